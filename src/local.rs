//! A throwaway local PostgreSQL server for tests, examples and benchmarks.
//!
//! Leases are only as good as the database behaviour underneath them, so the
//! tests of this crate (and of its users) run against a real PostgreSQL
//! server rather than a mock. [`LocalPostgres`] creates one in a private
//! temporary directory from the server binaries installed on this machine,
//! waits until it really accepts queries, and removes every trace of it when
//! it is dropped.
//!
//! Besides start and stop it can simulate the failures that fencing exists
//! for: [`LocalPostgres::kill_postmaster`] SIGKILLs the server (the database
//! then runs crash recovery on [`LocalPostgres::restart`]), and a restart
//! keeps the same URL so that connection pools can reconnect.
//!
//! # Cleanup
//!
//! Dropping a [`LocalPostgres`] stops the server and removes its directory,
//! also while a panic unwinds. Servers kept in a `static` are never dropped,
//! and a test process may be killed outright, so every server also gets a
//! small watchdog shell process. It blocks reading a pipe whose only write end
//! this process holds; when this process exits for any reason the pipe
//! closes and the watchdog shuts the server down and deletes the directory.
//!
//! # Root
//!
//! `initdb` and `postgres` refuse to run as root. When this process runs as
//! root (containers, CI) the server runs as the `postgres` system user
//! instead, which the `postgresql` packages create.
//!
//! # Example
//!
//! ```no_run
//! use diesel::{Connection, RunQueryDsl};
//! use leasehold::local::LocalPostgres;
//!
//! let server = LocalPostgres::builder().durable(false).start()?;
//! let mut conn = diesel::pg::PgConnection::establish(&server.url())?;
//! diesel::sql_query("SELECT 1").execute(&mut conn)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::TcpListener;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use diesel::{Connection, RunQueryDsl};

/// Environment variable naming a directory with `initdb`, `postgres` and
/// `pg_ctl`; it takes precedence over every automatic search.
pub const BIN_DIR_ENV: &str = "LEASEHOLD_PG_BIN";

/// The name of the database superuser created by `initdb -U`.
const SUPERUSER: &str = "postgres";
/// The system user the server runs as when this process is root.
const SERVER_USER: &str = "postgres";
/// Port for socket-only servers. The socket lives in a private directory,
/// so the well-known port cannot clash with another server.
const SOCKET_ONLY_PORT: u16 = 5432;
/// How long a start or restart may take before it is reported as stuck.
/// Generous because crash recovery and a loaded 2-core CI machine are slow.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Timeout handed to `pg_ctl stop -t`.
const STOP_TIMEOUT_SECS: u32 = 60;
/// How long [`LocalPostgres::kill_postmaster`] waits for orphaned backends.
const ORPHAN_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between readiness probes and other polls of external state.
const POLL_INTERVAL: Duration = Duration::from_millis(25);
/// Lines of the server log quoted in errors.
const LOG_TAIL_LINES: usize = 20;
/// How many times a TCP server is retried when its free port was taken
/// between probing and binding.
const TCP_PORT_ATTEMPTS: usize = 3;
/// Unix socket paths are limited to ~107 bytes; stay well below.
const MAX_SOCKET_PATH: usize = 100;

/// Distinguishes servers started by one process.
static SERVER_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Shell script run by the watchdog process; `$1` is the data directory and
/// `$2` the root directory to remove.
///
/// It waits for end-of-file on stdin (this process died or dropped the
/// server), then fast-shuts-down the postmaster named in `postmaster.pid`
/// (after checking that the pid still belongs to a process working in our
/// data directory, so a reused pid is never signalled), waits a bounded time
/// for it to exit (zombies count as exited: our orphans may be reparented to
/// an init that does not reap), and removes the directory.
const WATCHDOG_SCRIPT: &str = r#"
trap '' INT HUP QUIT PIPE
read -r line || true
data="$1"
root="$2"
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  if [ -r "/proc/$1/stat" ]; then
    state=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)
    [ "$state" != Z ] || return 1
  fi
  return 0
}
ours() {
  if [ -d "/proc/$1" ]; then
    [ "$(readlink "/proc/$1/cwd" 2>/dev/null)" = "$data" ] || return 1
  fi
  return 0
}
pid=$(head -n 1 "$data/postmaster.pid" 2>/dev/null)
case "$pid" in ''|*[!0-9]*) pid= ;; esac
if [ -n "$pid" ] && alive "$pid" && ours "$pid"; then
  kill -INT "$pid" 2>/dev/null
  i=0
  while alive "$pid" && [ "$i" -lt 300 ]; do sleep 0.1; i=$((i+1)); done
  if alive "$pid"; then kill -KILL "$pid" 2>/dev/null; fi
fi
rm -rf "$root"
"#;

/// How [`LocalPostgres::stop`] shuts the server down (`pg_ctl stop -m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopMode {
    /// Wait for all clients to disconnect, then shut down cleanly. Blocks
    /// (up to pg_ctl's timeout) while any connection, e.g. a pool, is open.
    Smart,
    /// Disconnect clients, roll back their transactions, checkpoint and shut
    /// down cleanly. What `Drop` uses.
    Fast,
    /// Abort all processes without a checkpoint; the next start runs crash
    /// recovery, like after a power cut of the database process (the OS page
    /// cache survives, unlike a real power cut).
    Immediate,
}

impl StopMode {
    /// The mode name `pg_ctl stop -m` expects.
    pub fn as_str(self) -> &'static str {
        match self {
            StopMode::Smart => "smart",
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        }
    }
}

impl fmt::Display for StopMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a local server could not be created, started or stopped.
///
/// Every message says what went wrong and what to do about it.
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
        "initdb failed ({status}); check that the temporary directory ({}) is writable \
         and has free space, and that the server binaries are intact. initdb output:\n{output}",
        std::env::temp_dir().display()
    )]
    InitdbFailed {
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

/// Builds an `Io` error mapper for `?`.
fn io_err(action: impl Into<String>) -> impl FnOnce(io::Error) -> LocalServerError {
    let action = action.into();
    move |source| LocalServerError::Io { action, source }
}

/// Configures a [`LocalPostgres`] before starting it.
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until start() is called"]
pub struct LocalPostgresBuilder {
    bin_dir: Option<PathBuf>,
    durable: bool,
    tcp: bool,
    settings: Vec<(String, String)>,
}

impl Default for LocalPostgresBuilder {
    fn default() -> Self {
        Self {
            bin_dir: None,
            durable: true,
            tcp: false,
            settings: Vec::new(),
        }
    }
}

impl LocalPostgresBuilder {
    /// Uses the server binaries in `dir` instead of searching for them.
    ///
    /// Without this, the search order is: the `LEASEHOLD_PG_BIN` environment
    /// variable, a `PATH` entry holding `initdb` and `postgres`,
    /// `pg_config --bindir`, and the highest version under
    /// `/usr/lib/postgresql/*/bin`. A directory qualifies only if it holds
    /// `initdb`, `postgres` and `pg_ctl`; an explicit directory (or the
    /// environment variable) that does not qualify is an error rather than
    /// silently replaced by another installation.
    pub fn bin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.bin_dir = Some(dir.into());
        self
    }

    /// Whether commits are durable (the default, `true`).
    ///
    /// Durable servers run with `fsync`, `synchronous_commit` and
    /// `full_page_writes` on, as in production, so benchmarks measure real
    /// commit costs. `false` turns all three off, which makes tests much
    /// faster; committed data still survives [`LocalPostgres::kill_postmaster`]
    /// because the OS page cache survives a process crash.
    pub fn durable(mut self, yes: bool) -> Self {
        self.durable = yes;
        self
    }

    /// Also listen on TCP at 127.0.0.1, on a free port (default: unix socket
    /// only). Needed by clients that cannot use unix sockets; see
    /// [`LocalPostgres::tcp_url_for`].
    pub fn tcp(mut self, yes: bool) -> Self {
        self.tcp = yes;
        self
    }

    /// Adds a server setting, passed as `-c name=value` after the built-in
    /// ones (so it overrides them), e.g. `("log_statement", "all")` or
    /// `("max_connections", "200")`. Do not override `port`,
    /// `listen_addresses` or `unix_socket_directories`: the URLs would be
    /// wrong.
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.settings.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Creates the data directory, starts the server and waits until it
    /// answers queries.
    pub fn start(self) -> Result<LocalPostgres, LocalServerError> {
        let bin_dir = find_bin_dir(self.bin_dir.as_deref())?;
        let run_as = server_identity()?;
        let attempts = if self.tcp { TCP_PORT_ATTEMPTS } else { 1 };
        let mut attempt = 1;
        loop {
            match self.start_once(&bin_dir, run_as) {
                Err(LocalServerError::StartFailed { ref log_tail, .. })
                    if attempt < attempts && log_tail.contains("could not bind") =>
                {
                    // Another process took the free port between our probe
                    // and the server's bind; try another port.
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    fn start_once(
        &self,
        bin_dir: &Path,
        run_as: Option<(u32, u32)>,
    ) -> Result<LocalPostgres, LocalServerError> {
        let port = if self.tcp {
            free_tcp_port()?
        } else {
            SOCKET_ONLY_PORT
        };
        let root = create_root_dir(run_as)?;
        // The watchdog exists from here on, so the directory is removed even
        // if this process is killed during initdb.
        let watchdog = match spawn_watchdog(&root) {
            Ok(w) => w,
            Err(e) => {
                let _ = fs::remove_dir_all(&root);
                return Err(e);
            }
        };
        let data_dir = root.join("data");
        let socket_dir = root.join("s");
        let server = LocalPostgres {
            server_args: self.server_args(&data_dir, &socket_dir, port),
            log_path: root.join("server.log"),
            data_dir,
            socket_dir,
            root,
            bin_dir: bin_dir.to_owned(),
            port,
            tcp: self.tcp,
            run_as,
            postmaster: Mutex::new(None),
            watchdog: Mutex::new(Some(watchdog)),
        };
        // From here on, an error drops `server`, which cleans up.
        server.prepare()?;
        server.launch()?;
        Ok(server)
    }

    fn server_args(&self, data_dir: &Path, socket_dir: &Path, port: u16) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "-D".into(),
            data_dir.into(),
            "-k".into(),
            socket_dir.into(),
            "-p".into(),
            port.to_string().into(),
        ];
        let listen = if self.tcp { "127.0.0.1" } else { "" };
        let on_off = if self.durable { "on" } else { "off" };
        let mut settings: Vec<(String, String)> = vec![
            ("listen_addresses".into(), listen.into()),
            ("fsync".into(), on_off.into()),
            ("synchronous_commit".into(), on_off.into()),
            ("full_page_writes".into(), on_off.into()),
        ];
        settings.extend(self.settings.iter().cloned());
        for (name, value) in settings {
            args.push("-c".into());
            args.push(format!("{name}={value}").into());
        }
        args
    }
}

/// A PostgreSQL server running in a private temporary directory.
///
/// Dropping it stops the server and deletes the directory. It is `Send +
/// Sync`, so tests can share one through a `static OnceLock`; a watchdog
/// process cleans up such never-dropped servers when the process exits.
/// Operations that change the server's state (`stop`, `restart`,
/// `kill_postmaster`) are serialised internally.
#[derive(Debug)]
pub struct LocalPostgres {
    root: PathBuf,
    data_dir: PathBuf,
    socket_dir: PathBuf,
    log_path: PathBuf,
    bin_dir: PathBuf,
    port: u16,
    tcp: bool,
    /// (uid, gid) the server runs as, when it is not this process's user.
    run_as: Option<(u32, u32)>,
    /// Arguments for `postgres`, identical on every (re)start.
    server_args: Vec<OsString>,
    /// The postmaster, when started by us and not yet reaped.
    postmaster: Mutex<Option<Child>>,
    /// The watchdog and the write end of its stdin pipe.
    watchdog: Mutex<Option<(Child, ChildStdin)>>,
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

    /// Shuts the server down with `pg_ctl stop -m <mode> -w` and waits until
    /// it has exited. Stopping a stopped (or killed) server does nothing.
    pub fn stop(&self, mode: StopMode) -> Result<(), LocalServerError> {
        let mut slot = self.lock_postmaster();
        self.stop_locked(&mut slot, mode)
    }

    /// Simulates a crash of the database: SIGKILLs the postmaster and waits
    /// until it and the backends it had forked are gone (they exit on their
    /// own when they notice the postmaster died). Committed data survives;
    /// [`LocalPostgres::restart`] then runs crash recovery.
    pub fn kill_postmaster(&self) -> Result<(), LocalServerError> {
        let mut slot = self.lock_postmaster();
        let Some(child) = slot.as_mut() else {
            return Err(LocalServerError::NotRunning {
                action: "kill the postmaster",
            });
        };
        if child
            .try_wait()
            .map_err(io_err("check whether the postmaster is running"))?
            .is_some()
        {
            *slot = None;
            return Err(LocalServerError::NotRunning {
                action: "kill the postmaster",
            });
        }
        let pid = child.id();
        // Orphaned backends keep the old shared memory attached, and a new
        // postmaster refuses to start until they are gone; remember them.
        let children = child_pids(pid);
        child
            .kill()
            .map_err(io_err(format!("SIGKILL the postmaster (pid {pid})")))?;
        child
            .wait()
            .map_err(io_err(format!("reap the killed postmaster (pid {pid})")))?;
        *slot = None;
        let deadline = Instant::now() + ORPHAN_TIMEOUT;
        while children.iter().any(|&c| process_alive(c)) && Instant::now() < deadline {
            std::thread::sleep(POLL_INTERVAL);
        }
        // Should a backend outlive the deadline, restart() still retries
        // while the server reports the shared memory in use.
        Ok(())
    }

    /// Starts the server again on the same data directory, socket and port,
    /// after [`LocalPostgres::stop`] or [`LocalPostgres::kill_postmaster`]
    /// (a running server is fast-stopped first), and waits until it answers
    /// queries. After a kill this includes crash recovery. URLs stay valid.
    pub fn restart(&self) -> Result<(), LocalServerError> {
        {
            let mut slot = self.lock_postmaster();
            self.stop_locked(&mut slot, StopMode::Fast)?;
        }
        self.launch()
    }

    fn lock_postmaster(&self) -> MutexGuard<'_, Option<Child>> {
        // A panic while holding the lock leaves nothing half-updated that
        // matters: the slot is re-checked with try_wait on every use.
        self.postmaster
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn stop_locked(
        &self,
        slot: &mut Option<Child>,
        mode: StopMode,
    ) -> Result<(), LocalServerError> {
        let Some(child) = slot.as_mut() else {
            return Ok(());
        };
        if child
            .try_wait()
            .map_err(io_err("check whether the postmaster is running"))?
            .is_some()
        {
            *slot = None;
            return Ok(());
        }
        let out = self
            .server_command("pg_ctl")
            .arg("stop")
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-m", mode.as_str(), "-w", "-t"])
            .arg(STOP_TIMEOUT_SECS.to_string())
            .stdin(Stdio::null())
            .output()
            .map_err(io_err(format!(
                "run `{}`",
                self.bin_dir.join("pg_ctl").display()
            )))?;
        if !out.status.success() {
            return Err(LocalServerError::StopFailed {
                mode,
                status: out.status,
                output: combined_output(&out.stdout, &out.stderr),
            });
        }
        child
            .wait()
            .map_err(io_err("reap the stopped postmaster"))?;
        *slot = None;
        Ok(())
    }

    /// Creates the socket directory and the log, and runs initdb.
    fn prepare(&self) -> Result<(), LocalServerError> {
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&self.socket_dir)
            .map_err(io_err(format!("create {}", self.socket_dir.display())))?;
        fs::File::create(&self.log_path)
            .map_err(io_err(format!("create {}", self.log_path.display())))?;
        if let Some((uid, gid)) = self.run_as {
            for path in [&self.socket_dir, &self.log_path] {
                std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(io_err(format!(
                    "chown {} to the server user",
                    path.display()
                )))?;
            }
        }
        // --no-sync: the data directory is throwaway, and a machine crash
        // loses it anyway; durability of commits is governed by the server
        // settings, not by initdb.
        let out = self
            .server_command("initdb")
            .arg("-D")
            .arg(&self.data_dir)
            .args([
                "-U",
                SUPERUSER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .stdin(Stdio::null())
            .output()
            .map_err(io_err(format!(
                "run `{}`",
                self.bin_dir.join("initdb").display()
            )))?;
        if !out.status.success() {
            return Err(LocalServerError::InitdbFailed {
                status: out.status,
                output: combined_output(&out.stdout, &out.stderr),
            });
        }
        Ok(())
    }

    /// Spawns the postmaster and waits for readiness, retrying while orphans
    /// of a killed postmaster still hold the old shared memory.
    fn launch(&self) -> Result<(), LocalServerError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut slot = self.lock_postmaster();
        loop {
            let log_start = fs::metadata(&self.log_path).map(|m| m.len()).unwrap_or(0);
            let log = fs::OpenOptions::new()
                .append(true)
                .open(&self.log_path)
                .map_err(io_err(format!("open {}", self.log_path.display())))?;
            let log_err = log
                .try_clone()
                .map_err(io_err(format!("duplicate {}", self.log_path.display())))?;
            let child = self
                .server_command("postgres")
                .args(&self.server_args)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log_err)
                // Own process group: a Ctrl-C in the terminal reaches the test
                // process only, and the watchdog shuts the server down.
                .process_group(0)
                .spawn()
                .map_err(io_err(format!(
                    "start `{}`",
                    self.bin_dir.join("postgres").display()
                )))?;
            let child = slot.insert(child);
            match self.wait_ready(child, deadline) {
                Err(LocalServerError::StartFailed { .. })
                    if Instant::now() < deadline
                        && read_log_tail(&self.log_path, log_start, usize::MAX)
                            .contains("pre-existing shared memory block") =>
                {
                    *slot = None;
                    std::thread::sleep(POLL_INTERVAL);
                }
                other => return other,
            }
        }
    }

    fn wait_ready(&self, child: &mut Child, deadline: Instant) -> Result<(), LocalServerError> {
        let started = Instant::now();
        let url = format!("{}&connect_timeout=10", self.url());
        loop {
            if let Some(status) = child
                .try_wait()
                .map_err(io_err("check whether the postmaster is running"))?
            {
                return Err(LocalServerError::StartFailed {
                    status,
                    log_tail: self.log_tail(LOG_TAIL_LINES),
                });
            }
            if let Ok(mut conn) = diesel::pg::PgConnection::establish(&url) {
                if diesel::sql_query("SELECT 1").execute(&mut conn).is_ok() {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(LocalServerError::NotReady {
                    waited: started.elapsed(),
                    log_tail: self.log_tail(LOG_TAIL_LINES),
                });
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// A command for a server binary, run as the server user, in the root
    /// directory (the current directory may not be accessible to it), with
    /// English messages (errors are matched on their text).
    fn server_command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin_dir.join(program));
        cmd.current_dir(&self.root).env("LC_ALL", "C");
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        cmd
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
        if let Some((mut child, stdin)) = watchdog {
            // EOF: the watchdog finds nothing left to clean and exits.
            drop(stdin);
            let _ = child.wait();
        }
    }
}

/// The effective uid of this process.
fn effective_uid() -> Option<u32> {
    if let Ok(status) = fs::read_to_string("/proc/self/status") {
        if let Some(line) = status.lines().find(|l| l.starts_with("Uid:")) {
            // Uid: real effective saved fs
            if let Some(euid) = line.split_whitespace().nth(2) {
                return euid.parse().ok();
            }
        }
    }
    let out = Command::new("id").arg("-u").output().ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// `Some((uid, gid))` of the `postgres` user when running as root, `None`
/// when the server can run as the current user.
fn server_identity() -> Result<Option<(u32, u32)>, LocalServerError> {
    if effective_uid() != Some(0) {
        return Ok(None);
    }
    let passwd = fs::read_to_string("/etc/passwd").map_err(io_err("read /etc/passwd"))?;
    passwd
        .lines()
        .find_map(|line| {
            let mut fields = line.split(':');
            if fields.next()? != SERVER_USER {
                return None;
            }
            let _password = fields.next()?;
            let uid = fields.next()?.parse().ok()?;
            let gid = fields.next()?.parse().ok()?;
            Some(Some((uid, gid)))
        })
        .ok_or(LocalServerError::NoServerUser)
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn qualifies(dir: &Path) -> bool {
    ["initdb", "postgres", "pg_ctl"]
        .iter()
        .all(|name| is_executable(&dir.join(name)))
}

/// Finds the server binaries; see [`LocalPostgresBuilder::bin_dir`].
fn find_bin_dir(explicit: Option<&Path>) -> Result<PathBuf, LocalServerError> {
    if let Some(dir) = explicit {
        return if qualifies(dir) {
            Ok(dir.to_owned())
        } else {
            Err(LocalServerError::BinariesNotFound {
                searched: vec![dir.to_owned()],
            })
        };
    }
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV).filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        return if qualifies(&dir) {
            Ok(dir)
        } else {
            Err(LocalServerError::BinariesNotFound {
                searched: vec![dir],
            })
        };
    }
    let mut searched = Vec::new();
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if is_executable(&dir.join("initdb")) && is_executable(&dir.join("postgres")) {
                if qualifies(&dir) {
                    return Ok(dir);
                }
                searched.push(dir);
            }
        }
        searched.push(PathBuf::from("$PATH"));
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        if out.status.success() {
            let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if qualifies(&dir) {
                return Ok(dir);
            }
            searched.push(dir);
        }
    }
    let base = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(Vec<u64>, PathBuf)> = fs::read_dir(base)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let version = name
                        .split('.')
                        .map(|part| part.parse::<u64>().ok())
                        .collect::<Option<Vec<u64>>>()?;
                    Some((version, entry.path().join("bin")))
                })
                .collect()
        })
        .unwrap_or_default();
    versions.sort();
    if let Some((_, dir)) = versions.iter().rev().find(|(_, dir)| qualifies(dir)) {
        return Ok(dir.clone());
    }
    searched.push(base.join("*").join("bin"));
    Err(LocalServerError::BinariesNotFound { searched })
}

/// Creates the private root directory: mode 0700, owned by the server user.
fn create_root_dir(run_as: Option<(u32, u32)>) -> Result<PathBuf, LocalServerError> {
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
    // "<root>/s/.s.PGSQL.65535" must fit a unix socket address.
    let socket_len = |base: &Path| base.join(&name).as_os_str().len() + "/s/.s.PGSQL.65535".len();
    if socket_len(&base) >= MAX_SOCKET_PATH {
        base = PathBuf::from("/tmp");
    }
    let root = base.join(&name);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&root)
        .map_err(io_err(format!("create {}", root.display())))?;
    // The watchdog compares the postmaster's working directory (as the
    // kernel reports it, symlinks resolved) with the data directory.
    let root = match fs::canonicalize(&root) {
        Ok(canonical) if canonical.as_os_str().len() + 18 < MAX_SOCKET_PATH => canonical,
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

/// Spawns the watchdog; see [`WATCHDOG_SCRIPT`].
fn spawn_watchdog(root: &Path) -> Result<(Child, ChildStdin), LocalServerError> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(WATCHDOG_SCRIPT)
        .arg("sh")
        .arg(root.join("data"))
        .arg(root)
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Own process group, so a terminal's Ctrl-C does not kill it
        // along with this process.
        .process_group(0)
        .spawn()
        .map_err(io_err("start the cleanup watchdog (`sh`)"))?;
    match child.stdin.take() {
        Some(stdin) => Ok((child, stdin)),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            Err(LocalServerError::Io {
                action: "open the cleanup watchdog's stdin".to_owned(),
                source: io::Error::other("no stdin pipe"),
            })
        }
    }
}

fn free_tcp_port() -> Result<u16, LocalServerError> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(io_err("find a free TCP port on 127.0.0.1"))?;
    let port = listener
        .local_addr()
        .map_err(io_err("find a free TCP port on 127.0.0.1"))?
        .port();
    Ok(port)
}

/// Whether a process with this pid exists and is not a zombie.
fn process_alive(pid: u32) -> bool {
    if Path::new("/proc/self/stat").exists() {
        return match fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => stat_fields(&stat).is_some_and(|f| f.first() != Some(&"Z")),
            Err(_) => false,
        };
    }
    Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// The fields of `/proc/<pid>/stat` after the command name: state, ppid, ...
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().collect())
}

/// Pids of the live children of `parent` (Linux only; empty elsewhere).
fn child_pids(parent: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let parent = parent.to_string();
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(entry.path().join("stat")).ok()?;
            let fields = stat_fields(&stat)?;
            (fields.get(1) == Some(&parent.as_str())).then_some(pid)
        })
        .collect()
}

/// The last `lines` lines of the log written after byte `from`.
fn read_log_tail(path: &Path, from: u64, lines: usize) -> String {
    const MAX_BYTES: u64 = 64 * 1024;
    let Ok(mut file) = fs::File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = from.max(len.saturating_sub(MAX_BYTES));
    if file.seek(SeekFrom::Start(start)).is_err() {
        return String::new();
    }
    let mut bytes = Vec::new();
    if file.read_to_end(&mut bytes).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn combined_output(stdout: &[u8], stderr: &[u8]) -> String {
    let mut out = Vec::with_capacity(stdout.len() + stderr.len());
    let _ = out.write_all(stdout);
    let _ = out.write_all(stderr);
    String::from_utf8_lossy(&out).trim_end().to_owned()
}

/// Percent-encodes everything but RFC 3986 unreserved characters (and `/`
/// when `keep_slash`, which libpq accepts raw in query values).
fn percent_encode(text: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        let keep = byte.is_ascii_alphanumeric()
            || matches!(byte, b'-' | b'.' | b'_' | b'~')
            || (keep_slash && byte == b'/');
        if keep {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoding_keeps_paths_readable() {
        assert_eq!(percent_encode("/tmp/a b", true), "/tmp/a%20b");
        assert_eq!(percent_encode("db/x", false), "db%2Fx");
    }

    #[test]
    fn stat_fields_skip_command_names_with_spaces() {
        let stat = "42 (postgres: check pointer) S 7 42 42 0";
        assert_eq!(stat_fields(stat).and_then(|f| f.get(1).copied()), Some("7"));
    }
}
