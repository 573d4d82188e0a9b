//! Every way either face connects is bounded by `connect_timeout` and
//! reports why it could not connect: a server that accepts and never
//! answers, a stopped postmaster, and a port nobody listens on, through
//! `AsyncLeaseClient::builder(..).build()`, a call through a lazily built
//! async client's pool, `leasehold::aio::connect`, and the sync
//! `LeaseClient::connect`; and a URL whose first host never answers
//! reaches its second.
//!
//! Each attempt runs under the test's own bound (`OUTER`), so a hang fails
//! the test instead of stalling it.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use leasehold::aio::{AsyncLeaseClient, AsyncLeases};
use leasehold::{ErrorKind, LeaseClient, LeaseError};
use leasehold_local::LocalPostgres;

use crate::aio_common::runtime;

/// How long any one attempt may take before the test calls it a hang.
const OUTER: Duration = Duration::from_secs(15);

/// The window a `connect_timeout=2` attempt must end in: not before the
/// bound (it did wait for the server), well before `OUTER`.
const AT_LEAST: Duration = Duration::from_secs(2);
const BELOW: Duration = Duration::from_secs(10);

/// Whether `error` is a connect that found no server within its bound.
fn is_connect_timed_out(error: &LeaseError) -> bool {
    error.kind() == ErrorKind::Unavailable && error.to_string().starts_with("no connection to")
}

/// Whether `error` is a connection that could not be opened; its source
/// has the driver's reason.
fn is_connect(error: &LeaseError) -> bool {
    error.kind() == ErrorKind::Unavailable
        && error
            .to_string()
            .starts_with("cannot connect to the database")
}

/// The async pool's own error, if `error` is a failed checkout from it.
fn async_pool_error(
    error: &LeaseError,
) -> Option<&diesel_async::pooled_connection::deadpool::PoolError> {
    if error.kind() != ErrorKind::Unavailable
        || error.operation().is_some()
        || !error
            .to_string()
            .starts_with("no database connection available from the pool")
    {
        return None;
    }
    std::error::Error::source(error)?.downcast_ref()
}

/// Runs `attempt` under `OUTER`: its result and how long it took.
async fn bounded<T>(what: &str, attempt: impl std::future::Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    match tokio::time::timeout(OUTER, attempt).await {
        Ok(result) => (result, started.elapsed()),
        Err(_) => panic!("{what}: still waiting after {OUTER:?}"),
    }
}

/// Runs the blocking `attempt` on a thread, under `OUTER`.
fn bounded_sync<T: Send + 'static>(
    what: &str,
    attempt: impl FnOnce() -> T + Send + 'static,
) -> (T, Duration) {
    let started = Instant::now();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(attempt());
    });
    match rx.recv_timeout(OUTER) {
        Ok(result) => (result, started.elapsed()),
        Err(_) => panic!("{what}: still waiting after {OUTER:?}"),
    }
}

fn assert_within_the_bound(what: &str, took: Duration) {
    assert!(
        took >= AT_LEAST && took < BELOW,
        "{what}: failed after {took:?}, expected within [{AT_LEAST:?}, {BELOW:?})"
    );
}

/// Every entry point of both faces against `url` (with
/// `connect_timeout=2`) that cannot complete a connection: each fails with
/// the typed timeout, naming `server`, the time and the setting, within
/// the bound.
fn every_entry_point_times_out(url: &str, server: &str) {
    let expected = |what: &str, message: &str| {
        for part in [server, "2 s", "connect_timeout=2 from the URL"] {
            assert!(
                message.contains(part),
                "{what}: {part:?} not in {message:?}"
            );
        }
    };
    runtime().block_on(async {
        let (result, took) = bounded("build", AsyncLeaseClient::builder(url).build()).await;
        match &result {
            Err(error) if is_connect_timed_out(error) => {
                assert_eq!(error.waited(), Some(Duration::from_secs(2)))
            }
            other => panic!("build: expected ConnectTimedOut, got {other:?}"),
        }
        expected("build", &result_text(result));
        assert_within_the_bound("build", took);

        let (result, took) = bounded("aio::connect", leasehold::aio::connect(url)).await;
        match &result {
            Err(error) if is_connect_timed_out(error) => {}
            Err(other) => panic!("aio::connect: expected TimedOut, got {other:?}"),
            Ok(_) => panic!("aio::connect: connected to a server that never answers"),
        }
        expected("aio::connect", &result_text(result));
        assert_within_the_bound("aio::connect", took);

        let mut lazy = AsyncLeaseClient::builder(url)
            .connect_lazily()
            .build()
            .await
            .expect("a lazy client builds without connecting");
        let (result, took) = bounded("a call through the pool", lazy.inspect("k")).await;
        let message = match result {
            Err(error) if async_pool_error(&error).is_some() => {
                async_pool_error(&error).unwrap().to_string()
            }
            other => panic!("a call through the pool: expected AsyncPool, got {other:?}"),
        };
        expected("a call through the pool", &message);
        assert_within_the_bound("a call through the pool", took);
    });
    let owned = url.to_owned();
    let (result, took) = bounded_sync("LeaseClient::connect", move || {
        LeaseClient::connect(&owned, 2).map(drop)
    });
    match result {
        Err(error) if is_connect(&error) => {
            let source = std::error::Error::source(&error).expect("the driver's reason");
            assert!(source.to_string().contains("timeout"), "{source}")
        }
        other => panic!("LeaseClient::connect: expected Connect, got {other:?}"),
    }
    assert_within_the_bound("LeaseClient::connect", took);
}

fn result_text<T>(result: Result<T, impl std::fmt::Display>) -> String {
    match result {
        Ok(_) => panic!("connected to a server that never answers"),
        Err(error) => error.to_string(),
    }
}

/// A listener that accepts TCP connections and never says a word.
#[test]
fn connecting_to_a_server_that_never_answers_is_bounded_on_both_faces() {
    let port = leasehold_test_support::fault_proxy::silent_server();
    let url = format!("postgres://nobody@127.0.0.1:{port}/db?connect_timeout=2");
    every_entry_point_times_out(&url, &format!("127.0.0.1:{port}"));
}

/// Resumes a stopped process when dropped, so that a failed assertion
/// does not leave the postmaster stopped.
struct Resume(libc::pid_t);

impl Drop for Resume {
    // The workspace denies unsafe code; this test stops and resumes a
    // process, which only libc's kill does.
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: kill(2) with a pid this test stopped; no memory involved.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// A real server whose postmaster is stopped (SIGSTOP): the kernel still
/// completes TCP handshakes on its socket, nobody answers.
#[test]
#[allow(unsafe_code)] // kill(2), as in `Resume`.
fn connecting_to_a_stopped_postmaster_is_bounded_on_both_faces() {
    let server = LocalPostgres::builder()
        .durable(false)
        .tcp(true)
        .start()
        .expect("a local server");
    let url = format!(
        "{}?connect_timeout=2",
        server.tcp_url_for("postgres").expect("a tcp server")
    );
    runtime().block_on(async {
        let client = bounded(
            "build while running",
            AsyncLeaseClient::builder(&url).build(),
        )
        .await
        .0;
        client.expect("the running server accepts the async client");
    });
    let pid = server.postmaster_pid().expect("the postmaster's pid");
    let pid = libc::pid_t::try_from(pid).expect("a pid_t");
    let resume = Resume(pid);
    // SAFETY: kill(2) on the postmaster this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0, "SIGSTOP");
    every_entry_point_times_out(&url, &format!("127.0.0.1:{}", server.port()));
    drop(resume);
    runtime().block_on(async {
        let (connected, _) = bounded("connect after SIGCONT", leasehold::aio::connect(&url)).await;
        connected.expect("the resumed server answers again");
    });
}

/// A URL that lists a host which accepts and never answers before a
/// running server (a hung old primary, then the new one) connects on both
/// faces, to the second host, once the first has used up its own
/// `connect_timeout`: each host has its own bound, as libpq gives it, and
/// running out of one passes the attempt on.
#[test]
fn a_host_that_never_answers_passes_the_attempt_to_the_next_on_both_faces() {
    let server = LocalPostgres::builder()
        .durable(false)
        .tcp(true)
        .start()
        .expect("a local server");
    let silent = leasehold_test_support::fault_proxy::silent_server();
    let direct = server.tcp_url_for("postgres").expect("a tcp server");
    let real = format!("@127.0.0.1:{}/", server.port());
    assert!(direct.contains(&real), "{direct}");
    let url = format!(
        "{}?connect_timeout=2",
        direct.replace(
            &real,
            &format!("@127.0.0.1:{silent},127.0.0.1:{}/", server.port())
        )
    );
    runtime().block_on(async {
        let (connected, took) = bounded("aio::connect", leasehold::aio::connect(&url)).await;
        let mut connection = connected.unwrap_or_else(|error| panic!("aio::connect: {error}"));
        assert_within_the_bound("aio::connect", took);
        use diesel_async::SimpleAsyncConnection;
        connection
            .batch_execute("SELECT 1")
            .await
            .expect("the second host answers");
        let (built, took) = bounded("build", AsyncLeaseClient::builder(&url).build()).await;
        built.unwrap_or_else(|error| panic!("build: {error}"));
        assert_within_the_bound("build", took);
    });
    let owned = url.clone();
    let (connected, took) = bounded_sync("LeaseClient::connect", move || {
        LeaseClient::connect(&owned, 1).map(drop)
    });
    connected.unwrap_or_else(|error| panic!("LeaseClient::connect: {error}"));
    assert_within_the_bound("LeaseClient::connect", took);
}

/// A loopback port that nobody listens on (bound, then closed).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("its address").port()
}

/// A refused connection says so, with the operating system's reason, on
/// every entry point of both faces, at once.
#[test]
fn a_refused_connection_reports_the_reason_on_both_faces() {
    let url = format!("postgres://nobody@127.0.0.1:{}/db", closed_port());
    let refused = |what: &str, message: &str| {
        assert!(
            message.contains("Connection refused"),
            "{what}: no reason in {message:?}"
        );
    };
    runtime().block_on(async {
        let (result, took) = bounded("build", AsyncLeaseClient::builder(&url).build()).await;
        match &result {
            Err(error) if is_connect(error) => {}
            other => panic!("build: expected Connect, got {other:?}"),
        }
        refused("build", &result_text(result));
        assert!(took < BELOW, "build: took {took:?}");

        let (result, _) = bounded("aio::connect", leasehold::aio::connect(&url)).await;
        let source = match result {
            Err(error) if is_connect(&error) => error,
            Err(other) => panic!("aio::connect: expected Driver, got {other:?}"),
            Ok(_) => panic!("aio::connect: connected to a closed port"),
        };
        refused("aio::connect", &source.to_string());
        let reason = std::error::Error::source(&source)
            .and_then(std::error::Error::source)
            .map(ToString::to_string)
            .unwrap_or_default();
        refused("aio::connect's source chain", &reason);

        let mut lazy = AsyncLeaseClient::builder(&url)
            .connect_lazily()
            .build()
            .await
            .expect("a lazy client builds without connecting");
        let (result, _) = bounded("a call through the pool", lazy.inspect("k")).await;
        match result {
            Err(error) if async_pool_error(&error).is_some() => refused(
                "a call through the pool",
                &async_pool_error(&error).unwrap().to_string(),
            ),
            other => panic!("a call through the pool: expected AsyncPool, got {other:?}"),
        }
    });
    let owned = url.clone();
    let (result, _) = bounded_sync("LeaseClient::connect", move || {
        LeaseClient::connect(&owned, 2).map(drop)
    });
    match result {
        Err(error) if is_connect(&error) => refused("LeaseClient::connect", &error.to_string()),
        other => panic!("LeaseClient::connect: expected Connect, got {other:?}"),
    }
}

/// A URL or credentials the server refuses is a configuration mistake:
/// both faces say `InvalidInput` (retrying unchanged fails again), with
/// the driver's reason, for a database that does not exist, a role that
/// does not exist and a malformed URL; a server that cannot be reached
/// stays `Unavailable` (the tests above).
#[test]
fn a_wrong_url_or_role_is_invalid_input_on_both_faces() {
    let db = leasehold_test_support::TestDb::new();
    let missing_database = db.url.replacen(&db.name, "no_such_database", 1);
    assert_ne!(missing_database, db.url);
    let missing_role = {
        // postgres://<user>@... becomes postgres://no_such_role@...
        let (scheme, rest) = db.url.split_once("://").unwrap();
        let (_, after_user) = rest.split_once('@').expect("a URL with a user");
        format!("{scheme}://no_such_role@{after_user}")
    };
    let malformed = format!(
        "{}&port=not_a_port",
        db.url.replace('?', "?sslmode=disable&")
    );
    for (what, url, reason) in [
        ("a missing database", missing_database, "does not exist"),
        ("a missing role", missing_role, "does not exist"),
        ("a malformed URL", malformed, "port"),
    ] {
        let sync_url = url.clone();
        let (sync, _) = bounded_sync(what, move || LeaseClient::connect(&sync_url, 1).map(drop));
        let error = sync.expect_err(what);
        assert_eq!(
            error.kind(),
            ErrorKind::InvalidInput,
            "sync, {what}: {error}"
        );
        assert!(error.to_string().contains(reason), "sync, {what}: {error}");

        let (tasks, _) = runtime().block_on(bounded(what, async {
            AsyncLeaseClient::connect(&url, 1).await.map(drop)
        }));
        let error = tasks.expect_err(what);
        assert_eq!(
            error.kind(),
            ErrorKind::InvalidInput,
            "async, {what}: {error}"
        );
    }
}

/// A refused password is a configuration mistake too: `InvalidInput` on
/// both faces, with the server's reason. The server asks TCP clients for a
/// SCRAM password (its own socket stays trusted, for this test's setup).
#[test]
fn a_refused_password_is_invalid_input_on_both_faces() {
    use diesel::connection::SimpleConnection;
    use diesel::Connection;
    let server = LocalPostgres::builder()
        .durable(false)
        .tcp(true)
        .start()
        .expect("a local server");
    std::fs::write(
        server.data_dir().join("pg_hba.conf"),
        "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n",
    )
    .expect("write pg_hba.conf");
    let mut admin = diesel::PgConnection::establish(&server.url()).expect("the admin's socket");
    admin
        .batch_execute(
            "SET password_encryption = 'scram-sha-256'; \
             CREATE ROLE app LOGIN PASSWORD 'the-right-one'; SELECT pg_reload_conf()",
        )
        .expect("a role with a password");
    let tcp = server.tcp_url_for("postgres").expect("a tcp server");
    let url_with = |password: &str| tcp.replacen("postgres@", &format!("app:{password}@"), 1);
    // The right password connects (so the refusal below is the password's).
    let right = url_with("the-right-one");
    let (connected, _) = bounded_sync("the right password", move || {
        LeaseClient::connect(&right, 1).map(drop)
    });
    connected.expect("the right password connects");
    let wrong = url_with("a-wrong-one");
    let sync_wrong = wrong.clone();
    let (refused, _) = bounded_sync("a wrong password", move || {
        LeaseClient::connect(&sync_wrong, 1).map(drop)
    });
    let error = refused.expect_err("a wrong password");
    assert_eq!(error.kind(), ErrorKind::InvalidInput, "sync: {error}");
    assert!(
        error.to_string().contains("password authentication failed"),
        "sync: {error}"
    );
    let (refused, _) = runtime().block_on(bounded("a wrong password, async", async {
        AsyncLeaseClient::connect(&wrong, 1).await.map(drop)
    }));
    let error = refused.expect_err("a wrong password, async");
    assert_eq!(error.kind(), ErrorKind::InvalidInput, "async: {error}");
}
