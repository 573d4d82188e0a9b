//! The directories on the way to a server's own directory, and whether the
//! server's OS user can enter them.
//!
//! As root, the server runs as [`SERVER_USER`] (see [`crate::server_user`]),
//! which needs search (`x`) permission on every directory above its data
//! directory. A recursive `mkdir` as root makes each new directory
//! root-only, so the server could not even be started inside them
//! ("could not run initdb: Permission denied"). Here the missing directories
//! are created so that the server user can pass through them, and the ones
//! that already exist are checked, never changed: a directory the server user
//! cannot enter is named in a typed error before anything is created.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{io_err, LocalServerError};
use crate::server_user::{group_name, user_name, SERVER_USER};

/// Mode of a directory created above the server's own one when the server
/// runs as another user: owner all, the server user's group search only.
///
/// Group rather than others (`o+x`), because it lets in exactly the server
/// user (its primary group: std drops supplementary groups when a command
/// switches user) and nobody else; without read permission it cannot list
/// what else is there. The owner stays the creating user (root), since these
/// directories (`~/.local`, `~/.local/share`, `/var/lib/leasehold`) may hold
/// other programs' data too.
const SHARED_PARENT_MODE: u32 = 0o710;

/// Mode of every directory created for a server that runs as this process's
/// own user, and of the server's own directory (handed over by `chown`).
const PRIVATE_MODE: u32 = 0o700;

/// Creates `dir` and the directories missing above it, so that the server
/// user (`run_as`, `None` for this process's user) can enter each of them.
///
/// Existing directories above `dir` are checked before anything is created:
/// one the server user cannot enter is an
/// [`LocalServerError::DirNotEnterable`] (`elsewhere` says how to choose
/// another place); it is not loosened. `dir` itself is created with mode
/// 0700 and left to the caller to hand over.
pub(crate) fn create_server_dir(
    dir: &Path,
    run_as: Option<(u32, u32)>,
    bin_dir: &Path,
    elsewhere: &'static str,
) -> Result<(), LocalServerError> {
    let dir = std::path::absolute(dir).map_err(io_err(format!(
        "find the absolute path of {}",
        dir.display()
    )))?;
    // The longest prefix that exists, and the names below it to create.
    let mut existing = dir.clone();
    let mut missing = Vec::new();
    while fs::symlink_metadata(&existing).is_err() {
        let Some(name) = existing.file_name().map(ToOwned::to_owned) else {
            break;
        };
        missing.push(name);
        existing.pop();
    }
    if let Some(user) = run_as {
        // The server's own directory is not checked: it is handed to the
        // server user (chown) when the cluster is created.
        let above = if missing.is_empty() {
            existing.parent().map(Path::to_path_buf)
        } else {
            Some(existing.clone())
        };
        if let Some(above) = above {
            check_enterable(&above, user, bin_dir, elsewhere)?;
        }
    }
    let mut path = existing;
    while let Some(name) = missing.pop() {
        path.push(name);
        match run_as {
            Some(user) if !missing.is_empty() => {
                create_shared_parent(&path, user.1)?;
                // Set up by us or by a concurrent start; else someone else
                // made it meanwhile, and it is checked like any other.
                check_enterable(&path, user, bin_dir, elsewhere)?;
            }
            _ => match make_dir(&path, PRIVATE_MODE) {
                // A concurrent start made it first: the same directory.
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists || !path.is_dir() => {
                    return Err(io_err(format!("create {}", path.display()))(e));
                }
                _ => {}
            },
        }
    }
    Ok(())
}

/// Creates `path` with [`SHARED_PARENT_MODE`] and group `gid`, appearing
/// there only once set up: made under a temporary name and renamed into
/// place, so that a concurrent start never sees it half done (root-only),
/// which it would rightly refuse. Losing that race is no error.
fn create_shared_parent(path: &Path, gid: u32) -> Result<(), LocalServerError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io_err(format!("create {}", path.display()))(
            io::Error::other("it has no parent directory"),
        ));
    };
    let temp = parent.join(format!(
        ".{}.leasehold-{}-{}",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    make_dir(&temp, PRIVATE_MODE).map_err(io_err(format!("create {}", temp.display())))?;
    let set_up = std::os::unix::fs::chown(&temp, None, Some(gid))
        .map_err(io_err(format!(
            "give {} to the server user's group",
            temp.display()
        )))
        .and_then(|()| {
            // Explicitly: the mode given to mkdir is reduced by the umask.
            fs::set_permissions(&temp, fs::Permissions::from_mode(SHARED_PARENT_MODE)).map_err(
                io_err(format!(
                    "set the mode of {} to {SHARED_PARENT_MODE:04o}",
                    temp.display()
                )),
            )
        });
    let renamed = set_up.and_then(|()| match fs::rename(&temp, path) {
        Ok(()) => Ok(true),
        // A concurrent start put it there first. (If it was still empty,
        // Linux lets ours replace it, an identical one: see `make_dir`.)
        Err(_) if path.is_dir() => Ok(false),
        Err(e) => Err(io_err(format!("create {}", path.display()))(e)),
    });
    if !matches!(renamed, Ok(true)) {
        let _ = fs::remove_dir(&temp);
    }
    renamed.map(|_| ())
}

/// `mkdir`, again when the parent was replaced meanwhile: a concurrent
/// start may rename its identical directory over ours while it is empty,
/// and creating in the replaced one then fails with "not found".
fn make_dir(path: &Path, mode: u32) -> io::Result<()> {
    let mut attempts = 0;
    loop {
        match fs::DirBuilder::new().mode(mode).create(path) {
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    && attempts < 5
                    && path.parent().is_some_and(Path::is_dir) =>
            {
                attempts += 1;
            }
            other => return other,
        }
    }
}

/// Checks that the server user can enter `dir` and every directory above
/// it (symbolic links resolved, as the kernel follows them).
pub(crate) fn check_enterable(
    dir: &Path,
    (uid, gid): (u32, u32),
    bin_dir: &Path,
    elsewhere: &'static str,
) -> Result<(), LocalServerError> {
    let canonical =
        fs::canonicalize(dir).map_err(io_err(format!("resolve the path {}", dir.display())))?;
    // From `/` down, so the error names the first directory in the way.
    let mut ancestors: Vec<&Path> = canonical.ancestors().collect();
    ancestors.reverse();
    for step in ancestors {
        let meta = fs::metadata(step).map_err(io_err(format!("inspect {}", step.display())))?;
        if may_enter(&meta, uid, gid) || probe_enters(step, (uid, gid), bin_dir) {
            continue;
        }
        return Err(LocalServerError::DirNotEnterable {
            dir: step.to_path_buf(),
            user: SERVER_USER.to_owned(),
            mode: meta.mode() & 0o7777,
            owner: user_name(meta.uid()),
            group: group_name(meta.gid()),
            elsewhere,
        });
    }
    Ok(())
}

/// What the mode bits say, in the kernel's order: the owner's bits for the
/// owner, else the group's for the group, else the others'.
fn may_enter(meta: &fs::Metadata, uid: u32, gid: u32) -> bool {
    let mode = meta.mode();
    if !meta.is_dir() {
        return false;
    }
    if meta.uid() == uid {
        mode & 0o100 != 0
    } else if meta.gid() == gid {
        mode & 0o010 != 0
    } else {
        mode & 0o001 != 0
    }
}

/// Whether a process of the server user can make `dir` its working
/// directory: asked when the mode bits say no, since an ACL may still let it
/// in. Spawning fails before the program runs when the directory cannot be
/// entered (the child changes user, then directory).
fn probe_enters(dir: &Path, (uid, gid): (u32, u32), bin_dir: &Path) -> bool {
    Command::new(bin_dir.join("initdb"))
        .arg("--version")
        .current_dir(dir)
        .uid(uid)
        .gid(gid)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}
