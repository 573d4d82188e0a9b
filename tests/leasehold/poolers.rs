//! Through PgBouncer 1.18 (docs/guide/poolers.md, "Poolers"): in session mode
//! everything works; in transaction mode the lease calls, guards and the
//! pool client work with `PreparedStatements::Uncached`, fail detectably
//! without it, and a waiter's listener refuses a transaction-mode URL with
//! its reason. Always on the local throwaway server (PgBouncer runs in
//! front of it), whatever `DATABASE_URL` says.

use std::time::{Duration, Instant};

use diesel::connection::{CacheSize, SimpleConnection};
use diesel::prelude::*;
use leasehold::{
    error::LeaseError,
    guard::Check,
    pool::PreparedStatements,
    wait::{LeaseWaiter, PollingReason, Wait, WakeMode},
    ErrorKind, LeaseClient, LeaseState, Leases, Release, Renewal,
};
use leasehold_test_support::{PgBouncer, PoolMode};

use crate::common::{granted, query_lines, quote, TestDb, TestServer, TTL};
use leasehold::guard::Fencing;

const LONG_WAIT: Duration = Duration::from_secs(60);

fn bouncer(mode: PoolMode, pool_size: u32) -> (TestDb, PgBouncer, String) {
    let server = TestServer::local();
    let db = TestDb::installed_on(server);
    let local = server
        .local_postgres()
        .expect("TestServer::local is a local server");
    let bouncer = PgBouncer::start(local, mode, pool_size);
    let url = bouncer.url_for(&db.name);
    (db, bouncer, url)
}

fn items_table(db: &TestDb) {
    db.conn()
        .batch_execute("CREATE TABLE items (resource text, writer text, epoch bigint)")
        .unwrap();
}

fn write(conn: &mut PgConnection, writer: &str, epoch: i64) -> Result<(), diesel::result::Error> {
    conn.batch_execute(&format!(
        "INSERT INTO items VALUES ('r', {}, {epoch})",
        quote(writer)
    ))
}

fn items(db: &TestDb) -> Vec<String> {
    query_lines(
        &mut db.conn(),
        "SELECT format('%s|%s', writer, epoch) AS line FROM items ORDER BY epoch, writer",
    )
}

/// The whole client cycle, guards included, from `threads` threads at
/// once (so that transaction mode really hands calls to different server
/// sessions), each on keys of its own.
fn full_cycle(client: &LeaseClient, threads: usize) {
    std::thread::scope(|scope| {
        for t in 0..threads {
            let mut client = client.clone();
            scope.spawn(move || {
                for round in 0..20 {
                    let key = format!("k{t}-{round}");
                    let owner = format!("w{t}");
                    let lease = client
                        .acquire(&key, &owner, TTL)
                        .unwrap()
                        .granted()
                        .unwrap();
                    let renewed = client
                        .renew(
                            &leasehold_test_support::grant(&key, &owner, lease.epoch()),
                            TTL,
                        )
                        .unwrap();
                    assert!(matches!(renewed, Renewal::Renewed { .. }), "{renewed:?}");
                    let state = client.inspect(&key).unwrap().unwrap();
                    assert!(
                        matches!(&state, LeaseState::Held { owner: o, .. } if *o == owner),
                        "{state:?}"
                    );
                    client
                        .run_fenced(
                            &format!("r{t}-{round}"),
                            &lease.token(),
                            Check::LeaseHeld,
                            |c| write(c, &owner, lease.epoch().get()),
                        )
                        .unwrap();
                    let released = client
                        .release(&leasehold_test_support::grant(&key, &owner, lease.epoch()))
                        .unwrap();
                    assert_eq!(released, Release::Released);
                }
            });
        }
    });
}

/// One waiter blocked on a held key, armed (its release notification
/// registered), woken by the release: the wake-up came by notification.
fn waiter_is_woken_by_notification(waiter: &LeaseWaiter, client: &mut LeaseClient) {
    waiter.ensure_listening(LONG_WAIT).unwrap();
    let holder = client
        .acquire("w", "holder", TTL)
        .unwrap()
        .granted()
        .unwrap();
    let before = waiter.listener_status().notification_wakeups;
    let waiting = {
        let waiter = waiter.clone();
        std::thread::spawn(move || waiter.acquire("w", "waiter", TTL, LONG_WAIT))
    };
    while waiter.armed_waiters("w") != 1 {
        assert!(!waiting.is_finished(), "{:?}", waiting.join());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        client
            .release(&leasehold_test_support::grant(
                "w",
                "holder",
                holder.epoch()
            ))
            .unwrap(),
        Release::Released
    );
    let lease = waiting.join().unwrap().unwrap();
    assert_eq!(lease.owner(), "waiter");
    let status = waiter.listener_status();
    assert!(status.notification_wakeups > before, "{status:?}");
    assert_eq!(status.wake_mode, WakeMode::Notifications);
}

#[test]
fn session_mode_runs_everything_with_cached_statements() {
    let (db, _bouncer, url) = bouncer(PoolMode::Session, 10);
    items_table(&db);
    let mut client = LeaseClient::connect(&url, 4).unwrap();
    full_cycle(&client, 3);
    assert_eq!(items(&db).len(), 60);
    let waiter = LeaseWaiter::new(&client);
    waiter_is_woken_by_notification(&waiter, &mut client);
}

#[test]
fn transaction_mode_runs_lease_calls_guards_and_the_client_with_uncached_statements() {
    let (db, _bouncer, url) = bouncer(PoolMode::Transaction, 2);
    items_table(&db);
    let mut client = LeaseClient::builder(&url)
        .max_size(4)
        .prepared_statements(PreparedStatements::Uncached)
        .build()
        .unwrap();
    full_cycle(&client, 4);
    assert_eq!(items(&db).len(), 80);

    // The free functions on a connection of the caller's whose statement
    // cache is disabled, interleaved with another connection's calls.
    let mut a = PgConnection::establish(&url).unwrap();
    let mut b = PgConnection::establish(&url).unwrap();
    a.set_prepared_statement_cache_size(CacheSize::Disabled);
    b.set_prepared_statement_cache_size(CacheSize::Disabled);
    let lease = granted(a.acquire("free", "a", TTL).unwrap());
    assert!(b.acquire("free", "b", TTL).unwrap().granted().is_none());
    let renewed = a
        .renew(
            &leasehold_test_support::grant("free", "a", lease.epoch()),
            TTL,
        )
        .unwrap();
    assert!(matches!(renewed, Renewal::Renewed { .. }), "{renewed:?}");
    let state = b.inspect("free").unwrap().unwrap();
    assert!(
        matches!(&state, LeaseState::Held { owner, .. } if owner == "a"),
        "{state:?}"
    );
    b.run_fenced("free-r", &lease, Check::Token, |c| {
        write(c, "a", lease.epoch().get())
    })
    .unwrap();
    assert_eq!(
        a.release(&leasehold_test_support::grant("free", "a", lease.epoch()))
            .unwrap(),
        Release::Released
    );

    // A waiter: attempts through the pooler, its listener session direct.
    let direct = TestServer::local().url_for(&db.name);
    let waiting = LeaseClient::builder(&url)
        .max_size(2)
        .prepared_statements(PreparedStatements::Uncached)
        .listen_url(&direct)
        .build()
        .unwrap();
    let waiter = LeaseWaiter::new(&waiting);
    waiter_is_woken_by_notification(&waiter, &mut client);
}

/// With the default cached statements, a transaction-mode pooler breaks
/// the calls in a way the error names. One server session (pool size 1)
/// makes it deterministic: connection `a` prepares diesel's first statement
/// there, and `b`'s first call then finds its name taken.
#[test]
fn transaction_mode_with_cached_statements_fails_with_a_named_error() {
    let (_db, _bouncer, url) = bouncer(PoolMode::Transaction, 1);
    let mut a = PgConnection::establish(&url).unwrap();
    let mut b = PgConnection::establish(&url).unwrap();
    granted(a.acquire("k", "a", TTL).unwrap());
    let error = b.acquire("other", "b", TTL).unwrap_err();
    assert!(is_prepared_statement_lost(&error), "{error:?}");
    assert!(error.to_string().contains("PreparedStatements::Uncached"));

    // The pool clients the same way: two clients, one server session.
    // Each call either works or fails with that error (and its connection
    // is discarded); some fail.
    drop((a, b));
    let mut first = LeaseClient::connect(&url, 1).unwrap();
    let mut second = LeaseClient::connect(&url, 1).unwrap();
    let mut lost = 0;
    for round in 0..4 {
        let client = if round % 2 == 0 {
            &mut first
        } else {
            &mut second
        };
        match client.inspect("k") {
            Ok(_) => {}
            Err(e) if is_prepared_statement_lost(&e) => lost += 1,
            Err(other) => panic!("{other:?}"),
        }
    }
    assert!(lost > 0);
}

/// A listener URL through a transaction-mode pooler: LISTEN succeeds there,
/// but the delivery check's notification never arrives, and the waiter
/// says so instead of waiting for notifications that cannot come. Waiting
/// still works, by polling.
#[test]
fn a_waiter_listening_through_transaction_mode_says_why_and_polls() {
    let (_db, _bouncer, url) = bouncer(PoolMode::Transaction, 4);
    let client = LeaseClient::builder(&url)
        .max_size(2)
        .prepared_statements(PreparedStatements::Uncached)
        .build()
        .unwrap();
    let waiter = LeaseWaiter::builder(&client)
        .fallback_poll(Duration::from_millis(20))
        .build();
    let error = waiter.ensure_listening(LONG_WAIT).unwrap_err();
    if !(error.kind() == ErrorKind::Unavailable
        && error
            .to_string()
            .starts_with("the waiters' listener is not listening"))
    {
        panic!("{error:?}");
    }
    // The error says the wake mode; the rest of the status is the waiter's.
    let status = waiter.listener_status();
    assert_eq!(
        status.wake_mode,
        WakeMode::Polling(PollingReason::NotificationsNotDelivered)
    );
    assert!(!status.connected);
    let message = error.to_string();
    assert!(
        message.contains(&format!(
            "({:?})",
            WakeMode::Polling(PollingReason::NotificationsNotDelivered)
        )),
        "{message}"
    );
    assert!(message.contains("transaction mode"), "{message}");
    assert!(!waiter.wait_until_listening(Duration::ZERO));

    let mut client = LeaseClient::builder(&url)
        .max_size(1)
        .prepared_statements(PreparedStatements::Uncached)
        .build()
        .unwrap();
    let holder = client
        .acquire("k", "holder", TTL)
        .unwrap()
        .granted()
        .unwrap();
    let waiting = {
        let waiter = waiter.clone();
        std::thread::spawn(move || waiter.acquire("k", "waiter", TTL, Wait::AtMost(LONG_WAIT)))
    };
    assert_eq!(
        client
            .release(&leasehold_test_support::grant(
                "k",
                "holder",
                holder.epoch()
            ))
            .unwrap(),
        Release::Released
    );
    assert_eq!(waiting.join().unwrap().unwrap().owner(), "waiter");
    assert_eq!(waiter.listener_status().notification_wakeups, 0);
}

/// What `PreparedStatements::Uncached` costs: median latency of acquire
/// and of renew on one connection, cached and uncached, directly and
/// through PgBouncer, all in this run against the same server. Prints
/// the numbers (`cargo test -p leasehold --test leasehold statement_caching
/// -- --nocapture`); asserts nothing about them.
#[test]
fn statement_caching_cost_is_measured() {
    const ROUNDS: usize = 300;
    let server = TestServer::local();
    let db = TestDb::installed_on(server);
    let local = server
        .local_postgres()
        .expect("TestServer::local is a local server");
    let session = PgBouncer::start(local, PoolMode::Session, 2);
    let transaction = PgBouncer::start(local, PoolMode::Transaction, 2);
    let direct = server.url_for(&db.name);
    let configs = [
        ("direct", direct.clone(), CacheSize::Unbounded),
        ("direct", direct, CacheSize::Disabled),
        (
            "pgbouncer session",
            session.url_for(&db.name),
            CacheSize::Unbounded,
        ),
        (
            "pgbouncer session",
            session.url_for(&db.name),
            CacheSize::Disabled,
        ),
        (
            "pgbouncer transaction",
            transaction.url_for(&db.name),
            CacheSize::Disabled,
        ),
    ];
    println!("median latency over {ROUNDS} calls each, one connection:");
    for (i, (path, url, cache)) in configs.iter().enumerate() {
        let mut conn = PgConnection::establish(url).unwrap();
        conn.set_prepared_statement_cache_size(*cache);
        let key = format!("bench-{i}");
        let lease = granted(conn.acquire(&key, "o", TTL).unwrap());
        let (mut acquires, mut renews) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let started = Instant::now();
            let again = conn.acquire(&key, "o", TTL).unwrap();
            acquires.push(started.elapsed());
            let started = Instant::now();
            let renewed = conn
                .renew(
                    &leasehold_test_support::grant(&key, "o", lease.epoch()),
                    TTL,
                )
                .unwrap();
            renews.push(started.elapsed());
            assert!(again.granted().is_some() && matches!(renewed, Renewal::Renewed { .. }));
        }
        let label = if *cache == CacheSize::Disabled {
            "uncached"
        } else {
            "cached"
        };
        println!(
            "  {path:<22} {label:<8}  acquire {:>7.1} us  renew {:>7.1} us",
            median_us(&mut acquires),
            median_us(&mut renews)
        );
    }
}

fn median_us(samples: &mut [Duration]) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

/// A fenced table behind a transaction-mode pooler with one server
/// session: a token presented by one client never authorises another
/// client's write on that session, even when the first left the setting
/// at session level (docs/SPECIFICATION.md §2.1, F4).
#[test]
fn transaction_mode_a_token_never_outlives_its_transaction_on_a_shared_session() {
    let (db, _bouncer, url) = bouncer(PoolMode::Transaction, 1);
    db.conn()
        .batch_execute("CREATE TABLE ledger (entry text); SELECT lease.protect_table('ledger', 'ledger-writer')")
        .unwrap();
    let mut a = PgConnection::establish(&url).unwrap();
    let mut b = PgConnection::establish(&url).unwrap();
    a.set_prepared_statement_cache_size(CacheSize::Disabled);
    b.set_prepared_statement_cache_size(CacheSize::Disabled);
    let lease = granted(a.acquire("ledger-writer", "a", TTL).unwrap());
    a.transaction(|conn| {
        conn.present(&lease).unwrap();
        conn.batch_execute("INSERT INTO ledger VALUES ('by a')")
    })
    .unwrap();
    // `a` copies its claim to session level on the shared server session.
    a.batch_execute("BEGIN").unwrap();
    a.present(&lease).unwrap();
    let claims = query_lines(&mut a, "SELECT current_setting('lease.presented') AS line").remove(0);
    a.batch_execute(&format!("COMMIT; SET lease.presented = {}", quote(&claims)))
        .unwrap();
    let pid = |conn: &mut PgConnection| {
        query_lines(conn, "SELECT pg_backend_pid()::text AS line").remove(0)
    };
    assert_eq!(
        pid(&mut a),
        pid(&mut b),
        "one server session serves both clients"
    );
    for sql in [
        "INSERT INTO ledger VALUES ('by b')",
        "BEGIN; INSERT INTO ledger VALUES ('by b'); COMMIT",
    ] {
        let refused = b.batch_execute(sql).unwrap_err();
        let _ = b.batch_execute("ROLLBACK");
        assert!(
            {
                let error = LeaseError::from(refused);
                // A fenced table's refusal of a write (not of its owner).
                error.table().is_some() && error.role().is_none()
            },
            "{sql}"
        );
    }
    b.batch_execute("RESET lease.presented").unwrap();
    assert_eq!(
        query_lines(&mut db.conn(), "SELECT entry AS line FROM ledger"),
        vec!["by a".to_owned()]
    );
}

/// The old `LeaseError::PreparedStatementLost`.
fn is_prepared_statement_lost(error: &LeaseError) -> bool {
    error.kind() == ErrorKind::Unavailable
        && error
            .to_string()
            .contains("prepared statement went missing")
}
