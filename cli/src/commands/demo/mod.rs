//! `leasehold demo`: the fencing story in a few seconds, on a throwaway
//! durable server, printed as a timeline.
//!
//! 1. worker-a acquires the job (ttl 1 s), heartbeats, writes a partial result.
//! 2. worker-b is denied, worker-a stalls; worker-b waits for the server
//!    clock to pass a's expiry and takes over at epoch 2, then writes.
//! 3. worker-a wakes: its renew says `lapsed`, its stale write is refused by
//!    the guard (stale epoch), and again with the lease check (not held).
//! 4. The database is SIGKILLed and restarted (crash recovery): the lease
//!    and its epoch are exactly as before.
//! 5. worker-b reconnects, heartbeats and releases.
//! 6. A psql-style writer that ignores the library writes without a token:
//!    the fenced table itself refuses it. The final state shows only the
//!    admitted writes, the guard record and the epoch counter.
//!
//! The demo checks each outcome as it goes; anything unexpected ends it
//! with exit code 1 and says what differed.

mod timeline;
mod workers;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use diesel::PgConnection;
use leasehold::LeaseState;
use leasehold_local::LocalPostgres;

use crate::connect::establish;
use crate::context::Context;
use crate::duration;
use crate::failure::CliError;
use crate::help::SEE_EXIT_CODES;
use crate::json::Json;
use crate::output::Printer;
use crate::table;
use leasehold::guard::Fencing;
use leasehold::Leases;
use timeline::Timeline;
use workers::{AChannels, BChannels};

/// The job both workers want.
const KEY: &str = "job-7";
/// The resource the job's results are fenced as.
const RESOURCE: &str = "job-7/result";
/// Short, so the takeover happens within a second or two.
const TTL: Duration = Duration::from_secs(1);

/// A guided fencing scenario on its own throwaway server: two workers,
/// a stalled holder taken over, its stale write refused, a database
/// crash and restart with epochs intact. Takes a few seconds.
#[derive(Debug, clap::Args)]
#[command(after_help = SEE_EXIT_CODES)]
pub struct Args {}

/// `leasehold demo`: on its own server whatever the global flags say,
/// since it crashes and restarts its database.
pub fn run(_args: Args, ctx: &Context) -> Result<(), CliError> {
    if ctx.database_url().is_some_and(|url| !url.is_empty()) {
        eprintln!(
            "note: demo ignores --database-url / DATABASE_URL: it crashes and restarts \
             its database, so it always runs on its own throwaway local PostgreSQL"
        );
    }
    scenario(ctx.out)
}

/// Runs the scenario and prints the timeline and the final state.
fn scenario(out: Printer) -> Result<(), CliError> {
    let timeline = Timeline::new(!out.is_json());
    timeline.log(
        "demo",
        "starting a throwaway durable PostgreSQL (deleted when the demo ends)",
    );
    let server = LocalPostgres::start()?;
    let url = server.url();
    let mut conn = establish(&url)?;
    leasehold::install(&mut conn)
        .map_err(|error| CliError::Demo(crate::failure::report(&error)))?;
    conn.batch_execute(
        "CREATE TABLE demo_results (epoch bigint NOT NULL, worker text NOT NULL, body text NOT NULL)",
    )
    .map_err(|error| CliError::Demo(format!("could not create demo_results: {error}")))?;
    leasehold::admin::Operator::protect_table(&mut conn, "demo_results", KEY)
        .map_err(|error| CliError::Demo(crate::failure::report(&error)))?;
    timeline.log(
        "demo",
        format!(
            "server ready, leasehold installed; workers write job results to table demo_results, fenced as resource {RESOURCE}, and the table itself fenced by key {KEY}"
        ),
    );

    let (a_to_b, b_from_a) = mpsc::channel();
    let (b_to_a, a_from_b) = mpsc::channel();
    let (b_to_demo, demo_from_b) = mpsc::channel();
    let (demo_to_b, b_from_demo) = mpsc::channel();
    let epochs = std::thread::scope(|scope| {
        let a = scope.spawn(|| {
            workers::worker_a(
                &url,
                &timeline,
                AChannels {
                    to_b: a_to_b,
                    from_b: a_from_b,
                },
            )
        });
        let b = scope.spawn(|| {
            workers::worker_b(
                &url,
                &timeline,
                BChannels {
                    to_a: b_to_a,
                    from_a: b_from_a,
                    to_demo: b_to_demo,
                    from_demo: b_from_demo,
                },
            )
        });
        // Crash and restart once worker-b is ready; a failed worker drops
        // its sender, so this never waits forever.
        let crashed = match demo_from_b.recv() {
            Ok(_) => crash_and_restart(&server, &url, &timeline),
            Err(_) => Err(CliError::Demo("worker-b stopped early".into())),
        };
        if crashed.is_ok() {
            // Ignoring a send error: worker-b then failed and says why.
            let _ = demo_to_b.send(workers::Baton);
        }
        drop(demo_to_b);
        let a = join(a, "worker-a");
        let b = join(b, "worker-b");
        a.and(b).and(crashed)
    })?;

    let mut conn = establish(&url)?;
    writer_without_the_library(&mut conn, &timeline)?;
    let summary = final_state(&mut conn, &timeline, epochs)?;
    if out.is_json() {
        let json = Json::Object(vec![
            ("events", timeline.to_json()),
            ("final", summary.json),
        ]);
        out.emit("", &json)?;
    } else {
        out.emit(&summary.text, &Json::Null)?;
    }
    Ok(())
}

/// Step 6: a writer that ignores the library (as psql would) inserts
/// without presenting a token; the table refuses it.
fn writer_without_the_library(
    conn: &mut PgConnection,
    timeline: &Timeline,
) -> Result<(), CliError> {
    let written = conn.batch_execute(
        "INSERT INTO demo_results (epoch, worker, body) VALUES (0, 'psql', 'written past the library')",
    );
    match written.map_err(leasehold::LeaseError::from) {
        Err(refused) if refused.table().is_some() => {
            timeline.log(
                "psql",
                "INSERT without presenting a token -> refused by the table itself (lease_fence_no_token)",
            );
            Ok(())
        }
        Err(other) => Err(CliError::Demo(format!(
            "the write without a token failed otherwise than by the fence: {other}"
        ))),
        Ok(()) => Err(CliError::Demo(
            "the fenced table admitted a write without a token".into(),
        )),
    }
}

fn join(
    handle: std::thread::ScopedJoinHandle<'_, Result<(), CliError>>,
    who: &str,
) -> Result<(), CliError> {
    handle
        .join()
        .unwrap_or_else(|_| Err(CliError::Demo(format!("{who} panicked"))))
}

/// The epoch reported before and after the crash.
type Epochs = (i64, i64);

fn crash_and_restart(
    server: &LocalPostgres,
    url: &str,
    timeline: &Timeline,
) -> Result<Epochs, CliError> {
    let before = inspect(&mut establish(url)?)?;
    timeline.log(
        "demo",
        format!("inspect {KEY} before the crash: {}", describe(&before)),
    );
    timeline.log(
        "demo",
        "CRASH: SIGKILL the PostgreSQL postmaster (no shutdown, no checkpoint)",
    );
    server.kill_postmaster()?;
    let restarting = Instant::now();
    server.restart()?;
    timeline.log(
        "demo",
        format!(
            "restarted: crash recovery done in {}",
            duration::format(restarting.elapsed())
        ),
    );
    let after = inspect(&mut establish(url)?)?;
    if after.epoch() != before.epoch() {
        return Err(CliError::Demo(format!(
            "the epoch of {KEY} changed across the crash: {} before, {} after",
            before.epoch(),
            after.epoch()
        )));
    }
    timeline.log(
        "demo",
        format!(
            "inspect {KEY} after the restart: {} -> epochs intact",
            describe(&after)
        ),
    );
    Ok((before.epoch().get(), after.epoch().get()))
}

fn inspect(conn: &mut PgConnection) -> Result<LeaseState, CliError> {
    conn.inspect(KEY)
        .map_err(|error| CliError::Demo(crate::failure::report(&error)))?
        .ok_or_else(|| CliError::Demo(format!("{KEY} vanished")))
}

fn describe(state: &LeaseState) -> String {
    match state {
        LeaseState::Held {
            owner,
            epoch,
            expires_at,
        } => format!("held by {owner} at epoch {epoch} until {expires_at}"),
        LeaseState::Lapsed {
            owner,
            epoch,
            expired_at,
        } => format!("lapsed: {owner}'s grant at epoch {epoch} expired at {expired_at}"),
        LeaseState::Free { epoch, .. } => format!("free, epoch counter {epoch}"),
    }
}

#[derive(QueryableByName)]
struct ResultRow {
    #[diesel(sql_type = BigInt)]
    epoch: i64,
    #[diesel(sql_type = Text)]
    worker: String,
    #[diesel(sql_type = Text)]
    body: String,
}

struct Summary {
    text: String,
    json: Json,
}

fn final_state(
    conn: &mut PgConnection,
    timeline: &Timeline,
    (epoch_before, epoch_after): Epochs,
) -> Result<Summary, CliError> {
    let rows = diesel::sql_query("SELECT epoch, worker, body FROM demo_results ORDER BY epoch")
        .load::<ResultRow>(conn)
        .map_err(|error| CliError::Demo(format!("could not read demo_results: {error}")))?;
    let guard = conn
        .inspect_guard(RESOURCE)
        .map_err(|error| CliError::Demo(crate::failure::report(&error)))?
        .ok_or_else(|| CliError::Demo(format!("no guard record for {RESOURCE}")))?;
    let lease = inspect(conn)?;
    timeline.log("demo", "done");

    let mut text = String::from("\nfinal state\n\nrows in demo_results (only admitted writes):\n");
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| vec![row.epoch.to_string(), row.worker.clone(), row.body.clone()])
        .collect();
    for line in table::render(&["EPOCH", "WORKER", "BODY"], &cells).lines() {
        text.push_str(&format!("  {line}\n"));
    }
    text.push_str(&format!(
        "guard {RESOURCE}: fenced by lease key {}, admits epochs >= {}\n",
        guard.lease_key, guard.accepted_epoch
    ));
    text.push_str(&format!(
        "lease {KEY}: {}; epoch {epoch_before} before the crash, {epoch_after} after\n",
        match &lease {
            LeaseState::Held { .. } | LeaseState::Lapsed { .. } => describe(&lease),
            LeaseState::Free { epoch, .. } => format!(
                "free, epoch counter {epoch} (every epoch below it is stale, {epoch} itself was never granted; the next grant gets {})",
                epoch.get() + 1
            ),
        }
    ));
    let json = Json::Object(vec![
        (
            "rows",
            Json::Array(
                rows.iter()
                    .map(|row| {
                        Json::Object(vec![
                            ("epoch", Json::Int(row.epoch)),
                            ("worker", Json::str(&row.worker)),
                            ("body", Json::str(&row.body)),
                        ])
                    })
                    .collect(),
            ),
        ),
        (
            "guard",
            Json::Object(vec![
                ("resource", Json::str(RESOURCE)),
                ("lease_key", Json::str(&guard.lease_key)),
                ("accepted_epoch", Json::Int(guard.accepted_epoch.get())),
            ]),
        ),
        (
            "lease",
            Json::Object(vec![
                ("key", Json::str(KEY)),
                ("held", Json::Bool(lease.is_held())),
                ("epoch", Json::Int(lease.epoch().get())),
                ("epoch_before_crash", Json::Int(epoch_before)),
                ("epoch_after_crash", Json::Int(epoch_after)),
            ]),
        ),
    ]);
    Ok(Summary { text, json })
}
