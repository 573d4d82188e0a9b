//! Servers made from a base backup of another: streaming standbys
//! (`pg_basebackup -R`) and restores that end on a new timeline, and
//! promotion. What leasehold's failover tests run on (docs/SPECIFICATION.md
//! §1.7).

use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use diesel::sql_types::Bool;
use diesel::{Connection, QueryableByName, RunQueryDsl};

use crate::error::{combined_output, io_err, LocalServerError};
use crate::server::{LocalPostgres, SUPERUSER};
use crate::server_log::LOG_TAIL_LINES;

/// How long a promotion (or a restore's recovery) may take.
const PROMOTE_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between polls of `pg_is_in_recovery()`.
const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// What a server made from a base backup of another is
/// ([`crate::LocalPostgresBuilder::from_base_backup`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackupMode {
    /// A streaming standby of the source (`pg_basebackup -R`): read only,
    /// replaying the source's WAL as it arrives, until
    /// [`LocalPostgres::promote`]. Asynchronous unless the source lists it
    /// in `synchronous_standby_names` (`'*'` will do).
    Standby,
    /// A restore from the backup: archive recovery (`recovery.signal`) that
    /// ends at the backup's consistency point (`recovery_target =
    /// 'immediate'`) and promotes onto a new timeline, as a point-in-time
    /// recovery does. The start returns once the server accepts writes.
    RestoreAndPromote,
}

/// Where a server's base backup comes from.
#[derive(Debug, Clone)]
pub(crate) struct BackupSource {
    pub(crate) socket_dir: PathBuf,
    pub(crate) port: u16,
    pub(crate) mode: BackupMode,
}

impl BackupSource {
    pub(crate) fn of(source: &LocalPostgres, mode: BackupMode) -> BackupSource {
        BackupSource {
            socket_dir: source.socket_dir.clone(),
            port: source.port,
            mode,
        }
    }
}

#[derive(QueryableByName)]
struct InRecovery {
    #[diesel(sql_type = Bool)]
    in_recovery: bool,
}

impl LocalPostgres {
    /// Creates the socket directory and the log, and fills the data
    /// directory with a base backup of `source` (instead of initdb).
    pub(crate) fn prepare_from_backup(
        &self,
        source: &BackupSource,
    ) -> Result<(), LocalServerError> {
        self.prepare_dirs()?;
        let mut cmd = self.server_command("pg_basebackup");
        cmd.arg("-D")
            .arg(&self.data_dir)
            .arg("-h")
            .arg(&source.socket_dir)
            .args(["-p", &source.port.to_string(), "-U", SUPERUSER])
            .args(["-X", "stream", "-c", "fast", "--no-sync"]);
        if source.mode == BackupMode::Standby {
            cmd.arg("-R");
        }
        let out = cmd.stdin(Stdio::null()).output().map_err(io_err(format!(
            "run `{}`",
            self.tool_path("pg_basebackup").display()
        )))?;
        if !out.status.success() {
            return Err(LocalServerError::BaseBackupFailed {
                status: out.status,
                output: combined_output(&out.stdout, &out.stderr),
            });
        }
        if source.mode == BackupMode::RestoreAndPromote {
            // No archive: every WAL file the recovery needs came with the
            // backup (-X stream), and restore_command only has to exist.
            self.write_data_file("recovery.signal", "", false)?;
            self.write_data_file(
                "postgresql.auto.conf",
                "restore_command = 'false'\nrecovery_target = 'immediate'\nrecovery_target_action = 'promote'\n",
                true,
            )?;
        }
        Ok(())
    }

    /// Writes (or appends to) a file in the data directory, owned by the
    /// server user.
    fn write_data_file(
        &self,
        name: &str,
        text: &str,
        append: bool,
    ) -> Result<(), LocalServerError> {
        let path = self.data_dir.join(name);
        let mut file = fs::OpenOptions::new()
            .create(true)
            .append(append)
            .write(true)
            .truncate(!append)
            .open(&path)
            .map_err(io_err(format!("open {}", path.display())))?;
        file.write_all(text.as_bytes())
            .map_err(io_err(format!("write {}", path.display())))?;
        if let Some((uid, gid)) = self.run_as {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid)).map_err(io_err(format!(
                "chown {} to the server user",
                path.display()
            )))?;
        }
        Ok(())
    }

    /// Promotes this standby (`pg_ctl promote -w`) and returns once it
    /// accepts writes on its new timeline.
    pub fn promote(&self) -> Result<(), LocalServerError> {
        let out = self
            .server_command("pg_ctl")
            .arg("promote")
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-w", "-t", &PROMOTE_TIMEOUT.as_secs().to_string()])
            .stdin(Stdio::null())
            .output()
            .map_err(io_err(format!(
                "run `{}`",
                self.bin_dir.join("pg_ctl").display()
            )))?;
        if !out.status.success() {
            return Err(LocalServerError::PromoteFailed {
                status: out.status,
                output: combined_output(&out.stdout, &out.stderr),
            });
        }
        self.wait_out_of_recovery()
    }

    /// Whether the server is a standby (or still recovering).
    pub fn in_recovery(&self) -> Result<bool, LocalServerError> {
        let mut conn = diesel::pg::PgConnection::establish(&self.url()).map_err(|source| {
            LocalServerError::Query {
                action: "connect",
                source: Box::new(source),
            }
        })?;
        diesel::sql_query("SELECT pg_is_in_recovery() AS in_recovery")
            .get_result::<InRecovery>(&mut conn)
            .map(|row| row.in_recovery)
            .map_err(|source| LocalServerError::Query {
                action: "ask pg_is_in_recovery()",
                source: Box::new(source),
            })
    }

    /// Waits until `pg_is_in_recovery()` answers false.
    pub(crate) fn wait_out_of_recovery(&self) -> Result<(), LocalServerError> {
        let started = Instant::now();
        loop {
            if let Ok(false) = self.in_recovery() {
                return Ok(());
            }
            if started.elapsed() >= PROMOTE_TIMEOUT {
                return Err(LocalServerError::NotReady {
                    waited: started.elapsed(),
                    log_tail: self.log_tail(LOG_TAIL_LINES),
                });
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }
}
