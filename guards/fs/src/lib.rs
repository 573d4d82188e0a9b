//! Fenced files: a local file that refuses writes from a superseded lease
//! holder.
//!
//! A lease alone cannot stop a holder that stalled (GC pause, swapped-out VM,
//! lost network) from writing after its lease lapsed and a successor took
//! over. The fix is to make the *resource* check the fencing epoch: every
//! write presents a [`FencingToken`], the file remembers the highest epoch it
//! has accepted, and anything lower is refused. [`FencedFile`] does that for
//! one file on a local file system.
//!
//! ```
//! use leasehold::FencingToken;
//! use leasehold_fs::{FenceError, FencedFile};
//! # let dir = std::env::temp_dir().join(format!("lhfs-doc-top-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir).unwrap();
//! let file = FencedFile::new(dir.join("report.json"))?;
//!
//! // The old holder (epoch 1) stalls; the successor (epoch 2) writes.
//! let old = FencingToken::new("reports", "worker-a", 1)?;
//! let new = FencingToken::new("reports", "worker-b", 2)?;
//! file.write(&new, b"{\"from\":\"b\"}")?;
//!
//! // When the old holder wakes up, the file itself refuses it.
//! let refused = file.write(&old, b"{\"from\":\"a\"}").unwrap_err();
//! assert!(matches!(refused, FenceError::StaleEpoch { presented: 1, accepted: 2, .. }));
//! assert_eq!(file.read()?, (2, b"{\"from\":\"b\"}".to_vec()));
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Rules
//!
//! * **G1** Each fenced file records the lease key it is fenced by and the
//!   highest epoch it has accepted ([`FenceRecord`]). The record never
//!   decreases.
//! * **G2** A write whose token epoch is below the record is refused with
//!   [`FenceError::StaleEpoch`] and the file is not touched.
//! * **G3** A write with an epoch at or above the record (equal epochs are
//!   admitted again: it is the same grant) replaces the payload and raises
//!   the record *atomically*: both or neither, also across a crash.
//! * **G4** Writers serialise on an OS file lock, so the rules hold between
//!   processes on one host, not only between threads.
//! * **G5** A token for a different lease key is refused with
//!   [`FenceError::WrongLeaseKey`]: it is a misuse, never silently accepted.
//!
//! The first write (or [`FencedFile::create`]) fences the file to the key of
//! that token. [`FencedFile::fence`] lets an operator raise the floor
//! without writing content, e.g. to the epoch `lease.inspect` reports after
//! a lapse, so that no holder up to and including it can write any more.
//!
//! # On-disk format and why
//!
//! The record and the payload live in **one file**: a single ASCII header
//! line followed by the payload bytes,
//!
//! ```text
//! lhfs1 <epoch> <fenced_through> <payload_len> <percent-encoded lease key>\n
//! <payload_len bytes of payload>
//! ```
//!
//! Because record and content are in the same file, a single `rename(2)`
//! commits both; no crash window can leave a raised record with old content
//! or new content with an old record, which a separate "epoch file" could.
//! `lhfs1` versions the format: a reader refuses what it does not know
//! instead of misreading it. `payload_len` lets a reader detect truncation
//! (for instance a copy made with a tool that stopped half way), reported as
//! [`FenceError::Corrupt`]. Readers get the payload with [`FencedFile::read`],
//! never by reading the file directly.
//!
//! Next to `name` the guard keeps two sibling files in the same directory:
//!
//! * `.name.lhfs-lock`: the lock file. It is never deleted (deleting a lock
//!   file while another process waits on it would let two writers in), and
//!   must not be deleted by hand either.
//! * `.name.lhfs-tmp`: the next version while it is being written. Only the
//!   lock holder creates it, so a leftover one (from a writer that crashed)
//!   is removed by the next writer; leftovers never break later writes.
//!
//! # Write path and fsync ordering
//!
//! 1. Take an exclusive lock on the lock file (`File::lock`, which is
//!    `flock(2)` on Linux and the BSDs). It blocks while another writer holds
//!    it and is released by the kernel when that writer exits or is killed.
//! 2. Read and parse the current header; check key (G5) and epoch (G2).
//!    A refused write returns here and has changed nothing.
//! 3. Write header + payload to `.name.lhfs-tmp` (created fresh) and
//!    `fsync` it, so the data is durable *before* it becomes visible.
//! 4. `rename` it over `name`: atomically, every reader sees the old or the
//!    new file, never a mix.
//! 5. `fsync` the directory, so the rename itself is durable.
//! 6. Release the lock.
//!
//! A write that returned `Ok` is durable and its record can never be lost or
//! lowered. A write that crashed (or was `SIGKILL`ed) before step 4 leaves the
//! old version; between steps 4 and 5 the new version is visible and, after a
//! power loss, either old or new survives, whole. Either way the file parses
//! and holds exactly one complete version.
//!
//! # Assumptions (read these)
//!
//! * **One host.** The lock is an advisory POSIX lock with `flock`
//!   semantics. It serialises processes and threads on the same machine that
//!   go through this crate. Programs that write the file without this crate
//!   bypass the guard.
//! * **Local file systems** (ext4, xfs, btrfs, tmpfs, APFS) where `rename`
//!   within a directory is atomic and `fsync` on a file and on a directory
//!   are honoured. Network file systems (NFS, SMB/CIFS) are **outside the
//!   guarantee**: their lock and rename semantics vary by server, client and
//!   mount options; test your setup before relying on it.
//! * The path names a regular file, not a symbolic link (the rename would
//!   replace the link, not its target), in a directory that exists and is
//!   writable (the lock and temporary files live there).
//! * `write` blocks while another writer holds the lock. A holder that is
//!   stopped (not dead) inside `write` keeps others waiting until it resumes
//!   or dies; a dead one releases the lock at once.
//! * Unix is the tested platform.

#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use leasehold::__private::field_text::{decode as percent_decode, encode as percent_encode};

pub use leasehold::FencingToken;

/// Version tag that opens every header.
const MAGIC: &str = "lhfs1";
/// Upper bound on the header line; a longer one is reported as corrupt.
const MAX_HEADER_LEN: u64 = 64 * 1024;
const LOCK_SUFFIX: &str = ".lhfs-lock";
const TEMP_SUFFIX: &str = ".lhfs-tmp";

/// What a fenced file remembers about its lease (G1).
///
/// ```
/// use leasehold_fs::FenceRecord;
/// let record = FenceRecord::new("job", 7, 5);
/// // Epoch 7 was accepted, so 6 is stale; equal epochs are the same grant.
/// assert!(record.admits(7) && !record.admits(6));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FenceRecord {
    /// The lease key the file is fenced by; tokens of other keys are refused.
    pub key: String,
    /// The highest epoch whose write was accepted: the epoch of the current
    /// payload. `0` if the file was created or fenced but never written.
    pub epoch: i64,
    /// The floor raised by [`FencedFile::fence`]: every epoch up to and
    /// including this one is refused. `0` if never raised.
    pub fenced_through: i64,
}

impl FenceRecord {
    /// Builds a record; useful for comparisons and tests.
    pub fn new(key: &str, epoch: i64, fenced_through: i64) -> Self {
        Self {
            key: key.to_owned(),
            epoch,
            fenced_through,
        }
    }

    /// Whether a write with `epoch` would be admitted by this record (key
    /// aside): at or above the accepted epoch and above the fenced floor.
    pub fn admits(&self, epoch: i64) -> bool {
        epoch >= self.epoch && epoch > self.fenced_through
    }
}

/// Why a fenced-file operation failed.
///
/// [`FenceError::StaleEpoch`] is the expected outcome for a superseded
/// holder; the others point at misuse, damage or the environment.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// The path cannot name a fenced file.
    #[error("invalid fenced-file path {path:?}: {reason}")]
    InvalidPath {
        /// The path as given.
        path: PathBuf,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An empty lease key was given to [`FencedFile::create`] or
    /// [`FencedFile::fence`].
    #[error("lease key for {resource:?} must not be empty")]
    EmptyKey {
        /// The fenced file.
        resource: PathBuf,
    },
    /// A negative epoch was given to [`FencedFile::fence`].
    #[error("cannot fence {resource:?} up to epoch {epoch}: epochs are never negative")]
    NegativeEpoch {
        /// The fenced file.
        resource: PathBuf,
        /// The rejected value.
        epoch: i64,
    },
    /// G2: the token's epoch is below what the file has accepted (or at or
    /// below the fenced floor). The holder was superseded; the file is
    /// untouched.
    #[error("stale epoch {presented} for {resource:?}: it accepted epoch {accepted} and is fenced through epoch {fenced_through}")]
    StaleEpoch {
        /// The fenced file.
        resource: PathBuf,
        /// The epoch of the refused token.
        presented: i64,
        /// The highest epoch the file has accepted.
        accepted: i64,
        /// The floor set by [`FencedFile::fence`] (`0` if none).
        fenced_through: i64,
    },
    /// G5: the token belongs to a different lease than the one fencing the
    /// file. This is a misuse (wrong file or wrong lease), not a race.
    #[error("{resource:?} is fenced by lease key {fenced_by:?}, not {presented:?}")]
    WrongLeaseKey {
        /// The fenced file.
        resource: PathBuf,
        /// The lease key the file is fenced by.
        fenced_by: String,
        /// The key of the presented token.
        presented: String,
    },
    /// The file does not exist yet, so there is nothing to read.
    #[error("{resource:?} does not exist, so it is not fenced yet")]
    NotFenced {
        /// The fenced file.
        resource: PathBuf,
    },
    /// The file exists but is not a valid fenced file. Nothing was changed.
    #[error("{resource:?} is not a valid fenced file: {reason}")]
    Corrupt {
        /// The fenced file.
        resource: PathBuf,
        /// What exactly did not parse.
        reason: String,
    },
    /// The operating system refused an operation.
    #[error("could not {action} for fenced file {resource:?}")]
    Io {
        /// The fenced file.
        resource: PathBuf,
        /// What was being done, e.g. "take the write lock".
        action: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

impl FenceError {
    /// True for [`FenceError::StaleEpoch`]: the presenting holder has been
    /// superseded and must stop, as opposed to a misuse or an I/O failure.
    pub fn is_stale(&self) -> bool {
        matches!(self, FenceError::StaleEpoch { .. })
    }
}

/// A file guarded by a lease's fencing epochs.
///
/// The handle holds only paths; it is cheap to clone, `Send + Sync`, and
/// several handles (in one or many processes) to the same path cooperate
/// through the lock file. Nothing touches the disk until an operation runs.
///
/// ```
/// use leasehold::FencingToken;
/// use leasehold_fs::FencedFile;
/// # let dir = std::env::temp_dir().join(format!("lhfs-doc-type-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// // Fence the file to the lease up front so a token of any other lease is
/// // refused even for the very first write.
/// let file = FencedFile::create(dir.join("state.bin"), "ledger")?;
/// let token = FencingToken::new("ledger", "node-1", 3)?;
/// file.write(&token, &[1, 2, 3])?;
/// file.write(&token, &[4, 5, 6])?; // same grant may write again
/// assert_eq!(file.read()?, (3, vec![4, 5, 6]));
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct FencedFile {
    path: PathBuf,
    dir: PathBuf,
    lock_path: PathBuf,
    temp_path: PathBuf,
}

impl FencedFile {
    /// A handle for the fenced file at `path`. Validates the path only; the
    /// file is created (and fenced to the token's key) by the first write.
    ///
    /// Fails with [`FenceError::InvalidPath`] for an empty path, a path
    /// without a file name (`/`, `a/..`, `dir/`) or an existing symbolic link.
    pub fn new(path: impl AsRef<Path>) -> Result<Self, FenceError> {
        let path = path.as_ref();
        let invalid = |reason| FenceError::InvalidPath {
            path: path.to_path_buf(),
            reason,
        };
        if path.as_os_str().is_empty() {
            return Err(invalid("the path is empty"));
        }
        if path.as_os_str().as_encoded_bytes().ends_with(b"/") {
            return Err(invalid(
                "the path ends with a separator, so it names a directory",
            ));
        }
        let Some(name) = path.file_name() else {
            return Err(invalid("the path has no file name"));
        };
        if let Ok(meta) = fs::symlink_metadata(path) {
            if meta.file_type().is_symlink() {
                return Err(invalid("the path is a symbolic link, which the atomic rename would replace; pass the link's target"));
            }
            if meta.is_dir() {
                return Err(invalid("the path is a directory"));
            }
        }
        let dir = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let sibling = |suffix: &str| {
            let mut hidden = OsString::from(".");
            hidden.push(name);
            hidden.push(suffix);
            dir.join(hidden)
        };
        Ok(Self {
            path: path.to_path_buf(),
            lock_path: sibling(LOCK_SUFFIX),
            temp_path: sibling(TEMP_SUFFIX),
            dir,
        })
    }

    /// Opens the fenced file at `path`, fencing it to `key` if it does not
    /// exist yet (with epoch 0 and an empty payload).
    ///
    /// Use this when the file should refuse foreign tokens from the start.
    /// Idempotent for the same key; an existing file fenced by another key
    /// gives [`FenceError::WrongLeaseKey`].
    pub fn create(path: impl AsRef<Path>, key: &str) -> Result<Self, FenceError> {
        let file = Self::new(path)?;
        if key.is_empty() {
            return Err(FenceError::EmptyKey {
                resource: file.path.clone(),
            });
        }
        let _lock = file.lock()?;
        match file.load_header()? {
            Some((record, _)) => file.check_key(&record, key)?,
            None => file.commit(&FenceRecord::new(key, 0, 0), &[], None)?,
        }
        Ok(file)
    }

    /// The path of the fenced file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `bytes` as the new content if `token` may (G2, G3, G5), and
    /// returns the new record.
    ///
    /// Refused with [`FenceError::WrongLeaseKey`] if the file is fenced by
    /// another key, and with [`FenceError::StaleEpoch`] if the token's epoch
    /// is below the accepted epoch or at or below the fenced floor; a refused
    /// write leaves the file untouched. On `Ok` the content and the raised
    /// record are durable together. An [`FenceError::Io`] means the outcome
    /// is unknown only if it came from the final directory `fsync` (the new
    /// version is then already visible); call [`FencedFile::read`] to see.
    ///
    /// ```
    /// use leasehold::FencingToken;
    /// use leasehold_fs::FencedFile;
    /// # let dir = std::env::temp_dir().join(format!("lhfs-doc-write-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// let file = FencedFile::new(dir.join("out.txt"))?;
    /// let record = file.write(&FencingToken::new("k", "me", 4)?, b"hello")?;
    /// assert_eq!(record.epoch, 4);
    /// // A token from another lease is a bug, reported as such.
    /// let other = FencingToken::new("other-key", "me", 9)?;
    /// assert!(file.write(&other, b"x").is_err());
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write(&self, token: &FencingToken, bytes: &[u8]) -> Result<FenceRecord, FenceError> {
        let _lock = self.lock()?;
        hooks::fire("locked", &self.path, token.epoch());
        let (next, permissions) = match self.load_header()? {
            None => (FenceRecord::new(token.key(), token.epoch(), 0), None),
            Some((record, permissions)) => {
                self.check_key(&record, token.key())?;
                if !record.admits(token.epoch()) {
                    return Err(FenceError::StaleEpoch {
                        resource: self.path.clone(),
                        presented: token.epoch(),
                        accepted: record.epoch,
                        fenced_through: record.fenced_through,
                    });
                }
                let next = FenceRecord {
                    epoch: token.epoch(),
                    ..record
                };
                (next, Some(permissions))
            }
        };
        self.commit(&next, bytes, permissions)?;
        Ok(next)
    }

    /// Raises the floor so that every epoch up to and including `epoch` is
    /// refused, without changing the content; returns the resulting record.
    ///
    /// For operators: after a holder's lease lapsed, fence its epoch (the
    /// counter `lease.inspect` reports) so that the stalled holder can never
    /// write, even before a successor does. Never lowers anything: a value at
    /// or below the current floor, or below the accepted epoch (already
    /// refused), changes nothing. If the file does not exist it is created,
    /// fenced to `key`, with an empty payload. A different `key` than the
    /// file's gives [`FenceError::WrongLeaseKey`].
    ///
    /// ```
    /// use leasehold::FencingToken;
    /// use leasehold_fs::FencedFile;
    /// # let dir = std::env::temp_dir().join(format!("lhfs-doc-fence-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// let file = FencedFile::new(dir.join("data"))?;
    /// file.write(&FencingToken::new("k", "a", 5)?, b"v5")?;
    /// // The lease of epoch 5 lapsed: fence it out before anyone re-acquires.
    /// file.fence("k", 5)?;
    /// assert!(file.write(&FencingToken::new("k", "a", 5)?, b"late").unwrap_err().is_stale());
    /// assert_eq!(file.read()?, (5, b"v5".to_vec())); // content unchanged
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fence(&self, key: &str, epoch: i64) -> Result<FenceRecord, FenceError> {
        if key.is_empty() {
            return Err(FenceError::EmptyKey {
                resource: self.path.clone(),
            });
        }
        if epoch < 0 {
            return Err(FenceError::NegativeEpoch {
                resource: self.path.clone(),
                epoch,
            });
        }
        let _lock = self.lock()?;
        match self.load_full()? {
            None => {
                let record = FenceRecord::new(key, 0, epoch);
                self.commit(&record, &[], None)?;
                Ok(record)
            }
            Some((record, payload, permissions)) => {
                self.check_key(&record, key)?;
                if epoch <= record.fenced_through || epoch < record.epoch {
                    return Ok(record);
                }
                let next = FenceRecord {
                    fenced_through: epoch,
                    ..record
                };
                self.commit(&next, &payload, Some(permissions))?;
                Ok(next)
            }
        }
    }

    /// Reads the current content: `(epoch, payload)`, where `epoch` is the
    /// epoch of the write that produced the payload (`0` if never written).
    ///
    /// Takes no lock: versions are replaced by rename, so the read sees one
    /// complete version, never a mix. [`FenceError::NotFenced`] if the file
    /// does not exist.
    pub fn read(&self) -> Result<(i64, Vec<u8>), FenceError> {
        match self.load_full()? {
            Some((record, payload, _)) => Ok((record.epoch, payload)),
            None => Err(FenceError::NotFenced {
                resource: self.path.clone(),
            }),
        }
    }

    /// The current record (key, accepted epoch, floor) without the payload,
    /// or `None` if the file does not exist yet. Takes no lock.
    pub fn record(&self) -> Result<Option<FenceRecord>, FenceError> {
        Ok(self.load_header()?.map(|(record, _)| record))
    }

    fn io(&self, action: &'static str) -> impl FnOnce(io::Error) -> FenceError + '_ {
        move |source| FenceError::Io {
            resource: self.path.clone(),
            action,
            source,
        }
    }

    fn corrupt(&self, reason: impl Into<String>) -> FenceError {
        FenceError::Corrupt {
            resource: self.path.clone(),
            reason: reason.into(),
        }
    }

    fn check_key(&self, record: &FenceRecord, presented: &str) -> Result<(), FenceError> {
        if record.key == presented {
            Ok(())
        } else {
            Err(FenceError::WrongLeaseKey {
                resource: self.path.clone(),
                fenced_by: record.key.clone(),
                presented: presented.to_owned(),
            })
        }
    }

    /// Takes the exclusive write lock; released when the returned file is
    /// dropped (or the process dies).
    fn lock(&self) -> Result<File, FenceError> {
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.lock_path)
            .map_err(self.io("open the lock file"))?;
        lock.lock().map_err(self.io("take the write lock"))?;
        Ok(lock)
    }

    fn open_existing(&self) -> Result<Option<File>, FenceError> {
        match File::open(&self.path) {
            Ok(file) => Ok(Some(file)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(self.io("open the file")(error)),
        }
    }

    /// Parses the header from `reader`, checking that the total file length
    /// matches. Leaves `reader` positioned at the payload.
    fn parse_header(
        &self,
        reader: &mut BufReader<&File>,
        file_len: u64,
    ) -> Result<(FenceRecord, u64), FenceError> {
        let mut line = Vec::new();
        reader
            .by_ref()
            .take(MAX_HEADER_LEN)
            .read_until(b'\n', &mut line)
            .map_err(self.io("read the header"))?;
        if line.pop() != Some(b'\n') {
            return Err(self.corrupt(
                "no header line: the file is empty, truncated, or was not written by leasehold-fs",
            ));
        }
        let line =
            std::str::from_utf8(&line).map_err(|_| self.corrupt("the header line is not ASCII"))?;
        let fields: Vec<&str> = line.split(' ').collect();
        let [magic, epoch, fenced_through, payload_len, key] = fields[..] else {
            return Err(self.corrupt(format!(
                "the header has {} fields, expected 5 (lhfs1 <epoch> <fenced_through> <len> <key>)",
                fields.len()
            )));
        };
        if magic != MAGIC {
            return Err(self.corrupt(format!("unknown header tag {magic:?}, expected {MAGIC:?}")));
        }
        let number = |text: &str, what: &str| -> Result<u64, FenceError> {
            if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                return Err(self.corrupt(format!("{what} {text:?} is not a decimal number")));
            }
            text.parse::<u64>()
                .map_err(|_| self.corrupt(format!("{what} {text:?} is out of range")))
        };
        let epoch = i64::try_from(number(epoch, "epoch")?)
            .map_err(|_| self.corrupt("epoch is out of range"))?;
        let fenced_through = i64::try_from(number(fenced_through, "fenced_through")?)
            .map_err(|_| self.corrupt("fenced_through is out of range"))?;
        let payload_len = number(payload_len, "payload length")?;
        let key = percent_decode(key)
            .ok_or_else(|| self.corrupt("the lease key is not validly percent-encoded"))?;
        if key.is_empty() {
            return Err(self.corrupt("the lease key is empty"));
        }
        let header_len = line.len() as u64 + 1;
        if header_len.checked_add(payload_len) != Some(file_len) {
            return Err(self.corrupt(format!(
                "the header announces {payload_len} payload bytes but the file holds {}",
                file_len.saturating_sub(header_len)
            )));
        }
        let record = FenceRecord {
            key,
            epoch,
            fenced_through,
        };
        Ok((record, payload_len))
    }

    /// The record and the file's permissions, reading only the header.
    fn load_header(&self) -> Result<Option<(FenceRecord, fs::Permissions)>, FenceError> {
        let Some(file) = self.open_existing()? else {
            return Ok(None);
        };
        let meta = file.metadata().map_err(self.io("inspect the file"))?;
        let (record, _) = self.parse_header(&mut BufReader::new(&file), meta.len())?;
        Ok(Some((record, meta.permissions())))
    }

    #[allow(clippy::type_complexity)]
    fn load_full(&self) -> Result<Option<(FenceRecord, Vec<u8>, fs::Permissions)>, FenceError> {
        let Some(file) = self.open_existing()? else {
            return Ok(None);
        };
        let meta = file.metadata().map_err(self.io("inspect the file"))?;
        let mut reader = BufReader::new(&file);
        let (record, payload_len) = self.parse_header(&mut reader, meta.len())?;
        let mut payload = Vec::new();
        reader
            .read_to_end(&mut payload)
            .map_err(self.io("read the payload"))?;
        // Versions are replaced by rename, never modified in place, so this
        // open file cannot change under us unless something else edits it.
        if payload.len() as u64 != payload_len {
            return Err(self.corrupt(format!(
                "the header announces {payload_len} payload bytes but {} were read; was the file edited in place?",
                payload.len()
            )));
        }
        Ok(Some((record, payload, meta.permissions())))
    }

    /// Steps 3 to 5 of the write path (see the crate docs); the caller holds
    /// the lock. On failure before the rename the old version stays in place.
    fn commit(
        &self,
        record: &FenceRecord,
        payload: &[u8],
        permissions: Option<fs::Permissions>,
    ) -> Result<(), FenceError> {
        // Only the lock holder writes the temporary file, so any existing one
        // is a leftover from a writer that died mid-write.
        match fs::remove_file(&self.temp_path) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(self.io("remove a leftover temporary file")(error)),
        }
        let header = format!(
            "{MAGIC} {} {} {} {}\n",
            record.epoch,
            record.fenced_through,
            payload.len(),
            percent_encode(&record.key)
        );
        let mut temp = TempFile {
            path: &self.temp_path,
            armed: true,
        };
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(temp.path)
            .map_err(self.io("create the temporary file"))?;
        if let Some(permissions) = permissions {
            file.set_permissions(permissions)
                .map_err(self.io("copy permissions to the temporary file"))?;
        }
        let (first, second) = payload.split_at(payload.len() / 2);
        file.write_all(header.as_bytes())
            .and_then(|()| file.write_all(first))
            .map_err(self.io("write the temporary file"))?;
        hooks::fire("temp-partial", &self.path, record.epoch);
        file.write_all(second)
            .map_err(self.io("write the temporary file"))?;
        file.sync_all()
            .map_err(self.io("fsync the temporary file"))?;
        drop(file);
        hooks::fire("temp-synced", &self.path, record.epoch);
        fs::rename(temp.path, &self.path).map_err(self.io("rename the new version into place"))?;
        temp.armed = false;
        hooks::fire("renamed", &self.path, record.epoch);
        File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(self.io("fsync the directory"))?;
        hooks::fire("dir-synced", &self.path, record.epoch);
        Ok(())
    }
}

/// Removes the temporary file on an error path (best effort: the next writer
/// removes it anyway).
struct TempFile<'a> {
    path: &'a Path,
    armed: bool,
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = fs::remove_file(self.path);
        }
    }
}

/// Crash-point hooks for this crate's own tests, behind the test-only
/// feature `fault-hooks`; without it the phases call nothing.
#[cfg(not(feature = "fault-hooks"))]
mod hooks {
    use std::path::Path;

    #[inline(always)]
    pub(crate) fn fire(_phase: &'static str, _path: &Path, _epoch: i64) {}
}

/// Crash-point hooks for this crate's own tests (feature `fault-hooks`,
/// test-only). Not part of the API.
#[cfg(feature = "fault-hooks")]
#[doc(hidden)]
pub mod hooks {
    use std::path::Path;
    use std::sync::OnceLock;

    /// Called with a phase name (`"locked"`, `"temp-partial"`,
    /// `"temp-synced"`, `"renamed"`, `"dir-synced"`), the file and the
    /// epoch of the record being written, while the write lock is held.
    pub type Hook = fn(phase: &'static str, path: &Path, epoch: i64);

    static HOOK: OnceLock<Hook> = OnceLock::new();

    /// Installs the process-wide hook; returns false if one was installed.
    pub fn install(hook: Hook) -> bool {
        HOOK.set(hook).is_ok()
    }

    pub(crate) fn fire(phase: &'static str, path: &Path, epoch: i64) {
        if let Some(hook) = HOOK.get() {
            hook(phase, path, epoch);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_encoding_round_trips_awkward_keys() {
        for key in ["plain", "with space", "a.b/c", "ä%20\n", "x y\tz"] {
            let encoded = percent_encode(key);
            assert!(!encoded.contains([' ', '\n']));
            assert_eq!(percent_decode(&encoded).as_deref(), Some(key));
        }
    }

    #[test]
    fn record_admission_rule() {
        let record = FenceRecord::new("k", 4, 6);
        assert!(!record.admits(4));
        assert!(!record.admits(6));
        assert!(record.admits(7));
        let record = FenceRecord::new("k", 4, 0);
        assert!(record.admits(4) && record.admits(5) && !record.admits(3));
    }
}
