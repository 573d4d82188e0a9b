//! `leasehold renew KEY OWNER EPOCH --ttl T` (or `--token TOKEN`): extends
//! a grant; a grant that is gone is the command's failure, with the reason.

use std::time::Duration;

use diesel::PgConnection;
use leasehold::{FencingToken, Leases, Renewal};

use crate::connect::Needs;
use crate::context::Context;
use crate::duration;
use crate::failure::CliError;
use crate::grant::{parse_token, status_json, token_of};
use crate::help::SEE_EXIT_CODES;
use crate::output::Printer;

/// Extend the grant (KEY, OWNER, EPOCH), or the grant of --token, by
/// --ttl from now.
#[derive(Debug, clap::Args)]
#[command(after_help = SEE_EXIT_CODES)]
pub struct Args {
    /// The lease key (or give --token).
    #[arg(required_unless_present = "token", conflicts_with = "token")]
    key: Option<String>,
    /// The owner of the grant.
    #[arg(required_unless_present = "token", conflicts_with = "token")]
    owner: Option<String>,
    /// The grant's epoch, as acquire printed it.
    #[arg(required_unless_present = "token", conflicts_with = "token")]
    epoch: Option<i64>,
    /// The fencing token acquire printed (or LEASEHOLD_TOKEN under
    /// `leasehold run`): key, owner and epoch in one argument.
    #[arg(long, value_parser = parse_token)]
    token: Option<FencingToken>,
    /// The new ttl, counted from now on the server clock.
    #[arg(long, value_parser = duration::parse, allow_hyphen_values = true)]
    ttl: Duration,
}

/// `leasehold renew`.
pub fn run(args: Args, ctx: &Context) -> Result<(), CliError> {
    let mut session = ctx.connect(Needs::Installed)?;
    let conn = &mut session.conn;
    let out = ctx.out;
    match (args.token, args.key, args.owner, args.epoch) {
        (Some(token), ..) => renew(
            conn,
            out,
            token.key(),
            token.owner(),
            token.epoch().get(),
            args.ttl,
        ),
        (None, Some(key), Some(owner), Some(epoch)) => {
            renew(conn, out, &key, &owner, epoch, args.ttl)
        }
        // clap's requires/conflicts rules make any other mix a usage
        // error before this point.
        _ => Err(CliError::InvalidInput(
            "pass either KEY OWNER EPOCH, or --token TOKEN".into(),
        )),
    }
}

/// Renews grant `epoch` of `key` for `owner` by `ttl` from now.
fn renew(
    conn: &mut PgConnection,
    out: Printer,
    key: &str,
    owner: &str,
    epoch: i64,
    ttl: Duration,
) -> Result<(), CliError> {
    let grant = token_of(key, owner, epoch)?;
    match conn.renew(&grant, ttl).map_err(CliError::from)? {
        Renewal::Renewed { expires_at } => {
            let text = format!(
                "renewed {key} for {owner} at epoch {epoch}, expires {expires_at} (ttl {})",
                duration::format(ttl)
            );
            Ok(out.emit(&text, &status_json(key, owner, epoch, Some(expires_at)))?)
        }
        Renewal::Refused(why) => Err(CliError::Lost {
            operation: "renew",
            key: key.to_owned(),
            owner: owner.to_owned(),
            epoch,
            why,
        }),
    }
}
