//! Why a local server could not be created, started or stopped.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use crate::binaries::BIN_DIR_ENV;
use crate::control::StopMode;
use crate::server_user::SERVER_USER;

/// Why a local server could not be created, started or stopped.
///
/// Every message says what went wrong and what to do about it.
/// `#[non_exhaustive]` because new server options (and the failures they
/// bring) are added without a breaking release; match the variants you act
/// on and report the rest through `Display`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LocalServerError {
    /// No directory with the PostgreSQL server binaries was found.
    #[error(
        "no PostgreSQL server binaries (initdb, postgres, pg_ctl) found; searched: {}. \
         Install the server with `apt-get install postgresql` (or a versioned package \
         such as `postgresql-15`), or set {BIN_DIR_ENV}=/path/to/bin to a directory \
         holding initdb, postgres and pg_ctl",
        display_paths(searched)
    )]
    BinariesNotFound {
        /// The directories that were checked, in search order.
        searched: Vec<PathBuf>,
    },

    /// This process runs as root, and there is no `postgres` user to run the
    /// server as (PostgreSQL refuses to run as root).
    #[error(
        "running as root, but PostgreSQL refuses to run as root and there is no \
         `{SERVER_USER}` system user to run it as; create one (`useradd --system \
         --user-group {SERVER_USER}`) or install the postgresql package, which creates \
         it, or run the tests as a non-root user"
    )]
    NoServerUser,

    /// The server runs as another OS user (this process is root, the server
    /// runs as `postgres`), and a directory that already existed on the way
    /// to the server's directory does not let that user in. Nothing was
    /// created or changed.
    #[error(
        "the server user {user} cannot enter {} (mode {mode:04o}, owner {owner}, group \
         {group}): PostgreSQL refuses to run as root, so the server runs as {user}, which \
         needs search (x) permission on every directory above its own; give it that (e.g. \
         `chmod o+x {}`) or {elsewhere}",
        dir.display(),
        dir.display()
    )]
    DirNotEnterable {
        /// The first directory from `/` down that the user cannot enter.
        dir: PathBuf,
        /// The user the server runs as.
        user: String,
        /// The directory's permission bits.
        mode: u32,
        /// Its owner (a name, or the number when it has none).
        owner: String,
        /// Its group (a name, or the number when it has none).
        group: String,
        /// How to put the server somewhere else instead.
        elsewhere: &'static str,
    },

    /// A file system or process operation failed.
    #[error("could not {action}: {source}")]
    Io {
        /// What was being done, including the path or program involved.
        action: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// `initdb` failed to create the data directory.
    #[error(
        "initdb could not create {} ({status}); check that its parent directory is \
         writable by the server user and has free space, and that the server binaries are \
         intact. initdb output:\n{output}",
        data_dir.display()
    )]
    InitdbFailed {
        /// The data directory initdb was asked to create: under the
        /// temporary directory for a throwaway server, under the
        /// development server's directory for `leasehold local`.
        data_dir: PathBuf,
        /// initdb's exit status.
        status: ExitStatus,
        /// initdb's combined stdout and stderr.
        output: String,
    },

    /// The server process exited while starting up.
    #[error(
        "the PostgreSQL server exited during startup ({status}); the cause is in the \
         last lines of its log (a bad `setting`, a port in use, shared memory \
         limits...):\n{log_tail}"
    )]
    StartFailed {
        /// The server's exit status.
        status: ExitStatus,
        /// The last lines of the server log.
        log_tail: String,
    },

    /// The server kept running but did not answer `SELECT 1` in time.
    #[error(
        "the PostgreSQL server did not accept queries within {waited:?}; the machine may \
         be overloaded, or crash recovery is very long; last lines of its log:\n{log_tail}"
    )]
    NotReady {
        /// How long readiness was awaited.
        waited: Duration,
        /// The last lines of the server log.
        log_tail: String,
    },

    /// `pg_ctl stop` failed or timed out.
    #[error(
        "`pg_ctl stop -m {mode}` failed ({status}); with Smart, close all connections \
         (pools) first, or use StopMode::Fast or Immediate, or kill_postmaster. pg_ctl \
         output:\n{output}"
    )]
    StopFailed {
        /// The requested mode.
        mode: StopMode,
        /// pg_ctl's exit status.
        status: ExitStatus,
        /// pg_ctl's combined stdout and stderr.
        output: String,
    },

    /// `pg_basebackup` failed to copy the source server.
    #[error(
        "pg_basebackup failed ({status}); the source server must be running and accept \
         replication connections (wal_level replica, max_wal_senders above 0). Output:\n{output}"
    )]
    BaseBackupFailed {
        /// pg_basebackup's exit status.
        status: ExitStatus,
        /// pg_basebackup's combined stdout and stderr.
        output: String,
    },

    /// `pg_ctl promote` failed or timed out.
    #[error(
        "`pg_ctl promote` failed ({status}); is the server a running standby? Output:\n{output}"
    )]
    PromoteFailed {
        /// pg_ctl's exit status.
        status: ExitStatus,
        /// pg_ctl's combined stdout and stderr.
        output: String,
    },

    /// A query the server control needs (e.g. `pg_is_in_recovery()`) failed.
    #[error("could not {action} on the local server")]
    Query {
        /// What was being asked.
        action: &'static str,
        /// The client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// The operation needs a running server, and it is stopped.
    #[error("cannot {action}: the server is not running; call restart() first")]
    NotRunning {
        /// The operation that was attempted.
        action: &'static str,
    },
}

fn display_paths(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "(nothing)".to_owned();
    }
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Builds an `Io` error mapper for `?`, naming what was being done.
pub(crate) fn io_err(action: impl Into<String>) -> impl FnOnce(io::Error) -> LocalServerError {
    let action = action.into();
    move |source| LocalServerError::Io { action, source }
}

/// A finished command's stdout followed by its stderr, as quoted in errors.
pub(crate) fn combined_output(stdout: &[u8], stderr: &[u8]) -> String {
    let mut out = Vec::with_capacity(stdout.len() + stderr.len());
    let _ = out.write_all(stdout);
    let _ = out.write_all(stderr);
    String::from_utf8_lossy(&out).trim_end().to_owned()
}
