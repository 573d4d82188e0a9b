//! `leasehold ls`: every key with its holder, epoch and remaining time, as
//! one table (or one JSON object).

use crate::connect::Needs;
use crate::context::Context;
use crate::failure::CliError;
use crate::help::SEE_EXIT_CODES;
use crate::json::Json;
use crate::listing::{cells, filter, load, no_keys, row_json, ListArgs, HEADER};
use crate::table;

/// List keys with holder, epoch and remaining time. Reads lease.leases
/// and lease.groups directly, so the role needs SELECT on them
/// (superuser or the role that installed leasehold).
#[derive(Debug, clap::Args)]
#[command(after_help = SEE_EXIT_CODES)]
pub struct Args {
    /// Which keys.
    #[command(flatten)]
    list: ListArgs,
}

/// `leasehold ls [PREFIX] [--state S] [--owner O] [--sort K] [--limit N]`.
pub fn run(args: Args, ctx: &Context) -> Result<(), CliError> {
    let mut session = ctx.connect(Needs::Installed)?;
    let list = &args.list;
    let (rows, now) = load(&mut session.conn, &filter(list))?;
    let text = if rows.is_empty() {
        no_keys(list)
    } else {
        table::render(&HEADER[1..], &rows.iter().map(cells).collect::<Vec<_>>())
    };
    let json = Json::Object(vec![
        ("now", Json::time(now)),
        ("leases", Json::Array(rows.iter().map(row_json).collect())),
    ]);
    Ok(ctx.out.emit(&text, &json)?)
}
