//! `leasehold demo` and the embedded default server.

use crate::support::run;

#[test]
fn demo_timeline_shows_takeover_refused_stale_write_and_intact_epochs() {
    let demo = run(&["demo"]);
    assert_eq!(demo.code, 0, "{demo:?}");
    let out = &demo.stdout;
    // In order: takeover, refusal of the stale write, crash, intact epochs.
    let positions: Vec<usize> = [
        "worker-b  acquire job-7 -> denied",
        "worker-b  acquire job-7 -> granted, epoch 2",
        "worker-a  heartbeat: renew -> lapsed",
        "REFUSED: stale epoch 1, job-7/result admits only epochs >= 2",
        "REFUSED: lease not held at epoch 1 (lapsed, and taken over at epoch 2)",
        "inspect job-7 before the crash: held by worker-b at epoch 2",
        "CRASH: SIGKILL",
        "inspect job-7 after the restart: held by worker-b at epoch 2",
        "epochs intact",
        "release job-7 -> ok",
        "psql      INSERT without presenting a token -> refused by the table itself",
    ]
    .iter()
    .map(|needle| {
        out.find(needle)
            .unwrap_or_else(|| panic!("timeline lacks {needle:?}:\n{out}"))
    })
    .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "out of order:\n{out}"
    );
    // Final state: only admitted writes, the guard record, the counter.
    assert!(
        out.contains("1      worker-a  partial result (40%)"),
        "{out}"
    );
    assert!(
        out.contains("2      worker-b  final result (100%)"),
        "{out}"
    );
    assert!(
        !out.contains("late result") && !out.contains("written past the library"),
        "a refused write is visible:\n{out}"
    );
    assert!(
        out.contains("guard job-7/result: fenced by lease key job-7, admits epochs >= 2"),
        "{out}"
    );
    assert!(out.contains("epoch 2 before the crash, 2 after"), "{out}");
}

/// Without a database URL a command refuses to run (exit 2) and says how
/// to name one: it never acts on a server nobody else sees. Not even
/// `force-release`, which would otherwise report "nothing changed" about a
/// database that is not the user's.
#[test]
fn without_a_database_url_a_command_refuses_and_says_how_to_name_one() {
    for args in [
        &["inspect", "job-1"][..],
        &["force-release", "nightly-billing"][..],
        &["doctor"][..],
    ] {
        let refused = run(args);
        assert_eq!(refused.code, 2, "{args:?}: {refused:?}");
        assert!(
            refused.stderr.contains("no database given")
                && refused.stderr.contains("--database-url")
                && refused.stderr.contains("--throwaway"),
            "{args:?}: {refused:?}"
        );
        assert!(refused.stdout.is_empty(), "{args:?}: {refused:?}");
    }
}

/// `--throwaway` asks for a server that lives for one command, and the
/// command says so on stderr.
#[test]
fn with_throwaway_a_command_runs_on_a_server_that_lives_for_it_alone() {
    let inspect = run(&["--throwaway", "inspect", "job-1"]);
    assert_eq!(inspect.code, 0, "{inspect:?}");
    assert!(
        inspect.stderr.contains("throwaway local PostgreSQL"),
        "{inspect:?}"
    );
    assert!(
        inspect
            .stderr
            .contains("nothing persists between invocations"),
        "{inspect:?}"
    );
    assert!(inspect.stdout.contains("never leased"), "{inspect:?}");
}
