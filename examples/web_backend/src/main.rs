//! A synchronous web backend handing out jobs under leases: claim a job,
//! heartbeat it, submit its result fenced by the token, inspect it.
//! The service itself is this crate's library (`src/service.rs`, shared
//! with the integration test `tests/web_backend.rs`).
//!
//! Run: `cargo run -p leasehold-example-web-backend` (a throwaway local PostgreSQL, or
//! the server in `DATABASE_URL`; listens on `LISTEN`, default
//! 127.0.0.1:8080; Ctrl-C or SIGTERM stops it, its standard input is
//! never read, so it runs under nohup or a service manager). Then, for
//! example:
//!
//! ```text
//! curl -s -X POST localhost:8080/jobs/job-7/claim -d '{"worker":"worker-b","ttl_ms":30000}'
//! curl -s -X POST localhost:8080/jobs/job-7/heartbeat -H 'Fencing-Token: lh1.1.job-7.worker-b' -d '{"ttl_ms":30000}'
//! curl -s -X PUT  localhost:8080/jobs/job-7/result -H 'Fencing-Token: lh1.1.job-7.worker-b' -d '{"result":{"rows":42}}'
//! curl -s localhost:8080/jobs/job-7
//! curl -s localhost:8080/metrics
//! ```

use leasehold::LeaseClient;
use leasehold_local::{DatabaseServer, LocalPostgres};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use web_backend::service;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Registered first, so a signal that arrives while the service starts
    // is not lost: it stops the service as soon as it runs.
    let mut signals = Signals::new([SIGINT, SIGTERM])?;
    // DATABASE_URL's server, or a throwaway one kept for the whole run and
    // removed when `server` is dropped.
    let server = DatabaseServer::from_env_or_start(LocalPostgres::builder())?;
    if server.local().is_some() {
        eprintln!("no DATABASE_URL: using a throwaway local PostgreSQL (deleted on exit)");
    }
    let url = server.url();
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:8080".to_owned());
    let client = LeaseClient::connect(&url, 8)?;
    let service = service::Service::start(client, &listen, 4)?;
    eprintln!(
        "job service listening on http://{}; Ctrl-C or SIGTERM stops it",
        service.addr()
    );
    // Serve until SIGINT or SIGTERM; then stop cleanly, so the pool and the
    // throwaway server are closed in order.
    if let Some(signal) = signals.forever().next() {
        eprintln!("signal {signal}: stopping");
    }
    service.shutdown();
    Ok(())
}
