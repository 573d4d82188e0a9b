//! The scripted scenario of issue 16: a grant, a denial, guard refusals, a
//! keeper's loss and a waiter's wake-up, with the exact counters each one
//! moves.

use leasehold::Leases;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold::{
    error::LeaseError,
    guard::{Check, FencedError},
    hold::{KeeperEvent, KeeperSet, LeaseLoss},
    wait::{LeaseWaiter, Wait},
    Acquisition, ErrorKind, Keeper, LeaseClient, Refusal, Release,
};
use leasehold_test_support::TestDb;

use crate::{exclusive, wait_for};
use leasehold::guard::Fencing;

const TTL: Duration = Duration::from_secs(30);

fn granted(acquisition: Acquisition) -> leasehold::Lease {
    acquisition.granted().expect("expected a grant")
}

fn guard_refusal(result: Result<(), FencedError<std::convert::Infallible>>) -> LeaseError {
    match result {
        Err(FencedError::Guard(error)) => error,
        other => panic!("expected a guard refusal, got {other:?}"),
    }
}

#[test]
fn a_scripted_scenario_moves_exactly_its_counters() {
    let (_serial, installed) = exclusive();
    let recorder = installed.metrics;
    let db = TestDb::new();
    let mut client = LeaseClient::connect(&db.url, 4).expect("pool");

    // Grant, then denial.
    let first = granted(client.acquire("job", "worker-1", TTL).expect("acquire"));
    assert_eq!(
        client.acquire("job", "worker-2", TTL).expect("acquire"),
        Acquisition::Denied
    );

    // The first holder writes, releases; the second takes over and writes.
    let mut writer = client.clone();
    let mut write = |token: &leasehold::FencingToken, check: Check| {
        writer.run_fenced("report", token, check, |_| {
            Ok::<(), std::convert::Infallible>(())
        })
    };
    write(first.token(), Check::Token).expect("first holder writes");
    assert_eq!(client.release(&first).expect("release"), Release::Released);
    let second = granted(client.acquire("job", "worker-2", TTL).expect("acquire"));
    write(second.token(), Check::Token).expect("second holder writes");

    // Refusals: the first holder's token is stale, and its lease not held.
    let stale = guard_refusal(write(first.token(), Check::Token));
    assert!(
        stale.kind() == ErrorKind::Fenced
            && matches!(stale.refusal(), Some(Refusal::StaleEpoch { .. }))
    );
    let not_held = guard_refusal(write(first.token(), Check::LeaseHeld));
    assert!(
        not_held.kind() == ErrorKind::Fenced
            && not_held.table().is_none()
            && not_held.owner().is_some()
            && not_held.refusal().is_some()
    );

    // Loss: the second holder's keeper finds its grant released.
    let renewed = Arc::new(AtomicU64::new(0));
    let keeper = {
        let renewed = renewed.clone();
        Keeper::builder(&client, second.clone())
            .ttl(Duration::from_secs(3))
            .renew_every(Duration::from_millis(300))
            .on_event(move |event| {
                if let KeeperEvent::Renewed { .. } = event {
                    renewed.fetch_add(1, Ordering::SeqCst);
                }
            })
            .start()
            .expect("keeper")
    };
    assert_eq!(client.release(&second).expect("release"), Release::Released);
    let loss = keeper
        .wait_for_loss(Duration::from_secs(30))
        .expect("the keeper notices");
    assert!(matches!(loss, LeaseLoss::Refused(Refusal::Released)));
    assert_eq!(
        keeper.stop().expect("stop"),
        Release::Refused(Refusal::Released),
        "a lost lease is not released again"
    );
    // Each successful renew the keeper reported was counted, and nothing
    // else: its renews are the only ones in the scenario.
    let renews = renewed.load(Ordering::SeqCst);
    assert!(renews >= 1, "the keeper renews once before start returns");

    let expected: BTreeMap<String, u64> = [
        ("leasehold_acquire_total{outcome=denied}", 1),
        ("leasehold_acquire_total{outcome=granted}", 2),
        ("leasehold_calls_total{operation=acquire,outcome=denied}", 1),
        (
            "leasehold_calls_total{operation=acquire,outcome=granted}",
            2,
        ),
        ("leasehold_calls_total{operation=admit,outcome=admitted}", 2),
        (
            "leasehold_calls_total{operation=admit,outcome=stale_epoch}",
            1,
        ),
        (
            "leasehold_calls_total{operation=admit_held,outcome=lease_not_held}",
            1,
        ),
        (
            "leasehold_calls_total{operation=release,outcome=released}",
            2,
        ),
        (
            "leasehold_calls_total{operation=renew,outcome=not_owner}",
            1,
        ),
        (
            "leasehold_calls_total{operation=renew,outcome=renewed}",
            renews,
        ),
        ("leasehold_guard_refused_total{kind=lease_not_held}", 1),
        ("leasehold_guard_refused_total{kind=stale_epoch}", 1),
        ("leasehold_lease_lost_total{reason=released}", 1),
    ]
    .into_iter()
    .map(|(series, value)| (series.to_owned(), value))
    .collect();
    assert_eq!(recorder.counters(), expected);
    let durations: BTreeMap<String, usize> = [
        ("leasehold_call_duration_seconds{operation=acquire}", 3),
        ("leasehold_call_duration_seconds{operation=admit}", 3),
        ("leasehold_call_duration_seconds{operation=admit_held}", 1),
        ("leasehold_call_duration_seconds{operation=release}", 2),
        (
            "leasehold_call_duration_seconds{operation=renew}",
            renews as usize + 1,
        ),
    ]
    .into_iter()
    .map(|(series, count)| (series.to_owned(), count))
    .collect();
    assert_eq!(recorder.histogram_counts(), durations);
    assert!(recorder
        .samples("leasehold_call_duration_seconds{operation=acquire}")
        .iter()
        .all(|seconds| *seconds > 0.0 && *seconds < 30.0));

    // Wake-up: a waiter blocked on a held key is woken by its release.
    let waiter = LeaseWaiter::new(&client);
    assert!(waiter.wait_until_listening(Duration::from_secs(30)));
    assert_eq!(recorder.gauge("leasehold_listener_up"), 1.0);
    let holder = granted(client.acquire("queue", "worker-1", TTL).expect("acquire"));
    let blocked = {
        let waiter = waiter.clone();
        std::thread::spawn(move || {
            waiter.acquire(
                "queue",
                "worker-2",
                TTL,
                Wait::AtMost(Duration::from_secs(60)),
            )
        })
    };
    wait_for("the waiter to sleep armed", || {
        waiter.armed_waiters("queue") == 1
    });
    let before = recorder.counters();
    assert_eq!(client.release(&holder).expect("release"), Release::Released);
    let lease = blocked
        .join()
        .expect("waiter thread")
        .expect("woken and granted");
    assert_eq!(lease.owner(), "worker-2");
    let after = recorder.counters();
    let moved: BTreeMap<&str, u64> = after
        .iter()
        .filter_map(|(series, value)| {
            let delta = value - before.get(series).copied().unwrap_or(0);
            (delta > 0).then_some((series.as_str(), delta))
        })
        .collect();
    assert_eq!(
        moved,
        BTreeMap::from([
            ("leasehold_acquire_total{outcome=granted}", 1),
            (
                "leasehold_calls_total{operation=acquire,outcome=granted}",
                1
            ),
            (
                "leasehold_calls_total{operation=release,outcome=released}",
                1
            ),
            ("leasehold_waiter_wakeups_total{cause=listener}", 1),
        ])
    );
    assert_eq!(
        recorder
            .samples("leasehold_wait_duration_seconds{outcome=granted}")
            .len(),
        1
    );

    // The listener stops with its last waiter, and says so.
    drop(waiter);
    wait_for("the listener to stop", || {
        recorder.gauge("leasehold_listener_up") == 0.0
    });
}

#[test]
fn a_keeper_sets_loss_of_one_key_counts_one_lost_lease() {
    let (_serial, installed) = exclusive();
    let recorder = installed.metrics;
    let db = TestDb::new();
    let mut client = LeaseClient::connect(&db.url, 4).expect("pool");
    let leases: Vec<leasehold::Lease> = ["shard-1", "shard-2", "shard-3"]
        .into_iter()
        .map(|key| granted(client.acquire(key, "worker-1", TTL).expect("acquire")))
        .collect();
    let set = KeeperSet::builder(&client, leases.clone())
        .ttl(Duration::from_secs(3))
        .renew_every(Duration::from_millis(300))
        .start()
        .expect("keeper set");
    let before = recorder.counter("leasehold_lease_lost_total{reason=released}");
    let lost = &leases[1];
    assert_eq!(client.release(&lost).expect("release"), Release::Released);
    let losses = set.wait_for_losses(1, Duration::from_secs(30));
    assert_eq!(losses.len(), 1, "{losses:?}");
    assert_eq!(losses[0].0, "shard-2");
    assert_eq!(
        recorder.counter("leasehold_lease_lost_total{reason=released}") - before,
        1,
        "one lost key, one count"
    );
    set.stop().expect("stop");
}

#[test]
fn describing_names_every_metric_with_help_text() {
    let (_serial, installed) = exclusive();
    leasehold::telemetry::describe_metrics();
    let described = installed.metrics.described();
    let names: Vec<&str> = described.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "leasehold_acquire_total",
            "leasehold_call_duration_seconds",
            "leasehold_calls_total",
            "leasehold_guard_refused_total",
            "leasehold_lease_lost_total",
            "leasehold_listener_up",
            "leasehold_wait_duration_seconds",
            "leasehold_waiter_wakeups_total",
        ]
    );
    assert!(described.values().all(|help| !help.is_empty()));
}
