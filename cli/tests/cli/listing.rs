//! `ls` and `watch`: the operator's view of every key.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use crate::support::{admin_exec, command, time_of, wait_until_server_time_passes, Db};

fn acquire(db: &Db, key: &str, owner: &str, ttl: &str) -> serde_json::Value {
    let (code, grant) = db.json(&["acquire", key, owner, "--ttl", ttl]);
    assert_eq!(code, 0, "{grant}");
    grant
}

#[test]
fn ls_lists_keys_under_a_prefix_with_state_holder_epoch_remaining() {
    let db = Db::installed();
    acquire(&db, "job-1", "worker-a", "1m");
    acquire(&db, "job-2", "worker-b", "1m");
    acquire(&db, "other", "worker-c", "1m");
    let (code, list) = db.json(&["ls", "job-"]);
    assert_eq!(code, 0, "{list}");
    let leases = list["leases"].as_array().unwrap();
    assert_eq!(leases.len(), 2, "{list}");
    assert_eq!(leases[0]["key"], "job-1");
    assert_eq!(leases[0]["state"], "held");
    assert_eq!(leases[0]["owner"], "worker-a");
    assert_eq!(leases[0]["epoch"], 1);
    let remaining = leases[0]["remaining_ms"].as_i64().unwrap();
    assert!(remaining > 0 && remaining <= 60_000, "{list}");

    let text = db.run(&["ls"]);
    assert_eq!(text.code, 0, "{text:?}");
    let lines: Vec<&str> = text.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "header and three keys: {text:?}");
    for column in ["KEY", "STATE", "HOLDER", "EPOCH", "EXPIRES_AT", "REMAINING"] {
        assert!(lines[0].contains(column), "{text:?}");
    }
    let empty = db.run(&["ls", "nothing-"]);
    assert_eq!(empty.code, 0);
    assert!(
        empty.stdout.contains("no lease keys start with"),
        "{empty:?}"
    );
}

#[test]
fn ls_shows_a_lapsed_grant_as_lapsed_with_its_former_holder() {
    let db = Db::installed();
    let grant = acquire(&db, "job-1", "worker-a", "200ms");
    wait_until_server_time_passes(&mut db.conn(), time_of(&grant["expires_at"]));
    let (_, list) = db.json(&["ls"]);
    assert_eq!(list["leases"][0]["state"], "lapsed", "{list}");
    assert_eq!(list["leases"][0]["remaining_ms"], serde_json::Value::Null);
    let text = db.run(&["ls"]);
    assert!(text.stdout.contains("(worker-a)"), "{text:?}");
    assert!(text.stdout.contains("lapsed "), "{text:?}");
}

#[test]
fn ls_without_the_privilege_says_so_and_exits_8() {
    let db = Db::installed();
    let role = format!("cli_reader_{}", std::process::id());
    admin_exec(&format!("CREATE ROLE {role} LOGIN"));
    let url = db.url.replacen("postgres@", &format!("{role}@"), 1);
    let denied = crate::support::run(&["--database-url", &url, "ls"]);
    assert_eq!(denied.code, 8, "{denied:?}");
    assert!(
        denied.stderr.contains("may not read lease.leases"),
        "{denied:?}"
    );
    assert!(
        denied.stderr.contains("leasehold inspect KEY"),
        "{denied:?}"
    );
    // inspect still works for that role: the API is open, the table is not.
    let inspect = crate::support::run(&["--database-url", &url, "inspect", "k"]);
    assert_eq!(inspect.code, 0, "{inspect:?}");
}

#[test]
fn watch_refreshes_until_count_and_marks_a_takeover() {
    let db = Db::installed();
    acquire(&db, "job-w", "worker-a", "1m");
    // Two refreshes 3 s apart; the change is made right after the first
    // one is read, and takes milliseconds.
    let mut child = command(&[
        "--database-url",
        &db.url,
        "--json",
        "watch",
        "job-",
        "--count",
        "2",
        "--interval",
        "3s",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn watch");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first: serde_json::Value =
        serde_json::from_str(&lines.next().expect("first refresh").expect("read")).unwrap();
    assert_eq!(first["refresh"], 1);
    assert_eq!(first["leases"][0]["owner"], "worker-a");
    assert_eq!(first["changed"], serde_json::json!([]));

    let mut conn = db.conn();
    let released = leasehold::release(&mut conn, "job-w", "worker-a", 1).unwrap();
    assert_eq!(released, leasehold::Release::Released);
    let taken = leasehold::acquire(&mut conn, "job-w", "worker-b", Duration::from_secs(60))
        .unwrap()
        .granted()
        .expect("granted");
    assert_eq!(taken.epoch(), 3);

    let second: serde_json::Value =
        serde_json::from_str(&lines.next().expect("second refresh").expect("read")).unwrap();
    assert_eq!(second["refresh"], 2);
    assert_eq!(second["changed"], serde_json::json!(["job-w"]));
    assert_eq!(second["leases"][0]["owner"], "worker-b");
    assert_eq!(second["leases"][0]["epoch"], 3);
    assert!(lines.next().is_none(), "watch --count 2 printed more");
    let status = child.wait().expect("wait for watch");
    assert_eq!(status.code(), Some(0));
}

#[test]
fn watch_text_shows_a_refresh_header_and_the_rows() {
    let db = Db::installed();
    acquire(&db, "job-t", "worker-a", "1m");
    let watch = db.run(&["watch", "--count", "1", "--interval", "100ms"]);
    assert_eq!(watch.code, 0, "{watch:?}");
    assert!(watch.stdout.starts_with("refresh 1 at "), "{watch:?}");
    assert!(
        watch.stdout.contains("job-t") && watch.stdout.contains("worker-a"),
        "{watch:?}"
    );
}
