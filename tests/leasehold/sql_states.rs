//! What the SQL must decide from the state it runs in, not from the state
//! a transaction began in or the collation its arguments carry
//! (docs/SPECIFICATION.md §1.3, §1.5, §4): namespace rules committed after
//! an old snapshot, nondeterministic collations on names and owners, an
//! install that meets a lock, transactions that began long before the call
//! (the clock at the call decides), REPEATABLE READ denials that would
//! wait, and lapsed keys taken over on the slow path.
//!
//! Each test failed on the SQL before the baseline rewrite, except those
//! whose documentation says otherwise: controls, which pass before and
//! after, and guards against mutants that the SQL of that time already
//! passed (a mutation run found no test that would notice the mutant).
//!
//! The SQL is called directly and its outcome read through `pg_temp.probe`
//! (see [`probe`]): a row, or the SQLSTATE and CONSTRAINT of the error.
//! States are written with raw SQL as the superuser where a test needs a
//! grant lapsed at a given instant, so nothing waits on a clock it does not
//! read.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_migrations::MigrationHarness;
use leasehold_test_support::Deployment;

use crate::common::*;
use leasehold::admin::Operator;

/// What a statement run through [`probe`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// Its first row as JSON (`row_to_json`), or "" when it returned none.
    Row(String),
    /// It raised an error.
    Failed {
        sqlstate: String,
        constraint: String,
        message: String,
    },
}

impl Outcome {
    fn failed_with(&self, state: &str, name: &str) -> bool {
        matches!(self, Outcome::Failed { sqlstate, constraint, .. }
            if sqlstate == state && constraint == name)
    }

    fn sqlstate(&self) -> &str {
        match self {
            Outcome::Row(_) => "00000",
            Outcome::Failed { sqlstate, .. } => sqlstate,
        }
    }
}

/// `{"column":value,...}`, as `row_to_json` writes a row.
fn row(json: &str) -> Outcome {
    Outcome::Row(json.to_owned())
}

/// Creates `pg_temp.probe` in the session. Run it before a test's `BEGIN`,
/// so that creating the function is no part of the transaction under test.
fn prepare_probe(conn: &mut PgConnection) {
    conn.batch_execute(
        "CREATE OR REPLACE FUNCTION pg_temp.probe(statement text) RETURNS text
         LANGUAGE plpgsql AS $f$
         DECLARE
             v_row text;
             v_state text;
             v_constraint text;
             v_message text;
         BEGIN
             EXECUTE 'SELECT row_to_json(r)::text FROM (' || statement || ') AS r LIMIT 1' INTO v_row;
             RETURN 'row' || chr(31) || COALESCE(v_row, '');
         EXCEPTION WHEN OTHERS OR query_canceled THEN
             GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE,
                                     v_constraint = CONSTRAINT_NAME,
                                     v_message = MESSAGE_TEXT;
             RETURN 'error' || chr(31) || v_state || chr(31) || v_constraint || chr(31) || v_message;
         END $f$;",
    )
    .expect("create pg_temp.probe");
}

/// Runs `sql` (a query) in a subtransaction and says what it did. An error
/// rolls back only the subtransaction, so the caller's transaction (and its
/// snapshot) goes on.
fn probe(conn: &mut PgConnection, sql: &str) -> Outcome {
    let line = query_lines(
        conn,
        &format!("SELECT pg_temp.probe({}) AS line", quote(sql)),
    )
    .remove(0);
    let mut fields = line.split('\u{1f}');
    match fields.next() {
        Some("row") => Outcome::Row(fields.next().unwrap_or_default().to_owned()),
        _ => Outcome::Failed {
            sqlstate: fields.next().unwrap_or_default().to_owned(),
            constraint: fields.next().unwrap_or_default().to_owned(),
            message: fields.next().unwrap_or_default().to_owned(),
        },
    }
}

/// A connection as `role` with `pg_temp.probe` ready.
fn session(deployment: &Deployment, role: &str) -> PgConnection {
    let mut conn = deployment.conn_as(role);
    prepare_probe(&mut conn);
    conn
}

/// The two isolation levels whose transactions keep one snapshot, each with
/// a tag for names of its own.
const OLD_SNAPSHOT_LEVELS: [(&str, &str); 2] = [("REPEATABLE READ", "rr"), ("SERIALIZABLE", "sr")];

/// A refusal because the namespace rules changed after the snapshot (40001
/// `lease_namespace_changed`), or because the current rules forbid the call
/// (42501 `lease_namespace_denied`).
fn refused_by_namespace(outcome: &Outcome) -> bool {
    outcome.failed_with("40001", "lease_namespace_changed")
        || outcome.failed_with("42501", "lease_namespace_denied")
}

/// Lets the operator role bind and unbind prefixes (docs/guide/security.md,
/// "Security model").
fn make_operator(deployment: &Deployment) {
    deployment
        .conn_as(&deployment.owner)
        .batch_execute(&format!(
            "GRANT EXECUTE ON FUNCTION lease.bind_namespace(text, text), \
             lease.unbind_namespace(text) TO {}",
            deployment.operator
        ))
        .unwrap();
}

/// Everything leasehold stores about leases, guards and groups, as the
/// superuser sees it.
fn whole_state(admin: &mut PgConnection) -> Vec<String> {
    let mut lines = table_snapshot(admin);
    lines.extend(query_lines(
        admin,
        "SELECT format('guard %s|%s|%s|%s', resource, lease_key, accepted_epoch, updated_at) AS line \
         FROM lease.guards ORDER BY resource",
    ));
    lines.extend(query_lines(
        admin,
        "SELECT format('group %s|%s|%s|%s', id, owner, expires_at, members) AS line \
         FROM lease.groups ORDER BY id",
    ));
    lines
}

/// Grants `key` to `owner` for a minute through the SQL; returns the epoch.
fn grant(conn: &mut PgConnection, key: &str, owner: &str) -> i64 {
    query_lines(
        conn,
        &format!(
            "SELECT epoch::text AS line FROM lease.acquire({}, {}, interval '1 min') WHERE acquired",
            quote(key),
            quote(owner)
        ),
    )
    .first()
    .unwrap_or_else(|| panic!("{key} was not granted to {owner}"))
    .parse()
    .unwrap()
}

/// Joins the grant (key, owner, epoch) to a new heartbeat group; returns
/// the group's id.
fn join(conn: &mut PgConnection, key: &str, owner: &str, epoch: i64) -> i64 {
    query_lines(
        conn,
        &format!(
            "SELECT group_id::text AS line FROM lease.join_group(ARRAY[{}], {}, ARRAY[{epoch}::bigint], \
             interval '1 min') WHERE status = 'ok'",
            quote(key),
            quote(owner)
        ),
    )
    .first()
    .unwrap_or_else(|| panic!("{key} did not join a group"))
    .parse()
    .unwrap()
}

/// Moves the grant's own expiry an hour into the past (superuser).
fn lapse(admin: &mut PgConnection, key: &str) {
    admin
        .batch_execute(&format!(
            "UPDATE lease.leases SET expires_at = clock_timestamp() - interval '1 hour' WHERE key = {}",
            quote(key)
        ))
        .unwrap();
}

/// Moves the group's expiry an hour into the past (superuser).
fn lapse_group(admin: &mut PgConnection, group: i64) {
    admin
        .batch_execute(&format!(
            "UPDATE lease.groups SET expires_at = clock_timestamp() - interval '1 hour' WHERE id = {group}"
        ))
        .unwrap();
}

/// Opens a READ COMMITTED transaction and makes it old: its `now()` is
/// 1.5 s behind `clock_timestamp()` when this returns.
fn begin_old_transaction(conn: &mut PgConnection) {
    conn.batch_execute("BEGIN; SELECT pg_sleep(1.5)").unwrap();
    assert!(
        query_bool(
            conn,
            "SELECT now() <= clock_timestamp() - interval '1.4 s' AS flag"
        ),
        "setup: the transaction is not old"
    );
}

/// The session's clock (`clock_timestamp()`) as text that reads back exactly.
fn clock_text(conn: &mut PgConnection) -> String {
    query_lines(conn, "SELECT clock_timestamp()::text AS line").remove(0)
}

fn pid_of(conn: &mut PgConnection) -> i32 {
    query_lines(conn, "SELECT pg_backend_pid()::text AS line")[0]
        .parse()
        .expect("a pid")
}

/// Waits until backend `pid` waits for a lock another transaction holds.
fn wait_until_blocked(observer: &mut PgConnection, pid: i32) {
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {pid} AND wait_event_type = 'Lock') AS flag"
    );
    for _ in 0..4_000 {
        if query_bool(observer, &sql) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("backend {pid} never waited on a lock");
}

/// When backend `pid` began waiting for the lock it waits for
/// (`pg_locks.waitstart`, the server's clock), as text.
fn lock_wait_start(observer: &mut PgConnection, pid: i32) -> String {
    let sql = format!(
        "SELECT waitstart::text AS line FROM pg_locks \
         WHERE pid = {pid} AND NOT granted AND waitstart IS NOT NULL"
    );
    for _ in 0..4_000 {
        if let Some(start) = query_lines(observer, &sql).into_iter().next() {
            return start;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("backend {pid} never waited on a lock");
}

/// Runs `call` on its own thread and returns its result, failing the test
/// (instead of hanging it) if the call has not returned after a minute.
fn returns<T: Send + 'static>(what: &str, call: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(call());
    });
    receiver
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what} had not returned after 60 s"))
}

/// An error's Display with those of its sources, outermost first.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut chain = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        chain = format!("{chain}: {inner}");
        cause = inner.source();
    }
    chain
}

/// Fails with every mismatch at once, so that one run names every call
/// that went wrong.
#[track_caller]
fn assert_no_mismatch(mismatches: &[String]) {
    assert!(
        mismatches.is_empty(),
        "{} call(s) went wrong:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

// ---------------------------------------------------------------------------
// 5. Old snapshots and new namespace rules (§4)
// ---------------------------------------------------------------------------

/// Hole: a REPEATABLE READ or SERIALIZABLE transaction read the namespace
/// rules in its snapshot, so a rule committed after the snapshot did not
/// govern it: a role outside the new rule's role acquired a key under the
/// prefix, and the role the prefix was bound to was then refused its own
/// key. Must hold: the old transaction's acquire fails (40001
/// `lease_namespace_changed`, or 42501 `lease_namespace_denied`), writes
/// nothing, and the bound role then acquires the key. Covers the first
/// rule ever bound (an empty rules table) and a later one.
#[test]
fn an_old_snapshot_does_not_let_a_role_outside_a_new_namespace_acquire_in_it() {
    let deployment = Deployment::new();
    make_operator(&deployment);
    let mut operator = deployment.conn_as(&deployment.operator);
    let mut admin = deployment.admin();
    let mut app = session(&deployment, &deployment.app);
    let mut mismatches = Vec::new();
    for (level, tag) in OLD_SNAPSHOT_LEVELS {
        let key = format!("{tag}/job");
        let mut attacker = session(&deployment, &deployment.attacker);
        attacker
            .batch_execute(&format!("BEGIN ISOLATION LEVEL {level}; SELECT 1"))
            .unwrap();
        operator
            .bind_namespace(&format!("{tag}/"), &deployment.app)
            .unwrap();
        let outcome = probe(
            &mut attacker,
            &format!(
                "SELECT acquired FROM lease.acquire({}, 'x', interval '1 min')",
                quote(&key)
            ),
        );
        let _ = attacker.batch_execute("COMMIT");
        if !refused_by_namespace(&outcome) {
            mismatches.push(format!(
                "{level}: the old transaction's acquire of {key}, bound to the app after its snapshot: {outcome:?}"
            ));
        }
        if let Some(stored) = raw_row(&mut admin, &key) {
            mismatches.push(format!("{level}: {key} was written: {stored}"));
        }
        let own = probe(
            &mut app,
            &format!(
                "SELECT acquired FROM lease.acquire({}, 'app-1', interval '1 min')",
                quote(&key)
            ),
        );
        if own != row(r#"{"acquired":true}"#) {
            mismatches.push(format!(
                "{level}: the app acquiring its own prefix's key {key}: {own:?}"
            ));
        }
    }
    assert_no_mismatch(&mismatches);
}

/// Hole: a prefix rebound from role A to role B after the snapshot of a
/// transaction of a member of A was still A's for that transaction, so it
/// acquired a key that is now B's. Must hold: the acquire fails with 40001
/// `lease_namespace_changed` or 42501 `lease_namespace_denied`, writes
/// nothing, and B then acquires the key.
#[test]
fn an_old_snapshot_does_not_keep_a_rebound_prefix_for_its_old_role() {
    let deployment = Deployment::new();
    make_operator(&deployment);
    let mut operator = deployment.conn_as(&deployment.operator);
    let mut admin = deployment.admin();
    let mut worker = session(&deployment, &deployment.worker);
    let mut mismatches = Vec::new();
    for (level, tag) in OLD_SNAPSHOT_LEVELS {
        let prefix = format!("{tag}-rebound/");
        let key = format!("{prefix}job");
        operator.bind_namespace(&prefix, &deployment.app).unwrap();
        let mut app = session(&deployment, &deployment.app);
        app.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}; SELECT 1"))
            .unwrap();
        operator
            .bind_namespace(&prefix, &deployment.worker)
            .unwrap();
        let outcome = probe(
            &mut app,
            &format!(
                "SELECT acquired FROM lease.acquire({}, 'app-1', interval '1 min')",
                quote(&key)
            ),
        );
        let _ = app.batch_execute("COMMIT");
        if !refused_by_namespace(&outcome) {
            mismatches.push(format!(
                "{level}: the app's old transaction acquiring {key}, rebound to the worker after its snapshot: {outcome:?}"
            ));
        }
        if let Some(stored) = raw_row(&mut admin, &key) {
            mismatches.push(format!("{level}: {key} was written: {stored}"));
        }
        let own = probe(
            &mut worker,
            &format!(
                "SELECT acquired FROM lease.acquire({}, 'worker-1', interval '1 min')",
                quote(&key)
            ),
        );
        if own != row(r#"{"acquired":true}"#) {
            mismatches.push(format!(
                "{level}: the worker acquiring its prefix's key {key}: {own:?}"
            ));
        }
    }
    assert_no_mismatch(&mismatches);
}

/// A read-only transaction cannot lock, so its calls (inspect) read the
/// rules and the rows as of its snapshot (docs/SPECIFICATION.md §4.2) and
/// do not try the lock that guards an old snapshot. A guard against a
/// mutant (the lock tried in read-only transactions too, which fails every
/// such call): in a REPEATABLE READ READ ONLY transaction the role a
/// prefix is bound to inspects its own held key, and an outsider is
/// refused by the rule.
#[test]
fn a_read_only_transaction_inspects_under_the_rules_of_its_snapshot() {
    let deployment = Deployment::new();
    make_operator(&deployment);
    let mut operator = deployment.conn_as(&deployment.operator);
    operator.bind_namespace("ro/", &deployment.app).unwrap();
    let mut app = session(&deployment, &deployment.app);
    let mut worker = session(&deployment, &deployment.worker);
    assert_eq!(
        probe(
            &mut app,
            "SELECT acquired FROM lease.acquire('ro/job', 'app-1', interval '1 min')"
        ),
        row(r#"{"acquired":true}"#)
    );
    let inspect = "SELECT held, owner FROM lease.inspect('ro/job')";
    for conn in [&mut app, &mut worker] {
        conn.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .unwrap();
    }
    assert_eq!(
        probe(&mut app, inspect),
        row(r#"{"held":true,"owner":"app-1"}"#)
    );
    let outsider = probe(&mut worker, inspect);
    assert!(
        outsider.failed_with("42501", "lease_namespace_denied"),
        "{outsider:?}"
    );
    for conn in [&mut app, &mut worker] {
        conn.batch_execute("COMMIT").unwrap();
    }
}

/// Hole: the attacker held a key before its prefix was bound to the app;
/// in a transaction whose snapshot predates the rule it went on renewing,
/// admitting with and releasing that key, which the rule forbids it from
/// then on. Must hold: each of renew, admit and release fails with 40001
/// `lease_namespace_changed` or 42501 `lease_namespace_denied`, and nothing
/// changes (the grant's expiry, the guard table, the grant itself).
#[test]
fn an_old_snapshot_does_not_let_renew_admit_or_release_act_under_a_new_namespace() {
    let deployment = Deployment::new();
    make_operator(&deployment);
    let mut operator = deployment.conn_as(&deployment.operator);
    let mut admin = deployment.admin();
    let mut mismatches = Vec::new();
    for (level, tag) in OLD_SNAPSHOT_LEVELS {
        let prefix = format!("{tag}-held/");
        let key = format!("{prefix}k");
        let resource = format!("{prefix}res");
        let mut attacker = session(&deployment, &deployment.attacker);
        let epoch = grant(&mut attacker, &key, "x");
        let before = whole_state(&mut admin);
        attacker
            .batch_execute(&format!("BEGIN ISOLATION LEVEL {level}; SELECT 1"))
            .unwrap();
        operator.bind_namespace(&prefix, &deployment.app).unwrap();
        let (k, r) = (quote(&key), quote(&resource));
        for sql in [
            format!("SELECT status FROM lease.renew({k}, 'x', {epoch}, interval '1 hour')"),
            format!("SELECT lease.admit({r}, {k}, {epoch})"),
            format!("SELECT status FROM lease.release({k}, 'x', {epoch})"),
        ] {
            let outcome = probe(&mut attacker, &sql);
            if !refused_by_namespace(&outcome) {
                mismatches.push(format!("{level}: {sql}: {outcome:?}"));
            }
        }
        let _ = attacker.batch_execute("COMMIT");
        if whole_state(&mut admin) != before {
            mismatches.push(format!(
                "{level}: the state changed: {:?} -> {:?}",
                before,
                whole_state(&mut admin)
            ));
        }
    }
    assert_no_mismatch(&mismatches);
}

/// Control (passes before and after the rewrite): under READ COMMITTED a
/// new statement sees a rule committed after the transaction began, so the
/// attacker's acquire is refused with 42501 `lease_namespace_denied` and
/// writes nothing; the app then acquires the key.
#[test]
fn control_read_committed_sees_a_new_namespace_rule_at_its_next_statement() {
    let deployment = Deployment::new();
    make_operator(&deployment);
    let mut operator = deployment.conn_as(&deployment.operator);
    let mut admin = deployment.admin();
    let mut attacker = session(&deployment, &deployment.attacker);
    attacker.batch_execute("BEGIN; SELECT 1").unwrap();
    operator.bind_namespace("rc/", &deployment.app).unwrap();
    let outcome = probe(
        &mut attacker,
        "SELECT acquired FROM lease.acquire('rc/job', 'x', interval '1 min')",
    );
    attacker.batch_execute("COMMIT").unwrap();
    assert!(
        outcome.failed_with("42501", "lease_namespace_denied"),
        "{outcome:?}"
    );
    assert_eq!(raw_row(&mut admin, "rc/job"), None);
    let mut app = session(&deployment, &deployment.app);
    assert_eq!(
        probe(
            &mut app,
            "SELECT acquired FROM lease.acquire('rc/job', 'app-1', interval '1 min')"
        ),
        row(r#"{"acquired":true}"#)
    );
}

// ---------------------------------------------------------------------------
// 7a. Collations: names and owners compare as bytes
// ---------------------------------------------------------------------------

/// Creates `public.ci`, a case-insensitive nondeterministic ICU collation,
/// in the deployment's database (collations are usable by every role).
fn create_case_insensitive_collation(deployment: &Deployment) {
    let mut admin = deployment.admin();
    assert!(
        query_bool(
            &mut admin,
            "SELECT count(*) > 0 AS flag FROM pg_collation WHERE collprovider = 'i'"
        ),
        "the test server has no ICU collations; these tests need a server built with ICU"
    );
    admin
        .batch_execute(
            "CREATE COLLATION public.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
        )
        .unwrap();
}

/// What a call must answer: this row, or this error (SQLSTATE, CONSTRAINT).
#[derive(Debug, Clone, Copy)]
enum Expect {
    Row(&'static str),
    Error(&'static str, &'static str),
}

impl Expect {
    fn met_by(self, outcome: &Outcome) -> bool {
        match self {
            Expect::Row(json) => outcome == &row(json),
            Expect::Error(state, name) => outcome.failed_with(state, name),
        }
    }
}

/// Hole: a PL/pgSQL function compares its parameters in the collation the
/// caller's arguments carry, so an owner passed `COLLATE` a case-insensitive
/// collation (or any argument so passed: all of a call's parameters take
/// that collation) matched the holder's owner in another case: `'WORKER-1'`
/// renewed, released, checked, admitted with, regrouped and heartbeat the
/// grant of `'Worker-1'`, and acquire answered it as the holder. Must hold:
/// owners compare as bytes whatever collation any argument carries: renew,
/// release, renew_many, release_many, join_group and renew_group answer
/// `not_owner`, acquire is denied, check_held, admit_held and renew_admit
/// raise `lease_guard_lease_not_held` (55000), and nothing changes. Each
/// call gets a grant of its own, so that one call that acts cannot change
/// what the next one is judged against.
#[test]
fn owners_compare_as_bytes_whatever_collation_the_arguments_carry() {
    let deployment = Deployment::new();
    create_case_insensitive_collation(&deployment);
    let mut admin = deployment.admin();
    let mut app = session(&deployment, &deployment.app);
    let mut attacker = session(&deployment, &deployment.attacker);
    const NOT_OWNER: Expect = Expect::Row(r#"{"status":"not_owner"}"#);
    const NOT_HELD: Expect = Expect::Error("55000", "lease_guard_lease_not_held");
    let calls: [(&str, Expect); 10] = [
        ("SELECT status FROM lease.renew({k}, {o}, {e}, interval '1 hour')", NOT_OWNER),
        ("SELECT status FROM lease.release({k}, {o}, {e})", NOT_OWNER),
        (
            "SELECT status FROM lease.renew_many(ARRAY[{k}], {o}, ARRAY[{e}::bigint], interval '1 hour')",
            NOT_OWNER,
        ),
        (
            "SELECT status FROM lease.release_many(ARRAY[{k}], {o}, ARRAY[{e}::bigint])",
            NOT_OWNER,
        ),
        (
            "SELECT status FROM lease.join_group(ARRAY[{k}], {o}, ARRAY[{e}::bigint], interval '1 hour')",
            NOT_OWNER,
        ),
        (
            "SELECT acquired FROM lease.acquire({k}, {o}, interval '1 hour')",
            Expect::Row(r#"{"acquired":false}"#),
        ),
        ("SELECT lease.check_held({k}, {o}, {e})", NOT_HELD),
        ("SELECT lease.admit_held({r}, {k}, {o}, {e})", NOT_HELD),
        (
            "SELECT lease.renew_admit({r}, {k}, {o}, {e}, interval '1 hour')",
            NOT_HELD,
        ),
        (
            "SELECT status FROM lease.renew_group({g}, {o}, interval '1 hour')",
            NOT_OWNER,
        ),
    ];
    // The collation on the owner, and on the key alone.
    let placements = [
        ("'{key}'", "'WORKER-1' COLLATE public.ci"),
        ("'{key}' COLLATE public.ci", "'WORKER-1'"),
    ];
    let mut mismatches = Vec::new();
    let mut n = 0;
    for (template, expect) in calls {
        for (key_sql, owner_sql) in placements {
            if template.contains("{g}") && !owner_sql.contains("COLLATE") {
                continue; // renew_group takes no key
            }
            n += 1;
            let key = format!("c/{n}");
            let resource = format!("c/res/{n}");
            let epoch = grant(&mut app, &key, "Worker-1");
            app.batch_execute(&format!(
                "SELECT lease.admit({}, {}, {epoch})",
                quote(&resource),
                quote(&key)
            ))
            .unwrap();
            let group = if template.contains("{g}") {
                join(&mut app, &key, "Worker-1", epoch)
            } else {
                0
            };
            let sql = template
                .replace("{k}", &key_sql.replace("{key}", &key))
                .replace("{o}", owner_sql)
                .replace("{e}", &epoch.to_string())
                .replace("{r}", &quote(&resource))
                .replace("{g}", &group.to_string());
            let before = whole_state(&mut admin);
            let outcome = probe(&mut attacker, &sql);
            if !expect.met_by(&outcome) {
                mismatches.push(format!("{sql}: expected {expect:?}, got {outcome:?}"));
            }
            let after = whole_state(&mut admin);
            if after != before {
                let changed: Vec<&String> = after.iter().filter(|l| !before.contains(l)).collect();
                mismatches.push(format!("{sql}: changed the state to {changed:?}"));
            }
        }
    }
    assert_no_mismatch(&mismatches);
}

/// Hole: a key passed `COLLATE` a nondeterministic collation made the
/// namespace check fail with 0A000 ("nondeterministic collations are not
/// supported for substring searches") instead of applying the rules: the
/// rule's own role could not act on its keys that way, and the answer for
/// other roles depended on the collation rather than on the bytes. Must
/// hold: prefixes match as bytes whatever collation the key carries. With
/// `Team/` bound to the app, the attacker is refused (42501
/// `lease_namespace_denied`) on `'Team/x' COLLATE ci` by acquire, inspect,
/// renew, release and check_held, changing nothing; `'team/x' COLLATE ci`
/// is another key, under no rule, which it acquires as the key `team/x`
/// (not `Team/x`); the app acquires `'Team/y' COLLATE ci`.
#[test]
fn namespace_prefixes_match_as_bytes_whatever_collation_the_key_carries() {
    let deployment = Deployment::new();
    create_case_insensitive_collation(&deployment);
    make_operator(&deployment);
    deployment
        .conn_as(&deployment.operator)
        .bind_namespace("Team/", &deployment.app)
        .unwrap();
    let mut admin = deployment.admin();
    let mut app = session(&deployment, &deployment.app);
    let epoch = grant(&mut app, "Team/x", "a");
    let before = whole_state(&mut admin);

    let mut attacker = session(&deployment, &deployment.attacker);
    let key = "'Team/x' COLLATE public.ci";
    let mut mismatches = Vec::new();
    for sql in [
        format!("SELECT acquired FROM lease.acquire({key}, 'x', interval '1 min')"),
        format!("SELECT acquired FROM lease.acquire({key}, 'a', interval '1 min')"),
        format!("SELECT held FROM lease.inspect({key})"),
        format!("SELECT status FROM lease.renew({key}, 'a', {epoch}, interval '1 hour')"),
        format!("SELECT status FROM lease.release({key}, 'a', {epoch})"),
        format!("SELECT lease.check_held({key}, 'a', {epoch})"),
        format!("SELECT lease.admit('open/res', {key}, {epoch})"),
    ] {
        let outcome = probe(&mut attacker, &sql);
        if !outcome.failed_with("42501", "lease_namespace_denied") {
            mismatches.push(format!(
                "attacker: {sql}: expected lease_namespace_denied, got {outcome:?}"
            ));
        }
    }
    let after = whole_state(&mut admin);
    if after != before {
        mismatches.push(format!(
            "the attacker's refusals changed the state: {before:?} -> {after:?}"
        ));
    }
    let other = probe(
        &mut attacker,
        "SELECT acquired FROM lease.acquire('team/x' COLLATE public.ci, 'x', interval '1 min')",
    );
    if other != row(r#"{"acquired":true}"#) {
        mismatches.push(format!(
            "attacker: 'team/x' COLLATE ci is under no rule, expected a grant, got {other:?}"
        ));
    } else if raw_row(&mut admin, "team/x").is_none() {
        mismatches.push("the attacker's grant is not stored as the key team/x".to_owned());
    }
    if raw_row(&mut admin, "Team/x") != before_row(&before, "Team/x") {
        mismatches.push("Team/x changed".to_owned());
    }
    let own = probe(
        &mut app,
        "SELECT acquired FROM lease.acquire('Team/y' COLLATE public.ci, 'a', interval '1 min')",
    );
    if own != row(r#"{"acquired":true}"#) {
        mismatches.push(format!(
            "app: 'Team/y' COLLATE ci is its own prefix's key, expected a grant, got {own:?}"
        ));
    }
    assert_no_mismatch(&mismatches);
}

/// The `raw_row` form of `key`'s line in a [`whole_state`] taken earlier.
fn before_row(state: &[String], key: &str) -> Option<String> {
    state
        .iter()
        .find(|line| line.starts_with(&format!("{key}|")))
        .map(|line| {
            let fields: Vec<&str> = line.split('|').collect();
            // key|owner|epoch|expires_at|lapsed_owner -> owner|epoch|set|lapsed
            format!(
                "{}|{}|{}|{}",
                fields[1],
                fields[2],
                if fields[3].is_empty() { "f" } else { "t" },
                fields[4]
            )
        })
}

// ---------------------------------------------------------------------------
// 7b. A blocked install fails with a clear error and changes nothing
// ---------------------------------------------------------------------------

/// Hole: `leasehold::install` waited without bound for a lock (here the
/// schema name, which another session's uncommitted `CREATE SCHEMA lease`
/// holds), hanging whatever process runs it at start-up. Must hold: the
/// install sets its own lock_timeout, so it returns an error within a
/// bounded time (the test allows 60 s) that mentions a lock (its Display or
/// that of a source); once the other session rolls back there is no schema
/// `lease`, and the install then succeeds.
#[test]
fn a_blocked_install_fails_with_a_lock_error_and_leaves_nothing() {
    let deployment = Deployment::uninstalled();
    let mut admin = deployment.admin();
    let mut blocker = deployment.conn_as(&deployment.owner);
    blocker.batch_execute("BEGIN; CREATE SCHEMA lease").unwrap();
    let url = deployment.url_as(&deployment.owner);
    let result = returns(
        "leasehold::install blocked by an uncommitted CREATE SCHEMA lease",
        move || {
            let mut conn = PgConnection::establish(&url).unwrap();
            leasehold::install(&mut conn)
                .map(|report| report.applied)
                .map_err(|error| error_chain(&error))
        },
    );
    blocker.batch_execute("ROLLBACK").unwrap();
    match result {
        Err(chain) => assert!(chain.contains("lock"), "the error names no lock: {chain}"),
        Ok(applied) => panic!("install succeeded while blocked: {applied:?}"),
    }
    assert!(
        query_bool(
            &mut admin,
            "SELECT to_regnamespace('lease') IS NULL AS flag"
        ),
        "the failed install left schema lease behind"
    );
    let mut owner = deployment.conn_as(&deployment.owner);
    let report = leasehold::install(&mut owner).unwrap();
    assert!(!report.applied.is_empty());
    assert_eq!(grant(&mut owner, "k", "a"), 1);
}

/// Hole: diesel's own migration runner on leasehold's migrations waited
/// without bound for the same lock. Must hold: the migrations set their own
/// lock_timeout, so `run_pending_migrations` returns an error within a
/// bounded time that mentions a lock, records no version and leaves no
/// schema `lease`; after the other session rolls back, the run succeeds.
#[test]
fn a_blocked_diesel_migration_run_fails_with_a_lock_error_and_leaves_nothing() {
    let deployment = Deployment::uninstalled();
    let mut admin = deployment.admin();
    let mut blocker = deployment.conn_as(&deployment.owner);
    blocker.batch_execute("BEGIN; CREATE SCHEMA lease").unwrap();
    let url = deployment.url_as(&deployment.owner);
    let migrations = || leasehold::admin::MIGRATIONS;
    let result = returns(
        "diesel's run_pending_migrations blocked by an uncommitted CREATE SCHEMA lease",
        move || {
            let mut conn = PgConnection::establish(&url).unwrap();
            conn.run_pending_migrations(migrations())
                .map(|versions| versions.len())
                .map_err(|error| error_chain(error.as_ref()))
        },
    );
    blocker.batch_execute("ROLLBACK").unwrap();
    match result {
        Err(chain) => assert!(chain.contains("lock"), "the error names no lock: {chain}"),
        Ok(applied) => panic!("the migrations ran while blocked: {applied} applied"),
    }
    assert!(
        query_bool(
            &mut admin,
            "SELECT to_regnamespace('lease') IS NULL AS flag"
        ),
        "the failed run left schema lease behind"
    );
    if query_bool(
        &mut admin,
        "SELECT to_regclass('public.__diesel_schema_migrations') IS NOT NULL AS flag",
    ) {
        assert_eq!(
            query_lines(
                &mut admin,
                "SELECT version::text AS line FROM public.__diesel_schema_migrations"
            ),
            Vec::<String>::new(),
            "the failed run recorded versions"
        );
    }
    let mut owner = deployment.conn_as(&deployment.owner);
    owner
        .run_pending_migrations(migrations())
        .expect("the migrations run once nothing blocks them");
    assert_eq!(grant(&mut owner, "k", "a"), 1);
}

// ---------------------------------------------------------------------------
// 7c. Transactions that began long before the call: the clock at the call
// ---------------------------------------------------------------------------

/// Guard (passed on the SQL before the rewrite too: the first grant already
/// used clock_timestamp()): the first grant of a never-seen key, in a
/// transaction that began 1.5 s earlier, expires a ttl after the call, not
/// a ttl after the transaction began.
#[test]
fn an_old_transactions_first_grant_expires_a_ttl_after_the_call() {
    let deployment = Deployment::new();
    let mut app = session(&deployment, &deployment.app);
    begin_old_transaction(&mut app);
    let before = clock_text(&mut app);
    let expires = query_lines(
        &mut app,
        "SELECT expires_at::text AS line FROM lease.acquire('fresh', 'o', interval '10 s') WHERE acquired",
    );
    app.batch_execute("COMMIT").unwrap();
    assert_eq!(expires.len(), 1, "the first grant was not granted");
    assert!(
        query_bool(
            &mut app,
            &format!(
                "SELECT {}::timestamptz >= {}::timestamptz + interval '10 s' AS flag",
                quote(&expires[0]),
                quote(&before)
            )
        ),
        "expires at {} although the call began at {before}",
        expires[0]
    );
}

/// Guard (passed before the rewrite too): a group heartbeat in a
/// transaction that began 1.5 s earlier extends the group to a ttl after the
/// call.
#[test]
fn an_old_transactions_group_heartbeat_extends_the_group_a_ttl_after_the_call() {
    let deployment = Deployment::new();
    let mut app = session(&deployment, &deployment.app);
    let epoch = grant(&mut app, "g/1", "o");
    let group = join(&mut app, "g/1", "o", epoch);
    begin_old_transaction(&mut app);
    let before = clock_text(&mut app);
    let renewed = query_lines(
        &mut app,
        &format!(
            "SELECT expires_at::text AS line FROM lease.renew_group({group}, 'o', interval '10 s') \
             WHERE status = 'ok'"
        ),
    );
    app.batch_execute("COMMIT").unwrap();
    assert_eq!(renewed.len(), 1, "the heartbeat was refused");
    assert!(
        query_bool(
            &mut app,
            &format!(
                "SELECT {}::timestamptz >= {}::timestamptz + interval '10 s' AS flag",
                quote(&renewed[0]),
                quote(&before)
            )
        ),
        "the group expires at {} although the call began at {before}",
        renewed[0]
    );
}

/// Guard (passed before the rewrite too): a member whose own expiry and
/// whose group's expiry both lie between the acquiring transaction's start
/// and the call — live by `now()`, lapsed by the clock — counts as lapsed:
/// the old transaction takes it over.
#[test]
fn an_old_transaction_takes_over_a_member_whose_group_lapsed_after_it_began() {
    let deployment = Deployment::new();
    let mut admin = deployment.admin();
    let mut app = session(&deployment, &deployment.app);
    let epoch = grant(&mut app, "g/2", "h");
    let group = join(&mut app, "g/2", "h", epoch);
    let mut worker = session(&deployment, &deployment.worker);
    begin_old_transaction(&mut worker);
    let started = query_lines(&mut worker, "SELECT now()::text AS line").remove(0);
    admin
        .batch_execute(&format!(
            "UPDATE lease.leases SET expires_at = {s}::timestamptz + interval '250 ms' WHERE key = 'g/2';
             UPDATE lease.groups SET expires_at = {s}::timestamptz + interval '500 ms' WHERE id = {group};",
            s = quote(&started)
        ))
        .unwrap();
    let outcome = probe(
        &mut worker,
        "SELECT acquired, epoch FROM lease.acquire('g/2', 'w', interval '1 min')",
    );
    worker.batch_execute("COMMIT").unwrap();
    assert_eq!(
        outcome,
        row(&format!(r#"{{"acquired":true,"epoch":{}}}"#, epoch + 1))
    );
    assert_eq!(
        raw_row(&mut admin, "g/2").unwrap(),
        format!("w|{}|t|h", epoch + 1)
    );
}

/// Guard (passed before the rewrite too): an acquire without a wait, in a
/// transaction that began 1.5 s earlier, of a never-seen key whose first
/// grant another transaction has not committed, waits about 1 s from the
/// call — not 1 s from the transaction's start, which would be over at
/// once — and then raises `lease_wait_timeout` (57014); it is not granted.
#[test]
fn an_old_transactions_acquire_without_wait_of_a_first_grant_in_flight_waits_a_second_from_the_call(
) {
    let deployment = Deployment::new();
    let mut app = session(&deployment, &deployment.app);
    app.batch_execute("BEGIN").unwrap();
    grant(&mut app, "first", "x");
    let mut worker = session(&deployment, &deployment.worker);
    begin_old_transaction(&mut worker);
    let started = Instant::now();
    let outcome = probe(
        &mut worker,
        "SELECT acquired FROM lease.acquire('first', 'w', interval '1 min')",
    );
    let elapsed = started.elapsed();
    app.batch_execute("ROLLBACK").unwrap();
    worker.batch_execute("ROLLBACK").unwrap();
    assert!(
        outcome.failed_with("57014", "lease_wait_timeout"),
        "{outcome:?}"
    );
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_millis(1_400),
        "the acquire gave up after {elapsed:?}, not about 1 s after the call"
    );
}

/// Hole: an acquire without a wait gave every lock it met a budget of its
/// own (lock_timeout 1 s each), so one that first waited for the key's row
/// and then for its heartbeat group's row waited close to 2 s in all.
/// Must hold: the 1 s bound of a call without a wait is measured from the
/// call (not from its transaction's start, 1.5 s earlier here, nor from
/// each lock): the call raises `lease_wait_timeout` (57014) after about a
/// second, not at once and not after 1.4 s.
///
/// The key is lapsed in a lapsed group; the holder's lease-checked
/// transaction keeps the key's row (FOR KEY SHARE) and a superuser
/// transaction keeps the group's row, standing in for a heartbeat or a
/// release in flight. The holder commits 750 ms (server clock) after the
/// acquire began to wait; the group's row stays locked.
#[test]
fn the_one_second_bound_of_an_acquire_without_wait_covers_all_its_lock_waits() {
    let deployment = Deployment::new();
    let mut admin = deployment.admin();
    let mut app = session(&deployment, &deployment.app);
    let epoch = grant(&mut app, "chain", "h");
    let group = join(&mut app, "chain", "h", epoch);
    app.batch_execute("BEGIN").unwrap();
    app.batch_execute(&format!("SELECT lease.check_held('chain', 'h', {epoch})"))
        .unwrap();
    lapse(&mut admin, "chain");
    lapse_group(&mut admin, group);
    let mut heartbeat = deployment.admin();
    heartbeat
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM lease.groups WHERE id = {group} FOR NO KEY UPDATE"
        ))
        .unwrap();

    let mut worker = session(&deployment, &deployment.worker);
    begin_old_transaction(&mut worker);
    let pid = pid_of(&mut worker);
    let acquiring = std::thread::spawn(move || {
        let started = Instant::now();
        let outcome = probe(
            &mut worker,
            "SELECT acquired FROM lease.acquire('chain', 'w', interval '1 min')",
        );
        let elapsed = started.elapsed();
        let _ = worker.batch_execute("ROLLBACK");
        (outcome, elapsed)
    });
    let waitstart = lock_wait_start(&mut admin, pid);
    admin
        .batch_execute(&format!(
            "SELECT pg_sleep(GREATEST(0, EXTRACT(epoch FROM {}::timestamptz + interval '750 ms' - clock_timestamp())))",
            quote(&waitstart)
        ))
        .unwrap();
    app.batch_execute("COMMIT").unwrap();
    let (outcome, elapsed) = returns("the acquire", move || acquiring.join().unwrap());
    heartbeat.batch_execute("ROLLBACK").unwrap();
    assert!(
        outcome.failed_with("57014", "lease_wait_timeout"),
        "{outcome:?}"
    );
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_millis(1_400),
        "the acquire without a wait gave up after {elapsed:?}, not about 1 s after the call"
    );
}

/// Runs `sql` (an acquire) through [`probe`] on `conn` and says what went
/// wrong, if anything, against the rule that a call meeting a lock that
/// stays held gives up with `lease_wait_timeout` (57014) about one second
/// after the call: its wait, or the bound of a call without one.
fn gave_up_a_second_after_the_call(
    conn: &mut PgConnection,
    what: &str,
    sql: &str,
) -> Option<String> {
    let started = Instant::now();
    let outcome = probe(conn, sql);
    let elapsed = started.elapsed();
    let in_time = elapsed >= Duration::from_millis(900) && elapsed < Duration::from_millis(1_400);
    if outcome.failed_with("57014", "lease_wait_timeout") && in_time {
        None
    } else {
        Some(format!("{what}: {outcome:?} after {elapsed:?}"))
    }
}

/// Begins a transaction on `admin` (a superuser) that keeps `key`'s row
/// locked `FOR UPDATE` until it ends.
fn lock_row_in_open_transaction(admin: &mut PgConnection, key: &str) {
    admin
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM lease.leases WHERE key = {} FOR UPDATE",
            quote(key)
        ))
        .unwrap();
}

/// Guard against five mutants (the bound of a lock wait computed from the
/// transaction's start in place of the clock; no test noticed them): in a
/// transaction that began 1.5 s earlier, an acquire that meets a locked
/// row gives up about 1 s after the call, wherever the lock is:
/// - the lineage row, when the grant starts a new lineage (the row given
///   another cluster's identifier) and a superuser transaction keeps the
///   row locked;
/// - the key's row read under REPEATABLE READ (`FOR SHARE`) while the
///   holder's renewal of it is not committed;
/// - the caller's own live grant (`FOR KEY SHARE`, an idempotent acquire)
///   while another transaction keeps the row locked `FOR UPDATE`;
/// - a lapsed key's row kept locked by another transaction, met by an
///   acquire with a wait of one second (the budget of its lock waits is
///   what is left of the wait).
///
/// Each raises `lease_wait_timeout` (57014) after 0.9–1.4 s, not 2.5 s.
#[test]
fn an_old_transactions_acquire_gives_up_a_second_after_the_call_at_every_lock() {
    let deployment = Deployment::new();
    let mut admin = deployment.admin();
    let mut app = session(&deployment, &deployment.app);
    let mut worker = session(&deployment, &deployment.worker);
    // An acquire that never gave up would fail here, not hang the test.
    worker
        .batch_execute("SET statement_timeout = '10s'")
        .unwrap();
    let mut mismatches = Vec::new();

    // The lineage row, locked while a new lineage must be started.
    let epoch = grant(&mut app, "lineage-locked", "h");
    lapse(&mut admin, "lineage-locked");
    let mut operator = deployment.admin();
    operator
        .batch_execute("UPDATE lease.lineage SET system_identifier = 1, checked_start = NULL")
        .unwrap();
    operator
        .batch_execute("BEGIN; SELECT 1 FROM lease.lineage FOR UPDATE")
        .unwrap();
    begin_old_transaction(&mut worker);
    mismatches.extend(gave_up_a_second_after_the_call(
        &mut worker,
        "the lineage row locked",
        "SELECT acquired FROM lease.acquire('lineage-locked', 'w', interval '1 min')",
    ));
    worker.batch_execute("ROLLBACK").unwrap();
    operator.batch_execute("ROLLBACK").unwrap();
    assert_eq!(
        raw_row(&mut admin, "lineage-locked").unwrap(),
        format!("h|{epoch}|t|"),
        "the lapsed grant is as it was"
    );

    // The key's row, read FOR SHARE under REPEATABLE READ.
    let epoch = grant(&mut app, "share-locked", "h");
    app.batch_execute(&format!(
        "BEGIN; SELECT * FROM lease.renew('share-locked', 'h', {epoch}, interval '1 min')"
    ))
    .unwrap();
    worker
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT pg_sleep(1.5)")
        .unwrap();
    mismatches.extend(gave_up_a_second_after_the_call(
        &mut worker,
        "the key's row locked, REPEATABLE READ",
        "SELECT acquired FROM lease.acquire('share-locked', 'w', interval '1 min')",
    ));
    worker.batch_execute("ROLLBACK").unwrap();
    app.batch_execute("ROLLBACK").unwrap();

    // The caller's own grant, locked (`FOR KEY SHARE` waits) by a
    // superuser transaction standing in for a takeover in flight.
    grant(&mut app, "own-locked", "h");
    lock_row_in_open_transaction(&mut admin, "own-locked");
    begin_old_transaction(&mut worker);
    mismatches.extend(gave_up_a_second_after_the_call(
        &mut worker,
        "the caller's own grant locked",
        "SELECT acquired FROM lease.acquire('own-locked', 'h', interval '1 min')",
    ));
    worker.batch_execute("ROLLBACK").unwrap();
    admin.batch_execute("ROLLBACK").unwrap();

    // A lapsed key's row, locked; the acquire waits up to a second.
    grant(&mut app, "wait-locked", "h");
    lapse(&mut admin, "wait-locked");
    lock_row_in_open_transaction(&mut admin, "wait-locked");
    begin_old_transaction(&mut worker);
    mismatches.extend(gave_up_a_second_after_the_call(
        &mut worker,
        "a lapsed key's row locked, a wait of 1 s",
        "SELECT acquired FROM lease.acquire('wait-locked', 'w', interval '1 min', interval '1 s')",
    ));
    worker.batch_execute("ROLLBACK").unwrap();
    admin.batch_execute("ROLLBACK").unwrap();
    assert_no_mismatch(&mismatches);
}

// ---------------------------------------------------------------------------
// 7d. A REPEATABLE READ denial that would wait
// ---------------------------------------------------------------------------

/// Guard against a mutant (the SQL before the rewrite passed it; dropping
/// its `FOR SHARE` in this path changed nothing any test saw): a REPEATABLE
/// READ or SERIALIZABLE acquire whose snapshot shows the key held by
/// another owner, though that grant was released after the snapshot, fails
/// with 40001 at once — with a wait too, where a denial from the past would
/// poll the snapshot until the wait ran out (57014) — and is not granted.
/// A new transaction then acquires the key.
#[test]
fn an_old_snapshot_showing_a_grant_that_ended_fails_with_40001_at_once_even_with_a_wait() {
    let deployment = Deployment::new();
    let mut app = session(&deployment, &deployment.app);
    let mut mismatches = Vec::new();
    for (i, (level, wait)) in [
        ("REPEATABLE READ", Some(2)),
        ("REPEATABLE READ", None),
        ("SERIALIZABLE", Some(2)),
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("d/{i}");
        let epoch = grant(&mut app, &key, "A");
        let mut worker = session(&deployment, &deployment.worker);
        worker
            .batch_execute(&format!("BEGIN ISOLATION LEVEL {level}; SELECT 1"))
            .unwrap();
        app.batch_execute(&format!(
            "SELECT * FROM lease.release({}, 'A', {epoch})",
            quote(&key)
        ))
        .unwrap();
        let wait_sql = wait.map_or(String::new(), |s| format!(", interval '{s} s'"));
        let sql = format!(
            "SELECT acquired FROM lease.acquire({}, 'B', interval '1 min'{wait_sql})",
            quote(&key)
        );
        let started = Instant::now();
        let outcome = probe(&mut worker, &sql);
        let elapsed = started.elapsed();
        let _ = worker.batch_execute("ROLLBACK");
        if outcome.sqlstate() != "40001" {
            mismatches.push(format!("{level}: {sql}: expected 40001, got {outcome:?}"));
        }
        if let Some(seconds) = wait {
            if elapsed >= Duration::from_secs(seconds) {
                mismatches.push(format!(
                    "{level}: {sql}: returned after {elapsed:?}, not before its wait ran out"
                ));
            }
        }
        if probe(&mut worker, &sql) != row(r#"{"acquired":true}"#) {
            mismatches.push(format!("{level}: a new transaction was not granted {key}"));
        }
    }
    assert_no_mismatch(&mismatches);
}

// ---------------------------------------------------------------------------
// 7e. Lapsed keys taken over on the slow path
// ---------------------------------------------------------------------------

/// Guard against a mutant (the SQL before the rewrite passed it): a LAPSED
/// key (owner set, expiry passed) is acquirable, so a new owner is granted
/// it — under READ COMMITTED without a wait, with a wait, and under
/// REPEATABLE READ with a snapshot taken after the lapse — whether the key
/// is a plain grant or a member of a heartbeat group that lapsed too (which
/// keeps it off the one-statement fast grant). Catches a classification of
/// "held" as "owner set OR still live". The lapsed owner is remembered.
#[test]
fn a_lapsed_key_is_granted_to_a_new_owner_with_or_without_a_wait_and_under_repeatable_read() {
    let deployment = Deployment::new();
    let mut admin = deployment.admin();
    let mut app = session(&deployment, &deployment.app);
    let mut worker = session(&deployment, &deployment.worker);
    let mut mismatches = Vec::new();
    for grouped in [false, true] {
        for (how, begin, wait) in [
            ("read committed, no wait", "", ""),
            ("read committed, a wait", "", ", interval '5 s'"),
            (
                "repeatable read",
                "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;",
                "",
            ),
        ] {
            let key = format!("e/{grouped}/{how}");
            let epoch = grant(&mut app, &key, "a");
            if grouped {
                let group = join(&mut app, &key, "a", epoch);
                lapse_group(&mut admin, group);
            }
            lapse(&mut admin, &key);
            if !begin.is_empty() {
                worker.batch_execute(begin).unwrap();
            }
            let sql = format!(
                "SELECT acquired, epoch FROM lease.acquire({}, 'b', interval '1 min'{wait})",
                quote(&key)
            );
            let outcome = probe(&mut worker, &sql);
            if !begin.is_empty() {
                let _ = worker.batch_execute("COMMIT");
            }
            let expected = row(&format!(r#"{{"acquired":true,"epoch":{}}}"#, epoch + 1));
            if outcome != expected {
                mismatches.push(format!(
                    "grouped={grouped}, {how}: {sql}: expected {expected:?}, got {outcome:?}"
                ));
            } else if raw_row(&mut admin, &key) != Some(format!("b|{}|t|a", epoch + 1)) {
                mismatches.push(format!(
                    "grouped={grouped}, {how}: stored {:?}",
                    raw_row(&mut admin, &key)
                ));
            }
        }
    }
    assert_no_mismatch(&mismatches);
}

/// Guard against a mutant (the SQL before the rewrite passed it): the old
/// holder admitted a write with its lease in a transaction it keeps open
/// (its row FOR KEY SHARE), and the lease lapsed meanwhile. An acquire with
/// a wait of 5 s waits for that transaction (observed as a lock wait) and
/// is granted right after it commits, before the wait runs out — for a
/// plain grant and for a member of a lapsed heartbeat group.
#[test]
fn a_lapsed_key_locked_by_its_old_holders_admission_is_granted_once_that_transaction_commits() {
    let deployment = Deployment::new();
    let mut admin = deployment.admin();
    for grouped in [false, true] {
        let key = format!("e/locked/{grouped}");
        let mut app = session(&deployment, &deployment.app);
        let epoch = grant(&mut app, &key, "a");
        let group = grouped.then(|| join(&mut app, &key, "a", epoch));
        app.batch_execute(&format!(
            "BEGIN; SELECT lease.admit('e/res/{grouped}', {}, {epoch})",
            quote(&key)
        ))
        .unwrap();
        lapse(&mut admin, &key);
        if let Some(group) = group {
            lapse_group(&mut admin, group);
        }
        let mut worker = session(&deployment, &deployment.worker);
        let pid = pid_of(&mut worker);
        let sql = format!(
            "SELECT acquired, epoch FROM lease.acquire({}, 'b', interval '1 min', interval '5 s')",
            quote(&key)
        );
        let acquiring = std::thread::spawn(move || {
            let started = Instant::now();
            let outcome = probe(&mut worker, &sql);
            (outcome, started.elapsed())
        });
        wait_until_blocked(&mut admin, pid);
        app.batch_execute("COMMIT").unwrap();
        let (outcome, elapsed) = returns("the acquire", move || acquiring.join().unwrap());
        assert_eq!(
            outcome,
            row(&format!(r#"{{"acquired":true,"epoch":{}}}"#, epoch + 1)),
            "grouped={grouped}"
        );
        assert!(
            elapsed < Duration::from_secs(5),
            "grouped={grouped}: granted after {elapsed:?}, not before the wait ran out"
        );
        assert_eq!(
            raw_row(&mut admin, &key).unwrap(),
            format!("b|{}|t|a", epoch + 1)
        );
    }
}

/// Attack on G2 with an old snapshot: a holder whose REPEATABLE READ or
/// SERIALIZABLE transaction took its snapshot before its key was taken
/// over is not admitted once the takeover committed. Its snapshot still
/// shows its own grant as the newest, but `admit` locks the key's row, and
/// a locking read of a row changed after the snapshot fails to serialize
/// (40001); nothing is recorded. (A control: it passed before the
/// superseded check too, which this test guards from being moved to a plain
/// read.)
#[test]
fn an_old_snapshot_does_not_admit_a_holder_superseded_after_it() {
    let db = TestDb::new();
    let mut admin = db.conn();
    for (level, tag) in OLD_SNAPSHOT_LEVELS {
        let key = format!("superseded-{tag}");
        let old = grant(&mut admin, &key, "a");
        let mut holder = db.conn();
        prepare_probe(&mut holder);
        holder
            .batch_execute(&format!("BEGIN ISOLATION LEVEL {level}; SELECT 1"))
            .unwrap();
        lapse(&mut admin, &key);
        assert_eq!(grant(&mut admin, &key, "b"), old + 1);
        let outcome = probe(
            &mut holder,
            &format!("SELECT lease.admit('r-{tag}', {}, {old})", quote(&key)),
        );
        assert!(
            outcome.sqlstate() == "40001"
                || outcome.failed_with("55000", "lease_guard_stale_epoch"),
            "{level}: {outcome:?}"
        );
        holder.batch_execute("ROLLBACK").unwrap();
    }
    assert_eq!(
        query_lines(
            &mut admin,
            "SELECT count(*)::text AS line FROM lease.guards"
        ),
        ["0"]
    );
}
