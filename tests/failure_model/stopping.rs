//! A holder stops in time whatever the database does: once its safe
//! deadline has passed, `Keeper::stop` and `run_while_held` return within
//! the keeper's margin (plus scheduling), not after the pool's 30 s
//! checkout timeout or a statement that never answers, with the database
//! down or silent (every server process SIGSTOPped). A release still
//! running then finishes on its own thread; the lease lapses at its ttl.

use std::sync::mpsc;
use std::time::Instant;

use leasehold::hold::{run_while_held, CancelToken, LeaseLoss, WorkOutcome};
use leasehold::{ErrorKind, Keeper, LeaseClient};

use crate::common::*;

/// The lease's ttl and the keeper's margin: the bound under test is the margin.
const HELD_FOR: Duration = Duration::from_secs(2);
const MARGIN: Duration = Duration::from_millis(200);
/// Scheduling on a loaded two-core machine, on top of the bound.
const SLACK: Duration = Duration::from_secs(2);
/// How long the test waits for anything before calling it a hang.
const HANG: Duration = Duration::from_secs(25);

/// Runs `call` on a thread; its answer, or a panic after `HANG`.
fn bounded<T: Send + 'static>(what: &str, call: impl FnOnce() -> T + Send + 'static) -> T {
    let (answer, answered) = mpsc::channel();
    std::thread::spawn(move || drop(answer.send(call())));
    answered
        .recv_timeout(HANG)
        .unwrap_or_else(|_| panic!("{what}: still waiting after {HANG:?}"))
}

/// A keeper of `k` on a pool of two, the pool's checkout timeout left at
/// its default (30 s).
fn keeper(cluster: &Cluster) -> Keeper {
    let client = LeaseClient::connect(&cluster.url(), 2).expect("a client");
    let lease = granted(client.clone().acquire("k", "a", HELD_FOR).unwrap());
    Keeper::builder(&client, lease)
        .renew_every(Duration::from_millis(300))
        .margin(MARGIN)
        .start()
        .expect("a keeper")
}

/// Every process of `cluster`'s server, SIGCONTed again when dropped.
struct Silenced(Vec<libc::pid_t>);

impl Silenced {
    #[allow(unsafe_code)] // kill(2) on the server this test started.
    fn every_process(cluster: &Cluster) -> Silenced {
        let mut conn = cluster.conn();
        #[derive(QueryableByName)]
        struct Pid {
            #[diesel(sql_type = diesel::sql_types::Integer)]
            pid: i32,
        }
        let mut pids: Vec<libc::pid_t> =
            diesel::sql_query("SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()")
                .load::<Pid>(&mut conn)
                .unwrap()
                .into_iter()
                .map(|row| row.pid)
                .collect();
        drop(conn);
        let postmaster = cluster.pg.postmaster_pid().expect("the postmaster's pid");
        pids.push(libc::pid_t::try_from(postmaster).unwrap());
        for &pid in &pids {
            // SAFETY: kill(2) with a pid of this test's own server.
            assert_eq!(
                unsafe { libc::kill(pid, libc::SIGSTOP) },
                0,
                "SIGSTOP {pid}"
            );
        }
        Silenced(pids)
    }
}

impl Drop for Silenced {
    #[allow(unsafe_code)] // kill(2), as above.
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
    }
}

/// The keeper's loss is its deadline, and `stop` returns within the margin
/// of it, answering `TimedOut` (the release never answered in time).
fn stops_in_time(keeper: Keeper) {
    let loss = keeper.wait_for_loss(HANG);
    assert!(
        matches!(loss, Some(LeaseLoss::DeadlinePassed { .. })),
        "{loss:?}"
    );
    let (stopped, took) = bounded("stop", move || {
        let started = Instant::now();
        (keeper.stop(), started.elapsed())
    });
    assert!(took < MARGIN + SLACK, "stop took {took:?}");
    let error = stopped.expect_err("a release no server answered");
    assert_eq!(error.kind(), ErrorKind::TimedOut, "{error}");
}

#[test]
fn a_keeper_stops_within_its_margin_with_the_database_down() {
    let cluster = Cluster::start(false);
    let keeper = keeper(&cluster);
    cluster.pg.stop(StopMode::Fast).unwrap();
    stops_in_time(keeper);
}

#[test]
fn a_keeper_stops_within_its_margin_with_the_database_silent() {
    let cluster = Cluster::start(false);
    let keeper = keeper(&cluster);
    let silenced = Silenced::every_process(&cluster);
    stops_in_time(keeper);
    drop(silenced);
}

/// `run_while_held`: the work sees the loss at the deadline and returns,
/// and the whole call returns within the margin of that moment.
#[test]
fn run_while_held_returns_within_the_margin_of_the_loss_with_the_database_silent() {
    let cluster = Cluster::start(false);
    let keeper = keeper(&cluster);
    let silenced = Silenced::every_process(&cluster);
    let (outcome, stopped_at, returned_at) = bounded("run_while_held", move || {
        let mut stopped_at = None;
        let outcome = run_while_held(keeper, &CancelToken::new(), |ctx| {
            // The work polls its context, as work that cannot be fenced must.
            while !ctx.should_stop() {
                std::thread::sleep(Duration::from_millis(5));
            }
            stopped_at = Some(Instant::now());
            Err::<(), _>("told to stop")
        });
        (outcome, stopped_at, Instant::now())
    });
    assert!(
        matches!(
            outcome,
            WorkOutcome::LeaseLost(LeaseLoss::DeadlinePassed { .. })
        ),
        "{outcome:?}"
    );
    let took = returned_at - stopped_at.expect("the work was told to stop");
    assert!(
        took < MARGIN + SLACK,
        "run_while_held took {took:?} after the loss"
    );
    drop(silenced);
}

/// The async keeper keeps the same bound: its stop returns within the
/// margin of the deadline with the database down.
#[cfg(feature = "async")]
#[test]
fn an_async_keeper_stops_within_its_margin_with_the_database_down() {
    use leasehold::aio::{AsyncLeaseClient, AsyncLeases};
    let cluster = Cluster::start(false);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut client = AsyncLeaseClient::connect(&cluster.url(), 2).await.unwrap();
        let lease = client
            .acquire("k", "a", HELD_FOR)
            .await
            .unwrap()
            .granted()
            .unwrap();
        let keeper = leasehold::aio::Keeper::builder(&client, lease)
            .renew_every(Duration::from_millis(300))
            .margin(MARGIN)
            .start()
            .await
            .unwrap();
        cluster.pg.stop(StopMode::Fast).unwrap();
        let loss = keeper.wait_for_loss(HANG).await;
        assert!(
            matches!(loss, Some(LeaseLoss::DeadlinePassed { .. })),
            "{loss:?}"
        );
        let started = Instant::now();
        let stopped = tokio::time::timeout(HANG, keeper.stop())
            .await
            .expect("stop still waiting");
        let took = started.elapsed();
        assert!(took < MARGIN + SLACK, "stop took {took:?}");
        // deadpool fails a checkout from a stopped server at once, where
        // r2d2 keeps trying: either way the release did not happen.
        let error = stopped.expect_err("a release no server answered");
        assert!(
            matches!(error.kind(), ErrorKind::TimedOut | ErrorKind::Unavailable),
            "{error}"
        );
    });
}
