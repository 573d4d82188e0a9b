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
//! use leasehold::{Epoch, FencingToken};
//! use leasehold_fs::{FenceError, FencedFile};
//! # let dir = std::env::temp_dir().join(format!("lhfs-doc-top-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir).unwrap();
//! let file = FencedFile::new(dir.join("report.json"))?;
//!
//! // The old holder (epoch 1) stalls; the successor (epoch 2) writes.
//! let old = FencingToken::new("reports", "worker-a", Epoch::new(1))?;
//! let new = FencingToken::new("reports", "worker-b", Epoch::new(2))?;
//! file.write(&new, b"{\"from\":\"b\"}")?;
//!
//! // When the old holder wakes up, the file itself refuses it.
//! let refused = file.write(&old, b"{\"from\":\"a\"}").unwrap_err();
//! assert!(matches!(refused, FenceError::StaleEpoch { presented, accepted, .. }
//!     if presented == 1 && accepted == 2));
//! assert_eq!(file.read()?, (Epoch::new(2), b"{\"from\":\"b\"}".to_vec()));
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Rules
//!
//! * **G1** Each fenced file records the lease key it is fenced by and the
//!   lowest epoch it still admits (a [`GuardRecord`], the record type of
//!   every leasehold guard). The record never decreases.
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
//! The header holds at most 64 KiB, so every lease key leasehold accepts
//! (up to 16 KiB, percent-encoded at most three times as long) fits.
//! `lhfs1` versions the format: a reader refuses what it does not know
//! instead of misreading it. `payload_len` lets a reader detect truncation
//! (for instance a copy made with a tool that stopped half way), reported as
//! [`FenceError::Corrupt`]. Readers get the payload with [`FencedFile::read`],
//! never by reading the file directly.
//!
//! Next to `name` the guard keeps sibling files in the same directory:
//!
//! * `.name.lhfs-lock`: the lock file. The guard never deletes it. Should
//!   someone delete or replace it anyway, a writer notices: one that was
//!   waiting for it takes the file now at the name instead, and one that
//!   held it abandons its write before the rename with
//!   [`FenceError::LockLost`], so two writers never both commit. (A writer
//!   stopped in the few instructions between that last check and its
//!   rename is the one window this cannot close.) The holder writes its
//!   process id into the lock file, which [`FenceError::Busy`] reports.
//! * `.name.lhfs-tmp.<pid>.<n>`: a writer's next version while it is being
//!   written, named for that writer, so no writer ever renames or removes
//!   another's. A leftover (from a writer that crashed) is removed by a
//!   later writer once no live process has that pid; leftovers never break
//!   later writes.
//!
//! Names of that shape cannot be fenced files themselves:
//! [`FencedFile::new`] refuses them.
//!
//! # Write path and fsync ordering
//!
//! Every step of one operation works in the directory it opened first (see
//! "One directory per operation" below).
//!
//! 1. Open the parent directory. Take an exclusive lock on the lock file
//!    (`flock(2)` on Linux and the BSDs), waiting at most the lock wait
//!    ([`FencedFile::with_lock_wait`], 30 s unless set), and check that the
//!    lock file is still the one at its name. The kernel releases the lock
//!    when its holder exits or is killed.
//! 2. Read and parse the current header; check key (G5) and epoch (G2).
//!    A refused write returns here and has changed nothing.
//! 3. Write header + payload to this writer's temporary file (created
//!    fresh) and `fsync` it, so the data is durable *before* it becomes
//!    visible.
//! 4. Check the lock file is still the one locked in step 1, then `rename`
//!    the temporary file over `name`: atomically, every reader sees the old
//!    or the new file, never a mix.
//! 5. `fsync` the directory, so the rename itself is durable.
//! 6. Release the lock.
//!
//! A write that returned `Ok` is durable and its record can never be lost or
//! lowered. A write that crashed (or was `SIGKILL`ed) before step 4 leaves the
//! old version; between steps 4 and 5 the new version is visible and, after a
//! power loss, either old or new survives, whole. Either way the file parses
//! and holds exactly one complete version.
//!
//! # One directory per operation
//!
//! The kernel resolves a path again at every use. If the lock, the header
//! read, the temporary file and the rename each named the path, a directory
//! swapped in between (`cur -> v1` re-pointed to `v2`) would leave a writer
//! holding `v1`'s lock while it checks and replaces `v2`'s file, next to a
//! writer that holds `v2`'s lock: two writers, one file, a torn or lost
//! version. So each operation opens the parent directory once and does every
//! step relative to that handle (`openat`, `renameat`, `unlinkat`). A swap
//! then decides only *which* directory an operation works in, the one its
//! path named when it began, and inside it the rules hold. Entries are
//! opened without following symbolic links: a link placed at the fenced
//! name or at a sidecar is refused with [`FenceError::NotRegularFile`], as
//! is a FIFO, a socket, a device or a directory (opened without blocking,
//! so a FIFO never hangs a caller that holds the lock).
//!
//! # Stopped holders and operator fences
//!
//! A holder stopped inside `write` (SIGSTOP, a debugger, a frozen
//! container) holds the write lock until it resumes or dies. Other writers
//! and [`FencedFile::fence`] wait for it at most the lock wait, then fail
//! with [`FenceError::Busy`], which names the holder's process id; they
//! change nothing. A fence is therefore never overtaken: when `fence`
//! returns `Ok`, no write that could land at or below its floor is in
//! flight, because every write checks the record under the lock the fence
//! took. When it returns `Busy`, the stopped holder may still land its write
//! when it resumes (it was admitted before it stopped); kill it, and a write
//! it had not renamed into place never lands, then fence again.
//!
//! # Deleting a fenced file
//!
//! The record lives in the file. **Deleting the file deletes its record**:
//! the next write of any epoch creates the file again, so a stale holder
//! whose write comes next is admitted. Do not delete fenced files while
//! their lease is in use; to start over, [`FencedFile::fence`] the new file
//! to the lease's current epoch (what `lease.inspect` reports) before any
//! holder writes. Deleting the lock file is covered above; deleting the
//! whole directory deletes the records of every file in it.
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
//!   writable (the lock and temporary files live there). Symbolic links in
//!   the directory part of the path are followed, once per operation.
//! * Unix is the tested platform.

#![deny(clippy::unwrap_used, clippy::expect_used)]

mod directory;
mod error;
mod record;

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use leasehold::guard::GuardRecord;
pub use leasehold::{Epoch, FencingToken};

use directory::{Directory, OpenError};
pub use error::FenceError;
use record::{encode_header, parse_header, FenceRecord, HeaderError};

/// Suffix of the lock file, `.name.lhfs-lock`.
const LOCK_SUFFIX: &str = ".lhfs-lock";
/// Infix of the temporary files, `.name.lhfs-tmp.<pid>.<n>`.
const TEMP_INFIX: &str = ".lhfs-tmp";
/// How long an operation waits for the write lock unless
/// [`FencedFile::with_lock_wait`] says otherwise.
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(30);
/// Longest pause between two tries of a lock that is held.
const MAX_LOCK_PAUSE: Duration = Duration::from_millis(10);

/// A file guarded by a lease's fencing epochs.
///
/// The handle holds only names; it is cheap to clone, `Send + Sync`, and
/// several handles (in one or many processes) to the same path cooperate
/// through the lock file. Nothing touches the disk until an operation runs,
/// and each operation resolves the path's directory once (see the crate
/// docs).
///
/// ```
/// use leasehold::{Epoch, FencingToken};
/// use leasehold_fs::FencedFile;
/// # let dir = std::env::temp_dir().join(format!("lhfs-doc-type-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// // Fence the file to the lease up front so a token of any other lease is
/// // refused even for the very first write.
/// let file = FencedFile::create(dir.join("state.bin"), "ledger")?;
/// let token = FencingToken::new("ledger", "node-1", Epoch::new(3))?;
/// file.write(&token, &[1, 2, 3])?;
/// file.write(&token, &[4, 5, 6])?; // same grant may write again
/// assert_eq!(file.read()?, (Epoch::new(3), vec![4, 5, 6]));
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct FencedFile {
    path: PathBuf,
    dir: PathBuf,
    name: OsString,
    lock_name: OsString,
    temp_prefix: OsString,
    lock_wait: Duration,
}

/// The write lock of one operation: the directory it was taken in and the
/// locked file (released when dropped, or by the kernel when the process
/// dies).
struct Locked {
    dir: Directory,
    lock: File,
}

impl FencedFile {
    /// A handle for the fenced file at `path`. Validates the path only; the
    /// file is created (and fenced to the token's key) by the first write.
    ///
    /// Fails with [`FenceError::InvalidPath`] for an empty path, a path
    /// without a file name (`/`, `a/..`, `dir/`), a name shaped like the
    /// guard's own sidecar files (`.x.lhfs-lock`, `.x.lhfs-tmp…`), or an
    /// existing entry that is not a regular file (a symbolic link, a
    /// directory, a FIFO).
    pub fn new(path: impl AsRef<Path>) -> Result<Self, FenceError> {
        let path = path.as_ref();
        let invalid = |reason| FenceError::InvalidPath {
            path: path.to_path_buf(),
            reason,
        };
        if path.as_os_str().is_empty() {
            return Err(invalid("the path is empty"));
        }
        if path.as_os_str().as_bytes().ends_with(b"/") {
            return Err(invalid(
                "the path ends with a separator, so it names a directory",
            ));
        }
        let Some(name) = path.file_name() else {
            return Err(invalid("the path has no file name"));
        };
        if is_sidecar_name(name) {
            return Err(invalid(
                "the name has the shape of a fenced file's lock or temporary file (.x.lhfs-lock, .x.lhfs-tmp…), which writes of another fenced file would replace or remove",
            ));
        }
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if meta.file_type().is_symlink() {
                return Err(invalid("the path is a symbolic link, which the atomic rename would replace; pass the link's target"));
            }
            if meta.is_dir() {
                return Err(invalid("the path is a directory"));
            }
            if !meta.is_file() {
                return Err(invalid(
                    "the path is not a regular file (a FIFO, socket or device)",
                ));
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
            hidden
        };
        Ok(Self {
            path: path.to_path_buf(),
            name: name.to_os_string(),
            lock_name: sibling(LOCK_SUFFIX),
            temp_prefix: sibling(&format!("{TEMP_INFIX}.")),
            dir,
            lock_wait: DEFAULT_LOCK_WAIT,
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
        let locked = file.lock(0)?;
        match file.load_header(&locked.dir)? {
            Some((record, _)) => file.check_key(&record, key)?,
            None => file.commit(&locked, &FenceRecord::new(key, 0, 0), &[], None)?,
        }
        Ok(file)
    }

    /// Sets how long [`write`](Self::write), [`fence`](Self::fence) and
    /// [`create`](Self::create) wait for a write lock another writer holds
    /// before they give up with [`FenceError::Busy`] (default
    /// [`DEFAULT_LOCK_WAIT`]). A write normally holds the lock for as long
    /// as it takes to write and `fsync` the payload; the bound is for a
    /// holder that stopped inside its write, so that an operator's fence
    /// reports it instead of waiting forever.
    ///
    /// ```
    /// use leasehold_fs::FencedFile;
    /// use std::time::Duration;
    /// # let dir = std::env::temp_dir();
    /// let file = FencedFile::new(dir.join("big.bin"))?.with_lock_wait(Duration::from_secs(300));
    /// # Ok::<(), leasehold_fs::FenceError>(())
    /// ```
    pub fn with_lock_wait(mut self, wait: Duration) -> Self {
        self.lock_wait = wait;
        self
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
    /// write leaves the file untouched, as do [`FenceError::Busy`],
    /// [`FenceError::LockLost`] and [`FenceError::NotRegularFile`]. On `Ok`
    /// the content and the raised record are durable together. An
    /// [`FenceError::Io`] means the outcome is unknown only if it came from
    /// the final directory `fsync` (the new version is then already
    /// visible); call [`FencedFile::read`] to see.
    ///
    /// ```
    /// use leasehold::{Epoch, FencingToken};
    /// use leasehold_fs::FencedFile;
    /// # let dir = std::env::temp_dir().join(format!("lhfs-doc-write-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// let file = FencedFile::new(dir.join("out.txt"))?;
    /// let record = file.write(&FencingToken::new("k", "me", Epoch::new(4))?, b"hello")?;
    /// assert_eq!(record.accepted_epoch, 4);
    /// // A token from another lease is a bug, reported as such.
    /// let other = FencingToken::new("other-key", "me", Epoch::new(9))?;
    /// assert!(file.write(&other, b"x").is_err());
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write(&self, token: &FencingToken, bytes: &[u8]) -> Result<GuardRecord, FenceError> {
        let epoch = token.epoch().get();
        let locked = self.lock(epoch)?;
        hooks::fire("locked", &self.path, epoch);
        let (next, permissions) = match self.load_header(&locked.dir)? {
            None => (FenceRecord::new(token.key(), epoch, 0), None),
            Some((record, permissions)) => {
                self.check_token(&record, token)?;
                let next = FenceRecord { epoch, ..record };
                (next, Some(permissions))
            }
        };
        self.commit(&locked, &next, bytes, permissions)?;
        Ok(next.guard_record())
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
    /// When it returns `Ok`, no write at or below the floor can land any
    /// more: a write checks the record under the same lock. A holder stopped
    /// inside its write holds that lock; the fence then waits at most the
    /// lock wait and fails with [`FenceError::Busy`] naming the holder's
    /// process, and the holder's write may still land when it resumes. Kill
    /// that process (a write it had not renamed into place never lands) and
    /// fence again.
    ///
    /// ```
    /// use leasehold::{Epoch, FencingToken};
    /// use leasehold_fs::FencedFile;
    /// # let dir = std::env::temp_dir().join(format!("lhfs-doc-fence-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// let file = FencedFile::new(dir.join("data"))?;
    /// let five = FencingToken::new("k", "a", Epoch::new(5))?;
    /// file.write(&five, b"v5")?;
    /// // The lease of epoch 5 lapsed: fence it out before anyone re-acquires.
    /// file.fence("k", Epoch::new(5))?;
    /// assert!(file.write(&five, b"late").unwrap_err().is_stale());
    /// assert_eq!(file.read()?, (Epoch::new(5), b"v5".to_vec())); // content unchanged
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fence(&self, key: &str, through: Epoch) -> Result<GuardRecord, FenceError> {
        if key.is_empty() {
            return Err(FenceError::EmptyKey {
                resource: self.path.clone(),
            });
        }
        if through < 0 {
            return Err(FenceError::NegativeEpoch {
                resource: self.path.clone(),
                epoch: through,
            });
        }
        let epoch = through.get();
        let locked = self.lock(epoch)?;
        match self.load_full(&locked.dir)? {
            None => {
                let record = FenceRecord::new(key, 0, epoch);
                self.commit(&locked, &record, &[], None)?;
                Ok(record.guard_record())
            }
            Some((record, payload, permissions)) => {
                self.check_key(&record, key)?;
                if epoch <= record.fenced_through || epoch < record.epoch {
                    return Ok(record.guard_record());
                }
                let next = FenceRecord {
                    fenced_through: epoch,
                    ..record
                };
                self.commit(&locked, &next, &payload, Some(permissions))?;
                Ok(next.guard_record())
            }
        }
    }

    /// Admits `token` without writing content: refused like
    /// [`write`](Self::write) (stale, wrong key), otherwise the record's
    /// epoch rises to the token's and the payload stays. A new holder's
    /// first move after a takeover: from then on every lower epoch is
    /// refused, before the new holder has anything to write. A file that
    /// does not exist is created empty, fenced to the token's key.
    ///
    /// ```
    /// use leasehold::{Epoch, FencingToken};
    /// use leasehold_fs::FencedFile;
    /// # let dir = std::env::temp_dir().join(format!("lhfs-doc-admit-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// let file = FencedFile::new(dir.join("data"))?;
    /// let three = FencingToken::new("k", "a", Epoch::new(3))?;
    /// file.write(&three, b"v3")?;
    /// file.admit(&FencingToken::new("k", "b", Epoch::new(4))?)?;
    /// assert!(file.write(&three, b"late").unwrap_err().is_stale());
    /// assert_eq!(file.read()?, (Epoch::new(4), b"v3".to_vec()));
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn admit(&self, token: &FencingToken) -> Result<GuardRecord, FenceError> {
        let epoch = token.epoch().get();
        let locked = self.lock(epoch)?;
        match self.load_full(&locked.dir)? {
            None => {
                let record = FenceRecord::new(token.key(), epoch, 0);
                self.commit(&locked, &record, &[], None)?;
                Ok(record.guard_record())
            }
            Some((record, payload, permissions)) => {
                self.check_token(&record, token)?;
                if epoch == record.epoch {
                    // The same grant: nothing to raise.
                    return Ok(record.guard_record());
                }
                let next = FenceRecord { epoch, ..record };
                self.commit(&locked, &next, &payload, Some(permissions))?;
                Ok(next.guard_record())
            }
        }
    }

    /// Reads the current content: `(epoch, payload)`, where `epoch` is the
    /// epoch of the write that produced the payload (`0` if never written).
    ///
    /// Takes no lock: versions are replaced by rename, so the read sees one
    /// complete version, never a mix. [`FenceError::NotFenced`] if the file
    /// does not exist.
    pub fn read(&self) -> Result<(Epoch, Vec<u8>), FenceError> {
        match self.load_full(&self.open_dir()?)? {
            Some((record, payload, _)) => Ok((Epoch::new(record.epoch), payload)),
            None => Err(FenceError::NotFenced {
                resource: self.path.clone(),
            }),
        }
    }

    /// The current record (the key and the lowest epoch admitted) without
    /// the payload, or `None` if the file does not exist yet. Takes no lock.
    pub fn record(&self) -> Result<Option<GuardRecord>, FenceError> {
        Ok(self
            .load_header(&self.open_dir()?)?
            .map(|(record, _)| record.guard_record()))
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

    fn header_error(&self, error: HeaderError) -> FenceError {
        match error {
            HeaderError::Io(source) => self.io("read the header")(source),
            HeaderError::Corrupt(reason) => self.corrupt(reason),
        }
    }

    /// Maps a refused or failed open of `entry` (a name in the directory).
    fn open_error(&self, entry: &OsStr, action: &'static str, error: OpenError) -> FenceError {
        match error {
            OpenError::NotRegular(found) => FenceError::NotRegularFile {
                resource: self.path.clone(),
                entry: self.dir.join(entry),
                found,
            },
            OpenError::Io(source) => self.io(action)(source),
        }
    }

    /// The admission rule for `token` against `record`: key first (G5),
    /// then epoch (G2); `write` and `admit` both decide with it.
    fn check_token(&self, record: &FenceRecord, token: &FencingToken) -> Result<(), FenceError> {
        self.check_key(record, token.key())?;
        if record.admits(token.epoch().get()) {
            Ok(())
        } else {
            Err(FenceError::StaleEpoch {
                resource: self.path.clone(),
                presented: token.epoch(),
                accepted: record.guard_record().accepted_epoch,
            })
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

    /// Opens the parent directory: the one resolution of the path an
    /// operation makes.
    fn open_dir(&self) -> Result<Directory, FenceError> {
        Directory::open(&self.dir).map_err(self.io("open the directory"))
    }

    /// Step 1 of the write path: opens the directory, then takes the
    /// exclusive write lock within the lock wait, on the lock file that is
    /// at its name once the lock is held (one deleted or replaced while this
    /// call waited is let go and the new one taken). `epoch` is for the
    /// test hooks only.
    fn lock(&self, epoch: i64) -> Result<Locked, FenceError> {
        let dir = self.open_dir()?;
        hooks::fire("opened", &self.path, epoch);
        let started = Instant::now();
        loop {
            let lock = dir
                .open_or_create(&self.lock_name)
                .map_err(|error| self.open_error(&self.lock_name, "open the lock file", error))?;
            self.wait_for(&lock, started)?;
            if dir
                .still_names(&self.lock_name, &lock)
                .map_err(self.io("check the lock file"))?
            {
                // Who holds it, for a Busy error elsewhere. Informational:
                // nothing depends on it being current.
                // Fixed width, so it overwrites the previous holder's in
                // place: no truncation, no new block after the first.
                let pid = format!("{:<15}\n", std::process::id());
                lock.write_all_at(pid.as_bytes(), 0)
                    .map_err(self.io("record the lock holder"))?;
                return Ok(Locked { dir, lock });
            }
        }
    }

    /// Takes the lock on `lock`, retrying with short growing pauses until
    /// the lock wait counted from `started` is over.
    fn wait_for(&self, lock: &File, started: Instant) -> Result<(), FenceError> {
        let mut pause = Duration::from_micros(200);
        loop {
            match lock.try_lock() {
                Ok(()) => return Ok(()),
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(source)) => {
                    return Err(self.io("take the write lock")(source))
                }
            }
            let waited = started.elapsed();
            if waited >= self.lock_wait {
                return Err(FenceError::Busy {
                    resource: self.path.clone(),
                    waited,
                    holder: lock_holder(lock),
                });
            }
            std::thread::sleep(pause.min(self.lock_wait - waited));
            pause = (pause * 2).min(MAX_LOCK_PAUSE);
        }
    }

    fn open_existing(&self, dir: &Directory) -> Result<Option<File>, FenceError> {
        dir.open_existing(&self.name)
            .map_err(|error| self.open_error(&self.name, "open the file", error))
    }

    /// The record and the file's permissions, reading only the header.
    fn load_header(
        &self,
        dir: &Directory,
    ) -> Result<Option<(FenceRecord, std::fs::Permissions)>, FenceError> {
        let Some(file) = self.open_existing(dir)? else {
            return Ok(None);
        };
        let meta = file.metadata().map_err(self.io("inspect the file"))?;
        let (record, _) = parse_header(&mut BufReader::new(&file), meta.len())
            .map_err(|error| self.header_error(error))?;
        Ok(Some((record, meta.permissions())))
    }

    #[allow(clippy::type_complexity)]
    fn load_full(
        &self,
        dir: &Directory,
    ) -> Result<Option<(FenceRecord, Vec<u8>, std::fs::Permissions)>, FenceError> {
        let Some(file) = self.open_existing(dir)? else {
            return Ok(None);
        };
        let meta = file.metadata().map_err(self.io("inspect the file"))?;
        let mut reader = BufReader::new(&file);
        let (record, payload_len) =
            parse_header(&mut reader, meta.len()).map_err(|error| self.header_error(error))?;
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

    /// Removes temporary files of this fenced file whose writer is gone
    /// (no live process has the pid in their name). Never one of a live
    /// writer: each writer renames only its own.
    fn remove_leftovers(&self, dir: &Directory) -> Result<(), FenceError> {
        let names = dir
            .names_starting_with(&self.temp_prefix)
            .map_err(self.io("list leftover temporary files"))?;
        for name in names {
            let writer = name.as_bytes()[self.temp_prefix.len()..]
                .split(|&b| b == b'.')
                .next()
                .and_then(|pid| std::str::from_utf8(pid).ok()?.parse::<i32>().ok());
            let gone = match writer {
                Some(pid) => !process_alive(pid),
                None => false, // not a name this crate makes: leave it
            };
            if gone {
                dir.remove(&name)
                    .map_err(self.io("remove a leftover temporary file"))?;
            }
        }
        Ok(())
    }

    /// Creates this writer's temporary file under a name no other writer
    /// uses.
    fn create_temp(&self, dir: &Directory) -> Result<(OsString, File), FenceError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        loop {
            let mut name = self.temp_prefix.clone();
            name.push(format!(
                "{}.{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            if let Some(file) = dir
                .create_new(&name)
                .map_err(self.io("create the temporary file"))?
            {
                return Ok((name, file));
            }
        }
    }

    /// Steps 3 to 5 of the write path (see the crate docs); the caller holds
    /// the lock. On failure before the rename the old version stays in place.
    fn commit(
        &self,
        locked: &Locked,
        record: &FenceRecord,
        payload: &[u8],
        permissions: Option<std::fs::Permissions>,
    ) -> Result<(), FenceError> {
        let dir = &locked.dir;
        self.remove_leftovers(dir)?;
        let header = encode_header(record, payload.len());
        let (temp_name, mut file) = self.create_temp(dir)?;
        let mut temp = TempFile {
            dir,
            name: &temp_name,
            armed: true,
        };
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
        if !dir
            .still_names(&self.lock_name, &locked.lock)
            .map_err(self.io("check the lock file"))?
        {
            return Err(FenceError::LockLost {
                resource: self.path.clone(),
            });
        }
        dir.rename(&temp_name, &self.name)
            .map_err(self.io("rename the new version into place"))?;
        temp.armed = false;
        hooks::fire("renamed", &self.path, record.epoch);
        dir.sync().map_err(self.io("fsync the directory"))?;
        hooks::fire("dir-synced", &self.path, record.epoch);
        Ok(())
    }
}

/// Whether `name` has the shape of a sidecar this crate keeps next to a
/// fenced file: fencing such a name would let another fenced file's writes
/// replace or remove it.
fn is_sidecar_name(name: &OsStr) -> bool {
    let bytes = name.as_bytes();
    bytes.starts_with(b".")
        && (bytes.ends_with(LOCK_SUFFIX.as_bytes())
            || bytes
                .windows(TEMP_INFIX.len())
                .any(|window| window == TEMP_INFIX.as_bytes()))
}

/// The pid a lock holder wrote into `lock`, if it can be read.
fn lock_holder(lock: &File) -> Option<u32> {
    let mut text = [0u8; 16];
    let read = lock.read_at(&mut text, 0).ok()?;
    std::str::from_utf8(&text[..read]).ok()?.trim().parse().ok()
}

/// Whether a process with `pid` exists (signal 0 is a permission check
/// only; EPERM means it exists but belongs to another user).
fn process_alive(pid: i32) -> bool {
    if pid <= 0 {
        return true; // never a writer's pid; do not touch
    }
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(nix::Error::ESRCH)
    )
}

/// Removes the temporary file on an error path (best effort: a later writer
/// removes it once this process is gone).
struct TempFile<'a> {
    dir: &'a Directory,
    name: &'a OsStr,
    armed: bool,
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.dir.remove(self.name);
        }
    }
}

/// The workspace's one guard contract ([`leasehold::guard::Guard`]): the
/// record's epoch is the lowest epoch the file admits, one above its fence
/// or its last written epoch, whichever is higher.
impl leasehold::guard::Guard for FencedFile {
    type Error = FenceError;

    fn admit(&self, token: &FencingToken) -> Result<(), FenceError> {
        FencedFile::admit(self, token).map(drop)
    }

    fn fence(&self, key: &str, through: Epoch) -> Result<(), FenceError> {
        FencedFile::fence(self, key, through).map(drop)
    }

    fn record(&self) -> Result<Option<GuardRecord>, FenceError> {
        FencedFile::record(self)
    }

    fn refused(error: &FenceError) -> Option<leasehold::guard::Refused> {
        match error {
            FenceError::StaleEpoch {
                presented,
                accepted,
                ..
            } => Some(leasehold::guard::Refused::Stale {
                presented: *presented,
                accepted: *accepted,
            }),
            FenceError::WrongLeaseKey {
                fenced_by,
                presented,
                ..
            } => Some(leasehold::guard::Refused::WrongKey {
                fenced_by: fenced_by.clone(),
                presented: presented.clone(),
            }),
            _ => None,
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
    /// epoch of the record being written, while the write lock is held;
    /// `"opened"` comes first, after the directory was opened and before
    /// the lock is taken.
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
