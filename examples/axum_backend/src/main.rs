//! The job service of the web backend example on axum and leasehold's
//! async face: claim a job, heartbeat it, submit its result fenced by the
//! token, inspect it. The service itself is this crate's library
//! (`src/service.rs`, shared with the integration tests).
//!
//! Run: `cargo run -p leasehold-example-axum-backend` (a throwaway local
//! PostgreSQL, or the server in `DATABASE_URL`; listens on `LISTEN`, default
//! 127.0.0.1:8080; Ctrl-C or SIGTERM stops it, its standard input is never
//! read). Then, for example:
//!
//! ```text
//! curl -s -X POST localhost:8080/jobs/job-7/claim -H 'Content-Type: application/json' -d '{"worker":"worker-b","ttl_ms":30000}'
//! curl -s -X POST localhost:8080/jobs/job-7/heartbeat -H 'Content-Type: application/json' -H 'Fencing-Token: lh1.1.job-7.worker-b' -d '{"ttl_ms":30000}'
//! curl -s -X PUT  localhost:8080/jobs/job-7/result -H 'Content-Type: application/json' -H 'Fencing-Token: lh1.1.job-7.worker-b' -d '{"result":{"rows":42}}'
//! curl -s localhost:8080/jobs/job-7
//! curl -s localhost:8080/metrics
//! ```

use axum_backend::service::Service;
use leasehold_local::{DatabaseServer, LocalPostgres};
use tokio::signal::unix::{signal, SignalKind};

/// Not `#[tokio::main]`: starting the throwaway server blocks for a second
/// or two, and belongs before the runtime rather than on one of its
/// threads; it is also dropped (stopped and removed) after the runtime,
/// so no pooled connection outlives it.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    // DATABASE_URL's server, or a throwaway one kept for the whole run and
    // removed when `server` is dropped.
    let server = DatabaseServer::from_env_or_start(LocalPostgres::builder())?;
    if server.local().is_some() {
        eprintln!("no DATABASE_URL: using a throwaway local PostgreSQL (deleted on exit)");
    }
    let url = server.url();
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:8080".to_owned());
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        // Registered before the service starts, so a signal that arrives
        // meanwhile is not lost: it stops the service as soon as it runs.
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        let service = Service::start(&url, &listen, 8).await?;
        eprintln!(
            "job service listening on http://{}; Ctrl-C or SIGTERM stops it",
            service.addr()
        );
        let name = tokio::select! {
            _ = interrupt.recv() => "SIGINT",
            _ = terminate.recv() => "SIGTERM",
        };
        eprintln!("{name}: stopping");
        service.shutdown().await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    drop(runtime);
    drop(server);
    Ok(())
}
