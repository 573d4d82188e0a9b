//! The one directory handle an operation works through.
//!
//! A path is resolved by the kernel every time it is used. Resolving the
//! parent directory of a fenced file again for the lock, the header read,
//! the temporary file and the rename lets a directory swapped (or a symbolic
//! link component re-pointed) between two of those steps put two writers
//! under two locks on one file. So each operation opens the parent
//! directory once and does every step relative to that handle (`openat`,
//! `renameat`, `unlinkat`, `fstatat`): whatever the path names later, the
//! operation stays in the directory it started in.
//!
//! Every entry is opened with `O_NOFOLLOW`, so a symbolic link placed at a
//! sidecar or at the fenced name is refused instead of followed, and with
//! `O_NONBLOCK` where opening could block (a FIFO), so a non-regular file is
//! refused instead of hanging the caller while it holds the lock.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::dir::Dir;
use nix::fcntl::{open, openat, renameat, OFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// What kind of entry sits at a name, for the refusal of anything that is
/// not a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryKind {
    Regular,
    Other(&'static str),
}

impl EntryKind {
    fn of(stat: &FileStat) -> Self {
        let format = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
        match format {
            SFlag::S_IFREG => EntryKind::Regular,
            SFlag::S_IFDIR => EntryKind::Other("a directory"),
            SFlag::S_IFLNK => EntryKind::Other("a symbolic link"),
            SFlag::S_IFIFO => EntryKind::Other("a FIFO"),
            SFlag::S_IFSOCK => EntryKind::Other("a socket"),
            SFlag::S_IFCHR => EntryKind::Other("a character device"),
            SFlag::S_IFBLK => EntryKind::Other("a block device"),
            _ => EntryKind::Other("not a regular file"),
        }
    }
}

/// An entry that exists but cannot be used: its kind says why.
#[derive(Debug)]
pub(crate) enum OpenError {
    NotRegular(&'static str),
    Io(io::Error),
}

impl From<nix::Error> for OpenError {
    fn from(errno: nix::Error) -> Self {
        OpenError::Io(errno.into())
    }
}

impl From<io::Error> for OpenError {
    fn from(error: io::Error) -> Self {
        OpenError::Io(error)
    }
}

/// The parent directory of a fenced file, opened once for one operation.
pub(crate) struct Directory {
    handle: File,
}

impl Directory {
    /// Opens (resolves) `path` as a directory. This is the one point at
    /// which the operation depends on what the path names.
    pub(crate) fn open(path: &Path) -> io::Result<Self> {
        let fd = open(
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Self {
            handle: File::from(fd),
        })
    }

    /// Opens the entry `name` for reading; `None` if there is none. Refuses
    /// a symbolic link and anything that is not a regular file.
    pub(crate) fn open_existing(&self, name: &OsStr) -> Result<Option<File>, OpenError> {
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        match openat(self.handle.as_fd(), name, flags, Mode::empty()) {
            Ok(fd) => regular(fd).map(Some),
            Err(nix::Error::ENOENT) => Ok(None),
            Err(nix::Error::ELOOP) => Err(OpenError::NotRegular("a symbolic link")),
            Err(errno) => Err(errno.into()),
        }
    }

    /// Opens the entry `name` for reading and writing, creating it if it
    /// does not exist (the lock file). Refuses what `open_existing` refuses.
    pub(crate) fn open_or_create(&self, name: &OsStr) -> Result<File, OpenError> {
        let flags = OFlag::O_RDWR
            | OFlag::O_CREAT
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_CLOEXEC;
        match openat(
            self.handle.as_fd(),
            name,
            flags,
            Mode::from_bits_truncate(0o666),
        ) {
            Ok(fd) => regular(fd),
            Err(nix::Error::ELOOP) => Err(OpenError::NotRegular("a symbolic link")),
            Err(errno) => Err(errno.into()),
        }
    }

    /// Creates `name`, which must not exist, for writing (a temporary
    /// file, mode 0666 less the umask, as `File::create` would); `Ok(None)`
    /// if the name is taken.
    pub(crate) fn create_new(&self, name: &OsStr) -> io::Result<Option<File>> {
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        match openat(
            self.handle.as_fd(),
            name,
            flags,
            Mode::from_bits_truncate(0o666),
        ) {
            Ok(fd) => Ok(Some(File::from(fd))),
            Err(nix::Error::EEXIST) => Ok(None),
            Err(errno) => Err(errno.into()),
        }
    }

    /// Whether the entry `name` is, right now, the very file `open` (same
    /// device and inode): false if it was removed or replaced since `open`
    /// was opened.
    pub(crate) fn still_names(&self, name: &OsStr, open: &File) -> io::Result<bool> {
        let held = fstat(open.as_fd())?;
        match fstatat(
            self.handle.as_fd(),
            name,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(now) => Ok(now.st_dev == held.st_dev && now.st_ino == held.st_ino),
            Err(nix::Error::ENOENT) => Ok(false),
            Err(errno) => Err(errno.into()),
        }
    }

    /// Atomically replaces `to` with `from`, both in this directory.
    pub(crate) fn rename(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        renameat(self.handle.as_fd(), from, self.handle.as_fd(), to)?;
        Ok(())
    }

    /// Removes the entry `name`; no error if it is already gone.
    pub(crate) fn remove(&self, name: &OsStr) -> io::Result<()> {
        match unlinkat(self.handle.as_fd(), name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(nix::Error::ENOENT) => Ok(()),
            Err(errno) => Err(errno.into()),
        }
    }

    /// The names in this directory that start with `prefix`.
    pub(crate) fn names_starting_with(&self, prefix: &OsStr) -> io::Result<Vec<OsString>> {
        let mut listing = Dir::openat(
            self.handle.as_fd(),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let mut names = Vec::new();
        for entry in listing.iter() {
            let entry = entry?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name.as_bytes().starts_with(prefix.as_bytes()) {
                names.push(name.to_os_string());
            }
        }
        Ok(names)
    }

    /// Makes the directory's entries (a rename) durable.
    pub(crate) fn sync(&self) -> io::Result<()> {
        self.handle.sync_all()
    }
}

/// `fd` as a file if it is a regular file.
fn regular(fd: OwnedFd) -> Result<File, OpenError> {
    match EntryKind::of(&fstat(fd.as_fd())?) {
        EntryKind::Regular => Ok(File::from(fd)),
        EntryKind::Other(kind) => Err(OpenError::NotRegular(kind)),
    }
}
