//! `ls` and `watch`: the operator's view of every key.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use crate::support::{admin_exec, command, time_of, wait_until_server_time_passes, Db};
use leasehold::Leases;

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
    let released = conn
        .release(&leasehold_test_support::grant("job-w", "worker-a", 1))
        .unwrap();
    assert_eq!(released, leasehold::Release::Released);
    let taken = conn
        .acquire("job-w", "worker-b", Duration::from_secs(60))
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

/// The keys of an `ls --json` run, in order.
fn listed_keys(db: &Db, args: &[&str]) -> Vec<String> {
    let mut full = vec!["ls"];
    full.extend_from_slice(args);
    let (code, list) = db.json(&full);
    assert_eq!(code, 0, "{args:?}: {list}");
    list["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["key"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn ls_filters_by_prefix_state_and_owner_sorts_and_limits() {
    let db = Db::installed();
    acquire(&db, "a-1", "w1", "1m");
    acquire(&db, "a-2", "w2", "10m");
    let freed = acquire(&db, "a-3", "w1", "1m");
    let (code, _) = db.json(&["release", "a-3", "w1", &freed["epoch"].to_string()]);
    assert_eq!(code, 0);
    let short = acquire(&db, "b-1", "w1", "200ms");
    wait_until_server_time_passes(&mut db.conn(), time_of(&short["expires_at"]));

    assert_eq!(listed_keys(&db, &[]), ["a-1", "a-2", "a-3", "b-1"]);
    assert_eq!(listed_keys(&db, &["--state", "held"]), ["a-1", "a-2"]);
    assert_eq!(
        listed_keys(&db, &["--state", "lapsed,free"]),
        ["a-3", "b-1"]
    );
    assert_eq!(
        listed_keys(&db, &["--state", "lapsed", "--state", "held"]),
        ["a-1", "a-2", "b-1"]
    );
    // --owner matches a lapsed grant's owner too, never a free key.
    assert_eq!(listed_keys(&db, &["--owner", "w1"]), ["a-1", "b-1"]);
    assert_eq!(listed_keys(&db, &["--owner", "w2"]), ["a-2"]);
    assert_eq!(
        listed_keys(&db, &["--prefix", "a-", "--state", "free"]),
        ["a-3"]
    );
    assert_eq!(listed_keys(&db, &["a-", "--owner", "w1"]), ["a-1"]);
    // Soonest expiry first (the lapsed one), free keys last.
    assert_eq!(
        listed_keys(&db, &["--sort", "expires"]),
        ["b-1", "a-1", "a-2", "a-3"]
    );
    // Highest epoch first (a-3's counter is 2), ties by key.
    assert_eq!(
        listed_keys(&db, &["--sort", "epoch"]),
        ["a-3", "a-1", "a-2", "b-1"]
    );
    assert_eq!(
        listed_keys(&db, &["--sort", "expires", "--limit", "2"]),
        ["b-1", "a-1"]
    );

    let none = db.run(&["ls", "--owner", "nobody"]);
    assert_eq!(none.code, 0, "{none:?}");
    assert!(
        none.stdout.contains("no lease keys match the filters"),
        "{none:?}"
    );
    for bad in [
        vec!["ls", "--state", "busy"],
        vec!["ls", "--sort", "owner"],
        vec!["ls", "--limit", "0"],
        vec!["ls", "a-", "--prefix", "b-"],
    ] {
        let run = db.run(&bad);
        assert_eq!(run.code, 2, "{bad:?}: {run:?}");
    }
}

/// `watch --events` prints one JSON line per event as it happens: the
/// `watching` line first, then a release's wake-up (the notification
/// waiters get) and the release itself, a new grant, a lapse and a
/// takeover, each with the key, and `loss` set for the losses. Each step
/// waits for the line announcing the previous one.
#[test]
fn watch_events_shows_wake_ups_grants_and_losses_as_they_happen() {
    let db = Db::installed();
    let first = acquire(&db, "job-e", "worker-a", "1m");
    acquire(&db, "other", "worker-z", "1m");
    let mut child = command(&[
        "--database-url",
        &db.url,
        "--json",
        "watch",
        "--events",
        "job-",
        "--interval",
        "100ms",
        "--count",
        "5",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn watch");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut next = move || -> serde_json::Value {
        let line = lines.next().expect("another event").expect("read");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    };
    let watching = next();
    assert_eq!(watching["event"], "watching", "{watching}");
    assert_eq!(
        (watching["keys"].as_i64(), watching["armed"].as_i64()),
        (Some(1), Some(1))
    );

    let mut conn = db.conn();
    let epoch = first["epoch"].as_i64().unwrap();
    assert_eq!(
        conn.release(&leasehold_test_support::grant("job-e", "worker-a", epoch))
            .unwrap(),
        leasehold::Release::Released
    );
    let wake = next();
    assert_eq!(
        (wake["event"].as_str(), wake["key"].as_str()),
        (Some("wake"), Some("job-e")),
        "{wake}"
    );
    let released = next();
    assert_eq!(released["event"], "released", "{released}");
    assert_eq!(released["loss"], true);
    assert_eq!(released["previous_owner"], "worker-a");
    assert_eq!(released["previous_epoch"], epoch);
    assert_eq!(released["epoch"], epoch + 1);
    assert!(released["at"].is_string());

    let short = conn
        .acquire("job-e", "worker-b", Duration::from_millis(300))
        .unwrap()
        .granted()
        .expect("granted");
    let acquired = next();
    assert_eq!(acquired["event"], "acquired", "{acquired}");
    assert_eq!(
        (acquired["owner"].as_str(), acquired["epoch"].as_i64()),
        (Some("worker-b"), Some(short.epoch().get()))
    );
    assert_eq!(acquired["loss"], false);

    let lapsed = next();
    assert_eq!(lapsed["event"], "lapsed", "{lapsed}");
    assert_eq!(lapsed["loss"], true);
    assert_eq!(lapsed["owner"], "worker-b");

    let taken = conn
        .acquire("job-e", "worker-c", Duration::from_secs(60))
        .unwrap()
        .granted()
        .expect("granted");
    let over = next();
    assert_eq!(over["event"], "taken_over", "{over}");
    assert_eq!(over["loss"], true);
    assert_eq!(
        (over["previous_owner"].as_str(), over["owner"].as_str()),
        (Some("worker-b"), Some("worker-c"))
    );
    assert_eq!(over["epoch"], taken.epoch().get());
    // --count 5 ends it: "other" (outside the watched prefix) never
    // produced an event.
    let status = child.wait().expect("wait for watch");
    assert_eq!(status.code(), Some(0));
}

/// `inspect` and `ls` say the same word for each state of a key: a lapsed
/// grant is `lapsed` in both (inspect said `free` before), with its
/// holder, and a force-released key is `free`, ended by the operator.
#[test]
fn inspect_and_ls_use_the_same_state_words() {
    let db = Db::installed();
    let (code, grant) = db.json(&["acquire", "job-l", "worker-a", "--ttl", "250ms"]);
    assert_eq!(code, 0, "{grant}");
    crate::support::wait_until_server_time_passes(
        &mut db.conn(),
        crate::support::time_of(&grant["expires_at"]),
    );
    acquire(&db, "job-f", "worker-b", "1m");
    assert_eq!(
        db.run(&["release", "--force", "job-f", "--epoch", "1"])
            .code,
        0
    );
    let (_, list) = db.json(&["ls", "job-"]);
    let listed: Vec<(String, String)> = list["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            (
                row["key"].as_str().unwrap().to_owned(),
                row["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("job-f".to_owned(), "free".to_owned()),
            ("job-l".to_owned(), "lapsed".to_owned())
        ]
    );
    let (code, lapsed) = db.json(&["inspect", "job-l"]);
    assert_eq!(code, 0, "{lapsed}");
    assert_eq!(
        (
            lapsed["state"].as_str(),
            lapsed["held"].as_bool(),
            lapsed["owner"].as_str()
        ),
        (Some("lapsed"), Some(false), Some("worker-a"))
    );
    let (_, free) = db.json(&["inspect", "job-f"]);
    assert_eq!(
        (
            free["state"].as_str(),
            free["ended"].as_str(),
            free["epoch"].as_i64()
        ),
        (Some("free"), Some("force_released"), Some(2))
    );
    let text = db.run(&["inspect", "job-l"]);
    assert!(text.stdout.contains("lapsed"), "{text:?}");
}
