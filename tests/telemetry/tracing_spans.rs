//! Spans and events: a span per lease and guard call with its owner,
//! epoch, outcome and duration; events for a keeper's loss, a waiter's
//! wake-up and the listener's state; key and resource names only when the
//! application opted in.

use std::convert::Infallible;
use std::time::Duration;

use diesel::PgConnection;
use leasehold::{
    guard::{Check, FencedError},
    telemetry::TraceKeys,
    wait::{LeaseWaiter, Wait},
    Acquisition, ErrorKind, FencingToken, Keeper, Lease, Leases, Refusal, Release,
};
use leasehold_test_support::TestDb;
use tracing::Level;

use crate::capture::Captured;
use crate::{exclusive, wait_for};
use leasehold::guard::Fencing;

const TTL: Duration = Duration::from_secs(30);
const KEY: &str = "customer-4711-invoice";
const RESOURCE: &str = "ledger-of-customer-4711";

fn granted(acquisition: Acquisition) -> Lease {
    acquisition.granted().expect("expected a grant")
}

/// A fenced write of nothing to [`RESOURCE`].
fn write(conn: &mut PgConnection, token: &FencingToken) -> Result<(), FencedError<Infallible>> {
    conn.run_fenced(RESOURCE, token, Check::Token, |_| Ok(()))
}

fn the_span<'a>(spans: &'a [Captured], name: &str, operation: &str) -> &'a Captured {
    let found: Vec<&Captured> = spans
        .iter()
        .filter(|span| span.name == name && span.field("operation") == Some(operation))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one {name} span for {operation}: {spans:#?}"
    );
    found[0]
}

/// Restores the default when a test ends, however it ends.
struct KeysRecorded;

impl KeysRecorded {
    fn on() -> KeysRecorded {
        leasehold::telemetry::set_trace_keys(TraceKeys::Recorded);
        KeysRecorded
    }
}

impl Drop for KeysRecorded {
    fn drop(&mut self) {
        leasehold::telemetry::set_trace_keys(TraceKeys::Hidden);
    }
}

#[test]
fn lease_and_guard_calls_are_spans_without_key_names_by_default() {
    let (_serial, installed) = exclusive();
    let capture = &installed.spans;
    assert_eq!(leasehold::telemetry::trace_keys(), TraceKeys::Hidden);
    let db = TestDb::new();
    let mut conn = db.conn();

    let lease = granted(conn.acquire(KEY, "worker-1", TTL).expect("acquire"));
    write(&mut conn, lease.token()).expect("admit");
    assert_eq!(
        conn.release(&leasehold_test_support::grant(
            KEY,
            "worker-1",
            lease.epoch()
        ))
        .expect("release"),
        Release::Released
    );
    let next = granted(conn.acquire(KEY, "worker-2", TTL).expect("acquire"));
    write(&mut conn, next.token()).expect("admit");
    let refused = write(&mut conn, lease.token()).expect_err("the older epoch is stale");
    assert!(matches!(
        refused,
        FencedError::Guard(ref e) if e.kind() == ErrorKind::Fenced
            && matches!(e.refusal(), Some(Refusal::StaleEpoch { .. }))
    ));
    let invalid = conn.acquire("", "worker-1", TTL).expect_err("empty key");
    assert!(invalid.kind() == ErrorKind::InvalidInput && !invalid.violations().is_empty());

    let spans = capture.spans();
    let acquire = spans
        .iter()
        .find(|span| span.name == "lease" && span.field("outcome") == Some("granted"))
        .expect("the grant's span");
    assert_eq!(acquire.target, "leasehold::lease");
    assert_eq!(acquire.level, Level::DEBUG);
    assert_eq!(acquire.field("operation"), Some("acquire"));
    assert_eq!(acquire.field("owner"), Some("worker-1"));
    assert_eq!(
        acquire.field("epoch"),
        Some(lease.epoch().to_string().as_str())
    );
    let micros: u64 = acquire
        .field("duration_us")
        .expect("a duration")
        .parse()
        .expect("whole microseconds");
    assert!(micros > 0);
    assert!(spans
        .iter()
        .any(|span| span.name == "lease" && span.field("outcome") == Some("invalid")));

    let admits: Vec<&Captured> = spans.iter().filter(|span| span.name == "guard").collect();
    let outcomes: Vec<Option<&str>> = admits.iter().map(|span| span.field("outcome")).collect();
    assert_eq!(
        outcomes,
        [Some("admitted"), Some("admitted"), Some("stale_epoch")]
    );
    assert_eq!(
        admits[2].field("epoch"),
        Some(lease.epoch().to_string().as_str())
    );
    assert_eq!(admits[2].field("owner"), Some("worker-1"));
    assert!(admits
        .iter()
        .all(|span| span.field("operation") == Some("admit")));

    // Neither the key nor the resource was recorded anywhere.
    for span in spans
        .iter()
        .filter(|span| span.target.starts_with("leasehold"))
    {
        assert_eq!(span.field("key"), None, "{span:?}");
        assert_eq!(span.field("resource"), None, "{span:?}");
    }
    let text = capture.all_text();
    assert!(!text.contains("customer-4711"), "a name leaked: {text}");

    // Opted in, the same calls carry them.
    let _recorded = KeysRecorded::on();
    capture.clear();
    let again = conn.acquire(KEY, "worker-2", TTL).expect("acquire");
    assert_eq!(again, Acquisition::Granted(next.clone()));
    write(&mut conn, next.token()).expect("admit");
    let spans = capture.spans();
    let acquire = the_span(&spans, "lease", "acquire");
    assert_eq!(acquire.field("key"), Some(KEY));
    let admit = the_span(&spans, "guard", "admit");
    assert_eq!(admit.field("key"), Some(KEY));
    assert_eq!(admit.field("resource"), Some(RESOURCE));
}

#[test]
fn a_keepers_loss_is_a_warning_event() {
    let (_serial, installed) = exclusive();
    let capture = &installed.spans;
    let db = TestDb::new();
    let mut client = leasehold::LeaseClient::connect(&db.url, 2).expect("pool");
    let lease = client
        .acquire(KEY, "worker-1", TTL)
        .expect("acquire")
        .granted()
        .expect("granted");
    let keeper = Keeper::builder(&client, lease.clone())
        .ttl(Duration::from_secs(3))
        .renew_every(Duration::from_millis(300))
        .start()
        .expect("keeper");
    assert_eq!(client.release(&lease).expect("release"), Release::Released);
    keeper
        .wait_for_loss(Duration::from_secs(30))
        .expect("the keeper notices");
    assert_eq!(
        keeper.stop().expect("stop"),
        Release::Refused(Refusal::Released),
        "a lost lease is not released again"
    );

    let lost: Vec<Captured> = capture
        .events()
        .into_iter()
        .filter(|event| event.target == "leasehold::keeper")
        .collect();
    assert_eq!(lost.len(), 1, "{lost:#?}");
    let lost = &lost[0];
    assert_eq!(lost.level, Level::WARN);
    assert_eq!(lost.field("reason"), Some("released"));
    assert_eq!(lost.field("owner"), Some("worker-1"));
    assert_eq!(
        lost.field("epoch"),
        Some(lease.epoch().to_string().as_str())
    );
    assert_eq!(lost.field("key"), None);
    assert!(!capture.all_text().contains("customer-4711"));
}

#[test]
fn the_listener_and_the_waiters_wake_ups_are_events() {
    let (_serial, installed) = exclusive();
    let capture = &installed.spans;
    let _recorded = KeysRecorded::on();
    let db = TestDb::new();
    let mut client = leasehold::LeaseClient::connect(&db.url, 2).expect("pool");
    let waiter = LeaseWaiter::new(&client);
    assert!(waiter.wait_until_listening(Duration::from_secs(30)));
    let listener_events = || -> Vec<Captured> {
        capture
            .events()
            .into_iter()
            .filter(|event| event.target == "leasehold::listener")
            .collect()
    };
    let up = listener_events();
    assert_eq!(up.len(), 1, "{up:#?}");
    assert_eq!(up[0].level, Level::INFO);
    assert!(up[0].field("backend_pid").is_some());

    let holder = client
        .acquire(KEY, "worker-1", TTL)
        .expect("acquire")
        .granted()
        .expect("granted");
    let blocked = {
        let waiter = waiter.clone();
        std::thread::spawn(move || {
            waiter.acquire(KEY, "worker-2", TTL, Wait::AtMost(Duration::from_secs(60)))
        })
    };
    wait_for("the waiter to sleep armed", || {
        waiter.armed_waiters(KEY) == 1
    });
    let woken_before = capture
        .events()
        .iter()
        .filter(|event| event.target == "leasehold::waiter")
        .count();
    assert_eq!(client.release(&holder).expect("release"), Release::Released);
    let lease = blocked.join().expect("waiter thread").expect("granted");
    let woken: Vec<Captured> = capture
        .events()
        .into_iter()
        .filter(|event| event.target == "leasehold::waiter")
        .skip(woken_before)
        .collect();
    assert_eq!(woken.len(), 1, "{woken:#?}");
    assert_eq!(woken[0].field("cause"), Some("listener"));
    let wait = capture
        .spans()
        .into_iter()
        .find(|span| span.name == "lease_wait")
        .expect("the wait's span");
    assert_eq!(wait.field("key"), Some(KEY));
    assert_eq!(wait.field("owner"), Some("worker-2"));
    assert_eq!(wait.field("outcome"), Some("granted"));
    assert_eq!(
        wait.field("epoch"),
        Some(lease.epoch().to_string().as_str())
    );

    drop(waiter);
    wait_for("the listener to stop", || listener_events().len() == 2);
    assert_eq!(
        listener_events()[1].field("message"),
        Some("waiters' listener stopped")
    );
}
