//! `leasehold generation show | raise`: the server's generation, which
//! orders epochs across failover; raising it is an operator action.

use clap::Subcommand;
use diesel::PgConnection;
use leasehold::admin::{Generation, MAX_GENERATION};
use leasehold::error::{ErrorKind, LeaseError};

use crate::connect::Needs;
use crate::context::Context;
use crate::failure::{report, CliError};
use crate::help::SEE_EXIT_CODES;
use crate::json::Json;
use crate::output::Printer;
use crate::privilege::explain;
use leasehold::admin::Operator;

/// The operator function `generation raise` calls, as a GRANT names it.
const RAISE_GENERATION: &str = "lease.raise_generation(bigint)";

/// The server's generation: epochs order across failover because every
/// grant is at least (generation << 40) + 1. `show` needs no privilege;
/// `raise` needs EXECUTE on lease.raise_generation(bigint) (granted to
/// nobody by default).
#[derive(Debug, Subcommand)]
#[command(after_help = SEE_EXIT_CODES)]
pub enum Action {
    /// Show the current generation, the timeline and the lowest epoch the
    /// next grant can get.
    #[command(after_help = SEE_EXIT_CODES)]
    Show,
    /// Operator: raise the generation to GENERATION (above the current one,
    /// at most 8388607): every grant from now on, of every key, gets an
    /// epoch of at least (GENERATION << 40) + 1.
    #[command(after_help = SEE_EXIT_CODES)]
    Raise {
        /// The new generation.
        generation: i64,
    },
}

/// `leasehold generation ...`.
pub fn run(action: Action, ctx: &Context) -> Result<(), CliError> {
    let mut session = ctx.connect(Needs::Installed)?;
    let conn = &mut session.conn;
    let out = ctx.out;
    match action {
        Action::Show => show(conn, out),
        Action::Raise { generation } => raise(conn, out, generation),
    }
}

/// `leasehold generation show`.
fn show(conn: &mut PgConnection, out: Printer) -> Result<(), CliError> {
    let now = conn
        .generation()
        .map_err(|error| generation_failure(conn, None, None, error))?;
    let text = format!(
        "generation {} (timeline {}): every grant from now on has an epoch of at least {}",
        now.generation,
        now.timeline,
        now.floor_epoch()
    );
    Ok(out.emit(&text, &generation_json(now))?)
}

/// `leasehold generation raise GENERATION`.
fn raise(conn: &mut PgConnection, out: Printer, generation: i64) -> Result<(), CliError> {
    conn.raise_generation(generation).map_err(|error| {
        generation_failure(conn, Some(RAISE_GENERATION), Some(generation), error)
    })?;
    let now = conn
        .generation()
        .map_err(|error| generation_failure(conn, None, None, error))?;
    let text = format!(
        "raised the generation to {}: every grant from now on, of every key, has an epoch of at least {}",
        now.generation,
        now.floor_epoch()
    );
    Ok(out.emit(&text, &generation_json(now))?)
}

fn generation_json(now: Generation) -> Json {
    Json::Object(vec![
        ("generation", Json::Int(now.generation)),
        ("timeline", Json::Int(now.timeline)),
        ("floor_epoch", Json::Int(now.floor_epoch().get())),
    ])
}

fn generation_failure(
    conn: &mut PgConnection,
    function: Option<&'static str>,
    requested: Option<i64>,
    error: LeaseError,
) -> CliError {
    let requested = function.and(requested);
    match (error.kind(), error.current_generation(), requested) {
        (ErrorKind::InvalidInput, Some(current), Some(requested)) => CliError::InvalidInput(format!(
            "GENERATION {requested} is not above the current generation {current}; a generation is only ever raised; nothing changed"
        )),
        (ErrorKind::InvalidInput, None, Some(requested)) if requested > MAX_GENERATION => {
            CliError::InvalidInput(format!(
                "GENERATION {requested} is above the highest generation, {MAX_GENERATION}; nothing changed"
            ))
        }
        (ErrorKind::InvalidInput, _, _) if !error.violations().is_empty() => {
            CliError::InvalidInput(error.violations().join("; "))
        }
        _ => {
            let failure = CliError::Database(report(&error));
            match function {
                Some(function) => explain(conn, function, failure),
                None => failure,
            }
        }
    }
}
