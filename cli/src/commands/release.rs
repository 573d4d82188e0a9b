//! `leasehold release KEY OWNER EPOCH` (or `--token TOKEN`): ends a grant;
//! and the operator's `release --force KEY --epoch N`, which ends exactly
//! grant N whoever holds it.

use diesel::PgConnection;
use leasehold::admin::ForcedRelease;
use leasehold::{Epoch, FencingToken, Leases, Refusal, Release};

use crate::connect::Needs;
use crate::context::Context;
use crate::failure::{report, CliError};
use crate::grant::{parse_token, status_json, token_of};
use crate::help::SEE_EXIT_CODES;
use crate::json::Json;
use crate::output::Printer;
use crate::privilege::explain;
use leasehold::admin::Operator;

/// The operator function `release --force` calls, as a GRANT names it.
const FORCE_RELEASE_EPOCH: &str = "lease.force_release(text, bigint)";

/// Release the grant (KEY, OWNER, EPOCH), or the grant of --token; its
/// epoch becomes stale. Releasing a grant released already (by its
/// holder or an operator), with the key still free, answers `released`
/// or `force_released` (exit 0): running it twice is harmless. Operator: `release --force KEY --epoch N` ends exactly
/// grant N of KEY, whoever holds it, and never a newer one (exit 5 if
/// the key is held under a newer epoch, 6 if epoch N was never
/// granted); needs EXECUTE on lease.force_release(text, bigint)
/// (granted to nobody by default).
#[derive(Debug, clap::Args)]
#[command(after_help = SEE_EXIT_CODES)]
pub struct Args {
    /// The lease key (or give --token).
    #[arg(required_unless_present = "token")]
    key: Option<String>,
    /// The owner of the grant (not with --force or --token).
    #[arg(required_unless_present_any = ["force", "token"], conflicts_with_all = ["force", "token"])]
    owner: Option<String>,
    /// The grant's epoch (not with --force, which takes --epoch).
    #[arg(required_unless_present_any = ["force", "token"], conflicts_with_all = ["force", "token"])]
    epoch: Option<i64>,
    /// The fencing token acquire printed: key, owner and epoch in one
    /// argument.
    #[arg(long, value_parser = parse_token, conflicts_with_all = ["force", "key"])]
    token: Option<FencingToken>,
    /// Operator: end the grant at --epoch whoever holds it.
    #[arg(long, requires = "force_epoch")]
    force: bool,
    /// With --force: the epoch of the grant to end (as `ls` or
    /// `inspect` showed it).
    #[arg(long = "epoch", requires = "force", value_name = "N")]
    force_epoch: Option<i64>,
}

/// `leasehold release`.
pub fn run(args: Args, ctx: &Context) -> Result<(), CliError> {
    let mut session = ctx.connect(Needs::Installed)?;
    let conn = &mut session.conn;
    let out = ctx.out;
    match (
        args.force,
        args.force_epoch,
        args.token,
        args.key,
        args.owner,
        args.epoch,
    ) {
        (true, Some(epoch), None, Some(key), _, _) => force_release_epoch(conn, out, &key, epoch),
        (false, None, Some(token), None, None, None) => {
            release(conn, out, token.key(), token.owner(), token.epoch().get())
        }
        (false, None, None, Some(key), Some(owner), Some(epoch)) => {
            release(conn, out, &key, &owner, epoch)
        }
        // clap's requires/conflicts rules make any other mix a usage
        // error before this point.
        _ => Err(CliError::InvalidInput(
            "pass either KEY OWNER EPOCH, --token TOKEN, or KEY --force --epoch N".into(),
        )),
    }
}

/// `leasehold release KEY OWNER EPOCH`.
fn release(
    conn: &mut PgConnection,
    out: Printer,
    key: &str,
    owner: &str,
    epoch: i64,
) -> Result<(), CliError> {
    let grant = token_of(key, owner, epoch)?;
    match conn.release(&grant).map_err(CliError::from)? {
        Release::Released => {
            let text = format!(
                "released {key} (owner {owner}, epoch {epoch}); epoch {epoch} is stale from now on and the next grant gets a higher one"
            );
            Ok(out.emit(&text, &status_json(key, owner, epoch, None))?)
        }
        // Released before, by its holder or an operator, and the key still
        // free: the grant is over, which is what the caller asked for, so
        // running it twice is harmless (exit 0). The words are the
        // refusal's, as everywhere: SQL answered not_owner.
        Release::Refused(why @ (Refusal::Released | Refusal::ForceReleased)) => {
            let by = match why {
                Refusal::ForceReleased => "by an operator",
                _ => "by its holder",
            };
            let text = format!(
                "grant {epoch} of {key} was released already, {by}, and the key is free; nothing changed"
            );
            let mut json = status_json(key, owner, epoch, None);
            if let Json::Object(fields) = &mut json {
                fields[0] = ("status", Json::str(why.as_reason()));
                fields.insert(1, ("sql_status", Json::str(why.as_status())));
            }
            Ok(out.emit(&text, &json)?)
        }
        Release::Refused(why) => Err(CliError::Lost {
            operation: "release",
            key: key.to_owned(),
            owner: owner.to_owned(),
            epoch,
            why,
        }),
    }
}

/// `leasehold release --force KEY --epoch N`: ends exactly grant N.
/// Exit 0 when grant N is over afterwards without a newer grant in the way
/// (`released`, or `already_free`: running it twice is harmless); a key
/// held under a newer epoch, or an epoch never granted, is a failure of the
/// command (exit 5 / 6) so a script notices that what it saw is gone.
fn force_release_epoch(
    conn: &mut PgConnection,
    out: Printer,
    key: &str,
    epoch: i64,
) -> Result<(), CliError> {
    let outcome = match conn.force_release_epoch(key, Epoch::new(epoch)) {
        Ok(outcome) => outcome,
        Err(error) if error.kind() == leasehold::ErrorKind::Other => {
            return Err(explain(
                conn,
                FORCE_RELEASE_EPOCH,
                CliError::Database(report(&error)),
            ))
        }
        Err(error) => return Err(CliError::from(error)),
    };
    let (status, counter, text) = match outcome {
        ForcedRelease::Released { counter } => (
            "released",
            counter,
            format!(
                "ended grant {epoch} of {key}; its counter is {counter}: every epoch up to {counter} is stale from now on (fence guarded resources with `leasehold fence RESOURCE --key {key} --up-to {counter}`)"
            ),
        ),
        ForcedRelease::AlreadyFree { counter } => (
            "already_free",
            counter,
            format!("{key} is free already (counter {counter}): grant {epoch} has ended; nothing changed"),
        ),
        ForcedRelease::NewerGrant { current_epoch } => {
            return Err(CliError::ForceReleaseRefused {
                key: key.to_owned(),
                epoch,
                status: "newer_grant",
                counter: Some(current_epoch.get()),
            })
        }
        ForcedRelease::NoSuchGrant { counter } => {
            return Err(CliError::ForceReleaseRefused {
                key: key.to_owned(),
                epoch,
                status: "no_such_grant",
                counter: counter.map(Epoch::get),
            })
        }
        // ForcedRelease is non_exhaustive: an outcome this command does
        // not know changed nothing it can describe.
        other => {
            return Err(CliError::Database(format!(
                "unexpected answer of lease.force_release: {other:?}"
            )))
        }
    };
    let json = Json::Object(vec![
        ("key", Json::str(key)),
        ("epoch", Json::Int(epoch)),
        ("status", Json::str(status)),
        ("counter", Json::Int(counter.get())),
    ]);
    Ok(out.emit(&text, &json)?)
}
