//! Everything a command can end with other than success, and its exit code.
//!
//! Ordinary lease outcomes that are not what the caller asked for (a denial,
//! a lapsed grant) are failures *of the command*: a script running
//! `leasehold renew ... || stop_work` must see them in the exit code. Each
//! variant says what happened and what to do next, and carries the facts a
//! script needs for the `--json` form.

use std::time::Duration;

use chrono::{DateTime, Utc};
use leasehold::error::{ErrorKind, LeaseError, Operation};
use leasehold::Refusal;
use leasehold_local::LocalServerError;

use crate::duration;
use crate::json::Json;
use crate::logging::LogSetupError;

/// Process exit codes; documented in `--help` (see `help::EXIT_CODES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: the command did what was asked.
    Ok = 0,
    /// 1: unexpected failure.
    Unexpected = 1,
    /// 2: invalid input or usage (also clap's own code for usage errors).
    InvalidInput = 2,
    /// 3: the key is held by another owner.
    Denied = 3,
    /// 4: the caller's grant lapsed.
    Lapsed = 4,
    /// 5: the caller holds the key under another epoch.
    EpochMismatch = 5,
    /// 6: the caller does not own the key: superseded, released,
    /// force-released or never held.
    NotOwner = 6,
    /// 7: a `--wait` passed with the key held throughout.
    WaitTimedOut = 7,
    /// 8: connection, database, privilege or installation problem.
    Database = 8,
    /// 9: a guard refused.
    GuardRefused = 9,
    /// 10: the role may not do this: an operator action it was not granted,
    /// or a key or resource whose namespace is bound to another role; or
    /// `extension install` may not write the server's extension directory.
    PermissionDenied = 10,
    /// 11: `doctor` found warnings and no failure.
    DoctorWarnings = 11,
    /// 12: `doctor` found at least one failure.
    DoctorFailures = 12,
    /// 13: `run` could not start the command.
    CommandNotStarted = 13,
    /// 14: `local status` / `local env`: the development server is not
    /// running.
    LocalNotRunning = 14,
}

impl Exit {
    /// The code handed to the operating system.
    pub fn code(self) -> u8 {
        self as u8
    }
}

/// Why a command did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The arguments were refused (by the CLI or the database's rules).
    #[error("invalid input: {0}; fix the arguments and run the command again (see --help)")]
    InvalidInput(String),
    /// Another owner holds the key.
    #[error("lease {key:?} is held by {}; retry later, pass --wait <duration> to wait for it, or run `leasehold inspect {key}`", describe_holder(.holder))]
    Denied {
        /// The key.
        key: String,
        /// Holder, epoch and expiry, when a follow-up inspect still saw them.
        holder: Option<(String, i64, DateTime<Utc>)>,
    },
    /// A renew or release found the grant gone.
    #[error("{operation} of lease {key:?} by {owner:?} at epoch {epoch} refused: {}", explain_lost(*.why))]
    Lost {
        /// `"renew"` or `"release"`.
        operation: &'static str,
        /// The key.
        key: String,
        /// The owner presented.
        owner: String,
        /// The epoch presented.
        epoch: i64,
        /// Why.
        why: Refusal,
    },
    /// `--wait` passed with the key held throughout.
    #[error("timed out after waiting {} for lease {key:?}, which another owner held throughout; retry later, pass a longer --wait, or run `leasehold inspect {key}`", duration::format(*.wait))]
    WaitTimedOut {
        /// The key.
        key: String,
        /// The wait that passed.
        wait: Duration,
    },
    /// A guard refused the write or fence.
    #[error("{0}")]
    Guard(LeaseError),
    /// The role lacks EXECUTE on an operator function (PostgreSQL's own
    /// "permission denied for function", SQLSTATE 42501).
    #[error("role {role:?} may not run {function}: operator actions are granted to nobody by default; run the command as the role that installed leasehold, or have that role run `GRANT EXECUTE ON FUNCTION {function} TO {role}`")]
    NotGranted {
        /// The connected role (`current_user`).
        role: String,
        /// The function's signature, e.g. `lease.force_release(text)`.
        function: &'static str,
    },
    /// An operator bound the name's prefix to a role the connected login
    /// role is not a member of (`lease_namespace_denied`).
    #[error("role {role:?} may not {operation} {argument} {name:?}: an operator bound its prefix to another role; connect as a member of that role (SET ROLE does not count), or ask an operator (`leasehold namespace ls` shows the rules)")]
    Forbidden {
        /// The refused call, as the SQL function is named.
        operation: String,
        /// `key` or `resource`.
        argument: String,
        /// The refused name.
        name: String,
        /// The login role refused.
        role: String,
    },
    /// `release --force KEY --epoch N` found grant N not live and could not
    /// end it: the key is held under a newer epoch (`newer_grant`, left
    /// alone) or epoch N was never granted (`no_such_grant`). Nothing changed.
    #[error("{}", explain_force_refusal(.key, *.epoch, .status, *.counter))]
    ForceReleaseRefused {
        /// The key.
        key: String,
        /// The epoch asked for.
        epoch: i64,
        /// `newer_grant` or `no_such_grant`.
        status: &'static str,
        /// The key's counter (the newer grant's epoch for `newer_grant`),
        /// `None` for a never-leased key.
        counter: Option<i64>,
    },
    /// The server accepts only reads (SQLSTATE 25006): a standby, or a
    /// primary being demoted during a failover.
    #[error("{operation} refused: the server is read-only (a standby, or a primary being demoted during a failover); point --database-url at the primary, or list every host and add target_session_attrs=read-write (postgres://user@host1:5432,host2:5432/db?target_session_attrs=read-write) so the writable one is chosen")]
    ReadOnlyServer {
        /// The refused call, as the SQL function is named.
        operation: String,
    },
    /// No connection could be made.
    #[error("cannot connect to {url}: {message}; check --database-url (or DATABASE_URL), that the server is running and that the role may log in")]
    Connect {
        /// The URL with any password removed.
        url: String,
        /// What libpq said.
        message: String,
    },
    /// `run`: the lease was lost while the command ran; the command was
    /// stopped.
    #[error("lease {key:?} (epoch {epoch}) was lost while the command ran: {loss}; the command was sent SIGTERM {} before the safe deadline and {status}; its writes after that must be fenced by the token (a guard refuses them once a successor's epoch reached the resource)", duration::format(*.ahead))]
    LostWhileRunning {
        /// The key.
        key: String,
        /// The lost grant's epoch.
        epoch: i64,
        /// What the keeper reported.
        loss: String,
        /// How long before the safe deadline the SIGTERM went out.
        ahead: Duration,
        /// How the command ended.
        status: String,
    },
    /// `run` could not start the command.
    #[error(
        "cannot run {command:?}: {source}; check the command after --; the lease was released"
    )]
    CommandNotStarted {
        /// The program.
        command: String,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// A server on this machine (`--throwaway` or `leasehold local`) could
    /// not be created, started or stopped.
    #[error("the local PostgreSQL failed: {0}")]
    LocalServer(#[from] LocalServerError),
    /// No database was named: no --database-url, no DATABASE_URL and no
    /// --throwaway. Nothing ran.
    #[error("no database given: pass --database-url postgres://user@host/db or set DATABASE_URL; for a development server on this machine, run `leasehold local start` (then commands use it); for a throwaway PostgreSQL that lives only for this one command, pass --throwaway")]
    NoDatabase,
    /// `local status` / `local env`: the development server does not run.
    #[error(
        "the development server in {dir} is not running; start it with `leasehold local start`"
    )]
    LocalNotRunning {
        /// Where it lives.
        dir: String,
    },
    /// The lease functions are missing from the database.
    #[error("leasehold is not installed in this database; run `leasehold install` with the same --database-url first")]
    NotInstalled,
    /// The role may not read `lease.leases` and `lease.groups` (needed by ls and watch).
    #[error("the role {role:?} may not read lease.leases and lease.groups, which ls and watch list (the tables are closed to callers by design); connect as a superuser or as the role that ran `leasehold install`, or use `leasehold inspect KEY`, which needs no privilege")]
    NoListPrivilege {
        /// The connected role.
        role: String,
    },
    /// The database failed the operation.
    #[error("{0}")]
    Database(String),
    /// The demo could not complete.
    #[error("the demo could not complete: {0}; run it again, and if it keeps failing, report the output above")]
    Demo(String),
    /// `leasehold extension generate` could not generate or write the files.
    #[error("cannot generate the extension files: {0}")]
    Extension(String),
    /// `leasehold extension install`: `pg_config --sharedir` could not be
    /// run or printed no directory.
    #[error("cannot ask {program} for the server's share directory: {message}; put the pg_config of the PostgreSQL that is to load the extension on PATH, or pass --pg-config PATH")]
    PgConfig {
        /// The pg_config program, as given or looked up on PATH.
        program: String,
        /// What went wrong.
        message: String,
    },
    /// `leasehold extension install`: the server's extension directory
    /// could not be written (typically: it belongs to root). Nothing else
    /// was changed; `command` writes the files there.
    #[error("cannot write the extension files into {dir}: {reason}; run `{command}` (as a user who may write there), then CREATE EXTENSION leasehold")]
    ExtensionDirNotWritable {
        /// `<sharedir>/extension`.
        dir: String,
        /// What the operating system said, with the path.
        reason: String,
        /// The one command that writes the files there.
        command: String,
    },
    /// `LEASEHOLD_LOG` holds no usable filter; the command did not run.
    #[error("{0}")]
    LogSetup(#[from] LogSetupError),
    /// Writing the output failed (e.g. the reading end of a pipe closed).
    #[error("could not write the output: {0}; check where stdout goes")]
    Output(#[from] std::io::Error),
}

fn describe_holder(holder: &Option<(String, i64, DateTime<Utc>)>) -> String {
    match holder {
        Some((owner, epoch, expires_at)) => {
            format!("{owner:?} (epoch {epoch}, expires {expires_at})")
        }
        None => "another owner".to_owned(),
    }
}

fn explain_force_refusal(key: &str, epoch: i64, status: &str, counter: Option<i64>) -> String {
    match (status, counter) {
        ("newer_grant", Some(current)) => format!(
            "grant {epoch} of {key:?} has ended already and the key is held under epoch {current} now; that newer grant was left alone (nothing changed). Check `leasehold inspect {key}`, and pass --epoch {current} to end it too"
        ),
        (_, None) => format!("{key:?} was never leased; nothing changed; check the key"),
        (_, Some(counter)) => format!(
            "{key:?} was never granted epoch {epoch} (its counter is {counter}); nothing changed; check the epoch with `leasehold inspect {key}`"
        ),
    }
}

/// What happened to the grant and what to do, in the words of the
/// operations guide's table ("Words").
fn explain_lost(why: Refusal) -> String {
    match why {
        Refusal::Lapsed { taken_over_by: None } => "lapsed: the ttl passed without a renewal; stop acting on the lease and acquire the key again for a new epoch".into(),
        Refusal::Lapsed { taken_over_by: Some(by) } => format!("lapsed, and taken over at epoch {by}: the ttl passed without a renewal and the key was granted again; stop acting on the lease, and acquire the key again once it is free"),
        Refusal::EpochMismatch { held: Some(held) } => format!("epoch_mismatch: this owner holds the key at epoch {held}; use the epoch the latest acquire printed"),
        Refusal::EpochMismatch { held: None } => "epoch_mismatch: this owner holds the key at another epoch; use the epoch the latest acquire printed (`leasehold inspect KEY` shows it)".into(),
        Refusal::Superseded { by } => format!("superseded: this grant ended and the key was granted again, at epoch {by}; stop acting on the lease"),
        Refusal::Released => "released: this grant was released already, by its holder; acquire the key again for a new epoch".into(),
        Refusal::ForceReleased => "force_released: an operator ended this grant (`leasehold release --force`); stop acting on the lease".into(),
        Refusal::NeverHeld => "never_held: this owner holds no grant of the key at this epoch; check the key, owner and epoch (`leasehold inspect KEY`)".into(),
        // A guard's or a fenced table's refusal: renew and release never answer one.
        other => format!("{other}; stop acting on the lease"),
    }
}

impl CliError {
    /// The exit code for this failure.
    pub fn exit(&self) -> Exit {
        match self {
            CliError::InvalidInput(_) | CliError::NoDatabase | CliError::PgConfig { .. } => {
                Exit::InvalidInput
            }
            // Installing a global subscriber twice is this command's bug.
            CliError::LogSetup(LogSetupError::Install(_)) => Exit::Unexpected,
            CliError::LogSetup(_) => Exit::InvalidInput,
            CliError::Denied { .. } => Exit::Denied,
            CliError::LostWhileRunning { .. } => Exit::Lapsed,
            CliError::CommandNotStarted { .. } => Exit::CommandNotStarted,
            CliError::LocalNotRunning { .. } => Exit::LocalNotRunning,
            CliError::Lost { why, .. } => match why {
                Refusal::Lapsed { .. } => Exit::Lapsed,
                Refusal::EpochMismatch { .. } => Exit::EpochMismatch,
                _ => Exit::NotOwner,
            },
            CliError::WaitTimedOut { .. } => Exit::WaitTimedOut,
            CliError::ForceReleaseRefused { status, .. } => {
                if *status == "newer_grant" {
                    Exit::EpochMismatch
                } else {
                    Exit::NotOwner
                }
            }
            CliError::Guard(error) if is_guard_refusal(error) => Exit::GuardRefused,
            CliError::Guard(_)
            | CliError::ReadOnlyServer { .. }
            | CliError::Connect { .. }
            | CliError::LocalServer(_)
            | CliError::NotInstalled
            | CliError::NoListPrivilege { .. }
            | CliError::Database(_) => Exit::Database,
            CliError::NotGranted { .. }
            | CliError::Forbidden { .. }
            | CliError::ExtensionDirNotWritable { .. } => Exit::PermissionDenied,
            CliError::Demo(_) | CliError::Output(_) | CliError::Extension(_) => Exit::Unexpected,
        }
    }

    /// A stable machine-readable name for `--json`.
    fn kind(&self) -> &'static str {
        match self {
            CliError::NoDatabase => "no_database",
            CliError::InvalidInput(_) => "invalid_input",
            CliError::LogSetup(LogSetupError::Install(_)) => "log_setup",
            CliError::LogSetup(_) => "invalid_input",
            CliError::Denied { .. } => "denied",
            CliError::LostWhileRunning { .. } => "lost",
            CliError::CommandNotStarted { .. } => "command_not_started",
            CliError::LocalNotRunning { .. } => "local_not_running",
            CliError::Lost { why, .. } => why.as_reason(),
            CliError::WaitTimedOut { .. } => "wait_timed_out",
            CliError::ForceReleaseRefused { status, .. } => status,
            CliError::Guard(error) if is_guard_refusal(error) => match error.refusal() {
                Some(
                    refusal @ (Refusal::StaleEpoch { .. }
                    | Refusal::WrongKey
                    | Refusal::EpochNotGranted { .. }),
                ) => refusal.as_reason(),
                _ => "lease_not_held",
            },
            CliError::Connect { .. } | CliError::LocalServer(_) => "cannot_connect",
            CliError::ReadOnlyServer { .. } => "read_only_server",
            CliError::NotInstalled => "not_installed",
            CliError::NoListPrivilege { .. } => "no_privilege",
            CliError::NotGranted { .. } => "not_granted",
            CliError::Forbidden { .. } => "namespace_denied",
            CliError::Guard(_) | CliError::Database(_) => "database",
            CliError::Demo(_) => "demo_failed",
            CliError::Output(_) => "output",
            CliError::Extension(_) => "extension",
            CliError::PgConfig { .. } => "pg_config",
            CliError::ExtensionDirNotWritable { .. } => "extension_dir_not_writable",
        }
    }

    /// The `--json` form: kind, exit code, message, and the facts.
    pub fn to_json(&self) -> Json {
        let mut fields = vec![
            ("error", Json::str(self.kind())),
            ("exit_code", Json::Int(i64::from(self.exit().code()))),
            ("message", Json::str(self.to_string())),
        ];
        match self {
            CliError::Denied { key, holder } => {
                fields.push(("key", Json::str(key)));
                fields.push((
                    "holder",
                    Json::opt_str(holder.as_ref().map(|(owner, _, _)| owner.as_str())),
                ));
                fields.push(("epoch", Json::int(holder.as_ref().map(|h| h.1))));
                fields.push(("expires_at", Json::time(holder.as_ref().map(|h| h.2))));
            }
            CliError::Lost {
                key,
                owner,
                epoch,
                why,
                ..
            } => {
                fields.push(("sql_status", Json::str(why.as_status())));
                fields.push(("key", Json::str(key)));
                fields.push(("owner", Json::str(owner)));
                fields.push(("epoch", Json::Int(*epoch)));
                if let Some(newer) = why.newer_epoch() {
                    fields.push(("newer_epoch", Json::Int(newer.get())));
                }
            }
            CliError::WaitTimedOut { key, wait } => {
                fields.push(("key", Json::str(key)));
                fields.push((
                    "wait_ms",
                    Json::Int(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX)),
                ));
            }
            CliError::Guard(error) => {
                let text = |value: Option<&str>| Json::str(value.unwrap_or_default());
                let epoch = || Json::Int(error.epoch().map_or(0, |epoch| epoch.get()));
                match error.refusal() {
                    Some(Refusal::StaleEpoch { accepted }) => {
                        fields.push(("resource", text(error.resource())));
                        fields.push(("presented_epoch", epoch()));
                        fields.push(("accepted_epoch", Json::Int(accepted.get())));
                    }
                    Some(Refusal::WrongKey) => {
                        fields.push(("resource", text(error.resource())));
                        fields.push(("fenced_by", text(error.fenced_by())));
                        fields.push(("presented", text(error.key())));
                    }
                    Some(Refusal::EpochNotGranted { counter }) => {
                        fields.push(("resource", text(error.resource())));
                        fields.push(("key", text(error.key())));
                        fields.push(("presented_epoch", epoch()));
                        fields.push(("counter", Json::Int(counter.get())));
                    }
                    _ => {}
                }
            }
            CliError::ForceReleaseRefused {
                key,
                epoch,
                status,
                counter,
            } => {
                fields.push(("key", Json::str(key)));
                fields.push(("epoch", Json::Int(*epoch)));
                fields.push(("status", Json::str(*status)));
                fields.push(("counter", Json::int(*counter)));
            }
            CliError::PgConfig { program, .. } => {
                fields.push(("pg_config", Json::str(program)));
            }
            CliError::ExtensionDirNotWritable { dir, command, .. } => {
                fields.push(("dir", Json::str(dir)));
                fields.push(("command", Json::str(command)));
            }
            CliError::ReadOnlyServer { operation } => {
                fields.push(("operation", Json::str(operation)));
            }
            CliError::NotGranted { role, function } => {
                fields.push(("role", Json::str(role)));
                fields.push(("function", Json::str(*function)));
            }
            CliError::Forbidden {
                operation,
                argument,
                name,
                role,
            } => {
                fields.push(("operation", Json::str(operation)));
                fields.push(("argument", Json::str(argument)));
                fields.push(("name", Json::str(name)));
                fields.push(("role", Json::str(role)));
            }
            _ => {}
        }
        Json::Object(fields)
    }
}

/// An error and its causes on one line (`what happened: because: because`):
/// the library's messages say only what happened and keep the cause as
/// their source; a command line is where the whole chain is shown.
pub fn report(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(inner.to_string().trim());
        cause = inner.source();
    }
    text
}

/// The one mapping of a library error to the command's: the facts a
/// command reports specially, and the rest as a database failure with its
/// causes.
impl From<LeaseError> for CliError {
    fn from(error: LeaseError) -> Self {
        let operation = || error.operation().map(|operation| operation.to_string());
        match error.kind() {
            ErrorKind::InvalidInput if !error.violations().is_empty() => {
                CliError::InvalidInput(error.violations().join("; "))
            }
            ErrorKind::TimedOut if error.operation() == Some(Operation::ACQUIRE) => {
                CliError::WaitTimedOut {
                    key: error.key().unwrap_or_default().to_owned(),
                    wait: error.waited().unwrap_or_default(),
                }
            }
            ErrorKind::Forbidden if is_namespace_refusal(&error) => {
                let (argument, name) = match error.resource() {
                    Some(resource) => ("resource", resource),
                    None => ("key", error.key().unwrap_or_default()),
                };
                CliError::Forbidden {
                    operation: operation().unwrap_or_default(),
                    argument: argument.to_owned(),
                    name: name.to_owned(),
                    role: error.role().unwrap_or_default().to_owned(),
                }
            }
            ErrorKind::Unavailable if error.is_read_only_server() => CliError::ReadOnlyServer {
                operation: operation().unwrap_or_default(),
            },
            _ if is_guard_refusal(&error) => CliError::Guard(error),
            _ => CliError::Database(report(&error)),
        }
    }
}

/// A guard refused the writer (as opposed to a fenced table, or a failure).
fn is_guard_refusal(error: &LeaseError) -> bool {
    error.kind() == ErrorKind::Fenced && error.table().is_none()
}

/// A namespace rule refused a key or resource (not a table's owner or a privilege).
fn is_namespace_refusal(error: &LeaseError) -> bool {
    error.table().is_none() && (error.key().is_some() || error.resource().is_some())
}
