//! The nemesis suite: the history checker's own tests (it must catch every
//! kind of violation it claims to), and a short randomized run against a
//! real server with paused and killed workers and crash-restarts.
//!
//! The long run is `cargo run --release --example nemesis -- --duration 600
//! --seed 7` (see `examples/nemesis.rs`). The short run's length can be set
//! with `LEASEHOLD_NEMESIS_SECS` (default 45) and its seed with
//! `LEASEHOLD_NEMESIS_SEED`.

use std::process::Command;
use std::time::Duration;

use leasehold_test_support::nemesis::history::{self, check, Event, Kind};
use leasehold_test_support::nemesis::run;

/// Not a test on its own: the worker role of the nemesis run, selected by
/// the environment when the run re-executes this test binary.
#[test]
fn nemesis_worker_process() {
    if let Some(spec) = run::worker_spec_from_env() {
        run::worker_main(&spec);
    }
}

/// A short run: several worker processes, pauses, kills and crash-restarts,
/// then the checker over everything recorded. It also insists that the run
/// exercised what it claims to (grants, takeovers, pauses, crashes,
/// committed and refused writes), so a run that silently did nothing fails.
#[test]
fn nemesis_run_with_pauses_kills_and_crashes_violates_no_invariant() {
    let secs = std::env::var("LEASEHOLD_NEMESIS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(45);
    let seed = std::env::var("LEASEHOLD_NEMESIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let options = run::Options {
        duration: Duration::from_secs(secs),
        seed,
        workers: 4,
        keys: 3,
        verbose: false,
        prune: false,
    };
    let exe = std::env::current_exe().expect("test executable");
    let outcome = run::run(&options, &|| {
        let mut command = Command::new(&exe);
        command.args([
            "nemesis_worker_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ]);
        command
    });
    let summary = outcome.summary(&options);
    eprintln!("{summary}");
    let report = &outcome.report;
    assert!(report.violations.is_empty(), "{summary}");
    assert!(
        report.grants > 10,
        "too few grants to mean anything\n{summary}"
    );
    assert!(report.takeovers > 0, "no takeover happened\n{summary}");
    assert!(
        report.group_renewals > 0,
        "no renewal went through a heartbeat group\n{summary}"
    );
    assert!(report.committed_writes > 0, "no write committed\n{summary}");
    assert!(outcome.pauses > 0 && outcome.crashes > 1, "{summary}");
    assert!(report.inspects > 0, "no post-crash inspect\n{summary}");
}

/// The same run with a pruner removing every key and guard record idle for
/// 1 ms, again and again (docs/SPECIFICATION.md §1.8): keys vanish between
/// grants and come back above the watermark, lapsed holders' tokens meet
/// missing rows and pruned records. The checker's rules are the same; it
/// also insists that the pruner really removed keys and guard records.
/// Length: `LEASEHOLD_NEMESIS_PRUNE_SECS` (default 30).
#[test]
fn nemesis_run_with_a_concurrent_pruner_violates_no_invariant() {
    let secs = std::env::var("LEASEHOLD_NEMESIS_PRUNE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let seed = std::env::var("LEASEHOLD_NEMESIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let options = run::Options {
        duration: Duration::from_secs(secs),
        seed,
        workers: 4,
        keys: 6,
        verbose: false,
        prune: true,
    };
    let exe = std::env::current_exe().expect("test executable");
    let outcome = run::run(&options, &|| {
        let mut command = Command::new(&exe);
        command.args([
            "nemesis_worker_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ]);
        command
    });
    let summary = outcome.summary(&options);
    eprintln!("{summary}");
    let report = &outcome.report;
    assert!(report.violations.is_empty(), "{summary}");
    assert!(report.grants > 10, "too few grants\n{summary}");
    assert!(report.committed_writes > 0, "no write committed\n{summary}");
    assert!(outcome.crashes > 1, "{summary}");
    assert!(
        outcome.pruning.keys > 10 && outcome.pruning.guards > 0,
        "the pruner removed too little to mean anything\n{summary}"
    );
}

// ---- The checker's own tests: feed it broken histories. ----

const MS: i64 = 1_000;

fn grant(key: &str, owner: &str, epoch: i64, start_ms: i64, end_ms: i64) -> Event {
    Event::Grant {
        key: key.into(),
        owner: owner.into(),
        epoch,
        start: start_ms * MS,
        end: end_ms * MS,
    }
}

fn renew(key: &str, owner: &str, epoch: i64, at_ms: i64, end_ms: i64) -> Event {
    Event::Renew {
        key: key.into(),
        owner: owner.into(),
        epoch,
        at: at_ms * MS,
        end: end_ms * MS,
    }
}

fn release(key: &str, owner: &str, epoch: i64) -> Vec<Event> {
    vec![
        Event::ReleaseInvoke {
            key: key.into(),
            owner: owner.into(),
            epoch,
        },
        Event::ReleaseOk {
            key: key.into(),
            owner: owner.into(),
            epoch,
        },
    ]
}

fn invoke(op: &str, key: &str, owner: &str, epoch: i64, held: bool) -> Event {
    Event::WriteInvoke {
        op: op.into(),
        resource: format!("res-{key}"),
        key: key.into(),
        owner: owner.into(),
        epoch,
        held,
    }
}

fn write_ok(op: &str, seq: i64, at_ms: i64) -> Event {
    Event::WriteOk {
        op: op.into(),
        seq,
        at: at_ms * MS,
    }
}

fn row(op: &str, key: &str, epoch: i64, seq: i64, at_ms: i64) -> Event {
    Event::Row {
        op: op.into(),
        resource: format!("res-{key}"),
        epoch,
        seq,
        at: at_ms * MS,
    }
}

/// A history of everything that may legally happen: takeover exactly at
/// expiry, renewals, a release followed by a grant that read its start
/// time while waiting for the release's row lock, unknown outcomes, fenced
/// and refused writes, post-crash inspects.
fn legal_history() -> Vec<Event> {
    let mut h = vec![
        grant("k", "a", 1, 0, 100),
        renew("k", "a", 1, 60, 160),
        invoke("a-1", "k", "a", 1, true),
        write_ok("a-1", 1, 70),
        Event::RenewUnknown {
            key: "k".into(),
            owner: "a".into(),
            epoch: 1,
        },
        // Takeover exactly when the acknowledged renewal ran out.
        grant("k", "b", 2, 160, 260),
        // The stalled holder's token write is refused once b has written.
        invoke("b-1", "k", "b", 2, false),
        write_ok("b-1", 2, 170),
        invoke("a-2", "k", "a", 1, false),
        Event::WriteRefused {
            op: "a-2".into(),
            reason: "stale_epoch".into(),
        },
        renew("k", "b", 2, 200, 300),
        invoke("b-2", "k", "b", 2, true),
        Event::WriteUnknown { op: "b-2".into() },
        Event::Inspect {
            key: "k".into(),
            before: 180 * MS,
            after: 181 * MS,
            held: true,
            epoch: 2,
        },
    ];
    h.extend(release("k", "b", 2));
    h.extend([
        // Read its start while waiting on the release: before the release
        // committed, but after b's last proof of life (200).
        grant("k", "c", 4, 205, 305),
        // The same owner's idempotent re-acquire: the same grant again.
        grant("k", "c", 4, 205, 305),
        Event::AcquireUnknown {
            key: "k".into(),
            owner: "d".into(),
        },
        // d's unknown acquire did commit (epoch 5, unseen); e takes over.
        grant("k", "e", 6, 900, 1000),
        row("a-1", "k", 1, 1, 70),
        row("b-1", "k", 2, 2, 170),
        // b-2's outcome was unknown; it committed.
        row("b-2", "k", 2, 3, 201),
        // Distinct keys never interact: a grant of another key overlaps.
        grant("other", "a", 1, 50, 500),
    ]);
    h
}

#[test]
fn checker_accepts_a_legal_history_with_unknown_outcomes() {
    let report = check(&legal_history());
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.grants, 5);
    assert_eq!(report.takeovers, 2, "b after a, e after c's lapse");
    assert_eq!(report.committed_writes, 3);
    assert_eq!(report.refused_writes, 1);
}

#[test]
fn checker_round_trips_records_through_their_text_form_and_skips_torn_lines() {
    let history = legal_history();
    let mut text: String = history.iter().map(|e| e.to_line() + "\n").collect();
    text.push_str("grant key=k owner=z epo"); // torn by a SIGKILL
    assert_eq!(history::parse_history(&text), history);
}

fn kinds_of(history: &[Event]) -> Vec<Kind> {
    check(history).kinds()
}

#[test]
fn checker_catches_a_grant_overlapping_a_live_grant() {
    let history = [grant("k", "a", 1, 0, 100), grant("k", "b", 2, 99, 199)];
    assert_eq!(kinds_of(&history), [Kind::Overlap]);
}

#[test]
fn checker_catches_a_takeover_before_an_acknowledged_renewal_ran_out() {
    let history = [
        grant("k", "a", 1, 0, 100),
        renew("k", "a", 1, 50, 150),
        grant("k", "b", 2, 120, 220),
    ];
    assert_eq!(kinds_of(&history), [Kind::Overlap]);
    // Without the renewal it is legal: the renewal is what makes it wrong.
    assert_eq!(kinds_of(&[history[0].clone(), history[2].clone()]), []);
}

#[test]
fn checker_catches_a_takeover_before_a_group_heartbeat_ran_out() {
    let history = [
        grant("k", "a", 1, 0, 100),
        Event::GroupRenew {
            key: "k".into(),
            owner: "a".into(),
            epoch: 1,
            at: 50 * MS,
            end: 150 * MS,
        },
        grant("k", "b", 2, 120, 220),
    ];
    assert_eq!(kinds_of(&history), [Kind::Overlap]);
    assert_eq!(check(&history).group_renewals, 1);
}

#[test]
fn checker_catches_a_grant_before_the_releasing_holder_last_proved_itself_live() {
    let mut history = vec![grant("k", "a", 1, 0, 100), renew("k", "a", 1, 40, 140)];
    history.extend(release("k", "a", 1));
    history.push(grant("k", "b", 3, 30, 130));
    assert_eq!(kinds_of(&history), [Kind::Overlap]);
}

#[test]
fn checker_keeps_a_refused_release_from_ending_the_grant_early() {
    let history = [
        grant("k", "a", 1, 0, 100),
        Event::ReleaseInvoke {
            key: "k".into(),
            owner: "a".into(),
            epoch: 1,
        },
        Event::ReleaseLost {
            key: "k".into(),
            owner: "a".into(),
            epoch: 1,
            status: "epoch_mismatch".into(),
        },
        grant("k", "b", 2, 50, 150),
    ];
    // A definite refusal changed nothing: the grant ran until its expiry.
    assert_eq!(kinds_of(&history), [Kind::Overlap]);
    // Had the release's outcome been unknown, it may have ended the grant.
    let mut unknown = history.to_vec();
    unknown[2] = Event::ReleaseUnknown {
        key: "k".into(),
        owner: "a".into(),
        epoch: 1,
    };
    assert_eq!(kinds_of(&unknown), []);
}

#[test]
fn checker_catches_one_epoch_granted_to_two_owners() {
    let history = [grant("k", "a", 1, 0, 100), grant("k", "b", 1, 200, 300)];
    assert!(kinds_of(&history).contains(&Kind::DoubleGrant));
}

#[test]
fn checker_catches_a_later_grant_with_a_lower_epoch() {
    let history = [grant("k", "a", 5, 0, 100), grant("k", "b", 4, 200, 300)];
    assert!(kinds_of(&history).contains(&Kind::EpochOrder));
}

#[test]
fn checker_catches_an_epoch_counter_that_regressed_across_a_crash() {
    let inspect = |epoch| Event::Inspect {
        key: "k".into(),
        before: 150 * MS,
        after: 151 * MS,
        held: false,
        epoch,
    };
    // Granted epoch 5 (proven committed by the renewal at 50) before;
    // after the crash the counter says 3.
    let history = [
        grant("k", "a", 5, 0, 100),
        renew("k", "a", 5, 50, 150),
        inspect(3),
    ];
    assert_eq!(kinds_of(&history), [Kind::EpochRegressed]);
    // Without proof that the grant had committed (its statement read the
    // clock at 0 but may have committed after the inspect), no verdict.
    assert_eq!(kinds_of(&[grant("k", "a", 5, 0, 100), inspect(3)]), []);
    // The counter says 7 after the crash; a later grant reuses epoch 7.
    let history = [
        grant("k", "a", 5, 0, 100),
        inspect(7),
        grant("k", "b", 7, 200, 300),
    ];
    assert_eq!(kinds_of(&history), [Kind::EpochRegressed]);
    assert_eq!(kinds_of(&[grant("k", "a", 5, 0, 100), inspect(5)]), []);
}

#[test]
fn checker_catches_a_lower_epoch_write_committed_after_a_higher_one() {
    let history = [
        invoke("b-1", "k", "b", 2, false),
        invoke("a-1", "k", "a", 1, false),
        row("b-1", "k", 2, 1, 10),
        row("a-1", "k", 1, 2, 20),
    ];
    assert_eq!(kinds_of(&history), [Kind::StaleWriteCommitted]);
}

#[test]
fn checker_catches_a_refused_write_that_became_visible() {
    let history = [
        invoke("a-1", "k", "a", 1, false),
        Event::WriteRefused {
            op: "a-1".into(),
            reason: "stale_epoch".into(),
        },
        row("a-1", "k", 1, 1, 10),
    ];
    assert_eq!(kinds_of(&history), [Kind::RefusedWriteVisible]);
}

#[test]
fn checker_catches_a_lease_checked_write_that_began_after_a_takeover() {
    let history = [
        grant("k", "a", 1, 0, 100),
        grant("k", "b", 2, 100, 200),
        invoke("a-1", "k", "a", 1, true),
        row("a-1", "k", 1, 1, 150),
    ];
    assert_eq!(kinds_of(&history), [Kind::HeldWriteAfterTakeover]);
    // A token-only write is judged by the guard record alone (G4).
    let token_only = [
        history[0].clone(),
        history[1].clone(),
        invoke("a-1", "k", "a", 1, false),
        history[3].clone(),
    ];
    assert_eq!(kinds_of(&token_only), []);
}

#[test]
fn checker_catches_an_acknowledged_write_lost_after_a_crash() {
    let history = [
        invoke("a-1", "k", "a", 1, false),
        write_ok("a-1", 1, 10),
        invoke("a-2", "k", "a", 1, false),
        write_ok("a-2", 2, 11),
        row("a-1", "k", 1, 1, 10),
    ];
    assert_eq!(kinds_of(&history), [Kind::LostWrite]);
}

#[test]
fn checker_catches_a_row_nobody_wrote() {
    let history = [row("ghost", "k", 1, 1, 10)];
    assert_eq!(kinds_of(&history), [Kind::PhantomWrite]);
}
