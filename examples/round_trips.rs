//! Shows how many protocol round trips each lease operation costs, from the
//! server's own statement log: after the first call on a connection, a call
//! is one Bind+Execute of an already prepared statement (no Parse), which
//! libpq sends in one packet and answers in one. Every call is one
//! statement, the SQL function of its name, whatever it answers.
//!
//! Run: `cargo run --example round_trips`

use std::time::Duration;

use diesel::{Connection, PgConnection};
use leasehold::Leases;
use leasehold_local::LocalPostgres;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = LocalPostgres::builder()
        .durable(false)
        .setting("log_min_duration_statement", "0")
        .start()?;
    let mut conn = PgConnection::establish(&server.url())?;
    leasehold::install(&mut conn)?;
    let calls: usize = std::env::var("CALLS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(100);
    let log_start = std::fs::read_to_string(server.log_path())?.len();
    for i in 0..calls {
        let key = format!("rt-{}", i % 10);
        let lease = conn.acquire(&key, "me", Duration::from_secs(30))?;
        if let Some(lease) = lease.granted() {
            let _ = conn.renew(&lease, Duration::from_secs(30))?;
            let _ = conn.release(&lease)?;
        }
        let _ = conn.inspect(&key)?;
    }
    let log = std::fs::read_to_string(server.log_path())?;
    let log = &log[log_start..];
    for function in [
        "lease.acquire",
        "lease.renew",
        "lease.release",
        "lease.inspect",
    ] {
        let count = |phase: &str| {
            log.lines()
                .filter(|l| l.contains(&format!("  {phase} ")) && l.contains(function))
                .count()
        };
        println!(
            "{function:<19} calls={calls} parse={} bind={} execute={}",
            count("parse"),
            count("bind"),
            count("execute")
        );
    }
    Ok(())
}
