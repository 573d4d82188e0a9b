//! What the side-by-side benches share, defined once: benches/side_by_side.rs
//! and benches/async_side_by_side.rs each include it as `mod common;`.
//!
//! The options (`--quick`, `--seconds N`, `--clients 1,4,16`,
//! `--fsync-off`), the server
//! (LocalPostgres, or `DATABASE_URL`) and the environment line of a
//! report, the pgbench runner and the percentiles of its per-transaction
//! logs, the SQL the Rust client sends for each common call, and the sync
//! client's calls and threads that the "Rust API" rows time.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection};
use leasehold::{Acquisition, Leases, Release, Renewal};
use leasehold_local::{DatabaseServer, LocalPostgres};

pub type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// The command line: the options every side-by-side bench reads, and the
/// rest of the arguments for the bench's own flags.
pub struct Options {
    pub seconds: u64,
    pub clients: Vec<usize>,
    args: Vec<String>,
}

impl Options {
    /// Whether the bench was given `flag`.
    pub fn has(&self, flag: &str) -> bool {
        self.args.iter().any(|arg| arg == flag)
    }

    /// The argument that follows `flag`, if any.
    pub fn value(&self, flag: &str) -> Option<&str> {
        let at = self.args.iter().position(|arg| arg == flag)?;
        self.args.get(at + 1).map(String::as_str)
    }
}

/// Reads the command line: `--quick` (2 s per row), `--seconds N` (10
/// unless told), `--clients 1,4,16`; anything else is left for
/// [`Options::has`] and [`Options::value`].
pub fn options() -> Options {
    let mut options = Options {
        seconds: 10,
        clients: vec![1, 4, 16],
        args: std::env::args().skip(1).collect(),
    };
    if options.has("--quick") {
        options.seconds = 2;
    }
    if let Some(seconds) = options.value("--seconds").and_then(|s| s.parse().ok()) {
        options.seconds = seconds;
    }
    if let Some(list) = options.value("--clients") {
        options.clients = list.split(',').filter_map(|c| c.parse().ok()).collect();
    }
    options
}

#[derive(Clone, Copy)]
pub struct Stats {
    pub ops_per_sec: f64,
    pub p50_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
}

pub fn stats_from(mut latencies_us: Vec<f64>, elapsed: Duration) -> Stats {
    latencies_us.sort_by(f64::total_cmp);
    let pick = |q: f64| {
        if latencies_us.is_empty() {
            f64::NAN
        } else {
            latencies_us[((latencies_us.len() as f64 - 1.0) * q).round() as usize]
        }
    };
    Stats {
        ops_per_sec: latencies_us.len() as f64 / elapsed.as_secs_f64(),
        p50_us: pick(0.50),
        p95_us: pick(0.95),
        p99_us: pick(0.99),
    }
}

/// One SQL workload: a pgbench script.
pub struct Workload {
    /// Whose SQL it is (the report's group; part of the script's file name).
    pub group: &'static str,
    pub name: &'static str,
    /// One pgbench transaction; ops/s is reported per transaction, as
    /// pgbench counts them.
    pub script: String,
}

/// The bench's server and where its pgbench lives.
pub struct Bench {
    pub server: DatabaseServer,
    pub url: String,
    /// The directory of `pgbench`.
    pub bin: PathBuf,
}

/// Starts a LocalPostgres (or takes `DATABASE_URL`) with room for
/// `max_connections`, and finds its pgbench. The server is durable unless
/// the bench was given `--fsync-off` (fsync, synchronous_commit and
/// full_page_writes off: what a call costs without the disk's commit).
pub fn start_server(options: &Options, max_connections: usize) -> BenchResult<Bench> {
    let server = DatabaseServer::from_env_or_start(
        LocalPostgres::builder()
            .durable(!options.has("--fsync-off"))
            .setting("max_connections", &max_connections.to_string()),
    )?;
    let url = server.url();
    let bin: PathBuf = match server.local() {
        Some(local) => local.bin_dir().to_path_buf(),
        None => PathBuf::from(
            std::env::var("LEASEHOLD_PG_BIN")
                .unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into()),
        ),
    };
    let bin = pgbench_dir(&bin);
    Ok(Bench { server, url, bin })
}

/// The keys the "renew" and "acquire denied" rows use: `held-<c>`, held by
/// owner `o<c>` at epoch 1 for 100 years, for callers 0 to 63.
pub const HELD_KEYS: &str = "SELECT count(*) FROM (SELECT lease.acquire('held-' || g, 'o' || g, interval '100 years') FROM generate_series(0, 63) g) s;";

/// The first sentence of a report: server, settings, pgbench, CPU, row
/// length (each bench adds what its ratios mean).
pub fn environment(conn: &mut PgConnection, bench: &Bench, seconds: u64) -> String {
    format!(
        "Environment: PostgreSQL {} ({}), fsync={}, synchronous_commit={}, wal_sync_method={}, shared_buffers={}; \
         pgbench {}; CPU {} × {} cores; {} s per row; pgbench -M prepared, one thread per client",
        query_text(conn, "SELECT current_setting('server_version') AS value"),
        if bench.server.local().is_some() { "embedded LocalPostgres, unix socket" } else { "DATABASE_URL" },
        query_text(conn, "SELECT current_setting('fsync') AS value"),
        query_text(conn, "SELECT current_setting('synchronous_commit') AS value"),
        query_text(conn, "SELECT current_setting('wal_sync_method') AS value"),
        query_text(conn, "SELECT current_setting('shared_buffers') AS value"),
        Command::new(bench.bin.join("pgbench")).arg("--version").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_else(|e| format!("? ({e}, {})", bench.bin.display())),
        cpu_model(),
        std::thread::available_parallelism().map_or(0, |p| p.get()),
        seconds,
    )
}

pub fn run_pgbench(
    bin: &Path,
    url: &str,
    dir: &Path,
    workload: &Workload,
    clients: usize,
    seconds: u64,
) -> Stats {
    let file_name = format!("{}-{}", workload.group, workload.name)
        .replace([' ', '/', '>', '(', ')', ','], "_");
    let script = dir.join(format!("{file_name}.sql"));
    std::fs::write(&script, &workload.script).unwrap_or_else(|e| panic!("write script: {e}"));
    let log_dir = dir.join(format!("log-{file_name}-{clients}"));
    let _ = std::fs::remove_dir_all(&log_dir);
    std::fs::create_dir_all(&log_dir).unwrap_or_else(|e| panic!("mkdir: {e}"));
    // One pgbench thread per client: a thread serving several clients
    // timestamps them lazily, which logs many fast transactions as 0 µs.
    let jobs = clients;
    let started = Instant::now();
    let output = Command::new(bin.join("pgbench"))
        .current_dir(&log_dir)
        .args(["-n", "-M", "prepared", "-l", "--log-prefix", "tx"])
        .arg("-c")
        .arg(clients.to_string())
        .arg("-j")
        .arg(jobs.to_string())
        .arg("-T")
        .arg(seconds.to_string())
        .arg("-f")
        .arg(&script)
        .arg(url)
        .output()
        .unwrap_or_else(|e| panic!("run pgbench: {e}"));
    let elapsed = started.elapsed();
    if !output.status.success() {
        panic!(
            "pgbench failed for {}: {}\n{}",
            workload.name,
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        );
    }
    let mut latencies = Vec::new();
    let mut first = f64::MAX;
    let mut last = 0.0_f64;
    for entry in std::fs::read_dir(&log_dir)
        .unwrap_or_else(|e| panic!("read logs: {e}"))
        .flatten()
    {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in text.lines() {
            // client_id transaction_no time script_no time_epoch time_us
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() >= 6 {
                if let (Ok(latency), Ok(epoch), Ok(us)) = (
                    fields[2].parse::<f64>(),
                    fields[4].parse::<f64>(),
                    fields[5].parse::<f64>(),
                ) {
                    latencies.push(latency);
                    let end = epoch + us / 1e6;
                    first = first.min(end - latency / 1e6);
                    last = last.max(end);
                }
            }
        }
    }
    let window = if last > first {
        Duration::from_secs_f64(last - first)
    } else {
        elapsed
    };
    stats_from(latencies, window)
}

/// What the Rust client sends for an acquire without a wait
/// (src/sql/calls.rs, `AcquireCall`, with the wait of `acquire`: zero):
/// the same statement, one whatever it answers: the call in the select
/// list. With `gset`, the answer's epoch becomes the pgbench variable
/// `:epoch` for a release after it (a field of the same single call).
pub fn client_acquire(key: &str, owner: &str, ttl: &str, gset: bool) -> String {
    let call = format!("lease.acquire({key}, {owner}, {ttl}, interval '0')");
    if gset {
        format!("SELECT ({call}).epoch AS epoch \\gset\n")
    } else {
        format!("SELECT {call};\n")
    }
}

/// What the Rust client sends for a renew (`RenewCall`).
pub fn client_renew(key: &str, owner: &str, epoch: &str, ttl: &str) -> String {
    format!("SELECT lease.renew({key}, {owner}, {epoch}, {ttl});\n")
}

/// What the Rust client sends for a release (`ReleaseCall`).
pub fn client_release(key: &str, owner: &str, epoch: &str) -> String {
    format!("SELECT lease.release({key}, {owner}, {epoch});\n")
}

/// The common calls that both pgbench (as the SQL the client sends) and
/// the Rust clients run, on caller `c`'s own keys ([`CallerKeys`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Op {
    /// Acquire of a free key: ttl of 1 µs, so the grant is lapsed by the
    /// next call and every call takes the free/lapsed acquire path.
    Acquire,
    /// Acquire of `held-<c>` by owner `d<c>` while `o<c>` holds it: a
    /// denial (the row is read, not written).
    Denied,
    /// Renew of `held-<c>` (epoch 1) for an hour.
    Renew,
    /// Acquire of a free key for 30 s, then its release.
    Cycle,
}

impl Op {
    /// Every operation, in the order the reports list them.
    pub const ALL: [Op; 4] = [Op::Acquire, Op::Denied, Op::Renew, Op::Cycle];

    /// The pgbench row's name (the "Rust API" rows add the client's).
    pub fn name(self) -> &'static str {
        match self {
            Op::Acquire => "acquire (free key)",
            Op::Denied => "acquire denied (held key)",
            Op::Renew => "renew",
            Op::Cycle => "acquire -> release cycle",
        }
    }

    /// The operation as pgbench sends it: what the Rust client sends.
    pub fn workload(self) -> Workload {
        let owner = "'o' || :client_id";
        let script = match self {
            Op::Acquire => client_acquire(
                "'op-' || :client_id",
                owner,
                "interval '1 microsecond'",
                false,
            ),
            Op::Denied => client_acquire(
                "'held-' || :client_id",
                "'d' || :client_id",
                "interval '30s'",
                false,
            ),
            Op::Renew => client_renew("'held-' || :client_id", owner, "1", "interval '1 hour'"),
            Op::Cycle => {
                client_acquire("'cyc-' || :client_id", owner, "interval '30s'", true)
                    + &client_release("'cyc-' || :client_id", owner, ":epoch")
            }
        };
        Workload {
            group: "leasehold",
            name: self.name(),
            script,
        }
    }
}

/// Caller `c`'s keys and owner names for the Rust rows (the pgbench rows
/// use the same, from `:client_id`; the cycle's key differs, so that a
/// cycle of one row never meets a grant of the other).
pub struct CallerKeys {
    pub owner: String,
    pub denied_owner: String,
    pub free: String,
    pub held: String,
    pub cycle: String,
}

impl CallerKeys {
    pub fn new(c: usize) -> Self {
        CallerKeys {
            owner: format!("o{c}"),
            denied_owner: format!("d{c}"),
            free: format!("op-{c}"),
            held: format!("held-{c}"),
            cycle: format!("rcyc-{c}"),
        }
    }
}

/// One call of `op` through the sync API (a `PgConnection` or a
/// `LeaseClient`); panics on an error or an answer the setup rules out.
pub fn sync_call(conn: &mut impl Leases, op: Op, keys: &CallerKeys) {
    match op {
        Op::Acquire => {
            let _ = conn
                .acquire(&keys.free, &keys.owner, Duration::from_micros(1))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        Op::Denied => {
            let answer = conn
                .acquire(&keys.held, &keys.denied_owner, Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(matches!(answer, Acquisition::Denied), "{answer:?}");
        }
        Op::Renew => {
            let answer = conn
                .renew(
                    &leasehold_test_support::grant(&keys.held, &keys.owner, 1),
                    Duration::from_secs(3600),
                )
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(matches!(answer, Renewal::Renewed { .. }), "{answer:?}");
        }
        Op::Cycle => {
            let lease = conn
                .acquire(&keys.cycle, &keys.owner, Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("{e}"))
                .granted()
                .unwrap_or_else(|| panic!("{} denied", keys.cycle));
            let answer = conn.release(&lease).unwrap_or_else(|e| panic!("{e}"));
            assert!(matches!(answer, Release::Released), "{answer:?}");
        }
    }
}

/// Untimed calls each caller makes before the timed window: statements
/// prepared, pools full.
pub const WARM_UP_CALLS: usize = 20;

/// `clients` threads, each with the connection `connect(c)` gives it,
/// calling `op` for `seconds` after [`WARM_UP_CALLS`] untimed calls; the
/// latency of each call, and the throughput over the longest thread's
/// window.
pub fn run_threads<C: Leases>(
    clients: usize,
    seconds: u64,
    op: Op,
    connect: impl Fn(usize) -> C + Sync,
) -> Stats {
    let barrier = Barrier::new(clients);
    let deadline = Duration::from_secs(seconds);
    let (all, longest) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let (barrier, connect) = (&barrier, &connect);
                scope.spawn(move || {
                    let mut conn = connect(c);
                    let keys = CallerKeys::new(c);
                    for _ in 0..WARM_UP_CALLS {
                        sync_call(&mut conn, op, &keys);
                    }
                    let mut samples = Vec::new();
                    barrier.wait();
                    let start = Instant::now();
                    while start.elapsed() < deadline {
                        let t = Instant::now();
                        sync_call(&mut conn, op, &keys);
                        samples.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                    (samples, start.elapsed())
                })
            })
            .collect();
        let mut all = Vec::new();
        let mut longest = Duration::ZERO;
        for handle in handles {
            let (samples, elapsed) = handle
                .join()
                .unwrap_or_else(|_| panic!("client thread panicked"));
            all.extend(samples);
            longest = longest.max(elapsed);
        }
        (all, longest)
    });
    stats_from(all, longest)
}

/// A `PgConnection` to `url`, for a thread of [`run_threads`].
pub fn connect(url: &str) -> PgConnection {
    PgConnection::establish(url).unwrap_or_else(|e| panic!("{e}"))
}

/// Installs leasehold and holds [`HELD_KEYS`].
pub fn prepare(conn: &mut PgConnection) -> BenchResult<()> {
    leasehold::install(conn)?;
    conn.batch_execute(HELD_KEYS)?;
    Ok(())
}

pub fn query_text(conn: &mut PgConnection, sql: &str) -> String {
    #[derive(diesel::QueryableByName)]
    struct Value {
        #[diesel(sql_type = diesel::sql_types::Text)]
        value: String,
    }
    diesel::RunQueryDsl::get_result::<Value>(diesel::sql_query(sql), conn)
        .map(|v| v.value)
        .unwrap_or_else(|e| format!("? ({e})"))
}

/// pgbench lives beside the server binaries; the directory found for those
/// may hold only symlinks to them, so follow `initdb`'s link if needed.
fn pgbench_dir(bin: &Path) -> PathBuf {
    if bin.join("pgbench").exists() {
        return bin.to_path_buf();
    }
    if let Some(real) = std::fs::canonicalize(bin.join("initdb"))
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
    {
        if real.join("pgbench").exists() {
            return real;
        }
    }
    PathBuf::from("/usr/lib/postgresql/15/bin")
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// A directory for pgbench's scripts and logs, removed by the bench.
pub fn work_dir(tag: &str) -> BenchResult<PathBuf> {
    let dir = std::env::temp_dir().join(format!("leasehold-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// `bench-results/<name>`, written; answers its path.
pub fn write_results(name: &str, report: &str) -> BenchResult<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-results");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(name);
    std::fs::write(&path, report)?;
    Ok(path)
}
