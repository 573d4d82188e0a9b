//! `leasehold doctor`: is this database, and this role, ready for leasehold?
//!
//! Every check is a [`Finding`]: a name, ok / warn / fail, what was seen,
//! and what to do. The command prints them all, whatever they say, and
//! exits 0 when all are ok, 11 when the worst is a warning and 12 when
//! something fails (`leasehold --help`), so a deployment script can gate on
//! it. A check that cannot run (the role may not read a table) says so in
//! its finding instead of failing the command; only a connection that
//! cannot be opened at all ends it early (exit 8).
//!
//! Read-only except for one `NOTIFY` on a channel of its own (the listener
//! check) and nothing else: no lease, guard or namespace row is touched.
//!
//! The checks live in `checks.rs`; this module runs them and prints.

mod checks;

use std::time::Duration;

use crate::connect::Needs;
use crate::context::Context;
use crate::duration;
use crate::failure::{CliError, Exit};
use crate::help::SEE_EXIT_CODES;
use crate::json::Json;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// Nothing to do.
    Ok,
    /// Works, but something is off: degraded (polling instead of
    /// notifications), risky (durability of the application's own writes)
    /// or due (an upgrade).
    Warn,
    /// leasehold cannot work as intended here (not installed, a standby,
    /// the role cannot take leases).
    Fail,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Stable name, e.g. `install`, `privilege.act`, `clock`.
    pub name: &'static str,
    /// ok, warn or fail.
    pub status: Status,
    /// What was seen.
    pub detail: String,
    /// What to do about it ("nothing" when ok).
    pub action: String,
}

impl Finding {
    fn new(
        name: &'static str,
        status: Status,
        detail: impl Into<String>,
        action: impl Into<String>,
    ) -> Finding {
        Finding {
            name,
            status,
            detail: detail.into(),
            action: action.into(),
        }
    }

    fn to_json(&self) -> Json {
        Json::Object(vec![
            ("name", Json::str(self.name)),
            ("status", Json::str(self.status.as_str())),
            ("detail", Json::str(&self.detail)),
            ("action", Json::str(&self.action)),
        ])
    }
}

/// What `doctor` was asked to check with.
pub struct Options<'a> {
    /// The URL the session was opened with (the listener check opens a
    /// second session with it).
    pub url: &'a str,
    /// Rows idle longer than this count as prunable.
    pub idle: Duration,
}

/// Check this database and role for leasehold: install path, version
/// and pending upgrades, privileges (act, operate, list),
/// synchronous_commit, standby, pooler, listener, clock difference,
/// table sizes and prunable rows. Each finding says what to do. Exit 0
/// healthy, 11 warnings, 12 failures (8 when it cannot connect).
#[derive(Debug, clap::Args)]
#[command(after_help = SEE_EXIT_CODES)]
pub struct Args {
    /// Lapsed rows whose grant expired longer ago than this count as
    /// prunable (free rows always do: no release time is stored).
    #[arg(long, default_value = "168h", value_parser = duration::parse, allow_hyphen_values = true)]
    idle: Duration,
}

/// `leasehold doctor [--idle D]`: prints the findings; the exit code says
/// how bad the worst one is. It runs on a database where leasehold may be
/// missing (that is a finding).
pub fn run(args: Args, ctx: &Context) -> Result<Exit, CliError> {
    let mut session = ctx.connect(Needs::Nothing)?;
    let options = Options {
        url: &session.url,
        idle: args.idle,
    };
    let (conn, out) = (&mut session.conn, ctx.out);
    let findings = checks::all(conn, &options);
    let worst = findings
        .iter()
        .map(|finding| finding.status)
        .max()
        .unwrap_or(Status::Ok);
    let mut text = String::new();
    for finding in &findings {
        text.push_str(&format!(
            "[{:<4}] {:<18} {}\n",
            finding.status.as_str(),
            finding.name,
            finding.detail
        ));
        if finding.status != Status::Ok {
            text.push_str(&format!("       {:<18} -> {}\n", "", finding.action));
        }
    }
    let exit = match worst {
        Status::Ok => Exit::Ok,
        Status::Warn => Exit::DoctorWarnings,
        Status::Fail => Exit::DoctorFailures,
    };
    text.push_str(&format!(
        "{}: {} checks, {} warnings, {} failures (exit {})",
        match worst {
            Status::Ok => "healthy",
            Status::Warn => "works, with warnings",
            Status::Fail => "NOT healthy",
        },
        findings.len(),
        findings.iter().filter(|f| f.status == Status::Warn).count(),
        findings.iter().filter(|f| f.status == Status::Fail).count(),
        exit.code()
    ));
    let json = Json::Object(vec![
        ("status", Json::str(worst.as_str())),
        ("healthy", Json::Bool(worst == Status::Ok)),
        ("exit_code", Json::Int(i64::from(exit.code()))),
        (
            "findings",
            Json::Array(findings.iter().map(Finding::to_json).collect()),
        ),
    ]);
    out.emit(&text, &json)?;
    Ok(exit)
}
