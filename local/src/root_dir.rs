//! The private directory a server lives in: data directory, socket
//! directory and log, all removed together.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{io_err, LocalServerError};
use crate::server_dirs::check_enterable;

/// Unix socket paths are limited to ~107 bytes; stay well below.
const MAX_SOCKET_PATH: usize = 100;
/// The socket file's path below the root, at its longest port number.
const SOCKET_SUFFIX: &str = "/s/.s.PGSQL.65535";

/// Distinguishes servers started by one process.
static SERVER_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Creates the private root directory: mode 0700, owned by the server user
/// (`run_as`), short enough for the socket path below it. When the server
/// runs as another user, the temporary directory it is created in must let
/// that user in (checked, not changed).
pub(crate) fn create_root_dir(
    run_as: Option<(u32, u32)>,
    bin_dir: &Path,
) -> Result<PathBuf, LocalServerError> {
    let mut base = std::env::temp_dir();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let name = format!(
        "leasehold-pg-{}-{}-{}",
        std::process::id(),
        SERVER_COUNTER.fetch_add(1, Ordering::Relaxed),
        nanos
    );
    let socket_len = |base: &Path| base.join(&name).as_os_str().len() + SOCKET_SUFFIX.len();
    if socket_len(&base) >= MAX_SOCKET_PATH {
        base = PathBuf::from("/tmp");
    }
    if let Some(user) = run_as {
        check_enterable(&base, user, bin_dir, "set TMPDIR to another directory")?;
    }
    let root = base.join(&name);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&root)
        .map_err(io_err(format!("create {}", root.display())))?;
    // The watchdog compares the postmaster's working directory (as the
    // kernel reports it, symlinks resolved) with the data directory.
    let root = match fs::canonicalize(&root) {
        Ok(canonical) if canonical.as_os_str().len() + SOCKET_SUFFIX.len() < MAX_SOCKET_PATH => {
            canonical
        }
        _ => root,
    };
    if let Some((uid, gid)) = run_as {
        if let Err(source) = std::os::unix::fs::chown(&root, Some(uid), Some(gid)) {
            let _ = fs::remove_dir_all(&root);
            return Err(LocalServerError::Io {
                action: format!("chown {} to the server user", root.display()),
                source,
            });
        }
    }
    Ok(root)
}
