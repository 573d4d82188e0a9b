//! Holes in leasehold's SQL itself, found by attacking it below the Rust
//! client, closed by the baseline rewrite:
//!
//! * the rewrite rules of the fast paths (migration 000007) paste a
//!   caller's SET expression into every place it is used, so a volatile
//!   expression is one key where the row is found and another where the
//!   namespace is checked, and one value where the input is checked and
//!   another where it is stored;
//! * a refused fast grant keeps the row lock it took;
//! * the fast paths and `lease._fast_wake` answer an outsider differently
//!   for a held and a free key of another role's namespace;
//! * the tables keep states no function may write (no constraints), and a
//!   pruned group leaves its member unacquirable.
//!
//! Every test runs in a [`Deployment`]: a non-superuser owner installed
//! leasehold, `team/` is bound to the application role, and the attacker
//! logs in as a role of its own with nothing but CONNECT and TEMP. Each
//! test failed on the SQL before the baseline rewrite.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use leasehold::{Acquisition, Leases, Release, Renewal};
use leasehold_test_support::Deployment;

use crate::common::*;
use leasehold::guard::Check;
use leasehold::guard::Fencing;

/// A key of the application's namespace that the application holds.
const HELD: &str = "team/held";
/// A key of the application's namespace that is FREE (held and released).
const FREE: &str = "team/free";
/// A name no rule governs: the attacker may act on it.
const UNGOVERNED: &str = "mine/x";
/// The switch thresholds an attack tries: more calls than any statement
/// here makes of its expression.
const THRESHOLDS: std::ops::RangeInclusive<i64> = 0..=12;

/// A deployment whose owner bound `team/` to the application role.
fn bound_deployment() -> Deployment {
    let deployment = Deployment::new();
    deployment
        .conn_as(&deployment.owner)
        .batch_execute(&format!(
            "SELECT lease.bind_namespace('team/', {})",
            quote(&deployment.app)
        ))
        .unwrap();
    deployment
}

/// Holds `key` for `owner` and releases it, and returns the grant's epoch:
/// the key is FREE, its counter one above that epoch, so the next grant's
/// epoch is two above it.
fn hold_and_release(conn: &mut PgConnection, key: &str, owner: &str) -> i64 {
    let lease = granted(conn.acquire(key, owner, TTL).unwrap());
    assert_eq!(
        conn.release(&leasehold_test_support::grant(key, owner, lease.epoch()))
            .unwrap(),
        Release::Released
    );
    lease.epoch().get()
}

/// What the attacker installs in its own session, with nothing but the
/// TEMP privilege every role has on a database by default:
/// * `pg_temp.sw()`, a volatile text expression that answers `good` on its
///   first `t` calls and `bad` after (see [`arm`]), and counts its calls;
/// * `pg_temp.outcome_of(statement)`, which runs a statement in a
///   subtransaction and answers its SQLSTATE, error message and result (a
///   SELECT's rows, or how many rows another statement wrote). A statement
///   that succeeds keeps its locks in the caller's transaction.
fn install_attacker_tools(conn: &mut PgConnection) {
    conn.batch_execute(
        r#"
        CREATE TEMP TABLE sw_state (n bigint NOT NULL, t bigint NOT NULL, good text, bad text);
        INSERT INTO pg_temp.sw_state VALUES (0, 0, NULL, NULL);
        CREATE FUNCTION pg_temp.sw() RETURNS text
        LANGUAGE plpgsql VOLATILE AS $f$
        DECLARE
            r record;
        BEGIN
            UPDATE pg_temp.sw_state SET n = n + 1 RETURNING n, t, good, bad INTO r;
            IF r.n <= r.t THEN
                RETURN r.good;
            END IF;
            RETURN r.bad;
        END $f$;
        CREATE FUNCTION pg_temp.outcome_of(statement text) RETURNS text
        LANGUAGE plpgsql AS $f$
        DECLARE
            v_result text;
            v_rows bigint;
        BEGIN
            IF statement ~* '^\s*select' THEN
                EXECUTE 'SELECT coalesce(array_agg(r)::text, ''{}'') FROM (' || statement || ') AS r'
                   INTO v_result;
            ELSE
                EXECUTE statement;
                GET DIAGNOSTICS v_rows = ROW_COUNT;
                v_result := v_rows::text || ' rows';
            END IF;
            RETURN '00000' || chr(31) || chr(31) || v_result;
        EXCEPTION WHEN OTHERS OR query_canceled THEN
            RETURN SQLSTATE || chr(31) || SQLERRM || chr(31);
        END $f$;
        "#,
    )
    .expect("install the attacker's pg_temp tools");
}

/// Sets `pg_temp.sw()` to answer `good` on its next `threshold` calls and
/// `bad` after, and resets its count.
fn arm(conn: &mut PgConnection, threshold: i64, good: Option<&str>, bad: Option<&str>) {
    let literal = |value: Option<&str>| value.map_or_else(|| "NULL".to_owned(), quote);
    conn.batch_execute(&format!(
        "UPDATE pg_temp.sw_state SET n = 0, t = {threshold}, good = {}, bad = {}",
        literal(good),
        literal(bad)
    ))
    .unwrap();
}

/// How often `pg_temp.sw()` was called since it was last armed.
fn switch_calls(conn: &mut PgConnection) -> i64 {
    query_lines(conn, "SELECT n::text AS line FROM pg_temp.sw_state")[0]
        .parse()
        .unwrap()
}

/// What a statement did, as `pg_temp.outcome_of` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    sqlstate: String,
    message: String,
    result: String,
}

fn outcome_of(conn: &mut PgConnection, sql: &str) -> Outcome {
    let line = query_lines(
        conn,
        &format!("SELECT pg_temp.outcome_of({}) AS line", quote(sql)),
    )
    .remove(0);
    let mut fields = line.split('\u{1f}').map(str::to_owned);
    Outcome {
        sqlstate: fields.next().unwrap(),
        message: fields.next().unwrap_or_default(),
        result: fields.next().unwrap_or_default(),
    }
}

/// A key's whole row as the superuser reads it (every column but the key
/// and digest), or None without a row.
fn row_state(admin: &mut PgConnection, key: &str) -> Option<String> {
    query_lines(
        admin,
        &format!(
            "SELECT format('owner=%s epoch=%s expires_at=%s lapsed_owner=%s group_id=%s first_epoch=%s', \
                    owner, epoch, expires_at, lapsed_owner, group_id, first_epoch) AS line \
             FROM lease.leases WHERE key = {}",
            quote(key)
        ),
    )
    .into_iter()
    .next()
}

/// The hex SHA-256 of `key`, the digest notifications carry.
fn digest_hex(conn: &mut PgConnection, key: &str) -> String {
    query_lines(
        conn,
        &format!(
            "SELECT encode(sha256(convert_to({}, 'UTF8')), 'hex') AS line",
            quote(key)
        ),
    )
    .remove(0)
}

/// `text` with `key` and its digest replaced by placeholders, so that the
/// answers for two keys compare equal when they differ only by the name.
fn normalised(text: &str, key: &str, digest: &str) -> String {
    text.replace(digest, "<digest>").replace(key, "<key>")
}

/// The payloads of every notification this session has received since the
/// last call. A session's own transaction's notifications arrive with its
/// COMMIT, so after it this reads all of them.
fn drain_notifications(conn: &mut PgConnection) -> Vec<String> {
    conn.notifications_iter()
        .map(|notification| {
            let notification = notification.unwrap();
            format!("{}:{}", notification.channel, notification.payload)
        })
        .collect()
}

/// Polls the server until the query's `flag` is true: state the test
/// waits for (a clock passing an expiry), observed, not slept for.
fn wait_for(conn: &mut PgConnection, sql: &str) {
    for _ in 0..6_000 {
        if query_bool(conn, sql) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("never true: {sql}");
}

/// The holder's own calls still work: renew and release `key` at `epoch`.
fn holder_renews_and_releases(app: &mut PgConnection, key: &str, epoch: i64) {
    assert!(
        matches!(
            app.renew(&leasehold_test_support::grant(key, "app-1", epoch), TTL)
                .unwrap(),
            Renewal::Renewed { .. }
        ),
        "the holder renews {key}"
    );
    assert_eq!(
        app.release(&leasehold_test_support::grant(key, "app-1", epoch))
            .unwrap(),
        Release::Released,
        "the holder releases {key}"
    );
}

/// Runs `statement` (which reads `pg_temp.sw()`) once per threshold, the
/// switch answering `good` on the first calls and `bad` after: one of
/// them finds the row with `good` and passes the namespace check with
/// `bad`, if the statement evaluates its key more than once. Errors are
/// tolerated (the statement may not even exist). Returns every outcome.
fn strike(conn: &mut PgConnection, statement: &str, good: &str, bad: &str) -> Vec<Outcome> {
    THRESHOLDS
        .map(|threshold| {
            arm(conn, threshold, Some(good), Some(bad));
            outcome_of(conn, statement)
        })
        .collect()
}

/// Function calls take a key expression once: whatever it answers, the
/// call is refused for the governed name or acts on the ungoverned one,
/// the attacker's own.
fn assert_refused_or_own(outcomes: &[Outcome], statement: &str) {
    for outcome in outcomes {
        assert!(
            outcome.sqlstate == "42501" || outcome.sqlstate == "00000",
            "{statement}: {outcome:?}"
        );
        if outcome.sqlstate == "42501" {
            assert!(
                outcome.message.contains("team/"),
                "{statement}: {outcome:?}"
            );
        }
    }
}

/// Hole 1, grant: `UPDATE lease.fast_acquire SET key = <expr>` evaluated
/// the key once per use, so a volatile expression answered the governed
/// key where the rule found the FREE row and an ungoverned name where it
/// asked whether the caller may act on it, and an outsider took a key of
/// another role's namespace. Must hold: no statement an outsider can run
/// changes a governed key's row (the views are gone; the functions take
/// the expression once and refuse it), and the application still
/// acquires the key at the next epoch.
#[test]
fn an_outsider_cannot_take_a_free_governed_key_with_a_key_that_changes_between_uses() {
    let deployment = bound_deployment();
    let mut admin = deployment.admin();
    let mut app = deployment.conn_as(&deployment.app);
    let first = hold_and_release(&mut app, "team/a-free", "app-1");
    let before = row_state(&mut admin, "team/a-free");
    let mut attacker = deployment.conn_as(&deployment.attacker);
    install_attacker_tools(&mut attacker);

    let fast = "UPDATE lease.fast_acquire SET key = pg_temp.sw(), owner = 'evil-1', ttl = interval '5 hours'";
    let fast_outcomes = strike(&mut attacker, fast, "team/a-free", UNGOVERNED);
    let after_fast = row_state(&mut admin, "team/a-free");
    let function = "SELECT * FROM lease.acquire(pg_temp.sw(), 'evil-1', interval '5 hours')";
    let function_outcomes = strike(&mut attacker, function, "team/a-free", UNGOVERNED);
    assert_eq!(
        after_fast, before,
        "the fast grant gave the governed key to the outsider: {fast_outcomes:?}"
    );
    assert_refused_or_own(&function_outcomes, function);
    assert_eq!(row_state(&mut admin, "team/a-free"), before);

    let lease = granted(app.acquire("team/a-free", "app-1", TTL).unwrap());
    assert_eq!(lease.epoch(), first + 2, "the next grant after the release");
    holder_renews_and_releases(&mut app, "team/a-free", lease.epoch().get());
}

/// Hole 1, renewal: `UPDATE lease.fast_renew SET key = <expr>, owner, epoch,
/// ttl` with a key that is the governed one where the row is found and an
/// ungoverned one where the namespace is checked extended another role's
/// grant by hours, given its owner and epoch (which `inspect` does not tell
/// an outsider under the rule; the test takes them from the grant). Must
/// hold: the grant's row is unchanged, its expiry included, and its holder
/// renews and releases it.
#[test]
fn an_outsider_cannot_extend_another_owners_grant_with_a_key_that_changes_between_uses() {
    let deployment = bound_deployment();
    let mut admin = deployment.admin();
    let mut app = deployment.conn_as(&deployment.app);
    let lease = granted(app.acquire(HELD, "app-1", TTL).unwrap());
    let before = row_state(&mut admin, HELD);
    let mut attacker = deployment.conn_as(&deployment.attacker);
    install_attacker_tools(&mut attacker);

    let epoch = lease.epoch();
    let fast = format!(
        "UPDATE lease.fast_renew SET key = pg_temp.sw(), owner = 'app-1', epoch = {epoch}, ttl = interval '5 hours'"
    );
    let fast_outcomes = strike(&mut attacker, &fast, HELD, UNGOVERNED);
    let after_fast = row_state(&mut admin, HELD);
    let function =
        format!("SELECT * FROM lease.renew(pg_temp.sw(), 'app-1', {epoch}, interval '5 hours')");
    let function_outcomes = strike(&mut attacker, &function, HELD, UNGOVERNED);
    assert_eq!(
        after_fast, before,
        "the fast renewal extended another role's grant: {fast_outcomes:?}"
    );
    assert_refused_or_own(&function_outcomes, &function);
    assert_eq!(row_state(&mut admin, HELD), before);
    assert!(!query_bool(
        &mut admin,
        "SELECT expires_at > clock_timestamp() + interval '1 hour' AS flag FROM lease.leases WHERE key = 'team/held'"
    ));

    holder_renews_and_releases(&mut app, HELD, epoch.get());
}

/// Hole 1, release: `UPDATE lease.fast_release SET key = <expr>, owner,
/// epoch` with a key that changes between its uses freed another role's
/// grant. Must hold: the grant is still the holder's, at its epoch, and the
/// holder renews and releases it.
#[test]
fn an_outsider_cannot_free_another_owners_grant_with_a_key_that_changes_between_uses() {
    let deployment = bound_deployment();
    let mut admin = deployment.admin();
    let mut app = deployment.conn_as(&deployment.app);
    let lease = granted(app.acquire(HELD, "app-1", TTL).unwrap());
    let before = row_state(&mut admin, HELD);
    let mut attacker = deployment.conn_as(&deployment.attacker);
    install_attacker_tools(&mut attacker);

    let epoch = lease.epoch();
    let fast = format!(
        "UPDATE lease.fast_release SET key = pg_temp.sw(), owner = 'app-1', epoch = {epoch}"
    );
    let fast_outcomes = strike(&mut attacker, &fast, HELD, UNGOVERNED);
    let after_fast = row_state(&mut admin, HELD);
    let function = format!("SELECT * FROM lease.release(pg_temp.sw(), 'app-1', {epoch})");
    let function_outcomes = strike(&mut attacker, &function, HELD, UNGOVERNED);
    assert_eq!(
        after_fast, before,
        "the fast release freed another role's grant: {fast_outcomes:?}"
    );
    assert_refused_or_own(&function_outcomes, &function);
    assert_eq!(row_state(&mut admin, HELD), before);

    holder_renews_and_releases(&mut app, HELD, epoch.get());
}

/// Hole 2 (§1.5: a refused call keeps no lock): an outsider's fast grant
/// of a governed FREE key, with a key expression that is not a constant
/// (so the namespace check ran after the row was locked FOR UPDATE SKIP
/// LOCKED), answered no row but kept the lock until its transaction
/// ended, and the application's acquire of the key timed out after the 1 s
/// bound. Must hold: with the outsider's transaction still open after any
/// refused call (the fast paths, acquire, renew, release, inspect,
/// check_held, admit, the waiter registration), the application acquires,
/// renews and releases at once.
#[test]
fn a_refused_outsider_in_an_open_transaction_keeps_no_lock_that_blocks_the_holder() {
    let deployment = bound_deployment();
    let mut app = deployment.conn_as(&deployment.app);
    let held = granted(app.acquire(HELD, "app-1", TTL).unwrap());
    hold_and_release(&mut app, "team/free-1", "app-1");
    hold_and_release(&mut app, "team/free-2", "app-1");
    // A renew or release that had to wait for a lock fails instead.
    app.batch_execute("SET lock_timeout = '5s'").unwrap();
    let mut attacker = deployment.conn_as(&deployment.attacker);
    install_attacker_tools(&mut attacker);
    let epoch = held.epoch();

    attacker.batch_execute("BEGIN").unwrap();
    for key in [HELD, "team/free-1"] {
        let k = quote(key);
        for sql in [
            format!("SELECT * FROM lease.acquire({k}, 'evil-1', interval '1 hour')"),
            format!("SELECT * FROM lease.renew({k}, 'app-1', {epoch}, interval '1 hour')"),
            format!("SELECT * FROM lease.release({k}, 'app-1', {epoch})"),
            format!("SELECT * FROM lease.inspect({k})"),
            format!("SELECT lease.check_held({k}, 'app-1', {epoch})"),
            format!("SELECT lease.admit('attacker/res', {k}, {epoch})"),
            format!("SELECT lease._waiter_watch({k})"),
        ] {
            let outcome = outcome_of(&mut attacker, &sql);
            assert_eq!(outcome.sqlstate, "42501", "{sql}: {outcome:?}");
        }
    }
    let acquired = app.acquire("team/free-1", "app-1", TTL);
    assert!(
        matches!(acquired, Ok(Acquisition::Granted(_))),
        "after refused function calls: {acquired:?}"
    );
    assert!(matches!(
        app.renew(&leasehold_test_support::grant(HELD, "app-1", epoch), TTL)
            .unwrap(),
        Renewal::Renewed { .. }
    ));

    // The fast paths, with key expressions that are not constants.
    arm(&mut attacker, i64::MAX, Some("team/free-2"), None);
    let fast_acquire = outcome_of(
        &mut attacker,
        "UPDATE lease.fast_acquire SET key = pg_temp.sw(), owner = 'evil-1', ttl = interval '1 hour'",
    );
    arm(&mut attacker, i64::MAX, Some(HELD), None);
    let fast_renew = outcome_of(
        &mut attacker,
        &format!(
            "UPDATE lease.fast_renew SET key = pg_temp.sw(), owner = 'app-1', epoch = {epoch}, ttl = interval '1 hour'"
        ),
    );
    arm(&mut attacker, i64::MAX, Some(HELD), None);
    let fast_release = outcome_of(
        &mut attacker,
        &format!(
            "UPDATE lease.fast_release SET key = pg_temp.sw(), owner = 'app-1', epoch = {epoch}"
        ),
    );
    for outcome in [&fast_acquire, &fast_renew, &fast_release] {
        assert_ne!(
            outcome.result, "1 rows",
            "a refused call wrote: {outcome:?}"
        );
    }
    let acquired = app.acquire("team/free-2", "app-1", TTL);
    assert!(
        matches!(acquired, Ok(Acquisition::Granted(_))),
        "the application's acquire, while the outsider's refused fast grant ({fast_acquire:?}) \
         is in an open transaction: {acquired:?}"
    );
    holder_renews_and_releases(&mut app, HELD, epoch.get());
    attacker.batch_execute("ROLLBACK").unwrap();
}

/// One way an outsider presents a governed key: the key, and the owner and
/// epoch it claims.
#[derive(Debug, Clone, Copy)]
struct Presented {
    key: &'static str,
    owner: &'static str,
    epoch: i64,
}

/// Hole 3a, an oracle: an outsider that counts how often its own key
/// expression is evaluated learnt, from the fast paths, whether a governed
/// key was held or free, and which owner and epoch held it (the rules
/// compared the row's state before they evaluated the key). Must hold:
/// for every statement, a governed HELD key with the right or a wrong owner
/// or epoch, and a governed FREE key, give the same count, SQLSTATE, error
/// text and result (up to the key's name).
#[test]
fn an_outsider_counting_its_key_expression_learns_nothing_about_a_governed_key() {
    let deployment = bound_deployment();
    let mut app = deployment.conn_as(&deployment.app);
    let held = granted(app.acquire(HELD, "app-1", TTL).unwrap());
    hold_and_release(&mut app, FREE, "app-1");
    let mut attacker = deployment.conn_as(&deployment.attacker);
    install_attacker_tools(&mut attacker);
    let epoch = held.epoch();
    let cases = [
        Presented {
            key: HELD,
            owner: "app-1",
            epoch: epoch.get(),
        },
        Presented {
            key: HELD,
            owner: "app-2",
            epoch: epoch.get(),
        },
        Presented {
            key: HELD,
            owner: "app-1",
            epoch: epoch.get() + 1,
        },
        Presented {
            key: FREE,
            owner: "app-1",
            epoch: epoch.get(),
        },
    ];
    let templates = [
        "UPDATE lease.fast_acquire SET key = pg_temp.sw(), owner = 'evil-1', ttl = interval '1 hour'",
        "UPDATE lease.fast_renew SET key = pg_temp.sw(), owner = {owner}, epoch = {epoch}, ttl = interval '1 hour'",
        "UPDATE lease.fast_release SET key = pg_temp.sw(), owner = {owner}, epoch = {epoch}",
        "SELECT * FROM lease.acquire(pg_temp.sw(), 'evil-1', interval '1 hour')",
        "SELECT * FROM lease.renew(pg_temp.sw(), {owner}, {epoch}, interval '1 hour')",
        "SELECT * FROM lease.release(pg_temp.sw(), {owner}, {epoch})",
        "SELECT * FROM lease.inspect(pg_temp.sw())",
        "SELECT lease.check_held(pg_temp.sw(), {owner}, {epoch})",
        "SELECT lease.admit('attacker/res', pg_temp.sw(), {epoch})",
        "SELECT lease._waiter_watch(pg_temp.sw())",
    ];
    let mut differing = Vec::new();
    for template in templates {
        let answers: Vec<(Presented, i64, Outcome)> = cases
            .iter()
            .map(|case| {
                let sql = template
                    .replace("{owner}", &quote(case.owner))
                    .replace("{epoch}", &case.epoch.to_string());
                arm(&mut attacker, i64::MAX, Some(case.key), Some(case.key));
                let outcome = outcome_of(&mut attacker, &sql);
                let digest = digest_hex(&mut attacker, case.key);
                let outcome = Outcome {
                    sqlstate: outcome.sqlstate,
                    message: normalised(&outcome.message, case.key, &digest),
                    result: normalised(&outcome.result, case.key, &digest),
                };
                (*case, switch_calls(&mut attacker), outcome)
            })
            .collect();
        let first = (&answers[0].1, &answers[0].2);
        if answers.iter().any(|answer| (&answer.1, &answer.2) != first) {
            differing.push(format!("{template}:\n    {answers:?}"));
        }
    }
    assert!(
        differing.is_empty(),
        "the outsider tells the key's state, owner or epoch apart:\n{}",
        differing.join("\n")
    );
}

/// Hole 3b, an oracle: `lease._fast_wake(digest)`, granted to PUBLIC,
/// notified `lease_released` for a FREE key and not for a held one (under
/// REPEATABLE READ always; under READ COMMITTED when a waiter is
/// registered), without any namespace check, so an outsider listening on
/// the channel learnt the state of any key whose name it can guess. Must
/// hold: the outsider hears the same for a held and a free governed key,
/// and the function is gone or not executable by it.
#[test]
fn fast_wake_is_no_oracle_of_whether_a_governed_key_is_free() {
    let deployment = bound_deployment();
    let mut app = deployment.conn_as(&deployment.app);
    granted(app.acquire(HELD, "app-1", TTL).unwrap());
    hold_and_release(&mut app, FREE, "app-1");
    // The application waits for both keys (its listener registered them).
    for key in [HELD, FREE] {
        query_lines(
            &mut app,
            &format!("SELECT lease._waiter_watch({}) AS line", quote(key)),
        );
    }
    let mut attacker = deployment.conn_as(&deployment.attacker);
    install_attacker_tools(&mut attacker);
    attacker.batch_execute("LISTEN lease_released").unwrap();

    for isolation in ["READ COMMITTED", "REPEATABLE READ"] {
        let heard: Vec<(&str, Outcome, Vec<String>)> = [HELD, FREE]
            .into_iter()
            .map(|key| {
                let digest = digest_hex(&mut attacker, key);
                attacker
                    .batch_execute(&format!("BEGIN ISOLATION LEVEL {isolation}"))
                    .unwrap();
                let outcome = outcome_of(
                    &mut attacker,
                    &format!(
                        "SELECT lease._fast_wake(sha256(convert_to({}, 'UTF8')))",
                        quote(key)
                    ),
                );
                attacker.batch_execute("COMMIT").unwrap();
                let notifications = drain_notifications(&mut attacker)
                    .iter()
                    .map(|payload| normalised(payload, key, &digest))
                    .collect();
                (key, outcome, notifications)
            })
            .collect();
        assert_eq!(
            (&heard[0].1, &heard[0].2),
            (&heard[1].1, &heard[1].2),
            "{isolation}: the outsider hears whether the key is free: {heard:?}"
        );
    }
    assert!(query_bool(
        &mut attacker,
        "SELECT to_regprocedure('lease._fast_wake(bytea)') IS NULL \
                OR NOT has_function_privilege(to_regprocedure('lease._fast_wake(bytea)'), 'EXECUTE') AS flag"
    ));
}

/// The statements hole 3c calls each function PUBLIC may execute with,
/// `{key}` standing for the governed name (also as a resource name: the
/// held key's name fences a resource, the free one's none). None for the
/// functions that take no key or resource name. A function missing here
/// fails the test: list it.
fn public_call(signature: &str) -> Option<Option<Vec<&'static str>>> {
    let statements = match signature {
        "lease.generation()" | "lease._waiter_reset()" | "lease.renew_group(bigint,text,interval)" => {
            return Some(None)
        }
        // The catalog's list of fenced tables and what reads it, the names
        // and the key texts of a fence, and the fence's shape: none reads a
        // key's state.
        "lease.fenced_tables()"
        | "lease._fences()"
        | "lease._fence_args(bytea)"
        | "lease._fence_shape(regclass,text[])"
        | "lease._fence_shape_trigger()"
        | "lease._fence_no_children_check()" => return Some(None),
        signature if signature.starts_with("lease._fence_key_text(") => return Some(None),
        // The fence's triggers, aimed by the outsider at a table of its own.
        "lease._fence()" => vec![
            "CREATE TEMP TABLE IF NOT EXISTS fence_rows_probe (k text);
             DROP TRIGGER IF EXISTS fence_rows_probe ON pg_temp.fence_rows_probe;
             CREATE TRIGGER fence_rows_probe AFTER INSERT ON pg_temp.fence_rows_probe
               REFERENCING NEW TABLE AS lease_new FOR EACH STATEMENT EXECUTE FUNCTION lease._fence('rows', '', 'k');
             INSERT INTO pg_temp.fence_rows_probe VALUES ({key})",
            "CREATE TEMP TABLE IF NOT EXISTS fence_table_probe (k text);
             DROP TRIGGER IF EXISTS fence_table_probe ON pg_temp.fence_table_probe;
             CREATE TRIGGER fence_table_probe BEFORE INSERT ON pg_temp.fence_table_probe
               FOR EACH STATEMENT EXECUTE FUNCTION lease._fence('table', {key});
             INSERT INTO pg_temp.fence_table_probe VALUES ('x')",
        ],
        "lease._fence_table()" => vec![
            "CREATE TEMP TABLE IF NOT EXISTS fence_table_probe (k text);
             DROP TRIGGER IF EXISTS fence_table_probe ON pg_temp.fence_table_probe;
             CREATE TRIGGER fence_table_probe BEFORE INSERT ON pg_temp.fence_table_probe
               FOR EACH STATEMENT EXECUTE FUNCTION lease._fence_table({key});
             INSERT INTO pg_temp.fence_table_probe VALUES ('x')",
        ],
        "lease._fence_check(regclass,text[])" => {
            vec!["SELECT lease._fence_check('pg_class', ARRAY[{key}])"]
        }
        "lease.present(text,text,bigint)" => vec!["SELECT lease.present({key}, 'app-1', 1)"],
        "lease.protect_table(regclass,text)" => vec!["SELECT lease.protect_table('pg_class', {key})"],
        "lease.protect_rows(regclass,text,text[])" => {
            vec!["SELECT lease.protect_rows('pg_class', {key}, ARRAY['oid'])"]
        }
        "lease.unprotect_table(regclass)" => vec!["SELECT lease.unprotect_table('pg_class')"],
        "lease._fence_prepare(text,regclass,text,text[])" => {
            vec!["SELECT lease._fence_prepare('protect_table', 'pg_class', {key}, NULL)"]
        }
        "lease._fence_drop(regclass)" => vec!["SELECT lease._fence_drop('pg_class')"],
        "lease.acquire(text,text,interval,interval)" => vec![
            "SELECT * FROM lease.acquire({key}, 'evil-1', interval '1 min', interval '0')",
        ],
        "lease.renew(text,text,bigint,interval)" => {
            vec!["SELECT * FROM lease.renew({key}, 'app-1', 1, interval '1 min')"]
        }
        "lease.release(text,text,bigint)" => vec!["SELECT * FROM lease.release({key}, 'app-1', 1)"],
        "lease.inspect(text)" => vec!["SELECT * FROM lease.inspect({key})"],
        "lease.key_state(text)" => vec!["SELECT * FROM lease.key_state({key})"],
        "lease.why_refused(text,text,bigint)" => {
            vec!["SELECT * FROM lease.why_refused({key}, 'app-1', 1)"]
        }
        "lease.admit(text,text,bigint)" => vec![
            "SELECT lease.admit('attacker/res', {key}, 1)",
            "SELECT lease.admit({key}, 'attacker/key', 1)",
        ],
        "lease.check_held(text,text,bigint)" => vec!["SELECT lease.check_held({key}, 'app-1', 1)"],
        "lease.admit_held(text,text,text,bigint)" => vec![
            "SELECT lease.admit_held('attacker/res', {key}, 'app-1', 1)",
            "SELECT lease.admit_held({key}, 'attacker/key', 'evil-1', 1)",
        ],
        "lease.renew_admit(text,text,text,bigint,interval)" => vec![
            "SELECT lease.renew_admit('attacker/res', {key}, 'app-1', 1, interval '1 min')",
            "SELECT lease.renew_admit({key}, 'attacker/key', 'evil-1', 1, interval '1 min')",
        ],
        "lease.inspect_guard(text)" => vec!["SELECT * FROM lease.inspect_guard({key})"],
        "lease.list_leases(text,text,text[],text,bigint)" => {
            vec!["SELECT * FROM lease.list_leases({key}, NULL, '{}', 'key', 10)"]
        }
        "lease._waiter_watch(text)" => vec!["SELECT lease._waiter_watch({key})"],
        "lease._waiter_unwatch(text)" => vec!["SELECT lease._waiter_unwatch({key})"],
        "lease.join_group(text[],text,bigint[],interval,bytea[])" => vec![
            "SELECT * FROM lease.join_group(ARRAY[{key}], 'app-1', ARRAY[1]::bigint[], interval '1 min')",
        ],
        "lease.renew_many(text[],text,bigint[],interval,bytea[])" => vec![
            "SELECT * FROM lease.renew_many(ARRAY[{key}], 'app-1', ARRAY[1]::bigint[], interval '1 min')",
        ],
        "lease.release_many(text[],text,bigint[],bytea[])" => vec![
            "SELECT * FROM lease.release_many(ARRAY[{key}], 'app-1', ARRAY[1]::bigint[])",
        ],
        "lease._fast_allowed(text)" => vec!["SELECT lease._fast_allowed({key})"],
        "lease._fast_wake(bytea)" => vec!["SELECT lease._fast_wake(sha256(convert_to({key}, 'UTF8')))"],
        _ => return None,
    };
    Some(Some(statements))
}

/// Hole 3c, oracles in general: every function of schema `lease` that
/// PUBLIC may execute, called by an outsider on a governed key, must answer
/// the same whether the key is held or free: the same SQLSTATE, error text
/// and result (up to the key's name), and the same notifications, under
/// READ COMMITTED and REPEATABLE READ, while the application waits for
/// both keys. Before the rewrite `lease._fast_wake` notified for the free
/// key only. A PUBLIC function this test does not know fails it.
#[test]
fn every_public_function_answers_an_outsider_alike_for_a_held_and_a_free_governed_key() {
    let deployment = bound_deployment();
    let mut app = deployment.conn_as(&deployment.app);
    let held = granted(app.acquire(HELD, "app-1", TTL).unwrap());
    assert_eq!(held.epoch(), 1, "the statements present epoch 1");
    app.admit(HELD, &held, Check::Token).unwrap();
    hold_and_release(&mut app, FREE, "app-1");
    for key in [HELD, FREE] {
        query_lines(
            &mut app,
            &format!("SELECT lease._waiter_watch({}) AS line", quote(key)),
        );
    }
    let mut attacker = deployment.conn_as(&deployment.attacker);
    install_attacker_tools(&mut attacker);
    attacker.batch_execute("LISTEN lease_released").unwrap();

    let executable = query_lines(
        &mut attacker,
        "SELECT p.oid::regprocedure::text AS line FROM pg_proc AS p \
           JOIN pg_namespace AS n ON n.oid = p.pronamespace \
          WHERE n.nspname = 'lease' AND has_function_privilege(p.oid, 'EXECUTE') \
          ORDER BY 1",
    );
    let unknown: Vec<&String> = executable
        .iter()
        .filter(|signature| public_call(signature).is_none())
        .collect();
    assert!(
        unknown.is_empty(),
        "functions PUBLIC may execute that this test does not know: {unknown:?}"
    );

    let mut differing = Vec::new();
    for signature in &executable {
        let Some(Some(statements)) = public_call(signature) else {
            continue;
        };
        for template in statements {
            for isolation in ["READ COMMITTED", "REPEATABLE READ"] {
                let answers: Vec<(Outcome, Vec<String>)> = [HELD, FREE]
                    .into_iter()
                    .map(|key| {
                        let digest = digest_hex(&mut attacker, key);
                        let sql = template.replace("{key}", &quote(key));
                        attacker
                            .batch_execute(&format!("BEGIN ISOLATION LEVEL {isolation}"))
                            .unwrap();
                        let outcome = outcome_of(&mut attacker, &sql);
                        attacker.batch_execute("COMMIT").unwrap();
                        let notifications = drain_notifications(&mut attacker)
                            .iter()
                            .map(|payload| normalised(payload, key, &digest))
                            .collect();
                        let outcome = Outcome {
                            sqlstate: outcome.sqlstate,
                            message: normalised(&outcome.message, key, &digest),
                            result: normalised(&outcome.result, key, &digest),
                        };
                        (outcome, notifications)
                    })
                    .collect();
                if answers[0] != answers[1] {
                    differing.push(format!(
                        "{template} ({isolation}):\n    held: {:?}\n    free: {:?}",
                        answers[0], answers[1]
                    ));
                }
            }
        }
    }
    assert!(
        differing.is_empty(),
        "public functions answer an outsider differently for a held and a free key:\n{}",
        differing.join("\n")
    );
}

/// One attack of hole 4: a fast path statement whose SET expression is
/// `pg_temp.sw()`, good where the rule checks it and bad where it stores it.
struct StoredAttack {
    what: &'static str,
    /// `{key}` and `{epoch}` stand for the attacker's own key and its grant.
    statement: &'static str,
    good: &'static str,
    bad: Option<String>,
    /// Whether the statement needs the key held by the attacker (a renewal)
    /// rather than FREE (a grant).
    needs_held: bool,
}

/// The rows no function writes: a grant without expiry or an expiry
/// without grant, an owner over 16 KiB, an expiry more than 100 years
/// ahead; of the keys LIKE `keys_like`.
fn impossible_rows(admin: &mut PgConnection, keys_like: &str) -> Vec<String> {
    query_lines(
        admin,
        &format!(
            "SELECT format('%s: owner %s, %s bytes, expires_at %s', key, left(owner, 10), \
                           octet_length(owner), coalesce(expires_at::text, 'NULL')) AS line \
               FROM lease.leases \
              WHERE key LIKE {} \
                AND ((owner IS NULL) <> (expires_at IS NULL) OR octet_length(owner) > 16384 \
                     OR expires_at > clock_timestamp() + interval '100 years') \
              ORDER BY key",
            quote(keys_like)
        ),
    )
}

/// Hole 4, values written are not the values checked: the fast paths'
/// rules checked `NEW.ttl` and `NEW.owner` in their WHERE and evaluated
/// them again in their SET, so a volatile expression passed the checks
/// and stored a held row without expiry, an expiry without owner, a
/// 20,000-byte owner or an expiry 1000 years ahead, on the attacker's own
/// keys. Must hold: none of these rows exists afterwards, whatever the
/// statements answered.
#[test]
fn volatile_set_expressions_cannot_store_rows_no_function_would_write() {
    let deployment = Deployment::new();
    let mut admin = deployment.admin();
    let mut attacker = deployment.conn_as(&deployment.attacker);
    install_attacker_tools(&mut attacker);
    let acquire_with =
        "UPDATE lease.fast_acquire SET key = {key}, owner = 'evil-1', ttl = pg_temp.sw()::interval";
    let owner_with =
        "UPDATE lease.fast_acquire SET key = {key}, owner = pg_temp.sw(), ttl = interval '1 hour'";
    let renew_with = "UPDATE lease.fast_renew SET key = {key}, owner = 'evil-1', epoch = {epoch}, ttl = pg_temp.sw()::interval";
    let attacks = [
        StoredAttack {
            what: "grant without expiry",
            statement: acquire_with,
            good: "1 hour",
            bad: None,
            needs_held: false,
        },
        StoredAttack {
            what: "expiry without owner",
            statement: owner_with,
            good: "evil-1",
            bad: None,
            needs_held: false,
        },
        StoredAttack {
            what: "20000-byte owner",
            statement: owner_with,
            good: "evil-1",
            bad: Some("o".repeat(20_000)),
            needs_held: false,
        },
        StoredAttack {
            what: "1000-year grant",
            statement: acquire_with,
            good: "1 hour",
            bad: Some("1000 years".into()),
            needs_held: false,
        },
        StoredAttack {
            what: "renewal without expiry",
            statement: renew_with,
            good: "1 hour",
            bad: None,
            needs_held: true,
        },
        StoredAttack {
            what: "1000-year renewal",
            statement: renew_with,
            good: "1 hour",
            bad: Some("1000 years".into()),
            needs_held: true,
        },
    ];
    let mut stored = Vec::new();
    for (number, attack) in attacks.iter().enumerate() {
        for threshold in THRESHOLDS {
            // A fresh key of the attacker's own for every try.
            let key = format!("mine/{number}/{threshold}");
            let lease = granted(attacker.acquire(&key, "evil-1", TTL).unwrap());
            if !attack.needs_held {
                assert_eq!(
                    attacker
                        .release(&leasehold_test_support::grant(
                            &key,
                            "evil-1",
                            lease.epoch()
                        ))
                        .unwrap(),
                    Release::Released
                );
            }
            let sql = attack
                .statement
                .replace("{key}", &quote(&key))
                .replace("{epoch}", &lease.epoch().to_string());
            arm(
                &mut attacker,
                threshold,
                Some(attack.good),
                attack.bad.as_deref(),
            );
            let outcome = outcome_of(&mut attacker, &sql);
            let planted = impossible_rows(&mut admin, &key);
            if !planted.is_empty() {
                stored.push(format!(
                    "{} (threshold {threshold}, {outcome:?}): {}",
                    attack.what,
                    planted.join(", ")
                ));
            }
        }
    }
    assert!(
        stored.is_empty(),
        "the fast paths stored rows no function writes:\n{}",
        stored.join("\n")
    );
    assert_eq!(impossible_rows(&mut admin, "%"), Vec::<String>::new());
}

/// Hole 4, consequence: a held row without expiry (planted above through
/// `lease.fast_acquire`) made every `lease.acquire` of the key loop
/// through its 100,000 attempts and raise 40001, for ever: nobody could
/// take the key again. Must hold: the row cannot be planted, and another
/// owner's acquire of every key the attack touched answers (granted or
/// denied) instead of failing.
#[test]
fn a_held_row_without_expiry_cannot_be_planted_to_make_acquire_spin() {
    let deployment = Deployment::new();
    let mut admin = deployment.admin();
    let mut attacker = deployment.conn_as(&deployment.attacker);
    install_attacker_tools(&mut attacker);
    let mut keys = Vec::new();
    for threshold in THRESHOLDS {
        let key = format!("open/spin/{threshold}");
        hold_and_release(&mut attacker, &key, "evil-1");
        arm(&mut attacker, threshold, Some("1 hour"), None);
        outcome_of(
            &mut attacker,
            &format!(
                "UPDATE lease.fast_acquire SET key = {}, owner = 'evil-1', ttl = pg_temp.sw()::interval",
                quote(&key)
            ),
        );
        keys.push(key);
        if query_bool(
            &mut admin,
            &format!(
                "SELECT EXISTS (SELECT 1 FROM lease.leases WHERE key = {} \
                                AND owner IS NOT NULL AND expires_at IS NULL) AS flag",
                quote(keys.last().unwrap())
            ),
        ) {
            break;
        }
    }
    let mut worker = deployment.conn_as(&deployment.worker);
    for key in &keys {
        let answer = worker.acquire(key, "worker-1", TTL);
        assert!(
            answer.is_ok(),
            "acquire of {key} ({:?}): {answer:?}",
            row_state(&mut admin, key)
        );
    }
}

/// How a raw statement on a table failed: what the CHECK tests compare.
#[derive(Debug)]
struct Violation {
    kind: String,
    constraint: Option<String>,
    column: Option<String>,
    message: String,
}

fn violation_of(conn: &mut PgConnection, sql: &str) -> Option<Violation> {
    match diesel::sql_query(sql).execute(conn) {
        Ok(_) => None,
        Err(DieselError::DatabaseError(kind, info)) => Some(Violation {
            kind: format!("{kind:?}"),
            constraint: info.constraint_name().map(str::to_owned),
            column: info.column_name().map(str::to_owned),
            message: info.message().to_owned(),
        }),
        Err(other) => panic!("{sql}: {other}"),
    }
}

/// Every row of `table`, whole, for "nothing changed" checks.
fn whole_table(conn: &mut PgConnection, table: &str) -> Vec<String> {
    query_lines(
        conn,
        &format!("SELECT format('%s', t) AS line FROM {table} AS t ORDER BY 1"),
    )
}

/// Runs each statement as `conn` (the install owner, who owns the tables)
/// in a transaction of its own, and lists every one that did not fail with
/// its constraint or that changed `table`. A NULL `first_epoch` may also be
/// refused by the column's NOT NULL.
fn constraint_failures(
    conn: &mut PgConnection,
    table: &str,
    cases: &[(&str, String)],
) -> Vec<String> {
    let before = whole_table(conn, table);
    let mut failures = Vec::new();
    for (constraint, sql) in cases {
        conn.batch_execute("BEGIN").unwrap();
        let violation = violation_of(conn, sql);
        let changed = violation.is_none() && whole_table(conn, table) != before;
        conn.batch_execute("ROLLBACK").unwrap();
        let named = violation.as_ref().is_some_and(|v| {
            v.constraint.as_deref() == Some(*constraint)
                || (*constraint == "not_null_first_epoch"
                    && v.kind == format!("{:?}", DatabaseErrorKind::NotNullViolation)
                    && v.column.as_deref() == Some("first_epoch"))
        });
        if !named {
            let got = violation.as_ref().map_or_else(
                || "success".to_owned(),
                |v| {
                    format!(
                        "{} on constraint {:?}, column {:?}: {}",
                        v.kind, v.constraint, v.column, v.message
                    )
                },
            );
            failures.push(format!(
                "{sql}: expected {constraint}, got {got}{}",
                if changed { "; the table changed" } else { "" }
            ));
        }
        assert_eq!(whole_table(conn, table), before, "{sql} left a change");
    }
    failures
}

/// Hole 4, the table keeps what the functions keep: named constraints on
/// `lease.leases` refuse every row no function writes, even from the
/// install owner writing the table by hand, and leave the row as it was: a
/// grant is owner and expiry or neither, and only a grant is in a group or
/// remembers a lapsed owner (`leases_grant_complete`); epochs and first
/// epochs are set and positive (domain `lease.lease_epoch`,
/// `lease_epoch_positive`); key, owner and lapsed owner are 1 to 16384
/// bytes (domain `lease.lease_name`, `lease_name_size`).
#[test]
fn the_lease_table_refuses_impossible_rows_by_named_check_constraints() {
    let deployment = Deployment::new();
    let mut app = deployment.conn_as(&deployment.app);
    granted(app.acquire("c/held", "app-1", TTL).unwrap());
    assert_eq!(hold_and_release(&mut app, "c/free", "app-1"), 1);
    let grouped = granted(app.acquire("c/grouped", "app-1", TTL).unwrap());
    let group = query_lines(
        &mut app,
        &format!(
            "SELECT group_id::text AS line FROM lease.join_group(ARRAY['c/grouped'], 'app-1', \
                    ARRAY[{}]::bigint[], interval '1 min')",
            grouped.epoch()
        ),
    )
    .remove(0);
    let hashed = |key: &str| format!("sha256(convert_to({key}, 'UTF8'))");
    let update =
        |set: &str, key: &str| format!("UPDATE lease.leases SET {set} WHERE key = '{key}'");
    let insert = |key: &str, hash: &str, owner: &str, epoch: i64, expires: &str, first: &str| {
        format!(
            "INSERT INTO lease.leases (key, key_hash, owner, epoch, expires_at, lapsed_owner, first_epoch, group_id) \
             VALUES ({key}, {hash}, {owner}, {epoch}, {expires}, NULL, {first}, NULL)"
        )
    };
    let later = "clock_timestamp() + interval '1 hour'";
    let cases: Vec<(&str, String)> = vec![
        (
            "leases_grant_complete",
            update("expires_at = NULL", "c/held"),
        ),
        ("leases_grant_complete", update("owner = NULL", "c/held")),
        (
            "leases_grant_complete",
            update(&format!("expires_at = {later}"), "c/free"),
        ),
        ("leases_grant_complete", update("owner = 'app-2'", "c/free")),
        (
            "leases_grant_complete",
            insert("'c/new'", &hashed("'c/new'"), "'x'", 1, "NULL", "1"),
        ),
        (
            "leases_grant_complete",
            insert("'c/new'", &hashed("'c/new'"), "NULL", 1, later, "1"),
        ),
        (
            "leases_grant_complete",
            update(&format!("group_id = {group}"), "c/free"),
        ),
        (
            "leases_grant_complete",
            update("lapsed_owner = 'app-0'", "c/free"),
        ),
        ("lease_epoch_positive", update("epoch = 0", "c/free")),
        ("lease_epoch_positive", update("epoch = -5", "c/free")),
        (
            "lease_epoch_positive",
            insert("'c/new'", &hashed("'c/new'"), "NULL", 0, "NULL", "1"),
        ),
        (
            "not_null_first_epoch",
            update("first_epoch = NULL", "c/free"),
        ),
        ("lease_epoch_positive", update("first_epoch = 0", "c/free")),
        (
            "not_null_first_epoch",
            insert("'c/new'", &hashed("'c/new'"), "NULL", 1, "NULL", "NULL"),
        ),
        (
            "lease_name_size",
            update(&format!("key = '', key_hash = {}", hashed("''")), "c/free"),
        ),
        (
            "lease_name_size",
            update(
                &format!(
                    "key = repeat('k', 16385), key_hash = {}",
                    hashed("repeat('k', 16385)")
                ),
                "c/free",
            ),
        ),
        (
            "lease_name_size",
            update(
                &format!(
                    "key = repeat('é', 8193), key_hash = {}",
                    hashed("repeat('é', 8193)")
                ),
                "c/free",
            ),
        ),
        (
            "lease_name_size",
            insert("''", &hashed("''"), "NULL", 1, "NULL", "1"),
        ),
        ("lease_name_size", update("owner = ''", "c/held")),
        (
            "lease_name_size",
            update("owner = repeat('o', 16385)", "c/held"),
        ),
        (
            "lease_name_size",
            insert(
                "'c/new'",
                &hashed("'c/new'"),
                "repeat('o', 20000)",
                1,
                later,
                "1",
            ),
        ),
    ];
    let mut owner = deployment.conn_as(&deployment.owner);
    let failures = constraint_failures(&mut owner, "lease.leases", &cases);
    assert!(
        failures.is_empty(),
        "lease.leases kept rows no function writes:\n{}",
        failures.join("\n")
    );
}

/// Hole 4, the guards: `lease.guards` refuses, by its domains' named
/// constraints, a record below 1 (`lease_epoch_positive`) and an empty or
/// over-long resource or key name (`lease_name_size`), even from the
/// install owner, and leaves the row as it was.
#[test]
fn the_guard_table_refuses_impossible_rows_by_named_check_constraints() {
    let deployment = Deployment::new();
    let mut app = deployment.conn_as(&deployment.app);
    let lease = granted(app.acquire("c/held", "app-1", TTL).unwrap());
    app.admit("c/res", &lease, Check::Token).unwrap();
    let cases: Vec<(&str, String)> = vec![
        (
            "lease_epoch_positive",
            "UPDATE lease.guards SET accepted_epoch = -1 WHERE resource = 'c/res'".into(),
        ),
        (
            "lease_epoch_positive",
            "INSERT INTO lease.guards (resource, resource_hash, lease_key, accepted_epoch, updated_at) \
             VALUES ('c/new', sha256(convert_to('c/new', 'UTF8')), 'c/held', -1, clock_timestamp())"
                .into(),
        ),
        (
            "lease_name_size",
            "UPDATE lease.guards SET lease_key = '' WHERE resource = 'c/res'".into(),
        ),
        (
            "lease_name_size",
            "UPDATE lease.guards SET resource = repeat('r', 16385) WHERE resource = 'c/res'".into(),
        ),
    ];
    let mut owner = deployment.conn_as(&deployment.owner);
    let failures = constraint_failures(&mut owner, "lease.guards", &cases);
    assert!(
        failures.is_empty(),
        "lease.guards kept rows no function writes:\n{}",
        failures.join("\n")
    );
}

/// Hole 4 and 6, groups: a grant that names a group that is gone (written
/// by hand by the install owner; a prune clears its members in the same
/// statement) counts the group as lapsed: `inspect` answers with a boolean,
/// and once the grant's own expiry has passed another owner is granted the
/// key at once, instead of the old 100,000 attempts and 40001.
#[test]
fn a_grant_naming_a_group_that_is_gone_is_settled_by_its_own_expiry() {
    let deployment = Deployment::new();
    let mut app = deployment.conn_as(&deployment.app);
    let lease = granted(app.acquire("c/grouped", "app-1", TTL).unwrap());
    let mut owner = deployment.conn_as(&deployment.owner);
    owner
        .batch_execute("UPDATE lease.leases SET group_id = -1 WHERE key = 'c/grouped'")
        .unwrap();
    assert!(matches!(
        app.inspect("c/grouped").unwrap(),
        Some(leasehold::LeaseState::Held { .. })
    ));
    owner
        .batch_execute(
            "UPDATE lease.leases SET expires_at = clock_timestamp() - interval '1 second' \
             WHERE key = 'c/grouped'",
        )
        .unwrap();
    assert!(matches!(
        app.inspect("c/grouped").unwrap(),
        Some(leasehold::LeaseState::Lapsed { .. })
    ));
    let mut worker = deployment.conn_as(&deployment.worker);
    let taken = granted(worker.acquire("c/grouped", "worker-1", TTL).unwrap());
    assert_eq!(taken.epoch(), lease.epoch().get() + 1);
}

/// Hole 6: a grant joined to a heartbeat group and then renewed alone past
/// the group's expiry kept naming the group after a prune deleted it (the
/// group lapsed first; the grant's own expiry was still ahead, so the
/// grant stayed). Once its own expiry passed, every `lease.acquire` of the
/// key looped through its 100,000 attempts and raised 40001: the grant
/// was neither live nor, by the takeover's test, lapsed. Must hold: once
/// the grant's own expiry has passed, another owner is granted the key.
#[test]
fn a_member_of_a_pruned_group_is_acquirable_once_its_own_expiry_passes() {
    let deployment = Deployment::new();
    let mut admin = deployment.admin();
    let mut app = deployment.conn_as(&deployment.app);
    let lease = granted(app.acquire("jobs/grouped", "app-1", TTL).unwrap());
    let group = query_lines(
        &mut app,
        &format!(
            "SELECT group_id::text AS line FROM lease.join_group(ARRAY['jobs/grouped'], 'app-1', \
                    ARRAY[{}]::bigint[], interval '{} seconds')",
            lease.epoch(),
            STILL_HELD_NEXT_STEP.as_secs()
        ),
    )
    .remove(0);
    // The key alone, renewed past its group's expiry.
    assert!(matches!(
        app.renew(
            &leasehold_test_support::grant("jobs/grouped", "app-1", lease.epoch()),
            STILL_HELD_NEXT_STEP * 2
        )
        .unwrap(),
        Renewal::Renewed { .. }
    ));
    wait_for(
        &mut admin,
        &format!(
            "SELECT NOT EXISTS (SELECT 1 FROM lease.groups \
                                 WHERE id = {group} AND expires_at >= clock_timestamp()) AS flag"
        ),
    );
    deployment
        .conn_as(&deployment.owner)
        .batch_execute("SELECT * FROM lease.prune_keys(interval '1 millisecond')")
        .unwrap();
    assert!(
        query_bool(
            &mut admin,
            &format!("SELECT NOT EXISTS (SELECT 1 FROM lease.groups WHERE id = {group}) AS flag")
        ),
        "the prune removed the lapsed group"
    );
    assert!(
        row_state(&mut admin, "jobs/grouped").is_some(),
        "the grant, live on its own expiry, was not pruned"
    );
    wait_for(
        &mut admin,
        "SELECT clock_timestamp() > expires_at AS flag FROM lease.leases WHERE key = 'jobs/grouped'",
    );

    let mut worker = deployment.conn_as(&deployment.worker);
    let answer = worker.acquire("jobs/grouped", "worker-1", TTL);
    match answer {
        Ok(Acquisition::Granted(taken)) => assert_eq!(taken.epoch(), lease.epoch().get() + 1),
        other => panic!(
            "the lapsed member of a pruned group ({:?}): {other:?}",
            row_state(&mut admin, "jobs/grouped")
        ),
    }
}
