//! Per-operation latency of the lease primitive and of fenced writes, through
//! the Rust API, side by side with the durable floor (a committed single-row
//! primary-key UPDATE sent the same way) in the same run.
//!
//! Run: `cargo bench --bench primitive` (add `-- --quick` for a short run).
//! Starts a durable throwaway PostgreSQL unless `DATABASE_URL` is set.
//!
//! The telemetry's cost: run it once as is and once with
//! `--features tracing,metrics` and compare, above all the client-side row
//! (a call refused by the client's own input check, so no round trip hides
//! the wrapper's cost). The header says which features the run has; no
//! subscriber or recorder is installed, as in an application that enables
//! the features but has not set telemetry up. `-- --client-side` stops
//! after that row, for repeating it with the two builds in turn.

use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Integer};
use diesel::{Connection, PgConnection, QueryResult, RunQueryDsl};
use leasehold::guard::Check;
use leasehold::guard::Fencing;
use leasehold::Leases;
use leasehold_local::{DatabaseServer, LocalPostgres};

/// `UPDATE bench_floor SET n = n + 1 WHERE id = $1 RETURNING n`, prepared
/// and cached exactly like the lease calls: the floor one durable write
/// through this client cannot beat.
struct FloorUpdate {
    id: i32,
}

impl QueryId for FloorUpdate {
    type QueryId = FloorUpdate;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl QueryFragment<Pg> for FloorUpdate {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("UPDATE bench_floor SET n = n + 1 WHERE id = ");
        out.push_bind_param::<Integer, _>(&self.id)?;
        out.push_sql(" RETURNING n");
        Ok(())
    }
}

impl Query for FloorUpdate {
    type SqlType = BigInt;
}

impl RunQueryDsl<PgConnection> for FloorUpdate {}

struct Stats {
    p50: Duration,
    p99: Duration,
    ops_per_sec: f64,
}

fn measure(samples: &mut [Duration], total: Duration) -> Stats {
    samples.sort();
    let pick = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    Stats {
        p50: pick(0.50),
        p99: pick(0.99),
        ops_per_sec: samples.len() as f64 / total.as_secs_f64(),
    }
}

fn time_ops(n: usize, mut op: impl FnMut(usize)) -> Stats {
    for i in 0..n / 10 {
        op(i); // warm-up: statement preparation, caches
    }
    let mut samples = Vec::with_capacity(n);
    let start = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        op(i);
        samples.push(t.elapsed());
    }
    measure(&mut samples, start.elapsed())
}

/// Mean time of one `op` over `n` calls in a row, the best of five rounds:
/// for calls far shorter than a clock read, which `time_ops` would swamp.
fn mean_of_rounds(n: usize, mut op: impl FnMut()) -> Duration {
    (0..5)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..n {
                op();
            }
            start.elapsed() / n as u32
        })
        .min()
        .unwrap_or_default()
}

fn row(name: &str, stats: &Stats, floor: &Stats) {
    println!(
        "| {name:<34} | {:>9.1} | {:>9.1} | {:>9.0} | {:>5.2}x |",
        stats.p50.as_secs_f64() * 1e6,
        stats.p99.as_secs_f64() * 1e6,
        stats.ops_per_sec,
        stats.p50.as_secs_f64() / floor.p50.as_secs_f64()
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = if quick { 300 } else { 3_000 };
    let server = DatabaseServer::from_env_or_start(LocalPostgres::builder())?;
    let url = server.url();
    let mut conn = PgConnection::establish(&url)?;
    leasehold::install(&mut conn)?;
    conn.batch_execute(
        "DROP TABLE IF EXISTS bench_floor, bench_items;
         CREATE TABLE bench_floor (id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO bench_floor SELECT g, 0 FROM generate_series(1, 64) g;
         CREATE TABLE bench_items (id int PRIMARY KEY, body text NOT NULL, epoch bigint NOT NULL);
         INSERT INTO bench_items SELECT g, '', 0 FROM generate_series(1, 64) g;",
    )?;
    let settings: Vec<String> = ["server_version", "fsync", "synchronous_commit"]
        .iter()
        .map(|name| {
            #[derive(diesel::QueryableByName)]
            struct Setting {
                #[diesel(sql_type = diesel::sql_types::Text)]
                value: String,
            }
            diesel::sql_query(format!("SELECT current_setting('{name}') AS value"))
                .get_result::<Setting>(&mut conn)
                .map(|s| format!("{name}={}", s.value))
                .unwrap_or_else(|e| format!("{name}=? ({e})"))
        })
        .collect();
    println!(
        "environment: {} | server: {} | cores: {} | samples per row: {n}",
        settings.join(" "),
        if server.local().is_some() {
            "embedded LocalPostgres (unix socket)"
        } else {
            "DATABASE_URL"
        },
        std::thread::available_parallelism().map_or(0, |p| p.get())
    );
    let on = |enabled: bool| if enabled { "on" } else { "off" };
    println!(
        "telemetry: tracing {} | metrics {} (no subscriber, no recorder installed)",
        on(cfg!(feature = "tracing")),
        on(cfg!(feature = "metrics"))
    );
    // Client-side only: a key with a NUL (which PostgreSQL text cannot
    // hold) is refused before anything is sent, yet the call goes through
    // the whole instrumentation (span, outcome, counters, duration).
    let client_side = mean_of_rounds(n * 100, || {
        let refused = conn.acquire("nul\0key", "bench", Duration::from_secs(600));
        assert!(
            matches!(refused, Err(error) if error.kind() == leasehold::ErrorKind::InvalidInput)
        );
    });
    println!(
        "client-side acquire (refused input, no round trip): {:.0} ns per call",
        client_side.as_nanos()
    );
    if std::env::args().any(|a| a == "--client-side") {
        // Only the row above: for repeating it, alternating builds.
        return Ok(());
    }
    println!(
        "\n| operation (1 client, autocommit)   |  p50 (µs) |  p99 (µs) |     ops/s | vs floor |"
    );
    println!(
        "|------------------------------------|-----------|-----------|-----------|----------|"
    );

    let ttl = Duration::from_secs(600);
    let floor = time_ops(n, |i| {
        FloorUpdate {
            id: (i % 64) as i32 + 1,
        }
        .get_result::<i64>(&mut conn)
        .map(|_| ())
        .unwrap_or_else(|e| panic!("{e}"));
    });
    row("durable floor: 1-row PK UPDATE", &floor, &floor);

    // Keys exist after the first pass, so acquire takes its common path
    // (one conditional UPDATE); release makes them free again.
    let keys: Vec<String> = (0..n).map(|i| format!("bench-key-{i}")).collect();
    let acquire_new = time_ops(n, |i| {
        let _ = conn
            .acquire(&format!("fresh-{i}-{}", keys.len()), "bench", ttl)
            .unwrap_or_else(|e| panic!("{e}"));
    });
    let mut epochs = vec![0_i64; n];
    let acquire = time_ops(n, |i| {
        let lease = conn
            .acquire(&keys[i], "bench", ttl)
            .unwrap_or_else(|e| panic!("{e}"));
        epochs[i] = lease.granted().map_or(0, |l| l.epoch().get());
    });
    let renew = time_ops(n, |i| {
        let _ = conn
            .renew(
                &leasehold_test_support::grant(&keys[i], "bench", epochs[i]),
                ttl,
            )
            .unwrap_or_else(|e| panic!("{e}"));
    });
    let inspect = time_ops(n, |i| {
        let _ = conn.inspect(&keys[i]).unwrap_or_else(|e| panic!("{e}"));
    });
    let release = time_ops(n, |i| {
        let _ = conn
            .release(&leasehold_test_support::grant(&keys[i], "bench", epochs[i]))
            .unwrap_or_else(|e| panic!("{e}"));
    });
    let cycle = time_ops(n, |i| {
        let key = &keys[i % 64];
        if let Some(lease) = conn
            .acquire(key, "cycler", ttl)
            .unwrap_or_else(|e| panic!("{e}"))
            .granted()
        {
            let _ = conn
                .release(&leasehold_test_support::grant(key, "cycler", lease.epoch()))
                .unwrap_or_else(|e| panic!("{e}"));
        }
    });
    row("acquire (existing free key)", &acquire, &floor);
    row("acquire (never-seen key)", &acquire_new, &floor);
    row("renew", &renew, &floor);
    row("release", &release, &floor);
    row("inspect (read only)", &inspect, &floor);
    row("acquire -> release cycle (2 commits)", &cycle, &floor);

    // Fenced write vs the same write without a guard, each one transaction.
    let lease = conn
        .acquire("fenced-bench", "writer", ttl)?
        .granted()
        .ok_or("fenced-bench is held")?;
    let token = lease.token();
    let plain = time_ops(n, |i| {
        conn.transaction::<_, diesel::result::Error, _>(|c| {
            c.batch_execute(&format!(
                "UPDATE bench_items SET body = 'v{i}', epoch = 1 WHERE id = {}",
                i % 64 + 1
            ))
        })
        .unwrap_or_else(|e| panic!("{e}"));
    });
    let fenced = time_ops(n, |i| {
        conn.run_fenced(&format!("item-{}", i % 64), &token, Check::Token, |c| {
            c.batch_execute(&format!(
                "UPDATE bench_items SET body = 'v{i}', epoch = 1 WHERE id = {}",
                i % 64 + 1
            ))
        })
        .unwrap_or_else(|e| panic!("{e}"));
    });
    let held = time_ops(n, |i| {
        conn.run_fenced(&format!("item-{}", i % 64), &token, Check::LeaseHeld, |c| {
            c.batch_execute(&format!(
                "UPDATE bench_items SET body = 'v{i}', epoch = 1 WHERE id = {}",
                i % 64 + 1
            ))
        })
        .unwrap_or_else(|e| panic!("{e}"));
    });
    println!(
        "\n| write transaction (1 client)       |  p50 (µs) |  p99 (µs) |     ops/s | vs plain |"
    );
    println!(
        "|------------------------------------|-----------|-----------|-----------|----------|"
    );
    row("plain UPDATE in a transaction", &plain, &plain);
    row("fenced (Check::Token)", &fenced, &plain);
    row("fenced (Check::LeaseHeld)", &held, &plain);

    // 8 clients: throughput of plain vs fenced writes, each client its own rows.
    println!(
        "\n| write transaction (8 clients)      |  p50 (µs) |  p99 (µs) |     ops/s | vs plain |"
    );
    println!(
        "|------------------------------------|-----------|-----------|-----------|----------|"
    );
    let run_clients = |fenced: bool| -> Stats {
        let per_client = n / 4;
        let start = Instant::now();
        let handles: Vec<_> = (0..8)
            .map(|c| {
                let (url, token) = (url.clone(), token.clone());
                std::thread::spawn(move || {
                    let mut conn = PgConnection::establish(&url).unwrap_or_else(|e| panic!("{e}"));
                    let mut samples = Vec::with_capacity(per_client);
                    for i in 0..per_client {
                        let id = c * 8 + i % 8 + 1;
                        let sql = format!(
                            "UPDATE bench_items SET body = 'v{i}', epoch = 1 WHERE id = {id}"
                        );
                        let t = Instant::now();
                        if fenced {
                            conn.run_fenced(&format!("item-{id}"), &token, Check::Token, |c| {
                                c.batch_execute(&sql)
                            })
                            .unwrap_or_else(|e| panic!("{e}"));
                        } else {
                            conn.transaction::<_, diesel::result::Error, _>(|c| {
                                c.batch_execute(&sql)
                            })
                            .unwrap_or_else(|e| panic!("{e}"));
                        }
                        samples.push(t.elapsed());
                    }
                    samples
                })
            })
            .collect();
        let mut samples: Vec<Duration> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect();
        measure(&mut samples, start.elapsed())
    };
    let plain8 = run_clients(false);
    let fenced8 = run_clients(true);
    row("plain UPDATE in a transaction", &plain8, &plain8);
    row("fenced (Check::Token)", &fenced8, &plain8);
    drop(server);
    Ok(())
}
