//! The lock-order matrix (docs/SPECIFICATION.md §1.5, I14): every pair of
//! lease and guard calls on ONE key `k` and ONE resource `r`, in both
//! orders, in two real sessions.
//!
//! Session 1 opens a transaction and makes call A; session 2 then makes
//! call B in its own transaction. The test *observes* whether B waits
//! (pg_stat_activity: wait_event_type = 'Lock', blocked by session 1's pid
//! per pg_blocking_pids) or completes, commits session 1, and B must then
//! complete. What was observed is compared with an explicit table, derived
//! below from the row-lock modes the migrations document. Every session runs
//! with `deadlock_timeout = '50ms'`, so a deadlock would surface within the
//! run as SQLSTATE 40P01 inside a `LeaseError` of kind `Other` (the
//! database's own error is its source); any database error fails the test.
//!
//! B's answer and the final state of `k` and `r` are also checked against
//! the same two calls run one after the other on fresh copies of the
//! fixture: a B that waited behaves exactly as if it ran after A committed;
//! a B that did not wait behaves as if it ran before or after A.
//!
//! The second half interleaves two-call transactions step by step. Those
//! that follow the documented rule (a transaction makes the calls that
//! write a key's lease before those that only check it or admit) never
//! deadlock; one that breaks it (admit, then renew) can, and PostgreSQL's
//! deadlock detector then aborts exactly one of the two.
//!
//! Nothing here sleeps and hopes: each step waits until its call returned
//! or its session is observed waiting for the other session's lock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::PgConnection;
use leasehold::{
    error::LeaseError, Acquisition, ErrorKind, FencingToken, LeaseState, Leases, Refusal, Release,
    Renewal,
};

use crate::common::*;
use leasehold::guard::Check;
use leasehold::guard::Fencing;

/// The epoch of the grant every fixture starts from.
const E: i64 = 1;
/// The ttl of the fixture's live grant: far beyond the run.
const HELD_TTL: Duration = Duration::from_secs(600);
/// The ttl of a fixture grant that is to lapse before the pairs run.
const LAPSING_TTL: Duration = Duration::from_millis(300);
/// The wait of an acquire that may queue on a row lock: long, so that the
/// answer never depends on how fast the test commits session 1.
const LONG_WAIT: Duration = Duration::from_secs(60);

// ---- the calls ----

/// Whose token (owner and epoch) a call presents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    /// `h`, holder of epoch E: live in the HELD fixture, lapsed in LAPSED.
    Holder,
    /// `x`, who never held `k`, presenting epoch E: always refused.
    Stranger,
    /// A new owner taking over a LAPSED key at epoch E + 1 (`n`, or `n1` /
    /// `n2` for the two sessions of the single-call matrix).
    Newcomer,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Acquire(Who),
    Renew(Who),
    Release(Who),
    Inspect,
    CheckHeld(Who),
    Admit(Who),
    AdmitHeld(Who),
    RenewAdmit(Who),
    /// `r.fence(k, leasehold::Epoch::from(E - 1))`: as the superuser (fence is an operator action).
    Fence,
    InspectGuard,
}

use Call::*;
use Who::*;

impl Call {
    fn name(self) -> &'static str {
        match self {
            Acquire(Holder) => "h.acquire()",
            Acquire(Stranger) => "x.acquire()",
            Acquire(Newcomer) => "new.acquire()",
            Renew(Holder) => "h.renew()",
            Renew(Stranger) => "x.renew()",
            Release(Holder) => "h.release()",
            Release(Stranger) => "x.release()",
            Inspect => "inspect",
            CheckHeld(Holder) => "h.check_held()",
            Admit(Holder) => "h.admit()",
            Admit(Newcomer) => "new.admit()",
            AdmitHeld(Holder) => "h.admit_held()",
            AdmitHeld(Newcomer) => "new.admit_held()",
            RenewAdmit(Holder) => "renew_admit(h)",
            RenewAdmit(Newcomer) => "renew_admit(new)",
            CheckHeld(Newcomer) => "new.check_held()",
            Renew(Newcomer) => "new.renew()",
            Release(Newcomer) => "new.release()",
            Fence => "fence",
            InspectGuard => "inspect_guard",
            other => panic!("no name for {other:?}"),
        }
    }
}

/// One copy of the fixture: key `k` and resource `r`.
#[derive(Clone, Debug)]
struct Fixture {
    key: String,
    resource: String,
}

/// The owner and epoch `who` presents. `tag` tells the sessions' newcomers
/// apart (0: both are `n`).
fn token(fixture: &Fixture, who: Who, tag: u8) -> FencingToken {
    let (owner, epoch) = match who {
        Holder => ("h".to_owned(), E),
        Stranger => ("x".to_owned(), E),
        Newcomer => (newcomer(tag), E + 1),
    };
    FencingToken::new(&fixture.key, &owner, leasehold::Epoch::from(epoch)).unwrap()
}

fn newcomer(tag: u8) -> String {
    if tag == 0 {
        "n".to_owned()
    } else {
        format!("n{tag}")
    }
}

/// The database's own error under `error`, if it is one leasehold has no
/// kind for (what was `LeaseError::Database`).
fn database_error(error: &LeaseError) -> Option<&diesel::result::Error> {
    if error.kind() != ErrorKind::Other {
        return None;
    }
    std::error::Error::source(error)?.downcast_ref()
}

fn lease_error(error: LeaseError) -> String {
    if error.kind() == ErrorKind::TimedOut && error.key().is_some() {
        return "timed out".to_owned();
    }
    match database_error(&error) {
        Some(source) => format!("DATABASE ERROR: {source}"),
        None => format!("ERROR: {error:?}"),
    }
}

fn guard_error(error: LeaseError) -> String {
    // A guard's refusal: fenced, by a guard rather than a table.
    let refusal = if error.kind() == ErrorKind::Fenced && error.table().is_none() {
        error.refusal()
    } else {
        None
    };
    match refusal {
        Some(Refusal::StaleEpoch { accepted }) => format!("stale (admits >= {accepted})"),
        Some(Refusal::EpochNotGranted { counter }) => format!("not granted (counter {counter})"),
        Some(Refusal::WrongKey) => "wrong lease key".to_owned(),
        // Lease not held: it names the owner of the refused token.
        Some(reason) if error.owner().is_some() => format!("not held ({})", reason.as_status()),
        _ => match database_error(&error) {
            Some(source) => format!("DATABASE ERROR: {source}"),
            None => format!("ERROR: {error:?}"),
        },
    }
}

/// Makes `call` on `conn` and describes its answer without times, so that
/// answers on different copies of the fixture compare equal.
fn run(conn: &mut PgConnection, call: Call, fixture: &Fixture, tag: u8) -> String {
    let (k, r) = (fixture.key.as_str(), fixture.resource.as_str());
    match call {
        Acquire(who) => {
            let t = token(fixture, who, tag);
            let answer = if who == Newcomer {
                conn.acquire_waiting(k, t.owner(), TTL, LONG_WAIT)
                    .map(Acquisition::Granted)
            } else {
                conn.acquire(k, t.owner(), TTL)
            };
            match answer {
                Ok(Acquisition::Granted(lease)) => {
                    format!("granted {} e{}", lease.owner(), lease.epoch())
                }
                Ok(Acquisition::Denied) => "denied".to_owned(),
                Err(error) => lease_error(error),
            }
        }
        Renew(who) => {
            let t = token(fixture, who, tag);
            match conn.renew(&leasehold_test_support::grant(k, t.owner(), t.epoch()), TTL) {
                Ok(Renewal::Renewed { .. }) => "renewed".to_owned(),
                Ok(Renewal::Refused(why)) => format!("refused {}", why.as_status()),
                Err(error) => lease_error(error),
            }
        }
        Release(who) => {
            let t = token(fixture, who, tag);
            match conn.release(&leasehold_test_support::grant(k, t.owner(), t.epoch())) {
                Ok(Release::Released) => "released".to_owned(),
                Ok(Release::Refused(why)) => format!("refused {}", why.as_status()),
                Err(error) => lease_error(error),
            }
        }
        Inspect => match conn.inspect(k) {
            Ok(Some(LeaseState::Held { owner, epoch, .. })) => format!("held {owner} e{epoch}"),
            Ok(Some(LeaseState::Lapsed { owner, epoch, .. })) => format!("lapsed {owner} e{epoch}"),
            Ok(Some(LeaseState::Free { epoch, .. })) => format!("free e{epoch}"),
            Ok(None) => "never leased".to_owned(),
            Err(error) => lease_error(error),
        },
        CheckHeld(who) => match conn.check_held(&token(fixture, who, tag)) {
            Ok(_) => "ok".to_owned(),
            Err(error) => guard_error(error),
        },
        Admit(who) => match conn.admit(r, &token(fixture, who, tag), Check::Token) {
            Ok(_) => "ok".to_owned(),
            Err(error) => guard_error(error),
        },
        AdmitHeld(who) => match conn.admit(r, &token(fixture, who, tag), Check::LeaseHeld) {
            Ok(_) => "ok".to_owned(),
            Err(error) => guard_error(error),
        },
        RenewAdmit(who) => {
            match conn.admit(r, &token(fixture, who, tag), Check::RenewAndAdmit(TTL)) {
                Ok(_) => "ok".to_owned(),
                Err(error) => guard_error(error),
            }
        }
        Fence => match conn.fence(r, k, leasehold::Epoch::from(E - 1)) {
            Ok(accepted) => format!("fenced (admits >= {accepted})"),
            Err(error) => guard_error(error),
        },
        InspectGuard => match conn.inspect_guard(r) {
            Ok(Some(record)) if record.lease_key == k => {
                format!("admits >= {}", record.accepted_epoch)
            }
            Ok(Some(record)) => format!("fenced by another key {}", record.lease_key),
            Ok(None) => "no record".to_owned(),
            Err(error) => guard_error(error),
        },
    }
}

fn is_database_error(answer: &str) -> bool {
    answer.starts_with("DATABASE ERROR") || answer.starts_with("ERROR")
}

/// The answer of a call after an earlier error aborted its transaction.
const SKIPPED: &str = "not made: the transaction was aborted";

/// Whether an answer is an error, which aborts the caller's transaction
/// (a refused renew or release and a denied acquire are answers, not errors).
fn aborts(answer: &str) -> bool {
    [
        "stale",
        "not held",
        "not granted",
        "wrong lease key",
        "timed out",
    ]
    .iter()
    .any(|refusal| answer.starts_with(refusal))
        || is_database_error(answer)
}

fn is_deadlock(answer: &str) -> bool {
    answer.contains("deadlock detected")
}

// ---- fixtures ----

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// `h` holds `k` at epoch E for long; `r` is fenced by `k` and admits
    /// epochs >= E.
    Held,
    /// As HELD, but `h`'s grant has lapsed (nobody took over).
    Lapsed,
}

/// Sets up `count` fresh copies of the fixture, named after `prefix`.
fn fixtures(conn: &mut PgConnection, state: State, prefix: &str, count: usize) -> Vec<Fixture> {
    let ttl = match state {
        State::Held => HELD_TTL,
        State::Lapsed => LAPSING_TTL,
    };
    let mut latest = None;
    let made = (0..count)
        .map(|i| {
            let fixture = Fixture {
                key: format!("{prefix}-{i}/k"),
                resource: format!("{prefix}-{i}/r"),
            };
            let lease = granted(conn.acquire(&fixture.key, "h", ttl).unwrap());
            assert_eq!(lease.epoch(), E);
            conn.admit(&fixture.resource, &lease, Check::Token).unwrap();
            latest = Some(lease.expires_at());
            fixture
        })
        .collect();
    if let (State::Lapsed, Some(expiry)) = (state, latest) {
        wait_until_server_time_passes(conn, expiry);
    }
    made
}

/// The committed state of a fixture copy, without times and names.
fn final_state(conn: &mut PgConnection, fixture: &Fixture) -> String {
    query_lines(
        conn,
        &format!(
            "SELECT format('lease %s e%s held=%s lapsed_owner=%s | guard %s', \
                 l.owner, l.epoch, l.expires_at > clock_timestamp(), l.lapsed_owner, \
                 (SELECT format('admits >= %s, own key %s', g.accepted_epoch, g.lease_key = l.key) \
                    FROM lease.guards AS g WHERE g.resource = {r})) AS line \
             FROM lease.leases AS l WHERE l.key = {k}",
            k = quote(&fixture.key),
            r = quote(&fixture.resource)
        ),
    )
    .remove(0)
}

// ---- sessions driven step by step ----

enum Step {
    Sql(&'static str),
    Call(Call, Fixture),
}

/// What issuing a step led to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Progress {
    /// The session finished everything issued to it.
    Ran,
    /// The session waits for a lock that the session with this pid holds.
    Blocked(i32),
}

/// A session on its own thread, fed steps in order. Each step's answer is
/// logged; SQL steps log their statement (or the error).
struct Session {
    pid: i32,
    steps: Option<Sender<Step>>,
    done: Arc<AtomicUsize>,
    sent: usize,
    log: Arc<Mutex<Vec<String>>>,
    thread: Option<JoinHandle<()>>,
}

impl Session {
    fn start(db: &TestDb, tag: u8) -> Session {
        let mut conn = db.conn();
        conn.batch_execute("SET deadlock_timeout = '50ms'").unwrap();
        let pid = query_lines(&mut conn, "SELECT pg_backend_pid()::text AS line")[0]
            .parse()
            .unwrap();
        let (sender, receiver) = channel::<Step>();
        let done = Arc::new(AtomicUsize::new(0));
        let log = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (done, log) = (done.clone(), log.clone());
            std::thread::spawn(move || {
                // After an error the transaction is aborted: the rest of its
                // calls are not made (PostgreSQL would refuse them).
                let mut aborted = false;
                for step in receiver {
                    let answer = match step {
                        Step::Sql(sql) => {
                            aborted = false;
                            match conn.batch_execute(sql) {
                                Ok(()) => sql.to_owned(),
                                Err(error) => format!("DATABASE ERROR: {error}"),
                            }
                        }
                        Step::Call(..) if aborted => SKIPPED.to_owned(),
                        Step::Call(call, fixture) => {
                            let answer = run(&mut conn, call, &fixture, tag);
                            aborted = aborts(&answer);
                            answer
                        }
                    };
                    log.lock().unwrap().push(answer);
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        Session {
            pid,
            steps: Some(sender),
            done,
            sent: 0,
            log,
            thread: Some(thread),
        }
    }

    /// Issues `step` and waits until the session finished everything issued
    /// to it, or is observed waiting for another session's lock.
    fn issue(&mut self, step: Step, observer: &mut PgConnection) -> Progress {
        self.sent += 1;
        self.steps.as_ref().unwrap().send(step).unwrap();
        self.progress(observer)
    }

    fn progress(&mut self, observer: &mut PgConnection) -> Progress {
        let sql = format!(
            "SELECT COALESCE((SELECT (pg_blocking_pids(a.pid))[1]::text FROM pg_stat_activity AS a \
              WHERE a.pid = {} AND a.wait_event_type = 'Lock'), '') AS line",
            self.pid
        );
        let started = Instant::now();
        loop {
            if self.done.load(Ordering::SeqCst) >= self.sent {
                return Progress::Ran;
            }
            let blocker = query_lines(observer, &sql).remove(0);
            if !blocker.is_empty() {
                return Progress::Blocked(blocker.parse().unwrap());
            }
            // A guard against a hang, not a timing assertion.
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "session {} neither finished nor waited on a lock",
                self.pid
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits until the session finished everything issued to it.
    fn finish(&mut self, observer: &mut PgConnection) {
        let started = Instant::now();
        while self.done.load(Ordering::SeqCst) < self.sent {
            if let Progress::Blocked(blocker) = self.progress(observer) {
                assert!(
                    started.elapsed() < Duration::from_secs(120),
                    "session {} still waits for {blocker}",
                    self.pid
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Waits until the session polls inside a waiting acquire.
    fn wait_until_polling(&self, observer: &mut PgConnection) {
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {} AND wait_event = 'PgSleep') AS flag",
            self.pid
        );
        let started = Instant::now();
        while !query_bool(observer, &sql) {
            assert!(started.elapsed() < Duration::from_secs(120), "never polled");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn take_log(&self) -> Vec<String> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.steps.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

// ---- the single-call matrix ----

/// A row lock on `lease.leases` (docs/SPECIFICATION.md §1.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    None,
    KeyShare,
    NoKeyUpdate,
    Update,
}

/// The lease-row lock `call` keeps until its transaction ends, on a key in
/// `state`, and whether it also locks the guard row: the documentation the
/// expected tables below are derived from.
/// * a grant to a new owner: FOR UPDATE;
/// * renew, release and renew_admit when they renew/release: FOR NO KEY UPDATE;
/// * same-owner acquire, check_held, admit_held, admit, fence: FOR KEY SHARE;
/// * every refusal, inspect, inspect_guard: nothing;
/// * admit, admit_held, renew_admit and fence, when they get that far, lock
///   the guard row (FOR NO KEY UPDATE, by their upsert), after the lease row.
fn locks(call: Call, state: State) -> (Mode, bool) {
    match (state, call) {
        (State::Held, Acquire(Holder)) => (Mode::KeyShare, false),
        (State::Held, Renew(Holder) | Release(Holder)) => (Mode::NoKeyUpdate, false),
        (State::Held, CheckHeld(Holder)) => (Mode::KeyShare, false),
        (State::Held, AdmitHeld(Holder)) => (Mode::KeyShare, true),
        (State::Held, RenewAdmit(Holder)) => (Mode::NoKeyUpdate, true),
        (State::Lapsed, Acquire(Newcomer)) => (Mode::Update, false),
        (_, Admit(Holder) | Fence) => (Mode::KeyShare, true),
        // Refused (a stranger; the lapsed holder), or locking nothing.
        _ => (Mode::None, false),
    }
}

fn conflicts(a: Mode, b: Mode) -> bool {
    use Mode::*;
    matches!(
        (a, b),
        (Update, KeyShare | NoKeyUpdate | Update)
            | (KeyShare | NoKeyUpdate, Update)
            | (NoKeyUpdate, NoKeyUpdate)
    )
}

fn derived_wait(a: Call, b: Call, state: State) -> bool {
    let ((lease_a, guard_a), (lease_b, guard_b)) = (locks(a, state), locks(b, state));
    conflicts(lease_a, lease_b) || (guard_a && guard_b)
}

const HELD_CALLS: [Call; 13] = [
    Acquire(Holder),
    Acquire(Stranger),
    Renew(Holder),
    Release(Holder),
    Renew(Stranger),
    Release(Stranger),
    Inspect,
    CheckHeld(Holder),
    Admit(Holder),
    AdmitHeld(Holder),
    RenewAdmit(Holder),
    Fence,
    InspectGuard,
];

/// HELD: which B (column) waits for an open A (row). `W` waits until A's
/// transaction ends, `.` completes at once. Lease row: renew, release and
/// renew_admit of the holder conflict with each other (FOR NO KEY UPDATE);
/// FOR KEY SHARE conflicts with none of them. Guard row: admit, admit_held,
/// renew_admit and fence conflict with each other. Columns in row order.
const HELD_TABLE: [&str; 13] = [
    //               aH aX rH lH rX lX in ch ad aH rA fe iG
    "h.acquire()      .  .  .  .  .  .  .  .  .  .  .  .  .",
    "x.acquire()      .  .  .  .  .  .  .  .  .  .  .  .  .",
    "h.renew()        .  .  W  W  .  .  .  .  .  .  W  .  .",
    "h.release()      .  .  W  W  .  .  .  .  .  .  W  .  .",
    "x.renew()        .  .  .  .  .  .  .  .  .  .  .  .  .",
    "x.release()      .  .  .  .  .  .  .  .  .  .  .  .  .",
    "inspect         .  .  .  .  .  .  .  .  .  .  .  .  .",
    "h.check_held()   .  .  .  .  .  .  .  .  .  .  .  .  .",
    "h.admit()        .  .  .  .  .  .  .  .  W  W  W  W  .",
    "h.admit_held()   .  .  .  .  .  .  .  .  W  W  W  W  .",
    "renew_admit(h)  .  .  W  W  .  .  .  .  W  W  W  W  .",
    "fence           .  .  .  .  .  .  .  .  W  W  W  W  .",
    "inspect_guard   .  .  .  .  .  .  .  .  .  .  .  .  .",
];

const LAPSED_CALLS: [Call; 10] = [
    Acquire(Newcomer),
    Renew(Holder),
    Release(Holder),
    Inspect,
    CheckHeld(Holder),
    Admit(Holder),
    AdmitHeld(Holder),
    RenewAdmit(Holder),
    Fence,
    InspectGuard,
];

/// LAPSED: as HELD_TABLE. The lapsed holder's renew, release and
/// lease-checked calls are refused and lock nothing; a takeover (FOR UPDATE)
/// waits for, and holds up, every lock on the lease row (admit and fence:
/// FOR KEY SHARE), and admit and fence conflict on the guard row.
const LAPSED_TABLE: [&str; 10] = [
    //               aN rH lH in ch ad aH rA fe iG
    "new.acquire()    W  .  .  .  .  W  .  .  W  .",
    "h.renew()        .  .  .  .  .  .  .  .  .  .",
    "h.release()      .  .  .  .  .  .  .  .  .  .",
    "inspect         .  .  .  .  .  .  .  .  .  .",
    "h.check_held()   .  .  .  .  .  .  .  .  .  .",
    "h.admit()        W  .  .  .  .  W  .  .  W  .",
    "h.admit_held()   .  .  .  .  .  .  .  .  .  .",
    "renew_admit(h)  .  .  .  .  .  .  .  .  .  .",
    "fence           W  .  .  .  .  W  .  .  W  .",
    "inspect_guard   .  .  .  .  .  .  .  .  .  .",
];

fn table_waits(table: &[&str], calls: &[Call]) -> Vec<Vec<bool>> {
    assert_eq!(table.len(), calls.len());
    table
        .iter()
        .zip(calls)
        .map(|(line, call)| {
            let (name, cells) = line.split_at(16);
            assert_eq!(name.trim(), call.name(), "table row order");
            let cells: Vec<bool> = cells
                .split_whitespace()
                .map(|cell| match cell {
                    "W" => true,
                    "." => false,
                    other => panic!("bad cell {other:?}"),
                })
                .collect();
            assert_eq!(cells.len(), calls.len(), "row {name}");
            cells
        })
        .collect()
}

/// One run of the pair (A, B) on `fixture`, with its serial references on
/// `ab` (A committed, then B) and `ba` (B, then A). Returns whether B waited.
#[allow(clippy::too_many_arguments)]
fn run_pair(
    state: State,
    a: Call,
    b: Call,
    fixture: &Fixture,
    ab: &Fixture,
    ba: &Fixture,
    one: &mut Session,
    two: &mut Session,
    observer: &mut PgConnection,
    setup: &mut PgConnection,
) -> bool {
    let pair = format!("{state:?}: A = {} then B = {}", a.name(), b.name());
    assert_eq!(
        one.issue(Step::Sql("BEGIN"), observer),
        Progress::Ran,
        "{pair}"
    );
    assert_eq!(
        one.issue(Step::Call(a, fixture.clone()), observer),
        Progress::Ran,
        "{pair}: A alone must not wait"
    );
    assert_eq!(
        two.issue(Step::Sql("BEGIN"), observer),
        Progress::Ran,
        "{pair}"
    );
    let waited = match two.issue(Step::Call(b, fixture.clone()), observer) {
        Progress::Ran => false,
        Progress::Blocked(blocker) => {
            assert_eq!(blocker, one.pid, "{pair}: B waits for somebody else");
            true
        }
    };
    two.issue(Step::Sql("COMMIT"), observer);
    one.issue(Step::Sql("COMMIT"), observer);
    let takeover_race = (a, b) == (Acquire(Newcomer), Acquire(Newcomer));
    if takeover_race {
        // B queued behind A's takeover, found `n1` holding the key and
        // polls for the rest of its wait: `n1` releases and B gets the key.
        two.wait_until_polling(observer);
        one.issue(Step::Call(Release(Newcomer), fixture.clone()), observer);
    }
    two.finish(observer);
    let a_answer = one.take_log();
    let b_answer = two.take_log();
    for answer in a_answer.iter().chain(&b_answer) {
        assert!(!is_deadlock(answer), "{pair}: DEADLOCK: {answer}");
        assert!(!is_database_error(answer), "{pair}: {answer}");
    }
    let (a_answer, b_answer) = (a_answer[1].clone(), b_answer[1].clone());
    let concurrent = (b_answer.clone(), final_state(observer, fixture));
    if takeover_race {
        assert!(waited, "{pair}");
        assert_eq!(b_answer, format!("granted n2 e{}", E + 3), "{pair}");
        return waited;
    }

    // The serial references: each call in its own committed transaction.
    let mut serial = |first: Call, first_tag: u8, second: Call, second_tag: u8, f: &Fixture| {
        setup.batch_execute("BEGIN").unwrap();
        let first_answer = run(setup, first, f, first_tag);
        setup.batch_execute("COMMIT").unwrap();
        setup.batch_execute("BEGIN").unwrap();
        let second_answer = run(setup, second, f, second_tag);
        setup.batch_execute("COMMIT").unwrap();
        (first_answer, second_answer, final_state(setup, f))
    };
    let (a_first, b_after, state_ab) = serial(a, 1, b, 2, ab);
    let (b_first, _, state_ba) = serial(b, 2, a, 1, ba);
    assert_eq!(a_answer, a_first, "{pair}: A's answer");
    let after_a = (b_after, state_ab);
    let before_a = (b_first, state_ba);
    if waited {
        assert_eq!(concurrent, after_a, "{pair}: B waited, so it ran after A");
    } else {
        assert!(
            concurrent == after_a || concurrent == before_a,
            "{pair}: B's answer and the final state {concurrent:?} are those of neither \
             serial order: A then B {after_a:?}, B then A {before_a:?}"
        );
    }
    waited
}

fn single_call_matrix(state: State, calls: &[Call], table: &[&str]) {
    let expected = table_waits(table, calls);
    // The table is the documentation; it must agree with the lock modes.
    for (i, a) in calls.iter().enumerate() {
        for (j, b) in calls.iter().enumerate() {
            assert_eq!(
                expected[i][j],
                derived_wait(*a, *b, state),
                "{state:?} table cell A = {}, B = {} disagrees with the lock modes",
                a.name(),
                b.name()
            );
        }
    }
    let db = TestDb::new();
    let mut setup = db.conn();
    let mut observer = db.conn();
    let mut one = Session::start(&db, 1);
    let mut two = Session::start(&db, 2);
    let pairs = calls.len() * calls.len();
    let prefix = format!("{state:?}").to_lowercase();
    let mut copies = fixtures(&mut setup, state, &prefix, 3 * pairs).into_iter();
    let mut observed = vec![vec![false; calls.len()]; calls.len()];
    for (i, a) in calls.iter().enumerate() {
        for (j, b) in calls.iter().enumerate() {
            let (fixture, ab, ba) = (
                copies.next().unwrap(),
                copies.next().unwrap(),
                copies.next().unwrap(),
            );
            observed[i][j] = run_pair(
                state,
                *a,
                *b,
                &fixture,
                &ab,
                &ba,
                &mut one,
                &mut two,
                &mut observer,
                &mut setup,
            );
        }
    }
    let mut mismatches = Vec::new();
    for (i, a) in calls.iter().enumerate() {
        for (j, b) in calls.iter().enumerate() {
            if expected[i][j] != observed[i][j] {
                let says = |waits: bool| if waits { "a wait" } else { "no wait" };
                mismatches.push(format!(
                    "A = {}, B = {}: expected {}, observed {}",
                    a.name(),
                    b.name(),
                    says(expected[i][j]),
                    says(observed[i][j])
                ));
            }
        }
    }
    assert!(mismatches.is_empty(), "{state:?}: {mismatches:#?}");
}

/// Every ordered pair of calls on a held key, A open in session 1, B in
/// session 2: B waits exactly where HELD_TABLE says, then completes as if
/// it ran after A, never with a deadlock.
#[test]
fn every_pair_of_calls_on_a_held_key_waits_exactly_as_the_lock_table_says() {
    single_call_matrix(State::Held, &HELD_CALLS, &HELD_TABLE);
}

/// Every ordered pair of calls on a lapsed key, a takeover among them.
#[test]
fn every_pair_of_calls_on_a_lapsed_key_waits_exactly_as_the_lock_table_says() {
    single_call_matrix(State::Lapsed, &LAPSED_CALLS, &LAPSED_TABLE);
}

/// I14 read off the table: nothing a non-holder can run — a same-owner
/// acquire, check_held, admit or admit_held with the owner and epoch that
/// `inspect` shows everybody, a refused acquire, renew or release, inspect,
/// inspect_guard — makes the holder's renew (or release) wait, however long
/// its transaction stays open. The matrix test above checks the table
/// against the database; this pins the table's rows for these calls.
#[test]
fn nothing_a_non_holder_can_run_holds_up_the_holders_renew_in_the_lock_table() {
    let waits = table_waits(&HELD_TABLE, &HELD_CALLS);
    let column = |call: Call| HELD_CALLS.iter().position(|c| *c == call).unwrap();
    let non_holder = [
        Acquire(Holder),
        Acquire(Stranger),
        Renew(Stranger),
        Release(Stranger),
        Inspect,
        CheckHeld(Holder),
        Admit(Holder),
        AdmitHeld(Holder),
        InspectGuard,
    ];
    for a in non_holder {
        for b in [Renew(Holder), Release(Holder)] {
            assert!(
                !waits[column(a)][column(b)],
                "the holder's {} waits for an open {}",
                b.name(),
                a.name()
            );
        }
    }
}

// ---- two-call transactions ----

/// The order in which the two transactions' steps are issued.
#[derive(Clone, Copy, Debug)]
enum Interleaving {
    /// T1 first call, T2 first call, T1 second, T2 second, T1 commits, T2 commits.
    Alternating,
    /// T1 first call, then all of T2 and its commit, then the rest of T1.
    Nested,
}

/// Runs T1 and T2 on `fixture` step by step. Returns each session's log
/// (BEGIN, the calls' answers, COMMIT).
fn interleave(
    t1: &[Call],
    t2: &[Call],
    order: Interleaving,
    fixture: &Fixture,
    one: &mut Session,
    two: &mut Session,
    observer: &mut PgConnection,
) -> (Vec<String>, Vec<String>) {
    let step = |call: &Call| Step::Call(*call, fixture.clone());
    one.issue(Step::Sql("BEGIN"), observer);
    two.issue(Step::Sql("BEGIN"), observer);
    one.issue(step(&t1[0]), observer);
    two.issue(step(&t2[0]), observer);
    match order {
        Interleaving::Alternating => {
            for i in 1..t1.len().max(t2.len()) {
                if let Some(call) = t1.get(i) {
                    one.issue(step(call), observer);
                }
                if let Some(call) = t2.get(i) {
                    two.issue(step(call), observer);
                }
            }
            one.issue(Step::Sql("COMMIT"), observer);
            two.issue(Step::Sql("COMMIT"), observer);
        }
        Interleaving::Nested => {
            for call in &t2[1..] {
                two.issue(step(call), observer);
            }
            two.issue(Step::Sql("COMMIT"), observer);
            for call in &t1[1..] {
                one.issue(step(call), observer);
            }
            one.issue(Step::Sql("COMMIT"), observer);
        }
    }
    one.finish(observer);
    two.finish(observer);
    (one.take_log(), two.take_log())
}

/// Runs `first` then `second` serially, each in one transaction, on `f`.
fn serially(conn: &mut PgConnection, first: &[Call], second: &[Call], f: &Fixture) -> String {
    for transaction in [first, second] {
        conn.batch_execute("BEGIN").unwrap();
        for call in transaction {
            if aborts(&run(conn, *call, f, 0)) {
                break;
            }
        }
        conn.batch_execute("COMMIT").unwrap();
    }
    final_state(conn, f)
}

/// Whether `transaction` follows the rule of docs/SPECIFICATION.md §1.5:
/// the calls that write the key's lease come before those that only check
/// it or admit.
fn follows_the_rule(transaction: &[Call]) -> bool {
    let writes = |call: &Call| matches!(call, Acquire(_) | Renew(_) | Release(_) | RenewAdmit(_));
    let first_check = transaction.iter().position(|c| !writes(c));
    first_check.is_none_or(|i| transaction[i..].iter().all(|c| !writes(c)))
}

fn two_call_matrix(state: State, transactions: &[&[Call]]) {
    for transaction in transactions {
        assert!(follows_the_rule(transaction), "{transaction:?}");
    }
    let db = TestDb::new();
    let mut setup = db.conn();
    let mut observer = db.conn();
    let mut one = Session::start(&db, 0);
    let mut two = Session::start(&db, 0);
    let orders = [Interleaving::Alternating, Interleaving::Nested];
    let runs = transactions.len() * transactions.len() * orders.len();
    let prefix = format!("{state:?}-two").to_lowercase();
    let mut copies = fixtures(&mut setup, state, &prefix, 3 * runs).into_iter();
    for t1 in transactions {
        for t2 in transactions {
            for order in orders {
                let (fixture, ab, ba) = (
                    copies.next().unwrap(),
                    copies.next().unwrap(),
                    copies.next().unwrap(),
                );
                let names = |t: &[Call]| t.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ");
                let case = format!(
                    "{state:?}, {order:?}: T1 [{}] vs T2 [{}]",
                    names(t1),
                    names(t2)
                );
                let (log1, log2) =
                    interleave(t1, t2, order, &fixture, &mut one, &mut two, &mut observer);
                for answer in log1.iter().chain(&log2) {
                    assert!(
                        !is_deadlock(answer),
                        "{case}: DEADLOCK: {log1:?} / {log2:?}"
                    );
                    assert!(!is_database_error(answer), "{case}: {log1:?} / {log2:?}");
                }
                let concurrent = final_state(&mut observer, &fixture);
                let t1_then_t2 = serially(&mut setup, t1, t2, &ab);
                let t2_then_t1 = serially(&mut setup, t2, t1, &ba);
                assert!(
                    concurrent == t1_then_t2 || concurrent == t2_then_t1,
                    "{case}: final state {concurrent} is that of neither serial order: \
                     T1 then T2 {t1_then_t2}, T2 then T1 {t2_then_t1} ({log1:?} / {log2:?})"
                );
            }
        }
    }
}

/// Two transactions on a held key, each following the rule, interleaved in
/// every order and both interleavings: no deadlock, and the final state is
/// that of one serial order.
#[test]
fn two_call_transactions_that_write_before_they_check_never_deadlock_on_a_held_key() {
    two_call_matrix(
        State::Held,
        &[
            &[Renew(Holder), AdmitHeld(Holder)],
            &[Renew(Holder), Admit(Holder)],
            &[RenewAdmit(Holder), CheckHeld(Holder)],
            &[RenewAdmit(Holder), Fence],
            &[Acquire(Holder), AdmitHeld(Holder)],
            &[Acquire(Holder), Renew(Holder)],
            &[Renew(Holder), RenewAdmit(Holder)],
            &[Renew(Holder), Release(Holder)],
            &[Release(Holder), Fence],
            &[Fence, AdmitHeld(Holder)],
            &[CheckHeld(Holder), Admit(Holder)],
            &[RenewAdmit(Holder)],
        ],
    );
}

/// The same on a lapsed key that a newcomer takes over (FOR UPDATE) while
/// others admit, fence or check it.
#[test]
fn two_call_transactions_that_write_before_they_check_never_deadlock_around_a_takeover() {
    two_call_matrix(
        State::Lapsed,
        &[
            &[Acquire(Newcomer), AdmitHeld(Newcomer)],
            &[Acquire(Newcomer), Admit(Newcomer)],
            &[Acquire(Newcomer), RenewAdmit(Newcomer)],
            &[Acquire(Newcomer), Fence],
            &[Fence, Admit(Holder)],
            &[Admit(Holder), Fence],
            &[Fence, AdmitHeld(Holder)],
            &[RenewAdmit(Newcomer)],
        ],
    );
}

/// The reported case, precisely: T1 fences then makes a lease-checked
/// write (fence, admit_held) while T2 renews and admits, in both
/// interleavings. Whoever locks the guard row second waits for the other's
/// commit; neither ever waits for the other's lease-row lock; both commit.
#[test]
fn fence_then_admit_held_against_renew_and_admit_never_deadlocks_in_either_order() {
    let db = TestDb::new();
    let mut setup = db.conn();
    let mut observer = db.conn();
    let mut one = Session::start(&db, 0);
    let mut two = Session::start(&db, 0);
    let mut copies = fixtures(&mut setup, State::Held, "reported", 2).into_iter();
    let t1 = [Fence, AdmitHeld(Holder)];
    let t2 = [RenewAdmit(Holder)];

    // T1 first: T2's renew_admit renews at once, then waits on the guard row.
    let f = copies.next().unwrap();
    let step = |call: Call| Step::Call(call, f.clone());
    one.issue(Step::Sql("BEGIN"), &mut observer);
    assert_eq!(one.issue(step(t1[0]), &mut observer), Progress::Ran);
    two.issue(Step::Sql("BEGIN"), &mut observer);
    assert_eq!(
        two.issue(step(t2[0]), &mut observer),
        Progress::Blocked(one.pid)
    );
    assert_eq!(
        one.issue(step(t1[1]), &mut observer),
        Progress::Ran,
        "admit_held must not wait for the renewal that waits for it"
    );
    one.issue(Step::Sql("COMMIT"), &mut observer);
    two.issue(Step::Sql("COMMIT"), &mut observer);
    two.finish(&mut observer);
    assert_eq!(
        one.take_log(),
        ["BEGIN", "fenced (admits >= 1)", "ok", "COMMIT"]
    );
    assert_eq!(two.take_log(), ["BEGIN", "ok", "COMMIT"]);
    assert_eq!(
        final_state(&mut observer, &f),
        "lease h e1 held=t lapsed_owner= | guard admits >= 1, own key t"
    );

    // T2 first: T1's fence waits on the guard row, then both complete.
    let f = copies.next().unwrap();
    let step = |call: Call| Step::Call(call, f.clone());
    two.issue(Step::Sql("BEGIN"), &mut observer);
    assert_eq!(two.issue(step(t2[0]), &mut observer), Progress::Ran);
    one.issue(Step::Sql("BEGIN"), &mut observer);
    assert_eq!(
        one.issue(step(t1[0]), &mut observer),
        Progress::Blocked(two.pid)
    );
    one.issue(step(t1[1]), &mut observer);
    one.issue(Step::Sql("COMMIT"), &mut observer);
    assert_eq!(two.issue(Step::Sql("COMMIT"), &mut observer), Progress::Ran);
    one.finish(&mut observer);
    assert_eq!(two.take_log(), ["BEGIN", "ok", "COMMIT"]);
    assert_eq!(
        one.take_log(),
        ["BEGIN", "fenced (admits >= 1)", "ok", "COMMIT"]
    );
    assert_eq!(
        final_state(&mut observer, &f),
        "lease h e1 held=t lapsed_owner= | guard admits >= 1, own key t"
    );
}

/// The documented limit: a transaction that breaks the rule — it admits
/// (guard row), then renews (lease row) — against a concurrent
/// renew_and_admit (lease row, then guard row) waits in a cycle.
/// PostgreSQL's deadlock detector aborts exactly one of them with 40P01
/// and the other commits, so the rule in §1.5 is needed.
#[test]
fn admit_then_renew_breaks_the_rule_and_can_deadlock_with_renew_and_admit() {
    let db = TestDb::new();
    let mut setup = db.conn();
    let mut observer = db.conn();
    let mut one = Session::start(&db, 0);
    let mut two = Session::start(&db, 0);
    let f = fixtures(&mut setup, State::Held, "breaks", 1).remove(0);
    let t1 = [Admit(Holder), Renew(Holder)];
    assert!(!follows_the_rule(&t1));
    let step = |call: Call| Step::Call(call, f.clone());
    one.issue(Step::Sql("BEGIN"), &mut observer);
    assert_eq!(one.issue(step(t1[0]), &mut observer), Progress::Ran);
    two.issue(Step::Sql("BEGIN"), &mut observer);
    // renew_and_admit renews (lease row), then waits for T1's guard row.
    assert_eq!(
        two.issue(step(RenewAdmit(Holder)), &mut observer),
        Progress::Blocked(one.pid)
    );
    // T1's renew needs the lease row T2 holds: a cycle.
    one.issue(step(t1[1]), &mut observer);
    one.issue(Step::Sql("COMMIT"), &mut observer);
    two.issue(Step::Sql("COMMIT"), &mut observer);
    one.finish(&mut observer);
    two.finish(&mut observer);
    let (log1, log2) = (one.take_log(), two.take_log());
    let aborted1 = log1.iter().any(|a| is_deadlock(a));
    let aborted2 = log2.iter().any(|a| is_deadlock(a));
    assert!(
        aborted1 != aborted2,
        "exactly one transaction must be aborted with 40P01: {log1:?} / {log2:?}"
    );
    for (log, aborted) in [(&log1, aborted1), (&log2, aborted2)] {
        if !aborted {
            assert!(
                log.iter().all(|a| !is_database_error(a)),
                "the survivor commits: {log:?}"
            );
        }
    }
    // The survivor's effects are committed; the victim's are gone.
    let expected = if aborted1 {
        (log2[1].as_str(), "ok")
    } else {
        (log1[2].as_str(), "renewed")
    };
    assert_eq!(expected.0, expected.1, "{log1:?} / {log2:?}");
    assert_eq!(
        final_state(&mut observer, &f),
        "lease h e1 held=t lapsed_owner= | guard admits >= 1, own key t"
    );
    // The victim's answer names the deadlock (SQLSTATE 40P01).
    let victim = if aborted1 { &log1 } else { &log2 };
    assert!(
        victim.iter().any(|a| a.contains("deadlock detected")),
        "{victim:?}"
    );
}
