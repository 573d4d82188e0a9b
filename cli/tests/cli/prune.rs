//! `leasehold prune --idle <duration> [--dry-run]`: what it removes, what a
//! dry run says and leaves alone, bad input (exit 2) and a role without the
//! grant (exit 10), driven as the real binary.

use leasehold_test_support::{query_lines, Deployment, TestServer};

use crate::support::{command, time_of, wait_until_server_time_passes, Db, Run};

/// Every key row and guard record, for "nothing changed".
fn rows(db: &Db) -> Vec<String> {
    let mut conn = db.conn();
    let mut rows = query_lines(
        &mut conn,
        "SELECT format('%s|%s|%s|%s', key, owner, epoch, expires_at) AS line FROM lease.leases ORDER BY key",
    );
    rows.extend(query_lines(
        &mut conn,
        "SELECT format('guard %s|%s', resource, accepted_epoch) AS line FROM lease.guards ORDER BY resource",
    ));
    rows.extend(query_lines(
        &mut conn,
        "SELECT format('sighting %s|%s', key_hash, epoch) AS line FROM lease.prune_sightings ORDER BY key_hash",
    ));
    rows
}

/// Acquires `key` for 1 ms and waits until it has been lapsed for 50 ms
/// on the server's clock.
fn lapsed_key(db: &Db, key: &str) -> i64 {
    let (code, json) = db.json(&["acquire", key, "a", "--ttl", "1ms"]);
    assert_eq!(code, 0, "{json}");
    let expires = time_of(&json["expires_at"]);
    wait_until_server_time_passes(&mut db.conn(), expires + chrono::Duration::milliseconds(50));
    json["epoch"].as_i64().unwrap()
}

#[test]
fn a_dry_run_says_what_it_would_remove_and_changes_nothing_then_prune_removes_it() {
    let db = Db::installed();
    let epoch = lapsed_key(&db, "job-1");
    assert_eq!(db.run(&["acquire", "held", "a", "--ttl", "30s"]).code, 0);
    let before = rows(&db);

    let (code, json) = db.json(&["prune", "--idle", "50ms", "--dry-run"]);
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["dry_run"], true);
    assert_eq!(json["keys_examined"], 2, "{json}");
    assert_eq!(json["keys_pruned"], 1, "{json}");
    assert_eq!(before, rows(&db), "a dry run wrote");
    let text = db.run(&["prune", "--idle", "50ms", "--dry-run"]);
    assert_eq!(text.code, 0, "{text:?}");
    assert!(
        text.stdout
            .contains("dry run, nothing changed: a prune now would remove 1 of 2 key rows"),
        "{text:?}"
    );
    assert_eq!(before, rows(&db), "a dry run wrote");

    let (code, json) = db.json(&["prune", "--idle", "50ms"]);
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["keys_pruned"], 1, "{json}");
    assert!(json["watermark"].as_i64().unwrap() >= epoch, "{json}");
    let (_, inspected) = db.json(&["inspect", "job-1"]);
    assert_eq!(inspected["exists"], false, "{inspected}");
    let (code, again) = db.json(&["acquire", "job-1", "b", "--ttl", "30s"]);
    assert_eq!(code, 0, "{again}");
    assert!(again["epoch"].as_i64().unwrap() > epoch, "{again}");
}

#[test]
fn bad_idle_times_exit_2_and_change_nothing() {
    let db = Db::installed();
    lapsed_key(&db, "k");
    let before = rows(&db);
    for idle in ["0s", "1000000h", "-1s", "soon"] {
        let run = db.run(&["prune", "--idle", idle]);
        assert_eq!(run.code, 2, "--idle {idle}: {run:?}");
        assert!(run.stderr.contains("idle"), "--idle {idle}: {run:?}");
    }
    let run = db.run(&["prune"]);
    assert_eq!(run.code, 2, "--idle is required: {run:?}");
    assert_eq!(before, rows(&db));
}

fn run_as(deployment: &Deployment, role: &str, args: &[&str]) -> Run {
    let url = deployment.url_as(role);
    let mut full = vec!["--database-url", url.as_str()];
    full.extend_from_slice(args);
    let output = command(&full).output().unwrap();
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

#[test]
fn a_role_without_the_grant_exits_10_with_the_grant_that_fixes_it() {
    let deployment = Deployment::new_on(TestServer::local());
    let operator = &deployment.operator;
    for dry in [false, true] {
        let mut args = vec!["prune", "--idle", "1h"];
        if dry {
            args.push("--dry-run");
        }
        let run = run_as(&deployment, operator, &args);
        assert_eq!(run.code, 10, "{run:?}");
        assert!(
            run.stderr.contains(&format!(
                "GRANT EXECUTE ON FUNCTION lease.prune_keys(interval, bytea, integer, boolean) TO {operator}"
            )),
            "{run:?}"
        );
    }
    deployment.admin_exec(&format!(
        "GRANT EXECUTE ON FUNCTION lease.prune_keys(interval, bytea, integer, boolean), \
         lease.prune_guards(interval, bytea, integer, boolean) TO {operator}"
    ));
    let run = run_as(&deployment, operator, &["prune", "--idle", "1h"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("removed 0 of 0 key rows"), "{run:?}");
}
