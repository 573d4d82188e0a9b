//! The nemesis run: worker processes use leases and guarded writes on a few
//! keys while a nemesis pauses them (SIGSTOP/SIGCONT), kills them (SIGKILL)
//! and crash-restarts the server; afterwards the history checker judges
//! everything they recorded.
//!
//! Shared by `tests/nemesis/main.rs` (a short run in the default test
//! suite) and `examples/nemesis.rs` (the long run); each provides the command that starts a worker process (the test binary
//! or the example re-executing itself), because only a real process can be
//! stopped and killed without taking the run down with it.
//!
//! Workers talk to the server through the library API only: `acquire`,
//! `renew`, `release`, and guarded writes with `guards::admit` /
//! `guards::admit_held` inside their own transaction. Some grants are kept
//! alive through a heartbeat group instead (`join_group`, then
//! `renew_group`, falling back to `renew` when the group answers that the
//! key left it), so that takeovers also race group heartbeats. Timing in workers and
//! nemesis is random on purpose (that is the point of a nemesis); nothing is
//! concluded from it. Every conclusion comes from server-time facts in the
//! history (see `history.rs`).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::result::Error as DieselError;
use diesel::sql_types::{BigInt, Text, Timestamptz};
use leasehold::{
    batch::{GroupId, GroupRenewal},
    error::{ErrorKind, LeaseError},
    Acquisition, LeaseState, Leases, Refusal, Release, Renewal,
};
use leasehold_local::LocalPostgres;

use super::history::{self, Event, Report};
use crate::clock::{server_now, try_server_now};
use leasehold::admin::Operator;
use leasehold::guard::Check;
use leasehold::guard::Fencing;

/// Environment variable carrying a worker's configuration to the child
/// process; its presence selects the worker role.
pub const WORKER_ENV: &str = "LEASEHOLD_NEMESIS_WORKER";

/// The database the run uses.
const DATABASE: &str = "nemesis";

/// The guarded table: every committed write, with the sequence value drawn
/// inside the fenced transaction (after the guard row was locked) and the
/// server time the transaction began.
const SCHEMA: &str = "CREATE TABLE nemesis_writes (
    seq bigserial PRIMARY KEY,
    op text NOT NULL UNIQUE,
    resource text NOT NULL,
    key text NOT NULL,
    owner text NOT NULL,
    epoch bigint NOT NULL,
    at timestamptz NOT NULL)";

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// How long workers run under the nemesis.
    pub duration: Duration,
    /// Seeds every random choice (the interleaving itself still depends on
    /// the scheduler).
    pub seed: u64,
    /// Concurrent worker processes.
    pub workers: usize,
    /// Lease keys (each guards the resource `res-<key>`).
    pub keys: usize,
    /// Print nemesis actions as they happen.
    pub verbose: bool,
    /// Run a pruner alongside (docs/SPECIFICATION.md §1.8): it prunes
    /// every key and guard record idle for 1 ms, again and again, in tiny
    /// batches, so that keys are removed and come back between grants.
    pub prune: bool,
}

/// A small deterministic PRNG (splitmix64): no dependency for dice.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `low..high` (`low` if the range is empty).
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        if high <= low {
            return low;
        }
        low + self.next_u64() % (high - low)
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 100) < percent
    }
}

/// A worker's configuration, passed in [`WORKER_ENV`].
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    pub index: usize,
    pub incarnation: usize,
    pub seed: u64,
    pub url: String,
    pub history: PathBuf,
    /// Unix time (ms) at which the worker stops.
    pub deadline_ms: u64,
    pub keys: usize,
}

impl WorkerSpec {
    fn encode(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}",
            self.index,
            self.incarnation,
            self.seed,
            self.url,
            self.history.display(),
            self.deadline_ms,
            self.keys
        )
    }

    fn decode(text: &str) -> Option<WorkerSpec> {
        let mut f = text.split('\t');
        Some(WorkerSpec {
            index: f.next()?.parse().ok()?,
            incarnation: f.next()?.parse().ok()?,
            seed: f.next()?.parse().ok()?,
            url: f.next()?.to_owned(),
            history: PathBuf::from(f.next()?),
            deadline_ms: f.next()?.parse().ok()?,
            keys: f.next()?.parse().ok()?,
        })
    }

    /// Sets the environment that makes `command` a worker with this spec.
    pub fn apply(&self, command: &mut Command) {
        command.env(WORKER_ENV, self.encode());
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Appends records to a worker's history file, one `write(2)` per record,
/// so a SIGKILL can tear at most the record being written.
struct Recorder {
    file: fs::File,
}

impl Recorder {
    fn open(path: &Path) -> Recorder {
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("open history {}: {e}", path.display()));
        Recorder { file }
    }

    fn record(&mut self, event: &Event) {
        let mut line = event.to_line();
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .unwrap_or_else(|e| panic!("write history: {e}"));
    }
}

#[derive(QueryableByName)]
struct Seq {
    #[diesel(sql_type = BigInt)]
    seq: i64,
}

/// Why a guarded write did not commit.
enum WriteError {
    /// The guard refused: definitely rolled back.
    Refused(&'static str),
    /// Anything else: it may or may not have committed (the connection may
    /// have broken during COMMIT), so it is recorded as unknown.
    Other,
}

impl From<LeaseError> for WriteError {
    fn from(error: LeaseError) -> Self {
        match error.refusal() {
            Some(Refusal::StaleEpoch { .. }) => WriteError::Refused("stale_epoch"),
            Some(Refusal::WrongKey) => WriteError::Refused("wrong_key"),
            // A token of a key whose row a pruner removed (G7).
            Some(Refusal::EpochNotGranted { .. }) => WriteError::Refused("epoch_not_granted"),
            Some(_) if error.kind() == ErrorKind::Fenced => WriteError::Refused("lease_not_held"),
            _ => WriteError::Other,
        }
    }
}

impl From<DieselError> for WriteError {
    fn from(_: DieselError) -> Self {
        WriteError::Other
    }
}

/// The worker process: runs until its deadline, recording every call.
/// Returns normally at the deadline; the nemesis may kill it before.
pub fn worker_main(spec: &WorkerSpec) {
    let owner = format!("w{}.{}", spec.index, spec.incarnation);
    let mut rng = Rng::new(
        spec.seed
            .wrapping_mul(1_000_003)
            .wrapping_add((spec.index as u64) << 20)
            .wrapping_add(spec.incarnation as u64),
    );
    let mut out = Recorder::open(&spec.history);
    // One ttl per incarnation: an idempotent re-acquire of a grant this
    // owner still holds then reports exactly the original grant's times.
    let ttl = Duration::from_millis(rng.range(300, 900));
    let ttl_us = ttl.as_micros() as i64;
    let mut conn: Option<PgConnection> = None;
    let mut writes = 0u64;
    while unix_ms() < spec.deadline_ms {
        let Some(c) = conn.as_mut() else {
            match PgConnection::establish(&spec.url) {
                Ok(c) => conn = Some(c),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
            continue;
        };
        let key = format!("k{}", rng.range(0, spec.keys as u64));
        let resource = format!("res-{key}");
        let lease = match c.acquire(&key, &owner, ttl) {
            Ok(Acquisition::Granted(lease)) => {
                out.record(&Event::Grant {
                    key: key.clone(),
                    owner: owner.clone(),
                    epoch: lease.epoch().get(),
                    start: lease.expires_at().timestamp_micros() - ttl_us,
                    end: lease.expires_at().timestamp_micros(),
                });
                lease
            }
            Ok(Acquisition::Denied) => {
                out.record(&Event::Denied {
                    key: key.clone(),
                    owner: owner.clone(),
                });
                std::thread::sleep(Duration::from_millis(rng.range(0, 50)));
                continue;
            }
            Err(error) if error.kind() == ErrorKind::OutcomeUnknown => {
                out.record(&Event::AcquireUnknown {
                    key: key.clone(),
                    owner: owner.clone(),
                });
                conn = None;
                continue;
            }
            Err(_) => {
                conn = None;
                continue;
            }
        };
        let epoch = lease.epoch();
        let token = lease.token();
        let mut alive = true;
        // Some grants are renewed through a group of their own: joining
        // renews the key, each renew_group then extends the group.
        let mut group = None;
        if rng.chance(40) {
            match c.join_group(&crate::grants(&owner, &[(&key, epoch)]), ttl) {
                Ok(joined) => {
                    if let (Some(joined_group), Renewal::Renewed { expires_at }) =
                        (joined.group, &joined.keys[0].renewal)
                    {
                        group = Some(joined_group);
                        out.record(&Event::GroupRenew {
                            key: key.clone(),
                            owner: owner.clone(),
                            epoch: epoch.get(),
                            at: expires_at.timestamp_micros() - ttl_us,
                            end: expires_at.timestamp_micros(),
                        });
                    }
                }
                Err(_) => {
                    out.record(&Event::RenewUnknown {
                        key: key.clone(),
                        owner: owner.clone(),
                        epoch: epoch.get(),
                    });
                    conn = None;
                    continue;
                }
            }
        }
        for _ in 0..rng.range(1, 6) {
            if rng.chance(75) {
                writes += 1;
                let op = format!("{owner}-{writes}");
                let held = rng.chance(50);
                out.record(&Event::WriteInvoke {
                    op: op.clone(),
                    resource: resource.clone(),
                    key: key.clone(),
                    owner: owner.clone(),
                    epoch: epoch.get(),
                    held,
                });
                let result = c.transaction::<_, WriteError, _>(|c| {
                    let at = try_server_now(c)?;
                    if held {
                        c.admit(&resource, &token, Check::LeaseHeld)?;
                    } else {
                        c.admit(&resource, &token, Check::Token)?;
                    }
                    let seq = diesel::sql_query(
                        "INSERT INTO nemesis_writes (op, resource, key, owner, epoch, at) \
                         VALUES ($1, $2, $3, $4, $5, $6) RETURNING seq",
                    )
                    .bind::<Text, _>(&op)
                    .bind::<Text, _>(&resource)
                    .bind::<Text, _>(&key)
                    .bind::<Text, _>(&owner)
                    .bind::<BigInt, _>(epoch)
                    .bind::<Timestamptz, _>(at)
                    .get_result::<Seq>(c)?
                    .seq;
                    Ok((seq, at))
                });
                match result {
                    Ok((seq, at)) => out.record(&Event::WriteOk {
                        op,
                        seq,
                        at: at.timestamp_micros(),
                    }),
                    Err(WriteError::Refused(reason)) => out.record(&Event::WriteRefused {
                        op,
                        reason: reason.to_owned(),
                    }),
                    Err(WriteError::Other) => {
                        out.record(&Event::WriteUnknown { op });
                        alive = false;
                        break;
                    }
                }
            }
            std::thread::sleep(Duration::from_micros(rng.range(0, ttl_us as u64 / 2)));
            match renew_key(c, group, &key, &owner, epoch.get(), ttl) {
                Ok((Renewal::Renewed { expires_at }, via_group)) => {
                    let (key, owner) = (key.clone(), owner.clone());
                    let (at, end) = (
                        expires_at.timestamp_micros() - ttl_us,
                        expires_at.timestamp_micros(),
                    );
                    out.record(&if via_group {
                        Event::GroupRenew {
                            key,
                            owner,
                            epoch: epoch.get(),
                            at,
                            end,
                        }
                    } else {
                        Event::Renew {
                            key,
                            owner,
                            epoch: epoch.get(),
                            at,
                            end,
                        }
                    })
                }
                Ok((Renewal::Refused(why), _)) => {
                    out.record(&Event::RenewLost {
                        key: key.clone(),
                        owner: owner.clone(),
                        epoch: epoch.get(),
                        status: why.as_status().to_owned(),
                    });
                    break;
                }
                Err(_) => {
                    out.record(&Event::RenewUnknown {
                        key: key.clone(),
                        owner: owner.clone(),
                        epoch: epoch.get(),
                    });
                    alive = false;
                    break;
                }
            }
        }
        if !alive {
            conn = None;
            continue;
        }
        if rng.chance(60) {
            out.record(&Event::ReleaseInvoke {
                key: key.clone(),
                owner: owner.clone(),
                epoch: epoch.get(),
            });
            match c.release(&crate::grant(&key, &owner, epoch)) {
                Ok(Release::Released) => out.record(&Event::ReleaseOk {
                    key: key.clone(),
                    owner: owner.clone(),
                    epoch: epoch.get(),
                }),
                Ok(Release::Refused(why)) => out.record(&Event::ReleaseLost {
                    key: key.clone(),
                    owner: owner.clone(),
                    epoch: epoch.get(),
                    status: why.as_status().to_owned(),
                }),
                Err(_) => {
                    // OutcomeUnknown (the connection broke mid-call) or a
                    // failure that rolled back; "unknown" is the safe
                    // record for both.
                    out.record(&Event::ReleaseUnknown {
                        key: key.clone(),
                        owner: owner.clone(),
                        epoch: epoch.get(),
                    });
                    conn = None;
                }
            }
        } else {
            // Abandon the grant: someone takes it over once it lapses.
            std::thread::sleep(Duration::from_millis(rng.range(0, 100)));
        }
    }
}

/// Renews one grant: through its group when it has one (the group's
/// expiry is the key's while the key is its one member), otherwise, and
/// whenever the group answers that the key is no longer in it or that the
/// group lapsed, with `renew`, which says why for the key itself. Says
/// whether the group renewed it.
fn renew_key(
    conn: &mut PgConnection,
    group: Option<GroupId>,
    key: &str,
    owner: &str,
    epoch: i64,
    ttl: Duration,
) -> Result<(Renewal, bool), LeaseError> {
    if let Some(group) = group {
        if let GroupRenewal::Renewed {
            expires_at,
            members: 1,
        } = conn.renew_group(group, owner, ttl)?
        {
            return Ok((Renewal::Renewed { expires_at }, true));
        }
    }
    Ok((conn.renew(&crate::grant(key, owner, epoch), ttl)?, false))
}

/// Best effort: the holder may have exited already.
fn signal(pid: u32, sig: libc::c_int) {
    let _ = crate::process::send_signal(pid, sig);
}

/// What the run did and what the checker found.
#[derive(Debug)]
pub struct Outcome {
    pub report: Report,
    pub pauses: usize,
    pub kills: usize,
    pub crashes: usize,
    /// What the pruner did (all zero without one).
    pub pruning: PruneCounts,
    pub elapsed: Duration,
    /// Where the histories are (kept when there were violations).
    pub history_dir: PathBuf,
}

impl Outcome {
    /// The counts, one line each, as printed at the end of a run.
    pub fn summary(&self, options: &Options) -> String {
        let r = &self.report;
        let mut text = format!(
            "nemesis run: duration {:?} (elapsed {:.1?}), seed {}, workers {}, keys {}\n\
             operations: {}\ngrants: {}\ntakeovers: {}\nrenewals: {} (through a group: {})\n\
             committed writes: {}\nrefused writes: {}\nunknown outcomes: {}\n\
             post-crash inspects: {}\npauses: {}\nkills: {}\ncrashes: {}\n\
             prunes: {} (failed {}), keys pruned: {}, guard records pruned: {}\n\
             violations: {} {:?}\n",
            options.duration,
            self.elapsed,
            options.seed,
            options.workers,
            options.keys,
            r.operations,
            r.grants,
            r.takeovers,
            r.renewals,
            r.group_renewals,
            r.committed_writes,
            r.refused_writes,
            r.unknown_outcomes,
            r.inspects,
            self.pauses,
            self.kills,
            self.crashes,
            self.pruning.prunes,
            self.pruning.failed,
            self.pruning.keys,
            self.pruning.guards,
            r.violations.len(),
            r.kinds()
        );
        for violation in r.violations.iter().take(20) {
            text.push_str(&format!("  {violation}\n"));
        }
        if !r.violations.is_empty() {
            text.push_str(&format!(
                "histories kept in {}\n",
                self.history_dir.display()
            ));
        }
        text
    }
}

/// Runs workers under the nemesis for `options.duration`, then checks the
/// history. `worker_command` returns the command that starts one worker
/// process (the caller's own executable); the spec is applied to it here.
/// When `LEASEHOLD_TEST_SQL_PATCH` names a file, its SQL runs right after
/// the install (see [`crate::database::apply_sql_patch`]; for the SQL
/// mutation runner, test-support/mutation/README.md).
pub fn run(options: &Options, worker_command: &dyn Fn() -> Command) -> Outcome {
    let started = Instant::now();
    let mut rng = Rng::new(options.seed);
    // Durable: an acknowledged commit must survive SIGKILL of the postmaster
    // (with synchronous_commit off it could be lost with shared memory).
    let server = LocalPostgres::builder()
        .durable(true)
        .setting("max_connections", "100")
        .start()
        .unwrap_or_else(|e| panic!("start the nemesis server: {e}"));
    {
        let mut admin = PgConnection::establish(&server.url()).expect("connect to the server");
        admin
            .batch_execute(&format!("CREATE DATABASE {DATABASE}"))
            .expect("create the nemesis database");
    }
    let url = server.url_for(DATABASE);
    let mut conn = PgConnection::establish(&url).expect("connect to the nemesis database");
    leasehold::install(&mut conn).expect("install leasehold");
    crate::database::apply_sql_patch(&mut conn);
    crate::coverage::record_everything();
    conn.batch_execute(SCHEMA)
        .expect("create the guarded table");

    let history_dir = std::env::temp_dir().join(format!(
        "leasehold-nemesis-{}-{}",
        std::process::id(),
        unix_ms()
    ));
    fs::create_dir_all(&history_dir).expect("create the history directory");
    let driver_path = history_dir.join("driver.log");
    let mut driver = Recorder::open(&driver_path);

    let deadline_ms = unix_ms() + options.duration.as_millis() as u64;
    let spawn = |index: usize, incarnation: usize| -> Child {
        let spec = WorkerSpec {
            index,
            incarnation,
            seed: options.seed,
            url: url.clone(),
            history: history_dir.join(format!("worker-{index}.{incarnation}.log")),
            deadline_ms,
            keys: options.keys,
        };
        let mut command = worker_command();
        spec.apply(&mut command);
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn worker {index}: {e}"))
    };
    let mut workers: Vec<(Child, usize)> = (0..options.workers).map(|i| (spawn(i, 0), 0)).collect();
    let pruner = options.prune.then(|| {
        let url = url.clone();
        let seed = options.seed;
        std::thread::spawn(move || prune_until(&url, deadline_ms, seed))
    });
    let (mut pauses, mut kills, mut crashes) = (0, 0, 0);
    let say = |text: String| {
        if options.verbose {
            eprintln!("[nemesis {:>6.1?}] {text}", started.elapsed());
        }
    };

    while unix_ms() + 300 < deadline_ms {
        std::thread::sleep(Duration::from_millis(rng.range(200, 1200)));
        let roll = rng.range(0, 100);
        let victim = rng.range(0, options.workers as u64) as usize;
        if roll < 50 {
            // Pause: shorter or longer than the ttls (300..900 ms), so that
            // some paused holders are taken over and wake up fenced.
            let pid = workers[victim].0.id();
            let pause = Duration::from_millis(rng.range(100, 2000));
            say(format!("pause worker {victim} for {pause:?}"));
            signal(pid, libc::SIGSTOP);
            driver.record(&Event::Nemesis {
                action: "pause".into(),
            });
            std::thread::sleep(pause);
            signal(pid, libc::SIGCONT);
            pauses += 1;
        } else if roll < 75 {
            say(format!("kill worker {victim}"));
            let (child, incarnation) = &mut workers[victim];
            let _ = child.kill();
            let _ = child.wait();
            *incarnation += 1;
            let next = *incarnation;
            *child = spawn(victim, next);
            driver.record(&Event::Nemesis {
                action: "kill".into(),
            });
            kills += 1;
        } else if roll < 90 {
            say("crash the server (SIGKILL postmaster) and restart".into());
            server.kill_postmaster().expect("kill the postmaster");
            std::thread::sleep(Duration::from_millis(rng.range(0, 500)));
            server.restart().expect("restart after the crash");
            driver.record(&Event::Nemesis {
                action: "crash".into(),
            });
            crashes += 1;
            // Epochs after recovery: checked against every grant before.
            let mut c = PgConnection::establish(&url).expect("reconnect after the crash");
            inspect_all(&mut c, options.keys, &mut driver);
            conn = c;
        }
    }

    // Let workers reach their deadline and exit; kill stragglers.
    let grace = Instant::now() + Duration::from_secs(30);
    for (child, _) in &mut workers {
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < grace => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
            }
        }
    }
    let pruning = pruner
        .map(|thread| thread.join().expect("the pruner thread panicked"))
        .unwrap_or_default();
    // One last crash: everything acknowledged must survive it too.
    drop(conn);
    server
        .kill_postmaster()
        .expect("final kill of the postmaster");
    server.restart().expect("final restart");
    crashes += 1;
    driver.record(&Event::Nemesis {
        action: "crash".into(),
    });
    let mut conn = PgConnection::establish(&url).expect("connect after the final crash");
    inspect_all(&mut conn, options.keys, &mut driver);

    let mut events = Vec::new();
    for entry in fs::read_dir(&history_dir).expect("read the history directory") {
        let path = entry.expect("history entry").path();
        let text = fs::read_to_string(&path).expect("read a history file");
        events.extend(history::parse_history(&text));
    }
    let rows = final_rows(&mut conn);
    // Keep the table next to the histories, so a kept run can be re-checked.
    let table: String = rows.iter().map(|e| e.to_line() + "\n").collect();
    fs::write(history_dir.join("table.log"), table).expect("write table.log");
    events.extend(rows);
    let report = history::check(&events);
    if report.violations.is_empty() {
        let _ = fs::remove_dir_all(&history_dir);
    }
    Outcome {
        report,
        pauses,
        kills,
        crashes,
        pruning,
        elapsed: started.elapsed(),
        history_dir,
    }
}

/// What the pruner of a run did.
#[derive(Debug, Clone, Copy, Default)]
pub struct PruneCounts {
    /// Prunes that completed.
    pub prunes: u64,
    /// Prunes that failed (the server crashed under them, say).
    pub failed: u64,
    /// Key rows removed.
    pub keys: u64,
    /// Guard records removed.
    pub guards: u64,
}

/// The pruner: until the deadline, prunes everything idle for 1 ms in
/// batches of 2 rows (so batches interleave with the workers' calls), with
/// random pauses, reconnecting after a crash. Records nothing in the
/// history: the checker judges the workers' calls, whatever the pruner did.
fn prune_until(url: &str, deadline_ms: u64, seed: u64) -> PruneCounts {
    let mut rng = Rng::new(seed.wrapping_add(0x5052_554e));
    let options = leasehold::admin::PruneOptions {
        batch: 2,
        ..leasehold::admin::PruneOptions::new(Duration::from_millis(1))
    };
    let mut counts = PruneCounts::default();
    let mut conn: Option<PgConnection> = None;
    while unix_ms() < deadline_ms {
        let Some(c) = conn.as_mut() else {
            match PgConnection::establish(url) {
                Ok(c) => conn = Some(c),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
            continue;
        };
        match c.prune(&options) {
            Ok(report) => {
                counts.prunes += 1;
                counts.keys += report.keys_pruned;
                counts.guards += report.guards_pruned;
            }
            Err(_) => {
                counts.failed += 1;
                conn = None;
            }
        }
        std::thread::sleep(Duration::from_millis(rng.range(0, 50)));
    }
    counts
}

/// Records `inspect` of every key, bracketed by server times.
fn inspect_all(conn: &mut PgConnection, keys: usize, out: &mut Recorder) {
    for k in 0..keys {
        let key = format!("k{k}");
        let before = server_now(conn);
        let state = conn.inspect(&key).expect("inspect after a crash");
        let after = server_now(conn);
        if let Some(state) = state {
            out.record(&Event::Inspect {
                key,
                before: before.timestamp_micros(),
                after: after.timestamp_micros(),
                held: matches!(state, LeaseState::Held { .. }),
                epoch: state.epoch().get(),
            });
        }
    }
}

#[derive(QueryableByName)]
struct RowLine {
    #[diesel(sql_type = Text)]
    op: String,
    #[diesel(sql_type = Text)]
    resource: String,
    #[diesel(sql_type = BigInt)]
    epoch: i64,
    #[diesel(sql_type = BigInt)]
    seq: i64,
    #[diesel(sql_type = Timestamptz)]
    at: DateTime<Utc>,
}

fn final_rows(conn: &mut PgConnection) -> Vec<Event> {
    diesel::sql_query("SELECT op, resource, epoch, seq, at FROM nemesis_writes ORDER BY seq")
        .load::<RowLine>(conn)
        .expect("read the guarded table")
        .into_iter()
        .map(|r| Event::Row {
            op: r.op,
            resource: r.resource,
            epoch: r.epoch,
            seq: r.seq,
            at: r.at.timestamp_micros(),
        })
        .collect()
}

/// The worker spec from the environment, if this process is a worker.
pub fn worker_spec_from_env() -> Option<WorkerSpec> {
    let text = std::env::var(WORKER_ENV).ok()?;
    Some(WorkerSpec::decode(&text).unwrap_or_else(|| panic!("bad {WORKER_ENV}: {text:?}")))
}
