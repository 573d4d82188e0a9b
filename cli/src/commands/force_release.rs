//! `leasehold force-release KEY`: the operator frees a key whatever its
//! state, as if its holder released it.

use leasehold::Epoch;

use crate::connect::Needs;
use crate::context::Context;
use crate::failure::{report, CliError};
use crate::help::SEE_EXIT_CODES;
use crate::json::Json;
use crate::privilege::explain;
use leasehold::admin::Operator;

/// The operator function `force-release` calls, as a GRANT names it.
const FORCE_RELEASE: &str = "lease.force_release(text)";

/// Operator: free KEY whatever its state, as if its holder released it;
/// prints the counter: every epoch up to it is stale from now on. Needs
/// EXECUTE on lease.force_release(text) (granted to nobody by default).
#[derive(Debug, clap::Args)]
#[command(after_help = SEE_EXIT_CODES)]
pub struct Args {
    /// The lease key.
    key: String,
}

/// `leasehold force-release KEY`.
pub fn run(args: Args, ctx: &Context) -> Result<(), CliError> {
    let mut session = ctx.connect(Needs::Installed)?;
    let conn = &mut session.conn;
    let key = args.key.as_str();
    if key.is_empty() {
        return Err(CliError::InvalidInput("KEY must not be empty".into()));
    }
    let counter = match conn.force_release(key) {
        Ok(counter) => counter,
        Err(error) if error.kind() == leasehold::ErrorKind::Other => {
            return Err(explain(
                conn,
                FORCE_RELEASE,
                CliError::Database(report(&error)),
            ))
        }
        Err(error) => return Err(CliError::from(error)),
    };
    let text = match counter {
        Some(counter) => format!(
            "{key} is free; its counter is {counter}: every epoch up to {counter} is stale from now on (fence guarded resources with `leasehold fence RESOURCE --key {key} --up-to {counter}`)"
        ),
        None => format!("{key} was never leased; nothing changed"),
    };
    let json = Json::Object(vec![
        ("key", Json::str(key)),
        ("exists", Json::Bool(counter.is_some())),
        ("epoch", Json::int(counter.map(Epoch::get))),
    ]);
    Ok(ctx.out.emit(&text, &json)?)
}
