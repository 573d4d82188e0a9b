//! The successful path of every one-shot subcommand, in text and JSON.

use crate::support::{command, time_of, Db};
use leasehold::guard::Check;
use leasehold::guard::Fencing;

#[test]
fn install_is_idempotent_and_reports_versions() {
    let db = Db::empty();
    let (code, first) = db.json(&["install"]);
    assert_eq!(code, 0, "{first}");
    assert!(!first["applied"].as_array().unwrap().is_empty(), "{first}");
    let (code, second) = db.json(&["install"]);
    assert_eq!(code, 0);
    assert_eq!(second["applied"], serde_json::json!([]));
    assert_eq!(second["installed"], first["installed"]);
    let text = db.run(&["install"]);
    assert_eq!(text.code, 0);
    assert!(text.stdout.contains("already installed"), "{text:?}");
}

#[test]
fn acquire_renew_release_inspect_round_trip_in_json() {
    let db = Db::installed();
    let (code, never) = db.json(&["inspect", "job-1"]);
    assert_eq!(code, 0);
    assert_eq!(never["exists"], false);

    let (code, grant) = db.json(&["acquire", "job-1", "worker-a", "--ttl", "30s"]);
    assert_eq!(code, 0, "{grant}");
    assert_eq!(grant["acquired"], true);
    assert_eq!(grant["epoch"], 1);
    assert_eq!(grant["token"], "lh1.1.job-1.worker-a");
    let expires = time_of(&grant["expires_at"]);

    let (code, held) = db.json(&["inspect", "job-1"]);
    assert_eq!(code, 0);
    assert_eq!(held["held"], true);
    assert_eq!(held["owner"], "worker-a");
    assert_eq!(held["epoch"], 1);
    assert_eq!(time_of(&held["expires_at"]), expires);

    // Same owner again: idempotent, same epoch and expiry.
    let (code, again) = db.json(&["acquire", "job-1", "worker-a", "--ttl", "30s"]);
    assert_eq!(code, 0);
    assert_eq!(again["epoch"], 1);
    assert_eq!(time_of(&again["expires_at"]), expires);

    let (code, renewed) = db.json(&["renew", "job-1", "worker-a", "1", "--ttl", "1m"]);
    assert_eq!(code, 0, "{renewed}");
    assert_eq!(renewed["status"], "ok");
    assert!(time_of(&renewed["expires_at"]) > expires);

    let (code, released) = db.json(&["release", "job-1", "worker-a", "1"]);
    assert_eq!(code, 0, "{released}");
    assert_eq!(released["status"], "ok");

    let (code, free) = db.json(&["inspect", "job-1"]);
    assert_eq!(code, 0);
    assert_eq!(free["held"], false);
    assert_eq!(free["owner"], serde_json::Value::Null);
    assert_eq!(free["epoch"], 2, "release moves the counter past the epoch");
}

/// `renew` and `release` take the token `acquire` printed; a second
/// release of the same grant answers `released` (exit 0), as `release
/// --force` answers `already_free`; a grant that never was is still
/// refused, and every refusal says what happened to the grant.
#[test]
fn renew_and_release_take_the_token_and_a_second_release_is_harmless() {
    let db = Db::installed();
    let (code, grant) = db.json(&["acquire", "job-2", "worker-b", "--ttl", "30s"]);
    assert_eq!(code, 0, "{grant}");
    let token = grant["token"].as_str().unwrap().to_owned();
    let expires = time_of(&grant["expires_at"]);

    let (code, renewed) = db.json(&["renew", "--token", &token, "--ttl", "1m"]);
    assert_eq!(code, 0, "{renewed}");
    assert_eq!(renewed["status"], "ok");
    assert!(time_of(&renewed["expires_at"]) > expires);

    let (code, released) = db.json(&["release", "--token", &token]);
    assert_eq!(code, 0, "{released}");
    assert_eq!(released["status"], "ok");
    let (code, again) = db.json(&["release", "--token", &token]);
    assert_eq!(code, 0, "{again}");
    assert_eq!(
        (again["status"].as_str(), again["sql_status"].as_str()),
        (Some("released"), Some("not_owner"))
    );
    let text = db.run(&["release", "job-2", "worker-b", "1"]);
    assert_eq!(text.code, 0, "{text:?}");
    assert!(
        text.stdout.contains("released already, by its holder"),
        "{text:?}"
    );

    // Renewing a released grant is still refused (not_owner, exit 6), and
    // so is releasing an epoch the key never had, or a key never leased.
    let (code, refused) = db.json(&["renew", "--token", &token, "--ttl", "1m"]);
    assert_eq!(
        (
            code,
            refused["error"].as_str(),
            refused["sql_status"].as_str()
        ),
        (6, Some("released"), Some("not_owner"))
    );
    let run = db.run(&["release", "job-2", "worker-b", "9"]);
    assert_eq!(run.code, 6, "{run:?}");
    assert!(run.stderr.contains("never_held"), "{run:?}");
    let run = db.run(&["release", "never-leased", "worker-b", "1"]);
    assert_eq!(run.code, 6, "{run:?}");
    assert!(run.stderr.contains("never_held"), "{run:?}");
    // A malformed token and a token next to positionals are usage errors.
    assert_eq!(db.run(&["release", "--token", "not-a-token"]).code, 2);
    assert_eq!(
        db.run(&["release", "job-2", "--token", &token]).code,
        2,
        "a token with a key"
    );
}

#[test]
fn text_output_names_epoch_token_and_state() {
    let db = Db::installed();
    let grant = db.run(&["acquire", "job-2", "worker-a", "--ttl", "1m30s"]);
    assert_eq!(grant.code, 0, "{grant:?}");
    assert!(
        grant
            .stdout
            .contains("acquired job-2 for worker-a at epoch 1"),
        "{grant:?}"
    );
    assert!(grant.stdout.contains("ttl 1m30s"), "{grant:?}");
    assert!(
        grant.stdout.contains("token: lh1.1.job-2.worker-a"),
        "{grant:?}"
    );
    let inspect = db.run(&["inspect", "job-2"]);
    assert_eq!(inspect.code, 0);
    let lines: Vec<&str> = inspect.stdout.lines().collect();
    assert!(lines[0].starts_with("KEY"), "{inspect:?}");
    assert!(
        lines[1].contains("held") && lines[1].contains("worker-a"),
        "{inspect:?}"
    );
}

#[test]
fn acquire_with_wait_gets_the_key_once_the_holder_lapses() {
    let db = Db::installed();
    let (code, first) = db.json(&["acquire", "job-3", "worker-a", "--ttl", "300ms"]);
    assert_eq!(code, 0, "{first}");
    // The server lapses worker-a's grant during worker-b's wait.
    let (code, second) = db.json(&[
        "acquire", "job-3", "worker-b", "--ttl", "30s", "--wait", "20s",
    ]);
    assert_eq!(code, 0, "{second}");
    assert_eq!(second["owner"], "worker-b");
    assert_eq!(second["epoch"], 2);
}

#[test]
fn fence_raises_the_guard_floor() {
    let db = Db::installed();
    // Grants up to epoch 3 (a fence may only go up to granted epochs).
    assert_eq!(db.run(&["acquire", "job-4", "w", "--ttl", "30s"]).code, 0);
    assert_eq!(db.run(&["release", "job-4", "w", "1"]).code, 0);
    assert_eq!(db.run(&["acquire", "job-4", "w", "--ttl", "30s"]).code, 0);
    let (code, fenced) = db.json(&["fence", "reports", "--key", "job-4", "--up-to", "3"]);
    assert_eq!(code, 0, "{fenced}");
    assert_eq!(fenced["accepted_epoch"], 4);
    let text = db.run(&["fence", "reports", "--key", "job-4", "--up-to", "2"]);
    assert_eq!(text.code, 0, "{text:?}");
    assert!(
        text.stdout.contains("admits epochs >= 4"),
        "a fence never lowers the floor: {text:?}"
    );

    let mut conn = db.conn();
    let stale =
        leasehold::FencingToken::new("job-4", "worker-a", leasehold::Epoch::from(3)).unwrap();
    match conn.admit("reports", &stale, Check::Token) {
        Err(e)
            if e.kind() == leasehold::ErrorKind::Fenced
                && e.refusal()
                    == Some(leasehold::Refusal::StaleEpoch {
                        accepted: leasehold::Epoch(4),
                    }) => {}
        other => panic!("epoch 3 must be refused after fence --up-to 3, got {other:?}"),
    }
}

/// Real processes, not threads: several `leasehold install` commands started
/// together against one empty database all succeed, exactly one of them
/// applies the migrations, and the result is what a library install gives.
#[test]
fn installers_in_separate_processes_started_together_all_succeed_once() {
    let db = Db::empty();
    let children: Vec<_> = (0..4)
        .map(|_| {
            command(&["--database-url", &db.url, "--json", "install"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for output in &outputs {
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let installing = outputs
        .iter()
        .filter(|o| !String::from_utf8_lossy(&o.stdout).contains("\"applied\":[]"))
        .count();
    assert_eq!(
        installing,
        1,
        "{:?}",
        outputs
            .iter()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .collect::<Vec<_>>()
    );
    let reference = Db::installed();
    assert_eq!(
        leasehold::admin::installed_versions(&mut db.conn()).unwrap(),
        leasehold::admin::installed_versions(&mut reference.conn()).unwrap()
    );
}
