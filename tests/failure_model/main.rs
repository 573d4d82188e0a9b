//! docs/SPECIFICATION.md §1.6, the failure model: every check runs against its own
//! throwaway cluster, because most of them stop, crash or break it.
//!
//! Nothing here waits for time to pass on hope. Expiry is awaited on the
//! server's clock (`clock_timestamp()`), a competitor is known to be waiting
//! when `pg_stat_activity` says so, a dead backend is gone when
//! `pg_stat_activity` no longer lists it, a paused process is paused when
//! `/proc/<pid>/stat` says `T`, and a lost answer is lost because a proxy
//! in this process dropped it after seeing the server's ReadyForQuery.
//!
//! Clusters whose point is durability run with `durable(true)` (fsync and
//! synchronous commit on); the others run without, to keep the suite fast.

mod proxy;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{Bool, Text, Timestamptz};
use leasehold::{
    acquire, acquire_waiting, inspect, release, renew, Acquisition, FencedError, GuardError, Lease,
    LeaseError, LeaseState, Refusal, Release, Renewal,
};
use leasehold::{run_fenced, Check};
use leasehold_local::{LocalPostgres, StopMode};

const TTL: Duration = Duration::from_secs(600);

/// Selects the child role of this test binary: a lease holder in its own
/// process (see [`holder_process`]). The value is the database URL.
const HOLDER_ENV: &str = "LEASEHOLD_FAILURE_MODEL_HOLDER";
/// The holder's ttl in milliseconds.
const HOLDER_TTL_ENV: &str = "LEASEHOLD_FAILURE_MODEL_HOLDER_TTL_MS";

struct Cluster {
    pg: LocalPostgres,
}

impl Cluster {
    /// A fresh server with leasehold installed in database `postgres` and a
    /// guarded table `writes`.
    fn start(durable: bool) -> Cluster {
        Self::from(LocalPostgres::builder().durable(durable))
    }

    fn from(builder: leasehold_local::LocalPostgresBuilder) -> Cluster {
        let pg = builder
            .start()
            .unwrap_or_else(|e| panic!("start a throwaway server: {e}"));
        let cluster = Cluster { pg };
        let mut conn = cluster.conn();
        leasehold::install(&mut conn).expect("install leasehold");
        conn.batch_execute(
            "CREATE TABLE writes (seq bigserial PRIMARY KEY, owner text NOT NULL, epoch bigint NOT NULL)",
        )
        .expect("create the guarded table");
        cluster
    }

    fn url(&self) -> String {
        self.pg.url()
    }

    fn conn(&self) -> PgConnection {
        PgConnection::establish(&self.url()).unwrap_or_else(|e| panic!("connect: {e}"))
    }

    fn crash_and_recover(&self) {
        self.pg.kill_postmaster().expect("SIGKILL the postmaster");
        self.pg.restart().expect("restart with crash recovery");
    }
}

#[derive(QueryableByName)]
struct Now {
    #[diesel(sql_type = Timestamptz)]
    now: DateTime<Utc>,
}

fn server_now(conn: &mut PgConnection) -> DateTime<Utc> {
    diesel::sql_query("SELECT clock_timestamp() AS now")
        .get_result::<Now>(conn)
        .expect("server clock")
        .now
}

/// Waits until the server's clock is past `instant`.
fn wait_until_server_time_passes(conn: &mut PgConnection, instant: DateTime<Utc>) {
    loop {
        let now = server_now(conn);
        if now > instant {
            return;
        }
        let remaining = (instant - now).to_std().unwrap_or_default();
        std::thread::sleep(remaining.min(Duration::from_millis(50)) + Duration::from_micros(100));
    }
}

#[derive(QueryableByName)]
struct Flag {
    #[diesel(sql_type = Bool)]
    flag: bool,
}

fn query_bool(conn: &mut PgConnection, sql: &str) -> bool {
    diesel::sql_query(sql)
        .get_result::<Flag>(conn)
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .flag
}

/// Polls an observable server condition (a boolean query) until it holds.
fn wait_for(conn: &mut PgConnection, what: &str, sql: &str) {
    for _ in 0..4_000 {
        if query_bool(conn, sql) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("never observed: {what} ({sql})");
}

/// Waits until backend `pid` polls inside a blocking acquire.
fn wait_until_polling(conn: &mut PgConnection, pid: i32) {
    wait_for(
        conn,
        "the waiter polling in lease.acquire",
        &format!(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {pid} AND wait_event = 'PgSleep') AS flag"
        ),
    );
}

fn wait_until_backend_gone(conn: &mut PgConnection, pid: i32) {
    wait_for(
        conn,
        "the backend exiting",
        &format!("SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {pid}) AS flag"),
    );
}

#[derive(QueryableByName)]
struct Line {
    #[diesel(sql_type = Text)]
    line: String,
}

fn query_lines(conn: &mut PgConnection, sql: &str) -> Vec<String> {
    diesel::sql_query(sql)
        .load::<Line>(conn)
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .into_iter()
        .map(|l| l.line)
        .collect()
}

fn backend_pid(conn: &mut PgConnection) -> i32 {
    query_lines(conn, "SELECT pg_backend_pid()::text AS line")[0]
        .parse()
        .expect("pid")
}

/// Every lease row and guard row, exactly: what "nothing changed" compares.
fn snapshot(conn: &mut PgConnection) -> Vec<String> {
    let mut rows = query_lines(
        conn,
        "SELECT format('lease %s|%s|%s|%s|%s', key, owner, epoch, expires_at, lapsed_owner) AS line \
         FROM lease.leases ORDER BY key",
    );
    rows.extend(query_lines(
        conn,
        "SELECT format('guard %s|%s|%s', resource, lease_key, accepted_epoch) AS line \
         FROM lease.guards ORDER BY resource",
    ));
    rows.extend(query_lines(
        conn,
        "SELECT format('write %s|%s|%s', seq, owner, epoch) AS line FROM writes ORDER BY seq",
    ));
    rows
}

fn granted(acquisition: Acquisition) -> Lease {
    acquisition.granted().expect("expected a grant")
}

fn writes(conn: &mut PgConnection) -> Vec<String> {
    query_lines(
        conn,
        "SELECT format('%s@%s', owner, epoch) AS line FROM writes ORDER BY seq",
    )
}

/// A guarded write to resource `r` with the lease's token.
fn fenced_write(
    conn: &mut PgConnection,
    lease_token: &leasehold::FencingToken,
    check: Check,
) -> Result<(), FencedError<diesel::result::Error>> {
    let (owner, epoch) = (lease_token.owner().to_owned(), lease_token.epoch());
    run_fenced(conn, "r", lease_token, check, |conn| {
        diesel::sql_query("INSERT INTO writes (owner, epoch) VALUES ($1, $2)")
            .bind::<Text, _>(&owner)
            .bind::<diesel::sql_types::BigInt, _>(epoch)
            .execute(conn)
            .map(|_| ())
    })
}

// ---------------------------------------------------------------------
// Restarts and crashes: the last committed state stands.
// ---------------------------------------------------------------------

/// Builds a state with every kind of key (held, free, lapsed, taken over)
/// and a guard record, and returns its exact snapshot.
fn committed_state(cluster: &Cluster) -> Vec<String> {
    let mut conn = cluster.conn();
    granted(acquire(&mut conn, "held", "a", TTL).unwrap());
    let free = granted(acquire(&mut conn, "free", "a", TTL).unwrap());
    assert_eq!(
        release(&mut conn, "free", "a", free.epoch()).unwrap(),
        Release::Released
    );
    let old = granted(acquire(&mut conn, "taken", "a", Duration::from_millis(100)).unwrap());
    wait_until_server_time_passes(&mut conn, old.expires_at());
    let new = granted(acquire(&mut conn, "taken", "b", TTL).unwrap());
    fenced_write(&mut conn, &new.token(), Check::LeaseHeld).unwrap();
    snapshot(&mut conn)
}

/// After the restart: the same rows, and they still act as they did.
fn assert_state_stands(cluster: &Cluster, before: &[String]) {
    let mut conn = cluster.conn();
    assert_eq!(snapshot(&mut conn), before, "the committed state changed");
    assert_eq!(
        acquire(&mut conn, "held", "x", TTL).unwrap(),
        Acquisition::Denied,
        "a held lease must stay held"
    );
    assert!(matches!(
        renew(&mut conn, "held", "a", 1, TTL).unwrap(),
        Renewal::Renewed { .. }
    ));
    assert_eq!(
        granted(acquire(&mut conn, "free", "x", TTL).unwrap()).epoch(),
        3,
        "the released key's counter (2) must stand"
    );
    assert_eq!(
        renew(&mut conn, "taken", "a", 1, TTL).unwrap(),
        Renewal::Refused(Refusal::Lapsed),
        "the taken-over holder must still hear lapsed"
    );
    let stale = leasehold::FencingToken::new("taken", "a", 1).unwrap();
    assert!(matches!(
        fenced_write(&mut conn, &stale, Check::Token),
        Err(FencedError::Guard(GuardError::StaleEpoch {
            accepted: 2,
            ..
        }))
    ));
}

#[test]
fn clean_restart_keeps_the_last_committed_state_and_epochs() {
    let cluster = Cluster::start(true);
    let before = committed_state(&cluster);
    cluster.pg.stop(StopMode::Fast).unwrap();
    cluster.pg.restart().unwrap();
    assert_state_stands(&cluster, &before);
}

#[test]
fn immediate_shutdown_keeps_the_last_committed_state_and_epochs() {
    let cluster = Cluster::start(true);
    let before = committed_state(&cluster);
    cluster.pg.stop(StopMode::Immediate).unwrap();
    cluster.pg.restart().unwrap();
    assert!(
        cluster.pg.log_tail(200).contains("not properly shut down"),
        "the restart must have run crash recovery"
    );
    assert_state_stands(&cluster, &before);
}

#[test]
fn postmaster_sigkill_keeps_the_last_committed_state_and_epochs() {
    let cluster = Cluster::start(true);
    let before = committed_state(&cluster);
    cluster.crash_and_recover();
    assert!(cluster.pg.log_tail(200).contains("not properly shut down"));
    assert_state_stands(&cluster, &before);
}

/// An acquire (a first grant and a takeover) and a release inside a
/// transaction that never committed when the server died leave no trace:
/// the next grants get exactly the epochs they would have got anyway.
#[test]
fn uncommitted_calls_in_flight_at_a_crash_leave_no_trace() {
    let cluster = Cluster::start(true);
    let mut conn = cluster.conn();
    let old = granted(acquire(&mut conn, "old", "a", TTL).unwrap());
    assert_eq!(
        release(&mut conn, "old", "a", old.epoch()).unwrap(),
        Release::Released
    );
    granted(acquire(&mut conn, "held", "a", TTL).unwrap());
    let before = snapshot(&mut conn);
    let mut in_flight = cluster.conn();
    in_flight.batch_execute("BEGIN").unwrap();
    assert_eq!(
        granted(acquire(&mut in_flight, "new", "b", TTL).unwrap()).epoch(),
        1
    );
    assert_eq!(
        granted(acquire(&mut in_flight, "old", "b", TTL).unwrap()).epoch(),
        3
    );
    assert_eq!(
        release(&mut in_flight, "held", "a", 1).unwrap(),
        Release::Released
    );
    cluster.crash_and_recover();
    let mut conn = cluster.conn();
    assert_eq!(snapshot(&mut conn), before);
    assert_eq!(inspect(&mut conn, "new").unwrap(), None);
    assert_eq!(
        granted(acquire(&mut conn, "old", "c", TTL).unwrap()).epoch(),
        3
    );
    assert!(inspect(&mut conn, "held").unwrap().unwrap().is_held());
}

/// Epochs granted before each of several crashes stay below every epoch
/// granted after it, and the counter inspect reports never goes back.
#[test]
fn epochs_never_regress_across_repeated_crashes() {
    let cluster = Cluster::start(true);
    let mut highest = 0;
    for round in 0..3 {
        let mut conn = cluster.conn();
        for _ in 0..3 {
            let lease = granted(acquire(&mut conn, "k", &format!("w{round}"), TTL).unwrap());
            assert!(lease.epoch() > highest, "round {round}: {lease:?}");
            highest = lease.epoch();
            assert_eq!(
                release(&mut conn, "k", lease.owner(), lease.epoch()).unwrap(),
                Release::Released
            );
        }
        let counter = inspect(&mut conn, "k").unwrap().unwrap().epoch();
        drop(conn);
        cluster.crash_and_recover();
        let mut conn = cluster.conn();
        assert_eq!(
            inspect(&mut conn, "k").unwrap().unwrap().epoch(),
            counter,
            "round {round}: the counter moved across the crash"
        );
        highest = counter;
    }
}

/// G1 across a crash: the guard record stands, so a stale writer stays
/// refused after recovery.
#[test]
fn guard_records_survive_a_crash_and_keep_refusing_stale_epochs() {
    let cluster = Cluster::start(true);
    let mut conn = cluster.conn();
    let new = leasehold::FencingToken::new("k", "b", 3).unwrap();
    fenced_write(&mut conn, &new, Check::Token).unwrap();
    drop(conn);
    cluster.crash_and_recover();
    let mut conn = cluster.conn();
    let stale = leasehold::FencingToken::new("k", "a", 2).unwrap();
    assert!(matches!(
        fenced_write(&mut conn, &stale, Check::Token),
        Err(FencedError::Guard(GuardError::StaleEpoch {
            presented: 2,
            accepted: 3,
            ..
        }))
    ));
    assert_eq!(writes(&mut conn), ["b@3"]);
}

// ---------------------------------------------------------------------
// Downtime never extends ownership.
// ---------------------------------------------------------------------

fn downtime_past_expiry(crash: bool) {
    let cluster = Cluster::start(true);
    let mut conn = cluster.conn();
    let lease = granted(acquire(&mut conn, "k", "a", Duration::from_millis(500)).unwrap());
    drop(conn);
    if crash {
        cluster.pg.kill_postmaster().unwrap();
    } else {
        cluster.pg.stop(StopMode::Fast).unwrap();
    }
    // The server is down, so its clock cannot be asked; it is this
    // machine's clock, which the check below confirms after the restart.
    while Utc::now() <= lease.expires_at() {
        std::thread::sleep(Duration::from_millis(20));
    }
    cluster.pg.restart().unwrap();
    let mut conn = cluster.conn();
    // First access after recovery, with no wait of any kind:
    let taken = granted(acquire(&mut conn, "k", "b", TTL).unwrap());
    assert_eq!(taken.epoch(), 2);
    assert!(server_now(&mut conn) > lease.expires_at());
    assert_eq!(
        renew(&mut conn, "k", "a", 1, TTL).unwrap(),
        Renewal::Refused(Refusal::Lapsed)
    );
}

#[test]
fn downtime_past_expiry_never_extends_ownership_after_a_clean_stop() {
    downtime_past_expiry(false);
}

#[test]
fn downtime_past_expiry_never_extends_ownership_after_a_crash() {
    downtime_past_expiry(true);
}

// ---------------------------------------------------------------------
// Holder death and hangs: the lease lapses at expiry, no earlier.
// ---------------------------------------------------------------------

/// The session dying does not free the lease; expiry does.
fn held_until_expiry_then_taken_over(conn: &mut PgConnection, lease: &Lease) {
    assert_eq!(
        inspect(conn, "k").unwrap(),
        Some(LeaseState::Held {
            owner: lease.owner().to_owned(),
            epoch: lease.epoch(),
            expires_at: lease.expires_at()
        }),
        "the holder's death must not free the lease"
    );
    assert_eq!(
        acquire(conn, "k", "b", TTL).unwrap(),
        Acquisition::Denied,
        "nobody may take the lease before it expires"
    );
    wait_until_server_time_passes(conn, lease.expires_at());
    let taken = granted(acquire(conn, "k", "b", TTL).unwrap());
    assert_eq!(taken.epoch(), lease.epoch() + 1);
}

#[test]
fn holder_backend_terminated_keeps_the_lease_until_expiry_then_it_is_taken_over() {
    let cluster = Cluster::start(false);
    let mut holder = cluster.conn();
    let mut observer = cluster.conn();
    let lease = granted(acquire(&mut holder, "k", "a", Duration::from_secs(2)).unwrap());
    let pid = backend_pid(&mut holder);
    assert!(query_bool(
        &mut observer,
        &format!("SELECT pg_terminate_backend({pid}) AS flag")
    ));
    wait_until_backend_gone(&mut observer, pid);
    held_until_expiry_then_taken_over(&mut observer, &lease);
    assert!(matches!(
        renew(&mut holder, "k", "a", 1, TTL),
        Err(LeaseError::OutcomeUnknown { .. }) | Err(LeaseError::Database { .. })
    ));
}

/// A lease holder in a process of its own, driven over stdin/stdout.
struct HolderProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl HolderProcess {
    /// Starts the holder; it acquires `k` as `stalled` with `ttl`.
    fn start(cluster: &Cluster, ttl: Duration) -> (HolderProcess, i64, DateTime<Utc>, i32) {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "holder_process",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HOLDER_ENV, cluster.url())
            .env(HOLDER_TTL_ENV, ttl.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the holder process");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut holder = HolderProcess {
            child,
            stdin,
            stdout,
        };
        let granted = holder.expect_line("GRANTED");
        let fields: Vec<&str> = granted.split(' ').collect();
        let epoch = fields[0].parse().unwrap();
        let expires_at = DateTime::from_timestamp_micros(fields[1].parse().unwrap()).unwrap();
        let backend = fields[2].parse().unwrap();
        (holder, epoch, expires_at, backend)
    }

    /// The rest of the first line starting with `tag `.
    fn expect_line(&mut self, tag: &str) -> String {
        loop {
            let mut line = String::new();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "the holder exited before reporting {tag}");
            // The child's test harness may have printed "test holder_process
            // ... " without a newline first, so look anywhere in the line.
            let line = line.trim_end();
            if let Some(at) = line.find(&format!("{tag} ")) {
                return line[at + tag.len() + 1..].to_owned();
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {sig} failed");
    }

    /// The process state letter from /proc (R, S, T, Z...).
    fn state(&self) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        let rest = stat.rsplit_once(')').unwrap().1;
        rest.trim_start().chars().next().unwrap()
    }

    /// Waits (bounded) until the process shows `state` in /proc: a signal is
    /// delivered asynchronously, so `kill` returning does not mean the
    /// process has stopped yet.
    fn wait_for_state(&self, state: char) -> char {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut seen = self.state();
        while seen != state && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
            seen = self.state();
        }
        seen
    }
}

impl Drop for HolderProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Not a test on its own: the holder process of the tests above, selected
/// by [`HOLDER_ENV`]. Acquires `k` as `stalled`, reports, then on `GO`
/// tries to carry on as if nothing had happened and reports each answer.
#[test]
fn holder_process() {
    let Ok(url) = std::env::var(HOLDER_ENV) else {
        return;
    };
    let ttl_ms: u64 = std::env::var(HOLDER_TTL_ENV).unwrap().parse().unwrap();
    let mut conn = PgConnection::establish(&url).unwrap();
    let lease = granted(acquire(&mut conn, "k", "stalled", Duration::from_millis(ttl_ms)).unwrap());
    let pid = backend_pid(&mut conn);
    let say = |text: String| {
        // Straight to the pipe: println! may be captured by the harness.
        let mut out = std::io::stdout().lock();
        out.write_all(format!("{text}\n").as_bytes()).unwrap();
        out.flush().unwrap();
    };
    say(format!(
        "GRANTED {} {} {pid}",
        lease.epoch(),
        lease.expires_at().timestamp_micros()
    ));
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let renewal = match renew(&mut conn, "k", "stalled", lease.epoch(), TTL).unwrap() {
        Renewal::Renewed { .. } => "renewed".to_owned(),
        Renewal::Refused(why) => why.to_string(),
    };
    say(format!("RENEW {renewal}"));
    let describe = |result: Result<(), FencedError<diesel::result::Error>>| match result {
        Ok(()) => "written".to_owned(),
        Err(FencedError::Guard(GuardError::StaleEpoch { accepted, .. })) => {
            format!("stale_epoch accepted={accepted}")
        }
        Err(FencedError::Guard(GuardError::LeaseNotHeld { reason, .. })) => {
            format!("lease_not_held reason={reason}")
        }
        Err(other) => format!("other {other}"),
    };
    say(format!(
        "TOKEN {}",
        describe(fenced_write(&mut conn, &lease.token(), Check::Token))
    ));
    say(format!(
        "HELD {}",
        describe(fenced_write(&mut conn, &lease.token(), Check::LeaseHeld))
    ));
}

#[test]
fn holder_process_killed_keeps_the_lease_until_expiry_then_it_is_taken_over() {
    let cluster = Cluster::start(false);
    let mut observer = cluster.conn();
    let (mut holder, epoch, expires_at, backend) =
        HolderProcess::start(&cluster, Duration::from_secs(2));
    holder.signal("-KILL");
    holder.child.wait().unwrap();
    // The server notices the dead client and ends its backend.
    wait_until_backend_gone(&mut observer, backend);
    let lease = granted_view("stalled", epoch, expires_at, &mut observer);
    held_until_expiry_then_taken_over(&mut observer, &lease);
}

/// The lease as inspect reports it, checked to be the given grant.
fn granted_view(
    owner: &str,
    epoch: i64,
    expires_at: DateTime<Utc>,
    conn: &mut PgConnection,
) -> Lease {
    assert_eq!(
        inspect(conn, "k").unwrap(),
        Some(LeaseState::Held {
            owner: owner.into(),
            epoch,
            expires_at
        })
    );
    // Re-acquiring as the owner is idempotent: the same grant, as a Lease,
    // and nothing changes.
    granted(acquire(conn, "k", owner, TTL).unwrap())
}

/// The seed's example 3 with a real hang: the holder's process is stopped
/// (no death, no disconnect), its lease lapses and is taken over, the new
/// holder writes; when the old holder resumes, its renew says `lapsed`, its
/// token-checked write is refused as stale and its lease-checked write as
/// lapsed, and nothing of either is visible.
#[test]
fn hung_holder_is_taken_over_at_expiry_and_fenced_when_it_resumes() {
    let cluster = Cluster::start(false);
    let mut conn = cluster.conn();
    let (mut holder, epoch, expires_at, _) =
        HolderProcess::start(&cluster, Duration::from_millis(800));
    holder.signal("-STOP");
    assert_eq!(
        holder.wait_for_state('T'),
        'T',
        "the holder must be stopped"
    );
    wait_until_server_time_passes(&mut conn, expires_at);
    let new = granted(acquire(&mut conn, "k", "b", TTL).unwrap());
    assert_eq!(new.epoch(), epoch + 1);
    fenced_write(&mut conn, &new.token(), Check::Token).unwrap();
    holder.signal("-CONT");
    holder.stdin.write_all(b"GO\n").unwrap();
    assert_eq!(holder.expect_line("RENEW"), "lapsed");
    assert_eq!(holder.expect_line("TOKEN"), "stale_epoch accepted=2");
    assert_eq!(holder.expect_line("HELD"), "lease_not_held reason=lapsed");
    assert_eq!(writes(&mut conn), ["b@2"]);
    assert_eq!(
        inspect(&mut conn, "k").unwrap(),
        Some(LeaseState::Held {
            owner: "b".into(),
            epoch: 2,
            expires_at: new.expires_at()
        })
    );
}

// ---------------------------------------------------------------------
// Too-short ttl: a liveness mistake, never a safety violation.
// ---------------------------------------------------------------------

#[test]
fn too_short_ttl_shows_up_as_lapsed_and_harms_nobody() {
    let cluster = Cluster::start(false);
    let mut hasty = cluster.conn();
    let mut other = cluster.conn();
    let lease = granted(acquire(&mut hasty, "k", "hasty", Duration::from_millis(50)).unwrap());
    // The "work" outlasts the ttl; meanwhile someone else takes over.
    wait_until_server_time_passes(&mut other, lease.expires_at());
    let next = granted(acquire(&mut other, "k", "b", TTL).unwrap());
    fenced_write(&mut other, &next.token(), Check::LeaseHeld).unwrap();
    let before = snapshot(&mut other);
    assert_eq!(
        renew(&mut hasty, "k", "hasty", lease.epoch(), TTL).unwrap(),
        Renewal::Refused(Refusal::Lapsed)
    );
    assert_eq!(
        release(&mut hasty, "k", "hasty", lease.epoch()).unwrap(),
        Release::Refused(Refusal::Lapsed)
    );
    assert!(matches!(
        fenced_write(&mut hasty, &lease.token(), Check::Token),
        Err(FencedError::Guard(GuardError::StaleEpoch { .. }))
    ));
    assert!(matches!(
        fenced_write(&mut hasty, &lease.token(), Check::LeaseHeld),
        Err(FencedError::Guard(GuardError::LeaseNotHeld {
            reason: Refusal::Lapsed,
            ..
        }))
    ));
    assert_eq!(
        snapshot(&mut other),
        before,
        "the hasty holder changed something"
    );
}

// ---------------------------------------------------------------------
// Interrupted blocking acquires change nothing.
// ---------------------------------------------------------------------

/// Starts a blocking acquire of `k` by `b` on its own connection and
/// returns its backend pid once it polls inside the SQL function.
fn blocked_waiter(
    cluster: &Cluster,
    observer: &mut PgConnection,
    setup: &'static str,
) -> (i32, std::thread::JoinHandle<Result<Lease, LeaseError>>) {
    let mut conn = cluster.conn();
    conn.batch_execute(setup).unwrap();
    let pid = backend_pid(&mut conn);
    let waiter = std::thread::spawn(move || {
        acquire_waiting(&mut conn, "k", "b", TTL, Duration::from_secs(60))
    });
    wait_until_polling(observer, pid);
    (pid, waiter)
}

#[test]
fn statement_timeout_during_a_blocking_acquire_changes_nothing() {
    let cluster = Cluster::start(false);
    let mut conn = cluster.conn();
    granted(acquire(&mut conn, "k", "a", TTL).unwrap());
    let before = snapshot(&mut conn);
    let (_, waiter) = blocked_waiter(&cluster, &mut conn, "SET statement_timeout = '400ms'");
    let error = waiter.join().unwrap().unwrap_err();
    // 57014 like the lease wait timeout, but the statement's timeout: a
    // database error, not the typed TimedOut of the 60 s wait bound.
    assert!(
        matches!(&error, LeaseError::Database { source, .. }
            if source.to_string().contains("statement timeout")),
        "{error:?}"
    );
    assert_eq!(snapshot(&mut conn), before);
}

#[test]
fn cancel_during_a_blocking_acquire_changes_nothing() {
    let cluster = Cluster::start(false);
    let mut conn = cluster.conn();
    granted(acquire(&mut conn, "k", "a", TTL).unwrap());
    let before = snapshot(&mut conn);
    let (pid, waiter) = blocked_waiter(&cluster, &mut conn, "SELECT 1");
    assert!(query_bool(
        &mut conn,
        &format!("SELECT pg_cancel_backend({pid}) AS flag")
    ));
    let error = waiter.join().unwrap().unwrap_err();
    assert!(
        matches!(&error, LeaseError::Database { source, .. }
            if source.to_string().contains("canceling statement due to user request")),
        "{error:?}"
    );
    assert_eq!(snapshot(&mut conn), before);
}

// ---------------------------------------------------------------------
// Connection lost mid-call: "outcome unknown", resolved by a re-read.
// ---------------------------------------------------------------------

/// The waiter's backend is terminated mid-call: the client cannot know
/// whether anything committed, so it must say "outcome unknown"; the
/// re-read shows that nothing did.
#[test]
fn terminated_backend_during_a_blocking_acquire_reports_outcome_unknown_and_changes_nothing() {
    let cluster = Cluster::start(false);
    let mut conn = cluster.conn();
    granted(acquire(&mut conn, "k", "a", TTL).unwrap());
    let before = snapshot(&mut conn);
    let (pid, waiter) = blocked_waiter(&cluster, &mut conn, "SELECT 1");
    assert!(query_bool(
        &mut conn,
        &format!("SELECT pg_terminate_backend({pid}) AS flag")
    ));
    let error = waiter.join().unwrap().unwrap_err();
    assert!(
        matches!(&error, LeaseError::OutcomeUnknown { operation: leasehold::Operation::Acquire, key, .. } if key == "k"),
        "{error:?}"
    );
    // Resolution: the re-read shows the holder unchanged.
    assert_eq!(snapshot(&mut conn), before);
    assert_eq!(inspect(&mut conn, "k").unwrap().unwrap().epoch(), 1);
}

fn proxied(cluster_tcp: &LocalPostgres) -> (proxy::Proxy, PgConnection) {
    let proxy = proxy::Proxy::start(cluster_tcp.port());
    let mut conn = PgConnection::establish(&proxy.url("postgres")).expect("connect via proxy");
    // Prepare every lease statement on this connection, so that the call
    // under test is exactly one Bind/Execute/Sync round trip.
    let warm = granted(acquire(&mut conn, "warm-up", "w", TTL).unwrap());
    let _ = renew(&mut conn, "warm-up", "w", warm.epoch(), TTL).unwrap();
    let _ = release(&mut conn, "warm-up", "w", warm.epoch()).unwrap();
    (proxy, conn)
}

fn tcp_cluster() -> Cluster {
    Cluster::from(LocalPostgres::builder().durable(false).tcp(true))
}

/// The server commits the acquire, the answer never arrives: the client
/// reports OutcomeUnknown (neither Granted nor Denied nor a plain error);
/// inspect resolves it as granted, and the idempotent re-acquire returns
/// the very same grant.
#[test]
fn acquire_whose_answer_is_lost_after_commit_reports_outcome_unknown_and_inspect_finds_it_granted()
{
    let cluster = tcp_cluster();
    let (proxy, mut conn) = proxied(&cluster.pg);
    proxy.drop_next_answer();
    let error = acquire(&mut conn, "k", "a", TTL).unwrap_err();
    assert!(
        matches!(&error, LeaseError::OutcomeUnknown { operation: leasehold::Operation::Acquire, key, .. } if key == "k"),
        "{error:?}"
    );
    assert!(proxy.answer_was_dropped(), "the proxy never saw the answer");
    let mut direct = cluster.conn();
    let Some(LeaseState::Held {
        owner,
        epoch,
        expires_at,
    }) = inspect(&mut direct, "k").unwrap()
    else {
        panic!("the acquire committed, inspect must show it");
    };
    assert_eq!((owner.as_str(), epoch), ("a", 1));
    let again = granted(acquire(&mut direct, "k", "a", TTL).unwrap());
    assert_eq!((again.epoch(), again.expires_at()), (1, expires_at));
}

/// The connection breaks before the call reaches the server: the client
/// still cannot tell, reports OutcomeUnknown, and inspect resolves it as
/// not granted.
#[test]
fn acquire_lost_before_the_server_saw_it_reports_outcome_unknown_and_inspect_finds_nothing() {
    let cluster = tcp_cluster();
    let (proxy, mut conn) = proxied(&cluster.pg);
    proxy.drop_next_request();
    let error = acquire(&mut conn, "k", "a", TTL).unwrap_err();
    assert!(
        matches!(
            &error,
            LeaseError::OutcomeUnknown {
                operation: leasehold::Operation::Acquire,
                ..
            }
        ),
        "{error:?}"
    );
    let mut direct = cluster.conn();
    assert_eq!(inspect(&mut direct, "k").unwrap(), None);
}

/// Renew and release with lost answers: OutcomeUnknown, and the re-read
/// shows each took effect.
#[test]
fn renew_and_release_whose_answers_are_lost_report_outcome_unknown_and_inspect_resolves_them() {
    let cluster = tcp_cluster();
    let mut direct = cluster.conn();
    let lease = granted(acquire(&mut direct, "k", "a", Duration::from_secs(5)).unwrap());

    let (proxy, mut conn) = proxied(&cluster.pg);
    proxy.drop_next_answer();
    let error = renew(&mut conn, "k", "a", lease.epoch(), TTL).unwrap_err();
    assert!(
        matches!(
            &error,
            LeaseError::OutcomeUnknown {
                operation: leasehold::Operation::Renew,
                ..
            }
        ),
        "{error:?}"
    );
    let Some(LeaseState::Held { expires_at, .. }) = inspect(&mut direct, "k").unwrap() else {
        panic!("the lease must still be held");
    };
    assert!(expires_at > lease.expires_at(), "the renewal committed");

    let (proxy, mut conn) = proxied(&cluster.pg);
    proxy.drop_next_answer();
    let error = release(&mut conn, "k", "a", lease.epoch()).unwrap_err();
    assert!(
        matches!(
            &error,
            LeaseError::OutcomeUnknown {
                operation: leasehold::Operation::Release,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        inspect(&mut direct, "k").unwrap(),
        Some(LeaseState::Unowned { epoch: 2 }),
        "the release committed"
    );
}

/// Inside the caller's (diesel) transaction a broken connection is not
/// "outcome unknown": nothing commits before the caller's COMMIT, so the
/// call's effect is certainly gone with the transaction.
#[test]
fn a_lost_answer_inside_a_transaction_is_a_database_error_and_nothing_commits() {
    let cluster = tcp_cluster();
    let (proxy, mut conn) = proxied(&cluster.pg);
    let mut lease_error = None;
    let _ = conn.transaction::<(), diesel::result::Error, _>(|conn| {
        proxy.drop_next_answer();
        lease_error = acquire(conn, "k", "a", TTL).err();
        Err(diesel::result::Error::RollbackTransaction)
    });
    let error = lease_error.expect("the acquire must fail");
    assert!(matches!(&error, LeaseError::Database { .. }), "{error:?}");
    let mut direct = cluster.conn();
    wait_for(
        &mut direct,
        "the proxied backend exiting",
        "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_type = 'client backend' AND client_addr IS NOT NULL) AS flag",
    );
    assert_eq!(inspect(&mut direct, "k").unwrap(), None);
}
