//! A persistent development server: `leasehold local start|stop|status|env`.
//!
//! Unlike [`crate::LocalPostgres`], which lives and dies with one process,
//! this server outlives the command that started it and keeps its data
//! between starts, so a developer can run `leasehold` commands and an
//! application against the same database all day. It lives in one
//! directory:
//!
//! * `$LEASEHOLD_LOCAL_DIR` when set;
//! * otherwise the user's data directory, `$XDG_DATA_HOME/leasehold/local`
//!   or `~/.local/share/leasehold/local`;
//! * for root, `/var/lib/leasehold/local`: the server runs as the
//!   `postgres` user, which may not enter root's home.
//!
//! As root, the directories `start` creates on the way there get mode 0710
//! and the `postgres` user's group, so that the server can pass through
//! them; directories that already exist are checked, not changed, and one
//! the server user cannot enter fails the start (naming it) before anything
//! is created.
//!
//! Inside: `data/` (the cluster), `s/` (its socket), `server.log`,
//! `port`, the TCP port chosen at the first start and kept, so the URL
//! stays the same, and `lock`, which overlapping starts and stops take in
//! turn. The server listens on 127.0.0.1 only and trusts local
//! connections (no password): it is for development, never for data that
//! matters.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::binaries::find_bin_dir;
use crate::error::{combined_output, io_err, LocalServerError};
use crate::server::SUPERUSER;
use crate::server_dirs::create_server_dir;
use crate::server_user::server_identity;

/// Overrides where the development server lives.
pub const LOCAL_DIR_ENV: &str = "LEASEHOLD_LOCAL_DIR";

/// How long `start` and `stop` wait for the server (pg_ctl's `-t`).
const PG_CTL_WAIT_SECS: &str = "60";

/// The persistent development server in one directory.
#[derive(Debug, Clone)]
pub struct DevServer {
    root: PathBuf,
    bin_dir: PathBuf,
    run_as: Option<(u32, u32)>,
}

/// Whether the development server runs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DevStatus {
    /// It runs and answers at this URL.
    Running {
        /// `postgres://postgres@127.0.0.1:PORT/postgres`.
        url: String,
    },
    /// Its data directory exists, but no server runs on it.
    Stopped,
    /// It was never started in this directory.
    NotCreated,
}

impl DevServer {
    /// The server in the default directory (see the module docs).
    pub fn from_env() -> Result<Self, LocalServerError> {
        let run_as = server_identity()?;
        Self::at(default_root(run_as.is_some())?)
    }

    /// The server in `root` (created by [`DevServer::start`]).
    pub fn at(root: impl Into<PathBuf>) -> Result<Self, LocalServerError> {
        Ok(Self {
            root: root.into(),
            bin_dir: find_bin_dir(None)?,
            run_as: server_identity()?,
        })
    }

    /// The directory it lives in.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Creates the cluster on the first call, starts the server if it is
    /// not running, and returns its URL. Idempotent.
    pub fn start(&self) -> Result<String, LocalServerError> {
        create_server_dir(
            &self.root,
            self.run_as,
            &self.bin_dir,
            "set LEASEHOLD_LOCAL_DIR to another directory",
        )?;
        let _turn = self.take_turn()?;
        if let DevStatus::Running { url } = self.status()? {
            return Ok(url);
        }
        if !self.data_dir().join("PG_VERSION").exists() {
            self.create()?;
        }
        let port = self.port()?;
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1",
            self.root.join("s").display()
        );
        let out = self
            .command("pg_ctl")
            .arg("start")
            .arg("-w")
            .args(["-t", PG_CTL_WAIT_SECS])
            .arg("-D")
            .arg(self.data_dir())
            .arg("-l")
            .arg(self.root.join("server.log"))
            .arg("-o")
            .arg(options)
            .stdin(Stdio::null())
            .output()
            .map_err(io_err("run pg_ctl start"))?;
        if !out.status.success() {
            let log = fs::read_to_string(self.root.join("server.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(LocalServerError::StartFailed {
                status: out.status,
                log_tail: format!(
                    "{}\n{}",
                    combined_output(&out.stdout, &out.stderr),
                    tail.join("\n")
                ),
            });
        }
        Ok(self.url(port))
    }

    /// Stops the server (fast shutdown: open sessions are ended); returns
    /// whether it was running.
    pub fn stop(&self) -> Result<bool, LocalServerError> {
        if !self.root.exists() {
            // Never started here: nothing to stop, and nothing to create.
            return Ok(false);
        }
        let _turn = self.take_turn()?;
        if !matches!(self.status()?, DevStatus::Running { .. }) {
            return Ok(false);
        }
        let out = self
            .command("pg_ctl")
            .arg("stop")
            .args(["-m", "fast", "-w", "-t", PG_CTL_WAIT_SECS])
            .arg("-D")
            .arg(self.data_dir())
            .stdin(Stdio::null())
            .output()
            .map_err(io_err("run pg_ctl stop"))?;
        if !out.status.success() {
            return Err(LocalServerError::Io {
                action: format!(
                    "stop the development server in {}: {}",
                    self.root.display(),
                    combined_output(&out.stdout, &out.stderr)
                ),
                source: std::io::Error::other("pg_ctl stop failed"),
            });
        }
        Ok(true)
    }

    /// Whether the server runs (`pg_ctl status`), and its URL if so.
    pub fn status(&self) -> Result<DevStatus, LocalServerError> {
        if !self.data_dir().join("PG_VERSION").exists() {
            return Ok(DevStatus::NotCreated);
        }
        let status = self
            .command("pg_ctl")
            .arg("status")
            .arg("-D")
            .arg(self.data_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(io_err("run pg_ctl status"))?;
        if status.success() {
            Ok(DevStatus::Running {
                url: self.url(self.port()?),
            })
        } else {
            Ok(DevStatus::Stopped)
        }
    }

    /// Waits until no other `start` or `stop` on this directory runs, and
    /// holds it off until the returned file is dropped. Without it, starts
    /// that overlap (two terminals, a parallel make, jobs started together)
    /// each saw no cluster and ran initdb on the same directory, or each
    /// ran pg_ctl: all but one failed. The lock is the kernel's (flock), so
    /// a command that dies releases it.
    /// The directory must exist (`start` creates it).
    fn take_turn(&self) -> Result<fs::File, LocalServerError> {
        let path = self.root.join("lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_err(format!("open {}", path.display())))?;
        file.lock()
            .map_err(io_err(format!("lock {}", path.display())))?;
        Ok(file)
    }

    fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    fn url(&self, port: u16) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{port}/postgres")
    }

    /// The port chosen at creation.
    fn port(&self) -> Result<u16, LocalServerError> {
        let path = self.root.join("port");
        let text = fs::read_to_string(&path).map_err(io_err(format!("read {}", path.display())))?;
        text.trim().parse().map_err(|_| LocalServerError::Io {
            action: format!("read the port from {}", path.display()),
            source: std::io::Error::other(format!("{text:?} is not a port number")),
        })
    }

    /// Creates the directory, the cluster and the port file.
    fn create(&self) -> Result<(), LocalServerError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(self.root.join("s"))
            .map_err(io_err(format!("create {}", self.root.display())))?;
        if let Some((uid, gid)) = self.run_as {
            for path in [self.root.clone(), self.root.join("s")] {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid)).map_err(io_err(format!(
                    "chown {} to the server user",
                    path.display()
                )))?;
            }
        }
        let out = self
            .command("initdb")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--locale=C"])
            .stdin(Stdio::null())
            .output()
            .map_err(io_err("run initdb"))?;
        if !out.status.success() {
            return Err(LocalServerError::InitdbFailed {
                data_dir: self.data_dir(),
                status: out.status,
                output: combined_output(&out.stdout, &out.stderr),
            });
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(io_err("find a free TCP port on 127.0.0.1"))?;
        let port = listener
            .local_addr()
            .map_err(io_err("find a free TCP port on 127.0.0.1"))?
            .port();
        let path = self.root.join("port");
        fs::write(&path, format!("{port}\n")).map_err(io_err(format!("write {}", path.display())))
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin_dir.join(program));
        command.current_dir(&self.root).env("LC_ALL", "C");
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid).gid(gid);
        }
        command
    }
}

/// See the module docs.
fn default_root(as_root: bool) -> Result<PathBuf, LocalServerError> {
    if let Some(dir) = std::env::var_os(LOCAL_DIR_ENV).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    if as_root {
        return Ok(PathBuf::from("/var/lib/leasehold/local"));
    }
    if let Some(data) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(data).join("leasehold").join("local"));
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".local/share/leasehold/local")),
        None => Err(LocalServerError::Io {
            action: format!("find a directory for the development server (set {LOCAL_DIR_ENV})"),
            source: std::io::Error::other("neither HOME nor XDG_DATA_HOME is set"),
        }),
    }
}
