//! The guard conformance suite: the cases of the one guard contract
//! ([`leasehold::guard::Guard`]), written once and run against every guard
//! (a database resource, a fenced file, a fenced object on each store).
//!
//! A guard's test file implements [`Harness`] (how to make a fresh guard,
//! and a token of a given epoch, which for a database means an epoch really
//! granted) and expands [`guard_conformance!`](macro@crate::guard_conformance)
//! with it: one `#[test]` per case, so a failure names the case.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Barrier;

use leasehold::guard::{Guard, GuardRecord, Refused};
use leasehold::Epoch;
use leasehold::FencingToken;

/// What the suite needs from one kind of guard.
pub trait Harness: Sync {
    /// The guard under test.
    type G: Guard + Sync;

    /// A guard of a resource no other case uses, never fenced yet.
    fn guard(&self, case: &str) -> Self::G;

    /// A token of `key` for `owner` at `epoch` that the guard takes as
    /// genuine (a database guard refuses epochs never granted, so its
    /// harness grants the key up to `epoch` first).
    fn token(&self, case: &str, key: &str, owner: &str, epoch: i64) -> FencingToken;
}

fn floor<G: Guard>(guard: &G) -> GuardRecord {
    match guard.record() {
        Ok(Some(floor)) => floor,
        Ok(None) => panic!("the guard was never fenced"),
        Err(error) => panic!("floor: {error}"),
    }
}

fn refusal<G: Guard>(result: Result<(), G::Error>) -> Refused {
    match result {
        Ok(()) => panic!("admitted, expected a refusal"),
        Err(error) => G::refused(&error).unwrap_or_else(|| panic!("not a refusal: {error}")),
    }
}

/// A token below the floor is refused as stale, naming the floor, and the
/// floor stays.
pub fn a_stale_token_is_refused_and_changes_nothing<H: Harness>(h: &H) {
    let case = "stale";
    let guard = h.guard(case);
    guard.admit(&h.token(case, "k", "new", 5)).expect("admit 5");
    let refused = refusal::<H::G>(guard.admit(&h.token(case, "k", "old", 4)));
    assert_eq!(
        refused,
        Refused::Stale {
            presented: Epoch::new(4),
            accepted: Epoch::new(5)
        }
    );
    assert_eq!(
        floor(&guard),
        GuardRecord {
            lease_key: "k".into(),
            accepted_epoch: Epoch::new(5)
        }
    );
}

/// The same epoch again is the same grant: admitted; a higher one raises
/// the floor.
pub fn the_same_epoch_is_admitted_again_and_a_higher_one_raises_the_floor<H: Harness>(h: &H) {
    let case = "equal";
    let guard = h.guard(case);
    assert!(
        guard.record().expect("record").is_none(),
        "fenced before use"
    );
    guard.admit(&h.token(case, "k", "a", 3)).expect("admit 3");
    guard
        .admit(&h.token(case, "k", "a", 3))
        .expect("admit 3 again");
    assert_eq!(floor(&guard).accepted_epoch, 3);
    guard.admit(&h.token(case, "k", "b", 6)).expect("admit 6");
    assert_eq!(floor(&guard).accepted_epoch, 6);
}

/// A token of another lease key is refused as a misuse, whatever its
/// epoch, and the floor stays.
pub fn a_token_of_another_key_is_refused<H: Harness>(h: &H) {
    let case = "wrongkey";
    let guard = h.guard(case);
    guard.admit(&h.token(case, "k", "a", 2)).expect("admit 2");
    let refused = refusal::<H::G>(guard.admit(&h.token(case, "other", "a", 9)));
    assert_eq!(
        refused,
        Refused::WrongKey {
            fenced_by: "k".into(),
            presented: "other".into()
        }
    );
    assert_eq!(
        floor(&guard),
        GuardRecord {
            lease_key: "k".into(),
            accepted_epoch: Epoch::new(2)
        }
    );
}

/// A fence through N refuses N and below and admits N + 1; fencing lower
/// again changes nothing; a fence fences a resource never used to its key.
pub fn a_fence_refuses_through_its_epoch_and_never_lowers<H: Harness>(h: &H) {
    let case = "fence";
    let guard = h.guard(case);
    let top = h.token(case, "k", "a", 8); // the key is granted up to 8
    guard
        .fence("k", leasehold::Epoch::from(7))
        .expect("fence 7");
    assert_eq!(floor(&guard).lease_key, "k");
    assert!(floor(&guard).accepted_epoch >= 8);
    let refused = refusal::<H::G>(guard.admit(&h.token(case, "k", "a", 7)));
    assert!(
        matches!(refused, Refused::Stale { presented, .. } if presented == 7),
        "{refused:?}"
    );
    guard
        .fence("k", leasehold::Epoch::from(3))
        .expect("fence 3");
    assert!(
        floor(&guard).accepted_epoch >= 8,
        "a lower fence lowered the floor"
    );
    guard.admit(&top).expect("admit 8");
    assert_eq!(floor(&guard).accepted_epoch, 8);
}

/// Admissions racing from several threads: every admitted epoch was at or
/// above the floor seen before it, the floor never goes down, and it ends
/// at the highest epoch admitted.
pub fn racing_admissions_never_lower_the_floor<H: Harness>(h: &H) {
    const THREADS: usize = 4;
    const EACH: i64 = 6;
    let case = "race";
    let guard = h.guard(case);
    let tokens: Vec<Vec<FencingToken>> = (0..THREADS as i64)
        .map(|t| {
            (1..=EACH)
                .map(|i| h.token(case, "k", &format!("t{t}"), i * 2 + (t % 2)))
                .collect()
        })
        .collect();
    let highest = AtomicI64::new(0);
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|scope| {
        for mine in &tokens {
            let (guard, highest, barrier) = (&guard, &highest, &barrier);
            scope.spawn(move || {
                barrier.wait();
                let mut last_floor = Epoch::new(0);
                for token in mine {
                    match guard.admit(token) {
                        Ok(()) => {
                            highest.fetch_max(token.epoch().get(), Ordering::SeqCst);
                        }
                        Err(error) => match H::G::refused(&error) {
                            Some(Refused::Stale {
                                presented,
                                accepted,
                            }) => assert!(presented < accepted),
                            _ => panic!("admit {}: {error}", token.epoch()),
                        },
                    }
                    // A database guard admits only its key's newest
                    // grant, so every other token here may be refused
                    // before anything fenced the resource: floor 0.
                    let now = match guard.record() {
                        Ok(record) => record.map_or(Epoch::new(0), |r| r.accepted_epoch),
                        Err(error) => panic!("floor: {error}"),
                    };
                    assert!(
                        now >= last_floor,
                        "the floor went down: {last_floor} -> {now}"
                    );
                    last_floor = now;
                }
            });
        }
    });
    assert_eq!(
        floor(&guard).accepted_epoch,
        highest.load(Ordering::SeqCst),
        "the floor is not the highest admitted epoch"
    );
}

/// One `#[test]` per case of the suite for `$harness` (an expression that
/// yields a [`Harness`]; it is evaluated once per case).
#[macro_export]
macro_rules! guard_conformance {
    ($harness:expr) => {
        #[test]
        fn conformance_a_stale_token_is_refused_and_changes_nothing() {
            $crate::guard_conformance::a_stale_token_is_refused_and_changes_nothing(&$harness);
        }
        #[test]
        fn conformance_the_same_epoch_is_admitted_again_and_a_higher_one_raises_the_floor() {
            $crate::guard_conformance::the_same_epoch_is_admitted_again_and_a_higher_one_raises_the_floor(&$harness);
        }
        #[test]
        fn conformance_a_token_of_another_key_is_refused() {
            $crate::guard_conformance::a_token_of_another_key_is_refused(&$harness);
        }
        #[test]
        fn conformance_a_fence_refuses_through_its_epoch_and_never_lowers() {
            $crate::guard_conformance::a_fence_refuses_through_its_epoch_and_never_lowers(
                &$harness,
            );
        }
        #[test]
        fn conformance_racing_admissions_never_lower_the_floor() {
            $crate::guard_conformance::racing_admissions_never_lower_the_floor(&$harness);
        }
    };
}
