//! The operator commands (`namespace bind | unbind | ls`, `force-release`,
//! `fence`, `generation raise`) and exit code 10, run as the roles of a [`Deployment`]: a
//! non-superuser owner installed leasehold, and the other roles log in as
//! themselves.

use leasehold_test_support::{Deployment, TestServer};
use serde_json::Value;

use crate::support::{command, Run};

fn deployment() -> Deployment {
    Deployment::new_on(TestServer::local())
}

/// Runs the binary as `role` against the deployment's database.
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

/// [`run_as`] with `--json`, stdout parsed.
fn json_as(deployment: &Deployment, role: &str, args: &[&str]) -> (i32, Value) {
    let mut full = vec!["--json"];
    full.extend_from_slice(args);
    let run = run_as(deployment, role, &full);
    (run.code, run.json())
}

fn grant_operator(deployment: &Deployment) {
    let owner = &deployment.owner;
    let sql = format!(
        "SET ROLE {owner}; GRANT EXECUTE ON FUNCTION lease.force_release(text), \
         lease.bind_namespace(text, text), lease.unbind_namespace(text), \
         lease.list_namespaces() TO {}",
        deployment.operator
    );
    deployment.admin_exec(&sql);
}

#[test]
fn namespace_bind_ls_and_unbind_as_a_granted_operator() {
    let deployment = deployment();
    grant_operator(&deployment);
    let op = &deployment.operator;
    let app = &deployment.app;

    let bound = run_as(&deployment, op, &["namespace", "bind", "billing/", app]);
    assert_eq!(bound.code, 0, "{bound:?}");
    assert!(bound.stdout.contains("only members of"), "{bound:?}");
    let (code, json) = json_as(
        &deployment,
        op,
        &["namespace", "bind", "billing/eu/", &deployment.worker],
    );
    assert_eq!((code, &json["bound"]), (0, &Value::Bool(true)), "{json}");

    let listed = run_as(&deployment, op, &["namespace", "ls"]);
    assert_eq!(listed.code, 0, "{listed:?}");
    let lines: Vec<&str> = listed.stdout.lines().collect();
    assert!(
        lines[0].starts_with("PREFIX")
            && lines[0].contains("ROLE")
            && lines[0].contains("CREATED_AT"),
        "{listed:?}"
    );
    assert!(
        lines[1].starts_with("billing/ ") && lines[1].contains(app.as_str()),
        "{listed:?}"
    );
    assert!(
        lines[2].starts_with("billing/eu/") && lines[2].contains(deployment.worker.as_str()),
        "{listed:?}"
    );

    let (code, json) = json_as(&deployment, op, &["namespace", "ls"]);
    assert_eq!(code, 0, "{json}");
    let rules = json["namespaces"].as_array().unwrap();
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[0]["prefix"], "billing/");
    assert_eq!(rules[0]["role"], app.as_str());
    assert_eq!(rules[0]["role_dropped"], false);
    assert!(rules[0]["created_at"].is_string());

    let (code, json) = json_as(&deployment, op, &["namespace", "unbind", "billing/eu/"]);
    assert_eq!((code, &json["removed"]), (0, &Value::Bool(true)), "{json}");
    let again = run_as(&deployment, op, &["namespace", "unbind", "billing/eu/"]);
    assert_eq!(again.code, 0, "{again:?}");
    assert!(again.stdout.contains("nothing changed"), "{again:?}");
    let (_, json) = json_as(&deployment, op, &["namespace", "unbind", "billing/"]);
    assert_eq!(json["removed"], true);
    let empty = run_as(&deployment, op, &["namespace", "ls"]);
    assert_eq!(empty.code, 0);
    assert!(empty.stdout.contains("no namespace rules"), "{empty:?}");
}

#[test]
fn namespace_ls_marks_a_rule_whose_role_was_dropped() {
    let deployment = deployment();
    let retired = format!("{}_retired", deployment.db.name);
    deployment.admin_exec(&format!("CREATE ROLE {retired}"));
    let owner = &deployment.owner;
    assert_eq!(
        run_as(
            &deployment,
            owner,
            &["namespace", "bind", "legacy/", &retired]
        )
        .code,
        0
    );
    deployment.admin_exec(&format!("DROP ROLE {retired}"));
    let listed = run_as(&deployment, owner, &["namespace", "ls"]);
    assert!(listed.stdout.contains("(dropped role, oid "), "{listed:?}");
    let (code, json) = json_as(&deployment, owner, &["namespace", "ls"]);
    assert_eq!(code, 0);
    let rule = &json["namespaces"][0];
    assert_eq!(rule["role"], Value::Null);
    assert_eq!(rule["role_dropped"], true);
    assert!(rule["dropped_role_oid"].as_i64().unwrap() > 0, "{json}");
}

#[test]
fn namespace_bind_with_bad_input_exits_2_naming_every_violation() {
    let deployment = deployment();
    let run = run_as(
        &deployment,
        &deployment.owner,
        &["namespace", "bind", "", "no_such_role"],
    );
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("prefix must not be empty"), "{run:?}");
    assert!(
        run.stderr.contains("there is no role 'no_such_role'"),
        "{run:?}"
    );
    let (code, json) = json_as(&deployment, &deployment.owner, &["namespace", "unbind", ""]);
    assert_eq!(
        (code, json["error"].as_str()),
        (2, Some("invalid_input")),
        "{json}"
    );
}

/// `generation show` works for any role; `generation raise` as a granted
/// operator refuses a generation at or below the current one (exit 2,
/// naming it, nothing changed) and moves every next grant above the new
/// generation's floor (docs/SPECIFICATION.md §1.2, §4.1).
#[test]
fn generation_show_for_anyone_and_raise_as_a_granted_operator() {
    let deployment = deployment();
    let owner = &deployment.owner;
    deployment.admin_exec(&format!(
        "SET ROLE {owner}; GRANT EXECUTE ON FUNCTION lease.raise_generation(bigint) TO {}",
        deployment.operator
    ));
    let op = &deployment.operator;
    let app = &deployment.app;

    let (code, json) = json_as(&deployment, app, &["generation", "show"]);
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["generation"], 0);
    assert_eq!(json["floor_epoch"], 1);
    let shown = run_as(&deployment, app, &["generation", "show"]);
    assert!(shown.stdout.contains("generation 0"), "{shown:?}");

    let refused = run_as(&deployment, op, &["generation", "raise", "0"]);
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(
        refused
            .stderr
            .contains("not above the current generation 0"),
        "{refused:?}"
    );
    let too_high = run_as(&deployment, op, &["generation", "raise", "8388608"]);
    assert_eq!(too_high.code, 2, "{too_high:?}");

    let (code, json) = json_as(&deployment, op, &["generation", "raise", "3"]);
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["generation"], 3);
    let floor = (3_i64 << 40) + 1;
    assert_eq!(json["floor_epoch"], floor);
    let (code, json) = json_as(
        &deployment,
        app,
        &["acquire", "gen-key", "a", "--ttl", "30s"],
    );
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["epoch"], floor, "{json}");
}

/// Operator actions are granted to nobody: every operator command run by a
/// role without the grant exits 10 and names the GRANT that would allow it.
#[test]
fn operator_commands_without_the_grant_exit_10_naming_the_grant() {
    let deployment = deployment();
    for role in [&deployment.app, &deployment.attacker, &deployment.operator] {
        for (args, function) in [
            (vec!["force-release", "k"], "lease.force_release(text)"),
            (
                vec!["release", "--force", "k", "--epoch", "1"],
                "lease.force_release(text, bigint)",
            ),
            (
                vec!["namespace", "bind", "p/", role.as_str()],
                "lease.bind_namespace(text, text)",
            ),
            (
                vec!["namespace", "unbind", "p/"],
                "lease.unbind_namespace(text)",
            ),
            (vec!["namespace", "ls"], "lease.list_namespaces()"),
            (
                vec!["generation", "raise", "1"],
                "lease.raise_generation(bigint)",
            ),
        ] {
            let run = run_as(&deployment, role, &args);
            assert_eq!(run.code, 10, "{args:?} as {role}: {run:?}");
            assert!(
                run.stderr
                    .contains(&format!("GRANT EXECUTE ON FUNCTION {function} TO {role}")),
                "{run:?}"
            );
            let mut json_args = vec!["--json"];
            json_args.extend_from_slice(&args);
            let run = run_as(&deployment, role, &json_args);
            let json = run.json();
            assert_eq!(json["error"], "not_granted", "{json}");
            assert_eq!(json["exit_code"], 10);
            assert_eq!(json["function"], function);
            assert_eq!(json["role"], role.as_str());
        }
    }
}

/// `fence` is an operator action too (needs the rewrite of migration
/// 000002 that revokes it from PUBLIC).
#[test]
fn fence_without_the_grant_exits_10() {
    let deployment = deployment();
    // G7: a fence reaches at most the key's counter (5 after this).
    for _ in 0..3 {
        let run = run_as(
            &deployment,
            &deployment.app,
            &["acquire", "k", "a", "--ttl", "30s"],
        );
        assert_eq!(run.code, 0, "{run:?}");
        let epoch = run
            .stdout
            .split("at epoch ")
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .unwrap()
            .to_owned();
        if epoch == "5" {
            break;
        }
        assert_eq!(
            run_as(&deployment, &deployment.app, &["release", "k", "a", &epoch]).code,
            0
        );
    }
    let run = run_as(
        &deployment,
        &deployment.app,
        &["fence", "r", "--key", "k", "--up-to", "5"],
    );
    assert_eq!(run.code, 10, "{run:?}");
    assert!(
        run.stderr
            .contains("GRANT EXECUTE ON FUNCTION lease.fence(text, text, bigint)"),
        "{run:?}"
    );
    deployment.admin_exec(&format!(
        "SET ROLE {}; GRANT EXECUTE ON FUNCTION lease.fence(text, text, bigint) TO {}",
        deployment.owner, deployment.app
    ));
    let (code, json) = json_as(
        &deployment,
        &deployment.app,
        &["fence", "r", "--key", "k", "--up-to", "5"],
    );
    assert_eq!(
        (code, json["accepted_epoch"].as_i64()),
        (0, Some(6)),
        "{json}"
    );
}

#[test]
fn force_release_frees_a_held_key_and_prints_the_counter() {
    let deployment = deployment();
    grant_operator(&deployment);
    let app = &deployment.app;
    let (code, grant) = json_as(
        &deployment,
        app,
        &["acquire", "job", "worker-a", "--ttl", "30s"],
    );
    assert_eq!(code, 0, "{grant}");

    let freed = run_as(&deployment, &deployment.operator, &["force-release", "job"]);
    assert_eq!(freed.code, 0, "{freed:?}");
    assert!(
        freed.stdout.contains("every epoch up to 2 is stale"),
        "{freed:?}"
    );
    assert!(
        freed
            .stdout
            .contains("leasehold fence RESOURCE --key job --up-to 2"),
        "{freed:?}"
    );

    // The old holder hears not_owner (exit 6); the key is free at counter 2.
    let renew = run_as(
        &deployment,
        app,
        &["renew", "job", "worker-a", "1", "--ttl", "30s"],
    );
    assert_eq!(renew.code, 6, "{renew:?}");
    let (_, state) = json_as(&deployment, app, &["inspect", "job"]);
    assert_eq!(
        (state["held"].as_bool(), state["epoch"].as_i64()),
        (Some(false), Some(2))
    );

    // Already free: the counter is reported unchanged.
    let (code, json) = json_as(&deployment, &deployment.operator, &["force-release", "job"]);
    assert_eq!(
        (code, json["epoch"].as_i64(), json["exists"].as_bool()),
        (0, Some(2), Some(true))
    );
    // Never leased: nothing to do, not an error.
    let (code, json) = json_as(
        &deployment,
        &deployment.operator,
        &["force-release", "other"],
    );
    assert_eq!(
        (code, &json["epoch"], json["exists"].as_bool()),
        (0, &Value::Null, Some(false))
    );
    let empty = run_as(&deployment, &deployment.operator, &["force-release", ""]);
    assert_eq!(empty.code, 2, "{empty:?}");
}

/// I15 through the command: a role outside the bound namespace exits 10
/// with the typed refusal (needs the "namespace checks" rewrite of
/// migrations 000001/000002).
#[test]
fn a_namespace_refusal_exits_10_naming_the_role_and_the_key() {
    let deployment = deployment();
    let owner = &deployment.owner;
    assert_eq!(
        run_as(
            &deployment,
            owner,
            &["namespace", "bind", "billing/", &deployment.app]
        )
        .code,
        0
    );
    let app = &deployment.app;
    assert_eq!(
        run_as(
            &deployment,
            app,
            &["acquire", "billing/k", "a", "--ttl", "30s"]
        )
        .code,
        0
    );

    let attacker = &deployment.attacker;
    let refused = run_as(
        &deployment,
        attacker,
        &["acquire", "billing/k", "x", "--ttl", "30s"],
    );
    assert_eq!(refused.code, 10, "{refused:?}");
    assert!(
        refused.stderr.contains("SET ROLE does not count"),
        "{refused:?}"
    );
    for args in [
        vec!["acquire", "billing/k", "x", "--ttl", "30s"],
        vec!["acquire", "billing/k", "x", "--ttl", "30s", "--wait", "2s"],
        vec!["renew", "billing/k", "a", "1", "--ttl", "30s"],
        vec!["release", "billing/k", "a", "1"],
        vec!["inspect", "billing/k"],
    ] {
        let mut json_args = vec!["--json"];
        json_args.extend_from_slice(&args);
        let run = run_as(&deployment, attacker, &json_args);
        assert_eq!(run.code, 10, "{args:?}: {run:?}");
        let json = run.json();
        assert_eq!(json["error"], "namespace_denied", "{json}");
        assert_eq!(json["argument"], "key");
        assert_eq!(json["name"], "billing/k");
        assert_eq!(json["role"], attacker.as_str());
    }
    let (_, state) = json_as(&deployment, app, &["inspect", "billing/k"]);
    assert_eq!(
        (state["owner"].as_str(), state["epoch"].as_i64()),
        (Some("a"), Some(1))
    );
}

/// `release --force KEY --epoch N` ends exactly grant N (exit 0, counter
/// printed), says so when it is over already (exit 0), and refuses to touch
/// a newer grant (exit 5) or an epoch never granted (exit 6); bad input is
/// exit 2 and changes nothing.
#[test]
fn release_force_ends_exactly_that_epoch_and_never_a_newer_grant() {
    let deployment = deployment();
    deployment.admin_exec(&format!(
        "SET ROLE {}; GRANT EXECUTE ON FUNCTION lease.force_release(text, bigint) TO {}",
        deployment.owner, deployment.operator
    ));
    let op = &deployment.operator;
    let app = &deployment.app;
    let (code, grant) = json_as(&deployment, app, &["acquire", "job", "a", "--ttl", "30s"]);
    assert_eq!((code, grant["epoch"].as_i64()), (0, Some(1)), "{grant}");

    for bad in [["--epoch", "0"], ["--epoch", "-3"]] {
        let args = ["release", "--force", "job", bad[0], bad[1]];
        let run = run_as(&deployment, op, &args);
        assert_eq!(run.code, 2, "{run:?}");
    }
    let (code, json) = json_as(
        &deployment,
        op,
        &["release", "--force", "job", "--epoch", "0"],
    );
    assert_eq!(
        (code, json["error"].as_str()),
        (2, Some("invalid_input")),
        "{json}"
    );
    assert!(json["message"]
        .as_str()
        .unwrap()
        .contains("epoch must be at least 1"));
    // Usage: --force needs --epoch, and takes no OWNER.
    assert_eq!(
        run_as(&deployment, op, &["release", "--force", "job"]).code,
        2
    );
    assert_eq!(
        run_as(
            &deployment,
            op,
            &["release", "--force", "job", "a", "--epoch", "1"]
        )
        .code,
        2
    );
    let (_, state) = json_as(&deployment, app, &["inspect", "job"]);
    assert_eq!(
        (state["held"].as_bool(), state["epoch"].as_i64()),
        (Some(true), Some(1))
    );

    let ended = run_as(
        &deployment,
        op,
        &["release", "--force", "job", "--epoch", "1"],
    );
    assert_eq!(ended.code, 0, "{ended:?}");
    assert!(ended.stdout.contains("ended grant 1 of job"), "{ended:?}");
    assert!(ended.stdout.contains("--up-to 2"), "{ended:?}");
    let (code, json) = json_as(
        &deployment,
        op,
        &["release", "--force", "job", "--epoch", "1"],
    );
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["status"], "already_free");
    assert_eq!(json["counter"], 2);

    let (code, grant) = json_as(&deployment, app, &["acquire", "job", "b", "--ttl", "30s"]);
    assert_eq!((code, grant["epoch"].as_i64()), (0, Some(3)), "{grant}");
    let newer = run_as(
        &deployment,
        op,
        &["release", "--force", "job", "--epoch", "1"],
    );
    assert_eq!(newer.code, 5, "{newer:?}");
    assert!(newer.stderr.contains("held under epoch 3"), "{newer:?}");
    let (code, json) = json_as(
        &deployment,
        op,
        &["release", "--force", "job", "--epoch", "2"],
    );
    assert_eq!(
        (code, json["error"].as_str()),
        (5, Some("newer_grant")),
        "{json}"
    );
    assert_eq!(json["counter"], 3);
    let (code, json) = json_as(
        &deployment,
        op,
        &["release", "--force", "job", "--epoch", "9"],
    );
    assert_eq!(
        (code, json["error"].as_str()),
        (6, Some("no_such_grant")),
        "{json}"
    );
    let (code, json) = json_as(
        &deployment,
        op,
        &["release", "--force", "nope", "--epoch", "1"],
    );
    assert_eq!(
        (code, json["error"].as_str()),
        (6, Some("no_such_grant")),
        "{json}"
    );
    assert_eq!(json["counter"], Value::Null);
    let (_, state) = json_as(&deployment, app, &["inspect", "job"]);
    assert_eq!(
        (
            state["held"].as_bool(),
            state["owner"].as_str(),
            state["epoch"].as_i64()
        ),
        (Some(true), Some("b"), Some(3))
    );
    let (code, json) = json_as(
        &deployment,
        op,
        &["release", "--force", "job", "--epoch", "3"],
    );
    assert_eq!(
        (code, json["status"].as_str(), json["counter"].as_i64()),
        (0, Some("released"), Some(4)),
        "{json}"
    );
}

/// `leasehold table`: the table's owner fences and unfences it; another
/// role is refused; the listing shows both kinds of fence.
#[test]
fn table_protect_ls_and_unprotect_as_the_owner_only() {
    let deployment = deployment();
    let owner = &deployment.owner;
    deployment.admin_exec(&format!(
        "SET ROLE {owner}; CREATE TABLE public.ledger (id int); CREATE TABLE public.items (tenant int, id int)"
    ));
    let fenced = run_as(
        &deployment,
        owner,
        &["table", "protect", "public.ledger", "ledger-writer"],
    );
    assert_eq!(fenced.code, 0, "{fenced:?}");
    let rows = run_as(
        &deployment,
        owner,
        &["table", "protect-rows", "public.items", "tenant/", "tenant"],
    );
    assert_eq!(rows.code, 0, "{rows:?}");
    let refused = run_as(
        &deployment,
        &deployment.attacker,
        &["table", "unprotect", "public.ledger"],
    );
    assert_ne!(refused.code, 0, "{refused:?}");
    assert!(refused.stderr.contains("does not own"), "{refused:?}");
    let (code, json) = json_as(&deployment, &deployment.app, &["table", "ls"]);
    assert_eq!(code, 0, "{json}");
    let tables = json["tables"].as_array().unwrap();
    assert_eq!(tables.len(), 2, "{json}");
    assert_eq!(tables[0]["table"], "public.items");
    assert_eq!(tables[0]["key"], "tenant/<tenant>");
    assert_eq!(tables[1]["key"], "ledger-writer");
    let (_, json) = json_as(&deployment, owner, &["table", "unprotect", "public.ledger"]);
    assert_eq!(json["removed"], true, "{json}");
    let again = run_as(&deployment, owner, &["table", "unprotect", "public.ledger"]);
    assert!(again.stdout.contains("had no fence"), "{again:?}");
}
