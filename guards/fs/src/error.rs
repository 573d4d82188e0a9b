//! [`FenceError`]: why a fenced-file operation failed.

use std::io;
use std::path::PathBuf;

use leasehold::Epoch;

#[cfg(doc)]
use crate::FencedFile;

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
        epoch: Epoch,
    },
    /// G2: the token's epoch is below the lowest epoch the file admits (its
    /// last written epoch, or one above its fence). The holder was
    /// superseded; the file is untouched. The same fields as every
    /// leasehold guard's refusal.
    #[error("stale epoch {presented} for {resource:?}: it accepts only epochs >= {accepted}")]
    StaleEpoch {
        /// The fenced file.
        resource: PathBuf,
        /// The epoch of the refused token.
        presented: Epoch,
        /// The lowest epoch the file admits.
        accepted: Epoch,
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
    /// The fenced name, or one of its sidecars, is not a regular file: a
    /// symbolic link (never followed: the rename would replace the link, and
    /// a link re-pointed between two steps would split one write across two
    /// files), a FIFO (opening it would block while the lock is held), a
    /// directory, a socket or a device. Nothing was changed.
    #[error("{entry:?} (of fenced file {resource:?}) is {found}, not a regular file; nothing was changed")]
    NotRegularFile {
        /// The fenced file.
        resource: PathBuf,
        /// The entry that is not a regular file: the fenced file itself or
        /// its lock file.
        entry: PathBuf,
        /// What it is instead.
        found: &'static str,
    },
    /// Another writer held the write lock for the whole lock wait (see
    /// [`FencedFile::with_lock_wait`]). A holder that is stopped (SIGSTOP, a
    /// debugger, a frozen container) keeps it until it resumes or dies;
    /// killing it releases the lock, and a write it had not yet renamed into
    /// place never lands. Nothing was changed.
    #[error("the write lock of {resource:?} stayed held{} for {waited:?}; nothing was changed", holder.map(|pid| format!(" by process {pid}")).unwrap_or_default())]
    Busy {
        /// The fenced file.
        resource: PathBuf,
        /// How long this call waited.
        waited: std::time::Duration,
        /// The process id the holder wrote into the lock file, if readable.
        holder: Option<u32>,
    },
    /// The lock file was deleted or replaced while this write held it, so
    /// another writer may have taken a new lock on the new file. The write
    /// stopped before its rename: nothing was changed by it.
    #[error("the lock file of {resource:?} was deleted or replaced during the write; the write was abandoned before it changed anything")]
    LockLost {
        /// The fenced file.
        resource: PathBuf,
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
