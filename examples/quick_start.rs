//! pg_lease's SQL quick start, through the Rust API, against the embedded
//! default: a throwaway PostgreSQL started for this run (or the server named
//! by `DATABASE_URL`). Prints each step's result.
//!
//! Run: `cargo run --example quick_start`

use std::time::Duration;

use diesel::{Connection, PgConnection};
use leasehold::{Acquisition, LeaseState, Leases, Release, Renewal};
use leasehold_local::{DatabaseServer, LocalPostgres};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // DATABASE_URL's server, or a throwaway one kept for the whole run and
    // removed when `server` is dropped.
    let server = DatabaseServer::from_env_or_start(LocalPostgres::builder())?;
    if server.local().is_some() {
        println!("no DATABASE_URL: using a throwaway local PostgreSQL");
    }
    let url = server.url();
    let mut conn = PgConnection::establish(&url)?;
    let report = leasehold::install(&mut conn)?;
    println!("install: applied {:?}", report.applied);

    let ttl = Duration::from_secs(30);
    let lease = match conn.acquire("job-42", "worker-a1", ttl)? {
        Acquisition::Granted(lease) => lease,
        Acquisition::Denied => return Err("job-42 is held by someone else".into()),
    };
    println!(
        "acquire('job-42', 'worker-a1', 30s) -> acquired=t epoch={} expires_at={}",
        lease.epoch(),
        lease.expires_at()
    );

    match conn.renew(&lease, ttl)? {
        Renewal::Renewed { expires_at } => {
            println!(
                "renew('job-42', 'worker-a1', {}, 30s) -> ok expires_at={expires_at}",
                lease.epoch()
            )
        }
        Renewal::Refused(why) => println!("renew -> {why}"),
    }

    match conn.release(&lease)? {
        Release::Released => println!("release('job-42', 'worker-a1', {}) -> ok", lease.epoch()),
        Release::Refused(why) => println!("release -> {why}"),
    }

    match conn.inspect("job-42")? {
        Some(LeaseState::Held {
            owner,
            epoch,
            expires_at,
        }) => {
            println!(
                "inspect('job-42') -> held=t owner={owner} epoch={epoch} expires_at={expires_at}"
            )
        }
        Some(state) => println!(
            "inspect('job-42') -> {} epoch={}",
            state.as_str(),
            state.epoch()
        ),
        None => println!("inspect('job-42') -> no rows (never leased)"),
    }
    println!("token of the grant, for guards: {}", lease.token());
    Ok(())
}
