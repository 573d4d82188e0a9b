//! `leasehold prune --idle <duration> [--dry-run]`: the operator removes
//! the rows of keys nobody uses any more (docs/SPECIFICATION.md §1.8),
//! through [`leasehold::admin::prune`], batch by batch, each batch committed on its
//! own.
//!
//! The prune functions are granted to nobody by default, so a refusal is
//! explained with the GRANT that fixes it (see `privilege::explain`).

use std::time::Duration;

use diesel::PgConnection;
use leasehold::{
    admin::{PruneOptions, PruneReport},
    error::LeaseError,
};

use crate::connect::Needs;
use crate::context::Context;
use crate::duration;
use crate::failure::{report, CliError};
use crate::help::SEE_EXIT_CODES;
use crate::json::Json;
use crate::privilege::explain;
use leasehold::admin::Operator;

/// The functions a role needs EXECUTE on, as a GRANT names them.
const PRUNE_KEYS: &str = "lease.prune_keys(interval, bytea, integer, boolean)";
const PRUNE_GUARDS: &str = "lease.prune_guards(interval, bytea, integer, boolean)";

/// Operator: remove the rows of keys FREE or LAPSED for longer than
/// --idle, with the guard records of resources fenced only by them, in
/// short batches. Epochs stay safe: a key that comes back starts above
/// every epoch it had, and stale epochs stay refused. A FREE key is
/// removed only when a prune saw it FREE at least --idle earlier (the
/// first prune records it). Needs EXECUTE on lease.prune_keys and
/// lease.prune_guards (granted to nobody by default).
#[derive(Debug, clap::Args)]
#[command(after_help = SEE_EXIT_CODES)]
pub struct Args {
    /// How long a key must have been unused, e.g. 168h.
    #[arg(long, value_parser = duration::parse, allow_hyphen_values = true)]
    idle: Duration,
    /// Change nothing; say what a prune would remove now.
    #[arg(long)]
    dry_run: bool,
}

/// `leasehold prune --idle IDLE [--dry-run]`.
pub fn run(args: Args, ctx: &Context) -> Result<(), CliError> {
    let mut session = ctx.connect(Needs::Installed)?;
    let conn = &mut session.conn;
    let Args { idle, dry_run } = args;
    if idle.is_zero() {
        return Err(CliError::InvalidInput(
            "--idle must be positive (e.g. 7d is written 168h); nothing changed".into(),
        ));
    }
    let options = PruneOptions {
        dry_run,
        ..PruneOptions::new(idle)
    };
    let done = conn.prune(&options).map_err(|error| failure(conn, error))?;
    Ok(ctx.out.emit(&text(&done, idle), &json(&done, idle))?)
}

fn text(done: &PruneReport, idle: Duration) -> String {
    let idle = duration::format(idle);
    if done.dry_run {
        return format!(
            "dry run, nothing changed: a prune now would remove {} of {} key rows (LAPSED, or FREE at the same counter since a prune saw them, for longer than {idle}) and {} of {} guard records (of keys already gone), and would record {} FREE key rows seen for the first time (a prune at least {idle} later removes them if they are still FREE); guard records of keys it removes go on the prune after",
            done.keys_pruned, done.keys_examined, done.guards_pruned, done.guards_examined, done.keys_sighted
        );
    }
    format!(
        "removed {} of {} key rows, {} of {} guard records and {} waiter rows of gone sessions; recorded {} FREE key rows seen for the first time (a prune at least {idle} later removes them if they are still FREE); watermark {}: a key that comes back gets an epoch above it ({} batches)",
        done.keys_pruned,
        done.keys_examined,
        done.guards_pruned,
        done.guards_examined,
        done.waiters_pruned,
        done.keys_sighted,
        done.watermark,
        done.batches
    )
}

fn json(done: &PruneReport, idle: Duration) -> Json {
    let count = |n: u64| Json::Int(i64::try_from(n).unwrap_or(i64::MAX));
    Json::Object(vec![
        ("dry_run", Json::Bool(done.dry_run)),
        ("idle", Json::str(duration::format(idle))),
        ("keys_examined", count(done.keys_examined)),
        ("keys_pruned", count(done.keys_pruned)),
        ("keys_sighted", count(done.keys_sighted)),
        ("guards_examined", count(done.guards_examined)),
        ("guards_pruned", count(done.guards_pruned)),
        ("waiters_pruned", count(done.waiters_pruned)),
        ("watermark", Json::Int(done.watermark)),
        ("batches", count(done.batches)),
    ])
}

fn failure(conn: &mut PgConnection, error: LeaseError) -> CliError {
    match error.violations() {
        [] => {
            let failure = CliError::Database(report(&error));
            // The keys pass runs first; its function is the one refused.
            match explain(conn, PRUNE_KEYS, failure) {
                CliError::Database(text) => explain(conn, PRUNE_GUARDS, CliError::Database(text)),
                explained => explained,
            }
        }
        violations => CliError::InvalidInput(format!("{}; nothing changed", violations.join("; "))),
    }
}
