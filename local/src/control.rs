//! Process control: initdb, starting the postmaster and waiting until it
//! answers, stopping it, SIGKILLing it and restarting it.

use std::fmt;
use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use diesel::{Connection, RunQueryDsl};

use crate::error::{combined_output, io_err, LocalServerError};
use crate::procfs::{child_pids, process_alive};
use crate::server::{LocalPostgres, SUPERUSER};
use crate::server_log::{read_log_tail, LOG_TAIL_LINES};

/// How long a start or restart may take before it is reported as stuck.
/// Generous because crash recovery and a loaded 2-core CI machine are slow.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Timeout handed to `pg_ctl stop -t`.
const STOP_TIMEOUT_SECS: u32 = 60;
/// How long [`LocalPostgres::kill_postmaster`] waits for orphaned backends.
const ORPHAN_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between readiness probes and other polls of external state.
const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// How [`LocalPostgres::stop`] shuts the server down (`pg_ctl stop -m`).
///
/// Not `#[non_exhaustive]`: these are exactly pg_ctl's shutdown modes, a set
/// that has not changed in PostgreSQL's history, so matching on all three
/// is safe.
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

impl LocalPostgres {
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

    pub(crate) fn lock_postmaster(&self) -> MutexGuard<'_, Option<Child>> {
        // A panic while holding the lock leaves nothing half-updated that
        // matters: the slot is re-checked with try_wait on every use.
        self.postmaster
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Stops the postmaster in `slot` (the locked postmaster field) and
    /// empties the slot; nothing to do when it is empty or exited.
    pub(crate) fn stop_locked(
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
    pub(crate) fn prepare(&self) -> Result<(), LocalServerError> {
        self.prepare_dirs()?;
        self.initdb()
    }

    /// Creates the socket directory and the log, owned by the server user.
    pub(crate) fn prepare_dirs(&self) -> Result<(), LocalServerError> {
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
        Ok(())
    }

    /// Creates the data directory with initdb.
    fn initdb(&self) -> Result<(), LocalServerError> {
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
                data_dir: self.data_dir.clone(),
                status: out.status,
                output: combined_output(&out.stdout, &out.stderr),
            });
        }
        Ok(())
    }

    /// Spawns the postmaster and waits for readiness, retrying while orphans
    /// of a killed postmaster still hold the old shared memory.
    pub(crate) fn launch(&self) -> Result<(), LocalServerError> {
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

    /// Waits until the server answers `SELECT 1`: a listening socket alone
    /// does not mean it accepts queries (startup and crash recovery refuse
    /// connections for a while).
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
    pub(crate) fn server_command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.tool_path(program));
        cmd.current_dir(&self.root).env("LC_ALL", "C");
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }
}
