//! Every call is counted and traced as the single-key calls are: the batch
//! and group calls, the operator calls, prune and the listing each move
//! `leasehold_calls_total{operation,outcome}` once per call and open one
//! `lease` span, and a KeeperSet's heartbeat shows up as `renew_group`.

use std::collections::BTreeMap;
use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::Text;
use leasehold::{
    admin::{ListFilter, PruneOptions},
    hold::KeeperSet,
    Acquisition, Leases,
};
use leasehold_test_support::TestDb;

use crate::{exclusive, wait_for};
use leasehold::admin::Operator;

const TTL: Duration = Duration::from_secs(30);

fn granted(acquisition: Acquisition) -> leasehold::Lease {
    acquisition.granted().expect("expected a grant")
}

#[derive(QueryableByName)]
struct Name {
    #[diesel(sql_type = Text)]
    name: String,
}

/// The `leasehold_calls_total` series that moved, by how much.
fn calls(counters: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    counters
        .iter()
        .filter(|(series, _)| series.starts_with("leasehold_calls_total{"))
        .map(|(series, value)| (series.clone(), *value))
        .collect()
}

#[test]
fn batch_group_operator_and_prune_calls_are_counted_and_traced() {
    let (_serial, installed) = exclusive();
    let recorder = installed.metrics;
    let db = TestDb::new();
    let mut conn = db.conn();
    let me = diesel::sql_query("SELECT current_user::text AS name")
        .get_result::<Name>(&mut conn)
        .expect("current_user")
        .name;
    let a = granted(conn.acquire("a", "w", TTL).expect("acquire"));
    let b = granted(conn.acquire("b", "w", TTL).expect("acquire"));
    let grants = [(a.key(), a.epoch()), (b.key(), b.epoch())];

    conn.renew_many(&leasehold_test_support::grants("w", &grants), TTL)
        .expect("renew_many");
    let stale = [
        (a.key(), a.epoch()),
        (b.key(), leasehold::Epoch::new(b.epoch().get() + 5)),
    ];
    conn.renew_many(&leasehold_test_support::grants("w", &stale), TTL)
        .expect("renew_many, one stale");
    let joined = conn
        .join_group(&leasehold_test_support::grants("w", &grants), TTL)
        .expect("join_group");
    let group = joined.group.expect("a group");
    assert!(matches!(
        conn.renew_group(group, "w", TTL).expect("renew_group"),
        leasehold::batch::GroupRenewal::Renewed { .. }
    ));
    assert!(matches!(
        conn.renew_group(group, "someone-else", TTL)
            .expect("renew_group, refused"),
        leasehold::batch::GroupRenewal::Refused(_)
    ));
    conn.release_many(&leasehold_test_support::grants("w", &grants))
        .expect("release_many");

    conn.bind_namespace("team/", &me).expect("bind");
    conn.list_namespaces().expect("list");
    assert!(conn.unbind_namespace("team/").expect("unbind"));
    assert!(!conn.unbind_namespace("team/").expect("unbind again"));
    conn.bind_namespace("", &me).expect_err("an empty prefix");

    assert_eq!(conn.force_release("never").expect("force"), None);
    let c = granted(conn.acquire("c", "w", TTL).expect("acquire"));
    conn.force_release_epoch(c.key(), c.epoch())
        .expect("force epoch");
    let now = conn.generation().expect("generation");
    conn.raise_generation(now.generation + 1).expect("raise");
    conn.raise_generation(now.generation + 1)
        .expect_err("not above");
    let mut options = PruneOptions::new(Duration::from_secs(3600));
    options.dry_run = true;
    conn.prune(&options).expect("prune");
    conn.list_leases(&ListFilter::new()).expect("list_leases");
    conn.list_leases(&ListFilter::new().limit(0))
        .expect_err("a limit of zero");

    let expected: BTreeMap<String, u64> = [
        ("acquire,outcome=granted", 3),
        ("bind_namespace,outcome=done", 1),
        ("bind_namespace,outcome=invalid", 1),
        ("force_release,outcome=never_leased", 1),
        ("force_release,outcome=released", 1),
        ("generation,outcome=read", 1),
        ("join_group,outcome=joined", 1),
        ("list_leases,outcome=invalid", 1),
        ("list_leases,outcome=listed", 1),
        ("list_namespaces,outcome=listed", 1),
        ("prune,outcome=dry_run", 1),
        ("raise_generation,outcome=done", 1),
        ("raise_generation,outcome=not_above", 1),
        ("release_many,outcome=all", 1),
        ("renew_group,outcome=not_owner", 1),
        ("renew_group,outcome=renewed", 1),
        ("renew_many,outcome=all", 1),
        ("renew_many,outcome=partial", 1),
        ("unbind_namespace,outcome=absent", 1),
        ("unbind_namespace,outcome=done", 1),
    ]
    .into_iter()
    .map(|(labels, value)| {
        (
            format!("leasehold_calls_total{{operation={labels}}}"),
            value,
        )
    })
    .collect();
    assert_eq!(calls(&recorder.counters()), expected);

    // One span per call, named and fielded as the single-key calls' are.
    let spans = installed.spans.spans();
    for operation in [
        "renew_many",
        "release_many",
        "join_group",
        "renew_group",
        "bind_namespace",
        "unbind_namespace",
        "list_namespaces",
        "force_release",
        "generation",
        "raise_generation",
        "prune",
        "list_leases",
    ] {
        assert!(
            spans.iter().any(|span| span.name == "lease"
                && span.fields.get("operation").map(String::as_str) == Some(operation)
                && span.fields.contains_key("outcome")
                && span.fields.contains_key("duration_us")),
            "no lease span for {operation}: {spans:?}"
        );
    }
}

#[test]
fn a_keeper_sets_heartbeat_is_counted_as_renew_group() {
    let (_serial, installed) = exclusive();
    let recorder = installed.metrics;
    let db = TestDb::new();
    let mut conn = db.conn();
    let leases: Vec<leasehold::Lease> = ["s1", "s2"]
        .into_iter()
        .map(|key| granted(conn.acquire(key, "w", TTL).expect("acquire")))
        .collect();
    let client = leasehold::LeaseClient::connect(&db.url, 2).expect("pool");
    let set = KeeperSet::builder(&client, leases)
        .ttl(Duration::from_secs(3))
        .renew_every(Duration::from_millis(200))
        .start()
        .expect("keeper set");
    wait_for("a heartbeat of the set", || {
        recorder.counter("leasehold_calls_total{operation=renew_group,outcome=renewed}") >= 1
    });
    assert_eq!(
        recorder.counter("leasehold_calls_total{operation=join_group,outcome=joined}"),
        1
    );
    set.stop().expect("stop");
    assert_eq!(
        recorder.counter("leasehold_calls_total{operation=release_many,outcome=all}"),
        1
    );
}
