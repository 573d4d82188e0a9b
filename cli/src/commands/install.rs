//! `leasehold install`: the lease functions into the database.

use crate::connect::Needs;
use crate::context::Context;
use crate::failure::{report, CliError};
use crate::help::SEE_EXIT_CODES;
use crate::json::Json;

/// Install or upgrade the lease functions in the database (idempotent).
#[derive(Debug, clap::Args)]
#[command(after_help = SEE_EXIT_CODES)]
pub struct Args {}

/// `leasehold install`. Needs no leasehold in the database: that is what
/// it installs.
pub fn run(_args: Args, ctx: &Context) -> Result<(), CliError> {
    let mut session = ctx.connect(Needs::Nothing)?;
    let conn = &mut session.conn;
    let migrations =
        leasehold::install(conn).map_err(|error| CliError::Database(report(&error)))?;
    let installed = leasehold::admin::installed_versions(conn)
        .map_err(|error| CliError::Database(report(&error)))?;
    let text = if migrations.applied.is_empty() {
        format!(
            "leasehold is already installed (versions {}); nothing to do",
            installed.join(", ")
        )
    } else {
        format!(
            "installed leasehold migrations {}; the lease functions are ready",
            migrations.applied.join(", ")
        )
    };
    let strings = |list: &[String]| Json::Array(list.iter().map(Json::str).collect());
    let json = Json::Object(vec![
        ("applied", strings(&migrations.applied)),
        ("installed", strings(&installed)),
    ]);
    Ok(ctx.out.emit(&text, &json)?)
}
