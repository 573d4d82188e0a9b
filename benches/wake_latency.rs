//! Wake latency of the client-side waiter against the SQL `wait` poll, how
//! soon an election's observer sees a new leader, and the cost of release
//! notifications to releases nobody waits for.
//!
//! Run: `cargo bench --bench wake_latency` (add `-- --quick`, or set
//! `LEASEHOLD_BENCH_QUICK=1`, for a short run). Starts a durable throwaway
//! PostgreSQL unless `DATABASE_URL` names a server (its role needs
//! CREATEDB; the bench creates and drops two databases).
//!
//! Measures:
//! 1. hand-over after a release: from the instant the releasing transaction's
//!    COMMIT is sent (so the commit's WAL flush is included) to the instant the
//!    waiting thread holds the lease;
//! 2. hand-over after a lapse: from the holder's `expires_at` to the start of
//!    the new grant (`expires_at - ttl`), both on the server's clock;
//! 3. a new leader observed: from the instant the granting transaction's
//!    COMMIT is sent to the instant an `Election::observe` watch, which never
//!    polls, returns the `Elected` change (the grant's notification, then
//!    one look);
//! 4. release latency/throughput: `lease.release` without its wake-up (a
//!    database whose `lease._on_change` answers false), the gated one with
//!    nobody waiting, and the gated one with a registered waiter (notifies).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{Bool, Integer};
use leasehold::{
    wait::{LeaseWaiter, Wait},
    Acquisition, LeaseClient, Leases,
};
use leasehold_local::{DatabaseServer, LocalPostgres};

/// The release without its wake-up, for the release-cost comparison: the
/// hook every release and grant calls (`lease._on_change`,
/// sql/functions/01_rules.sql) emptied in the comparison database only.
const WITHOUT_WAKE: &str =
    "CREATE OR REPLACE FUNCTION lease._on_change(key_hash bytea, channel text) RETURNS boolean \
     LANGUAGE sql VOLATILE AS $$ SELECT false $$";
const TTL: Duration = Duration::from_secs(30);

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

struct Sizes {
    handovers: usize,
    sql_handovers: usize,
    lapses: usize,
    release_rounds: usize,
    releases_per_round: usize,
}

fn main() -> BenchResult<()> {
    let quick = std::env::args().any(|a| a == "--quick")
        || std::env::var_os("LEASEHOLD_BENCH_QUICK").is_some_and(|v| !v.is_empty() && v != "0");
    let sizes = if quick {
        Sizes {
            handovers: 200,
            sql_handovers: 40,
            lapses: 20,
            release_rounds: 3,
            releases_per_round: 200,
        }
    } else {
        Sizes {
            handovers: 1000,
            sql_handovers: 1000,
            lapses: 200,
            release_rounds: 10,
            releases_per_round: 500,
        }
    };
    let server = DatabaseServer::from_env_or_start(
        LocalPostgres::builder().setting("max_connections", "50"),
    )?;
    if server.local().is_some() {
        eprintln!("no DATABASE_URL: using a durable throwaway PostgreSQL");
    }
    let admin_url = server.url();
    let mut admin = PgConnection::establish(&admin_url)?;
    let new_db = "leasehold_bench_wake";
    let old_db = "leasehold_bench_nowake";
    for db in [new_db, old_db] {
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))?;
        admin.batch_execute(&format!("CREATE DATABASE {db}"))?;
    }
    let new_url = server.url_for(new_db);
    let old_url = server.url_for(old_db);
    leasehold::install(&mut PgConnection::establish(&new_url)?)?;
    {
        let mut old = PgConnection::establish(&old_url)?;
        leasehold::install(&mut old)?;
        old.batch_execute(WITHOUT_WAKE)?;
    }

    println!(
        "leasehold wake_latency ({}; server {})\n",
        if quick { "quick" } else { "full" },
        if server.local().is_some() {
            "LocalPostgres, durable"
        } else {
            "DATABASE_URL"
        }
    );

    let client = handover_client(&new_url, sizes.handovers)?;
    let sql = handover_sql(&new_url, sizes.sql_handovers)?;
    println!("## Hand-over after release (COMMIT sent -> waiter holds the lease)\n");
    println!("| waiting | n | p50 | p90 | p99 | max | commit ack p50 |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    print_row("client waiter (LISTEN/NOTIFY)", &client.0, Some(&client.1));
    print_row("SQL wait (50 ms poll)", &sql.0, Some(&sql.1));

    let lapse_client = lapse(&new_url, sizes.lapses, true)?;
    let lapse_sql = lapse(&new_url, sizes.lapses, false)?;
    println!("\n## Hand-over after a lapse (holder's expires_at -> new grant, server clock)\n");
    println!("| waiting | n | p50 | p90 | p99 | max | |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    print_row("client waiter (expiry timer)", &lapse_client, None);
    print_row("SQL wait (50 ms poll)", &lapse_sql, None);

    let observed = observe_grants(&new_url, sizes.handovers)?;
    println!("\n## A new leader observed (grant's COMMIT sent -> observer's Elected)\n");
    println!("| observing | n | p50 | p90 | p99 | max | commit ack p50 |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    print_row(
        "Election::observe (LISTEN/NOTIFY, no poll)",
        &observed.0,
        Some(&observed.1),
    );

    release_cost(&old_url, &new_url, &sizes)?;

    drop(admin);
    let mut admin = PgConnection::establish(&admin_url)?;
    for db in [new_db, old_db] {
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))?;
    }
    Ok(())
}

/// A uniformly random delay below 50 ms (the SQL poll interval), so each
/// release or lapse falls at a random phase of the SQL waiter's poll, as it
/// would in production, rather than right after it went to sleep.
fn random_phase() -> Duration {
    use std::cell::Cell;
    thread_local!(static STATE: Cell<u64> = const { Cell::new(0x9E37_79B9_7F4A_7C15) });
    let x = STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    });
    Duration::from_micros(x % 50_000)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64)).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn print_row(name: &str, samples: &[Duration], commits: Option<&[Duration]>) {
    let mut s = samples.to_vec();
    s.sort();
    let commit = commits.map_or(String::new(), |c| {
        let mut c = c.to_vec();
        c.sort();
        ms(percentile(&c, 50.0))
    });
    println!(
        "| {name} | {} | {} | {} | {} | {} | {commit} |",
        s.len(),
        ms(percentile(&s, 50.0)),
        ms(percentile(&s, 90.0)),
        ms(percentile(&s, 99.0)),
        ms(s.last().copied().unwrap_or_default()),
    );
}

fn granted(acquisition: Acquisition) -> BenchResult<leasehold::Lease> {
    acquisition
        .granted()
        .ok_or_else(|| "bench key unexpectedly held".into())
}

/// Releases in an explicit transaction and returns (instant COMMIT was
/// sent, commit round-trip).
fn release_committing(
    conn: &mut PgConnection,
    lease: &leasehold::Lease,
) -> BenchResult<(Instant, Duration)> {
    conn.batch_execute("BEGIN")?;
    let released = conn.release(&lease)?;
    if released != leasehold::Release::Released {
        return Err(format!("release answered {released:?}").into());
    }
    let sent = Instant::now();
    conn.batch_execute("COMMIT")?;
    Ok((sent, sent.elapsed()))
}

/// Grants of an election's key to a new candidate each time, committed in
/// an explicit transaction, against an observer that never polls: (COMMIT
/// sent -> `Elected` returned, commit round-trip) per grant.
fn observe_grants(url: &str, n: usize) -> BenchResult<(Vec<Duration>, Vec<Duration>)> {
    use leasehold::hold::{Election, LeaderChange};
    let client = LeaseClient::connect(url, 2)?;
    let never = Duration::from_secs(3600);
    let waiter = LeaseWaiter::builder(&client)
        .fallback_poll(never)
        .recheck_every(never)
        .build();
    if !waiter.wait_until_listening(Duration::from_secs(10)) {
        return Err(format!("listener not connected: {:?}", waiter.listener_status()).into());
    }
    let election = Election::new(&client, "observed", "observer", TTL).with_waiter(&waiter);
    let mut watch = election.observe()?;
    let (seen_tx, seen_rx) = mpsc::channel::<(i64, Instant)>();
    std::thread::spawn(move || {
        for change in &mut watch {
            if let LeaderChange::Elected(leader) = change {
                if seen_tx.send((leader.epoch.get(), Instant::now())).is_err() {
                    break;
                }
            }
        }
    });
    let mut conn = PgConnection::establish(url)?;
    let (mut latencies, mut commits) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        std::thread::sleep(random_phase());
        conn.batch_execute("BEGIN")?;
        let lease = granted(conn.acquire("observed", &format!("candidate-{i}"), TTL)?)?;
        let sent = Instant::now();
        conn.batch_execute("COMMIT")?;
        commits.push(sent.elapsed());
        loop {
            let (epoch, at) = seen_rx.recv_timeout(Duration::from_secs(10))?;
            if epoch == lease.epoch().get() {
                latencies.push(at.saturating_duration_since(sent));
                break;
            }
        }
        if conn.release(&lease)? != leasehold::Release::Released {
            return Err("the observed grant was not released".into());
        }
    }
    Ok((latencies, commits))
}

fn handover_client(url: &str, n: usize) -> BenchResult<(Vec<Duration>, Vec<Duration>)> {
    let client = LeaseClient::connect(url, 2)?;
    let waiter = LeaseWaiter::new(&client);
    if !waiter.wait_until_listening(Duration::from_secs(10)) {
        return Err(format!("listener not connected: {:?}", waiter.listener_status()).into());
    }
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<Instant>();
    let w = waiter.clone();
    let thread = std::thread::spawn(move || -> Result<(), String> {
        let mut conn = w.client().pool().get().map_err(|e| e.to_string())?;
        drop(conn);
        for _ in go_rx {
            let lease = w
                .acquire(
                    "handover",
                    "waiter",
                    TTL,
                    Wait::AtMost(Duration::from_secs(10)),
                )
                .map_err(|e| e.to_string())?;
            let at = Instant::now();
            conn = w.client().pool().get().map_err(|e| e.to_string())?;
            let _ = conn.release(&lease).map_err(|e| e.to_string())?;
            drop(conn);
            if done_tx.send(at).is_err() {
                break;
            }
        }
        Ok(())
    });
    let mut conn = PgConnection::establish(url)?;
    let mut latencies = Vec::with_capacity(n);
    let mut commits = Vec::with_capacity(n);
    for _ in 0..n {
        let lease = granted(conn.acquire("handover", "holder", TTL)?)?;
        go_tx.send(())?;
        let until = Instant::now() + Duration::from_secs(10);
        while waiter.armed_waiters("handover") != 1 {
            if Instant::now() > until {
                return Err("the waiter never armed".into());
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        std::thread::sleep(random_phase());
        let (sent, commit) = release_committing(&mut conn, &lease)?;
        let acquired = done_rx.recv()?;
        latencies.push(acquired.saturating_duration_since(sent));
        commits.push(commit);
    }
    drop(go_tx);
    thread.join().map_err(|_| "waiter thread panicked")??;
    Ok((latencies, commits))
}

#[derive(QueryableByName)]
struct Pid {
    #[diesel(sql_type = Integer)]
    pid: i32,
}

#[derive(QueryableByName)]
struct Flag {
    #[diesel(sql_type = Bool)]
    flag: bool,
}

fn handover_sql(url: &str, n: usize) -> BenchResult<(Vec<Duration>, Vec<Duration>)> {
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<Instant>();
    let (pid_tx, pid_rx) = mpsc::channel::<i32>();
    let url_w = url.to_owned();
    let thread = std::thread::spawn(move || -> Result<(), String> {
        let mut conn = PgConnection::establish(&url_w).map_err(|e| e.to_string())?;
        let pid: Pid = diesel::sql_query("SELECT pg_backend_pid() AS pid")
            .get_result(&mut conn)
            .map_err(|e| e.to_string())?;
        pid_tx.send(pid.pid).map_err(|e| e.to_string())?;
        for _ in go_rx {
            let lease = conn
                .acquire_waiting("handover-sql", "waiter", TTL, Duration::from_secs(10))
                .map_err(|e| e.to_string())?;
            let at = Instant::now();
            let _ = conn.release(&lease).map_err(|e| e.to_string())?;
            if done_tx.send(at).is_err() {
                break;
            }
        }
        Ok(())
    });
    let pid = pid_rx.recv()?;
    let mut conn = PgConnection::establish(url)?;
    let mut probe = PgConnection::establish(url)?;
    let sleeping = format!(
        "SELECT coalesce((SELECT wait_event = 'PgSleep' FROM pg_stat_activity WHERE pid = {pid}), false) AS flag"
    );
    let mut latencies = Vec::with_capacity(n);
    let mut commits = Vec::with_capacity(n);
    for _ in 0..n {
        let lease = granted(conn.acquire("handover-sql", "holder", TTL)?)?;
        go_tx.send(())?;
        let until = Instant::now() + Duration::from_secs(10);
        while !diesel::sql_query(&sleeping)
            .get_result::<Flag>(&mut probe)?
            .flag
        {
            if Instant::now() > until {
                return Err("the SQL waiter never slept".into());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        std::thread::sleep(random_phase());
        let (sent, commit) = release_committing(&mut conn, &lease)?;
        let acquired = done_rx.recv()?;
        latencies.push(acquired.saturating_duration_since(sent));
        commits.push(commit);
    }
    drop(go_tx);
    thread.join().map_err(|_| "waiter thread panicked")??;
    Ok((latencies, commits))
}

/// Lapse hand-overs: the holder never releases; returns server-side
/// lateness of each new grant after the old expiry.
fn lapse(url: &str, n: usize, client: bool) -> BenchResult<Vec<Duration>> {
    let short = Duration::from_millis(100);
    let key = if client { "lapse-client" } else { "lapse-sql" };
    let pooled = LeaseClient::connect(url, 2)?;
    let waiter = LeaseWaiter::new(&pooled);
    let mut holder = PgConnection::establish(url)?;
    let mut sql_waiter = PgConnection::establish(url)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let held = granted(holder.acquire(key, "holder", short)?)?;
        std::thread::sleep(random_phase());
        let lease = if client {
            waiter.acquire(key, "waiter", TTL, Duration::from_secs(10))?
        } else {
            sql_waiter.acquire_waiting(key, "waiter", TTL, Duration::from_secs(10))?
        };
        let started = lease.expires_at() - chrono::Duration::from_std(TTL)?;
        out.push((started - held.expires_at()).to_std().unwrap_or_default());
        let _ = holder.release(&lease)?;
    }
    Ok(out)
}

/// Release latency with the original function, the gated one with nobody
/// waiting, and the gated one notifying a registered waiter; interleaved
/// rounds so drift on a shared machine hits every case alike.
fn release_cost(old_url: &str, new_url: &str, sizes: &Sizes) -> BenchResult<()> {
    let mut old = PgConnection::establish(old_url)?;
    let mut new = PgConnection::establish(new_url)?;
    let mut watched = PgConnection::establish(new_url)?;
    let mut listener = PgConnection::establish(new_url)?;
    listener
        .batch_execute("LISTEN lease_released; SELECT lease._waiter_watch('release-watched')")?;
    let cases: [(&str, &str); 3] = [
        ("original lease.release (no wake-on-release)", "old"),
        ("gated release, nobody waiting", "new"),
        ("gated release, a waiter registered (NOTIFY)", "watched"),
    ];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); cases.len()];
    for round in 0..sizes.release_rounds {
        for offset in 0..cases.len() {
            let case = (round + offset) % cases.len();
            let (conn, key) = match cases[case].1 {
                "old" => (&mut old, "release-old"),
                "new" => (&mut new, "release-new"),
                _ => (&mut watched, "release-watched"),
            };
            for _ in 0..sizes.releases_per_round {
                let lease = granted(conn.acquire(key, "o", TTL)?)?;
                let start = Instant::now();
                let _ = conn.release(&leasehold_test_support::grant(key, "o", lease.epoch()))?;
                samples[case].push(start.elapsed());
            }
        }
        // Keep the listening session's notification backlog drained.
        for notification in listener.notifications_iter() {
            notification?;
        }
    }
    println!("\n## Release cost (autocommit, durable commit per release)\n");
    println!("| release | n | mean | p50 | p99 | releases/s | vs original |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mean_of = |s: &[Duration]| s.iter().sum::<Duration>() / (s.len().max(1) as u32);
    let base = mean_of(&samples[0]);
    for (i, (name, _)) in cases.iter().enumerate() {
        let mut s = samples[i].clone();
        s.sort();
        let mean = mean_of(&s);
        println!(
            "| {name} | {} | {} | {} | {} | {:.0} | {:+.1} % |",
            s.len(),
            ms(mean),
            ms(percentile(&s, 50.0)),
            ms(percentile(&s, 99.0)),
            1.0 / mean.as_secs_f64(),
            (mean.as_secs_f64() / base.as_secs_f64() - 1.0) * 100.0
        );
    }
    Ok(())
}
