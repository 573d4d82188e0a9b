//! Clients across a failover (docs/guide/failover.md, "Clients across a failover"):
//! multi-host URLs, read-only servers, commits that wait for a synchronous
//! standby, and a keeper through the gap.
//!
//! No replication here: two independent servers, one started with
//! `default_transaction_read_only = on`, which is what libpq's
//! `target_session_attrs=read-write` looks at (with `in_hot_standby`) to
//! skip a server. The failover is: stop the writable one, turn the other
//! writable (`ALTER SYSTEM`, reload). The lease rows a real failover would
//! have carried over are written on both servers before it, by sessions
//! that turn `default_transaction_read_only` off for themselves (it is
//! only a default).
//!
//! Every wait is for observable state: an event of the keeper, a backend's
//! `wait_event` in `pg_stat_activity`, the listener's status, a setting a
//! new session sees. No assertion is about how long anything took.

use std::sync::mpsc;
use std::time::Instant;

use leasehold::{
    error::{LeaseError, Operation},
    hold::{CancelToken, KeeperEvent, LeaseLoss},
    wait::{LeaseWaiter, Wait, LISTENER_APPLICATION_NAME},
    Keeper, LeaseClient, Leases,
};

use crate::common::*;
use crate::proxy;
use leasehold::guard::Fencing;

const READ_WRITE: &str = "target_session_attrs=read-write";

/// A server listening on TCP (multi-host URLs name hosts and ports), read
/// only from the start when `read_only`. The setting goes through
/// `ALTER SYSTEM` rather than the command line, which would win over any
/// later `ALTER SYSTEM` and so forbid the promotion.
fn tcp_server(read_only: bool) -> LocalPostgres {
    let server = LocalPostgres::builder()
        .durable(false)
        .tcp(true)
        .start()
        .unwrap_or_else(|e| panic!("start a throwaway server: {e}"));
    if read_only {
        set_read_only(&server, true);
    }
    server
}

fn url_of(server: &LocalPostgres) -> String {
    server.tcp_url_for("postgres").expect("a TCP server")
}

/// A session that writes even on a server started read-only: how these
/// tests install leasehold and write what replication would have copied.
fn writer(server: &LocalPostgres) -> PgConnection {
    let mut conn = PgConnection::establish(&url_of(server)).expect("connect");
    conn.batch_execute("SET default_transaction_read_only = off")
        .expect("make the session writable");
    conn
}

/// A session with the server's defaults.
fn plain(server: &LocalPostgres) -> PgConnection {
    PgConnection::establish(&url_of(server)).expect("connect")
}

/// `postgres://postgres@127.0.0.1:<p1>,127.0.0.1:<p2>/postgres?<params>`.
fn multi_host_url(ports: &[u16], params: &str) -> String {
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut url = format!("postgres://postgres@{}/postgres", hosts.join(","));
    if !params.is_empty() {
        url.push('?');
        url.push_str(params);
    }
    url
}

/// A TCP port nothing listens on: a host of the URL that is down.
fn dead_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

/// A pool like the library's (no check on checkout), with a short
/// checkout timeout so that calls fail quickly while no server is usable.
fn lazy_client(url: &str, size: u32) -> LeaseClient {
    LeaseClient::builder(url)
        .max_size(size)
        .checkout_timeout(Duration::from_secs(2))
        .connect_lazily()
        .build()
        .expect("a lazily connecting client")
}

/// The port of the server `conn` reaches.
fn server_port(conn: &mut PgConnection) -> u16 {
    query_lines(conn, "SELECT inet_server_port()::text AS line")[0]
        .parse()
        .expect("a port")
}

/// Turns `default_transaction_read_only` on or off for the whole server
/// and waits until a new session sees it. Existing sessions apply the
/// reloaded file before their next statement.
fn set_read_only(server: &LocalPostgres, on: bool) {
    let value = if on { "on" } else { "off" };
    let mut admin = plain(server);
    admin
        .batch_execute(&format!(
            "ALTER SYSTEM SET default_transaction_read_only = {value}"
        ))
        .expect("ALTER SYSTEM (allowed in a read-only transaction)");
    assert!(query_bool(&mut admin, "SELECT pg_reload_conf() AS flag"));
    wait_until("a new session seeing the reloaded setting", || {
        query_bool(
            &mut plain(server),
            &format!("SELECT current_setting('default_transaction_read_only') = '{value}' AS flag"),
        )
    });
}

/// Polls client-side observable state until it holds.
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    for _ in 0..4_000 {
        if condition() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("never observed: {what}");
}

/// Whether the listener session with `pid` runs on the server `conn` reaches.
fn listener_runs_on(conn: &mut PgConnection, pid: Option<i32>) -> bool {
    let Some(pid) = pid else { return false };
    query_bool(
        conn,
        &format!(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {pid} \
             AND application_name = '{LISTENER_APPLICATION_NAME}') AS flag"
        ),
    )
}

/// A keeper's events, each with the instant it was reported.
type Events = mpsc::Receiver<(Instant, KeeperEvent)>;

fn keeper(client: &LeaseClient, lease: Lease, ttl: Duration, margin: Duration) -> (Keeper, Events) {
    let (tx, rx) = mpsc::channel();
    let keeper = Keeper::builder(client, lease)
        .ttl(ttl)
        .margin(margin)
        .renew_every(Duration::from_millis(100))
        .retry_every(Duration::from_millis(50))
        .on_event(move |event| {
            let _ = tx.send((Instant::now(), event.clone()));
        })
        .start()
        .expect("start the keeper");
    (keeper, rx)
}

/// The next event matching `wanted`, skipping others.
fn next_event(
    events: &Events,
    what: &str,
    wanted: impl Fn(&KeeperEvent) -> bool,
) -> (Instant, KeeperEvent) {
    loop {
        match events.recv_timeout(Duration::from_secs(30)) {
            Ok((at, event)) if wanted(&event) => return (at, event),
            Ok(_) => {}
            Err(error) => panic!("never observed: {what} ({error})"),
        }
    }
}

fn is_read_only(error: &LeaseError, operation: Operation) -> bool {
    read_only_refusal(error) == Some(operation)
}

/// Part 1 of the failover story: a `LeaseClient` call, a `Keeper` renewal
/// and a `LeaseWaiter` wake-up all continue against the new writable
/// server, with nothing but the multi-host URL to find it. The old primary
/// is stopped.
#[test]
fn clients_on_a_multi_host_url_follow_the_writable_server_across_a_failover() {
    follow_the_writable_server(
        |old, new| {
            old.stop(StopMode::Fast).unwrap();
            set_read_only(new, false);
        },
        |error| {
            error.kind() == ErrorKind::OutcomeUnknown
                || database_error(error).is_some()
                || is_pool_error(error)
        },
    );
}

/// The same, with the old primary left up but fenced read-only and its
/// sessions left alone: calls on pooled connections to it are refused as
/// read-only (nothing changed) and the connections discarded, and the
/// listener leaves it at its next idle probe.
#[test]
fn clients_on_a_multi_host_url_leave_a_primary_that_turned_read_only() {
    follow_the_writable_server(
        |old, new| {
            set_read_only(old, true);
            set_read_only(new, false);
        },
        |error| read_only_refusal(error).is_some() || is_pool_error(error),
    );
}

fn follow_the_writable_server(
    failover: impl FnOnce(&LocalPostgres, &LocalPostgres),
    expected_failure: fn(&LeaseError) -> bool,
) {
    let primary = tcp_server(false);
    let standby = tcp_server(true);
    for server in [&primary, &standby] {
        let mut conn = writer(server);
        leasehold::install(&mut conn).expect("install leasehold");
        // What replication would have carried over: the same grants.
        granted(conn.acquire("kept", "keeper", TTL).unwrap());
        granted(conn.acquire("waited", "holder", TTL).unwrap());
    }
    let Some(LeaseState::Held {
        expires_at: seeded_on_standby,
        ..
    }) = plain(&standby).inspect("kept").unwrap()
    else {
        panic!("the kept lease must be held on the standby");
    };
    // The read-only server comes first: libpq must skip it.
    let url = multi_host_url(&[standby.port(), primary.port()], READ_WRITE);

    let mut client = lazy_client(&url, 2);
    assert_eq!(
        server_port(&mut client.pool().get().unwrap()),
        primary.port()
    );
    granted(client.acquire("before", "c", TTL).unwrap());
    assert!(plain(&primary).inspect("before").unwrap().is_some());
    assert_eq!(plain(&standby).inspect("before").unwrap(), None);

    let kept = granted(client.acquire("kept", "keeper", TTL).unwrap());
    let (keeper, events) = keeper(&lazy_client(&url, 2), kept, TTL, TTL / 10);

    let waiter = LeaseWaiter::builder(&lazy_client(&url, 2))
        .recheck_every(TTL)
        .fallback_poll(Duration::from_millis(20))
        .build();
    assert!(waiter.wait_until_listening(Duration::from_secs(20)));
    let blocked = {
        let waiter = waiter.clone();
        std::thread::spawn(move || {
            waiter.acquire("waited", "w", TTL, Wait::AtMost(Duration::from_secs(600)))
        })
    };
    wait_until("the waiter armed through the primary's listener", || {
        waiter.armed_waiters("waited") == 1
    });
    let before = waiter.listener_status();
    assert!(listener_runs_on(&mut plain(&primary), before.backend_pid));

    failover(&primary, &standby);
    let promoted = Instant::now();

    // LeaseClient: a call that meets a pooled connection to the old
    // primary fails (never a grant or a denial) and discards it; a later
    // call reaches the new primary.
    let mut failures = Vec::new();
    let after = loop {
        match client.acquire("after", "c", TTL) {
            Ok(acquisition) => break acquisition,
            Err(error) if expected_failure(&error) && failures.len() < 10 => failures.push(error),
            Err(error) => panic!("unexpected error: {error:?} after {failures:?}"),
        }
    };
    granted(after);
    assert_eq!(
        server_port(&mut client.pool().get().unwrap()),
        standby.port()
    );
    assert!(plain(&standby).inspect("after").unwrap().is_some());

    // Keeper: a renewal sent after the promotion succeeds, on the new
    // primary (the only writable server left), and the lease stays safe.
    let (_, renewed) = next_event(
        &events,
        "a renewal after the failover",
        |e| matches!(e, KeeperEvent::Renewed { sent_at, .. } if *sent_at >= promoted),
    );
    let KeeperEvent::Renewed { expires_at, .. } = renewed else {
        unreachable!()
    };
    assert!(keeper.is_valid() && keeper.loss().is_none());
    let Some(LeaseState::Held {
        expires_at: now_on_standby,
        epoch,
        ..
    }) = plain(&standby).inspect("kept").unwrap()
    else {
        panic!("the kept lease must be held on the new primary");
    };
    assert_eq!(epoch, 1);
    assert!(now_on_standby >= expires_at);
    assert!(
        now_on_standby > seeded_on_standby,
        "renewed on the new primary"
    );

    // LeaseWaiter: the listener reconnects to the new primary, the key is
    // registered there, and a release there wakes the waiter by
    // notification (re-checks are ten minutes apart, the holder's expiry
    // as far away).
    wait_until(
        "the waiter armed through the new primary's listener",
        || {
            let status = waiter.listener_status();
            status.connected
                && status.sessions > before.sessions
                && waiter.armed_waiters("waited") == 1
        },
    );
    let status = waiter.listener_status();
    assert!(listener_runs_on(&mut plain(&standby), status.backend_pid));
    assert_eq!(
        client
            .release(&leasehold_test_support::grant("waited", "holder", 1))
            .unwrap(),
        Release::Released
    );
    let lease = blocked.join().unwrap().expect("the waiter gets the lease");
    assert_eq!(lease.owner(), "w");
    assert_eq!(
        plain(&standby).inspect("waited").unwrap(),
        Some(LeaseState::Held {
            owner: "w".to_owned(),
            epoch: lease.epoch(),
            expires_at: lease.expires_at()
        })
    );
    assert!(waiter.listener_status().notification_wakeups > status.notification_wakeups);

    assert_eq!(keeper.stop().unwrap(), Release::Released);
}

/// Part 2: every lease and guard call on a read-only server fails with a
/// typed error that says so; reads still work; the pooled clients discard
/// the connection.
#[test]
fn lease_and_guard_calls_on_a_read_only_server_fail_with_a_typed_error() {
    let server = tcp_server(true);
    let mut setup = writer(&server);
    leasehold::install(&mut setup).expect("install leasehold");
    let held = granted(setup.acquire("k", "a", TTL).unwrap());
    drop(setup);
    let mut conn = plain(&server);

    let error = conn.acquire("free", "b", TTL).unwrap_err();
    assert!(is_read_only(&error, Operation::ACQUIRE), "{error:?}");
    assert!(error.to_string().contains("read-only"), "{error}");
    assert!(std::error::Error::source(&error).is_some());
    let error = conn
        .renew(&leasehold_test_support::grant("k", "a", held.epoch()), TTL)
        .unwrap_err();
    assert!(is_read_only(&error, Operation::RENEW), "{error:?}");
    let error = conn
        .release(&leasehold_test_support::grant("k", "a", held.epoch()))
        .unwrap_err();
    assert!(is_read_only(&error, Operation::RELEASE), "{error:?}");
    // Inside the caller's transaction too (and it stays usable).
    let in_transaction = conn.transaction::<_, diesel::result::Error, _>(|conn| {
        Ok(conn.acquire("free", "b", TTL).unwrap_err())
    });
    assert!(is_read_only(&in_transaction.unwrap(), Operation::ACQUIRE));
    // Reads work on a read-only server: nothing above changed anything.
    assert_eq!(
        conn.inspect("k").unwrap(),
        Some(LeaseState::Held {
            owner: "a".to_owned(),
            epoch: held.epoch(),
            expires_at: held.expires_at()
        })
    );
    assert_eq!(conn.inspect("free").unwrap(), None);

    let error = conn.admit("r", &held, Check::Token).unwrap_err();
    assert!(
        read_only_refusal(&error) == Some(Operation::ADMIT),
        "{error:?}"
    );
    let fenced = conn.run_fenced("r", &held, Check::Token, |_| {
        Ok::<_, diesel::result::Error>(())
    });
    assert!(
        matches!(
            fenced,
            Err(FencedError::Guard(ref e)) if read_only_refusal(e).is_some()
        ),
        "{fenced:?}"
    );

    // The pooled clients: the connection that met the read-only server is
    // not handed out again (the next one may reach a new primary).
    let url = url_of(&server);
    let mut client = lazy_client(&url, 1);
    let first = backend_pid(&mut client.pool().get().unwrap());
    let error = client.acquire("free", "b", TTL).unwrap_err();
    assert!(is_read_only(&error, Operation::ACQUIRE), "{error:?}");
    assert_ne!(backend_pid(&mut client.pool().get().unwrap()), first);
    let fenced = client.run_fenced("r", &held, Check::Token, |_| {
        Ok::<_, diesel::result::Error>(())
    });
    assert!(matches!(
        fenced,
        Err(FencedError::Guard(ref e)) if read_only_refusal(e).is_some()
    ));

    let waiter = LeaseWaiter::new(&lazy_client(&url, 1));
    let error = waiter
        .acquire("free", "b", TTL, Duration::from_secs(5))
        .unwrap_err();
    assert!(is_read_only(&error, Operation::ACQUIRE), "{error:?}");
    let error = Keeper::start(&lazy_client(&url, 1), held).unwrap_err();
    assert!(is_read_only(&error, Operation::RENEW), "{error:?}");
}

/// Part 3: a connection lost while an autocommitted call commits is
/// "outcome unknown" with a multi-host URL exactly as with one host.
#[test]
fn an_answer_lost_after_commit_is_outcome_unknown_on_a_multi_host_url() {
    let primary = tcp_server(false);
    let standby = tcp_server(true);
    leasehold::install(&mut writer(&primary)).expect("install leasehold");
    let proxy = proxy::Proxy::start(primary.port());
    let url = multi_host_url(
        &[standby.port(), proxy.port()],
        &format!("sslmode=disable&gssencmode=disable&{READ_WRITE}"),
    );
    let mut conn = PgConnection::establish(&url).expect("connect past the read-only server");
    assert_eq!(server_port(&mut conn), primary.port());
    let warm = granted(conn.acquire("warm-up", "w", TTL).unwrap());
    let _ = conn
        .release(&leasehold_test_support::grant("warm-up", "w", warm.epoch()))
        .unwrap();

    // A never-seen key: the SQL function grants it, in one request.
    proxy.drop_next_answer();
    let error = conn.acquire("k", "a", TTL).unwrap_err();
    assert!(
        error.kind() == ErrorKind::OutcomeUnknown && error.operation() == Some(Operation::ACQUIRE),
        "{error:?}"
    );
    assert!(proxy.answer_was_dropped());
    let Some(LeaseState::Held { owner, epoch, .. }) = plain(&primary).inspect("k").unwrap() else {
        panic!("the acquire committed, inspect must show it");
    };
    assert_eq!((owner.as_str(), epoch), ("a", leasehold::Epoch::new(1)));
}

/// The backend pid of the call whose statement matches the regular
/// expression `function` (the SQL function, e.g. `lease\.renew`) waiting
/// for a synchronous standby.
fn waiting_in_sync_rep(observer: &mut PgConnection, function: &str) -> i32 {
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event = 'SyncRep' \
         AND query ~ '{function}') AS flag"
    );
    wait_for(observer, &format!("{function} waiting in SyncRep"), &sql);
    query_lines(
        observer,
        &format!(
            "SELECT pid::text AS line FROM pg_stat_activity WHERE wait_event = 'SyncRep' \
             AND query ~ '{function}'"
        ),
    )[0]
    .parse()
    .expect("a pid")
}

fn still_in_sync_rep(observer: &mut PgConnection, pid: i32) -> bool {
    query_bool(
        observer,
        &format!(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {pid} \
             AND wait_event = 'SyncRep') AS flag"
        ),
    )
}

/// Part 4: a commit waiting for a synchronous standby has committed
/// locally; a cancel would make PostgreSQL end the wait with a WARNING and
/// report success for a commit a failover may lose. No way the API offers
/// to stop a call sends a cancel: the renew and the acquire keep waiting
/// through a cancelled token, a dropped waiter and a stopping keeper, and
/// finish with the confirmed outcome once the standby requirement goes.
#[test]
fn no_cancellation_path_interrupts_a_commit_waiting_for_a_synchronous_standby() {
    let cluster = Cluster::start(false);
    let url = cluster.url();
    let mut admin = cluster.conn();
    let kept = granted(admin.acquire("kept", "keeper", TTL).unwrap());
    let (keeper, _events) = keeper(&lazy_client(&url, 2), kept, TTL, TTL / 10);
    let waiter = LeaseWaiter::new(&lazy_client(&url, 2));

    // Every commit now waits for a standby that never comes. The lease
    // functions raise synchronous_commit to on for their own transaction,
    // so this holds although the server runs with it off.
    admin
        .batch_execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        .unwrap();
    assert!(query_bool(&mut admin, "SELECT pg_reload_conf() AS flag"));
    let renewing = waiting_in_sync_rep(&mut admin, "lease\\.renew");

    let cancel = CancelToken::new();
    let acquiring = {
        let (waiter, cancel) = (waiter.clone(), cancel.clone());
        std::thread::spawn(move || {
            waiter.acquire_cancellable("free", "w", TTL, Wait::UntilCancelled, &cancel)
        })
    };
    let acquire_pid = waiting_in_sync_rep(&mut admin, "lease\\.acquire");

    // Every way to stop a call: the waiter's token, dropping a waiter (its
    // clone in the thread is what remains), stopping the keeper (dropping
    // it runs the same stop).
    cancel.cancel();
    drop(waiter);
    let stopping = std::thread::spawn(move || keeper.stop());
    // The renew holds its row lock until the wait ends (PostgreSQL
    // releases a transaction's locks after its commit record is
    // confirmed), so the keeper's release waits behind it.
    wait_for(
        &mut admin,
        "the keeper's release waiting behind the renew",
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND query ~ 'lease\\.release') AS flag",
    );
    for pid in [renewing, acquire_pid] {
        assert!(
            still_in_sync_rep(&mut admin, pid),
            "backend {pid} left SyncRep"
        );
    }
    assert!(!acquiring.is_finished() && !stopping.is_finished());

    admin
        .batch_execute("ALTER SYSTEM RESET synchronous_standby_names")
        .unwrap();
    assert!(query_bool(&mut admin, "SELECT pg_reload_conf() AS flag"));
    // The grant committed and was confirmed: it is returned, not reported
    // cancelled (which would leak a grant the caller does not know of).
    let lease = acquiring
        .join()
        .unwrap()
        .expect("the confirmed grant, not a cancellation");
    assert_eq!(lease.owner(), "w");
    assert!(matches!(
        admin.inspect("free").unwrap(),
        Some(LeaseState::Held { owner, .. }) if owner == "w"
    ));
    assert_eq!(stopping.join().unwrap().unwrap(), Release::Released);
    assert!(matches!(
        admin.inspect("kept").unwrap(),
        Some(LeaseState::Free { .. })
    ));
    let log = cluster.pg.log_tail(10_000);
    assert!(
        !log.contains("wait for synchronous replication"),
        "a wait for synchronous replication was cancelled:\n{log}"
    );
}

/// Part 5: the only server the URL reaches turned read-only (a failover
/// that demoted it, with no new primary reachable): renewals fail with the
/// typed read-only error, `safe_until` does not move, and the keeper
/// reports the loss at it.
#[test]
fn keeper_whose_only_reachable_server_turned_read_only_reports_the_loss_at_its_deadline() {
    let server = tcp_server(false);
    let mut conn = writer(&server);
    leasehold::install(&mut conn).expect("install leasehold");
    let ttl = Duration::from_secs(3);
    let lease = granted(conn.acquire("k", "a", ttl).unwrap());
    drop(conn);
    // No target_session_attrs: libpq takes the read-only server rather
    // than nothing, so the keeper sees the server's own refusal.
    let url = multi_host_url(&[dead_port(), server.port()], "");
    let (keeper, events) = keeper(
        &lazy_client(&url, 2),
        lease,
        ttl,
        Duration::from_millis(500),
    );

    set_read_only(&server, true);
    let (_, failed) = next_event(
        &events,
        "a renewal refused as read-only",
        |e| matches!(e, KeeperEvent::RenewFailed { error } if is_read_only(error, Operation::RENEW)),
    );
    drop(failed);
    let deadline = keeper.safe_until();
    let (lost_at, lost) = next_event(&events, "the loss", |e| {
        assert!(
            !matches!(e, KeeperEvent::Renewed { .. }),
            "a read-only server renewed: {e:?}"
        );
        matches!(e, KeeperEvent::Lost(_))
    });
    let KeeperEvent::Lost(LeaseLoss::DeadlinePassed {
        last_error: Some(last_error),
    }) = lost
    else {
        panic!("expected the deadline to pass: {lost:?}");
    };
    assert!(
        is_read_only(&last_error, Operation::RENEW),
        "{last_error:?}"
    );
    assert_eq!(keeper.safe_until(), deadline, "safe_until moved");
    assert!(lost_at >= deadline, "reported before the deadline");
    assert!(!keeper.is_valid());
    drop(keeper);
}

/// Part 5 again, with every host of a multi-host URL gone: the renewals
/// fail as connection failures and the loss is reported at the deadline.
#[test]
fn keeper_on_a_multi_host_url_with_every_server_gone_reports_the_loss_at_its_deadline() {
    let primary = tcp_server(false);
    let mut conn = writer(&primary);
    leasehold::install(&mut conn).expect("install leasehold");
    let ttl = Duration::from_secs(3);
    let lease = granted(conn.acquire("k", "a", ttl).unwrap());
    drop(conn);
    let url = multi_host_url(&[primary.port(), dead_port()], READ_WRITE);
    let (keeper, events) = keeper(
        &lazy_client(&url, 2),
        lease,
        ttl,
        Duration::from_millis(500),
    );
    next_event(&events, "a renewal", |e| {
        matches!(e, KeeperEvent::Renewed { .. })
    });
    primary.stop(StopMode::Immediate).unwrap();
    let (lost_at, lost) = next_event(&events, "the loss", |e| matches!(e, KeeperEvent::Lost(_)));
    assert!(
        matches!(
            lost,
            KeeperEvent::Lost(LeaseLoss::DeadlinePassed {
                last_error: Some(_)
            })
        ),
        "{lost:?}"
    );
    assert!(
        lost_at >= keeper.safe_until(),
        "reported before the deadline"
    );
    assert!(!keeper.is_valid());
    drop(keeper);
}
