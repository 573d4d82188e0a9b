//! A fenced database write: why fencing epochs exist.
//!
//! Worker A holds the lease for `report` and starts writing; it pauses (a GC
//! pause, swap, a network stall...) longer than its ttl. Worker B takes the
//! lease over with a higher epoch and writes. A wakes, still believing it is
//! the holder, and tries to write: the guard refuses it, and the table shows
//! only B's rows.
//!
//! Run: `cargo run --example fenced_db_write` (embedded throwaway PostgreSQL,
//! or the server in `DATABASE_URL`).

use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection};
use leasehold::guard::Check;
use leasehold::guard::Fencing;
use leasehold::{guard::FencedError, Acquisition, ErrorKind, Leases};
use leasehold_local::{DatabaseServer, LocalPostgres};

const KEY: &str = "report-2026-11";
const RESOURCE: &str = "reports";

struct Timeline(Instant);

impl Timeline {
    fn say(&self, actor: &str, event: &str) {
        println!("{:>6} ms  {actor:<9} {event}", self.0.elapsed().as_millis());
    }
}

fn write_rows(
    conn: &mut PgConnection,
    writer: &str,
    epoch: i64,
) -> Result<(), diesel::result::Error> {
    conn.batch_execute(&format!(
        "INSERT INTO report_lines (writer, epoch, line) VALUES \
         ('{writer}', {epoch}, 'total: 42'), ('{writer}', {epoch}, 'checked: yes')"
    ))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // DATABASE_URL's server, or a throwaway one removed when this is dropped.
    let server = DatabaseServer::from_env_or_start(LocalPostgres::builder())?;
    let url = server.url();
    let t = Timeline(Instant::now());
    let mut setup = PgConnection::establish(&url)?;
    leasehold::install(&mut setup)?;
    setup.batch_execute(
        "DROP TABLE IF EXISTS report_lines;
         CREATE TABLE report_lines (id serial PRIMARY KEY, writer text, epoch bigint, line text);",
    )?;
    t.say("setup", "leasehold installed, table report_lines created");

    let mut a = PgConnection::establish(&url)?;
    let mut b = PgConnection::establish(&url)?;
    let ttl = Duration::from_millis(800);

    let Acquisition::Granted(lease_a) = a.acquire(KEY, "worker-a", ttl)? else {
        return Err("worker-a could not acquire the fresh key".into());
    };
    t.say(
        "worker-a",
        &format!("acquired {KEY} with epoch {} (ttl 800 ms)", lease_a.epoch()),
    );
    t.say(
        "worker-a",
        "starts preparing its report... and pauses (GC, swap, network)",
    );

    // B polls until A's grant lapses on the server clock, then takes over.
    let lease_b = loop {
        match b.acquire(KEY, "worker-b", Duration::from_secs(30))? {
            Acquisition::Granted(lease) => break lease,
            Acquisition::Denied => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    t.say(
        "worker-b",
        &format!("A's lease lapsed; took over with epoch {}", lease_b.epoch()),
    );
    b.run_fenced(RESOURCE, &lease_b, Check::Token, |conn| {
        write_rows(conn, "worker-b", lease_b.epoch().get())
    })?;
    t.say(
        "worker-b",
        &format!(
            "fenced write committed; {RESOURCE} now admits epochs >= {}",
            lease_b.epoch()
        ),
    );

    t.say("worker-a", "wakes up and writes its (now stale) report");
    match a.run_fenced(RESOURCE, &lease_a, Check::Token, |conn| {
        write_rows(conn, "worker-a", lease_a.epoch().get())
    }) {
        Err(FencedError::Guard(refused)) if refused.kind() == ErrorKind::Fenced => t.say(
            "guard",
            &format!(
                "REFUSED worker-a: presented epoch {}, {}; rolled back",
                refused.epoch().map_or(0, |epoch| epoch.get()),
                refused
                    .refusal()
                    .map_or_else(String::new, |why| why.to_string())
            ),
        ),
        Ok(()) => return Err("the stale write was admitted: fencing failed".into()),
        Err(other) => return Err(other.into()),
    }
    match a.renew(&lease_a, ttl)? {
        leasehold::Renewal::Refused(why) => t.say(
            "worker-a",
            &format!("renew says `{why}`: stops acting on {KEY}"),
        ),
        leasehold::Renewal::Renewed { .. } => return Err("a superseded holder renewed".into()),
    }

    println!("\nreport_lines:");
    let rows: Vec<(String, i64, String)> = {
        use diesel::prelude::*;
        #[derive(QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Text)]
            writer: String,
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            epoch: i64,
            #[diesel(sql_type = diesel::sql_types::Text)]
            line: String,
        }
        diesel::sql_query("SELECT writer, epoch, line FROM report_lines ORDER BY id")
            .load::<Row>(&mut setup)?
            .into_iter()
            .map(|r| (r.writer, r.epoch, r.line))
            .collect()
    };
    for (writer, epoch, line) in &rows {
        println!("  {writer:<9} epoch {epoch}  {line}");
    }
    if rows.iter().any(|(writer, _, _)| writer == "worker-a") {
        return Err("worker-a's stale rows are visible".into());
    }
    Ok(())
}
