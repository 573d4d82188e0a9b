//! The server handle: where the server is (URLs, directories, log) and what
//! it is (version, postmaster pid), and cleanup on drop.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Mutex;

use crate::builder::LocalPostgresBuilder;
use crate::control::StopMode;
use crate::error::{io_err, LocalServerError};
use crate::procfs::process_alive;
use crate::server_log::read_log_tail;
use crate::url::percent_encode;
use crate::watchdog::Watchdog;

/// The name of the database superuser created by `initdb -U`.
pub(crate) const SUPERUSER: &str = "postgres";

/// A PostgreSQL server running in a private temporary directory.
///
/// Dropping it stops the server and deletes the directory. It is `Send +
/// Sync`, so tests can share one through a `static OnceLock`; a watchdog
/// process cleans up such never-dropped servers when the process exits.
/// Operations that change the server's state (`stop`, `restart`,
/// `kill_postmaster`) are serialised internally.
#[derive(Debug)]
pub struct LocalPostgres {
    pub(crate) root: PathBuf,
    pub(crate) data_dir: PathBuf,
    pub(crate) socket_dir: PathBuf,
    pub(crate) log_path: PathBuf,
    pub(crate) bin_dir: PathBuf,
    pub(crate) port: u16,
    pub(crate) tcp: bool,
    /// (uid, gid) the server runs as, when it is not this process's user.
    pub(crate) run_as: Option<(u32, u32)>,
    /// Arguments for `postgres`, identical on every (re)start.
    pub(crate) server_args: Vec<OsString>,
    /// The postmaster, when started by us and not yet reaped.
    pub(crate) postmaster: Mutex<Option<Child>>,
    /// The cleanup watchdog, until `Drop` dismisses it.
    pub(crate) watchdog: Mutex<Option<Watchdog>>,
}

// Tests keep servers in statics; fail the build if that ever breaks.
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<LocalPostgres>();
};

impl LocalPostgres {
    /// Starts a durable server with default settings; see
    /// [`LocalPostgres::builder`] for the options.
    pub fn start() -> Result<Self, LocalServerError> {
        Self::builder().start()
    }

    /// A builder for a server with non-default options.
    pub fn builder() -> LocalPostgresBuilder {
        LocalPostgresBuilder::default()
    }

    /// Connection URL for database `postgres` as superuser `postgres`, over
    /// the unix socket; see [`LocalPostgres::url_for`].
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// Connection URL for `database` as superuser `postgres`, over the unix
    /// socket: `postgres://postgres@/<database>?host=<socket dir>&port=<port>`
    /// (percent-encoded). Accepted by libpq, hence by diesel's
    /// `PgConnection::establish` and r2d2's `ConnectionManager`. It stays
    /// valid across [`LocalPostgres::restart`]. No password: the server
    /// trusts local connections.
    pub fn url_for(&self, database: &str) -> String {
        format!(
            "postgres://{SUPERUSER}@/{}?host={}&port={}",
            percent_encode(database, false),
            percent_encode(&self.socket_dir.to_string_lossy(), true),
            self.port
        )
    }

    /// Connection URL over TCP, `postgres://postgres@127.0.0.1:<port>/<database>`,
    /// when the server was built with [`LocalPostgresBuilder::tcp`]; `None`
    /// for socket-only servers.
    pub fn tcp_url_for(&self, database: &str) -> Option<String> {
        self.tcp.then(|| {
            format!(
                "postgres://{SUPERUSER}@127.0.0.1:{}/{}",
                self.port,
                percent_encode(database, false)
            )
        })
    }

    /// The directory holding the server's unix socket.
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// The server's port (TCP port if enabled; also the socket's number).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's data directory (`PGDATA`).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The private temporary directory holding data directory, socket
    /// directory and log; removed on drop.
    pub fn root_dir(&self) -> &Path {
        &self.root
    }

    /// The directory of the server binaries in use.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The path of one of the installation's programs (`pg_basebackup`,
    /// `pg_dump`, `psql`, ...): in [`LocalPostgres::bin_dir`] when it is
    /// there, else next to the real `postgres` binary (a `bin_dir` on `PATH`
    /// may hold only links to initdb, postgres and pg_ctl), so that a server
    /// and its tools always come from one version.
    pub fn tool_path(&self, program: &str) -> PathBuf {
        let direct = self.bin_dir.join(program);
        if direct.exists() {
            return direct;
        }
        match fs::canonicalize(self.bin_dir.join("postgres")) {
            Ok(real) => match real.parent() {
                Some(dir) if dir.join(program).exists() => dir.join(program),
                _ => direct,
            },
            Err(_) => direct,
        }
    }

    /// The server log (stdout and stderr of every start), useful when a test
    /// fails.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last `lines` lines of the server log (empty if unreadable).
    pub fn log_tail(&self, lines: usize) -> String {
        read_log_tail(&self.log_path, 0, lines)
    }

    /// The pid of the running postmaster, read from `postmaster.pid`; `None`
    /// when the server is stopped or the pid file is stale (after
    /// [`LocalPostgres::kill_postmaster`]).
    pub fn postmaster_pid(&self) -> Option<u32> {
        let text = fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        let pid: u32 = text.lines().next()?.trim().parse().ok()?;
        process_alive(pid).then_some(pid)
    }

    /// The server's version, e.g. `"15.18"`, from `postgres --version`.
    pub fn server_version(&self) -> Result<String, LocalServerError> {
        let program = self.bin_dir.join("postgres");
        let out = Command::new(&program)
            .arg("--version")
            .env("LC_ALL", "C")
            .output()
            .map_err(io_err(format!("run `{} --version`", program.display())))?;
        let text = String::from_utf8_lossy(&out.stdout);
        // "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"
        let version = text
            .split_once(')')
            .map(|(_, rest)| rest)
            .unwrap_or(&text)
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_owned();
        if version.is_empty() {
            return Err(LocalServerError::Io {
                action: format!("parse the output of `{} --version`", program.display()),
                source: io::Error::new(io::ErrorKind::InvalidData, text.trim().to_owned()),
            });
        }
        Ok(version)
    }
}

impl Drop for LocalPostgres {
    fn drop(&mut self) {
        {
            let mut slot = self.lock_postmaster();
            if self.stop_locked(&mut slot, StopMode::Fast).is_err() {
                if let Some(child) = slot.as_mut() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                *slot = None;
            }
        }
        let _ = fs::remove_dir_all(&self.root);
        let watchdog = self
            .watchdog
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(watchdog) = watchdog {
            watchdog.dismiss();
        }
    }
}
