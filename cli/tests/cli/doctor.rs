//! `leasehold doctor`: findings and exit codes against a healthy deployment
//! and misconfigured ones (each test breaks one thing and checks that the
//! finding for it, and only it, says so), and against the fast test server
//! (fsync off), which doctor must fail.

use leasehold_test_support::{Deployment, PgBouncer, PoolMode, TestDb, TestServer};
use serde_json::Value;

use crate::support::{run, Run};
use leasehold::admin::Operator;
use leasehold::Leases;

/// The throwaway servers of the other tests run with fsync and
/// synchronous_commit off (fast, and what doctor rightly flags), so these
/// tests use a durable one.
fn server() -> &'static TestServer {
    TestServer::durable_local()
}

fn deployment() -> Deployment {
    Deployment::new_on(server())
}

fn doctor(url: &str, extra: &[&str]) -> Run {
    let mut args = vec!["--database-url", url, "doctor"];
    args.extend_from_slice(extra);
    run(&args)
}

/// `doctor --json` as `url`: the exit code and the findings by name.
fn findings(url: &str) -> (i32, Value, Vec<(String, String)>) {
    let run = doctor(url, &["--json"]);
    let json = run.json();
    let list = json["findings"]
        .as_array()
        .unwrap_or_else(|| panic!("no findings: {run:?}"))
        .iter()
        .map(|f| {
            for field in ["name", "status", "detail", "action"] {
                assert!(f[field].is_string(), "{field} missing in {f}");
            }
            (
                f["name"].as_str().unwrap().to_owned(),
                f["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(json["exit_code"], run.code, "{json}");
    (run.code, json, list)
}

fn finding<'a>(json: &'a Value, name: &str) -> &'a Value {
    json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("no finding {name}: {json}"))
}

/// Every finding named in `not_ok` is not ok, every other one is.
fn only_these_not_ok(list: &[(String, String)], not_ok: &[&str]) {
    for (name, status) in list {
        if not_ok.contains(&name.as_str()) {
            assert_ne!(status, "ok", "{name} should not be ok: {list:?}");
        } else {
            assert_eq!(status, "ok", "{name}: {list:?}");
        }
    }
}

const ALL_CHECKS: [&str; 13] = [
    "server",
    "install",
    "upgrades",
    "privilege.act",
    "privilege.operate",
    "privilege.list",
    "namespaces",
    "synchronous_commit",
    "standby",
    "pooler",
    "listener",
    "clock",
    "storage",
];

#[test]
fn doctor_on_a_healthy_deployment_is_all_ok_and_exits_0() {
    let deployment = deployment();
    let owner_url = deployment.url_as(&deployment.owner);
    let (code, json, list) = findings(&owner_url);
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["healthy"], true);
    let names: Vec<&str> = list.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ALL_CHECKS, "{json}");
    only_these_not_ok(&list, &[]);
    assert!(
        finding(&json, "install")["detail"]
            .as_str()
            .unwrap()
            .contains("leasehold install"),
        "{json}"
    );
    assert!(
        finding(&json, "privilege.operate")["detail"]
            .as_str()
            .unwrap()
            .contains("every operator action"),
        "{json}"
    );
    assert!(
        finding(&json, "storage")["detail"]
            .as_str()
            .unwrap()
            .contains("prunable: 0 free and 0 lapsed longer than 168h ago"),
        "{json}"
    );

    // An application role: healthy too, it just may not operate or list.
    let (code, json, list) = findings(&deployment.url_as(&deployment.app));
    assert_eq!(code, 0, "{json}");
    only_these_not_ok(&list, &[]);
    assert!(finding(&json, "privilege.operate")["detail"]
        .as_str()
        .unwrap()
        .contains("no operator action"));
    assert!(finding(&json, "privilege.list")["detail"]
        .as_str()
        .unwrap()
        .contains("may not list"));

    let text = doctor(&owner_url, &[]);
    assert_eq!(text.code, 0, "{text:?}");
    assert!(text.stdout.contains("[ok  ] listener"), "{text:?}");
    assert!(text.stdout.contains("healthy: 13 checks"), "{text:?}");
}

#[test]
fn doctor_counts_prunable_free_and_long_lapsed_rows() {
    let deployment = deployment();
    let owner_url = deployment.url_as(&deployment.owner);
    let mut app = deployment.conn_as(&deployment.app);
    let lease = app
        .acquire("free", "a", std::time::Duration::from_secs(30))
        .unwrap()
        .granted()
        .unwrap();
    assert_eq!(
        app.release(&leasehold_test_support::grant("free", "a", lease.epoch()))
            .unwrap(),
        leasehold::Release::Released
    );
    assert!(app
        .acquire("held", "a", std::time::Duration::from_secs(30))
        .unwrap()
        .granted()
        .is_some());
    // A grant that expired eight days ago, written as the installing owner
    // (the table's owner) could leave it after a crash of its holder.
    deployment.admin_exec(&format!(
        "SET ROLE {}; INSERT INTO lease.leases (key, key_hash, owner, epoch, expires_at, first_epoch) \
         VALUES ('old', lease._key_hash('old'), 'gone', 1, clock_timestamp() - interval '8 days', 1)",
        deployment.owner
    ));
    let (code, json, _) = findings(&owner_url);
    assert_eq!(code, 0, "{json}");
    let detail = finding(&json, "storage")["detail"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        detail.contains("3 keys (1 held, 1 lapsed, 1 free)"),
        "{detail}"
    );
    assert!(
        detail.contains("prunable: 1 free and 1 lapsed longer than 168h ago"),
        "{detail}"
    );
    let run = doctor(&owner_url, &["--json", "--idle", "240h"]);
    let detail = finding(&run.json(), "storage")["detail"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        detail.contains("prunable: 1 free and 0 lapsed longer than 240h ago"),
        "{detail}"
    );
}

#[test]
fn doctor_without_leasehold_installed_fails_with_exit_12() {
    let db = TestDb::empty_on(server());
    let (code, json, list) = findings(&db.url);
    assert_eq!(code, 12, "{json}");
    assert_eq!(json["status"], "fail");
    let install = finding(&json, "install");
    assert_eq!(install["status"], "fail");
    assert!(install["action"]
        .as_str()
        .unwrap()
        .contains("leasehold install"));
    // The checks that need the schema are not run; the others are ok.
    assert!(!list.iter().any(|(name, _)| name.starts_with("privilege")));
    only_these_not_ok(&list, &["install"]);
    let text = doctor(&db.url, &[]);
    assert_eq!(text.code, 12);
    assert!(text.stdout.contains("[fail] install"), "{text:?}");
    assert!(text.stdout.contains("NOT healthy"), "{text:?}");
}

/// A namespace rule restored from another cluster whose role was not
/// created here admits nobody but superusers, and nothing else says so:
/// doctor names it with the statements that repair it, and creating the
/// role is one of them. (The other cluster is simulated: the rule's
/// recorded system identifier is changed; tests/extension/namespaces_restore.rs
/// restores a real dump into a second cluster.)
#[test]
fn doctor_names_a_namespace_rule_whose_role_is_missing_with_its_repair() {
    let deployment = deployment();
    let owner_url = deployment.url_as(&deployment.owner);
    let ghost = format!("{}_ghost", deployment.app);
    deployment.admin_exec(&format!("CREATE ROLE {ghost}"));
    deployment
        .conn_as(&deployment.owner)
        .bind_namespace("team/", &ghost)
        .unwrap();
    let (code, json, _) = findings(&owner_url);
    assert_eq!(code, 0, "{json}");
    deployment.admin_exec(&format!(
        "DROP ROLE {ghost}; \
         UPDATE lease.namespaces SET system_identifier = system_identifier # 1 WHERE prefix = 'team/'"
    ));
    let (code, json, list) = findings(&owner_url);
    assert_eq!(code, 11, "{json}");
    only_these_not_ok(&list, &["namespaces"]);
    let rule = finding(&json, "namespaces");
    let detail = rule["detail"].as_str().unwrap();
    assert!(
        detail.contains("'team/'") && detail.contains(&ghost),
        "{detail}"
    );
    let action = rule["action"].as_str().unwrap();
    assert!(
        action.contains(&format!("SELECT lease.bind_namespace('team/', '{ghost}')")),
        "{action}"
    );
    assert!(action.contains(&format!("CREATE ROLE {ghost}")), "{action}");
    let text = doctor(&owner_url, &[]);
    assert!(text.stdout.contains("[warn] namespaces"), "{text:?}");
    // An application role may not list the rules: not checked, not a fault.
    let (_, json, _) = findings(&deployment.url_as(&deployment.app));
    assert_eq!(finding(&json, "namespaces")["status"], "ok", "{json}");
    // Creating the role repairs the rule.
    deployment.admin_exec(&format!("CREATE ROLE {ghost}"));
    let (code, json, _) = findings(&owner_url);
    assert_eq!(code, 0, "{json}");
    deployment.admin_exec(&format!("DROP ROLE {ghost}"));
}

#[test]
fn doctor_warns_about_synchronous_commit_off_for_the_role_with_exit_11() {
    let deployment = deployment();
    deployment.admin_exec(&format!(
        "ALTER ROLE {} SET synchronous_commit = off",
        deployment.app
    ));
    let (code, json, list) = findings(&deployment.url_as(&deployment.app));
    assert_eq!(code, 11, "{json}");
    assert_eq!(json["status"], "warn");
    only_these_not_ok(&list, &["synchronous_commit"]);
    let sync = finding(&json, "synchronous_commit");
    assert_eq!(sync["status"], "warn");
    assert!(sync["action"]
        .as_str()
        .unwrap()
        .contains("synchronous_commit = on"));
    // Another role of the same database is unaffected.
    let (code, _, _) = findings(&deployment.url_as(&deployment.worker));
    assert_eq!(code, 0);
}

#[test]
fn doctor_fails_a_role_that_may_not_take_leases_and_names_the_grant() {
    let deployment = deployment();
    deployment.admin_exec(&format!(
        "SET ROLE {}; REVOKE EXECUTE ON FUNCTION lease.acquire(text, text, interval, interval) FROM PUBLIC",
        deployment.owner
    ));
    let app = &deployment.app;
    let (code, json, list) = findings(&deployment.url_as(app));
    assert_eq!(code, 12, "{json}");
    only_these_not_ok(&list, &["privilege.act"]);
    let act = finding(&json, "privilege.act");
    assert_eq!(act["status"], "fail");
    assert!(
        act["action"].as_str().unwrap().contains(&format!(
            "GRANT EXECUTE ON FUNCTION lease.acquire(text,text,interval,interval) TO {app}"
        )),
        "{act}"
    );
}

#[test]
fn doctor_warns_about_a_partial_operator_grant_and_pending_migrations() {
    let deployment = deployment();
    let owner = &deployment.owner;
    let op = &deployment.operator;
    deployment.admin_exec(&format!(
        "SET ROLE {owner}; GRANT EXECUTE ON FUNCTION lease.force_release(text) TO {op}"
    ));
    let (code, json, list) = findings(&deployment.url_as(op));
    assert_eq!(code, 11, "{json}");
    only_these_not_ok(&list, &["privilege.operate"]);
    let operate = finding(&json, "privilege.operate");
    assert!(
        operate["detail"]
            .as_str()
            .unwrap()
            .contains("may run lease.force_release(text) but not"),
        "{operate}"
    );

    // The newest migration's record missing: an upgrade is pending.
    deployment.admin_exec(&format!(
        "SET ROLE {owner}; DELETE FROM lease.schema_migrations WHERE version = '{}'",
        crate::support::newest_migration_version()
    ));
    let (code, json, list) = findings(&deployment.url_as(owner));
    assert_eq!(code, 11, "{json}");
    only_these_not_ok(&list, &["upgrades"]);
    let upgrades = finding(&json, "upgrades");
    assert!(
        upgrades["detail"].as_str().unwrap().contains(&format!(
            "pending migrations: {}",
            crate::support::newest_migration_version()
        )),
        "{upgrades}"
    );
    assert!(upgrades["action"]
        .as_str()
        .unwrap()
        .contains("leasehold install"));
}

/// Through PgBouncer in transaction mode, server sessions are shared
/// between client sessions: the pooler finding says so (exit 11).
#[test]
fn doctor_sees_a_transaction_mode_pooler() {
    let server = server();
    let db = TestDb::installed_on(server);
    let local = server.local_postgres().expect("a local server");
    let bouncer = PgBouncer::start(local, PoolMode::Transaction, 2);
    let (code, json, list) = findings(&bouncer.url_for(&db.name));
    assert_eq!(code, 11, "{json}");
    assert!(
        list.contains(&("pooler".to_owned(), "warn".to_owned())),
        "{json}"
    );
    assert!(
        finding(&json, "pooler")["detail"]
            .as_str()
            .unwrap()
            .contains("transaction or statement mode"),
        "{json}"
    );
    // Session mode forwards one server session per client: no warning,
    // and the port difference shows something sits in between.
    let session = PgBouncer::start(local, PoolMode::Session, 4);
    let (code, json, _) = findings(&session.url_for(&db.name));
    let pooler = finding(&json, "pooler");
    assert_eq!(pooler["status"], "ok", "{json}");
    assert!(
        pooler["detail"]
            .as_str()
            .unwrap()
            .contains("session mode or a proxy"),
        "{pooler}"
    );
    assert_eq!(code, 0, "{json}");
}

/// The other tests' server runs with fsync off: doctor fails it (exit 12)
/// and says how to fix it.
#[test]
fn doctor_fails_a_server_running_with_fsync_off() {
    let db = TestDb::installed_on(TestServer::local());
    let (code, json, _) = findings(&db.url);
    assert_eq!(code, 12, "{json}");
    let durability = finding(&json, "synchronous_commit");
    assert_eq!(durability["status"], "fail", "{json}");
    assert!(durability["detail"]
        .as_str()
        .unwrap()
        .contains("fsync is off"));
    assert!(durability["action"]
        .as_str()
        .unwrap()
        .contains("fsync = on"));
}

/// A role whose transactions are read-only by default cannot take leases
/// (as on a standby): the standby finding fails (exit 12).
#[test]
fn doctor_fails_a_read_only_role_like_a_standby() {
    let deployment = deployment();
    deployment.admin_exec(&format!(
        "ALTER ROLE {} SET default_transaction_read_only = on",
        deployment.app
    ));
    let (code, json, list) = findings(&deployment.url_as(&deployment.app));
    assert_eq!(code, 12, "{json}");
    only_these_not_ok(&list, &["standby"]);
    let standby = finding(&json, "standby");
    assert_eq!(standby["status"], "fail");
    assert!(standby["action"]
        .as_str()
        .unwrap()
        .contains("target_session_attrs=read-write"));
}

/// The operator GRANT the security guide gives (docs/guide/security.md),
/// run verbatim with its `ops` replaced by the deployment's operator role:
/// doctor then finds the operator's privileges complete, so a setup that
/// follows the guide is healthy.
#[test]
fn the_guides_operator_grant_is_complete_for_doctor() {
    let guide = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/guide/security.md"
    ))
    .expect("docs/guide/security.md");
    let start = guide
        .find("GRANT EXECUTE ON FUNCTION lease.fence")
        .expect("the guide's operator GRANT");
    let end = start + guide[start..].find(';').expect("the GRANT's end");
    let grant = &guide[start..end];
    assert!(grant.ends_with(" TO ops"), "{grant}");
    let deployment = deployment();
    let owner = &deployment.owner;
    let op = &deployment.operator;
    deployment.admin_exec(&format!(
        "SET ROLE {owner}; {} TO {op}",
        grant.trim_end_matches(" TO ops")
    ));
    let (code, json, list) = findings(&deployment.url_as(op));
    assert_eq!(code, 0, "{json}");
    only_these_not_ok(&list, &[]);
    assert!(
        finding(&json, "privilege.operate")["detail"]
            .as_str()
            .unwrap()
            .contains("every operator action"),
        "{json}"
    );
}
