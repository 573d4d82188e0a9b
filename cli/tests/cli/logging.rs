//! `LEASEHOLD_LOG` and `--trace-keys`: the library's spans on stderr, the
//! key names only when asked for, stdout untouched.

use crate::support::Db;
use leasehold::Leases;

const DEBUG: (&str, &str) = ("LEASEHOLD_LOG", "leasehold=debug");

/// The line the fmt subscriber writes when the `lease` span of `operation`
/// closes, if stderr has one.
fn lease_span_close<'a>(stderr: &'a str, operation: &str) -> Option<&'a str> {
    let operation = format!("operation=\"{operation}\"");
    stderr
        .lines()
        .find(|line| line.contains("lease{") && line.contains(&operation) && line.contains("close"))
}

#[test]
fn acquire_writes_its_lease_span_to_stderr_without_the_key() {
    let db = Db::installed();
    let run = db.run_with_env(
        &[DEBUG],
        &["acquire", "customer-4711", "worker-a", "--ttl", "30s"],
    );
    assert_eq!(run.code, 0, "{run:?}");
    let line = lease_span_close(&run.stderr, "acquire")
        .unwrap_or_else(|| panic!("no close line of the acquire span on stderr: {run:?}"));
    assert!(line.contains("outcome=\"granted\""), "{line}");
    assert!(line.contains("owner=\"worker-a\""), "{line}");
    assert!(line.contains("epoch=1"), "{line}");
    assert!(
        !run.stderr.contains("customer-4711"),
        "key names are hidden without --trace-keys: {run:?}"
    );
    // stdout is the usual result, with no log line in it.
    assert!(
        run.stdout
            .starts_with("acquired customer-4711 for worker-a at epoch 1"),
        "{run:?}"
    );
    assert!(!run.stdout.contains("lease{"), "{run:?}");
}

#[test]
fn trace_keys_puts_the_key_into_the_span() {
    let db = Db::installed();
    let run = db.run_with_env(
        &[DEBUG],
        &[
            "--trace-keys",
            "acquire",
            "customer-4711",
            "worker-a",
            "--ttl",
            "30s",
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    let line = lease_span_close(&run.stderr, "acquire")
        .unwrap_or_else(|| panic!("no close line of the acquire span on stderr: {run:?}"));
    assert!(line.contains("key=\"customer-4711\""), "{line}");
    assert!(line.contains("outcome=\"granted\""), "{line}");
}

/// Nothing is installed without LEASEHOLD_LOG, whatever RUST_LOG says and
/// with --trace-keys given: stderr stays empty.
#[test]
fn without_leasehold_log_stderr_stays_empty() {
    let db = Db::installed();
    for env in [
        &[][..],
        &[("RUST_LOG", "debug")][..],
        &[("LEASEHOLD_LOG", "")][..],
    ] {
        let run = db.run_with_env(
            env,
            &[
                "--trace-keys",
                "acquire",
                "job-1",
                "worker-a",
                "--ttl",
                "30s",
            ],
        );
        assert_eq!(run.code, 0, "{env:?}: {run:?}");
        assert_eq!(run.stderr, "", "{env:?}: nothing may be logged");
        assert!(run.stdout.starts_with("acquired job-1"), "{run:?}");
    }
}

#[test]
fn json_stdout_stays_one_json_value_while_logging() {
    let db = Db::installed();
    let granted = db.run_with_env(
        &[DEBUG],
        &["--json", "acquire", "job-2", "worker-a", "--ttl", "30s"],
    );
    assert_eq!(granted.code, 0, "{granted:?}");
    assert_eq!(granted.json()["epoch"], 1, "{granted:?}");
    assert!(
        lease_span_close(&granted.stderr, "acquire").is_some_and(|l| l.contains("\"granted\"")),
        "logging was on: {granted:?}"
    );

    // An error's JSON object too.
    let denied = db.run_with_env(
        &[DEBUG],
        &["--json", "acquire", "job-2", "worker-b", "--ttl", "30s"],
    );
    assert_eq!(denied.code, 3, "{denied:?}");
    assert_eq!(denied.json()["error"], "denied", "{denied:?}");
    assert!(
        lease_span_close(&denied.stderr, "acquire").is_some_and(|l| l.contains("\"denied\"")),
        "logging was on: {denied:?}"
    );
}

#[test]
fn a_waiting_acquire_logs_its_lease_wait_span() {
    let db = Db::installed();
    let first = db.run(&["acquire", "job-3", "worker-a", "--ttl", "300ms"]);
    assert_eq!(first.code, 0, "{first:?}");
    // The server lapses worker-a's grant during worker-b's wait.
    let run = db.run_with_env(
        &[DEBUG],
        &[
            "--json", "acquire", "job-3", "worker-b", "--ttl", "30s", "--wait", "20s",
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.json()["epoch"], 2, "{run:?}");
    let line = run
        .stderr
        .lines()
        .find(|line| line.contains("}: leasehold::waiter: close"))
        .unwrap_or_else(|| panic!("no close line of the lease_wait span: {run:?}"));
    assert!(line.contains("owner=\"worker-b\""), "{line}");
    assert!(line.contains("outcome=\"granted\""), "{line}");
    assert!(line.contains("epoch=2"), "{line}");
    assert!(!run.stderr.contains("job-3"), "{run:?}");
}

/// A value that is no filter is refused before the command runs: exit 2,
/// the variable named, and the key left alone.
#[test]
fn an_invalid_leasehold_log_is_refused_and_changes_nothing() {
    let db = Db::installed();
    let run = db.run_with_env(
        &[("LEASEHOLD_LOG", "leasehold=loud")],
        &["--json", "acquire", "job-4", "worker-a", "--ttl", "30s"],
    );
    assert_eq!(run.code, 2, "{run:?}");
    let error = run.json();
    assert_eq!(error["error"], "invalid_input", "{run:?}");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("LEASEHOLD_LOG=\"leasehold=loud\"")),
        "{run:?}"
    );
    assert!(
        db.conn().inspect("job-4").unwrap().is_none(),
        "the acquire must not have run"
    );
}
