//! The two workers of the demo, each on its own thread and connection.
//!
//! worker-a claims the job, heartbeats, writes a partial result, then
//! stalls (the "GC pause": it blocks, without heartbeats, until worker-b
//! has taken over), wakes, and tries to write anyway: the guard refuses.
//! worker-b is refused while a holds the job, waits on the *server* clock
//! for a's grant to lapse, takes over at a higher epoch, writes, and after
//! the database crash reconnects, heartbeats and releases.
//!
//! Hand-offs go over channels, so the event order is the same on every run;
//! the only waiting on time is worker-b's wait for the server clock, which
//! is the observable state that decides expiry.

use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text, Timestamptz};
use diesel::PgConnection;
use leasehold::{guard::Check, guard::FencedError, Leases};
use leasehold::{
    Acquisition, ErrorKind, FencingToken, Lease, LeaseState, Refusal, Release, Renewal,
};

use super::timeline::Timeline;
use super::{KEY, RESOURCE, TTL};
use crate::connect::establish;
use crate::duration;
use crate::failure::CliError;
use leasehold::guard::Fencing;

/// The ttl worker-b heartbeats with before the planned crash, so its grant
/// outlasts crash recovery and the inspect after the restart shows it held.
const TTL_ACROSS_RESTART: Duration = Duration::from_secs(30);
/// How long worker-b waits at most for the server clock to pass an expiry.
const CLOCK_WAIT_LIMIT: Duration = Duration::from_secs(30);

/// A token for a hand-off between threads.
pub struct Baton;

/// Channels of worker-a.
pub struct AChannels {
    /// To worker-b: "I hold the job and am stalling now" / "I am done".
    pub to_b: Sender<Baton>,
    /// From worker-b: "I took over and wrote".
    pub from_b: Receiver<Baton>,
}

/// Channels of worker-b.
pub struct BChannels {
    /// To worker-a: "I took over and wrote".
    pub to_a: Sender<Baton>,
    /// From worker-a.
    pub from_a: Receiver<Baton>,
    /// To the demo: "ready for the crash".
    pub to_demo: Sender<Baton>,
    /// From the demo: "the server is back".
    pub from_demo: Receiver<Baton>,
}

fn demo_error(what: impl Into<String>) -> CliError {
    CliError::Demo(what.into())
}

fn lease_error(error: leasehold::LeaseError) -> CliError {
    demo_error(crate::failure::report(&error))
}

fn hand_off_failed(peer: &str) -> CliError {
    demo_error(format!(
        "{peer} stopped before handing over (see its error)"
    ))
}

fn granted(acquisition: Acquisition, who: &str) -> Result<Lease, CliError> {
    acquisition
        .granted()
        .ok_or_else(|| demo_error(format!("{who} expected a grant of {KEY} but was denied")))
}

/// Writes one result row, guarded: admitted only if the token is current.
fn fenced_write(
    conn: &mut PgConnection,
    token: &FencingToken,
    check: Check,
    body: &str,
) -> Result<(), FencedError<diesel::result::Error>> {
    conn.run_fenced(RESOURCE, token, check, |conn| {
        diesel::sql_query("INSERT INTO demo_results (epoch, worker, body) VALUES ($1, $2, $3)")
            .bind::<BigInt, _>(token.epoch())
            .bind::<Text, _>(token.owner())
            .bind::<Text, _>(body)
            .execute(conn)
            .map(|_| ())
    })
}

/// worker-a: the holder that stalls past its ttl.
pub fn worker_a(url: &str, timeline: &Timeline, channels: AChannels) -> Result<(), CliError> {
    const ME: &str = "worker-a";
    let mut conn = establish(url)?;
    let lease = granted(conn.acquire(KEY, ME, TTL).map_err(lease_error)?, ME)?;
    timeline.log(
        ME,
        format!(
            "acquire {KEY} (ttl {}) -> granted, epoch {}, token {}",
            duration::format(TTL),
            lease.epoch(),
            lease.token()
        ),
    );
    match conn.renew(&lease, TTL).map_err(lease_error)? {
        Renewal::Renewed { .. } => timeline.log(ME, "heartbeat: renew -> ok (same epoch)"),
        Renewal::Refused(why) => return Err(demo_error(format!("{ME}'s first renew said {why}"))),
    }
    let token = lease.token();
    fenced_write(&mut conn, token, Check::LeaseHeld, "partial result (40%)")
        .map_err(|error| demo_error(format!("{ME}'s first write was refused: {error}")))?;
    timeline.log(
        ME,
        format!(
            "fenced write of a partial result at epoch {} -> admitted; guard {RESOURCE} now admits epochs >= {}",
            lease.epoch(),
            lease.epoch()
        ),
    );
    timeline.log(
        ME,
        "stalls (simulated stop-the-world pause): no heartbeats, no work, until after worker-b has taken over",
    );
    let stalled = Instant::now();
    channels
        .to_b
        .send(Baton)
        .map_err(|_| hand_off_failed("worker-b"))?;
    channels
        .from_b
        .recv()
        .map_err(|_| hand_off_failed("worker-b"))?;
    timeline.log(
        ME,
        format!(
            "wakes after {} stalled (ttl was {}); it does not know it lost the lease",
            duration::format(stalled.elapsed()),
            duration::format(TTL)
        ),
    );
    match conn.renew(&lease, TTL).map_err(lease_error)? {
        Renewal::Refused(why) => timeline.log(
            ME,
            format!("heartbeat: renew -> {why} (a careful worker would stop here)"),
        ),
        Renewal::Renewed { .. } => {
            return Err(demo_error(format!(
                "{ME}'s renew after the takeover succeeded"
            )))
        }
    }
    match fenced_write(
        &mut conn,
        token,
        Check::Token,
        "late result from a stale holder",
    ) {
        Err(FencedError::Guard(refused))
            if matches!(refused.refusal(), Some(Refusal::StaleEpoch { .. })) =>
        {
            let presented = refused.epoch().map_or(0, |epoch| epoch.get());
            let accepted = refused.refusal().and_then(|why| match why {
                Refusal::StaleEpoch { accepted } => Some(accepted.get()),
                _ => None,
            });
            timeline.log(
                ME,
                format!(
                    "writes its result anyway (Check::Token) -> REFUSED: stale epoch {presented}, {RESOURCE} admits only epochs >= {}; rolled back",
                    accepted.unwrap_or_default()
                ),
            )
        }
        other => {
            return Err(demo_error(format!(
                "{ME}'s stale write was expected to be refused as a stale epoch, got {other:?}"
            )))
        }
    }
    match fenced_write(
        &mut conn,
        token,
        Check::LeaseHeld,
        "late result from a stale holder",
    ) {
        Err(FencedError::Guard(refused)) if refused.kind() == ErrorKind::Fenced => {
            let epoch = refused.epoch().map_or(0, |epoch| epoch.get());
            let reason = refused
                .refusal()
                .map_or_else(String::new, |why| why.to_string());
            timeline.log(
                ME,
                format!(
                    "retries with Check::LeaseHeld -> REFUSED: lease not held at epoch {epoch} ({reason}); rolled back"
                ),
            )
        }
        other => {
            return Err(demo_error(format!(
                "{ME}'s lease-checked stale write was expected to be refused, got {other:?}"
            )))
        }
    }
    channels
        .to_b
        .send(Baton)
        .map_err(|_| hand_off_failed("worker-b"))?;
    Ok(())
}

/// worker-b: refused at first, takes over after the lapse, survives the crash.
pub fn worker_b(url: &str, timeline: &Timeline, channels: BChannels) -> Result<(), CliError> {
    const ME: &str = "worker-b";
    let mut conn = establish(url)?;
    channels
        .from_a
        .recv()
        .map_err(|_| hand_off_failed("worker-a"))?;
    match conn.acquire(KEY, ME, TTL).map_err(lease_error)? {
        Acquisition::Denied => {}
        Acquisition::Granted(_) => {
            return Err(demo_error(format!(
                "{ME} was granted {KEY} while worker-a held it"
            )))
        }
    }
    let Some(LeaseState::Held {
        owner,
        epoch,
        expires_at,
    }) = conn.inspect(KEY).map_err(lease_error)?
    else {
        return Err(demo_error(format!(
            "{KEY} was not held after worker-a acquired it"
        )));
    };
    timeline.log(
        ME,
        format!("acquire {KEY} -> denied: held by {owner} at epoch {epoch}, expires {expires_at}"),
    );
    timeline.log(
        ME,
        "waits until the server clock passes that expiry (no reaper: expiry is lazy)",
    );
    wait_until_server_time_passes(&mut conn, expires_at)?;
    timeline.log(
        ME,
        format!("the server clock passed {expires_at}: worker-a's grant has lapsed"),
    );
    let lease = granted(conn.acquire(KEY, ME, TTL).map_err(lease_error)?, ME)?;
    timeline.log(
        ME,
        format!(
            "acquire {KEY} -> granted, epoch {} (takeover of worker-a's lapsed epoch {epoch})",
            lease.epoch()
        ),
    );
    fenced_write(
        &mut conn,
        lease.token(),
        Check::LeaseHeld,
        "final result (100%)",
    )
    .map_err(|error| demo_error(format!("{ME}'s write was refused: {error}")))?;
    timeline.log(
        ME,
        format!(
            "fenced write of its result at epoch {} -> admitted; guard {RESOURCE} now admits epochs >= {}",
            lease.epoch(),
            lease.epoch()
        ),
    );
    channels
        .to_a
        .send(Baton)
        .map_err(|_| hand_off_failed("worker-a"))?;
    channels
        .from_a
        .recv()
        .map_err(|_| hand_off_failed("worker-a"))?;
    match conn.renew(&lease, TTL_ACROSS_RESTART)
        .map_err(lease_error)?
    {
        Renewal::Renewed { .. } => timeline.log(
            ME,
            format!(
                "heartbeat: renew with ttl {} (to outlast the coming database crash) -> ok, epoch {}",
                duration::format(TTL_ACROSS_RESTART),
                lease.epoch()
            ),
        ),
        Renewal::Refused(why) => return Err(demo_error(format!("{ME}'s heartbeat said {why}"))),
    }
    channels
        .to_demo
        .send(Baton)
        .map_err(|_| hand_off_failed("demo"))?;
    channels
        .from_demo
        .recv()
        .map_err(|_| hand_off_failed("demo"))?;
    // The crash broke the old connection; a real worker's pool reconnects.
    drop(conn);
    let mut conn = establish(url)?;
    match conn.renew(&lease, TTL).map_err(lease_error)? {
        Renewal::Renewed { .. } => timeline.log(
            ME,
            format!(
                "reconnects; heartbeat: renew -> ok, still epoch {}",
                lease.epoch()
            ),
        ),
        Renewal::Refused(why) => {
            return Err(demo_error(format!(
                "{ME}'s heartbeat after the restart said {why}"
            )))
        }
    }
    match conn.release(&lease).map_err(lease_error)? {
        Release::Released => timeline.log(
            ME,
            format!(
                "release {KEY} -> ok; epoch {} is stale from now on",
                lease.epoch()
            ),
        ),
        Release::Refused(why) => return Err(demo_error(format!("{ME}'s release said {why}"))),
    }
    Ok(())
}

#[derive(QueryableByName)]
struct Now {
    #[diesel(sql_type = Timestamptz)]
    now: DateTime<Utc>,
}

/// Blocks until the server's clock is past `instant`, polling no faster than
/// needed: expiry is decided by that clock alone.
fn wait_until_server_time_passes(
    conn: &mut PgConnection,
    instant: DateTime<Utc>,
) -> Result<(), CliError> {
    let started = Instant::now();
    loop {
        let now = diesel::sql_query("SELECT clock_timestamp() AS now")
            .get_result::<Now>(conn)
            .map_err(|error| demo_error(format!("could not read the server clock: {error}")))?
            .now;
        if now > instant {
            return Ok(());
        }
        if started.elapsed() > CLOCK_WAIT_LIMIT {
            return Err(demo_error(format!(
                "the server clock did not pass {instant} within {}",
                duration::format(CLOCK_WAIT_LIMIT)
            )));
        }
        let remaining = (instant - now).to_std().unwrap_or_default();
        std::thread::sleep(remaining.min(Duration::from_millis(50)) + Duration::from_micros(100));
    }
}
