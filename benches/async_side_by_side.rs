//! The async face beside the sync one and beside pgbench, in one run, on
//! one server: what a call costs through each client, and what a waiting
//! task costs against a waiting thread.
//!
//! Run: `cargo bench --features async --bench async_side_by_side` (10 s
//! per row), or with `-- --quick` (2 s) or `-- --seconds N`. Options:
//! `--clients 1,4,16`, `--rounds R` (each row's figures the median of R
//! interleaved rounds; 1 unless told), `--waiters N` (1000), `--no-memory`,
//! `--no-throughput`, `--fsync-off` (a server without durable commits:
//! the client's own cost stands out from the disk's).
//!
//! Throughput: for each number of callers and each operation of
//! [`common::Op`], in this order, on the same keys:
//! 1. pgbench (`-M prepared`, one thread per client) sending the SQL the
//!    library sends;
//! 2. the sync `Leases` on one `PgConnection` per thread (side_by_side's
//!    "Rust API" rows);
//! 3. the sync `LeaseClient`, pool size = callers, one thread per caller;
//! 4. the async `AsyncLeaseClient`, pool size = callers, one tokio task per
//!    caller on a multi-thread runtime (a worker per core);
//! 5. the async `AsyncLeases` on one `AsyncPgConnection` per task.
//!
//! Each Rust caller makes `common::WARM_UP_CALLS` untimed calls, then all
//! start together and time every call for the row's seconds.
//!
//! Memory: the bench runs itself twice more as child processes (so that
//! the two measurements share no heap), `--memory-child async` and
//! `--memory-child sync`. Each builds a client (pool of [`MEMORY_POOL`]) and
//! a waiter, waits for the listener session, makes a few calls on every
//! pooled connection, reads VmRSS, VmHWM, VmSize and Threads from
//! /proc/self/status, then starts N waiters (`aio::LeaseWaiter` tasks, or
//! `wait::LeaseWaiter` threads with the default stack), each on its own
//! key held by another owner, waits until the listener counts all N armed
//! (`armed_waiters`), and reads /proc/self/status again. While it waits to
//! be told to exit, the parent counts the server's client sessions
//! (pg_stat_activity).
//!
//! The tables go to stdout and to `bench-results/<timestamp>-async.md`.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::future::Future;
use std::io::{BufRead, BufReader, Write as _};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::PgConnection;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use leasehold::aio::{AsyncLeaseClient, AsyncLeases};
use leasehold::wait::Wait;
use leasehold::{Acquisition, LeaseClient, Release, Renewal};
use tokio::runtime::Runtime;

mod common;
use common::{BenchResult, CallerKeys, Op, Options, Stats};

/// The pool of each memory child's client: the attempts of all its
/// waiters share it.
const MEMORY_POOL: u32 = 4;

/// How long a memory child waits for all its waiters to be armed.
const ARM_TIMEOUT: Duration = Duration::from_secs(180);

/// What drives each throughput row, in the order of the rows.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Client {
    Pgbench,
    SyncConnection,
    SyncPool,
    AsyncPool,
    AsyncConnection,
}

impl Client {
    const ALL: [Client; 5] = [
        Client::Pgbench,
        Client::SyncConnection,
        Client::SyncPool,
        Client::AsyncPool,
        Client::AsyncConnection,
    ];

    fn name(self) -> &'static str {
        match self {
            Client::Pgbench => "pgbench (same SQL)",
            Client::SyncConnection => "sync PgConnection per thread",
            Client::SyncPool => "sync LeaseClient (pool), threads",
            Client::AsyncPool => "async AsyncLeaseClient (pool), tasks",
            Client::AsyncConnection => "async AsyncPgConnection per task",
        }
    }
}

fn main() -> BenchResult<()> {
    let options = common::options();
    if let Some(kind) = options.value("--memory-child") {
        return memory_child(kind, &options);
    }
    let waiters: usize = options
        .value("--waiters")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let bench = common::start_server(&options, 100)?;
    let url = bench.url.clone();
    let mut conn = common::connect(&url);
    common::prepare(&mut conn)?;
    let work_dir = common::work_dir("async-bench")?;

    let mut report = String::new();
    let timestamp = chrono::Utc::now().format("%Y-%m-%dT%H-%M-%SZ").to_string();
    writeln!(report, "## Async beside sync, {timestamp}\n")?;
    writeln!(
        report,
        "{}; `vs pgbench` is the row's p50 minus pgbench's (µs) and its ops/s over pgbench's, same callers, same operation. \
         Load average at the start: {}.\n",
        common::environment(&mut conn, &bench, options.seconds),
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default(),
    )?;
    print!("{report}");

    if !options.has("--no-memory") {
        memory_section(&mut conn, &url, waiters, &mut report)?;
    }
    if !options.has("--no-throughput") {
        throughput_section(&bench, &options, &work_dir, &mut report)?;
    }

    let path = common::write_results(&format!("{timestamp}-async.md"), &report)?;
    println!("\nwritten to {}", path.display());
    let _ = std::fs::remove_dir_all(&work_dir);
    drop(conn);
    drop(bench);
    Ok(())
}

fn throughput_section(
    bench: &common::Bench,
    options: &Options,
    work_dir: &std::path::Path,
    report: &mut String,
) -> BenchResult<()> {
    let rounds: usize = options
        .value("--rounds")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
        .max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut emit = |line: String| {
        print!("{line}");
        report.push_str(&line);
    };
    if rounds > 1 {
        emit(format!(
            "Each figure is the median of {rounds} rounds; each round runs the five rows of an operation once, the first row moving by one each round.\n\n"
        ));
    }
    emit("| operation | callers | client | ops/s | p50 µs | p95 µs | p99 µs | p50 vs pgbench (µs) | ops/s vs pgbench |\n".into());
    emit("|---|---:|---|---:|---:|---:|---:|---:|---:|\n".into());
    let mut results: HashMap<(Op, usize, Client), Stats> = HashMap::new();
    for &callers in &options.clients {
        for op in Op::ALL {
            let mut runs: HashMap<Client, Vec<Stats>> = HashMap::new();
            for round in 0..rounds {
                let mut order = Client::ALL;
                order.rotate_left(round % Client::ALL.len());
                for client in order {
                    let stats = run_client(
                        &runtime,
                        bench,
                        work_dir,
                        client,
                        callers,
                        options.seconds,
                        op,
                    )?;
                    runs.entry(client).or_default().push(stats);
                }
            }
            let floor = median(&runs[&Client::Pgbench]);
            for client in Client::ALL {
                let stats = median(&runs[&client]);
                results.insert((op, callers, client), stats);
                emit(format!(
                    "| {} | {callers} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:+.0} | {:.2} |\n",
                    op.name(),
                    client.name(),
                    stats.ops_per_sec,
                    stats.p50_us,
                    stats.p95_us,
                    stats.p99_us,
                    stats.p50_us - floor.p50_us,
                    stats.ops_per_sec / floor.ops_per_sec,
                ));
            }
        }
    }

    // What the async face adds to each call: the same pair of rows of
    // the table above, async minus sync.
    emit("\n| operation | callers | p50 µs: AsyncLeaseClient − LeaseClient | ops/s: AsyncLeaseClient ÷ LeaseClient | p50 µs: AsyncPgConnection − PgConnection | ops/s: AsyncPgConnection ÷ PgConnection |\n".into());
    emit("|---|---:|---:|---:|---:|---:|\n".into());
    for &callers in &options.clients {
        for op in Op::ALL {
            let get = |client: Client| results[&(op, callers, client)];
            let (conn, pool, apool, aconn) = (
                get(Client::SyncConnection),
                get(Client::SyncPool),
                get(Client::AsyncPool),
                get(Client::AsyncConnection),
            );
            emit(format!(
                "| {} | {callers} | {:+.0} | {:.2} | {:+.0} | {:.2} |\n",
                op.name(),
                apool.p50_us - pool.p50_us,
                apool.ops_per_sec / pool.ops_per_sec,
                aconn.p50_us - conn.p50_us,
                aconn.ops_per_sec / conn.ops_per_sec,
            ));
        }
    }
    Ok(())
}

/// Each figure's median over `runs`.
fn median(runs: &[Stats]) -> Stats {
    let of = |field: fn(&Stats) -> f64| {
        let mut values: Vec<f64> = runs.iter().map(field).collect();
        values.sort_by(f64::total_cmp);
        let mid = values.len() / 2;
        if values.len().is_multiple_of(2) {
            (values[mid - 1] + values[mid]) / 2.0
        } else {
            values[mid]
        }
    };
    Stats {
        ops_per_sec: of(|s| s.ops_per_sec),
        p50_us: of(|s| s.p50_us),
        p95_us: of(|s| s.p95_us),
        p99_us: of(|s| s.p99_us),
    }
}

/// One row: `callers` callers of `op` for `seconds`, through `client`.
fn run_client(
    runtime: &Runtime,
    bench: &common::Bench,
    work_dir: &std::path::Path,
    client: Client,
    callers: usize,
    seconds: u64,
    op: Op,
) -> BenchResult<Stats> {
    let url = bench.url.as_str();
    let size = u32::try_from(callers)?;
    Ok(match client {
        Client::Pgbench => {
            common::run_pgbench(&bench.bin, url, work_dir, &op.workload(), callers, seconds)
        }
        Client::SyncConnection => {
            common::run_threads(callers, seconds, op, |_| common::connect(url))
        }
        Client::SyncPool => {
            let pool = LeaseClient::builder(url).max_size(size).build()?;
            common::run_threads(callers, seconds, op, |_| pool.clone())
        }
        Client::AsyncPool => {
            let pool = runtime.block_on(AsyncLeaseClient::builder(url).max_size(size).build())?;
            run_tasks(runtime, callers, seconds, op, |_| {
                let pool = pool.clone();
                async move { pool }
            })
        }
        Client::AsyncConnection => run_tasks(runtime, callers, seconds, op, |_| async move {
            AsyncPgConnection::establish(url)
                .await
                .unwrap_or_else(|e| panic!("{e}"))
        }),
    })
}

/// One call of `op` through the async face: [`common::sync_call`],
/// awaited.
async fn async_call(conn: &mut (impl AsyncLeases + Send), op: Op, keys: &CallerKeys) {
    match op {
        Op::Acquire => {
            let _ = conn
                .acquire(&keys.free, &keys.owner, Duration::from_micros(1))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        Op::Denied => {
            let answer = conn
                .acquire(&keys.held, &keys.denied_owner, Duration::from_secs(30))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(matches!(answer, Acquisition::Denied), "{answer:?}");
        }
        Op::Renew => {
            let answer = conn
                .renew(
                    &leasehold_test_support::grant(&keys.held, &keys.owner, 1),
                    Duration::from_secs(3600),
                )
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(matches!(answer, Renewal::Renewed { .. }), "{answer:?}");
        }
        Op::Cycle => {
            let lease = conn
                .acquire(&keys.cycle, &keys.owner, Duration::from_secs(30))
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .granted()
                .unwrap_or_else(|| panic!("{} denied", keys.cycle));
            let answer = conn.release(&lease).await.unwrap_or_else(|e| panic!("{e}"));
            assert!(matches!(answer, Release::Released), "{answer:?}");
        }
    }
}

/// [`common::run_threads`] with tasks: `callers` tasks on `runtime`, each
/// with the connection `connect(c)` gives it.
fn run_tasks<C, F>(
    runtime: &Runtime,
    callers: usize,
    seconds: u64,
    op: Op,
    connect: impl Fn(usize) -> F,
) -> Stats
where
    C: AsyncLeases + Send + 'static,
    F: Future<Output = C>,
{
    let deadline = Duration::from_secs(seconds);
    runtime.block_on(async {
        let barrier = Arc::new(tokio::sync::Barrier::new(callers));
        let mut tasks = Vec::new();
        for c in 0..callers {
            let mut conn = connect(c).await;
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                let keys = CallerKeys::new(c);
                for _ in 0..common::WARM_UP_CALLS {
                    async_call(&mut conn, op, &keys).await;
                }
                let mut samples = Vec::new();
                barrier.wait().await;
                let start = Instant::now();
                while start.elapsed() < deadline {
                    let t = Instant::now();
                    async_call(&mut conn, op, &keys).await;
                    samples.push(t.elapsed().as_secs_f64() * 1e6);
                }
                (samples, start.elapsed())
            }));
        }
        let mut all = Vec::new();
        let mut longest = Duration::ZERO;
        for task in tasks {
            let (samples, elapsed) = task.await.unwrap_or_else(|e| panic!("caller task: {e}"));
            all.extend(samples);
            longest = longest.max(elapsed);
        }
        common::stats_from(all, longest)
    })
}

/// What /proc/self/status says of the process's memory and threads.
#[derive(Clone, Copy, Debug)]
struct ProcStatus {
    rss_kib: u64,
    hwm_kib: u64,
    size_kib: u64,
    threads: u64,
}

fn proc_status() -> ProcStatus {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    ProcStatus {
        rss_kib: field("VmRSS:"),
        hwm_kib: field("VmHWM:"),
        size_kib: field("VmSize:"),
        threads: field("Threads:"),
    }
}

/// The line a memory child prints once its waiters are armed.
fn armed_line(start: ProcStatus, before: ProcStatus, armed: ProcStatus, took: Duration) -> String {
    let mut line = String::from("armed");
    for (name, status) in [("start", start), ("before", before), ("armed", armed)] {
        line.push_str(&format!(
            " {name}_rss={} {name}_hwm={} {name}_size={} {name}_threads={}",
            status.rss_kib, status.hwm_kib, status.size_kib, status.threads
        ));
    }
    line.push_str(&format!(" arm_ms={}", took.as_millis()));
    line
}

/// A memory child: `kind` is `async` or `sync`.
fn memory_child(kind: &str, options: &Options) -> BenchResult<()> {
    let start = proc_status();
    let url = options.value("--url").ok_or("--url missing")?.to_owned();
    let n: usize = options
        .value("--waiters")
        .ok_or("--waiters missing")?
        .parse()?;
    let keys: Vec<String> = (1..=n).map(|i| format!("mem-{i}")).collect();
    let ttl = Duration::from_secs(30);
    let line = match kind {
        "sync" => {
            let client = LeaseClient::builder(&url).max_size(MEMORY_POOL).build()?;
            let waiter = leasehold::wait::LeaseWaiter::new(&client);
            if !waiter.wait_until_listening(Duration::from_secs(30)) {
                return Err("the listener did not connect".into());
            }
            // Every pooled connection opened and its statements prepared.
            std::thread::scope(|scope| {
                for c in 0..MEMORY_POOL as usize {
                    let mut client = client.clone();
                    scope.spawn(move || {
                        for _ in 0..5 {
                            common::sync_call(&mut client, Op::Denied, &CallerKeys::new(c));
                        }
                    });
                }
            });
            let before = proc_status();
            let began = Instant::now();
            for (i, key) in keys.iter().enumerate() {
                let (key, owner) = (key.clone(), format!("mem-w{i}"));
                let waiter = waiter.clone();
                std::thread::spawn(move || {
                    let result = waiter.acquire(&key, &owner, ttl, Wait::UntilCancelled);
                    panic!("waiter of {key} returned: {result:?}");
                });
            }
            loop {
                let armed: usize = keys.iter().map(|key| waiter.armed_waiters(key)).sum();
                if armed == n {
                    break;
                }
                if began.elapsed() > ARM_TIMEOUT {
                    return Err(format!("{armed} of {n} sync waiters armed").into());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            armed_line(start, before, proc_status(), began.elapsed())
        }
        "async" => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            // The runtime and its parked tasks outlive this block: the
            // process exits once the parent has counted the sessions.
            let line = runtime.block_on(async {
                let client = AsyncLeaseClient::builder(&url)
                    .max_size(MEMORY_POOL)
                    .build()
                    .await?;
                let waiter = leasehold::aio::LeaseWaiter::new(&client);
                if !waiter.wait_until_listening(Duration::from_secs(30)).await {
                    return Err::<String, Box<dyn std::error::Error>>(
                        "the listener did not connect".into(),
                    );
                }
                let warm: Vec<_> = (0..MEMORY_POOL as usize)
                    .map(|c| {
                        let mut client = client.clone();
                        tokio::spawn(async move {
                            for _ in 0..5 {
                                async_call(&mut client, Op::Denied, &CallerKeys::new(c)).await;
                            }
                        })
                    })
                    .collect();
                for task in warm {
                    task.await?;
                }
                let before = proc_status();
                let began = Instant::now();
                for (i, key) in keys.iter().enumerate() {
                    let (key, owner) = (key.clone(), format!("mem-w{i}"));
                    let waiter = waiter.clone();
                    tokio::spawn(async move {
                        let result = waiter
                            .acquire(&key, &owner, ttl, Wait::UntilCancelled)
                            .await;
                        panic!("waiter of {key} returned: {result:?}");
                    });
                }
                loop {
                    let armed: usize = keys.iter().map(|key| waiter.armed_waiters(key)).sum();
                    if armed == n {
                        break;
                    }
                    if began.elapsed() > ARM_TIMEOUT {
                        return Err(format!("{armed} of {n} async waiters armed").into());
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Ok(armed_line(start, before, proc_status(), began.elapsed()))
            })?;
            std::mem::forget(runtime);
            line
        }
        other => return Err(format!("--memory-child {other}: async or sync").into()),
    };
    println!("{line}");
    std::io::stdout().flush()?;
    // Armed until the parent has counted the server's sessions.
    let mut done = String::new();
    std::io::stdin().read_line(&mut done)?;
    std::process::exit(0);
}

/// The server's client sessions other than the asking one, by
/// application name.
const SESSIONS: &str = "SELECT coalesce(sum(n), 0)::text || ' (' || coalesce(string_agg(n::text || ' ' || name, ', ' ORDER BY name), '') || ')' AS value \
     FROM (SELECT CASE WHEN application_name = '' THEN 'unnamed' ELSE application_name END AS name, count(*) AS n \
           FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() GROUP BY 1) s";

fn memory_section(
    conn: &mut PgConnection,
    url: &str,
    waiters: usize,
    report: &mut String,
) -> BenchResult<()> {
    conn.batch_execute(&format!(
        "SELECT count(*) FROM (SELECT lease.acquire('mem-' || g, 'mem-holder', interval '1 day') \
         FROM generate_series(1, {waiters}) g) s"
    ))?;
    let mut emit = |line: String| {
        print!("{line}");
        report.push_str(&line);
    };
    emit(format!(
        "\n| {waiters} waiters | threads before → armed | VmRSS before → armed (KiB) | VmRSS per waiter (KiB) | VmHWM armed (KiB) | VmSize per waiter (KiB) | server sessions while armed | time to arm (ms) | VmRSS at process start (KiB) |\n"
    ));
    emit("|---|---:|---:|---:|---:|---:|---|---:|---:|\n".into());
    for kind in ["async", "sync"] {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["--memory-child", kind, "--url", url])
            .args(["--waiters", &waiters.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("child stdout")?;
        let mut armed = None;
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            if let Some(rest) = line.strip_prefix("armed ") {
                armed = Some(rest.to_owned());
                break;
            }
        }
        let Some(armed) = armed else {
            let status = child.wait()?;
            return Err(format!("memory child {kind} ended ({status}) before arming").into());
        };
        let sessions = common::query_text(conn, SESSIONS);
        writeln!(child.stdin.take().ok_or("child stdin")?, "done")?;
        child.wait()?;
        let value: BTreeMap<&str, f64> = armed
            .split_whitespace()
            .filter_map(|pair| pair.split_once('='))
            .filter_map(|(name, n)| Some((name, n.parse().ok()?)))
            .collect();
        let get = |name: &str| value.get(name).copied().unwrap_or(f64::NAN);
        let per_waiter = |name: &str| {
            (get(&format!("armed_{name}")) - get(&format!("before_{name}"))) / waiters as f64
        };
        let label = if kind == "async" {
            "async: aio::LeaseWaiter tasks"
        } else {
            "sync: wait::LeaseWaiter threads"
        };
        emit(format!(
            "| {label} | {:.0} → {:.0} | {:.0} → {:.0} | {:.1} | {:.0} | {:.1} | {sessions} | {:.0} | {:.0} |\n",
            get("before_threads"),
            get("armed_threads"),
            get("before_rss"),
            get("armed_rss"),
            per_waiter("rss"),
            get("armed_hwm"),
            per_waiter("size"),
            get("arm_ms"),
            get("start_rss"),
        ));
    }
    emit(format!(
        "\nEach in its own process; pool of {MEMORY_POOL} connections each; `before` is after the client, the waiter, the listener session and warm-up calls on every pooled connection.\n\n"
    ));
    Ok(())
}
