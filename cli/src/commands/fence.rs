//! `leasehold fence RESOURCE --key KEY --up-to EPOCH`: the operator raises
//! a guard after a holder lapsed or released.

use leasehold::Epoch;

use crate::connect::Needs;
use crate::context::Context;
use crate::failure::{report, CliError};
use crate::help::SEE_EXIT_CODES;
use crate::json::Json;
use crate::privilege::explain;
use leasehold::guard::Fencing;

/// The operator function `fence` calls, as a GRANT names it.
const FENCE: &str = "lease.fence(text, text, bigint)";

/// Raise RESOURCE's guard so it refuses every epoch up to --up-to of
/// lease --key (operator action after a holder lapsed or released).
#[derive(Debug, clap::Args)]
#[command(after_help = SEE_EXIT_CODES)]
pub struct Args {
    /// The guarded resource's name, as the application uses it.
    resource: String,
    /// The lease key whose epochs fence the resource.
    #[arg(long)]
    key: String,
    /// Refuse this epoch and every lower one from now on.
    #[arg(long)]
    up_to: i64,
}

/// `leasehold fence RESOURCE --key KEY --up-to EPOCH`.
pub fn run(args: Args, ctx: &Context) -> Result<(), CliError> {
    let mut session = ctx.connect(Needs::Installed)?;
    let conn = &mut session.conn;
    let (resource, key) = (args.resource.as_str(), args.key.as_str());
    let accepted = match conn.fence(resource, key, Epoch::new(args.up_to)) {
        Ok(accepted) => accepted,
        // An operator action since security part 2: say when the role was
        // not granted it (see `privilege::explain`).
        Err(error) if error.kind() == leasehold::ErrorKind::Other => {
            return Err(explain(conn, FENCE, CliError::Database(report(&error))))
        }
        Err(error) => return Err(error.into()),
    };
    let text = format!(
        "fenced {resource} (lease key {key}): epochs up to {} are refused, it admits epochs >= {accepted}",
        accepted.get() - 1
    );
    let json = Json::Object(vec![
        ("resource", Json::str(resource)),
        ("key", Json::str(key)),
        ("accepted_epoch", Json::Int(accepted.get())),
    ]);
    Ok(ctx.out.emit(&text, &json)?)
}
