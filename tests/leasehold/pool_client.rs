//! The r2d2 convenience handle behaves like the connection API.

use leasehold::Leases;
use leasehold::{Acquisition, LeaseClient, LeaseState, Release, Renewal};

use crate::common::*;

#[test]
fn pool_client_runs_the_full_cycle_without_a_caller_connection() {
    let db = TestDb::new();
    let mut client = LeaseClient::connect(&db.url, 2).unwrap();
    let lease = client
        .acquire("k", "a", TTL)
        .unwrap()
        .granted()
        .expect("granted");
    assert_eq!(client.acquire("k", "b", TTL).unwrap(), Acquisition::Denied);
    assert!(matches!(
        client
            .renew(&leasehold_test_support::grant("k", "a", lease.epoch()), TTL)
            .unwrap(),
        Renewal::Renewed { .. }
    ));
    assert_eq!(
        client
            .release(&leasehold_test_support::grant("k", "a", lease.epoch()))
            .unwrap(),
        Release::Released
    );
    assert_eq!(
        client.inspect("k").unwrap(),
        Some(LeaseState::Free {
            epoch: 2.into(),
            force_released: false
        })
    );
    assert_eq!(client.inspect("none").unwrap(), None);
}

/// A database that does not exist, reached lazily through the pool: the
/// pool's error, as a configuration mistake (`InvalidInput`).
#[test]
fn pool_client_reports_an_unreachable_database_as_a_pool_error() {
    let url = TestServer::from_env().url_for("leasehold_no_such_database");
    let mut client = LeaseClient::builder(&url)
        .checkout_timeout(std::time::Duration::from_millis(300))
        .connect_lazily()
        .build()
        .unwrap();
    let error = client.acquire("k", "a", TTL).unwrap_err();
    assert!(
        error.kind() == leasehold::ErrorKind::InvalidInput
            && error.operation().is_none()
            && error
                .to_string()
                .starts_with("no database connection available from the pool"),
        "{error:?}"
    );
    // The pool's own error is kept as the source.
    assert!(std::error::Error::source(&error).is_some(), "{error:?}");
}

#[test]
fn pool_client_discards_a_connection_whose_session_died_and_recovers_on_the_next_call() {
    use diesel::connection::SimpleConnection;
    let db = TestDb::new();
    let mut client = LeaseClient::connect(&db.url, 1).unwrap();
    let lease = client.acquire("k", "a", TTL).unwrap().granted().unwrap();
    // Kill the pool's only session from outside.
    let mut admin = db.conn();
    admin
        .batch_execute(&format!(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity \
             WHERE datname = '{}' AND pid <> pg_backend_pid()",
            db.name
        ))
        .unwrap();
    let first = client.renew(&leasehold_test_support::grant("k", "a", lease.epoch()), TTL);
    assert!(
        first.is_err(),
        "a call on the dead session must fail: {first:?}"
    );
    // The dead connection was discarded: the next call gets a fresh one.
    assert!(matches!(
        client
            .renew(&leasehold_test_support::grant("k", "a", lease.epoch()), TTL)
            .unwrap(),
        Renewal::Renewed { .. }
    ));
}

/// Building a client or a waiter for a URL that cannot connect fails at
/// once with libpq's own message (here: the database does not exist), an
/// `ErrorKind::Unavailable` "cannot connect" error, instead of a pool that
/// waits its connection timeout and then says only that no connection is
/// available.
#[test]
fn connecting_to_a_database_that_refuses_says_why_at_once() {
    let url = TestServer::from_env().url_for("leasehold_no_such_database");
    for (what, result) in [
        ("client", LeaseClient::connect(&url, 2).map(drop)),
        (
            "uncached",
            LeaseClient::builder(&url)
                .max_size(2)
                .prepared_statements(leasehold::pool::PreparedStatements::Uncached)
                .build()
                .map(drop),
        ),
    ] {
        let error = result.expect_err(what);
        assert!(
            error.kind() == leasehold::ErrorKind::InvalidInput
                && error
                    .to_string()
                    .starts_with("cannot connect to the database"),
            "{what}: {error:?}"
        );
        let message = error.to_string();
        assert!(
            message.contains("leasehold_no_such_database") && message.contains("does not exist"),
            "{what}: {message}"
        );
    }
}

/// A server that accepts connections and never answers: building a client,
/// a waiter or a pool fails within the connect timeout (5 s by default,
/// the URL's `connect_timeout` when it sets one) with libpq's message,
/// instead of waiting as long as the operating system would.
#[test]
fn connecting_to_a_server_that_never_answers_fails_within_the_connect_timeout() {
    let port = leasehold_test_support::fault_proxy::silent_server();
    let url = format!("postgres://nobody@127.0.0.1:{port}/db");
    let bounded = format!("{url}?connect_timeout=2");
    type Connect = fn(&str) -> Result<(), leasehold::LeaseError>;
    let ways: [(&str, Connect); 2] = [
        ("client", |url| LeaseClient::connect(url, 2).map(drop)),
        ("uncached", |url| {
            LeaseClient::builder(url)
                .max_size(2)
                .prepared_statements(leasehold::pool::PreparedStatements::Uncached)
                .build()
                .map(drop)
        }),
    ];
    for (what, connect) in ways {
        for (url, at_least, below) in [(&url, 4, 15), (&bounded, 1, 5)] {
            let started = std::time::Instant::now();
            let error = connect(url).expect_err(what);
            let took = started.elapsed();
            assert!(
                error.kind() == leasehold::ErrorKind::Unavailable
                    && error
                        .to_string()
                        .starts_with("cannot connect to the database"),
                "{what}: {error:?}"
            );
            assert!(error.to_string().contains("timeout"), "{what}: {error}");
            assert!(
                took >= std::time::Duration::from_secs(at_least)
                    && took < std::time::Duration::from_secs(below),
                "{what} {url}: failed after {took:?}"
            );
        }
    }
}
