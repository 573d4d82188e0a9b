//! Heartbeat groups (docs/SPECIFICATION.md §1.9): `lease.join_group` and
//! `lease.renew_group`, their Rust calls, and what every other call sees of
//! a grant whose group keeps it alive.
//!
//! A member's own expiry and its group's are moved into the past with raw
//! SQL (superuser), so "its own expiry passed while the group lives" and
//! "the group lapsed" are states written, not waited for.

use std::sync::mpsc;
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use leasehold::{
    admin::PruneOptions,
    batch::{GroupId, GroupJoin, GroupRenewal},
    error::Operation,
    hold::{KeeperSet, KeeperSetEvent},
    Acquisition, ErrorKind, Lease, LeaseState, Leases, Refusal, Renewal,
};
use leasehold_test_support::Deployment;

use crate::common::*;
use crate::holders::client;
use leasehold::admin::Operator;
use leasehold::guard::Fencing;

const OWNER: &str = "worker";

/// Grants `keys` to [`OWNER`] and joins them to one group.
fn joined(conn: &mut PgConnection, keys: &[&str]) -> (Vec<Lease>, GroupId) {
    let leases: Vec<Lease> = keys
        .iter()
        .map(|key| granted(conn.acquire(key, OWNER, TTL).unwrap()))
        .collect();
    let grants: Vec<(&str, leasehold::Epoch)> =
        leases.iter().map(|l| (l.key(), l.epoch())).collect();
    let join = conn
        .join_group(&leasehold_test_support::grants(OWNER, &grants), TTL)
        .unwrap();
    assert_eq!(join.renewed(), keys.len(), "{join:?}");
    (leases, join.group.expect("a group for the renewed keys"))
}

/// Moves the members' own expiry an hour into the past: only the group
/// keeps them alive now.
fn expire_own(conn: &mut PgConnection, keys: &[&str]) {
    for key in keys {
        conn.batch_execute(&format!(
            "UPDATE lease.leases SET expires_at = clock_timestamp() - interval '1 hour' WHERE key = {}",
            quote(key)
        ))
        .unwrap();
    }
}

/// Moves the group's expiry `ago` into the past: it lapsed.
fn lapse_group(conn: &mut PgConnection, group: GroupId, ago: &str) {
    conn.batch_execute(&format!(
        "UPDATE lease.groups SET expires_at = clock_timestamp() - interval '{ago}' WHERE id = {}",
        group.get()
    ))
    .unwrap();
}

fn members_now(conn: &mut PgConnection, group: GroupId) -> usize {
    match conn.renew_group(group, OWNER, TTL).unwrap() {
        GroupRenewal::Renewed { members, .. } => members,
        other => panic!("expected the group renewed, got {other:?}"),
    }
}

fn group_expiry_in_sql(conn: &mut PgConnection, group: GroupId) -> String {
    query_lines(
        conn,
        &format!(
            "SELECT expires_at::text AS line FROM lease.groups WHERE id = {}",
            group.get()
        ),
    )
    .remove(0)
}

#[test]
fn a_member_stays_held_by_its_groups_heartbeat_after_its_own_expiry_passed() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let (leases, group) = joined(&mut conn, &["g/a", "g/b"]);
    expire_own(&mut conn, &["g/a", "g/b"]);

    let GroupRenewal::Renewed {
        expires_at,
        members,
    } = conn.renew_group(group, OWNER, TTL).unwrap()
    else {
        panic!("a live group is renewed");
    };
    assert_eq!(members, 2);
    // Every check of the key sees the group's expiry.
    assert_eq!(
        conn.inspect("g/a").unwrap(),
        Some(LeaseState::Held {
            owner: OWNER.into(),
            epoch: leases[0].epoch(),
            expires_at,
        })
    );
    assert_eq!(
        conn.acquire("g/a", "rival", TTL).unwrap(),
        Acquisition::Denied
    );
    assert_eq!(conn.check_held(&leases[1].token()).unwrap(), expires_at);
    // The same owner acquiring again is the idempotent success, same epoch.
    let again = granted(conn.acquire("g/b", OWNER, TTL).unwrap());
    assert_eq!(again.epoch(), leases[1].epoch());
    // A single renew still works on a member, and a release ends it.
    assert!(matches!(
        conn.renew(
            &leasehold_test_support::grant("g/a", OWNER, leases[0].epoch()),
            TTL
        )
        .unwrap(),
        Renewal::Renewed { .. }
    ));
    assert_eq!(
        conn.release(&leasehold_test_support::grant(
            "g/b",
            OWNER,
            leases[1].epoch()
        ))
        .unwrap(),
        leasehold::Release::Released
    );
    assert_eq!(members_now(&mut conn, group), 1);
}

#[test]
fn a_lapsed_group_frees_its_members_and_is_never_renewed_again() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let (leases, group) = joined(&mut conn, &["h/a", "h/b"]);
    expire_own(&mut conn, &["h/a", "h/b"]);
    lapse_group(&mut conn, group, "1 second");

    assert_eq!(
        conn.renew_group(group, OWNER, TTL).unwrap(),
        GroupRenewal::Refused(Refusal::Lapsed {
            taken_over_by: None
        })
    );
    assert_eq!(
        conn.renew(
            &leasehold_test_support::grant("h/a", OWNER, leases[0].epoch()),
            TTL
        )
        .unwrap(),
        Renewal::Refused(Refusal::Lapsed {
            taken_over_by: None
        })
    );
    let taken = granted(conn.acquire("h/a", "rival", TTL).unwrap());
    assert!(taken.epoch() > leases[0].epoch());
    // The takeover counted the key out of the group, and the lapsed group
    // stays lapsed.
    assert_eq!(
        query_lines(
            &mut conn,
            &format!(
                "SELECT members::text AS line FROM lease.groups WHERE id = {}",
                group.get()
            )
        ),
        vec!["1"]
    );
    assert_eq!(
        conn.renew_group(group, OWNER, TTL).unwrap(),
        GroupRenewal::Refused(Refusal::Lapsed {
            taken_over_by: None
        })
    );
    // The taker's grant is its own, outside the group.
    lapse_group(&mut conn, group, "1 second");
    assert!(matches!(
        conn.renew(
            &leasehold_test_support::grant("h/a", "rival", taken.epoch()),
            TTL
        )
        .unwrap(),
        Renewal::Renewed { .. }
    ));
}

/// A release, a force-release, a batch release and a join elsewhere each
/// count a member out of its group; a grouped release adds one to the
/// key's counter as any release does (docs/SPECIFICATION.md §1.2).
#[test]
fn every_way_out_of_a_group_is_counted() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let keys = ["c/1", "c/2", "c/3", "c/4", "c/5"];
    let (leases, group) = joined(&mut conn, &keys);
    assert_eq!(members_now(&mut conn, group), 5);

    assert_eq!(
        conn.release(&leasehold_test_support::grant(
            "c/1",
            OWNER,
            leases[0].epoch()
        ))
        .unwrap(),
        leasehold::Release::Released
    );
    assert_eq!(members_now(&mut conn, group), 4);
    assert!(conn.force_release("c/2").unwrap().is_some());
    assert_eq!(members_now(&mut conn, group), 3);
    let answers = conn
        .release_many(&leasehold_test_support::grants(
            OWNER,
            &[("c/3", leases[2].epoch())],
        ))
        .unwrap();
    assert_eq!(answers[0].release, leasehold::Release::Released);
    assert_eq!(members_now(&mut conn, group), 2);
    // Joining a member to a new group moves it.
    let moved = conn
        .join_group(
            &leasehold_test_support::grants(OWNER, &[("c/4", leases[3].epoch())]),
            TTL,
        )
        .unwrap();
    let new_group = moved.group.unwrap();
    assert_ne!(new_group, group);
    assert_eq!(members_now(&mut conn, group), 1);
    assert_eq!(members_now(&mut conn, new_group), 1);
    // A released key comes back outside any group; its release added one
    // to the counter as every release does, so the new grant is two above.
    let back = granted(conn.acquire("c/1", OWNER, TTL).unwrap());
    assert_eq!(back.epoch().get(), leases[0].epoch().get() + 2);
    expire_own(&mut conn, &["c/1"]);
    assert_eq!(
        conn.renew(
            &leasehold_test_support::grant("c/1", OWNER, back.epoch()),
            TTL
        )
        .unwrap(),
        Renewal::Refused(Refusal::Lapsed {
            taken_over_by: None
        })
    );
}

#[test]
fn join_group_answers_each_key_as_renew_many_would_and_groups_only_the_renewed() {
    let (group_db, many_db) = (TestDb::new(), TestDb::new());
    let (mut grouped, mut many) = (group_db.conn(), many_db.conn());
    for conn in [&mut grouped, &mut many] {
        granted(conn.acquire("j/held", OWNER, TTL).unwrap());
        granted(conn.acquire("j/other", "rival", TTL).unwrap());
    }
    let grants = [
        ("j/other", 1),
        ("j/held", 1),
        ("j/never", 1),
        ("j/held-wrong", 1),
    ];
    let joined: GroupJoin = grouped
        .join_group(&leasehold_test_support::grants(OWNER, &grants[..2]), TTL)
        .unwrap();
    let renewed = many
        .renew_many(&leasehold_test_support::grants(OWNER, &grants[..2]), TTL)
        .unwrap();
    assert_eq!(joined.keys.len(), renewed.len());
    for (group_answer, many_answer) in joined.keys.iter().zip(&renewed) {
        assert_eq!(group_answer.key, many_answer.key);
        assert_eq!(
            std::mem::discriminant(&group_answer.renewal),
            std::mem::discriminant(&many_answer.renewal)
        );
    }
    assert_eq!(joined.keys[0].renewal, Renewal::Refused(Refusal::NeverHeld));
    let group = joined.group.unwrap();
    assert_eq!(joined.renewed(), 1);
    assert_eq!(members_now(&mut grouped, group), 1);
    // No key renewed: no group.
    let none = grouped
        .join_group(&leasehold_test_support::grants(OWNER, &grants[2..]), TTL)
        .unwrap();
    assert_eq!(none.group, None);
    assert_eq!(
        query_lines(
            &mut grouped,
            "SELECT count(*)::text AS line FROM lease.groups"
        ),
        vec!["1"]
    );
}

#[test]
fn a_heartbeat_is_refused_to_another_owner_an_unknown_group_and_bad_input() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let (leases, group) = joined(&mut conn, &["r/a"]);
    let before = group_expiry_in_sql(&mut conn, group);
    assert_eq!(
        conn.renew_group(group, "rival", TTL).unwrap(),
        GroupRenewal::Refused(Refusal::NeverHeld)
    );
    assert_eq!(
        conn.renew_group(GroupId::from_raw(group.get() + 1000), OWNER, TTL)
            .unwrap(),
        GroupRenewal::Refused(Refusal::NeverHeld)
    );
    match conn.renew_group(group, OWNER, Duration::ZERO) {
        Err(error) if error.kind() == ErrorKind::InvalidInput && !error.violations().is_empty() => {
            let violations = error.violations();
            assert!(
                violations.iter().any(|v| v.contains("ttl")),
                "{violations:?}"
            )
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    assert_eq!(group_expiry_in_sql(&mut conn, group), before);
    assert_eq!(
        sqlstate_of(
            &mut conn,
            "SELECT * FROM lease.renew_group(NULL, 'worker', interval '1 minute')"
        ),
        "22023"
    );

    // A bad batch is refused by name, before anything changes.
    let snapshot = table_snapshot(&mut conn);
    let groups_before = query_lines(&mut conn, "SELECT count(*)::text AS line FROM lease.groups");
    let twice = [("r/a", leases[0].epoch()), ("r/a", leases[0].epoch())];
    match conn.join_group(&leasehold_test_support::grants(OWNER, &twice), TTL) {
        Err(error) if error.kind() == ErrorKind::InvalidInput && !error.violations().is_empty() => {
            assert_eq!(error.violations(), ["keys must not contain a key twice"])
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    assert_eq!(table_snapshot(&mut conn), snapshot);
    assert_eq!(
        query_lines(&mut conn, "SELECT count(*)::text AS line FROM lease.groups"),
        groups_before
    );
    let message = conn
        .batch_execute("SELECT * FROM lease.join_group(ARRAY['x','x'], 'worker', ARRAY[1,1]::bigint[], interval '1 minute')")
        .unwrap_err()
        .to_string();
    assert!(message.contains("lease.join_group"), "{message}");
}

/// The race the group row's lock closes: a heartbeat that has extended a
/// group but not committed, and a takeover that still sees the group
/// lapsed. The takeover must wait for the heartbeat and then find the key
/// held; without the lock it would grant a key whose holder is about to
/// hear "renewed".
#[test]
fn a_takeover_waits_for_a_heartbeat_in_flight_and_then_finds_the_key_held() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let (leases, group) = joined(&mut conn, &["race/a"]);
    expire_own(&mut conn, &["race/a"]);
    // Lapsing a little ahead: the heartbeat still sees it live when it
    // runs, every other session sees it lapsed once that moment passed.
    conn.batch_execute(&format!(
        "UPDATE lease.groups SET expires_at = clock_timestamp() + interval '500 milliseconds' WHERE id = {}",
        group.get()
    ))
    .unwrap();
    let mut heartbeat = db.conn();
    heartbeat.batch_execute("BEGIN").unwrap();
    assert!(matches!(
        heartbeat.renew_group(group, OWNER, TTL).unwrap(),
        GroupRenewal::Renewed { members: 1, .. }
    ));
    // The committed expiry passes (observed on the server's clock).
    let lapsed_sql = format!(
        "SELECT expires_at < clock_timestamp() AS flag FROM lease.groups WHERE id = {}",
        group.get()
    );
    while !query_bool(&mut conn, &lapsed_sql) {
        std::thread::sleep(Duration::from_millis(20));
    }

    let (sender, receiver) = mpsc::channel();
    let taker_conn = db.conn();
    let taker = std::thread::spawn(move || {
        let mut taker_conn = taker_conn;
        let answer = taker_conn.acquire("race/a", "rival", TTL);
        sender.send(()).unwrap();
        answer
    });
    wait_for_lock_waiter(&mut conn, &db.name);
    assert!(
        receiver.try_recv().is_err(),
        "the takeover must wait for the heartbeat"
    );
    heartbeat.batch_execute("COMMIT").unwrap();
    assert_eq!(taker.join().unwrap().unwrap(), Acquisition::Denied);
    assert!(matches!(
        conn.inspect("race/a").unwrap(),
        Some(LeaseState::Held { owner, epoch, .. }) if owner == OWNER && epoch == leases[0].epoch()
    ));
    assert_eq!(members_now(&mut conn, group), 1);
}

/// A release of a grant in a heartbeat group locks the grant's row before
/// it reads the group to leave (§1.5), so one that meets the row locked by
/// an operator's force-release in flight waits for it, then finds the key
/// FREE and answers not-owner: the counter moves on once and the group
/// counts the member out once. Read without the lock, the grant would be
/// taken as it was before the force-release, and the release would free
/// the row a second time: the counter moved twice, the member counted out
/// twice, and the holder told "released".
#[test]
fn a_grouped_release_that_waited_for_a_force_release_answers_from_the_newest_row() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let (leases, group) = joined(&mut conn, &["forced/a", "forced/b"]);
    let mut operator = db.conn();
    operator.batch_execute("BEGIN").unwrap();
    let counter = operator
        .force_release("forced/a")
        .unwrap()
        .expect("a grant to end");
    let grant = leasehold_test_support::grant("forced/a", OWNER, leases[0].epoch());
    let mut holder = db.conn();
    let release = std::thread::spawn(move || holder.release(&grant));
    wait_for_lock_waiter(&mut conn, &db.name);
    operator.batch_execute("COMMIT").unwrap();
    assert_eq!(
        release.join().unwrap().unwrap(),
        leasehold::Release::Refused(Refusal::ForceReleased)
    );
    assert_eq!(
        query_lines(
            &mut conn,
            "SELECT format('%s %s', epoch, COALESCE(owner, 'FREE')) AS line FROM lease.leases WHERE key = 'forced/a'"
        ),
        [format!("{counter} FREE")]
    );
    assert_eq!(members_now(&mut conn, group), 1);
}

/// A join takes members only from the groups its own keys were in: every
/// other group keeps its count, whether the join moves one key or several.
#[test]
fn a_join_leaves_the_count_of_every_group_its_keys_were_not_in() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let (_, first) = joined(&mut conn, &["n/1", "n/2"]);
    let (_, one) = joined(&mut conn, &["n/3"]);
    assert_eq!(members_now(&mut conn, first), 2);
    assert_eq!(members_now(&mut conn, one), 1);
    let (_, two) = joined(&mut conn, &["n/4", "n/5"]);
    assert_eq!(members_now(&mut conn, first), 2);
    assert_eq!(members_now(&mut conn, one), 1);
    assert_eq!(members_now(&mut conn, two), 2);
}

#[test]
fn pruning_keeps_members_of_a_live_group_and_removes_long_lapsed_groups() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let (_, live) = joined(&mut conn, &["p/live"]);
    let (_, dead) = joined(&mut conn, &["p/dead"]);
    expire_own(&mut conn, &["p/live", "p/dead"]);
    lapse_group(&mut conn, dead, "2 hours");

    let report = conn
        .prune(&PruneOptions::new(Duration::from_secs(60)))
        .unwrap();
    assert_eq!(report.keys_pruned, 1, "{report:?}");
    let left = query_lines(
        &mut conn,
        "SELECT key AS line FROM lease.leases ORDER BY key",
    );
    assert_eq!(left, vec!["p/live"]);
    let groups = query_lines(
        &mut conn,
        "SELECT id::text AS line FROM lease.groups ORDER BY id",
    );
    assert_eq!(groups, vec![live.get().to_string()]);
}

#[test]
fn a_heartbeat_with_a_member_in_another_roles_namespace_is_refused() {
    let deployment = Deployment::new();
    let mut worker = deployment.conn_as(&deployment.worker);
    let lease = granted(worker.acquire("ns/1", OWNER, TTL).unwrap());
    let join = worker
        .join_group(
            &leasehold_test_support::grants(OWNER, &[("ns/1", lease.epoch())]),
            TTL,
        )
        .unwrap();
    let group = join.group.unwrap();
    deployment
        .conn_as(&deployment.owner)
        .bind_namespace("ns/", &deployment.app)
        .unwrap();
    match worker.renew_group(group, OWNER, TTL) {
        Err(error)
            if error.kind() == ErrorKind::Forbidden
                && error.table().is_none()
                && error.refusal().is_none() =>
        {
            assert_eq!(error.operation(), Some(Operation::RENEW_GROUP));
            assert_eq!(error.key(), Some("ns/1"));
        }
        other => panic!("expected Forbidden, got {other:?}"),
    }
    // A member of the bound role may.
    let mut app = deployment.conn_as(&deployment.app);
    assert!(matches!(
        app.renew_group(group, OWNER, TTL).unwrap(),
        GroupRenewal::Renewed { members: 1, .. }
    ));
}

/// A [`KeeperSet`] beats by writing its group's row: after the first beat,
/// the members' own expiry stays as the join wrote it while the group's
/// moves on; and a key force-released in between is reported lost at the
/// next beat.
#[test]
fn a_keeper_set_heartbeat_writes_the_group_row_and_still_reports_each_loss() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let leases: Vec<Lease> = ["k/1", "k/2", "k/3"]
        .iter()
        .map(|key| granted(conn.acquire(key, OWNER, Duration::from_secs(3)).unwrap()))
        .collect();
    let (sender, receiver) = mpsc::channel();
    let keepers = KeeperSet::builder(&client(&db.url), leases)
        .ttl(Duration::from_secs(3))
        .renew_every(Duration::from_millis(200))
        .on_event(move |event| {
            let _ = sender.send(event.clone());
        })
        .start()
        .unwrap();
    let own_expiry = |conn: &mut PgConnection| {
        query_lines(
            conn,
            "SELECT format('%s|%s', key, expires_at) AS line FROM lease.leases ORDER BY key",
        )
    };
    let next_renewal = || loop {
        match receiver.recv_timeout(Duration::from_secs(30)).unwrap() {
            KeeperSetEvent::Renewed { renewed, .. } => return renewed,
            _ => continue,
        }
    };
    let group_count = |conn: &mut PgConnection| {
        query_lines(conn, "SELECT count(*)::text AS line FROM lease.groups")
    };
    assert_eq!(group_count(&mut conn), vec!["1"]);
    let after_join = own_expiry(&mut conn);
    let group_before = query_lines(
        &mut conn,
        "SELECT expires_at::text AS line FROM lease.groups",
    );
    assert_eq!(next_renewal(), 3);
    assert_eq!(next_renewal(), 3);
    assert_eq!(own_expiry(&mut conn), after_join);
    assert_ne!(
        query_lines(
            &mut conn,
            "SELECT expires_at::text AS line FROM lease.groups"
        ),
        group_before
    );

    assert!(conn.force_release("k/2").unwrap().is_some());
    let lost = loop {
        match receiver.recv_timeout(Duration::from_secs(30)).unwrap() {
            KeeperSetEvent::Lost { key, .. } => break key,
            _ => continue,
        }
    };
    assert_eq!(lost, "k/2");
    assert!(keepers.is_valid("k/1") && keepers.is_valid("k/3"));
    assert!(!keepers.is_valid("k/2"));
    // The two kept keys moved to a new group, which the next beats renew.
    assert_eq!(next_renewal(), 2);
    assert_eq!(group_count(&mut conn), vec!["2"]);
    keepers.stop().unwrap();
}

/// Liveness of a group is judged by the clock at the heartbeat, not by the
/// start of the heartbeat's transaction: a transaction that began while
/// the group was live and sends its heartbeat after the group lapsed is
/// refused, and the group's expiry does not move.
#[test]
fn a_heartbeat_sent_after_the_group_lapsed_is_refused_in_a_transaction_begun_before() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let (_, group) = joined(&mut conn, &["late/a"]);
    expire_own(&mut conn, &["late/a"]);
    conn.batch_execute(&format!(
        "UPDATE lease.groups SET expires_at = clock_timestamp() + interval '1 second' WHERE id = {}",
        group.get()
    ))
    .unwrap();
    let mut late = db.conn();
    late.batch_execute("BEGIN").unwrap();
    assert_eq!(
        query_lines(
            &mut late,
            &format!(
                "SELECT (expires_at > now())::text AS line FROM lease.groups WHERE id = {}",
                group.get()
            )
        ),
        ["true"],
        "the group is live at the transaction's start"
    );
    let lapsed = format!(
        "SELECT (expires_at < clock_timestamp())::text AS line FROM lease.groups WHERE id = {}",
        group.get()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while query_lines(&mut conn, &lapsed) != ["true"] {
        assert!(
            std::time::Instant::now() < deadline,
            "the group never lapsed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = group_expiry_in_sql(&mut conn, group);
    assert_eq!(
        late.renew_group(group, OWNER, TTL).unwrap(),
        GroupRenewal::Refused(Refusal::Lapsed {
            taken_over_by: None
        })
    );
    late.batch_execute("COMMIT").unwrap();
    assert_eq!(group_expiry_in_sql(&mut conn, group), before);
}
