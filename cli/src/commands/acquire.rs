//! `leasehold acquire KEY OWNER --ttl T [--wait W]`: a grant, printed with
//! its epoch, expiry and fencing token; a denial or a wait that timed out
//! is the command's failure, so its exit code tells a script.

use std::time::Duration;

use diesel::PgConnection;
use leasehold::{Acquisition, Lease, LeaseState, Leases};

use crate::connect::Needs;
use crate::context::Context;
use crate::duration;
use crate::failure::CliError;
use crate::grant::check_names;
use crate::help::SEE_EXIT_CODES;
use crate::json::Json;
use crate::output::Printer;

/// Acquire KEY for OWNER; prints the epoch, expiry and fencing token.
#[derive(Debug, clap::Args)]
#[command(after_help = SEE_EXIT_CODES)]
pub struct Args {
    /// The lease key, e.g. job-42.
    key: String,
    /// Who acquires it, e.g. worker-a1.
    owner: String,
    /// How long the grant lasts unless renewed (server clock).
    #[arg(long, value_parser = duration::parse, allow_hyphen_values = true)]
    ttl: Duration,
    /// Wait up to this long while another owner holds the key (exit 7 on
    /// timeout) instead of failing at once (exit 3).
    #[arg(long, value_parser = duration::parse, allow_hyphen_values = true)]
    wait: Option<Duration>,
}

/// `leasehold acquire`.
pub fn run(args: Args, ctx: &Context) -> Result<(), CliError> {
    let mut session = ctx.connect(Needs::Installed)?;
    let lease = obtain(
        &mut session.conn,
        &session.url,
        &args.key,
        &args.owner,
        args.ttl,
        args.wait,
    )?;
    print_grant(ctx.out, &lease, args.ttl)
}

/// Acquires `key` for `owner`, waiting up to `wait` when given (and not
/// zero); a denial or a wait that timed out is the error. `leasehold run`
/// acquires its lease through it too.
pub fn obtain(
    conn: &mut PgConnection,
    url: &str,
    key: &str,
    owner: &str,
    ttl: Duration,
    wait: Option<Duration>,
) -> Result<Lease, CliError> {
    check_names(key, owner)?;
    Ok(match wait.filter(|w| !w.is_zero()) {
        // Wake on release (LISTEN/NOTIFY) or at the holder's expiry, holding
        // no transaction while waiting, instead of the SQL 50 ms poll.
        Some(wait) => {
            let client = leasehold::LeaseClient::connect(url, 1).map_err(CliError::from)?;
            let waiter = leasehold::wait::LeaseWaiter::new(&client);
            waiter
                .acquire(key, owner, ttl, leasehold::wait::Wait::AtMost(wait))
                .map_err(|error| match error.kind() {
                    leasehold::ErrorKind::TimedOut => CliError::WaitTimedOut {
                        key: key.to_owned(),
                        wait,
                    },
                    _ => CliError::from(error),
                })?
        }
        None => match conn.acquire(key, owner, ttl).map_err(CliError::from)? {
            Acquisition::Granted(lease) => lease,
            Acquisition::Denied => return Err(denied(conn, key)),
        },
    })
}

/// Builds the denial error, naming the holder if it is still there.
fn denied(conn: &mut PgConnection, key: &str) -> CliError {
    let holder = match conn.inspect(key) {
        Ok(Some(LeaseState::Held {
            owner,
            epoch,
            expires_at,
        })) => Some((owner, epoch.get(), expires_at)),
        _ => None,
    };
    CliError::Denied {
        key: key.to_owned(),
        holder,
    }
}

fn print_grant(out: Printer, lease: &Lease, ttl: Duration) -> Result<(), CliError> {
    let text = format!(
        "acquired {} for {} at epoch {}, expires {} (ttl {})\ntoken: {}",
        lease.key(),
        lease.owner(),
        lease.epoch(),
        lease.expires_at(),
        duration::format(ttl),
        lease.token()
    );
    let json = Json::Object(vec![
        ("acquired", Json::Bool(true)),
        ("key", Json::str(lease.key())),
        ("owner", Json::str(lease.owner())),
        ("epoch", Json::Int(lease.epoch().get())),
        ("expires_at", Json::time(Some(lease.expires_at()))),
        ("token", Json::str(lease.token().to_string())),
    ]);
    Ok(out.emit(&text, &json)?)
}
