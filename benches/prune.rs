//! Lease-call latency under load, with and without a concurrent prune of a
//! large table (docs/SPECIFICATION.md §1.8): the target is a p99 at
//! most 2× the p99 without a prune.
//!
//! Setup: 200 000 prunable key rows (LAPSED for an hour) and 50 000 guard
//! records of them, written straight into the tables. Load: `LOAD_CLIENTS`
//! clients, each on its own connection, cycling acquire → renew → release
//! over keys of their own (a never-seen key every tenth cycle, so the
//! never-seen-key path, which reads the watermark, is in the mix). Phases,
//! interleaved: load alone, load while `leasehold::admin::prune` removes all
//! 250 000 rows (batches of the default 1000), load alone again. Every
//! latency is one call, measured at the client.
//!
//! Run: `cargo bench --bench prune` (add `-- --quick` for a short run).
//! Starts a durable throwaway PostgreSQL unless `DATABASE_URL` is set;
//! writes the table to `bench-results/<time>-prune.md`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection};
use leasehold::admin::Operator;
use leasehold::{admin::PruneOptions, Acquisition, Leases};
use leasehold_local::{DatabaseServer, LocalPostgres};

const LOAD_CLIENTS: usize = 2;
const PRUNABLE_KEYS: u64 = 200_000;
const PRUNABLE_GUARDS: u64 = 50_000;

struct Stats {
    calls: usize,
    p50: Duration,
    p99: Duration,
    max: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let pick = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    Stats {
        calls: samples.len(),
        p50: pick(0.50),
        p99: pick(0.99),
        max: samples[samples.len() - 1],
    }
}

/// One client's lease calls until `stop`; the latency of each call that
/// starts while `measuring` is set is recorded.
fn load(
    url: String,
    client: usize,
    measuring: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> Vec<Duration> {
    let mut conn = PgConnection::establish(&url).unwrap_or_else(|e| panic!("{e}"));
    let ttl = Duration::from_secs(60);
    let owner = format!("client-{client}");
    let mut samples = Vec::new();
    let mut cycle = 0u64;
    let timed = |samples: &mut Vec<Duration>, started: Instant| {
        if measuring.load(Ordering::Relaxed) {
            samples.push(started.elapsed());
        }
    };
    while !stop.load(Ordering::Relaxed) {
        cycle += 1;
        let key = if cycle.is_multiple_of(10) {
            format!("new-{client}-{cycle}-{}", std::process::id())
        } else {
            format!("hot-{client}-{}", cycle % 16)
        };
        let started = Instant::now();
        let lease = match conn.acquire(&key, &owner, ttl) {
            Ok(Acquisition::Granted(lease)) => lease,
            other => panic!("acquire {key}: {other:?}"),
        };
        timed(&mut samples, started);
        let started = Instant::now();
        match conn.renew(
            &leasehold_test_support::grant(&key, &owner, lease.epoch()),
            ttl,
        ) {
            Ok(leasehold::Renewal::Renewed { .. }) => {}
            other => panic!("renew {key}: {other:?}"),
        }
        timed(&mut samples, started);
        let started = Instant::now();
        match conn.release(&leasehold_test_support::grant(&key, &owner, lease.epoch())) {
            Ok(leasehold::Release::Released) => {}
            other => panic!("release {key}: {other:?}"),
        }
        timed(&mut samples, started);
    }
    samples
}

/// Runs the load and measures it while `during` runs, and at least for
/// `length`; returns the latencies, what `during` returned and how long it
/// took.
fn phase<T>(url: &str, length: Duration, during: impl FnOnce() -> T) -> (Stats, T, Duration) {
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..LOAD_CLIENTS)
        .map(|client| {
            let url = url.to_owned();
            let (measuring, stop) = (measuring.clone(), stop.clone());
            std::thread::spawn(move || load(url, client, measuring, stop))
        })
        .collect();
    // Let every client get going before the measured work starts.
    std::thread::sleep(Duration::from_millis(300));
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let result = during();
    let took = started.elapsed();
    if took < length {
        std::thread::sleep(length - took);
    }
    measuring.store(false, Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let samples: Vec<Duration> = clients
        .into_iter()
        .flat_map(|c| {
            c.join()
                .unwrap_or_else(|_| panic!("a load client panicked"))
        })
        .collect();
    (stats(samples), result, took)
}

fn seed(conn: &mut PgConnection) -> Result<(), diesel::result::Error> {
    conn.batch_execute(&format!(
        "INSERT INTO lease.leases AS l (key, key_hash, owner, epoch, expires_at, lapsed_owner, first_epoch)
         SELECT 'old-' || g, lease._key_hash('old-' || g), 'gone', 1 + g % 7,
                clock_timestamp() - interval '1 hour', NULL, 1
           FROM generate_series(1, {PRUNABLE_KEYS}) AS g;
         INSERT INTO lease.guards AS r (resource, resource_hash, lease_key, accepted_epoch, updated_at)
         SELECT 'res-' || g, lease._key_hash('res-' || g), 'old-' || g, 1,
                clock_timestamp() - interval '1 hour'
           FROM generate_series(1, {PRUNABLE_GUARDS}) AS g;"
    ))?;
    // Separately: VACUUM cannot run in the implicit transaction of a
    // multi-statement string.
    conn.batch_execute("VACUUM ANALYZE lease.leases")?;
    conn.batch_execute("VACUUM ANALYZE lease.guards")
}

fn us(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e6)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let quick = std::env::args().any(|a| a == "--quick");
    let length = Duration::from_secs(if quick { 3 } else { 12 });
    let server = DatabaseServer::from_env_or_start(LocalPostgres::builder())?;
    let url = server.url();
    let mut conn = PgConnection::establish(&url)?;
    leasehold::install(&mut conn)?;
    seed(&mut conn)?;

    let mut rows = Vec::new();
    let (before, (), _) = phase(&url, length, || ());
    rows.push(("load alone (before)", before, String::new()));
    // Measured exactly while the prune runs.
    let (during, report, took) = phase(&url, Duration::ZERO, || {
        conn.prune(&PruneOptions::new(Duration::from_secs(60)))
    });
    let report = report?;
    let pruned = report.keys_pruned + report.guards_pruned;
    rows.push((
        "load + concurrent prune",
        during,
        format!(
            "prune removed {} keys + {} guard records in {:.1} s ({:.0} rows/s, {} batches)",
            report.keys_pruned,
            report.guards_pruned,
            took.as_secs_f64(),
            pruned as f64 / took.as_secs_f64(),
            report.batches
        ),
    ));
    let (after, (), _) = phase(&url, length, || ());
    rows.push(("load alone (after)", after, String::new()));

    let load_average = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut text = format!(
        "## Lease calls with and without a concurrent prune — {}\n\n\
         {LOAD_CLIENTS} clients cycling acquire/renew/release (autocommit); the phases without a \
         prune last {} s, the one with it exactly as long as the prune; \
         the prune removes {PRUNABLE_KEYS} LAPSED key rows and {PRUNABLE_GUARDS} guard records in \
         batches of {}. Server: {}. Cores: {}. Load average at the end: {}\n\n\
         | phase | calls | p50 (µs) | p99 (µs) | max (µs) | note |\n|---|---:|---:|---:|---:|---|\n",
        chrono::Utc::now().format("%Y-%m-%dT%H:%MZ"),
        length.as_secs(),
        leasehold::admin::DEFAULT_PRUNE_BATCH,
        if server.local().is_some() {
            "embedded LocalPostgres (unix socket)"
        } else {
            "DATABASE_URL"
        },
        std::thread::available_parallelism().map_or(0, |p| p.get()),
        load_average.trim()
    );
    for (name, s, note) in &rows {
        text.push_str(&format!(
            "| {name} | {} | {} | {} | {} | {note} |\n",
            s.calls,
            us(s.p50),
            us(s.p99),
            us(s.max)
        ));
    }
    let base = rows[0].1.p99.max(rows[2].1.p99);
    text.push_str(&format!(
        "\np99 during the prune / worse p99 without: {:.2}× (target: at most 2×)\n",
        rows[1].1.p99.as_secs_f64() / base.as_secs_f64()
    ));
    println!("{text}");
    if !quick {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-results");
        let name = format!(
            "{}-prune.md",
            chrono::Utc::now().format("%Y-%m-%dT%H-%M-%SZ")
        );
        std::fs::write(dir.join(&name), &text)?;
        println!("written to bench-results/{name}");
    }
    Ok(())
}
