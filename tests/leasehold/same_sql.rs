//! One SQL source: every operation, run on the sync face and on the async
//! face against a real server, sends the same statements (text and bind
//! values, so the bind count too), in the same order. Each face records
//! what its connection sends through diesel's `Instrumentation`, which
//! both `PgConnection` and `AsyncPgConnection` report to; each face runs
//! the same script on a fresh database of its own, so every answer (epochs,
//! group ids, pruning cursors) and so every bind is the same when the
//! faces are, but for group ids, which the server draws at random and
//! which both faces' binds carry as `<group id>`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::connection::{Instrumentation, InstrumentationEvent};
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use leasehold::admin::Operator;
use leasehold::admin::{ListFilter, PruneOptions};
use leasehold::aio::AsyncFencing;
use leasehold::aio::AsyncLeases;
use leasehold::aio::AsyncOperator;
use leasehold::guard::Check;
use leasehold::guard::Fencing;
use leasehold::{Epoch, Leases};
use leasehold_test_support::TestDb;

/// What a connection sent: each statement with its binds, after a marker
/// line naming the operation that sent it.
#[derive(Clone, Default)]
struct Sent(
    Arc<Mutex<Vec<String>>>,
    Arc<Mutex<Vec<(String, &'static str)>>>,
);

impl Sent {
    fn mark(&self, operation: &str) {
        self.0.lock().unwrap().push(format!("== {operation}"));
    }
    /// A value the server chose at random (a group id), which each face's
    /// binds carry as `name` instead.
    fn alias(&self, value: String, name: &'static str) {
        self.1.lock().unwrap().push((value, name));
    }
    fn lines(&self) -> Vec<String> {
        let aliases = self.1.lock().unwrap().clone();
        let mut lines = self.0.lock().unwrap().clone();
        for line in &mut lines {
            for (value, name) in &aliases {
                *line = line.replace(value.as_str(), name);
            }
        }
        lines
    }
    fn recorder(&self) -> impl Instrumentation {
        let sent = self.clone();
        move |event: InstrumentationEvent<'_>| {
            if let InstrumentationEvent::StartQuery { query, .. } = event {
                sent.0.lock().unwrap().push(query.to_string());
            }
        }
    }
}

const TTL: Duration = Duration::from_secs(30);

/// Every operation of the API, in an order where each finds what it needs.
/// `$call!(name, expression)` runs one; `$conn` is the face's connection.
macro_rules! script {
    ($sent:expr, $run:ident) => {{
        let sent = &$sent;
        sent.mark("acquire");
        let lease = $run!(acquire("k", "a", TTL)).unwrap().granted().unwrap();
        sent.mark("acquire_waiting");
        let other = $run!(acquire_waiting("k2", "a", TTL, Duration::from_millis(100))).unwrap();
        sent.mark("renew");
        let _ = $run!(renew(&lease, TTL)).unwrap();
        sent.mark("inspect");
        $run!(inspect("k")).unwrap();
        sent.mark("renew_many");
        let both = vec![lease.token().clone(), other.token().clone()];
        let _ = $run!(renew_many(&both, TTL)).unwrap();
        sent.mark("join_group");
        let group = $run!(join_group(&both, TTL)).unwrap().group.unwrap();
        sent.alias(group.get().to_string(), "<group id>");
        sent.mark("renew_group");
        let _ = $run!(renew_group(group, "a", TTL)).unwrap();
        sent.mark("admit");
        $run!(admit("r", &lease, Check::Token)).unwrap();
        sent.mark("check_held");
        $run!(check_held(&lease)).unwrap();
        sent.mark("admit_held");
        $run!(admit("r", &lease, Check::LeaseHeld)).unwrap();
        sent.mark("renew_and_admit");
        $run!(admit("r", &lease, Check::RenewAndAdmit(TTL))).unwrap();
        sent.mark("inspect_guard");
        $run!(inspect_guard("r")).unwrap();
        sent.mark("bind_namespace");
        $run!(bind_namespace("ns/", "postgres")).unwrap();
        sent.mark("list_namespaces");
        $run!(list_namespaces()).unwrap();
        sent.mark("unbind_namespace");
        $run!(unbind_namespace("ns/")).unwrap();
        sent.mark("list_leases");
        $run!(list_leases(&ListFilter::new().prefix("k"))).unwrap();
        sent.mark("generation");
        let generation = $run!(generation()).unwrap();
        sent.mark("raise_generation");
        $run!(raise_generation(generation.generation + 1)).unwrap();
        sent.mark("release_many");
        let _ = $run!(release_many(&[other.token().clone()])).unwrap();
        sent.mark("release");
        let _ = $run!(release(&lease)).unwrap();
        sent.mark("force_release");
        $run!(force_release("k")).unwrap();
        sent.mark("force_release_epoch");
        let _ = $run!(force_release_epoch("k2", Epoch::new(1))).unwrap();
        sent.mark("fence");
        $run!(fence("r", "k", Epoch::new(1))).unwrap();
        sent.mark("prune");
        $run!(prune(&PruneOptions {
            batch: 1,
            ..PruneOptions::new(Duration::from_secs(3600))
        }))
        .unwrap();
        sent.mark("acquire refused before the call");
        $run!(acquire("nul\0", "a", TTL)).unwrap_err();
        sent.mark("acquire refused by the server");
        $run!(acquire("", "a", TTL)).unwrap_err();
    }};
}

fn sync_face(db: &TestDb) -> Vec<String> {
    let sent = Sent::default();
    let mut conn = PgConnection::establish(&db.url).unwrap();
    conn.set_instrumentation(sent.recorder());
    macro_rules! run {
        ($method:ident($($arg:expr),*)) => { conn.$method($($arg),*) };
    }
    script!(sent, run);
    // A guard admits only a key's newest grant: a grant of its own.
    let fenced = Leases::acquire(&mut conn, "fenced", "a", TTL).unwrap();
    sent.mark("run_fenced");
    conn.run_fenced(
        "fenced-resource",
        fenced.granted().expect("a grant of a new key").token(),
        Check::Token,
        |conn| diesel::connection::SimpleConnection::batch_execute(conn, "SELECT 1"),
    )
    .map(drop)
    .unwrap_or_else(|error| panic!("sync run_fenced: {error:?}"));
    sent.mark("function_privilege");
    leasehold::admin::function_privilege(&mut conn, "lease.fence(text, text, bigint)").unwrap();
    sent.lines()
}

async fn async_face(db: &TestDb) -> Vec<String> {
    let sent = Sent::default();
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    conn.set_instrumentation(sent.recorder());
    macro_rules! run {
        ($method:ident($($arg:expr),*)) => { conn.$method($($arg),*).await };
    }
    script!(sent, run);
    // A guard admits only a key's newest grant: a grant of its own.
    let fenced = AsyncLeases::acquire(&mut conn, "fenced", "a", TTL)
        .await
        .unwrap();
    sent.mark("run_fenced");
    conn.run_fenced(
        "fenced-resource",
        fenced.granted().expect("a grant of a new key").token(),
        Check::Token,
        async |conn: &mut AsyncPgConnection| conn.batch_execute("SELECT 1").await,
    )
    .await
    .map(drop)
    .unwrap_or_else(|error| panic!("async run_fenced: {error:?}"));
    sent.mark("function_privilege");
    leasehold::aio::function_privilege(&mut conn, "lease.fence(text, text, bigint)")
        .await
        .unwrap();
    sent.lines()
}

#[test]
fn both_faces_send_the_same_sql_for_every_operation() {
    let sync_sent = sync_face(&TestDb::new());
    let async_sent = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async_face(&TestDb::new()));
    // Every operation sent something, and every operation was run.
    let operations = sync_sent
        .iter()
        .filter(|line| line.starts_with("== "))
        .count();
    assert_eq!(operations, 28, "{sync_sent:#?}");
    for (at, (sync_line, async_line)) in sync_sent.iter().zip(&async_sent).enumerate() {
        assert_eq!(
            sync_line,
            async_line,
            "statement {at} differs between the faces (after {:?})",
            sync_sent[..at]
                .iter()
                .rev()
                .find(|line| line.starts_with("== "))
        );
    }
    assert_eq!(
        sync_sent.len(),
        async_sent.len(),
        "one face sent more: {sync_sent:#?} {async_sent:#?}"
    );
    // The comparison would see a difference: the script sends binds.
    assert!(
        sync_sent
            .iter()
            .any(|line| line.contains("lease.acquire") && line.contains("binds")),
        "{sync_sent:#?}"
    );
}
