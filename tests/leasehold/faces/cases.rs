//! The cases of the dual suite, each written once against [`Face`] and run
//! on both faces (the list and the macro are in `mod.rs`). Rules cited as
//! in docs/SPECIFICATION.md.

use std::time::Duration;

use leasehold::error::{ErrorKind, LeaseError, Operation};
use leasehold::guard::Check;
use leasehold::guard::FencedError;
use leasehold::{Acquisition, Epoch, FencingToken, Lease, LeaseState, Refusal, Release, Renewal};
use leasehold_test_support::{
    grant, grants, query_bool, server_now, wait_until_server_time_passes, TestDb,
};

use super::Face;
use crate::aio_common::eventually;
use crate::common::sqlstate_of;
use diesel::connection::SimpleConnection;

const TTL: Duration = Duration::from_secs(30);
/// Held for the next step or two, then waited out on the server's clock.
const SHORT: Duration = Duration::from_secs(2);

/// Whether `error` is an input rule's refusal, naming the rules broken.
fn is_invalid_input(error: &LeaseError) -> bool {
    error.kind() == ErrorKind::InvalidInput && !error.violations().is_empty()
}

/// Whether a guard refused an epoch below the resource's record.
fn is_stale_epoch(error: &LeaseError) -> bool {
    error.kind() == ErrorKind::Fenced && matches!(error.refusal(), Some(Refusal::StaleEpoch { .. }))
}

/// Whether a guard refused a token of another key than the one fencing the resource.
fn is_wrong_key(error: &LeaseError) -> bool {
    error.kind() == ErrorKind::Fenced && error.refusal() == Some(Refusal::WrongKey)
}

/// Whether a guard refused an epoch never granted for its key.
fn is_epoch_not_granted(error: &LeaseError) -> bool {
    error.kind() == ErrorKind::Fenced
        && matches!(error.refusal(), Some(Refusal::EpochNotGranted { .. }))
}

/// Whether a lease-checked call found the lease not held: fenced, not by a
/// table, naming the token's owner and what happened to its grant.
fn is_lease_not_held(error: &LeaseError) -> bool {
    error.kind() == ErrorKind::Fenced
        && error.table().is_none()
        && error.owner().is_some()
        && error.refusal().is_some()
}

fn granted(acquisition: Result<Acquisition, LeaseError>) -> Lease {
    match acquisition {
        Ok(Acquisition::Granted(lease)) => lease,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn epoch_of(state: Option<LeaseState>) -> i64 {
    state.expect("a row").epoch().get()
}

async fn open<F: Face>(db: &TestDb) -> F {
    F::open(&db.url).await
}

/// §1.3: a free key is granted at epoch 1; while held, another owner is
/// denied and nothing changes.
pub async fn a_free_key_is_granted_and_another_owner_is_denied<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    assert_eq!(face.inspect("k").await.unwrap(), None, "{}", F::NAME);
    let lease = granted(face.acquire("k", "a", TTL).await);
    assert_eq!(lease.epoch(), 1);
    assert_eq!(lease.owner(), "a");
    assert!(matches!(
        face.acquire("k", "b", TTL).await,
        Ok(Acquisition::Denied)
    ));
    match face.inspect("k").await.unwrap() {
        Some(LeaseState::Held {
            owner,
            epoch,
            expires_at,
        }) => {
            assert_eq!((owner.as_str(), epoch.get()), ("a", 1));
            assert_eq!(expires_at, lease.expires_at());
        }
        other => panic!("expected held, got {other:?}"),
    }
}

/// §1.3: renew moves the expiry and never the epoch; a stranger's or an
/// unknown key's renew is refused as not_owner.
pub async fn renew_extends_keeps_the_epoch_and_refuses_strangers<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    let lease = granted(face.acquire("k", "a", SHORT).await);
    let Renewal::Renewed { expires_at } = face.renew(lease.token(), TTL).await.unwrap() else {
        panic!("renew refused");
    };
    assert!(expires_at > lease.expires_at());
    assert_eq!(epoch_of(face.inspect("k").await.unwrap()), 1);
    let stranger = grant("k", "b", 1);
    assert_eq!(
        face.renew(&stranger, TTL).await.unwrap(),
        Renewal::Refused(Refusal::NeverHeld)
    );
    let unknown = grant("nobody", "a", 1);
    assert_eq!(
        face.renew(&unknown, TTL).await.unwrap(),
        Renewal::Refused(Refusal::NeverHeld)
    );
}

/// §1.3: a release frees the key and moves its counter past the epoch; a
/// second release is refused and changes nothing.
pub async fn release_frees_the_key_and_moves_the_counter<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    let lease = granted(face.acquire("k", "a", TTL).await);
    assert_eq!(
        face.release(lease.token()).await.unwrap(),
        Release::Released
    );
    assert_eq!(
        face.inspect("k").await.unwrap(),
        Some(LeaseState::Free {
            epoch: Epoch::new(2),
            force_released: false,
        })
    );
    assert_eq!(
        face.release(lease.token()).await.unwrap(),
        Release::Refused(Refusal::Released)
    );
    assert_eq!(epoch_of(face.inspect("k").await.unwrap()), 2);
}

/// §1.2: every grant of a key has a higher epoch than every earlier one,
/// whoever holds it and however it ended.
pub async fn epochs_only_rise_across_grants<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    let mut last = 0;
    for owner in ["a", "b", "a", "c"] {
        let lease = granted(face.acquire("k", owner, TTL).await);
        assert!(lease.epoch().get() > last, "{} after {last}", lease.epoch());
        last = lease.epoch().get();
        if owner == "b" {
            assert_eq!(
                face.force_release("k").await.unwrap(),
                Some(Epoch::new(last + 1))
            );
        } else {
            assert_eq!(
                face.release(lease.token()).await.unwrap(),
                Release::Released
            );
        }
    }
}

/// §1.3: the holder presenting an older epoch of its own key is refused as
/// epoch_mismatch, and the newer grant is untouched.
pub async fn a_renew_of_an_older_epoch_is_an_epoch_mismatch<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    let first = granted(face.acquire("k", "a", TTL).await);
    assert_eq!(
        face.release(first.token()).await.unwrap(),
        Release::Released
    );
    let second = granted(face.acquire("k", "a", TTL).await);
    assert_eq!(
        face.renew(first.token(), TTL).await.unwrap(),
        Renewal::Refused(Refusal::EpochMismatch {
            held: Some(second.epoch())
        })
    );
    assert_eq!(
        face.release(first.token()).await.unwrap(),
        Release::Refused(Refusal::EpochMismatch {
            held: Some(second.epoch())
        })
    );
    assert_eq!(
        epoch_of(face.inspect("k").await.unwrap()),
        second.epoch().get()
    );
}

/// §1.3: once its expiry passed on the server's clock, a grant's renew is
/// refused as lapsed and another owner takes the key with a higher epoch.
pub async fn a_lapsed_grant_is_refused_and_taken_over_with_a_higher_epoch<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    let lease = granted(face.acquire("k", "a", SHORT).await);
    wait_until_server_time_passes(&mut db.conn(), lease.expires_at());
    assert_eq!(
        face.renew(lease.token(), TTL).await.unwrap(),
        Renewal::Refused(Refusal::Lapsed {
            taken_over_by: None
        })
    );
    let next = granted(face.acquire("k", "b", TTL).await);
    assert!(next.epoch() > lease.epoch());
    assert_eq!(
        face.release(lease.token()).await.unwrap(),
        Release::Refused(Refusal::Lapsed {
            taken_over_by: Some(next.epoch())
        })
    );
}

/// §1.4: input the rules refuse is `InvalidInput` naming the rule, checked
/// before the call (NUL) or by the server (empty key, zero ttl); nothing
/// changes.
pub async fn bad_input_is_a_typed_error_and_changes_nothing<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    for (key, ttl) in [("a\0b", TTL), ("", TTL), ("k", Duration::ZERO)] {
        match face.acquire(key, "a", ttl).await {
            Err(error) if error.kind() == ErrorKind::InvalidInput && error.table().is_none() => {
                assert!(!error.violations().is_empty())
            }
            other => panic!(
                "{}: expected InvalidInput for {key:?} {ttl:?}, got {other:?}",
                F::NAME
            ),
        }
    }
    match face.admit("r\0", &grant("k", "a", 1)).await {
        Err(error) if is_invalid_input(&error) => {}
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    assert_eq!(face.inspect("k").await.unwrap(), None);
    assert_eq!(face.inspect_guard("r").await.unwrap(), None);
    // The connection is still good.
    granted(face.acquire("k", "a", TTL).await);
}

/// §1.5: inside the caller's transaction a grant is invisible to others
/// until the commit, and commits with it.
pub async fn a_grant_commits_with_the_callers_transaction<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    let mut other = open::<F>(db).await;
    face.begin().await;
    let lease = granted(face.acquire("k", "a", TTL).await);
    face.exec("CREATE TABLE written (v int); INSERT INTO written VALUES (1)")
        .await
        .unwrap();
    assert_eq!(
        other.inspect("k").await.unwrap(),
        None,
        "seen before the commit"
    );
    face.commit().await;
    assert_eq!(
        epoch_of(other.inspect("k").await.unwrap()),
        lease.epoch().get()
    );
    assert!(query_bool(
        &mut db.conn(),
        "SELECT EXISTS (SELECT 1 FROM written) AS flag"
    ));
}

/// §1.5: a grant whose transaction rolls back never happened: the key is
/// as before, and the next grant takes its epoch.
pub async fn a_rolled_back_grant_never_happened<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    face.begin().await;
    let lease = granted(face.acquire("k", "a", TTL).await);
    assert_eq!(lease.epoch(), 1);
    face.rollback().await;
    assert_eq!(face.inspect("k").await.unwrap(), None);
    let again = granted(face.acquire("k", "b", TTL).await);
    assert_eq!(again.epoch(), 1);
}

/// §1.3: `acquire_waiting` waits while another owner holds the key, and is
/// granted once it is released (the waiter is observed waiting first).
pub async fn acquire_waiting_gets_the_key_when_it_is_released<F: Face>(db: &TestDb) {
    let mut holder = open::<F>(db).await;
    let held = granted(holder.acquire("k", "a", TTL).await);
    let mut waiter = open::<F>(db).await;
    let pid = waiter.pid().await;
    let waiting = tokio::spawn(async move {
        waiter
            .acquire_waiting("k", "b", TTL, Duration::from_secs(60))
            .await
    });
    wait_for_active(db, pid);
    assert_eq!(
        holder.release(held.token()).await.unwrap(),
        Release::Released
    );
    let lease = waiting.await.expect("join").expect("granted");
    assert_eq!((lease.owner(), lease.epoch().get()), ("b", 3));
}

/// §1.3: `acquire_waiting` that outlasts its wait is `TimedOut` naming the
/// key and the wait; the holder keeps the key.
pub async fn acquire_waiting_times_out_and_changes_nothing<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    granted(face.acquire("k", "a", TTL).await);
    let wait = Duration::from_millis(200);
    match face.acquire_waiting("k", "b", TTL, wait).await {
        Err(error) if error.kind() == ErrorKind::TimedOut => {
            assert_eq!((error.key(), error.waited()), (Some("k"), Some(wait)))
        }
        other => panic!("expected TimedOut, got {other:?}"),
    }
    match face.inspect("k").await.unwrap() {
        Some(LeaseState::Held { owner, .. }) => assert_eq!(owner, "a"),
        other => panic!("expected held by a, got {other:?}"),
    }
}

/// §1.3: the batch calls answer per key, in the order given, what the
/// single-key call would have answered.
pub async fn batch_calls_answer_per_key_in_order<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    let a = granted(face.acquire("a", "w", TTL).await);
    let b = granted(face.acquire("b", "w", TTL).await);
    assert_eq!(face.release(b.token()).await.unwrap(), Release::Released);
    let tokens = vec![b.token().clone(), a.token().clone(), grant("never", "w", 1)];
    let answers = face.renew_many(&tokens, TTL).await.unwrap();
    let keys: Vec<&str> = answers.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(keys, ["b", "a", "never"]);
    assert_eq!(answers[0].renewal, Renewal::Refused(Refusal::Released));
    assert!(matches!(answers[1].renewal, Renewal::Renewed { .. }));
    assert_eq!(answers[2].renewal, Renewal::Refused(Refusal::NeverHeld));
    let released = face.release_many(&tokens).await.unwrap();
    let answers: Vec<Release> = released.iter().map(|k| k.release).collect();
    assert_eq!(
        answers,
        [
            Release::Refused(Refusal::Released),
            Release::Released,
            Release::Refused(Refusal::NeverHeld)
        ]
    );
    assert_eq!(epoch_of(face.inspect("a").await.unwrap()), 2);
}

/// §1.3: grants of two owners in one batch are `InvalidInput` and change
/// nothing; no grants, no call: an empty answer.
pub async fn batch_calls_refuse_mixed_owners_and_answer_nothing_for_nothing<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    let a = granted(face.acquire("a", "w", TTL).await);
    let mixed = vec![a.token().clone(), grant("b", "x", 1)];
    assert!(matches!(
        face.renew_many(&mixed, TTL).await,
        Err(ref error) if is_invalid_input(error)
    ));
    assert!(matches!(
        face.release_many(&mixed).await,
        Err(ref error) if is_invalid_input(error)
    ));
    assert!(matches!(
        face.join_group(&mixed, TTL).await,
        Err(ref error) if is_invalid_input(error)
    ));
    let twice = grants("w", &[("a", 1), ("a", 1)]);
    assert!(matches!(
        face.renew_many(&twice, TTL).await,
        Err(ref error) if is_invalid_input(error)
    ));
    assert!(face.renew_many(&[], TTL).await.unwrap().is_empty());
    assert!(face.release_many(&[]).await.unwrap().is_empty());
    let nothing = face.join_group(&[], TTL).await.unwrap();
    assert_eq!((nothing.group, nothing.keys.len()), (None, 0));
    assert!(matches!(
        face.renew(a.token(), TTL).await.unwrap(),
        Renewal::Renewed { .. }
    ));
}

/// §1.9: a group keeps its joined members alive with one heartbeat that
/// counts them; another owner's heartbeat is refused; a released member
/// leaves.
pub async fn a_group_heartbeat_keeps_its_members_and_refuses_strangers<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    let a = granted(face.acquire("a", "w", SHORT).await);
    let b = granted(face.acquire("b", "w", SHORT).await);
    let tokens = vec![a.token().clone(), b.token().clone(), grant("c", "w", 1)];
    let joined = face.join_group(&tokens, SHORT).await.unwrap();
    assert_eq!(joined.renewed(), 2);
    let group = joined.group.expect("a group");
    let expires = match face.renew_group(group, "w", TTL).await.unwrap() {
        leasehold::batch::GroupRenewal::Renewed {
            members,
            expires_at,
        } => {
            assert_eq!(members, 2);
            expires_at
        }
        other => panic!("expected renewed, got {other:?}"),
    };
    assert_eq!(
        face.renew_group(group, "x", TTL).await.unwrap(),
        leasehold::batch::GroupRenewal::Refused(Refusal::NeverHeld)
    );
    // The members outlive their own short expiry through the group's.
    wait_until_server_time_passes(&mut db.conn(), b.expires_at());
    assert!(matches!(
        face.acquire("a", "x", TTL).await,
        Ok(Acquisition::Denied)
    ));
    assert_eq!(face.release(b.token()).await.unwrap(), Release::Released);
    match face.renew_group(group, "w", TTL).await.unwrap() {
        leasehold::batch::GroupRenewal::Renewed {
            members,
            expires_at,
        } => {
            assert_eq!(members, 1);
            assert!(expires_at >= expires);
        }
        other => panic!("expected renewed, got {other:?}"),
    }
}

/// A grant of `key` for `owner` at a real epoch (G7: a database guard
/// admits only epochs granted), the key released before each next grant.
async fn epoch_n<F: Face>(face: &mut F, key: &str, owner: &str, n: i64) -> FencingToken {
    loop {
        let lease = granted(face.acquire(key, owner, TTL).await);
        if lease.epoch().get() >= n {
            return lease.token().clone();
        }
        assert_eq!(
            face.release(lease.token()).await.unwrap(),
            Release::Released
        );
    }
}

fn record(epoch: i64) -> Option<leasehold::guard::GuardRecord> {
    Some(leasehold::guard::GuardRecord {
        lease_key: "k".into(),
        accepted_epoch: Epoch::new(epoch),
    })
}

/// G1, G3: an admission records the key and raises the record to its
/// epoch; the same epoch is admitted again.
pub async fn g1_g3_an_admission_raises_the_record_and_an_equal_epoch_is_admitted_again<F: Face>(
    db: &TestDb,
) {
    let mut face = open::<F>(db).await;
    let first = epoch_n(&mut face, "k", "a", 1).await;
    assert_eq!(face.inspect_guard("r").await.unwrap(), None);
    face.admit("r", &first).await.unwrap();
    assert_eq!(face.inspect_guard("r").await.unwrap(), record(1));
    face.admit("r", &first).await.unwrap();
    assert_eq!(face.release(&first).await.unwrap(), Release::Released);
    let third = epoch_n(&mut face, "k", "b", 3).await;
    face.admit("r", &third).await.unwrap();
    assert_eq!(face.inspect_guard("r").await.unwrap(), record(3));
}

/// G2: an epoch below the record is refused as stale, naming the record,
/// and the fenced transaction's write is rolled back.
pub async fn g2_a_stale_epoch_is_refused_and_its_write_is_rolled_back<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    face.exec("CREATE TABLE out (v int)").await.unwrap();
    let old = epoch_n(&mut face, "k", "a", 1).await;
    assert_eq!(face.release(&old).await.unwrap(), Release::Released);
    let new = epoch_n(&mut face, "k", "b", 3).await;
    face.run_fenced_sql("r", &new, Check::Token, "INSERT INTO out VALUES (3)", false)
        .await
        .unwrap();
    match face
        .run_fenced_sql("r", &old, Check::Token, "INSERT INTO out VALUES (1)", false)
        .await
    {
        Err(FencedError::Guard(error)) if is_stale_epoch(&error) => {
            assert_eq!(
                (error.resource(), error.epoch(), error.refusal()),
                (
                    Some("r"),
                    Some(Epoch::new(1)),
                    Some(Refusal::StaleEpoch {
                        accepted: Epoch::new(3)
                    })
                )
            );
        }
        other => panic!("expected StaleEpoch, got {other:?}"),
    }
    assert!(query_bool(
        &mut db.conn(),
        "SELECT array_agg(v) = '{3}' AS flag FROM out"
    ));
    assert_eq!(face.inspect_guard("r").await.unwrap(), record(3));
}

/// G3: a fenced write that the caller's own code fails rolls back, and the
/// record does not rise.
pub async fn g3_a_write_the_callers_code_rolls_back_does_not_raise_the_record<F: Face>(
    db: &TestDb,
) {
    let mut face = open::<F>(db).await;
    face.exec("CREATE TABLE out (v int)").await.unwrap();
    let token = epoch_n(&mut face, "k", "a", 1).await;
    match face
        .run_fenced_sql(
            "r",
            &token,
            Check::LeaseHeld,
            "INSERT INTO out VALUES (1)",
            true,
        )
        .await
    {
        Err(FencedError::Work(_)) => {}
        other => panic!("expected the work's error, got {other:?}"),
    }
    assert_eq!(face.inspect_guard("r").await.unwrap(), None);
    assert!(query_bool(
        &mut db.conn(),
        "SELECT NOT EXISTS (SELECT 1 FROM out) AS flag"
    ));
}

/// G4: an admission locks the guard row until its transaction ends: a
/// second writer of the resource waits for it.
pub async fn g4_writers_of_one_resource_serialise_at_the_guard<F: Face>(db: &TestDb) {
    let mut first = open::<F>(db).await;
    let token = epoch_n(&mut first, "k", "a", 1).await;
    first.begin().await;
    first.admit("r", &token).await.unwrap();
    let mut second = open::<F>(db).await;
    let pid = second.pid().await;
    let again = token.clone();
    let late = tokio::spawn(async move { second.admit("r", &again).await });
    // The second admission of the resource waits for the first's
    // transaction (a lower epoch of the key is refused before it reaches
    // the guard: see the superseded case).
    wait_for_lock_wait(db, pid);
    first.commit().await;
    late.await.expect("join").unwrap();
    assert_eq!(
        first.inspect_guard("r").await.unwrap(),
        record(token.epoch().get())
    );
}

/// G5: a token of another key is refused as misuse, whatever its epoch,
/// and so is a fence with another key.
pub async fn g5_a_token_of_another_key_is_refused<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    let mine = epoch_n(&mut face, "k", "a", 1).await;
    let other = epoch_n(&mut face, "other", "a", 2).await;
    face.admit("r", &mine).await.unwrap();
    match face.admit("r", &other).await {
        Err(error) if is_wrong_key(&error) => {
            assert_eq!((error.fenced_by(), error.key()), (Some("k"), Some("other")));
        }
        other => panic!("expected WrongLeaseKey, got {other:?}"),
    }
    assert!(matches!(
        face.fence("r", "other", Epoch::new(1)).await,
        Err(ref error) if is_wrong_key(error)
    ));
    assert_eq!(face.inspect_guard("r").await.unwrap(), record(1));
}

/// G6: `check_held`, `admit_held` and `renew_and_admit` need the lease held
/// right now by the token; a lapsed or released one is refused with its
/// reason.
pub async fn g6_a_checked_write_needs_the_lease_held_now<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    let lease = granted(face.acquire("k", "a", SHORT).await);
    let token = lease.token().clone();
    assert_eq!(face.check_held(&token).await.unwrap(), lease.expires_at());
    face.admit_held("r", &token).await.unwrap();
    let renewed = face.renew_and_admit("r", &token, SHORT).await.unwrap();
    assert!(renewed >= lease.expires_at());
    wait_until_server_time_passes(&mut db.conn(), renewed);
    for result in [
        face.check_held(&token).await.map(drop),
        face.admit_held("r", &token).await.map(drop),
        face.renew_and_admit("r", &token, TTL).await.map(drop),
    ] {
        match result {
            Err(error) if is_lease_not_held(&error) => {
                assert_eq!(
                    (error.refusal(), error.epoch()),
                    (
                        Some(Refusal::Lapsed {
                            taken_over_by: None
                        }),
                        Some(Epoch::new(1))
                    )
                );
            }
            other => panic!("expected LeaseNotHeld(lapsed), got {other:?}"),
        }
    }
    match face
        .run_fenced_sql("r", &token, Check::LeaseHeld, "SELECT 1", false)
        .await
    {
        Err(FencedError::Guard(error))
            if is_lease_not_held(&error)
                && error.refusal()
                    == Some(Refusal::Lapsed {
                        taken_over_by: None,
                    }) => {}
        other => panic!("expected LeaseNotHeld, got {other:?}"),
    }
}

/// G6: an open checked write keeps the lease from being taken over: a
/// takeover after the lapse waits for the write's commit.
pub async fn g6_a_checked_write_holds_off_a_takeover_until_it_commits<F: Face>(db: &TestDb) {
    let mut writer = open::<F>(db).await;
    let lease = granted(writer.acquire("k", "a", SHORT).await);
    writer.begin().await;
    writer.admit_held("r", lease.token()).await.unwrap();
    wait_until_server_time_passes(&mut db.conn(), lease.expires_at());
    let mut taker = open::<F>(db).await;
    let pid = taker.pid().await;
    let takeover = tokio::spawn(async move {
        taker
            .acquire_waiting("k", "b", TTL, Duration::from_secs(60))
            .await
    });
    wait_for_lock_wait(db, pid);
    assert!(
        !takeover.is_finished(),
        "the takeover did not wait for the checked write"
    );
    writer.commit().await;
    let next = takeover
        .await
        .expect("join")
        .expect("granted after the commit");
    assert_eq!(next.epoch().get(), 2);
}

/// G7: an epoch never granted is refused and fences nothing; a fence above
/// the counter is refused too.
pub async fn g7_an_epoch_never_granted_fences_nothing<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    let real = epoch_n(&mut face, "k", "a", 1).await;
    match face.admit("r", &grant("k", "a", 1_000)).await {
        Err(error) if is_epoch_not_granted(&error) => {
            assert_eq!(
                (error.epoch(), error.refusal()),
                (
                    Some(Epoch::new(1_000)),
                    Some(Refusal::EpochNotGranted {
                        counter: Epoch::new(1)
                    })
                )
            );
        }
        other => panic!("expected EpochNotGranted, got {other:?}"),
    }
    assert!(matches!(
        face.admit("r", &grant("never-leased", "a", 1)).await,
        Err(ref error) if is_epoch_not_granted(error)
    ));
    assert!(matches!(
        face.fence("r", "k", Epoch::new(50)).await,
        Err(ref error) if is_epoch_not_granted(error)
    ));
    assert_eq!(face.inspect_guard("r").await.unwrap(), None);
    face.admit("r", &real).await.unwrap();
}

/// G2, G7: a holder superseded before its successor wrote anything is
/// refused at once, by `run_fenced` with `Check::Token`, by `admit` (SQL
/// `lease.admit`) and by `admit_held`, and nothing of its write is
/// visible; so is a holder that released, or whose lease was
/// force-released, since. The counter a release leaves was never granted.
pub async fn g2_a_superseded_holder_is_refused_before_its_successor_writes<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    face.exec("CREATE TABLE out (v bigint)").await.unwrap();
    let old = granted(face.acquire("k", "a", TTL).await).token().clone();
    // a pauses past its ttl; b takes the key over and writes nothing yet.
    db.conn()
        .batch_execute("UPDATE lease.leases SET expires_at = clock_timestamp() - interval '1 hour'")
        .unwrap();
    let new = granted(face.acquire("k", "b", TTL).await).token().clone();
    assert_eq!(new.epoch().get(), old.epoch().get() + 1);
    let superseded = |result: Result<(), LeaseError>| match result {
        Err(error) if is_stale_epoch(&error) => {
            let Some(Refusal::StaleEpoch { accepted }) = error.refusal() else {
                unreachable!()
            };
            (
                error.epoch().expect("the presented epoch").get(),
                accepted.get(),
            )
        }
        other => panic!("expected StaleEpoch, got {other:?}"),
    };
    let write = format!("INSERT INTO out VALUES ({})", old.epoch());
    match face
        .run_fenced_sql("r", &old, Check::Token, &write, false)
        .await
    {
        Err(FencedError::Guard(error)) => assert_eq!(
            superseded(Err(error)),
            (old.epoch().get(), new.epoch().get())
        ),
        other => panic!("run_fenced with a superseded token: {other:?}"),
    }
    assert_eq!(
        superseded(face.admit("r", &old).await),
        (old.epoch().get(), new.epoch().get())
    );
    assert_eq!(
        sqlstate_of(
            &mut db.conn(),
            &format!("SELECT lease.admit('r', 'k', {})", old.epoch())
        ),
        "55000"
    );
    assert!(matches!(
        face.admit_held("r", &old).await,
        Err(ref error) if is_lease_not_held(error)
    ));
    assert!(query_bool(
        &mut db.conn(),
        "SELECT count(*) = 0 AS flag FROM out"
    ));
    assert_eq!(face.inspect_guard("r").await.unwrap(), None);
    // The successor's own epoch is admitted (G3).
    face.run_fenced_sql("r", &new, Check::Token, "INSERT INTO out VALUES (2)", false)
        .await
        .unwrap();

    // Released by its holder: its epoch is refused, and the counter the
    // release left (never granted) fences nothing.
    assert_eq!(face.release(&new).await.unwrap(), Release::Released);
    assert_eq!(
        superseded(face.admit("r2", &new).await),
        (new.epoch().get(), new.epoch().get() + 2)
    );
    match face
        .admit("r2", &grant("k", "b", new.epoch().get() + 1))
        .await
    {
        Err(error) if is_epoch_not_granted(&error) => {
            let Some(Refusal::EpochNotGranted { counter }) = error.refusal() else {
                unreachable!()
            };
            assert_eq!(error.epoch(), Some(counter))
        }
        other => panic!("expected EpochNotGranted for the released counter, got {other:?}"),
    }

    // Force-released by an operator, nobody granted since: refused too.
    let third = granted(face.acquire("k", "c", TTL).await).token().clone();
    face.force_release("k").await.unwrap();
    assert!(matches!(
        face.admit("r3", &third).await,
        Err(ref error) if is_stale_epoch(error)
    ));
    assert_eq!(face.inspect_guard("r2").await.unwrap(), None);
    assert_eq!(face.inspect_guard("r3").await.unwrap(), None);
}

/// §2 (`fence`): a fence through N refuses N and below, admits N + 1, and
/// never lowers the record.
pub async fn a_fence_refuses_through_its_epoch<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    let old = epoch_n(&mut face, "k", "a", 1).await;
    assert_eq!(face.release(&old).await.unwrap(), Release::Released);
    let new = epoch_n(&mut face, "k", "b", 3).await;
    assert_eq!(
        face.fence("r", "k", Epoch::new(2)).await.unwrap(),
        Epoch::new(3)
    );
    assert!(matches!(
        face.admit("r", &old).await,
        Err(ref error) if is_stale_epoch(error)
    ));
    assert_eq!(
        face.fence("r", "k", Epoch::new(1)).await.unwrap(),
        Epoch::new(3)
    );
    face.admit("r", &new).await.unwrap();
}

/// §1.4: a session that ends while an autocommitted mutating call is in
/// flight leaves the outcome unknown (`OutcomeUnknown`, whichever face:
/// each face's driver reports the loss its own way, and the execute step
/// files it as one), and the re-read shows nothing changed.
pub async fn a_session_lost_mid_call_is_outcome_unknown_and_changes_nothing<F: Face>(db: &TestDb) {
    let mut holder = open::<F>(db).await;
    granted(holder.acquire("k", "a", TTL).await);
    let mut waiter = open::<F>(db).await;
    let pid = waiter.pid().await;
    let waiting = tokio::spawn(async move {
        waiter
            .acquire_waiting("k", "b", TTL, Duration::from_secs(60))
            .await
    });
    wait_for_active(db, pid);
    assert!(query_bool(
        &mut db.conn(),
        &format!("SELECT pg_terminate_backend({pid}) AS flag")
    ));
    match waiting.await.expect("join") {
        Err(error)
            if error.kind() == ErrorKind::OutcomeUnknown
                && error.operation() == Some(Operation::ACQUIRE) =>
        {
            assert_eq!(error.key(), Some("k"))
        }
        other => panic!("{}: expected OutcomeUnknown, got {other:?}", F::NAME),
    }
    match holder.inspect("k").await.unwrap() {
        Some(LeaseState::Held { owner, epoch, .. }) => {
            assert_eq!((owner.as_str(), epoch.get()), ("a", 1))
        }
        other => panic!("expected held by a, got {other:?}"),
    }
}

/// Waits until backend `pid` runs a statement (a waiting acquire polls
/// inside one).
fn wait_for_active(db: &TestDb, pid: i32) {
    wait_for(db, &format!(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {pid} AND state = 'active' AND query LIKE '%lease.acquire%') AS flag"
    ));
}

/// Waits until backend `pid` waits on a lock.
fn wait_for_lock_wait(db: &TestDb, pid: i32) {
    wait_for(db, &format!(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {pid} AND wait_event_type = 'Lock') AS flag"
    ));
}

fn wait_for(db: &TestDb, sql: &str) {
    let mut conn = db.conn();
    let started = server_now(&mut conn);
    for _ in 0..4_000 {
        if query_bool(&mut conn, sql) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("never observed since {started}: {sql}");
}

/// Keeping: the keeper renews (the server's expiry moves past the
/// acquired one, the epoch stays) until stopped, and its stop releases.
pub async fn a_keeper_renews_its_grant_until_stopped_and_stop_releases<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    let lease = granted(face.acquire("k", "a", Duration::from_secs(3)).await);
    let kept = F::keep(&db.url, lease.clone(), Duration::from_millis(200)).await;
    assert!(F::kept_is_valid(&kept));
    let first = F::kept_expires_at(&kept).expect("the first renew's expiry");
    eventually("a renew after the first", || {
        F::kept_expires_at(&kept).is_some_and(|now| now > first)
    })
    .await;
    match face.inspect("k").await.unwrap() {
        Some(LeaseState::Held {
            expires_at, epoch, ..
        }) => {
            assert!(expires_at > lease.expires_at(), "{}", F::NAME);
            assert_eq!(epoch, lease.epoch());
        }
        other => panic!("{}: expected held, got {other:?}", F::NAME),
    }
    assert_eq!(F::stop_keeping(kept).await.unwrap(), Release::Released);
    assert!(matches!(
        face.inspect("k").await.unwrap(),
        Some(LeaseState::Free { .. })
    ));
}

/// Keeping: an operator's forced release is the keeper's loss (its next
/// renew is refused), the lease is no longer valid, and stop answers the
/// refusal.
pub async fn a_keeper_reports_a_forced_release_as_its_loss<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    let lease = granted(face.acquire("k", "a", TTL).await);
    let kept = F::keep(&db.url, lease, Duration::from_millis(100)).await;
    face.force_release("k").await.unwrap();
    eventually("the loss reported", || F::kept_loss(&kept).is_some()).await;
    assert!(
        matches!(
            F::kept_loss(&kept),
            Some(leasehold::hold::LeaseLoss::Refused(Refusal::ForceReleased))
        ),
        "{}: {:?}",
        F::NAME,
        F::kept_loss(&kept)
    );
    assert!(!F::kept_is_valid(&kept));
    assert_eq!(
        F::stop_keeping(kept).await.unwrap(),
        Release::Refused(Refusal::ForceReleased)
    );
}

/// Keeping: both faces' keepers tell their schedule, report every renew
/// and the loss to their `on_event` handler, and wake `wait_for_loss` with
/// the loss (and not before it, at the bound).
pub async fn a_keeper_reports_its_renews_and_loss_as_events_and_to_wait_for_loss<F: Face>(
    db: &TestDb,
) {
    let mut face = open::<F>(db).await;
    let lease = granted(face.acquire("k", "a", Duration::from_secs(3)).await);
    let kept = F::keep(&db.url, lease, Duration::from_millis(100)).await;
    assert_eq!(
        F::kept_schedule(&kept),
        (Duration::from_secs(3), Duration::from_millis(300)),
        "{}",
        F::NAME
    );
    assert!(
        F::kept_wait_for_loss(&kept, Duration::from_millis(50))
            .await
            .is_none(),
        "{}: lost while held",
        F::NAME
    );
    eventually("two renews reported", || {
        F::kept_events(&kept)
            .iter()
            .filter(|event| matches!(event, leasehold::hold::KeeperEvent::Renewed { .. }))
            .count()
            >= 2
    })
    .await;
    face.force_release("k").await.unwrap();
    let loss = F::kept_wait_for_loss(&kept, Duration::from_secs(60)).await;
    assert!(
        matches!(
            loss,
            Some(leasehold::hold::LeaseLoss::Refused(Refusal::ForceReleased))
        ),
        "{}: {loss:?}",
        F::NAME
    );
    // The loss is recorded (waking wait_for_loss) just before it is reported.
    eventually("the loss reported last", || {
        matches!(
            F::kept_events(&kept).last(),
            Some(leasehold::hold::KeeperEvent::Lost(
                leasehold::hold::LeaseLoss::Refused(Refusal::ForceReleased)
            ))
        )
    })
    .await;
    assert_eq!(
        F::stop_keeping(kept).await.unwrap(),
        Release::Refused(Refusal::ForceReleased)
    );
}

/// Waiting: a waiter parked on a held key (armed: its release will
/// notify) is granted the key when its holder releases it, with the next
/// epoch.
pub async fn a_waiter_is_granted_the_key_its_holder_releases<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    let held = granted(face.acquire("k", "a", Duration::from_secs(600)).await);
    let waiter = F::waiter(&db.url).await;
    let wait = tokio::spawn(F::wait_for(
        waiter.clone(),
        "k",
        "b",
        TTL,
        Duration::from_secs(600),
    ));
    eventually("the waiter parked, armed", || {
        F::armed_waiters(&waiter, "k") == 1
    })
    .await;
    assert_eq!(face.release(held.token()).await.unwrap(), Release::Released);
    let lease = tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .expect("woken in time")
        .unwrap()
        .unwrap();
    assert_eq!(
        (lease.owner(), lease.epoch().get()),
        ("b", 3),
        "{}",
        F::NAME
    );
}

/// Waiting: a bounded wait on a key that stays held ends with `TimedOut`,
/// changes nothing, and leaves no waiter armed.
pub async fn a_bounded_wait_times_out_and_leaves_nothing_armed<F: Face>(db: &TestDb) {
    let mut face = open::<F>(db).await;
    let held = granted(face.acquire("k", "a", Duration::from_secs(600)).await);
    let waiter = F::waiter(&db.url).await;
    match F::wait_for(waiter.clone(), "k", "b", TTL, Duration::from_millis(300)).await {
        Err(error) if error.kind() == ErrorKind::TimedOut => assert_eq!(error.key(), Some("k")),
        other => panic!("{}: expected TimedOut, got {other:?}", F::NAME),
    }
    assert_eq!(F::armed_waiters(&waiter, "k"), 0);
    match face.inspect("k").await.unwrap() {
        Some(LeaseState::Held { owner, epoch, .. }) => {
            assert_eq!((owner.as_str(), epoch), ("a", held.epoch()));
        }
        other => panic!("{}: expected held by a, got {other:?}", F::NAME),
    }
}
