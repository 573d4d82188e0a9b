//! Listing keys (`Operator::list_leases`, what `leasehold ls` and `watch`
//! show): the states it reports are the SQL's own liveness rule, its
//! filters and orders, and who may list.
//!
//! `lease.list_leases` calls `lease._live` and `lease._expiry`; the first
//! test lists every kind of row the tables can hold and checks each state
//! and expiry against `inspect` and the helpers themselves.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use leasehold::{
    admin::{KeyState, ListFilter, ListOrder, ListedLease, Listing},
    error::Operation,
    ErrorKind, LeaseClient, LeaseState, Leases, Release,
};
use leasehold_test_support::Deployment;

use crate::common::*;
use leasehold::admin::Operator;

/// A ttl that outlasts every test here.
const LONG: Duration = Duration::from_secs(600);

fn listed(leases: &mut impl Operator, filter: &ListFilter) -> Vec<String> {
    leases
        .list_leases(filter)
        .unwrap()
        .leases
        .into_iter()
        .map(|row| row.key)
        .collect()
}

fn row<'l>(listing: &'l Listing, key: &str) -> &'l ListedLease {
    listing
        .leases
        .iter()
        .find(|row| row.key == key)
        .unwrap_or_else(|| panic!("{key} not listed: {listing:?}"))
}

/// The helpers' own verdict on every row, as the superuser reads it:
/// `key|live|owner|epoch|expiry` (expiry as epoch microseconds).
fn by_the_rule(conn: &mut PgConnection) -> Vec<String> {
    query_lines(
        conn,
        "SELECT format('%s|%s|%s|%s|%s', l.key, lease._live(l)::text, l.owner, l.epoch,
                       (extract(epoch FROM lease._expiry(l)) * 1000000)::bigint) AS line
           FROM lease.leases AS l ORDER BY l.key COLLATE \"C\"",
    )
}

/// The same fields from a listing.
fn as_listed(listing: &Listing) -> Vec<String> {
    let micros = |at: Option<DateTime<Utc>>| {
        at.map_or(String::new(), |at| at.timestamp_micros().to_string())
    };
    listing
        .leases
        .iter()
        .map(|row| {
            format!(
                "{}|{}|{}|{}|{}",
                row.key,
                row.state == KeyState::Held,
                row.owner.as_deref().unwrap_or(""),
                row.epoch,
                micros(row.expires_at)
            )
        })
        .collect()
}

/// Every kind of row, listed: held; lapsed; released and force-released
/// (free); in a heartbeat group whose own expiry passed while the group is
/// live (held until the group's expiry); in a group that lapsed; pointing
/// at a group that is gone (as a row read in a snapshot older than a
/// prune's would). Each state is the one `inspect` and `lease._live`
/// give, and each expiry the one `lease._expiry` gives.
#[test]
fn listed_states_and_expiries_are_the_sql_rules_own_for_every_kind_of_row() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let held = granted(conn.acquire("held", "w-held", LONG).unwrap());
    let lapsing = granted(
        conn.acquire("lapsed", "w-lapsed", STILL_HELD_NEXT_STEP)
            .unwrap(),
    );
    let released = granted(conn.acquire("released", "w", LONG).unwrap());
    assert_eq!(
        conn.release(&leasehold_test_support::grant(
            "released",
            "w",
            released.epoch()
        ))
        .unwrap(),
        Release::Released
    );
    granted(conn.acquire("forced", "w", LONG).unwrap());
    conn.force_release("forced").unwrap();

    // Own expiry short, group renewed long: held through the group.
    let member = granted(conn.acquire("group-live", "w-group", LONG).unwrap());
    let joined = conn.join_group(&[&member], STILL_HELD_NEXT_STEP).unwrap();
    let group = joined.group.expect("a group");
    assert!(matches!(
        conn.renew_group(group, "w-group", LONG).unwrap(),
        leasehold::batch::GroupRenewal::Renewed { .. }
    ));
    // Own expiry and group both short: lapsed once both passed.
    let gone = granted(conn.acquire("group-lapsed", "w-group", LONG).unwrap());
    let short_group = conn.join_group(&[&gone], STILL_HELD_NEXT_STEP).unwrap();
    assert!(short_group.group.is_some());
    // A member whose group is gone (no foreign key: see docs/ARCHITECTURE.md).
    let orphan = granted(
        conn.acquire("group-gone", "w-group", STILL_HELD_NEXT_STEP)
            .unwrap(),
    );
    conn.batch_execute(
        "UPDATE lease.leases SET group_id = (SELECT coalesce(max(id), 0) + 1000 FROM lease.groups)
          WHERE key = 'group-gone'",
    )
    .unwrap();

    // Everything short has expired on the server's clock: the plain grants,
    // both members' own expiries and the short group's.
    let latest = [
        lapsing.expires_at(),
        orphan.expires_at(),
        renewed_until(&joined),
        renewed_until(&short_group),
        group_expiry(&mut conn, short_group.group.expect("a group")),
    ]
    .into_iter()
    .max()
    .unwrap();
    wait_until_server_time_passes(&mut conn, latest);

    let listing = conn.list_leases(&ListFilter::new()).unwrap();
    let states: Vec<(&str, KeyState)> = listing
        .leases
        .iter()
        .map(|row| (row.key.as_str(), row.state))
        .collect();
    assert_eq!(
        states,
        [
            ("forced", KeyState::Free),
            ("group-gone", KeyState::Lapsed),
            ("group-lapsed", KeyState::Lapsed),
            ("group-live", KeyState::Held),
            ("held", KeyState::Held),
            ("lapsed", KeyState::Lapsed),
            ("released", KeyState::Free),
        ]
    );
    // The rule's own verdict and expiry for every row.
    assert_eq!(as_listed(&listing), by_the_rule(&mut conn));
    // inspect agrees key by key: held with the same owner, epoch and
    // effective expiry; otherwise unowned at the same epoch.
    for listed in &listing.leases {
        match conn.inspect(&listed.key).unwrap() {
            Some(LeaseState::Held {
                owner,
                epoch,
                expires_at,
            }) => {
                assert_eq!(listed.state, KeyState::Held, "{listed:?}");
                assert_eq!(listed.owner.as_deref(), Some(owner.as_str()));
                assert_eq!((listed.epoch, listed.expires_at), (epoch, Some(expires_at)));
            }
            Some(LeaseState::Lapsed {
                owner,
                epoch,
                expired_at,
            }) => {
                assert_eq!(listed.state, KeyState::Lapsed, "{listed:?}");
                assert_eq!(listed.owner.as_deref(), Some(owner.as_str()));
                assert_eq!((listed.epoch, listed.expires_at), (epoch, Some(expired_at)));
            }
            Some(LeaseState::Free { epoch, .. }) => {
                assert_eq!(listed.state, KeyState::Free, "{listed:?}");
                assert_eq!(listed.epoch, epoch, "{listed:?}");
            }
            other => panic!("{}: inspect answered {other:?}", listed.key),
        }
    }
    // A lapsed row keeps its holder and shows how long ago it expired; a
    // held one how long it has left; a free one neither. Both are the
    // server's expiry minus the server's clock at the read.
    let lapsed = row(&listing, "lapsed");
    assert_eq!(lapsed.owner.as_deref(), Some("w-lapsed"));
    let since = lapsed.remaining.expect("a lapsed row's time");
    assert!(since <= chrono::TimeDelta::zero(), "{lapsed:?}");
    let live = row(&listing, "held");
    assert_eq!(live.expires_at, Some(held.expires_at()));
    let left = live.remaining.expect("a held row's time");
    assert!(left > chrono::TimeDelta::zero() && left <= chrono::TimeDelta::seconds(600));
    assert_eq!(Some(listing.read_at + left), live.expires_at);
    let free = row(&listing, "released");
    assert_eq!(
        (free.owner.as_ref(), free.expires_at, free.remaining),
        (None, None, None)
    );
    assert_eq!(free.epoch, released.epoch().get() + 1);
    // The digest is the one release notifications carry.
    assert_eq!(
        query_lines(
            &mut conn,
            "SELECT encode(sha256(convert_to('held', 'UTF8')), 'hex') AS line"
        ),
        std::slice::from_ref(&live.digest)
    );
}

/// The own expiry a joined key was renewed to.
fn renewed_until(join: &leasehold::batch::GroupJoin) -> DateTime<Utc> {
    match join.keys[0].renewal {
        leasehold::Renewal::Renewed { expires_at } => expires_at,
        ref refused => panic!("join refused: {refused:?}"),
    }
}

/// A group's expiry, as the superuser reads it.
fn group_expiry(conn: &mut PgConnection, group: leasehold::batch::GroupId) -> DateTime<Utc> {
    #[derive(QueryableByName)]
    struct Expiry {
        #[diesel(sql_type = diesel::sql_types::Timestamptz)]
        expires_at: DateTime<Utc>,
    }
    diesel::sql_query("SELECT expires_at FROM lease.groups WHERE id = $1")
        .bind::<diesel::sql_types::BigInt, _>(group.get())
        .get_result::<Expiry>(conn)
        .unwrap()
        .expires_at
}

/// Each filter and order, on a connection and through a pooled client
/// (the two faces of the one call).
#[test]
fn list_leases_filters_by_prefix_owner_and_state_orders_and_limits() {
    let db = TestDb::new();
    let mut conn = db.conn();
    granted(conn.acquire("a-1", "w1", Duration::from_secs(60)).unwrap());
    granted(conn.acquire("a-2", "w2", LONG).unwrap());
    let freed = granted(conn.acquire("a-3", "w1", LONG).unwrap());
    assert_eq!(
        conn.release(&leasehold_test_support::grant("a-3", "w1", freed.epoch()))
            .unwrap(),
        Release::Released
    );
    let short = granted(conn.acquire("b-1", "w1", STILL_HELD_NEXT_STEP).unwrap());
    wait_until_server_time_passes(&mut conn, short.expires_at());

    check_filters(&mut conn);
    check_filters(&mut LeaseClient::connect(&db.url, 1).unwrap());
}

/// The filters and orders, on either face of the call.
fn check_filters(leases: &mut impl Operator) {
    let all = ListFilter::new();
    assert_eq!(listed(leases, &all), ["a-1", "a-2", "a-3", "b-1"]);
    assert_eq!(
        listed(leases, &all.clone().prefix("a-")),
        ["a-1", "a-2", "a-3"]
    );
    assert_eq!(
        listed(leases, &all.clone().prefix("a-1x")),
        Vec::<String>::new()
    );
    assert_eq!(
        listed(leases, &all.clone().state(KeyState::Held)),
        ["a-1", "a-2"]
    );
    assert_eq!(
        listed(
            leases,
            &all.clone().state(KeyState::Lapsed).state(KeyState::Free)
        ),
        ["a-3", "b-1"]
    );
    // The owner of a held or a lapsed grant; a free key has none.
    assert_eq!(listed(leases, &all.clone().owner("w1")), ["a-1", "b-1"]);
    assert_eq!(listed(leases, &all.clone().owner("w2")), ["a-2"]);
    assert_eq!(
        listed(
            leases,
            &all.clone().prefix("a-").owner("w1").state(KeyState::Held)
        ),
        ["a-1"]
    );
    // Soonest effective expiry first (the lapsed one), free keys last.
    assert_eq!(
        listed(leases, &all.clone().order(ListOrder::Expires)),
        ["b-1", "a-1", "a-2", "a-3"]
    );
    // Highest epoch first (a-3's counter is 2), ties by key.
    assert_eq!(
        listed(leases, &all.clone().order(ListOrder::Epoch)),
        ["a-3", "a-1", "a-2", "b-1"]
    );
    assert_eq!(
        listed(leases, &all.clone().order(ListOrder::Expires).limit(2)),
        ["b-1", "a-1"]
    );
    assert_eq!(listed(leases, &all.clone().limit(u64::MAX)).len(), 4);
}

/// An empty answer still carries the server's clock; keys order by bytes,
/// whatever the database's collation.
#[test]
fn an_empty_listing_has_the_servers_clock_and_keys_sort_by_bytes() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let before = server_now(&mut conn);
    let empty = conn.list_leases(&ListFilter::new()).unwrap();
    assert!(empty.leases.is_empty());
    assert!(empty.read_at >= before, "{empty:?}");
    for key in ["b", "B", "a", "_", "é"] {
        granted(conn.acquire(key, "w", LONG).unwrap());
    }
    assert_eq!(
        listed(&mut conn, &ListFilter::new()),
        ["B", "_", "a", "b", "é"]
    );
}

/// A filter that cannot be meant is refused before anything is sent.
#[test]
fn bad_filters_are_invalid_input() {
    let db = TestDb::new();
    let mut conn = db.conn();
    for (filter, violation) in [
        (ListFilter::new().limit(0), "limit must be at least 1"),
        (ListFilter::new().owner(""), "owner must not be empty"),
        (
            ListFilter::new().prefix("a\0b"),
            "prefix must not contain NUL characters",
        ),
    ] {
        match conn.list_leases(&filter) {
            Err(error)
                if error.kind() == ErrorKind::InvalidInput && !error.violations().is_empty() =>
            {
                assert_eq!(error.violations(), [violation])
            }
            other => panic!("{filter:?}: expected InvalidInput, got {other:?}"),
        }
    }
}

/// Who may list: the owner that installed leasehold, and a role the owner
/// granted SELECT on both tables (which holds no EXECUTE on the helpers:
/// `lease.list_leases` calls them as their owner). A role without the privilege is refused by
/// name, nothing is read, and its transaction goes on.
#[test]
fn listing_needs_select_on_both_tables_and_a_refusal_names_the_role() {
    let deployment = Deployment::new();
    let mut owner = deployment.conn_as(&deployment.owner);
    granted(owner.acquire("k", "w", LONG).unwrap());
    assert_eq!(listed(&mut owner, &ListFilter::new()), ["k"]);

    let mut attacker = deployment.conn_as(&deployment.attacker);
    attacker
        .transaction::<_, diesel::result::Error, _>(|conn| {
            match conn.list_leases(&ListFilter::new()) {
                Err(error)
                    if error.kind() == ErrorKind::Forbidden
                        && error.operation() == Some(Operation::LIST_LEASES) =>
                {
                    assert_eq!(error.role(), Some(deployment.attacker.as_str()))
                }
                other => panic!("expected ListNotPermitted, got {other:?}"),
            }
            // The refusal did not abort the transaction.
            assert!(matches!(
                conn.inspect("k").unwrap(),
                Some(LeaseState::Held { .. })
            ));
            Ok(())
        })
        .unwrap();
    let error = attacker.list_leases(&ListFilter::new()).unwrap_err();
    assert!(
        error.to_string().contains(&deployment.attacker)
            && error.to_string().contains("lease.leases"),
        "{error}"
    );

    // SELECT on one table is not enough.
    owner
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA lease TO {op}; GRANT SELECT ON lease.leases TO {op}",
            op = deployment.operator
        ))
        .unwrap();
    let mut operator = deployment.conn_as(&deployment.operator);
    assert!(matches!(
        operator.list_leases(&ListFilter::new()),
        Err(error) if error.kind() == ErrorKind::Forbidden
            && error.operation() == Some(Operation::LIST_LEASES)
            && error.role().is_some()
    ));
    owner
        .batch_execute(&format!(
            "GRANT SELECT ON lease.groups TO {}",
            deployment.operator
        ))
        .unwrap();
    assert!(!query_bool(
        &mut operator,
        "SELECT has_function_privilege('lease._live(lease.leases)', 'EXECUTE') AS flag"
    ));
    let listing = operator.list_leases(&ListFilter::new()).unwrap();
    assert_eq!(listing.leases.len(), 1);
    assert_eq!(listing.leases[0].state, KeyState::Held);
    assert_eq!(listing.leases[0].owner.as_deref(), Some("w"));
}

/// The SQL function's own gate, for a caller who skips the client's
/// question: without SELECT on both tables, `lease.list_leases` refuses
/// (42501) before reading a row; with it, it lists, though the role holds
/// no EXECUTE on the helpers it calls. Bad arguments are invalid input.
#[test]
fn the_listing_function_admits_only_roles_that_may_read_both_tables() {
    let deployment = Deployment::new();
    let mut owner = deployment.conn_as(&deployment.owner);
    granted(owner.acquire("k", "w", LONG).unwrap());
    let call = "SELECT format('%s|%s|%s', key, state, owner) AS line \
                FROM lease.list_leases('', NULL, '{}', 'key', 10)";
    let refusal = |conn: &mut PgConnection| {
        diesel::sql_query(call)
            .execute(conn)
            .expect_err("refused")
            .to_string()
    };
    let mut attacker = deployment.conn_as(&deployment.attacker);
    let message = refusal(&mut attacker);
    assert!(
        message.contains("permission denied for lease.list_leases")
            && message.contains(&deployment.attacker),
        "{message}"
    );
    owner
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA lease TO {op}; GRANT SELECT ON lease.leases TO {op}",
            op = deployment.operator
        ))
        .unwrap();
    let mut operator = deployment.conn_as(&deployment.operator);
    assert!(refusal(&mut operator).contains("permission denied for lease.list_leases"));
    owner
        .batch_execute(&format!(
            "GRANT SELECT ON lease.groups TO {}",
            deployment.operator
        ))
        .unwrap();
    assert_eq!(query_lines(&mut operator, call), ["k|held|w"]);
    let invalid =
        diesel::sql_query("SELECT * FROM lease.list_leases(NULL, '', '{busy}', 'owner', 0)")
            .execute(&mut operator)
            .expect_err("invalid input")
            .to_string();
    assert_eq!(
        invalid,
        "invalid input to lease.list_leases: prefix must not be NULL; owner must not be empty; \
         states must each be held, lapsed or free; sort must be key, expires or epoch; \
         max_rows must be at least 1"
    );
}

/// Without leasehold there is nothing to list, and the error says so.
#[test]
fn listing_an_empty_database_says_leasehold_is_not_installed() {
    let db = TestDb::empty();
    let error = db.conn().list_leases(&ListFilter::new()).unwrap_err();
    assert!(
        error.kind() == ErrorKind::NotInstalled
            && error.operation() == Some(Operation::LIST_LEASES),
        "{error:?}"
    );
}
