//! The async face's own tests (feature `async`): its futures are `Send`
//! (tasks that `tokio::spawn` hold them), its pooled client's builder and
//! checkout, connections found dead discarded, and calls inside the
//! caller's own diesel-async transaction. What the two faces share is
//! tested once for both in `faces/`.

use std::time::Duration;

use crate::aio_common::runtime;
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use leasehold::aio::AsyncFencing;
use leasehold::aio::AsyncOperator;
use leasehold::aio::{AsyncLeaseClient, AsyncLeases};
use leasehold::guard::Check;
use leasehold::{Acquisition, ErrorKind, LeaseError, Release};
use leasehold_test_support::{query_bool, TestDb};

const TTL: Duration = Duration::from_secs(30);

/// Every call's future may be held by a spawned task (it is `Send`), on
/// the client and on a connection: sixteen tasks share a pool of four.
#[test]
fn the_futures_are_send_and_tasks_share_one_pool() {
    let db = TestDb::new();
    runtime().block_on(async {
        let client = AsyncLeaseClient::builder(&db.url)
            .max_size(4)
            .build()
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for n in 0..16 {
            let mut client = client.clone();
            tasks.push(tokio::spawn(async move {
                let key = format!("job-{n}");
                let lease = client
                    .acquire(&key, "w", TTL)
                    .await
                    .unwrap()
                    .granted()
                    .unwrap();
                assert!(matches!(
                    client.renew(&lease, TTL).await.unwrap(),
                    leasehold::Renewal::Renewed { .. }
                ));
                client
                    .admit(&format!("out-{n}"), &lease, Check::Token)
                    .await
                    .unwrap();
                client
                    .run_fenced(
                        &format!("out-{n}"),
                        &lease,
                        Check::LeaseHeld,
                        async |conn: &mut AsyncPgConnection| conn.batch_execute("SELECT 1").await,
                    )
                    .await
                    .unwrap();
                client
                    .renew_many(std::slice::from_ref(&lease), TTL)
                    .await
                    .unwrap();
                assert_eq!(client.release(&lease).await.unwrap(), Release::Released);
                lease.epoch().get()
            }));
        }
        for task in tasks {
            assert_eq!(task.await.unwrap(), 1);
        }
        let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
        let on_conn = tokio::spawn(async move {
            let lease = conn
                .acquire("job-0", "v", TTL)
                .await
                .unwrap()
                .granted()
                .unwrap();
            conn.release(&lease).await.unwrap()
        });
        assert_eq!(on_conn.await.unwrap(), Release::Released);
    });
}

/// Every method's future is `Send`, on both receivers: a compile-time
/// proof (`send` takes only `Send` futures), run on real receivers; the
/// futures are made and dropped unpolled, which sends nothing.
#[test]
fn every_methods_future_is_send_on_both_receivers() {
    fn send<F: std::future::Future + Send>(_future: F) {}
    let db = TestDb::new();
    runtime().block_on(async {
        let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
        let mut client = AsyncLeaseClient::builder(&db.url).build().await.unwrap();
        let lease = client
            .acquire("k", "a", TTL)
            .await
            .unwrap()
            .granted()
            .unwrap();
        let tokens = vec![lease.token().clone()];
        let group = leasehold::batch::GroupId::from_raw(1);
        let filter = leasehold::admin::ListFilter::new();
        let prune = leasehold::admin::PruneOptions::new(TTL);
        let epoch = leasehold::Epoch::new(1);
        macro_rules! every_method {
            ($leases:expr) => {
                send($leases.acquire("k", "a", TTL));
                send($leases.acquire_waiting("k", "a", TTL, TTL));
                send($leases.renew(&lease, TTL));
                send($leases.release(&lease));
                send($leases.inspect("k"));
                send($leases.renew_many(&tokens, TTL));
                send($leases.release_many(&tokens));
                send($leases.join_group(&tokens, TTL));
                send($leases.renew_group(group, "a", TTL));
                send($leases.admit("r", &lease, Check::Token));
                send($leases.check_held(&lease));
                send($leases.admit("r", &lease, Check::LeaseHeld));
                send($leases.admit("r", &lease, Check::RenewAndAdmit(TTL)));
                send($leases.fence("r", "k", epoch));
                send($leases.inspect_guard("r"));
                send($leases.run_fenced(
                    "r",
                    &lease,
                    Check::Token,
                    async |conn: &mut AsyncPgConnection| conn.batch_execute("SELECT 1").await,
                ));
                send($leases.bind_namespace("p/", "postgres"));
                send($leases.unbind_namespace("p/"));
                send($leases.list_namespaces());
                send($leases.force_release("k"));
                send($leases.force_release_epoch("k", epoch));
                send($leases.generation());
                send($leases.raise_generation(1));
                send($leases.prune(&prune));
                send($leases.list_leases(&filter));
            };
        }
        every_method!(conn);
        every_method!(client);
        send(leasehold::aio::function_privilege(
            &mut conn,
            "lease.fence(text, text, bigint)",
        ));
        // Nothing was sent: the key is still held by the grant above.
        assert_eq!(
            client.inspect("k").await.unwrap().unwrap().epoch(),
            lease.epoch()
        );
    });
}

/// A URL naming a database that does not exist fails at build with the
/// driver's whole message, as a configuration mistake (`InvalidInput`: a
/// retry fails again); a lazily built client fails at its first call
/// instead, with the pool's.
#[test]
fn a_url_that_cannot_connect_fails_at_build_or_lazily_at_the_first_call() {
    let db = TestDb::new();
    let wrong = db.url.replace(&db.name, "no_such_database");
    runtime().block_on(async {
        match AsyncLeaseClient::builder(&wrong).build().await {
            Err(error)
                if error.kind() == ErrorKind::InvalidInput
                    && error
                        .to_string()
                        .starts_with("cannot connect to the database") =>
            {
                assert!(error.to_string().contains("no_such_database"), "{error}")
            }
            other => panic!("expected Connect, got {other:?}"),
        }
        let mut lazy = AsyncLeaseClient::builder(&wrong)
            .connect_lazily()
            .checkout_timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap();
        match lazy.acquire("k", "a", TTL).await {
            Err(error)
                if error.kind() == ErrorKind::InvalidInput
                    && async_pool_error(&error).is_some() =>
            {
                let error = async_pool_error(&error).unwrap();
                assert!(error.to_string().contains("no_such_database"), "{error}")
            }
            other => panic!("expected AsyncPool, got {other:?}"),
        }
    });
}

/// The async pool's own error, if `error` is a failed checkout from it.
fn async_pool_error(
    error: &LeaseError,
) -> Option<&diesel_async::pooled_connection::deadpool::PoolError> {
    if error.operation().is_some()
        || !error
            .to_string()
            .starts_with("no database connection available from the pool")
    {
        return None;
    }
    std::error::Error::source(error)?.downcast_ref()
}

/// Waits until `sql` (a flag) holds, on the server's observable state.
fn wait_for(admin: &mut diesel::PgConnection, sql: &str) {
    for _ in 0..4_000 {
        if query_bool(admin, sql) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("never observed: {sql}");
}

/// A pooled session that ends while a call runs fails that call as
/// `OutcomeUnknown` (the sync client's answer) and is discarded: with one
/// connection in the pool, the next call runs on a new session.
#[test]
fn a_session_lost_mid_call_fails_that_call_and_the_next_call_reconnects() {
    let db = TestDb::new();
    runtime().block_on(async {
        let mut client = AsyncLeaseClient::builder(&db.url).max_size(1).build().await.unwrap();
        client.acquire("k", "a", TTL).await.unwrap().granted().unwrap();
        let mut waiter = client.clone();
        let waiting = tokio::spawn(async move {
            waiter.acquire_waiting("k", "b", TTL, Duration::from_secs(60)).await
        });
        let mut admin = db.conn();
        let busy = "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
                    AND state = 'active' AND query LIKE '%lease.acquire%' AND pid <> pg_backend_pid()) AS flag";
        wait_for(&mut admin, busy);
        assert!(query_bool(
            &mut admin,
            "SELECT bool_and(pg_terminate_backend(pid)) AS flag FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ));
        match waiting.await.unwrap() {
            Err(error) if error.kind() == ErrorKind::OutcomeUnknown => {}
            other => panic!("expected OutcomeUnknown, got {other:?}"),
        }
        match client.inspect("k").await.unwrap() {
            Some(leasehold::LeaseState::Held { owner, .. }) => assert_eq!(owner, "a"),
            other => panic!("expected held by a, got {other:?}"),
        }
    });
}

/// A pooled session that ended while idle is never handed out again: the
/// call that finds it dead fails (or the pool saw it closed first and the
/// call runs on a new session), and the next call runs on a new session.
#[test]
fn a_session_that_died_idle_is_not_handed_out_again() {
    let db = TestDb::new();
    runtime().block_on(async {
        let mut client = AsyncLeaseClient::builder(&db.url)
            .max_size(1)
            .build()
            .await
            .unwrap();
        let lease = client
            .acquire("k", "a", TTL)
            .await
            .unwrap()
            .granted()
            .unwrap();
        let mut admin = db.conn();
        assert!(query_bool(
            &mut admin,
            "SELECT bool_and(pg_terminate_backend(pid)) AS flag FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ));
        // pg_terminate_backend only signals: wait until the session is gone.
        wait_for(
            &mut admin,
            "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()) AS flag",
        );
        match client.renew(&lease, TTL).await {
            Ok(leasehold::Renewal::Renewed { .. }) => {}
            Err(error) if error.kind() == ErrorKind::OutcomeUnknown => {}
            other => panic!("expected renewed or OutcomeUnknown, got {other:?}"),
        }
        assert!(matches!(
            client.renew(&lease, TTL).await,
            Ok(leasehold::Renewal::Renewed { .. })
        ));
    });
}

/// Calls on the caller's connection run in the caller's own diesel-async
/// transaction: a grant and a guard admission roll back with it.
#[test]
fn calls_roll_back_with_the_callers_async_transaction() {
    let db = TestDb::new();
    runtime().block_on(async {
        let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
        let outcome = conn
            .transaction::<(), diesel::result::Error, _>(async |conn| {
                let lease = conn.acquire("k", "a", TTL).await.unwrap().granted().unwrap();
                conn.admit("r", &lease, Check::Token).await.unwrap();
                conn.batch_execute("CREATE TABLE out (v int)").await?;
                Err(diesel::result::Error::RollbackTransaction)
            })
            .await;
        assert!(matches!(outcome, Err(diesel::result::Error::RollbackTransaction)));
        assert_eq!(conn.inspect("k").await.unwrap(), None);
        assert_eq!(conn.inspect_guard("r").await.unwrap(), None);
        assert!(matches!(conn.acquire("k", "b", TTL).await.unwrap(), Acquisition::Granted(lease) if lease.epoch() == 1));
    });
}
