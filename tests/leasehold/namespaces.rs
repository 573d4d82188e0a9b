//! §4 and I15: operator actions granted to nobody, key namespaces bound to
//! roles, and the forced release. Every test runs in a [`Deployment`]: a
//! non-superuser owner installed leasehold, and the application, a worker,
//! an operator and an attacker log in as roles of their own.
//!
//! The refusals inside the API functions (acquire ... inspect_guard, the
//! waiter registration) and `fence` leaving PUBLIC come with the rewrite of
//! migrations 000001/000002 ("namespace checks"); the operator functions
//! themselves are migration 000004.

use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use leasehold::{
    admin::{BoundRole, ForcedRelease, MAX_GENERATION},
    error::{LeaseError, Operation},
    wait::LeaseWaiter,
    ErrorKind, LeaseClient, LeaseState, Leases, Refusal, Release, Renewal,
};
use leasehold_test_support::Deployment;

use crate::common::*;
use leasehold::admin::Operator;
use leasehold::guard::Check;
use leasehold::guard::Fencing;

/// The GRANT an owner runs to make a role an operator (docs/guide/security.md,
/// "Security model"), without `fence`, which has its own test.
fn grant_namespace_and_release_actions(deployment: &Deployment, to: &str) {
    deployment
        .conn_as(&deployment.owner)
        .batch_execute(&format!(
            "GRANT EXECUTE ON FUNCTION lease.force_release(text), lease.bind_namespace(text, text), \
             lease.unbind_namespace(text), lease.list_namespaces() TO {to}"
        ))
        .unwrap();
}

/// Binds as the owner, who owns the operator functions and so may run them.
fn bind(deployment: &Deployment, prefix: &str, role: &str) {
    deployment
        .conn_as(&deployment.owner)
        .bind_namespace(prefix, role)
        .unwrap();
}

/// Everything leasehold stores, as the superuser sees it.
fn whole_state(deployment: &Deployment) -> Vec<String> {
    let mut admin = deployment.admin();
    let mut lines = query_lines(
        &mut admin,
        "SELECT format('lease %s|%s|%s|%s|%s', key, owner, epoch, expires_at, lapsed_owner) AS line \
         FROM lease.leases ORDER BY key",
    );
    lines.extend(query_lines(
        &mut admin,
        "SELECT format('guard %s|%s|%s|%s', resource, lease_key, accepted_epoch, updated_at) AS line \
         FROM lease.guards ORDER BY resource",
    ));
    lines.extend(query_lines(
        &mut admin,
        "SELECT format('rule %s|%s|%s', prefix, role_oid, created_at) AS line \
         FROM lease.namespaces ORDER BY prefix",
    ));
    lines.extend(query_lines(
        &mut admin,
        "SELECT format('waiter %s', key_hash) AS line FROM lease.waiters ORDER BY key_hash",
    ));
    lines
}

#[track_caller]
fn assert_lease_forbidden<T: std::fmt::Debug>(
    result: Result<T, LeaseError>,
    operation: Operation,
    key: &str,
    role: &str,
) {
    match result {
        Err(e) if is_forbidden_by_namespace(&e) => {
            assert_eq!(
                (e.operation(), e.key().or(e.resource()), e.role()),
                (Some(operation), Some(key), Some(role))
            );
        }
        other => panic!("{operation} of {key} by {role}: expected Forbidden, got {other:?}"),
    }
}

/// A guard refusal by namespace; `argument` is checked when given (a call
/// whose key and resource are both protected may name either).
#[track_caller]
fn assert_guard_forbidden<T: std::fmt::Debug>(
    result: Result<T, LeaseError>,
    operation: Operation,
    refused: Option<(&str, &str)>,
    role: &str,
) {
    match result {
        Err(e) if is_forbidden_by_namespace(&e) => {
            assert_eq!((e.operation(), e.role()), (Some(operation), Some(role)));
            if let Some((argument, name)) = refused {
                let named = if argument == "resource" {
                    (e.resource(), e.key())
                } else {
                    (e.key(), e.resource())
                };
                assert_eq!(named, (Some(name), None), "{e:?}");
                let message = e.to_string();
                assert!(
                    message.contains(&format!(" {argument} {name:?}")),
                    "{message}"
                );
            }
        }
        other => panic!("{operation} by {role}: expected Forbidden, got {other:?}"),
    }
}

/// A namespace rule's refusal (the old `LeaseError::Forbidden`): kind
/// Forbidden, naming a key or a resource, and neither a fenced table's
/// refusal nor a refusal of a table's owner.
fn is_forbidden_by_namespace(error: &LeaseError) -> bool {
    error.kind() == ErrorKind::Forbidden
        && error.table().is_none()
        && error.refusal().is_none()
        && (error.key().is_some() || error.resource().is_some())
}

/// The diesel error of the old `LeaseError::Database` (the database failed
/// the call otherwise): kind Other, or Unavailable when the connection died.
fn database_error(error: &LeaseError) -> Option<&diesel::result::Error> {
    let operation = error.operation()?;
    let fits = matches!(error.kind(), ErrorKind::Other | ErrorKind::Unavailable)
        && error
            .to_string()
            .starts_with(&format!("lease {operation} failed in the database"));
    if !fits {
        return None;
    }
    std::error::Error::source(error)?.downcast_ref::<diesel::result::Error>()
}

fn is_granted(acquisition: Result<leasehold::Acquisition, LeaseError>) -> bool {
    matches!(acquisition, Ok(leasehold::Acquisition::Granted(_)))
}

// ---------------------------------------------------------------------------
// Operator actions are granted to nobody
// ---------------------------------------------------------------------------

#[test]
fn operator_functions_are_security_definer_with_a_pinned_search_path_and_granted_to_nobody() {
    let deployment = Deployment::new();
    let mut admin = deployment.admin();
    let functions = query_lines(
        &mut admin,
        "SELECT format('%s|%s|%s|%s', p.proname, p.prosecdef, array_to_string(p.proconfig, ','), \
                (SELECT string_agg(DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END, ',') \
                   FROM aclexplode(p.proacl) AS a WHERE a.privilege_type = 'EXECUTE')) AS line \
         FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
         WHERE n.nspname = 'lease' AND p.proname IN ('bind_namespace', 'unbind_namespace', 'list_namespaces', 'force_release', 'raise_generation') \
         ORDER BY p.proname",
    );
    let owner = &deployment.owner;
    assert_eq!(
        functions,
        [
            format!("bind_namespace|t|search_path=pg_catalog, pg_temp|{owner}"),
            format!("force_release|t|search_path=pg_catalog, pg_temp|{owner}"),
            format!("force_release|t|search_path=pg_catalog, pg_temp|{owner}"),
            format!("list_namespaces|t|search_path=pg_catalog, pg_temp|{owner}"),
            format!("raise_generation|t|search_path=pg_catalog, pg_temp|{owner}"),
            format!("unbind_namespace|t|search_path=pg_catalog, pg_temp|{owner}"),
        ]
    );
}

#[test]
fn app_worker_attacker_and_an_ungranted_operator_cannot_run_operator_actions() {
    let deployment = Deployment::new();
    let mut app = deployment.conn_as(&deployment.app);
    granted(app.acquire("job", "app-1", TTL).unwrap());
    let before = whole_state(&deployment);
    for role in [
        &deployment.app,
        &deployment.worker,
        &deployment.attacker,
        &deployment.operator,
    ] {
        let mut conn = deployment.conn_as(role);
        for sql in [
            format!("SELECT lease.bind_namespace('job', {})", quote(role)),
            "SELECT lease.bind_namespace('', '')".to_owned(),
            "SELECT lease.unbind_namespace('job')".to_owned(),
            "SELECT * FROM lease.list_namespaces()".to_owned(),
            "SELECT lease.force_release('job')".to_owned(),
        ] {
            assert_eq!(sqlstate_of(&mut conn, &sql), "42501", "{role}: {sql}");
        }
        assert!(matches!(
            conn.bind_namespace("job", role),
            Err(e) if database_error(&e).is_some()
                && e.operation() == Some(Operation::BIND_NAMESPACE)
        ));
        assert!(matches!(
            conn.unbind_namespace("job"),
            Err(e) if database_error(&e).is_some()
                && e.operation() == Some(Operation::UNBIND_NAMESPACE)
        ));
        assert!(matches!(
            conn.list_namespaces(),
            Err(e) if database_error(&e).is_some()
                && e.operation() == Some(Operation::LIST_NAMESPACES)
        ));
        assert!(matches!(
            conn.force_release("job"),
            Err(e) if database_error(&e).is_some()
                && e.operation() == Some(Operation::FORCE_RELEASE)
        ));
    }
    assert_eq!(whole_state(&deployment), before);
}

#[test]
fn operator_actions_work_once_the_owner_grants_them() {
    let deployment = Deployment::new();
    grant_namespace_and_release_actions(&deployment, &deployment.operator);
    let mut operator = deployment.conn_as(&deployment.operator);
    operator
        .bind_namespace("billing/", &deployment.app)
        .unwrap();
    let rules = operator.list_namespaces().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].prefix, "billing/");
    assert_eq!(rules[0].role, BoundRole::Role(deployment.app.clone()));
    assert!(operator.unbind_namespace("billing/").unwrap());
    assert_eq!(operator.list_namespaces().unwrap(), []);
    assert_eq!(operator.force_release("never-leased").unwrap(), None);
    // Still nobody else.
    let mut attacker = deployment.conn_as(&deployment.attacker);
    assert!(attacker.list_namespaces().is_err());
}

/// G7 / §4: `fence` raises a record above every real epoch, so it is an
/// operator action too. Needs the rewrite of migration 000002 that revokes
/// it from PUBLIC ("namespace checks").
#[test]
fn fence_is_an_operator_action_granted_to_nobody_until_the_owner_grants_it() {
    let deployment = Deployment::new();
    for role in [&deployment.app, &deployment.attacker, &deployment.operator] {
        let mut conn = deployment.conn_as(role);
        assert_eq!(
            sqlstate_of(&mut conn, "SELECT lease.fence('r', 'k', 0)"),
            "42501",
            "{role} may fence"
        );
    }
    assert_eq!(whole_state(&deployment), Vec::<String>::new());
    // G7: a fence reaches at most the key's counter (2 after a release).
    let mut app = deployment.conn_as(&deployment.app);
    let lease = granted(app.acquire("k", "a", TTL).unwrap());
    assert_eq!(app.release(&lease).unwrap(), Release::Released);
    deployment
        .conn_as(&deployment.owner)
        .batch_execute(&format!(
            "GRANT EXECUTE ON FUNCTION lease.fence(text, text, bigint) TO {}",
            deployment.operator
        ))
        .unwrap();
    let mut operator = deployment.conn_as(&deployment.operator);
    assert_eq!(
        operator.fence("r", "k", leasehold::Epoch::from(2)).unwrap(),
        3
    );
}

// ---------------------------------------------------------------------------
// The rules themselves
// ---------------------------------------------------------------------------

#[test]
fn bind_namespace_names_every_violation_and_changes_nothing() {
    let deployment = Deployment::new();
    let mut owner = deployment.conn_as(&deployment.owner);
    let violations = |result: Result<(), LeaseError>| match result {
        Err(e) if e.kind() == ErrorKind::InvalidInput && !e.violations().is_empty() => {
            e.violations().to_vec()
        }
        other => panic!("expected invalid input, got {other:?}"),
    };
    assert_eq!(
        violations(owner.bind_namespace("", "no_such_role")),
        [
            "prefix must not be empty",
            "role must name an existing role (there is no role 'no_such_role')",
        ]
    );
    assert_eq!(
        violations(owner.bind_namespace(&"p".repeat(1025), "")),
        [
            "prefix must be at most 1024 bytes",
            "role must not be empty"
        ]
    );
    // 1024 bytes of a two-byte character: 512 characters, at the limit;
    // beside another violation, only that one is named.
    assert_eq!(
        violations(owner.bind_namespace(&"é".repeat(512), "")),
        ["role must not be empty"]
    );
    owner
        .bind_namespace(&"é".repeat(512), &deployment.app)
        .unwrap();
    assert_eq!(
        violations(owner.bind_namespace(&"é".repeat(513), &deployment.app)),
        ["prefix must be at most 1024 bytes"]
    );
    assert_eq!(
        violations(owner.bind_namespace("a\0b", &deployment.app)),
        ["prefix must not contain NUL characters"]
    );
    // Role names are matched as stored: case matters, no identifier folding.
    assert_eq!(
        violations(owner.bind_namespace("x/", &deployment.app.to_uppercase())),
        [format!(
            "role must name an existing role (there is no role '{}')",
            deployment.app.to_uppercase()
        )]
    );
    assert_eq!(
        violations(owner.unbind_namespace("").map(|_| ())),
        ["prefix must not be empty"]
    );
    let mut admin = deployment.admin();
    assert_eq!(
        query_lines(
            &mut admin,
            "SELECT format('%s', octet_length(prefix)) AS line FROM lease.namespaces"
        ),
        ["1024"]
    );
}

#[test]
fn rebinding_a_prefix_moves_it_and_unbind_says_whether_a_rule_was_removed() {
    let deployment = Deployment::new();
    let mut owner = deployment.conn_as(&deployment.owner);
    owner.bind_namespace("billing/", &deployment.app).unwrap();
    owner.bind_namespace("audit/", &deployment.worker).unwrap();
    let first = owner.list_namespaces().unwrap();
    owner
        .bind_namespace("billing/", &deployment.worker)
        .unwrap();
    let rules = owner.list_namespaces().unwrap();
    let described: Vec<(String, BoundRole)> = rules
        .iter()
        .map(|rule| (rule.prefix.clone(), rule.role.clone()))
        .collect();
    assert_eq!(
        described,
        [
            (
                "audit/".to_owned(),
                BoundRole::Role(deployment.worker.clone())
            ),
            (
                "billing/".to_owned(),
                BoundRole::Role(deployment.worker.clone())
            ),
        ]
    );
    assert!(
        rules[1].created_at > first[1].created_at,
        "rebinding records when"
    );
    assert!(owner.unbind_namespace("billing/").unwrap());
    assert!(!owner.unbind_namespace("billing/").unwrap());
    assert!(
        !owner.unbind_namespace("audit").unwrap(),
        "exact prefixes only"
    );
    assert_eq!(owner.list_namespaces().unwrap().len(), 1);
}

/// A rule's `created_at` is the clock at the bind, not the start of the
/// binding transaction (§4: "the time of the latest bind"): checked inside
/// a transaction, once the server's clock is a second past its start.
#[test]
fn a_rule_is_dated_by_the_clock_at_the_bind_not_the_transactions_start() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.batch_execute("BEGIN").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !query_bool(
        &mut conn,
        "SELECT clock_timestamp() > now() + interval '1 second' AS flag",
    ) {
        assert!(Instant::now() < deadline, "the clock never moved");
        std::thread::sleep(Duration::from_millis(50));
    }
    conn.batch_execute("SELECT lease.bind_namespace('dated/', current_user)")
        .unwrap();
    assert_eq!(
        query_lines(
            &mut conn,
            "SELECT format('%s %s', prefix, (created_at > now() + interval '1 second')::text) AS line
               FROM lease.list_namespaces()"
        ),
        ["dated/ true"]
    );
    conn.batch_execute("COMMIT").unwrap();
}

#[test]
fn operator_writes_are_durable_at_commit_whatever_the_session_set() {
    let deployment = Deployment::new();
    let mut owner = deployment.conn_as(&deployment.owner);
    granted(owner.acquire("held", "a", TTL).unwrap());
    let setting = |conn: &mut PgConnection| {
        query_lines(conn, "SELECT current_setting('synchronous_commit') AS line").remove(0)
    };
    let app = quote(&deployment.app);
    for (call, writes) in [
        (format!("SELECT lease.bind_namespace('p/', {app})"), true),
        ("SELECT lease.unbind_namespace('none/')".to_owned(), false),
        ("SELECT * FROM lease.list_namespaces()".to_owned(), false),
        ("SELECT lease.force_release('held')".to_owned(), true),
        ("SELECT lease.force_release('unknown')".to_owned(), false),
    ] {
        for caller in ["off", "local"] {
            owner
                .batch_execute(&format!(
                    "BEGIN; SET LOCAL synchronous_commit = {caller}; {call}"
                ))
                .unwrap_or_else(|e| panic!("{call}: {e}"));
            let expected = if writes { "on" } else { caller };
            assert_eq!(setting(&mut owner), expected, "{call} under {caller}");
            owner.batch_execute("ROLLBACK").unwrap();
        }
    }
    owner
        .batch_execute(&format!(
            "SELECT lease.bind_namespace('p/', {app}); BEGIN; SET LOCAL synchronous_commit = off; \
             SELECT lease.unbind_namespace('p/')"
        ))
        .unwrap();
    assert_eq!(
        setting(&mut owner),
        "on",
        "an unbind that removes a rule writes"
    );
    owner.batch_execute("ROLLBACK").unwrap();
}

// ---------------------------------------------------------------------------
// I15: refusals (need the "namespace checks" rewrite of migrations 1 and 2)
// ---------------------------------------------------------------------------

/// I15: after `billing/` is bound to the application's role, the worker and
/// the attacker are refused on every lease and guard call for keys and
/// resources under it, with the typed error, and the refusal changes
/// nothing; the application goes on as before.
#[test]
fn a_bound_prefix_refuses_other_roles_on_every_call_and_the_refusal_changes_nothing() {
    let deployment = Deployment::new();
    bind(&deployment, "billing/", &deployment.app);
    let mut app = deployment.conn_as(&deployment.app);
    let lease = granted(app.acquire("billing/k", "app-1", TTL).unwrap());
    let token = lease.token();
    app.admit("billing/invoices", &token, Check::Token).unwrap();
    // Each other role gets a lease of its own outside the namespace, for
    // the calls that present an allowed key to a protected resource.
    let mut others = Vec::new();
    for role in [&deployment.worker, &deployment.attacker] {
        let mut conn = deployment.conn_as(role);
        let own = granted(conn.acquire(&format!("open/{role}"), role, TTL).unwrap());
        others.push((role.clone(), conn, own));
    }
    let before = whole_state(&deployment);

    for (role, conn, own) in &mut others {
        let role = role.as_str();
        let epoch = lease.epoch();
        assert_lease_forbidden(
            conn.acquire("billing/k", role, TTL),
            Operation::ACQUIRE,
            "billing/k",
            role,
        );
        assert_lease_forbidden(
            conn.acquire("billing/new", role, TTL),
            Operation::ACQUIRE,
            "billing/new",
            role,
        );
        assert_lease_forbidden(
            conn.acquire_waiting("billing/k", role, TTL, Duration::from_secs(5)),
            Operation::ACQUIRE,
            "billing/k",
            role,
        );
        assert_lease_forbidden(
            conn.renew(
                &leasehold_test_support::grant("billing/k", "app-1", epoch),
                TTL,
            ),
            Operation::RENEW,
            "billing/k",
            role,
        );
        assert_lease_forbidden(
            conn.release(&leasehold_test_support::grant("billing/k", "app-1", epoch)),
            Operation::RELEASE,
            "billing/k",
            role,
        );
        // Inspect refuses for a key that exists and for one that does not
        // alike: the refusal reveals nothing about the key's state.
        assert_lease_forbidden(
            conn.inspect("billing/k"),
            Operation::INSPECT,
            "billing/k",
            role,
        );
        assert_lease_forbidden(
            conn.inspect("billing/none"),
            Operation::INSPECT,
            "billing/none",
            role,
        );
        // Protected key and resource.
        assert_guard_forbidden(
            conn.admit("billing/invoices", &token, Check::Token),
            Operation::ADMIT,
            None,
            role,
        );
        assert_guard_forbidden(
            conn.check_held(&token),
            Operation::CHECK_HELD,
            Some(("key", "billing/k")),
            role,
        );
        assert_guard_forbidden(
            conn.admit("billing/invoices", &token, Check::LeaseHeld),
            Operation::ADMIT_HELD,
            None,
            role,
        );
        assert_guard_forbidden(
            conn.admit("billing/invoices", &token, Check::RenewAndAdmit(TTL)),
            Operation::RENEW_AND_ADMIT,
            None,
            role,
        );
        assert_guard_forbidden(
            conn.inspect_guard("billing/invoices"),
            Operation::INSPECT_GUARD,
            Some(("resource", "billing/invoices")),
            role,
        );
        // A protected resource with the role's own, allowed key.
        let own_token = own.token();
        for (operation, result) in [
            (
                Operation::ADMIT,
                conn.admit("billing/new-res", &own_token, Check::Token)
                    .map(|_| ()),
            ),
            (
                Operation::ADMIT_HELD,
                conn.admit("billing/new-res", &own_token, Check::LeaseHeld)
                    .map(|_| ()),
            ),
            (
                Operation::RENEW_AND_ADMIT,
                conn.admit("billing/new-res", &own_token, Check::RenewAndAdmit(TTL))
                    .map(|_| ()),
            ),
        ] {
            assert_guard_forbidden(
                result,
                operation,
                Some(("resource", "billing/new-res")),
                role,
            );
        }
        // A protected key presented to an unprotected resource.
        assert_guard_forbidden(
            conn.admit("open-resource", &token, Check::Token),
            Operation::ADMIT,
            Some(("key", "billing/k")),
            role,
        );
        // A waiter: its first attempt is an acquire.
        let client = LeaseClient::connect(&deployment.url_as(role), 1).unwrap();
        let waiter = LeaseWaiter::new(&client);
        match waiter.acquire("billing/k", role, TTL, Duration::from_secs(5)) {
            Err(error) => {
                assert_lease_forbidden::<()>(Err(error), Operation::ACQUIRE, "billing/k", role)
            }
            other => panic!("waiter of {role}: expected Forbidden, got {other:?}"),
        }
    }
    drop(others);
    assert_eq!(whole_state(&deployment), before, "a refusal changed state");

    // The application acts as before.
    assert!(matches!(
        app.inspect("billing/k").unwrap(),
        Some(LeaseState::Held { .. })
    ));
    app.check_held(&token).unwrap();
    app.admit("billing/invoices", &token, Check::LeaseHeld)
        .unwrap();
    app.admit("billing/invoices", &token, Check::RenewAndAdmit(TTL))
        .unwrap();
    assert_eq!(
        app.inspect_guard("billing/invoices")
            .unwrap()
            .map(|r| r.accepted_epoch),
        Some(lease.epoch())
    );
    assert!(matches!(
        app.renew(
            &leasehold_test_support::grant("billing/k", "app-1", lease.epoch()),
            TTL
        )
        .unwrap(),
        Renewal::Renewed { .. }
    ));
    assert_eq!(
        app.release(&leasehold_test_support::grant(
            "billing/k",
            "app-1",
            lease.epoch()
        ))
        .unwrap(),
        Release::Released
    );
    assert!(is_granted(app.acquire("billing/k", "app-2", TTL)));
}

/// I15: the rule with the longest matching prefix decides, and a prefix is
/// a plain starts-with on the name.
#[test]
fn the_longest_bound_prefix_decides_who_may_act() {
    let deployment = Deployment::new();
    bind(&deployment, "billing/", &deployment.app);
    bind(&deployment, "billing/eu/", &deployment.worker);
    let mut app = deployment.conn_as(&deployment.app);
    let mut worker = deployment.conn_as(&deployment.worker);
    let mut attacker = deployment.conn_as(&deployment.attacker);

    assert!(is_granted(app.acquire("billing/us/1", "a", TTL)));
    assert!(is_granted(worker.acquire("billing/eu/1", "w", TTL)));
    assert_lease_forbidden(
        app.acquire("billing/eu/2", "a", TTL),
        Operation::ACQUIRE,
        "billing/eu/2",
        &deployment.app,
    );
    assert_lease_forbidden(
        worker.acquire("billing/us/2", "w", TTL),
        Operation::ACQUIRE,
        "billing/us/2",
        &deployment.worker,
    );
    // "billing/eu" (no slash) is governed by "billing/", not "billing/eu/".
    assert!(is_granted(app.acquire("billing/eu", "a", TTL)));
    for name in ["billing/eu/3", "billing/x"] {
        assert_lease_forbidden(
            attacker.acquire(name, "x", TTL),
            Operation::ACQUIRE,
            name,
            &deployment.attacker,
        );
    }
    // Names that merely contain a bound prefix are not governed by it.
    for name in ["billing", "billingX/1", "other/billing/1", "Billing/1"] {
        assert!(is_granted(attacker.acquire(name, "x", TTL)), "{name}");
    }
    // Removing the longer rule hands its names to the shorter one.
    deployment
        .conn_as(&deployment.owner)
        .unbind_namespace("billing/eu/")
        .unwrap();
    assert!(is_granted(app.acquire("billing/eu/2", "a", TTL)));
    assert_lease_forbidden(
        worker.renew(&leasehold_test_support::grant("billing/eu/1", "w", 1), TTL),
        Operation::RENEW,
        "billing/eu/1",
        &deployment.worker,
    );
}

/// I15: a rule whose role was dropped admits nobody but superusers, and a
/// new role that takes the old name does not inherit it.
#[test]
fn a_rule_whose_role_was_dropped_fails_closed() {
    let deployment = Deployment::new();
    let retired = format!("{}_retired", deployment.db.name);
    deployment.admin_exec(&format!(
        "CREATE ROLE {retired}; GRANT {retired} TO {}",
        deployment.app
    ));
    bind(&deployment, "legacy/", &retired);
    let mut app = deployment.conn_as(&deployment.app);
    assert!(is_granted(app.acquire("legacy/1", "a", TTL)));

    deployment.admin_exec(&format!("DROP ROLE {retired}"));
    let mut owner = deployment.conn_as(&deployment.owner);
    let rules = owner.list_namespaces().unwrap();
    assert!(
        matches!(rules[0].role, BoundRole::Dropped { .. }),
        "{rules:?}"
    );
    for role in [&deployment.app, &deployment.attacker, &deployment.owner] {
        let mut conn = deployment.conn_as(role);
        assert_lease_forbidden(
            conn.acquire("legacy/2", "a", TTL),
            Operation::ACQUIRE,
            "legacy/2",
            role,
        );
        assert_lease_forbidden(
            conn.inspect("legacy/1"),
            Operation::INSPECT,
            "legacy/1",
            role,
        );
    }
    deployment.admin_exec(&format!(
        "CREATE ROLE {retired}; GRANT {retired} TO {}",
        deployment.app
    ));
    assert_lease_forbidden(
        deployment
            .conn_as(&deployment.app)
            .acquire("legacy/2", "a", TTL),
        Operation::ACQUIRE,
        "legacy/2",
        &deployment.app,
    );
    // Superusers pass; an operator can repair the key and the rule.
    assert!(is_granted(
        deployment.admin().acquire("legacy/3", "admin", TTL)
    ));
    assert_eq!(
        owner.force_release("legacy/1").unwrap(),
        Some(leasehold::Epoch::new(2))
    );
    owner.bind_namespace("legacy/", &deployment.app).unwrap();
    assert!(is_granted(app.acquire("legacy/1", "a", TTL)));
}

/// I15 and the identity rule: the caller is the login role (session_user)
/// with every role it is a member of. A login role that is a member of the
/// bound role may act; `SET ROLE` to a less privileged role does not drop
/// that, and cannot gain anything either.
#[test]
fn membership_counts_and_set_role_does_not_change_who_acts() {
    let deployment = Deployment::new();
    bind(&deployment, "billing/", &deployment.app);
    let member = format!("{}_member", deployment.db.name);
    deployment.admin_exec(&format!(
        "CREATE ROLE {member} LOGIN; GRANT {} TO {member}; GRANT {} TO {}",
        deployment.app, deployment.attacker, deployment.app
    ));
    let mut as_member = deployment.conn_as(&member);
    assert!(is_granted(as_member.acquire("billing/m", "m", TTL)));

    // The app session SETs ROLE to the attacker role (it is a member of it):
    // still the app's login role acts.
    let mut app = deployment.conn_as(&deployment.app);
    app.batch_execute(&format!("SET ROLE {}", deployment.attacker))
        .unwrap();
    assert_eq!(
        query_lines(&mut app, "SELECT current_user::text AS line"),
        [deployment.attacker.as_str()]
    );
    assert!(is_granted(app.acquire("billing/a", "a", TTL)));

    // The attacker cannot become the app: SET ROLE is refused, and SET
    // SESSION AUTHORIZATION needs a superuser.
    let mut attacker = deployment.conn_as(&deployment.attacker);
    for sql in [
        format!("SET ROLE {}", deployment.app),
        format!("SET SESSION AUTHORIZATION {}", deployment.app),
    ] {
        assert!(attacker.batch_execute(&sql).is_err(), "{sql}");
    }
    assert_lease_forbidden(
        attacker.acquire("billing/a", "x", TTL),
        Operation::ACQUIRE,
        "billing/a",
        &deployment.attacker,
    );
    drop(as_member);
    drop(app);
    deployment.admin_exec(&format!("DROP OWNED BY {member}; DROP ROLE {member}"));
}

/// Without rules, every role may act on every key, as before namespaces.
#[test]
fn without_rules_every_role_acts_on_every_key_as_before() {
    let deployment = Deployment::new();
    let mut app = deployment.conn_as(&deployment.app);
    let mut attacker = deployment.conn_as(&deployment.attacker);
    let lease = granted(app.acquire("billing/k", "app-1", TTL).unwrap());
    app.admit("billing/res", &lease, Check::Token).unwrap();
    assert!(matches!(
        attacker.inspect("billing/k").unwrap(),
        Some(LeaseState::Held { .. })
    ));
    assert_eq!(
        attacker
            .inspect_guard("billing/res")
            .unwrap()
            .map(|r| r.accepted_epoch),
        Some(leasehold::Epoch::new(1))
    );
    assert!(matches!(
        attacker
            .renew(
                &leasehold_test_support::grant("billing/k", "app-1", lease.epoch()),
                TTL
            )
            .unwrap(),
        Renewal::Renewed { .. }
    ));
    attacker.check_held(&lease).unwrap();
    assert_eq!(
        attacker
            .release(&leasehold_test_support::grant(
                "billing/k",
                "app-1",
                lease.epoch()
            ))
            .unwrap(),
        Release::Released
    );
    assert!(is_granted(attacker.acquire("billing/k", "x", TTL)));
}

// ---------------------------------------------------------------------------
// force_release
// ---------------------------------------------------------------------------

/// A forced release ends the grant as a release would: the counter moves
/// on, the holder hears `not_owner` (the key is FREE, §1.3 rule 1), and its
/// epoch is stale at a guard.
#[test]
fn force_release_frees_a_held_key_and_fences_its_holder() {
    let deployment = Deployment::new();
    grant_namespace_and_release_actions(&deployment, &deployment.operator);
    let mut app = deployment.conn_as(&deployment.app);
    let mut operator = deployment.conn_as(&deployment.operator);
    let lease = granted(app.acquire("job", "app-1", TTL).unwrap());
    app.admit("out", &lease, Check::Token).unwrap();

    assert_eq!(
        operator.force_release("job").unwrap(),
        Some(leasehold::Epoch::new(2))
    );
    assert_eq!(
        app.inspect("job").unwrap(),
        Some(LeaseState::Free {
            epoch: 2.into(),
            force_released: true
        })
    );
    assert_eq!(
        app.renew(&leasehold_test_support::grant("job", "app-1", 1), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::ForceReleased)
    );
    assert_eq!(
        app.release(&leasehold_test_support::grant("job", "app-1", 1))
            .unwrap(),
        Release::Refused(Refusal::ForceReleased)
    );
    assert!(matches!(
        app.admit("out", &lease, Check::LeaseHeld),
        Err(e) if e.kind() == ErrorKind::Fenced
            && e.table().is_none()
            && e.owner().is_some()
            && e.refusal() == Some(Refusal::ForceReleased)
    ));
    // The next holder's epoch is above the counter; once it writes, the old
    // epoch is refused by a token-checked guard too.
    let mut worker = deployment.conn_as(&deployment.worker);
    let next = granted(worker.acquire("job", "worker-1", TTL).unwrap());
    assert_eq!(next.epoch(), 3);
    worker.admit("out", &next, Check::Token).unwrap();
    assert!(matches!(
        app.admit("out", &lease, Check::Token),
        Err(e) if e.kind() == ErrorKind::Fenced
            && e.refusal() == Some(Refusal::StaleEpoch { accepted: leasehold::Epoch(3) })
            && e.epoch() == Some(leasehold::Epoch(1))
    ));
    // After the forced release, nobody hears `lapsed` for the old grant.
    assert_eq!(
        app.renew(&leasehold_test_support::grant("job", "app-1", 1), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::Superseded { by: 3.into() })
    );
}

#[test]
fn force_release_of_lapsed_free_and_unknown_keys() {
    let deployment = Deployment::new();
    let mut owner = deployment.conn_as(&deployment.owner);
    let mut app = deployment.conn_as(&deployment.app);
    let mut admin = deployment.admin();

    // Lapsed: the grant still counts, so it is ended and its epoch passed.
    let short = granted(
        app.acquire("lapsed", "a", Duration::from_millis(200))
            .unwrap(),
    );
    wait_until_server_time_passes(&mut admin, short.expires_at());
    assert_eq!(
        owner.force_release("lapsed").unwrap(),
        Some(leasehold::Epoch::new(2))
    );
    assert_eq!(raw_row(&mut admin, "lapsed").unwrap(), "|2|f|");
    assert_eq!(
        app.renew(&leasehold_test_support::grant("lapsed", "a", 1), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::ForceReleased)
    );

    // Free: nothing to end; the counter is reported unchanged.
    let done = granted(app.acquire("free", "a", TTL).unwrap());
    assert_eq!(
        app.release(&leasehold_test_support::grant("free", "a", done.epoch()))
            .unwrap(),
        Release::Released
    );
    let before = raw_row(&mut admin, "free");
    assert_eq!(
        owner.force_release("free").unwrap(),
        Some(leasehold::Epoch::new(2))
    );
    assert_eq!(raw_row(&mut admin, "free"), before);

    // Never leased: no counter, and no row is created.
    assert_eq!(owner.force_release("unknown").unwrap(), None);
    assert_eq!(raw_row(&mut admin, "unknown"), None);

    // Invalid input is refused, naming the violation.
    assert!(matches!(
        owner.force_release(""),
        Err(e) if e.kind() == ErrorKind::InvalidInput && e.violations() == ["key must not be empty"]
    ));
    assert_eq!(
        sqlstate_of(&mut owner, "SELECT lease.force_release(NULL)"),
        "22023"
    );
}

/// The operator acts on every name: namespace rules do not limit it (only
/// the GRANT does), so it can free a key bound to a role it is not in.
#[test]
fn force_release_acts_on_keys_of_any_namespace() {
    let deployment = Deployment::new();
    grant_namespace_and_release_actions(&deployment, &deployment.operator);
    bind(&deployment, "billing/", &deployment.app);
    let mut app = deployment.conn_as(&deployment.app);
    granted(app.acquire("billing/k", "app-1", TTL).unwrap());
    let mut operator = deployment.conn_as(&deployment.operator);
    assert_eq!(
        operator.force_release("billing/k").unwrap(),
        Some(leasehold::Epoch::new(2))
    );
    assert_eq!(
        app.inspect("billing/k").unwrap(),
        Some(LeaseState::Free {
            epoch: 2.into(),
            force_released: true
        })
    );
}

/// A forced release locks like a release: a holder's open lease-checked
/// transaction (FOR KEY SHARE) does not hold it up. (If it did, the
/// operator's lock_timeout would fail the call.)
#[test]
fn force_release_does_not_wait_for_a_holders_open_lease_checked_transaction() {
    let deployment = Deployment::new();
    let mut app = deployment.conn_as(&deployment.app);
    let lease = granted(app.acquire("job", "app-1", TTL).unwrap());
    app.batch_execute("BEGIN").unwrap();
    app.check_held(&lease).unwrap();
    let mut owner = deployment.conn_as(&deployment.owner);
    owner.batch_execute("SET lock_timeout = '10s'").unwrap();
    assert_eq!(
        owner.force_release("job").unwrap(),
        Some(leasehold::Epoch::new(2))
    );
    app.batch_execute("COMMIT").unwrap();
    assert_eq!(
        app.inspect("job").unwrap(),
        Some(LeaseState::Free {
            epoch: 2.into(),
            force_released: true
        })
    );
}

/// A forced release wakes waiters like a release: the waiter below can be
/// woken only by the notification (no re-check, no polling, holder's ttl a
/// minute), so a missing notification is a timeout.
#[test]
fn force_release_wakes_a_waiter_like_a_release() {
    let deployment = Deployment::new();
    let mut app = deployment.conn_as(&deployment.app);
    let holder = granted(
        app.acquire("job", "holder", Duration::from_secs(60))
            .unwrap(),
    );
    let url = deployment.url_as(&deployment.worker);
    let client = LeaseClient::connect(&url, 2).unwrap();
    let never = Duration::from_secs(60);
    let waiter = LeaseWaiter::builder(&client)
        .recheck_every(never)
        .fallback_poll(never)
        .build();
    assert!(waiter.wait_until_listening(Duration::from_secs(10)));
    let waiting = {
        let waiter = waiter.clone();
        std::thread::spawn(move || waiter.acquire("job", "waiter", TTL, Duration::from_secs(20)))
    };
    let until = Instant::now() + Duration::from_secs(10);
    while waiter.armed_waiters("job") != 1 {
        assert!(Instant::now() < until, "the waiter never armed");
        std::thread::sleep(Duration::from_millis(2));
    }
    let forced_at = Instant::now();
    let counter = deployment
        .conn_as(&deployment.owner)
        .force_release("job")
        .unwrap();
    assert_eq!(
        counter,
        Some(leasehold::Epoch::new(holder.epoch().get() + 1))
    );
    let lease = waiting.join().unwrap().unwrap();
    assert!(forced_at.elapsed() < Duration::from_secs(15));
    assert_eq!(lease.epoch(), holder.epoch().get() + 2);
}

// ---------------------------------------------------------------------------
// key.force_release(epoch): exactly one grant
// ---------------------------------------------------------------------------

fn grant_epoch_exact_release(deployment: &Deployment, to: &str) {
    deployment
        .conn_as(&deployment.owner)
        .batch_execute(&format!(
            "GRANT EXECUTE ON FUNCTION lease.force_release(text, bigint) TO {to}"
        ))
        .unwrap();
}

/// The CONSTRAINT field of the error `sql` raises ('' when none).
fn constraint_of(conn: &mut PgConnection, sql: &str) -> String {
    conn.batch_execute(
        "CREATE OR REPLACE FUNCTION pg_temp.constraint_of(statement text) RETURNS text
         LANGUAGE plpgsql AS $f$
         DECLARE c text;
         BEGIN
             EXECUTE statement;
             RETURN '';
         EXCEPTION WHEN OTHERS THEN
             GET STACKED DIAGNOSTICS c = CONSTRAINT_NAME;
             RETURN c;
         END $f$;",
    )
    .unwrap();
    query_lines(
        conn,
        &format!("SELECT pg_temp.constraint_of({}) AS line", quote(sql)),
    )
    .remove(0)
}

/// The epoch-exact forced release ends the grant it names, held or lapsed,
/// as a release would (counter + 1, holder hears `not_owner`), and answers
/// without writing for a grant that ended already, a newer grant (which it
/// leaves alone), and an epoch or key never granted.
#[test]
fn force_release_epoch_ends_exactly_that_grant_and_never_a_newer_one() {
    let deployment = Deployment::new();
    grant_epoch_exact_release(&deployment, &deployment.operator);
    let mut app = deployment.conn_as(&deployment.app);
    let mut operator = deployment.conn_as(&deployment.operator);
    let mut admin = deployment.admin();

    let first = granted(app.acquire("job", "app-1", TTL).unwrap());
    assert_eq!(
        operator.force_release_epoch("job", first.epoch()).unwrap(),
        ForcedRelease::Released { counter: 2.into() }
    );
    assert_eq!(raw_row(&mut admin, "job").unwrap(), "|2|f|");
    assert_eq!(
        app.renew(&leasehold_test_support::grant("job", "app-1", 1), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::ForceReleased)
    );
    // Twice: the grant is over, nothing more happens.
    assert_eq!(
        operator
            .force_release_epoch("job", leasehold::Epoch::from(1))
            .unwrap(),
        ForcedRelease::AlreadyFree { counter: 2.into() }
    );
    // At the counter of a FREE key: already free too; above it: a grant
    // the key never had.
    assert_eq!(
        operator
            .force_release_epoch("job", leasehold::Epoch::from(2))
            .unwrap(),
        ForcedRelease::AlreadyFree { counter: 2.into() }
    );
    assert_eq!(
        operator
            .force_release_epoch("job", leasehold::Epoch::from(3))
            .unwrap(),
        ForcedRelease::NoSuchGrant {
            counter: Some(2.into())
        }
    );
    assert_eq!(raw_row(&mut admin, "job").unwrap(), "|2|f|");

    // A newer grant is never ended by an older epoch, nor by one it was
    // never granted.
    let mut worker = deployment.conn_as(&deployment.worker);
    let next = granted(worker.acquire("job", "worker-1", TTL).unwrap());
    assert_eq!(next.epoch(), 3);
    let before = whole_state(&deployment);
    for stale in [1, 2] {
        assert_eq!(
            operator
                .force_release_epoch("job", leasehold::Epoch::from(stale))
                .unwrap(),
            ForcedRelease::NewerGrant {
                current_epoch: 3.into()
            }
        );
    }
    assert_eq!(
        operator
            .force_release_epoch("job", leasehold::Epoch::from(4))
            .unwrap(),
        ForcedRelease::NoSuchGrant {
            counter: Some(3.into())
        }
    );
    assert_eq!(
        operator
            .force_release_epoch("never-leased", leasehold::Epoch::from(1))
            .unwrap(),
        ForcedRelease::NoSuchGrant { counter: None }
    );
    assert_eq!(whole_state(&deployment), before);

    // A lapsed grant at exactly that epoch is ended too.
    let short = granted(
        app.acquire("short", "a", Duration::from_millis(200))
            .unwrap(),
    );
    wait_until_server_time_passes(&mut admin, short.expires_at());
    assert_eq!(
        operator
            .force_release_epoch("short", short.epoch())
            .unwrap(),
        ForcedRelease::Released { counter: 2.into() }
    );
    assert_eq!(raw_row(&mut admin, "short").unwrap(), "|2|f|");
}

/// Granted to nobody (42501 for every role but the owner until granted),
/// and bad input is SQLSTATE 22023 `lease_invalid_input`; neither changes
/// anything.
#[test]
fn force_release_epoch_is_granted_to_nobody_and_refuses_bad_input() {
    let deployment = Deployment::new();
    let mut app = deployment.conn_as(&deployment.app);
    granted(app.acquire("job", "app-1", TTL).unwrap());
    let before = whole_state(&deployment);
    for role in [
        &deployment.app,
        &deployment.worker,
        &deployment.attacker,
        &deployment.operator,
    ] {
        let mut conn = deployment.conn_as(role);
        assert_eq!(
            sqlstate_of(&mut conn, "SELECT * FROM lease.force_release('job', 1)"),
            "42501",
            "{role}"
        );
        assert!(matches!(
            conn.force_release_epoch("job", leasehold::Epoch::from(1)),
            Err(e) if database_error(&e).is_some()
                && e.operation() == Some(Operation::FORCE_RELEASE)
        ));
    }
    let mut owner = deployment.conn_as(&deployment.owner);
    for sql in [
        "SELECT * FROM lease.force_release('job', 0)",
        "SELECT * FROM lease.force_release('job', -1)",
        "SELECT * FROM lease.force_release('job', NULL)",
        "SELECT * FROM lease.force_release('', 1)",
        "SELECT * FROM lease.force_release(NULL::text, 1)",
    ] {
        assert_eq!(sqlstate_of(&mut owner, sql), "22023", "{sql}");
        assert_eq!(
            constraint_of(&mut owner, sql),
            "lease_invalid_input",
            "{sql}"
        );
    }
    assert!(matches!(
        owner.force_release_epoch("job", leasehold::Epoch::from(0)),
        Err(e) if e.kind() == ErrorKind::InvalidInput && e.violations() == ["epoch must be at least 1"]
    ));
    assert!(matches!(
        owner.force_release_epoch("", leasehold::Epoch::from(1)),
        Err(e) if e.kind() == ErrorKind::InvalidInput && e.violations() == ["key must not be empty"]
    ));
    assert_eq!(whole_state(&deployment), before);
}

/// The epoch-exact forced release wakes waiters like a release: as in
/// `force_release_wakes_a_waiter_like_a_release`, only the notification
/// can wake this waiter before its 20 s bound.
#[test]
fn force_release_epoch_wakes_a_waiter_like_a_release() {
    let deployment = Deployment::new();
    let mut app = deployment.conn_as(&deployment.app);
    let holder = granted(
        app.acquire("job", "holder", Duration::from_secs(60))
            .unwrap(),
    );
    let url = deployment.url_as(&deployment.worker);
    let client = LeaseClient::connect(&url, 2).unwrap();
    let never = Duration::from_secs(60);
    let waiter = LeaseWaiter::builder(&client)
        .recheck_every(never)
        .fallback_poll(never)
        .build();
    assert!(waiter.wait_until_listening(Duration::from_secs(10)));
    let waiting = {
        let waiter = waiter.clone();
        std::thread::spawn(move || waiter.acquire("job", "waiter", TTL, Duration::from_secs(20)))
    };
    let until = Instant::now() + Duration::from_secs(10);
    while waiter.armed_waiters("job") != 1 {
        assert!(Instant::now() < until, "the waiter never armed");
        std::thread::sleep(Duration::from_millis(2));
    }
    let forced_at = Instant::now();
    let outcome = deployment
        .conn_as(&deployment.owner)
        .force_release_epoch("job", holder.epoch())
        .unwrap();
    assert_eq!(
        outcome,
        ForcedRelease::Released {
            counter: leasehold::Epoch::new(holder.epoch().get() + 1)
        }
    );
    let lease = waiting.join().unwrap().unwrap();
    assert!(forced_at.elapsed() < Duration::from_secs(15));
    assert_eq!(lease.epoch(), holder.epoch().get() + 2);
}

/// I15 for the waiting protocol: registering interest in a key of another
/// role's namespace is refused too (a registration earns the key's release
/// notifications), whether the key exists or not, and changes nothing.
#[test]
fn the_waiter_registration_refuses_keys_of_another_roles_namespace() {
    let deployment = Deployment::new();
    bind(&deployment, "billing/", &deployment.app);
    let mut app = deployment.conn_as(&deployment.app);
    granted(app.acquire("billing/k", "app-1", TTL).unwrap());
    let before = whole_state(&deployment);
    for role in [&deployment.worker, &deployment.attacker] {
        let mut conn = deployment.conn_as(role);
        for key in ["billing/k", "billing/none"] {
            assert_eq!(
                sqlstate_of(&mut conn, &format!("SELECT lease._waiter_watch('{key}')")),
                "42501",
                "{role} registered for {key}"
            );
        }
    }
    assert_eq!(whole_state(&deployment), before);
}

/// §4.1, scenario 6: `raise_generation` refuses a generation at or below
/// the current one (naming it) and one above 2^23 - 1, changing nothing; a
/// higher one, up to 2^23 - 1 itself, moves every next grant to at least
/// (g << 40) + 1, and a live grant keeps its epoch. Two raises to the same
/// value are serialised: the second waits for the first and is then
/// refused as not above it. A role without the grant is refused by
/// PostgreSQL.
#[test]
fn raise_generation_only_raises_and_moves_every_next_grant_above_its_floor() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let held = granted(conn.acquire("held", "a", TTL).unwrap());
    let lineage = |conn: &mut PgConnection| {
        query_lines(
            conn,
            "SELECT format('%s|%s|%s|%s', system_identifier, base, last_timeline, external_floor) AS line \
             FROM lease.lineage",
        )
    };
    let before = lineage(&mut conn);
    for refused in [0, -1] {
        match conn.raise_generation(refused) {
            Err(e) if e.kind() == ErrorKind::InvalidInput && e.current_generation().is_some() => {
                assert_eq!(e.current_generation(), Some(0));
                let message = e.to_string();
                assert!(
                    message.starts_with(&format!("generation {refused} is not above")),
                    "{message}"
                );
            }
            other => panic!("raise to {refused} must be refused: {other:?}"),
        }
    }
    match conn.raise_generation(MAX_GENERATION + 1) {
        Err(e)
            if e.kind() == ErrorKind::InvalidInput
                && e.current_generation().is_none()
                && e.to_string().contains("is above the highest generation") =>
        {
            let message = e.to_string();
            assert!(
                message.starts_with(&format!("generation {} is above", MAX_GENERATION + 1)),
                "{message}"
            )
        }
        other => panic!("raise above the maximum must be refused: {other:?}"),
    }
    // The server refuses bad input too, when the client's check is
    // bypassed, naming what is wrong.
    for (sql, violation) in [
        (
            format!("SELECT lease.raise_generation({})", MAX_GENERATION + 1),
            "generation must be at most 8388607",
        ),
        (
            "SELECT lease.raise_generation(NULL)".to_string(),
            "generation must not be NULL",
        ),
    ] {
        let error = conn.batch_execute(&sql).expect_err("the server refuses it");
        assert!(error.to_string().ends_with(violation), "{sql}: {error}");
    }
    assert_eq!(
        lineage(&mut conn),
        before,
        "a refused raise changed nothing"
    );
    assert_eq!(
        granted(conn.acquire("before", "b", TTL).unwrap()).epoch(),
        1
    );

    assert_eq!(conn.raise_generation(5).expect("raise to 5"), 5);
    let now = conn.generation().expect("generation");
    assert_eq!(now.generation, 5);
    let floor = (5 << 40) + 1;
    assert_eq!(now.floor_epoch(), floor);
    // The live grant keeps its epoch; every next grant is above the floor.
    assert!(matches!(
        conn.inspect("held").unwrap(),
        Some(LeaseState::Held { epoch, .. }) if epoch == held.epoch()
    ));
    assert_eq!(conn.release(&held).unwrap(), Release::Released);
    assert_eq!(
        granted(conn.acquire("held", "c", TTL).unwrap()).epoch(),
        floor
    );
    assert_eq!(
        granted(conn.acquire("never-seen", "d", TTL).unwrap()).epoch(),
        floor
    );
    match conn.raise_generation(5) {
        Err(e) if e.kind() == ErrorKind::InvalidInput && e.current_generation().is_some() => {
            assert_eq!(e.current_generation(), Some(5))
        }
        other => panic!("raise to the current generation must be refused: {other:?}"),
    }

    // Two raises to 7: the second waits for the first, then is refused.
    conn.batch_execute("BEGIN").unwrap();
    assert_eq!(conn.raise_generation(7).unwrap(), 7);
    let mut second = db.conn();
    let racer = std::thread::spawn(move || second.raise_generation(7));
    wait_for_lock_waiter(&mut db.conn(), &db.name);
    conn.batch_execute("COMMIT").unwrap();
    match racer.join().unwrap() {
        Err(e) if e.kind() == ErrorKind::InvalidInput && e.current_generation().is_some() => {
            assert_eq!(e.current_generation(), Some(7));
            let message = e.to_string();
            assert!(
                message.starts_with("generation 7 is not above"),
                "{message}"
            );
        }
        other => panic!("the second raise to 7 must be refused: {other:?}"),
    }

    // The highest generation is accepted, and grants stay within bigint.
    assert_eq!(
        conn.raise_generation(MAX_GENERATION).unwrap(),
        MAX_GENERATION
    );
    assert_eq!(
        granted(conn.acquire("at-the-top", "e", TTL).unwrap()).epoch(),
        (MAX_GENERATION << 40) + 1
    );

    let role = app_role(&db, "raiser");
    let mut app = db.conn_as(&role);
    assert!(matches!(
        app.raise_generation(9),
        Err(e) if database_error(&e).is_some()
    ));
    assert_eq!(
        app.generation().expect("any role may read it").generation,
        MAX_GENERATION
    );
    drop(app);
    drop_role(&db, &role);
}

/// Code any table owner wrote, evaluated by autovacuum (an index
/// expression, run as the table's owner while the session's login role is
/// the bootstrap superuser), acts on no governed key and lists none: the
/// superuser's namespace rights are not lent to it.
#[test]
fn autovacuum_lends_no_namespace_rights_to_a_table_owners_code() {
    let server = leasehold_local::LocalPostgres::builder()
        .setting("autovacuum_naptime", "1")
        .start()
        .expect("start a server whose autovacuum wakes every second");
    let mut admin = PgConnection::establish(&server.url()).unwrap();
    leasehold::install(&mut admin).unwrap();
    let victim = granted(admin.acquire("secret/job", "victim", TTL).unwrap());
    admin
        .batch_execute(
            "CREATE ROLE team; CREATE ROLE mallory;
             CREATE SCHEMA m AUTHORIZATION mallory;
             SELECT lease.bind_namespace('secret/', 'team');
             SET ROLE mallory;
             CREATE TABLE m.loot (what text);
             CREATE TABLE m.setup AS SELECT pg_backend_pid() AS pid;
             -- Strikes once, in any backend but this one.
             CREATE FUNCTION m.work() RETURNS void LANGUAGE plpgsql AS $$ BEGIN
               IF EXISTS (SELECT 1 FROM m.loot) OR pg_backend_pid() = (SELECT pid FROM m.setup) THEN
                 RETURN;
               END IF;
               BEGIN
                 INSERT INTO m.loot SELECT 'state ' || k::text FROM lease.key_state('secret/job') AS k;
               EXCEPTION WHEN OTHERS THEN INSERT INTO m.loot VALUES ('key_state refused: ' || SQLERRM); END;
               BEGIN
                 INSERT INTO m.loot SELECT 'listed ' || l.key FROM lease.list_leases('', NULL, '{}', 'key', 10) AS l WHERE l.key IS NOT NULL;
               EXCEPTION WHEN OTHERS THEN INSERT INTO m.loot VALUES ('list refused: ' || SQLERRM); END;
             END $$;
             CREATE FUNCTION m.trip(int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$ BEGIN PERFORM m.work(); RETURN $1; END $$;
             CREATE TABLE m.bait (i int) WITH (autovacuum_analyze_threshold = 1, autovacuum_analyze_scale_factor = 0);
             CREATE INDEX ON m.bait (m.trip(i));
             INSERT INTO m.bait SELECT generate_series(1, 100);
             RESET ROLE;",
        )
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let loot = loop {
        let loot = query_lines(&mut admin, "SELECT what AS line FROM m.loot ORDER BY what");
        if loot.len() >= 2 {
            break loot;
        }
        assert!(
            Instant::now() < deadline,
            "autovacuum never analyzed m.bait: {loot:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        loot[0].starts_with("key_state refused: permission denied for lease.key_state")
            && loot[1].starts_with("list refused: permission denied for lease.list_leases"),
        "{loot:?}"
    );
    assert_eq!(
        admin.inspect("secret/job").unwrap(),
        Some(LeaseState::Held {
            owner: "victim".into(),
            epoch: victim.epoch(),
            expires_at: victim.expires_at(),
        })
    );
}
