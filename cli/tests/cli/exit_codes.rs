//! Every documented exit code, with the message saying what to do next and
//! the `--json` error object scripts read.

use diesel::connection::SimpleConnection;

use crate::support::{run, time_of, wait_until_server_time_passes, Db};

#[test]
fn help_documents_every_exit_code() {
    let help = run(&["--help"]);
    assert_eq!(help.code, 0);
    for line in [
        "0  ok",
        "2  invalid input",
        "3  denied",
        "4  lapsed",
        "5  epoch mismatch",
        "6  not owner",
        "7  wait timed out",
        "8  cannot connect",
        "9  guard refusal",
        "13  run: the command could not be started",
    ] {
        assert!(
            help.stdout.contains(line),
            "--help lacks {line:?}:\n{}",
            help.stdout
        );
    }
}

#[test]
fn acquire_held_by_another_owner_exits_3_naming_the_holder() {
    let db = Db::installed();
    assert_eq!(
        db.run(&["acquire", "k", "worker-a", "--ttl", "30s"]).code,
        0
    );
    let denied = db.run(&["acquire", "k", "worker-b", "--ttl", "30s"]);
    assert_eq!(denied.code, 3, "{denied:?}");
    assert!(denied.stderr.contains("held by \"worker-a\""), "{denied:?}");
    assert!(
        denied.stderr.contains("--wait"),
        "says what to do next: {denied:?}"
    );
    let (code, json) = db.json(&["acquire", "k", "worker-b", "--ttl", "30s"]);
    assert_eq!(code, 3);
    assert_eq!(json["error"], "denied");
    assert_eq!(json["exit_code"], 3);
    assert_eq!(json["holder"], "worker-a");
    assert_eq!(json["epoch"], 1);
}

#[test]
fn renew_after_takeover_exits_4_lapsed() {
    let db = Db::installed();
    let (code, grant) = db.json(&["acquire", "k", "worker-a", "--ttl", "250ms"]);
    assert_eq!(code, 0, "{grant}");
    wait_until_server_time_passes(&mut db.conn(), time_of(&grant["expires_at"]));
    assert_eq!(
        db.run(&["acquire", "k", "worker-b", "--ttl", "30s"]).code,
        0
    );
    let lapsed = db.run(&["renew", "k", "worker-a", "1", "--ttl", "30s"]);
    assert_eq!(lapsed.code, 4, "{lapsed:?}");
    assert!(lapsed.stderr.contains("lapsed"), "{lapsed:?}");
    assert!(
        lapsed.stderr.contains("acquire the key again"),
        "{lapsed:?}"
    );
    assert!(
        lapsed.stderr.contains("taken over at epoch 2"),
        "{lapsed:?}"
    );
    let (code, json) = db.json(&["release", "k", "worker-a", "1"]);
    assert_eq!(code, 4);
    assert_eq!(
        (json["error"].as_str(), json["newer_epoch"].as_i64()),
        (Some("lapsed"), Some(2))
    );
}

#[test]
fn renew_with_another_epoch_exits_5_epoch_mismatch() {
    let db = Db::installed();
    assert_eq!(
        db.run(&["acquire", "k", "worker-a", "--ttl", "30s"]).code,
        0
    );
    let mismatch = db.run(&["renew", "k", "worker-a", "7", "--ttl", "30s"]);
    assert_eq!(mismatch.code, 5, "{mismatch:?}");
    assert!(mismatch.stderr.contains("epoch_mismatch"), "{mismatch:?}");
}

#[test]
fn release_by_another_owner_exits_6_not_owner() {
    let db = Db::installed();
    assert_eq!(
        db.run(&["acquire", "k", "worker-a", "--ttl", "30s"]).code,
        0
    );
    let (code, json) = db.json(&["release", "k", "worker-b", "1"]);
    assert_eq!(code, 6, "{json}");
    assert_eq!(
        (json["error"].as_str(), json["sql_status"].as_str()),
        (Some("never_held"), Some("not_owner"))
    );
    assert_eq!(json["owner"], "worker-b");
    // Nothing changed.
    let (_, state) = db.json(&["inspect", "k"]);
    assert_eq!(state["owner"], "worker-a");
}

#[test]
fn acquire_wait_timeout_exits_7() {
    let db = Db::installed();
    assert_eq!(db.run(&["acquire", "k", "worker-a", "--ttl", "1m"]).code, 0);
    let timeout = db.run(&[
        "acquire", "k", "worker-b", "--ttl", "30s", "--wait", "200ms",
    ]);
    assert_eq!(timeout.code, 7, "{timeout:?}");
    assert!(
        timeout.stderr.contains("timed out after waiting 200ms"),
        "{timeout:?}"
    );
}

#[test]
fn invalid_input_exits_2_and_says_what_to_write() {
    let db = Db::installed();
    let no_unit = db.run(&["acquire", "k", "o", "--ttl", "30"]);
    assert_eq!(no_unit.code, 2, "{no_unit:?}");
    assert!(no_unit.stderr.contains("e.g. 30s"), "{no_unit:?}");
    // A fraction names its whole-number spelling; a negative says so
    // (instead of being taken for an option).
    let fraction = db.run(&["acquire", "k", "o", "--ttl", "1.5s"]);
    assert_eq!(fraction.code, 2, "{fraction:?}");
    assert!(
        fraction.stderr.contains("write 1s500ms for 1.5s"),
        "{fraction:?}"
    );
    let negative = db.run(&["acquire", "k", "o", "--ttl", "-5s"]);
    assert_eq!(negative.code, 2, "{negative:?}");
    assert!(
        negative.stderr.contains("\"-5s\" is negative"),
        "{negative:?}"
    );
    // A zero ttl passes the CLI's parser and is refused by the database.
    let zero = db.run(&["acquire", "k", "o", "--ttl", "0s"]);
    assert_eq!(zero.code, 2, "{zero:?}");
    assert!(zero.stderr.contains("ttl"), "{zero:?}");
    let (code, json) = db.json(&["acquire", "", "o", "--ttl", "1s"]);
    assert_eq!(code, 2);
    assert_eq!(json["error"], "invalid_input");
    assert!(json["message"]
        .as_str()
        .unwrap()
        .contains("KEY must not be empty"));
    let missing = db.run(&["renew", "k", "o"]);
    assert_eq!(missing.code, 2, "{missing:?}");
}

#[test]
fn unreachable_database_exits_8_and_hides_the_password() {
    let unreachable = run(&[
        "--database-url",
        "postgres://someone:secret@127.0.0.1:1/nowhere?connect_timeout=5",
        "inspect",
        "k",
    ]);
    assert_eq!(unreachable.code, 8, "{unreachable:?}");
    assert!(
        unreachable.stderr.contains("cannot connect"),
        "{unreachable:?}"
    );
    assert!(
        unreachable.stderr.contains("someone:***@"),
        "{unreachable:?}"
    );
    assert!(!unreachable.stderr.contains("secret"), "{unreachable:?}");
}

#[test]
fn database_without_leasehold_exits_8_and_says_install() {
    let db = Db::empty();
    let (code, json) = db.json(&["acquire", "k", "o", "--ttl", "1s"]);
    assert_eq!(code, 8, "{json}");
    assert_eq!(json["error"], "not_installed");
    assert!(json["message"]
        .as_str()
        .unwrap()
        .contains("leasehold install"));
}

#[test]
fn fence_with_another_lease_key_exits_9() {
    let db = Db::installed();
    // A fence may only go up to epochs the key granted.
    assert_eq!(db.run(&["acquire", "job-a", "w", "--ttl", "30s"]).code, 0);
    assert_eq!(
        db.run(&["fence", "reports", "--key", "job-a", "--up-to", "1"])
            .code,
        0
    );
    let (code, json) = db.json(&["fence", "reports", "--key", "job-b", "--up-to", "0"]);
    assert_eq!(code, 9, "{json}");
    assert_eq!(json["error"], "wrong_lease_key");
    assert_eq!(json["fenced_by"], "job-a");
}

#[test]
fn fence_above_the_keys_counter_exits_9_epoch_not_granted() {
    let db = Db::installed();
    assert_eq!(db.run(&["acquire", "job-c", "w", "--ttl", "30s"]).code, 0);
    let (code, json) = db.json(&["fence", "reports", "--key", "job-c", "--up-to", "2"]);
    assert_eq!(code, 9, "{json}");
    assert_eq!(json["error"], "epoch_not_granted");
    assert_eq!(json["counter"], 1);
    assert_eq!(json["presented_epoch"], 2);
}

#[test]
fn a_read_only_server_exits_8_and_says_to_connect_to_the_primary() {
    let db = Db::installed();
    assert_eq!(db.run(&["acquire", "k", "w", "--ttl", "30s"]).code, 0);
    // What a standby or a primary being demoted looks like to a new
    // session: every transaction is read-only.
    db.conn()
        .batch_execute(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_read_only = on', \
             current_database()); END $$",
        )
        .unwrap();
    for args in [
        &["acquire", "k2", "w", "--ttl", "30s"][..],
        &["renew", "k", "w", "1", "--ttl", "30s"],
        &["release", "k", "w", "1"],
        &["fence", "r", "--key", "k", "--up-to", "1"],
    ] {
        let (code, json) = db.json(args);
        assert_eq!(code, 8, "{args:?}: {json}");
        assert_eq!(json["error"], "read_only_server", "{args:?}: {json}");
        assert_eq!(json["operation"], args[0], "{json}");
        let message = json["message"].as_str().unwrap();
        assert!(
            message.contains("read-only") && message.contains("target_session_attrs=read-write"),
            "{message}"
        );
    }
    // Reads still work.
    assert_eq!(db.run(&["inspect", "k"]).code, 0);
}

/// A server that accepts and never answers: the command exits 8 within the
/// connect timeout (5 s by default) and says so, instead of hanging.
#[test]
fn a_server_that_never_answers_exits_8_within_the_connect_timeout() {
    let port = leasehold_test_support::fault_proxy::silent_server();
    let url = format!("postgres://nobody@127.0.0.1:{port}/db");
    let started = std::time::Instant::now();
    let run = crate::support::run(&["--database-url", &url, "inspect", "k"]);
    let took = started.elapsed();
    assert_eq!(run.code, 8, "{run:?}");
    assert!(run.stderr.contains("timeout"), "{run:?}");
    assert!(took < std::time::Duration::from_secs(15), "took {took:?}");
}

#[test]
fn subcommand_help_points_to_the_exit_codes_instead_of_repeating_them() {
    let top = run(&["--help"]);
    assert_eq!(top.code, 0);
    assert!(top.stdout.contains("Exit codes:\n  0  ok"), "{top:?}");
    for args in [
        &["acquire", "--help"][..],
        &["acquire", "-h"],
        &["namespace", "bind", "--help"],
        &["extension", "install", "--help"],
        &["local", "start", "--help"],
        &["install", "--help"],
    ] {
        let help = run(args);
        assert_eq!(help.code, 0, "{help:?}");
        assert!(
            !help.stdout.contains("0  ok") && !help.stdout.contains("9  guard refusal"),
            "{args:?} repeats the exit-code table:\n{}",
            help.stdout
        );
        assert!(
            help.stdout
                .trim_end()
                .ends_with("Exit codes: see `leasehold --help`."),
            "{args:?} does not point to the table:\n{}",
            help.stdout
        );
    }
    let run_help = run(&["run", "--help"]);
    assert!(
        !run_help.stdout.contains("9  guard refusal"),
        "{run_help:?}"
    );
    assert!(
        run_help.stdout.contains("CMD's own status")
            && run_help.stdout.contains("see `leasehold --help`"),
        "{run_help:?}"
    );
}
