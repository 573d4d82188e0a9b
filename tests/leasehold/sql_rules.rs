//! The baseline SQL's own shape (docs/SPECIFICATION.md §1, "one definition
//! per rule"): every liveness and expiry comparison lives in its helper,
//! the shortcuts of a rule never disagree with the rule, every function
//! pins its search_path or is an inlined helper, nothing in schema `lease`
//! is a rewrite rule or a view, functions live in the files of functions
//! only, and each migration's `down.sql` drops exactly the functions its
//! `up.sql` creates (the files of functions are undone together by the
//! functions step, tests/leasehold/layout.rs).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use diesel::connection::SimpleConnection;
use leasehold_test_support::TestDb;

use crate::common::*;
use leasehold::admin::Operator;
use leasehold::Leases;

/// The helpers allowed to compare an expiry with the clock, or to compute
/// one: the definitions of liveness, expiry and span validity
/// (sql/functions/01_rules.sql).
const TIME_RULE_HELPERS: &[&str] = &[
    "_expires_in",
    "_live",
    "_group_live",
    "_expiry",
    "_lapsed_for",
    "_group_lapsed_for",
    "_idle_cutoff",
    "_span_effect",
];

fn migration_dirs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("migrations/")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// Every SQL source, in the order installs apply them: each migration's
/// `up.sql`, then each file of `sql/functions/`; path and text.
fn sql_sources() -> Vec<(PathBuf, String)> {
    let mut sources: Vec<PathBuf> = migration_dirs()
        .into_iter()
        .map(|dir| dir.join("up.sql"))
        .collect();
    let functions = Path::new(env!("CARGO_MANIFEST_DIR")).join("sql/functions");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&functions)
        .expect("sql/functions/")
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    files.sort();
    sources.extend(files);
    sources
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
            (
                path,
                text.replace("CREATE OR REPLACE FUNCTION", "CREATE FUNCTION"),
            )
        })
        .collect()
}

/// Every `CREATE FUNCTION lease.<name>(...) ... $$ body $$` of a migration:
/// the name and the body, with `--` comments removed.
fn function_bodies(sql: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = sql;
    while let Some(at) = rest.find("CREATE FUNCTION lease.") {
        let after = &rest[at + "CREATE FUNCTION lease.".len()..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let open = after.find("$$").expect("a body opening with $$");
        let body_and_rest = &after[open + 2..];
        let close = body_and_rest.find("$$").expect("a body closing with $$");
        let body: String = body_and_rest[..close]
            .lines()
            .map(|line| line.split("--").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        out.push((name, body));
        rest = &body_and_rest[close + 2..];
    }
    out
}

/// Whether `text` compares an expiry with something, or adds a span to the
/// clock: what only the time-rule helpers may do.
fn time_rule_written_out(text: &str) -> Option<String> {
    let squeezed: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let lowered = squeezed.to_ascii_lowercase();
    let comparisons = ["<=", ">=", "<", ">"];
    for (index, _) in lowered.match_indices("expires_at") {
        let before = lowered[..index].trim_end();
        let after = lowered[index + "expires_at".len()..].trim_start();
        // `x.expires_at > ...` or `... < x.expires_at` (a qualified column
        // is preceded by its alias and a dot).
        let before = before.trim_end_matches(|c: char| {
            c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '(' || c == ')'
        });
        if comparisons
            .iter()
            .any(|op| after.starts_with(op) && !after.starts_with("<<") && !after.starts_with(">>"))
            || comparisons.iter().any(|op| before.trim_end().ends_with(op))
        {
            return Some(
                squeezed[index.saturating_sub(40)..(index + 50).min(squeezed.len())].to_owned(),
            );
        }
    }
    for needle in [
        "clock_timestamp() +",
        "clock_timestamp() -",
        "clock_timestamp() operator(pg_catalog.+)",
        "clock_timestamp() operator(pg_catalog.-)",
        "now()",
        "_expiry(l) <",
        "_expiry(l) >",
        "_expiry(o) <",
        "_expiry(o) >",
    ] {
        if let Some(index) = lowered.find(needle) {
            return Some(
                squeezed[index.saturating_sub(40)..(index + 50).min(squeezed.len())].to_owned(),
            );
        }
    }
    None
}

/// One definition per rule: no liveness or expiry comparison, and no
/// `clock_timestamp() + span` or `- span` (pruning's idle test), is written anywhere in the migrations but in
/// its helper; everything else calls `lease._live`, `lease._expires_in` and
/// the others. Fails naming the function and the text.
#[test]
fn liveness_and_expiry_are_compared_only_in_their_helpers() {
    let mut found = Vec::new();
    let mut helpers_seen = BTreeSet::new();
    for (dir, sql) in sql_sources() {
        for (name, body) in function_bodies(&sql) {
            if TIME_RULE_HELPERS.contains(&name.as_str()) {
                helpers_seen.insert(name);
                continue;
            }
            if let Some(text) = time_rule_written_out(&body) {
                found.push(format!("{}: lease.{name}: {text}", dir.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "time rules written out of their helpers:\n{}",
        found.join("\n")
    );
    let expected: BTreeSet<String> = TIME_RULE_HELPERS.iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(helpers_seen, expected, "every time-rule helper exists");
}

/// One definition of a grant's end: every function that frees a lease row
/// writes it with `lease._freed`, and no other body clears an owner or
/// moves a counter on by hand. Fails naming the function and the text.
#[test]
fn a_grant_ends_only_through_its_rule() {
    let mut found = Vec::new();
    let mut freeing = BTreeSet::new();
    for (dir, sql) in sql_sources() {
        for (name, body) in function_bodies(&sql) {
            if name == "_freed" {
                continue;
            }
            let squeezed = body
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .to_ascii_lowercase();
            if squeezed.contains("lease._freed(") {
                freeing.insert(name.clone());
            }
            for needle in [
                "owner = null",
                "expires_at = null",
                "epoch + 1",
                "epoch operator(pg_catalog.+) 1",
                "force_released =",
            ] {
                if let Some(at) = squeezed.find(needle) {
                    found.push(format!(
                        "{}: lease.{name}: {}",
                        dir.display(),
                        &squeezed[at.saturating_sub(40)..(at + 50).min(squeezed.len())]
                    ));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "a grant's end written out of lease._freed:\n{}",
        found.join("\n")
    );
    assert_eq!(
        freeing.into_iter().collect::<Vec<_>>(),
        ["_force_free", "_many_write", "release"],
        "the functions that free a row"
    );
}

/// `lease._freed` costs nothing as a call: the planner inlines it into
/// every freeing UPDATE (`track_functions = 'all'` counts a SQL function
/// only when it runs as a call), on each path that frees a row.
#[test]
fn a_grants_end_is_inlined_on_every_path() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.batch_execute("SET track_functions = 'all'")
        .expect("count function calls (superuser)");
    let epoch = |conn: &mut diesel::PgConnection, key: &str| {
        query_lines(
            conn,
            &format!("SELECT epoch::text AS line FROM lease.leases WHERE key = '{key}'"),
        )
        .remove(0)
    };
    let acquire = |conn: &mut diesel::PgConnection, key: &str| {
        conn.batch_execute(&format!(
            "SELECT * FROM lease.acquire('{key}', 'a', interval '1 min')"
        ))
        .expect("acquire");
    };
    for key in [
        "free/release",
        "free/member",
        "free/force",
        "free/exact",
        "free/many",
    ] {
        acquire(&mut conn, key);
    }
    let member = epoch(&mut conn, "free/member");
    conn.batch_execute(&format!(
        "SELECT * FROM lease.join_group(ARRAY['free/member'], 'a', ARRAY[{member}::bigint], interval '1 min')"
    ))
    .expect("join a group");
    let calls = [
        format!(
            "SELECT lease.release('free/release', 'a', {})",
            epoch(&mut conn, "free/release")
        ),
        format!("SELECT lease.release('free/member', 'a', {member})"),
        "SELECT lease.force_release('free/force')".to_owned(),
        format!(
            "SELECT * FROM lease.force_release('free/exact', {})",
            epoch(&mut conn, "free/exact")
        ),
        format!(
            "SELECT * FROM lease.release_many(ARRAY['free/many'], 'a', ARRAY[{}::bigint])",
            epoch(&mut conn, "free/many")
        ),
    ];
    conn.batch_execute("BEGIN").expect("begin");
    for call in &calls {
        conn.batch_execute(call).expect("the call");
    }
    let counted = query_lines(
        &mut conn,
        "SELECT (SELECT count(*) FROM lease.leases WHERE key LIKE 'free/%' AND owner IS NULL)::text
                || ' freed, _freed called '
                || COALESCE(pg_stat_get_xact_function_calls('lease._freed(lease.leases, boolean)'::regprocedure), 0)
                || ' times' AS line",
    );
    conn.batch_execute("COMMIT").expect("commit");
    assert_eq!(counted, ["5 freed, _freed called 0 times"]);
}

/// The detector itself: each way of writing the rule out is caught.
#[test]
fn the_time_rule_detector_catches_what_it_must() {
    for text in [
        "WHERE l.expires_at > clock_timestamp()",
        "AND g.expires_at<=v_cutoff",
        "clock_timestamp() < l.expires_at",
        "SET expires_at = clock_timestamp() + ttl",
        "v := now()",
        "lease._expiry(l) <= v_cutoff",
        "v_cutoff := clock_timestamp() - idle",
        "g.updated_at <= (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) idle)",
    ] {
        assert!(time_rule_written_out(text).is_some(), "{text}");
    }
    for text in [
        "SET expires_at = lease._expires_in(v_ttl)",
        "RETURNING l.epoch, l.expires_at INTO v_epoch, v_expires",
        "lease._live(l) AND l.owner = v_owner",
        "SELECT g.expires_at INTO v FROM lease.groups AS g",
        "g.updated_at <= lease._idle_cutoff(prune_guards.idle)",
    ] {
        assert!(time_rule_written_out(text).is_none(), "{text}");
    }
}

/// A rule's shortcut never disagrees with the rule: the plain-span test
/// that lets a ttl or wait skip `lease._span_effect` accepts only spans the
/// rule accepts; `lease._ttl_ok` and `lease._wait_ok` answer as the rule
/// does on every span tried, odd ones included; `lease._name_ok` and
/// `lease._text_violations` agree.
#[test]
fn the_shortcuts_of_a_rule_agree_with_the_rule() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let spans = [
        "0",
        "1 microsecond",
        "1 second",
        "-1 second",
        "59 minutes",
        "1 day",
        "-1 day",
        "1 mon",
        "1 mon -30 days",
        "1 mon -31 days",
        "-1 year 361 days",
        "1 year -360 days",
        "1 year -8640 hours",
        "-1 year 8640 hours",
        "99 years",
        "100 years",
        "100 years 1 day",
        "36000 days",
        "36500 days",
        "876000 hours",
        "876599 hours",
        "877000 hours",
        "-2000000 mon 60000001 days",
        "1 mon -720 hours",
        "12 mon -360 days",
    ];
    let list = spans
        .iter()
        .map(|span| format!("interval '{span}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let disagreements = query_lines(
        &mut conn,
        &format!(
            "SELECT format('%s: plain=%s ttl_ok=%s wait_ok=%s effect=%s', s.span,
                           lease._plain_span_within(s.span, interval '0'),
                           lease._ttl_ok(s.span), lease._wait_ok(s.span), e.effect) AS line
               FROM unnest(ARRAY[{list}]) AS s(span)
              CROSS JOIN LATERAL (SELECT lease._span_effect(s.span) AS effect) AS e
              WHERE (lease._plain_span_within(s.span, interval '0') AND e.effect <> 'ok')
                 OR lease._ttl_ok(s.span) <> (e.effect = 'ok')
                 OR lease._wait_ok(s.span) <> (e.effect IN ('ok', 'zero'))
                 OR (cardinality(lease._ttl_violations(s.span)) = 0) <> lease._ttl_ok(s.span)
                 OR (cardinality(lease._wait_violations(s.span)) = 0) <> lease._wait_ok(s.span)"
        ),
    );
    assert!(disagreements.is_empty(), "{disagreements:#?}");
    // The shortcuts' own test, against its definition (no month part and no
    // day part): a span whose months and days cancel in interval ordering
    // ('1 mon -30 days') still has both, and moves the clock by other than
    // its ordering on some dates, so no date may be needed to catch it.
    let time_only = query_lines(
        &mut conn,
        &format!(
            "SELECT format('%s: time_only=%s', s.span, lease._time_only(s.span)) AS line
               FROM unnest(ARRAY[{list}, interval '1 mon -30 days 1 second', interval '-1 day 24:00',
                                 interval '25:00', interval '-00:00:01']) AS s(span)
              WHERE lease._time_only(s.span)
                    <> (date_part('year', s.span) = 0 AND date_part('month', s.span) = 0
                        AND date_part('day', s.span) = 0)"
        ),
    );
    assert!(time_only.is_empty(), "{time_only:#?}");
    let names = query_lines(
        &mut conn,
        "SELECT format('%s', coalesce(octet_length(v)::text, 'NULL')) AS line
           FROM unnest(ARRAY[NULL, '', 'a', repeat('é', 8192), repeat('x', 16384), repeat('x', 16385)]) AS n(v)
          WHERE lease._name_ok(v) <> (cardinality(lease._text_violations('key', v)) = 0)",
    );
    assert!(names.is_empty(), "{names:?}");
}

/// The SQL helpers written without a pinned search_path so that the planner
/// inlines them into their callers (a pin forbids inlining). Each was
/// reviewed for built-ins written `pg_catalog.`-qualified; a function not
/// listed here must pin its path, so dropping a pin anywhere else, or
/// adding an unpinned helper without review, fails the test below.
const INLINED_HELPERS: &[&str] = &[
    "_allowed",
    "_any_rules",
    "_claims_tag",
    "_current_lineage",
    "_detail",
    "_expires_in",
    "_expiry",
    // One per type a row fence's key column may have.
    "_fence_key_text",
    "_fence_key_text",
    "_fence_key_text",
    "_fence_key_text",
    "_fence_key_text",
    "_fence_key_text",
    "_fence_key_text",
    "_fence_key_text",
    "_fence_key_text",
    "_fence_key_text",
    "_fence_key_text",
    "_freed",
    "_grant_epoch",
    "_group_lapsed_for",
    "_group_live",
    "_idle_cutoff",
    "_key_hash",
    "_lapsed_for",
    "_limit_lock_wait",
    "_lineage_generation",
    "_live",
    "_lock_budget",
    "_make_durable",
    "_many_input",
    "_max_batch",
    "_max_generation",
    "_max_name_bytes",
    "_max_span",
    "_name_ok",
    "_on_change",
    "_plain_span_within",
    "_presented_live",
    "_read_only",
    "_time_only",
    "_timeline",
    "_token_text",
    "_ttl_ok",
    "_wait_ok",
    "_waiter_class",
    "_waiter_limit",
    "_waiter_lock_id",
];

/// Every function in schema `lease` either pins its search_path or is one
/// of the SQL helpers the planner inlines into callers that pin theirs
/// ([`INLINED_HELPERS`], which write every built-in they call
/// `pg_catalog.`-qualified); every SECURITY DEFINER function pins it. And
/// schema `lease` holds no view and no rewrite rule: every entry point is
/// a function.
#[test]
fn every_function_pins_its_search_path_and_no_rule_exists() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let unpinned_helpers = query_lines(
        &mut conn,
        "SELECT p.proname::text AS line FROM pg_proc AS p
          WHERE p.pronamespace = 'lease'::regnamespace AND p.proconfig IS NULL
          ORDER BY p.proname::text COLLATE \"C\"",
    );
    assert_eq!(
        unpinned_helpers, INLINED_HELPERS,
        "the functions without a pinned search_path"
    );
    let unpinned = query_lines(
        &mut conn,
        "SELECT p.oid::regprocedure::text AS line
           FROM pg_proc AS p
          WHERE p.pronamespace = 'lease'::regnamespace
            AND NOT coalesce(p.proconfig @> ARRAY['search_path=pg_catalog, pg_temp'], false)
            AND (p.prosecdef OR p.prolang <> (SELECT oid FROM pg_language WHERE lanname = 'sql'))
          ORDER BY 1",
    );
    assert!(
        unpinned.is_empty(),
        "functions without a pinned search_path: {unpinned:?}"
    );
    let unqualified = query_lines(
        &mut conn,
        "SELECT p.proname::text AS line
           FROM pg_proc AS p
          WHERE p.pronamespace = 'lease'::regnamespace
            AND p.proconfig IS NULL
            AND p.prosrc ~ '(^|[^._a-z])(clock_timestamp|convert_to|sha256|octet_length|pg_relation_size|current_setting|set_config|encode|substring|date_part|ceil|pg_try_advisory_xact_lock)\\('
          ORDER BY 1",
    );
    assert!(
        unqualified.is_empty(),
        "inlined helpers calling unqualified built-ins: {unqualified:?}"
    );
    let rewrites = query_lines(
        &mut conn,
        "SELECT c.relname::text AS line FROM pg_class AS c
          WHERE c.relnamespace = 'lease'::regnamespace AND c.relkind IN ('v', 'm')
         UNION ALL
         SELECT r.rulename::text FROM pg_rewrite AS r JOIN pg_class AS c ON c.oid = r.ev_class
          WHERE c.relnamespace = 'lease'::regnamespace",
    );
    assert!(
        rewrites.is_empty(),
        "views or rules in schema lease: {rewrites:?}"
    );
}

/// Every migration and every file of functions ends by taking back what
/// default privileges granted on the objects it wrote (docs/PRIVILEGES.md),
/// so a new one cannot forget it: its last statement is the call.
#[test]
fn each_migration_ends_by_dropping_default_grants() {
    for (dir, up) in sql_sources() {
        let last = up
            .lines()
            .map(str::trim)
            .rfind(|line| !line.is_empty() && !line.starts_with("--"))
            .unwrap_or_default();
        assert_eq!(
            last,
            "SELECT lease._drop_default_grants();",
            "{}",
            dir.display()
        );
    }
}

/// Each migration's `down.sql` drops exactly the functions its `up.sql`
/// creates, so that reverting one migration leaves none behind.
#[test]
fn each_down_migration_drops_exactly_what_its_up_migration_creates() {
    for dir in migration_dirs() {
        let up = std::fs::read_to_string(dir.join("up.sql")).expect("up.sql");
        let down = std::fs::read_to_string(dir.join("down.sql")).expect("down.sql");
        let created: BTreeSet<String> = function_bodies(&up)
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        let dropped: BTreeSet<String> = down
            .lines()
            .filter_map(|line| line.trim().strip_prefix("DROP FUNCTION IF EXISTS lease."))
            .map(|rest| rest.split('(').next().unwrap_or(rest).to_owned())
            .collect();
        assert_eq!(created, dropped, "{}", dir.display());
    }
}

/// Every migration and every file of functions sets the install's lock
/// bound, so a blocked install fails within it and changes nothing.
#[test]
fn each_migration_sets_the_installs_lock_bound() {
    let secs = leasehold::admin::INSTALL_LOCK_TIMEOUT.as_secs();
    let bound = format!("SET LOCAL lock_timeout = '{secs}s';");
    for (path, text) in sql_sources() {
        assert!(
            text.lines().any(|line| line.trim() == bound),
            "{} does not set the install's lock bound",
            path.display()
        );
    }
}

/// A file of functions creates functions only with `CREATE OR REPLACE`
/// (so applying it again is allowed) and no table, index or column; no
/// migration creates a function but the migrations' own tool.
#[test]
fn functions_live_in_the_files_of_functions_only() {
    use leasehold::__private::sql_files::{FUNCTION_SQL, MIGRATION_SQL};
    let leads = [
        "CREATE FUNCTION",
        "CREATE TABLE",
        "CREATE INDEX",
        "ALTER TABLE",
    ];
    for (name, text) in FUNCTION_SQL {
        for line in text.lines() {
            let upper = line.trim_start().to_ascii_uppercase();
            assert!(
                !leads.iter().any(|lead| upper.starts_with(lead)),
                "{name}: {line}"
            );
        }
    }
    for (dir, up, _) in MIGRATION_SQL {
        for line in up.lines() {
            let upper = line.trim_start().to_ascii_uppercase();
            if upper.starts_with("CREATE FUNCTION") || upper.starts_with("CREATE OR REPLACE") {
                assert!(
                    line.contains("lease._drop_default_grants()"),
                    "{dir} creates a function; functions belong in sql/functions/: {line}"
                );
            }
        }
    }
}

/// Migration 1 seeds the lineage with the timeline expression of
/// `lease._timeline()`, which does not exist yet when it runs.
#[test]
fn the_lineage_seed_uses_the_timeline_rule() {
    use leasehold::__private::sql_files::{FUNCTION_SQL, MIGRATION_SQL};
    let rules = FUNCTION_SQL[0].1;
    let at = rules
        .find("CREATE OR REPLACE FUNCTION lease._timeline()")
        .expect("01_rules.sql defines lease._timeline()");
    let body = &rules[at..];
    let body = &body[body.find("SELECT CASE").expect("its body")..];
    let body = &body[..body.find("\n$$;").expect("its end")];
    let body = body.trim_start_matches("SELECT ");
    assert!(
        MIGRATION_SQL[0]
            .1
            .contains(&format!("FROM (SELECT {body} AS timeline) AS t;")),
        "migration 1's lineage seed no longer computes the timeline as lease._timeline() does"
    );
}

/// The bounds of a span are exact, by the clock: a ttl or wait of exactly
/// `lease._max_span()` (100 years) from now is accepted, one microsecond
/// more is refused, and a wait of zero is accepted while a ttl of zero is
/// refused; each through the entry point, so that a change to the rule
/// itself (not only to a shortcut) is seen.
#[test]
fn the_bounds_of_a_span_are_exact() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let accepted = |conn: &mut diesel::PgConnection, sql: &str| sqlstate_of(conn, sql) == "00000";
    assert!(accepted(
        &mut conn,
        "SELECT * FROM lease.acquire('span/a', 'o', interval '100 years')"
    ));
    assert!(!accepted(
        &mut conn,
        "SELECT * FROM lease.acquire('span/b', 'o', interval '100 years 1 microsecond')"
    ));
    assert!(accepted(
        &mut conn,
        "SELECT * FROM lease.acquire('span/c', 'o', interval '1 minute', interval '100 years')"
    ));
    assert!(!accepted(
        &mut conn,
        "SELECT * FROM lease.acquire('span/d', 'o', interval '1 minute', interval '100 years 1 microsecond')"
    ));
    assert!(accepted(
        &mut conn,
        "SELECT * FROM lease.acquire('span/e', 'o', interval '1 minute', interval '0')"
    ));
    assert!(!accepted(
        &mut conn,
        "SELECT * FROM lease.acquire('span/f', 'o', interval '0')"
    ));
}

/// The lineage row one server checked is what lets a grant skip the full
/// generation check (docs/SPECIFICATION.md §1.7). A row this server has not
/// checked (written by a server before a restart, a standby's replayed
/// copy, a dump from another cluster: here, a start time from long ago)
/// sends the next grant to `lease._generation`, which records this
/// server's start time, so the grants after it take the common path again;
/// the epochs do not move for it.
#[test]
fn a_lineage_row_this_server_has_not_checked_is_checked_and_recorded_by_the_next_grant() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let checked = |conn: &mut diesel::PgConnection| {
        query_bool(
            conn,
            "SELECT checked_start = pg_postmaster_start_time() AS flag FROM lease.lineage",
        )
    };
    assert!(checked(&mut conn));
    conn.batch_execute(
        "UPDATE lease.lineage SET checked_start = timestamptz '2000-01-01 00:00:00+00'",
    )
    .unwrap_or_else(|error| panic!("age the lineage row: {error}"));
    assert!(!checked(&mut conn));
    let lease = granted(conn.acquire("lineage/a", "o", TTL).unwrap());
    assert_eq!(lease.epoch(), 1, "no new generation for the same server");
    assert!(checked(&mut conn), "the grant recorded this server's start");
    let next = granted(conn.acquire("lineage/b", "o", TTL).unwrap());
    assert_eq!(next.epoch(), 1);
}

/// What `call` does to table `lease.<table>`, counted by the server in one
/// transaction (`pg_stat_xact_user_tables`): "N reads, M writes", reads
/// being its scans and writes the rows it updated.
fn reads_and_writes(
    conn: &mut diesel::PgConnection,
    table: &str,
    call: impl FnOnce(&mut diesel::PgConnection),
) -> String {
    let counts = format!(
        "SELECT format('%s %s', COALESCE(seq_scan, 0) + COALESCE(idx_scan, 0), n_tup_upd) AS line
           FROM pg_stat_xact_user_tables WHERE schemaname = 'lease' AND relname = '{table}'"
    );
    let parse = |text: String| -> Vec<i64> {
        text.split(' ')
            .map(|n| n.parse().expect("a count"))
            .collect()
    };
    conn.batch_execute("BEGIN").expect("begin");
    let before = parse(query_lines(conn, &counts).remove(0));
    call(conn);
    let after = parse(query_lines(conn, &counts).remove(0));
    conn.batch_execute("COMMIT").expect("commit");
    format!(
        "{} reads, {} writes",
        after[0] - before[0],
        after[1] - before[1]
    )
}

/// Once this server's start is recorded in the lineage row, a first grant
/// only reads the row, once (its generation and the prune watermark its
/// insert starts the counter above, in the insert itself), with no locking
/// read to record what is recorded already. Counted by the server
/// (`pg_stat_xact_user_tables`, scans of `lease.lineage`); the control is
/// the same grant while the row is not recorded: that read finds no
/// current row, and the settling step reads it, takes the locking read and
/// the update (a scan of its own) and writes once.
#[test]
fn a_first_grant_only_reads_a_lineage_row_that_is_recorded() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lineage_use = |conn: &mut diesel::PgConnection, key: &str| -> String {
        reads_and_writes(conn, "lineage", |conn| {
            granted(conn.acquire(key, "o", TTL).unwrap());
        })
    };
    granted(conn.acquire("lineage/warm", "o", TTL).unwrap());
    let recorded = lineage_use(&mut conn, "lineage/recorded");
    conn.batch_execute("UPDATE lease.lineage SET checked_start = '2000-01-01 00:00:00+00'")
        .expect("age the row's start");
    let unrecorded = lineage_use(&mut conn, "lineage/unrecorded");
    assert_eq!(
        (recorded.as_str(), unrecorded.as_str()),
        ("1 reads, 0 writes", "5 reads, 1 writes")
    );
}

/// Recording this server's start in the lineage row never waits
/// (docs/SPECIFICATION.md §1.7): the generation does not depend on it, so
/// a grant whose recording finds the row locked by another transaction
/// that is recording it too skips the write and is granted at once. Were
/// it to wait, the grant would sit behind an unrelated open transaction;
/// lock_timeout would fail it instead of hanging the test.
#[test]
fn recording_the_servers_start_never_waits_for_a_transaction_recording_it_too() {
    let db = TestDb::new();
    let mut first = db.conn();
    let mut second = db.conn();
    let mut observer = db.conn();
    let checked = |conn: &mut diesel::PgConnection| {
        query_bool(
            conn,
            "SELECT checked_start = pg_postmaster_start_time() AS flag FROM lease.lineage",
        )
    };
    observer
        .batch_execute(
            "UPDATE lease.lineage SET checked_start = timestamptz '2000-01-01 00:00:00+00'",
        )
        .unwrap_or_else(|error| panic!("age the lineage row: {error}"));
    first.batch_execute("BEGIN").expect("begin");
    let held = granted(first.acquire("lineage/a", "o", TTL).unwrap());
    assert_eq!(held.epoch(), 1);
    assert!(
        !checked(&mut observer),
        "the first grant's recording is not committed yet"
    );
    second
        .batch_execute("SET lock_timeout = '10s'")
        .expect("set lock_timeout");
    let other = second
        .acquire("lineage/b", "o", TTL)
        .unwrap_or_else(|error| panic!("a grant waited for the lineage row: {error}"));
    assert_eq!(granted(other).epoch(), 1);
    first.batch_execute("COMMIT").expect("commit");
    assert!(checked(&mut observer), "the first grant recorded the start");
}

/// Sets the session's time zone (for the current transaction only, with
/// `local`) to the POSIX zone that `zone_sql` computes (one row, column
/// `line`) and returns it. The zone tests below build zones whose clocks
/// change at a moment relative to the server's clock, so that a span's
/// effect differs from its ordering today, whatever the date.
fn enter_posix_zone(conn: &mut diesel::PgConnection, zone_sql: &str, local: bool) -> String {
    let zone = query_lines(conn, zone_sql).remove(0);
    let scope = if local { "LOCAL " } else { "" };
    conn.batch_execute(&format!("SET {scope}TimeZone = '{zone}'"))
        .expect("set the time zone");
    zone
}

/// A span is judged by the time it adds in the session's time zone, not by
/// interval ordering (docs/SPECIFICATION.md §1.3): where the clocks went
/// back within the last day, `-1 day +24 hours +1 microsecond` orders as
/// one microsecond but moves the clock back an hour. The session here
/// uses a POSIX time zone whose summer time ended twelve hours ago, so the
/// day just past was 25 hours long. The ttl is refused, the shortcut that
/// skips the rule for plain spans does not take it, and the wait of the
/// same span is refused too; a lease call refuses it and grants nothing.
#[test]
fn a_span_is_judged_by_the_clock_it_moves_where_the_clocks_went_back() {
    let db = TestDb::new();
    let mut conn = db.conn();
    // Summer time (one hour ahead) from the start of the year until the
    // hour twelve hours ago, given as the summer clock reads it.
    let zone = enter_posix_zone(
        &mut conn,
        "SELECT format('LHS0LHD-1,0/0,%s/%s', extract(doy FROM e)::int - 1,
                       greatest(extract(hour FROM e)::int, CASE WHEN extract(doy FROM e) = 1 THEN 1 ELSE 0 END)) AS line
           FROM (SELECT date_trunc('hour', (now() AT TIME ZONE 'UTC') - interval '12 hours')
                        + interval '1 hour' AS e) AS t",
        false,
    );
    let day = query_lines(
        &mut conn,
        "SELECT (extract(epoch FROM now() - (now() - interval '1 day')) / 3600)::int::text AS line",
    );
    assert_eq!(day, ["25"], "hours in the day just past in {}", zone);
    let span = "interval '-1 day +24 hours +1 microsecond'";
    let answers = query_lines(
        &mut conn,
        &format!(
            "SELECT format('%s %s %s %s %s', lease._span_effect({span}),
                           lease._plain_span_within({span}, interval '0'),
                           lease._ttl_ok({span}), lease._wait_ok({span}),
                           array_to_string(lease._ttl_violations({span}), ',')) AS line"
        ),
    );
    assert_eq!(
        answers,
        ["negative f f f ttl must be positive"],
        "in {}",
        zone
    );
    assert_eq!(
        sqlstate_of(
            &mut conn,
            &format!("SELECT * FROM lease.acquire('zone/a', 'o', {span})")
        ),
        "22023"
    );
    assert_eq!(
        query_lines(&mut conn, "SELECT count(*)::text AS line FROM lease.leases"),
        ["0"]
    );
}

/// The same rule for months: in a session whose time zone moves its
/// clocks ahead by 167 hours two days from now (a POSIX zone; real ones
/// move an hour, the rule is the same), the month ahead is 577 hours long,
/// so `1 mon -720 hours +1 microsecond`, which orders as one microsecond,
/// moves the clock back. The ttl is refused and the shortcut does not take
/// it; `1 mon -720 hours`, which orders as zero, is refused as a wait. (A
/// span of whole years cannot be told apart this way: a zone's rules
/// repeat every year, so a year ahead is never shorter than 360 days.)
#[test]
fn a_month_is_judged_by_the_clock_it_moves_where_the_clocks_jump_ahead() {
    let db = TestDb::new();
    let mut conn = db.conn();
    // Summer time, 167 hours ahead, from two days from now for 58 days.
    let zone = enter_posix_zone(
        &mut conn,
        "SELECT format('LHS0LHD-167,%s/0,%s/0', (extract(doy FROM d)::int + 1) % 365,
                       (extract(doy FROM d)::int + 59) % 365) AS line
           FROM (SELECT now() AT TIME ZONE 'UTC' AS d) AS t",
        false,
    );
    let month = query_lines(
        &mut conn,
        "SELECT (extract(epoch FROM (now() + interval '1 mon') - now()) / 3600)::int::text AS line",
    );
    let hours: i64 = month[0].parse().expect("hours");
    assert!(hours < 720, "the month ahead in {} has {hours} hours", zone);
    let span = "interval '1 mon -720 hours +1 microsecond'";
    let answers = query_lines(
        &mut conn,
        &format!(
            "SELECT format('%s %s %s %s', lease._span_effect({span}),
                           lease._plain_span_within({span}, interval '0'),
                           lease._ttl_ok({span}),
                           array_to_string(lease._ttl_violations({span}), ',')) AS line"
        ),
    );
    assert_eq!(
        answers,
        ["negative f f ttl must be positive"],
        "in {}",
        zone
    );
    assert_eq!(
        sqlstate_of(
            &mut conn,
            &format!("SELECT * FROM lease.acquire('zone/m', 'o', {span})")
        ),
        "22023"
    );
    // A month less 720 hours orders as zero, the shortcut's zero wait, yet
    // moves the clock back here: refused as a wait.
    let zero = "interval '1 mon -720 hours'";
    assert_eq!(
        query_lines(
            &mut conn,
            &format!(
                "SELECT format('%s %s', lease._span_effect({zero}), lease._wait_ok({zero})) AS line"
            ),
        ),
        ["negative f"],
        "in {}",
        zone
    );
}

/// A wait of zero is judged the same way: where the clocks jump an hour
/// ahead within the next day (a POSIX zone whose summer time starts twelve
/// hours from now), `1 day -24 hours`, which orders as zero, moves the
/// clock back an hour, so it is refused as a wait, by the shortcut for
/// zero waits as by the rule, and a lease call with it grants nothing.
#[test]
fn a_zero_wait_is_judged_by_the_clock_it_moves_where_the_clocks_jump_ahead() {
    let db = TestDb::new();
    let mut conn = db.conn();
    // Summer time, an hour ahead, from the hour twelve hours from now for
    // thirty days.
    let zone = enter_posix_zone(
        &mut conn,
        "SELECT format('LHS0LHD-1,%s/%s,%s/0', extract(doy FROM s)::int - 1,
                       extract(hour FROM s)::int, (extract(doy FROM s)::int + 29) % 365) AS line
           FROM (SELECT date_trunc('hour', (now() AT TIME ZONE 'UTC') + interval '12 hours') AS s) AS t",
        false,
    );
    let day = query_lines(
        &mut conn,
        "SELECT (extract(epoch FROM (now() + interval '1 day') - now()) / 3600)::int::text AS line",
    );
    assert_eq!(day, ["23"], "hours in the day ahead in {}", zone);
    let span = "interval '1 day -24 hours'";
    let answers = query_lines(
        &mut conn,
        &format!(
            "SELECT format('%s %s %s', lease._span_effect({span}), lease._wait_ok({span}),
                           array_to_string(lease._wait_violations({span}), ',')) AS line"
        ),
    );
    assert_eq!(
        answers,
        ["negative f wait must not be negative"],
        "in {}",
        zone
    );
    assert_eq!(
        sqlstate_of(
            &mut conn,
            &format!("SELECT * FROM lease.acquire('zone/w', 'o', interval '1 minute', {span})")
        ),
        "22023"
    );
    assert_eq!(
        query_lines(&mut conn, "SELECT count(*)::text AS line FROM lease.leases"),
        ["0"]
    );
}

/// A span is judged from the clock at the call, not from the start of the
/// caller's transaction: a transaction begins, its session's time zone
/// (POSIX) jumps an hour ahead two seconds later, and once the clock has
/// passed the jump, `1 day -24 hours` adds nothing to the clock (the day
/// ahead of the call is 24 hours long) although the day ahead of the
/// transaction's start was 23. So it is a valid wait, and a lease call
/// with it is granted.
#[test]
fn a_span_is_judged_from_the_clock_at_the_call_not_the_transactions_start() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.batch_execute("BEGIN").expect("begin");
    let zone = enter_posix_zone(
        &mut conn,
        "SELECT format('LHS0LHD-1,%s/%s,%s/0', extract(doy FROM t)::int - 1, to_char(t, 'HH24:MI:SS'),
                       (extract(doy FROM t)::int + 29) % 365) AS line
           FROM (SELECT date_trunc('second', now() AT TIME ZONE 'UTC') + interval '2 seconds' AS t) AS x",
        true,
    );
    let jumped = || {
        "SELECT (extract(epoch FROM (clock_timestamp() + interval '1 day') - clock_timestamp()) / 3600)::int::text AS line"
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while query_lines(&mut conn, jumped()) != ["24"] {
        assert!(
            std::time::Instant::now() < deadline,
            "the clocks of {} never jumped",
            zone
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let span = "interval '1 day -24 hours'";
    assert_eq!(
        query_lines(
            &mut conn,
            &format!(
                "SELECT format('%s %s %s', (extract(epoch FROM (now() + interval '1 day') - now()) / 3600)::int,
                               lease._span_effect({span}), lease._wait_ok({span})) AS line"
            ),
        ),
        ["23 zero t"],
        "in {}",
        zone
    );
    assert_eq!(
        sqlstate_of(
            &mut conn,
            &format!("SELECT * FROM lease.acquire('zone/c', 'o', interval '1 minute', {span})")
        ),
        "00000"
    );
    conn.batch_execute("COMMIT").expect("commit");
}

/// The generation never goes back: should the lineage row name a later
/// timeline than the server's own (a row copied from elsewhere, an
/// operator's edit), the generation is that of the later timeline, and a
/// first grant starts above it.
#[test]
fn a_lineage_row_naming_a_later_timeline_never_lowers_the_generation() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.batch_execute("UPDATE lease.lineage SET last_timeline = lease._timeline() + 2")
        .expect("move the row's timeline ahead");
    let expected = query_lines(
        &mut conn,
        "SELECT (base + last_timeline - 1)::text AS line FROM lease.lineage",
    );
    assert_eq!(
        query_lines(
            &mut conn,
            "SELECT generation::text AS line FROM lease.generation()"
        ),
        expected
    );
    let epoch = query_lines(
        &mut conn,
        "SELECT epoch::text AS line FROM lease.acquire('later/a', 'o', interval '1 minute')",
    );
    let floor: i64 = expected[0].parse::<i64>().expect("generation") << 40;
    assert!(
        epoch[0].parse::<i64>().expect("epoch") > floor,
        "epoch {epoch:?} not above generation {expected:?}"
    );
}

/// A new lineage (a dump restored into another cluster, here the lineage
/// row given another system identifier and, as a restored row has, another
/// server's start time: see `lease.lineage.checked_start`) is started once, by the first
/// grant, one generation above the old; every later grant stays in that
/// generation (docs/SPECIFICATION.md §1.7): `lease.generation` reports it
/// before and after the first grant, and another key's first grant and
/// the old key's next grant are in it too.
#[test]
fn a_new_lineage_keeps_the_generation_its_first_grant_started() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let old = granted(conn.acquire("lineage/old", "o", TTL).unwrap());
    assert_eq!(old.epoch(), 1);
    assert_eq!(conn.release(&old).unwrap(), leasehold::Release::Released);
    conn.batch_execute(
        "UPDATE lease.lineage SET system_identifier = 1, checked_start = '2000-01-01 00:00:00+00'",
    )
    .expect("give the lineage row another cluster's identifier");
    assert_eq!(conn.generation().unwrap().generation, 1, "the next grant's");
    let first = granted(conn.acquire("lineage/a", "o", TTL).unwrap());
    assert_eq!(first.epoch(), (1 << 40) + 1);
    assert_eq!(conn.generation().unwrap().generation, 1, "after the first");
    let second = granted(conn.acquire("lineage/b", "o", TTL).unwrap());
    assert_eq!(second.epoch(), (1 << 40) + 1);
    let again = granted(conn.acquire("lineage/old", "o", TTL).unwrap());
    assert_eq!(again.epoch(), (1 << 40) + 1);
}

/// `lease.generation` (what a standby can call) writes and locks nothing:
/// even when the lineage row has not recorded this server's start, it
/// answers inside a read-only transaction and leaves the row as it was.
#[test]
fn the_generation_is_read_without_writing_even_when_the_row_is_not_checked() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.batch_execute("UPDATE lease.lineage SET checked_start = '2000-01-01 00:00:00+00'")
        .expect("age the row's start");
    conn.batch_execute("BEGIN READ ONLY").expect("begin");
    let read = conn.batch_execute("SELECT * FROM lease.generation()");
    assert!(read.is_ok(), "in a read-only transaction: {read:?}");
    conn.batch_execute("COMMIT").expect("commit");
    assert_eq!(
        query_lines(
            &mut conn,
            "SELECT checked_start::text AS line FROM lease.lineage"
        ),
        ["2000-01-01 00:00:00+00"]
    );
}

/// The common denial reads the key's row once and writes nothing: another
/// owner's live grant, read under READ COMMITTED, is the answer, with no
/// attempt to update the row (which would read it twice more, in a
/// subtransaction, before finding it live). Counted by the server
/// (`pg_stat_xact_user_tables`, scans of `lease.leases` and rows updated
/// in the transaction); the control is the grant of the same key once it
/// is free, which reads it to find it free, then locks and updates it.
#[test]
fn the_common_denial_reads_the_keys_row_once_and_writes_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let mut other = db.conn();
    let held = granted(other.acquire("denial/held", "a", TTL).unwrap());
    let leases_use = |conn: &mut diesel::PgConnection| -> String {
        reads_and_writes(conn, "leases", |conn| {
            conn.batch_execute("SELECT * FROM lease.acquire('denial/held', 'b', interval '1 min')")
                .expect("the call");
        })
    };
    let denied = leases_use(&mut conn);
    assert_eq!(other.release(&held).unwrap(), leasehold::Release::Released);
    let granted_after = leases_use(&mut conn);
    assert_eq!(
        (denied.as_str(), granted_after.as_str()),
        ("1 reads, 0 writes", "3 reads, 1 writes")
    );
}

/// The common grant and the common denial take the first step of an
/// attempt and never the settling step (docs/SPECIFICATION.md §1.3, "How
/// an attempt settles the key"): the speed of the common path rests on
/// it, and a shortcut whose conditions the settling step repeats answers
/// the same either way, so only the count of settling calls tells a
/// shortcut that works from one that never fires. Counted by the server
/// (`track_functions`, superuser; `pg_stat_get_xact_function_calls` reads
/// the session's counts not yet flushed, which may span its earlier
/// transactions, so each count is of every call so far): a FREE key with
/// a row, a LAPSED key, another owner's live grant under READ COMMITTED
/// and a never-seen key (its first grant) settle nothing; the caller's
/// own live grant (the control, last) takes the settling step once.
#[test]
fn the_common_grant_and_denial_never_take_the_settling_step() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let mut other = db.conn();
    conn.batch_execute("SET track_functions = 'all'")
        .expect("count function calls (superuser)");
    let released = granted(other.acquire("common/free", "a", TTL).unwrap());
    assert_eq!(
        other.release(&released).unwrap(),
        leasehold::Release::Released
    );
    granted(other.acquire("common/lapsed", "a", TTL).unwrap());
    other
        .batch_execute(
            "UPDATE lease.leases SET expires_at = clock_timestamp() - interval '1 hour'
              WHERE key = 'common/lapsed'",
        )
        .expect("lapse the grant");
    granted(other.acquire("common/held", "a", TTL).unwrap());
    let settling_calls = |conn: &mut diesel::PgConnection, call: &str| -> String {
        conn.batch_execute("BEGIN").expect("begin");
        conn.batch_execute(call).expect("the call");
        let counted = query_lines(
            conn,
            "SELECT COALESCE(pg_stat_get_xact_function_calls(
                        'lease._acquire_settle(bytea, text, text, interval, interval)'::regprocedure),
                    0)::text AS line",
        );
        conn.batch_execute("COMMIT").expect("commit");
        format!("{call}: {}", counted[0])
    };
    let acquire =
        |key: &str| format!("SELECT * FROM lease.acquire('{key}', 'b', interval '1 min')");
    let counts: Vec<String> = [
        "common/free",
        "common/lapsed",
        "common/held",
        "common/new",
        "common/new",
    ]
    .iter()
    .map(|key| settling_calls(&mut conn, &acquire(key)))
    .collect();
    assert_eq!(
        counts,
        [
            format!("{}: 0", acquire("common/free")),
            format!("{}: 0", acquire("common/lapsed")),
            format!("{}: 0", acquire("common/held")),
            format!("{}: 0", acquire("common/new")),
            format!("{}: 1", acquire("common/new")),
        ]
    );
    assert_eq!(
        query_lines(
            &mut conn,
            "SELECT string_agg(key || '=' || owner, ',' ORDER BY key) AS line FROM lease.leases"
        ),
        ["common/free=b,common/held=a,common/lapsed=b,common/new=b"]
    );
}

/// The helpers written to be inlined are inlined where the common paths
/// call them: a grant or a release with nobody waiting runs no statement
/// and no function call for its wake-up (`lease._on_change` inlined; its
/// look-up, `lease._notify_change`, not called), and the lock bound of
/// a never-seen key's first grant is an expression, not a SQL function
/// parsed and planned at every call (`lease._lock_budget`). Counted by
/// the server (`track_functions = 'all'` counts a SQL function's calls
/// only when it runs as a call, not inlined); a registered waiter (the
/// control) makes the release, and the next grant, call the look-up and
/// notify.
#[test]
fn the_wake_up_and_the_lock_bound_are_inlined_on_the_common_paths() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.batch_execute("SET track_functions = 'all'")
        .expect("count function calls (superuser)");
    let calls = |conn: &mut diesel::PgConnection, call: &str| -> String {
        conn.batch_execute("BEGIN").expect("begin");
        conn.batch_execute(call).expect("the call");
        let counted = query_lines(
            conn,
            "SELECT string_agg(f || '=' || COALESCE(pg_stat_get_xact_function_calls(f::regprocedure), 0), ' '
                               ORDER BY f) AS line
               FROM unnest(ARRAY['lease._lock_budget(interval)', 'lease._on_change(bytea, text)',
                                 'lease._notify_change(bytea, text, boolean)']) AS f",
        );
        conn.batch_execute("COMMIT").expect("commit");
        format!("{call}: {}", counted[0])
    };
    let acquire = "SELECT * FROM lease.acquire('inline/new', 'a', interval '1 min')";
    let epoch = |conn: &mut diesel::PgConnection| {
        query_lines(
            conn,
            "SELECT epoch::text AS line FROM lease.leases WHERE key = 'inline/new'",
        )
        .remove(0)
    };
    let counts_of = |calls_so_far: [u32; 3]| {
        format!(
            "lease._lock_budget(interval)={} lease._notify_change(bytea, text, boolean)={} lease._on_change(bytea, text)={}",
            calls_so_far[0], calls_so_far[1], calls_so_far[2]
        )
    };
    assert_eq!(
        calls(&mut conn, acquire),
        format!("{acquire}: {}", counts_of([0, 0, 0]))
    );
    let release = format!(
        "SELECT status FROM lease.release('inline/new', 'a', {})",
        epoch(&mut conn)
    );
    assert_eq!(
        calls(&mut conn, &release),
        format!("{release}: {}", counts_of([0, 0, 0]))
    );
    // The control: a waiter registered on the key, so the next release
    // looks it up.
    assert_eq!(
        calls(&mut conn, acquire),
        format!("{acquire}: {}", counts_of([0, 0, 0]))
    );
    let mut waiter = db.conn();
    waiter
        .batch_execute("SELECT lease._waiter_watch('inline/new')")
        .expect("register a waiter (superuser)");
    let release = format!(
        "SELECT status FROM lease.release('inline/new', 'a', {})",
        epoch(&mut conn)
    );
    assert_eq!(
        calls(&mut conn, &release),
        format!("{release}: {}", counts_of([0, 1, 0]))
    );
    // A session's counts include its calls not yet sent to the statistics
    // system, so the grant is counted on a new session.
    let mut fresh = db.conn();
    fresh
        .batch_execute("SET track_functions = 'all'")
        .expect("count function calls (superuser)");
    assert_eq!(
        calls(&mut fresh, acquire),
        format!("{acquire}: {}", counts_of([0, 1, 0]))
    );
}

/// Every path of `lease.acquire` puts the caller's lock_timeout back: the
/// common grant, a first grant (one INSERT), the settling step (here the
/// caller's own grant), and a first grant that waited for another
/// session's first grant of the same key until that one rolled back. The
/// first grant and the settling step bound their lock waits by setting
/// lock_timeout for the rest of the call; left set, the caller's next
/// statements would give up on their locks early.
#[test]
fn acquire_puts_the_callers_lock_timeout_back_on_every_path() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let mut other = db.conn();
    let mut observer = db.conn();
    let released = granted(other.acquire("timeout/free", "a", TTL).unwrap());
    assert_eq!(
        other.release(&released).unwrap(),
        leasehold::Release::Released
    );
    granted(conn.acquire("timeout/own", "o", TTL).unwrap());
    let in_transaction = |conn: &mut diesel::PgConnection, call: &str| -> String {
        conn.batch_execute("BEGIN; SET LOCAL lock_timeout = '7s'")
            .expect("begin");
        let answer =
            query_lines(conn, &format!("SELECT acquired::text AS line FROM {call}")).remove(0);
        let setting = query_lines(conn, "SELECT current_setting('lock_timeout') AS line").remove(0);
        conn.batch_execute("COMMIT").expect("commit");
        format!("{call}: acquired {answer}, lock_timeout {setting}")
    };
    let calls = [
        "lease.acquire('timeout/free', 'o', interval '1 min')",
        "lease.acquire('timeout/new', 'o', interval '1 min')",
        "lease.acquire('timeout/own', 'o', interval '1 min')",
    ];
    for call in calls {
        assert_eq!(
            in_transaction(&mut conn, call),
            format!("{call}: acquired true, lock_timeout 7s")
        );
    }
    other
        .batch_execute(
            "BEGIN; SELECT * FROM lease.acquire('timeout/contended', 'x', interval '1 min')",
        )
        .expect("another session's first grant, not committed");
    let contended = "lease.acquire('timeout/contended', 'o', interval '1 min', interval '30 s')";
    let answer = std::thread::scope(|scope| {
        let waiting = scope.spawn(|| in_transaction(&mut conn, contended));
        wait_for_lock_waiter(&mut observer, &db.name);
        other
            .batch_execute("ROLLBACK")
            .expect("roll the other first grant back");
        waiting.join().expect("the waiting acquire")
    });
    assert_eq!(
        answer,
        format!("{contended}: acquired true, lock_timeout 7s")
    );
}

/// A call on one key (or one resource) reads that key's row (and that
/// resource's guard) through the primary key, never its way through other
/// rows of `lease.leases` or `lease.guards`, so it costs the same with a
/// million keys as with ten. A plan that scanned the lease table was found
/// once by profiling (docs/PERFORMANCE.md); and a look-up whose conditions
/// the digest already decides (`key_hash = $1 AND key = $2`) answers the
/// same when its two halves are joined by OR instead, so only the server's
/// count of rows read tells the two apart (`pg_stat_xact_user_tables`:
/// rows read by scans and fetched through indexes). The tables hold 3,000
/// other keys, a third of them grants in heartbeat groups (another index
/// can serve a look-up that went wrong), and 3,000 other resources,
/// analysed, so that no plan reads another row more cheaply than none.
#[test]
fn a_call_on_one_key_reads_no_other_keys_row() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.batch_execute(
        "INSERT INTO lease.leases (key, key_hash, owner, epoch, expires_at, first_epoch, group_id)
              SELECT 'filler/' || i, lease._key_hash('filler/' || i),
                     CASE WHEN i % 3 = 0 THEN 'filler' END, 1,
                     CASE WHEN i % 3 = 0 THEN clock_timestamp() + interval '1 hour' END, 1,
                     CASE WHEN i % 3 = 0 THEN -i END
                FROM generate_series(1, 3000) AS i;
         INSERT INTO lease.guards (resource, resource_hash, lease_key, accepted_epoch, updated_at)
              SELECT 'filler/' || i, lease._key_hash('filler/' || i), 'filler/' || i, 1, now()
                FROM generate_series(1, 3000) AS i;
         ANALYZE lease.leases, lease.guards;",
    )
    .expect("fill the tables");
    let mut epochs = std::collections::BTreeMap::new();
    for key in ["scan/held", "scan/grouped", "scan/forced", "scan/many"] {
        epochs.insert(
            key,
            i64::from(granted(conn.acquire(key, "a", TTL).unwrap()).epoch()),
        );
    }
    let (held, grouped, forced, many) = (
        epochs["scan/held"],
        epochs["scan/grouped"],
        epochs["scan/forced"],
        epochs["scan/many"],
    );
    let group = query_lines(
        &mut conn,
        &format!(
            "SELECT group_id::text AS line FROM lease.join_group(
                 ARRAY['scan/grouped'], 'a', ARRAY[{grouped}::bigint], interval '1 hour')"
        ),
    )
    .remove(0);
    // (how the transaction begins, the call, the SQLSTATE it ends with)
    let rc = "BEGIN";
    let rr = "BEGIN ISOLATION LEVEL REPEATABLE READ";
    let calls = [
        (rc, "lease.acquire('scan/new', 'b', interval '1 min')".to_string(), "00000"),
        (rc, "lease.acquire('scan/held', 'b', interval '1 min')".to_string(), "00000"),
        (rr, "lease.acquire('scan/held', 'b', interval '1 min')".to_string(), "00000"),
        (rc, format!("lease.renew('scan/held', 'a', {held}, interval '1 hour')"), "00000"),
        (rc, format!("lease.renew('scan/held', 'a', {}, interval '1 hour')", held + 1), "00000"),
        (rc, "lease.inspect('scan/held')".to_string(), "00000"),
        (rc, "lease.key_state('scan/held')".to_string(), "00000"),
        (rc, format!("lease.why_refused('scan/held', 'b', {held})"), "00000"),
        (rc, format!("lease.check_held('scan/held', 'a', {held})"), "00000"),
        (rc, format!("lease.admit('scan/resource', 'scan/held', {held})"), "00000"),
        (rc, format!("lease.admit('scan/resource', 'scan/new', {held})"), "22023"),
        (rc, format!("lease.admit_held('scan/resource', 'scan/held', 'a', {held})"), "00000"),
        (rc, format!("lease.renew_admit('scan/resource', 'scan/held', 'a', {held}, interval '1 hour')"), "00000"),
        (rc, format!("lease.fence('scan/fenced', 'scan/held', {held})"), "00000"),
        (rc, format!("lease.admit('scan/fenced', 'scan/held', {held})"), "55000"),
        (rc, "lease.fence('scan/resource', 'scan/new', 0)".to_string(), "22023"),
        (rc, "lease.inspect_guard('scan/resource')".to_string(), "00000"),
        (rc, format!("lease.renew_many(ARRAY['scan/held'], 'a', ARRAY[{held}::bigint], interval '1 hour')"), "00000"),
        (rc, format!("lease.renew_group({group}, 'a', interval '1 hour')"), "00000"),
        (rc, format!("lease.release('scan/grouped', 'a', {grouped})"), "00000"),
        (rc, format!("lease.release('scan/held', 'a', {held})"), "00000"),
        (rc, format!("lease.release_many(ARRAY['scan/many'], 'a', ARRAY[{many}::bigint])"), "00000"),
        (rc, format!("lease.force_release('scan/forced', {forced})"), "00000"),
        (rc, "lease.force_release('scan/new')".to_string(), "00000"),
    ];
    // The session's counts not yet flushed may span its earlier
    // transactions, so each call is judged by the difference it makes.
    let rows_read = |conn: &mut diesel::PgConnection| -> i64 {
        query_lines(
            conn,
            "SELECT COALESCE(sum(seq_tup_read + COALESCE(idx_tup_fetch, 0)), 0)::text AS line
               FROM pg_stat_xact_user_tables
              WHERE schemaname = 'lease' AND relname IN ('leases', 'guards')",
        )[0]
        .parse()
        .expect("a count")
    };
    let read: Vec<(String, String, i64)> = calls
        .iter()
        .map(|(begin, call, _)| {
            conn.batch_execute(begin).expect("begin");
            let before = rows_read(&mut conn);
            let sqlstate = sqlstate_of(&mut conn, &format!("SELECT * FROM {call}"));
            let after = rows_read(&mut conn);
            conn.batch_execute("COMMIT").expect("commit");
            (call.clone(), sqlstate, after - before)
        })
        .collect();
    let answers: Vec<(&str, &str)> = read
        .iter()
        .map(|(call, state, _)| (call.as_str(), state.as_str()))
        .collect();
    let expected: Vec<(&str, &str)> = calls
        .iter()
        .map(|(_, call, state)| (call.as_str(), *state))
        .collect();
    assert_eq!(answers, expected);
    let too_many: Vec<&(String, String, i64)> =
        read.iter().filter(|(_, _, rows)| *rows > 10).collect();
    assert!(
        too_many.is_empty(),
        "calls that read other rows: {too_many:?}"
    );
    assert_eq!(
        query_lines(
            &mut conn,
            "SELECT string_agg(key || '=' || COALESCE(owner, 'FREE'), ',' ORDER BY key) AS line
               FROM lease.leases WHERE key LIKE 'scan/%'"
        ),
        ["scan/forced=FREE,scan/grouped=FREE,scan/held=FREE,scan/many=FREE,scan/new=FREE"]
    );
}

/// Valid input never takes the full input check. Each function first asks
/// its shortcuts (`lease._name_ok`, `lease._ttl_ok`, an epoch's bounds)
/// and builds the list of violations only when one says no; the list is
/// what the error names, so a shortcut that says no to valid input
/// answers the same, only slower. The server counts the calls of
/// `lease._raise_invalid` (`track_functions`, superuser), which only the
/// full check makes: none for a call of each function at the edges of
/// what it accepts (epoch 1, `up_to` 0, a name of one byte and one of the
/// cap, a ttl of one microsecond, a wait of 0, a namespace prefix of 1024
/// bytes, a batch of 1,000 keys, a batch with its digests). The count of an aborted
/// call is discarded with it, so the control is the settling step of the
/// holder's second acquire of its own key (an idempotent success, which
/// settles), counted the same way: one call.
#[test]
fn valid_input_at_every_edge_never_takes_the_full_input_check() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.batch_execute("SET track_functions = 'all'")
        .expect("count function calls (superuser)");
    let long = "x".repeat(16 * 1024);
    let calls = [
        "SELECT * FROM lease.acquire('k', 'o', interval '1 min', interval '0')".to_string(),
        "SELECT * FROM lease.acquire('k', 'o', interval '1 min', interval '0')".to_string(),
        format!("SELECT * FROM lease.acquire('{long}', '{long}', interval '1 microsecond')"),
        "SELECT * FROM lease.renew('k', 'o', 1, interval '1 min')".to_string(),
        "SELECT * FROM lease.inspect('k')".to_string(),
        "SELECT lease.check_held('k', 'o', 1)".to_string(),
        "SELECT lease.admit('r', 'k', 1)".to_string(),
        "SELECT lease.admit_held('r', 'k', 'o', 1)".to_string(),
        "SELECT lease.renew_admit('r', 'k', 'o', 1, interval '1 min')".to_string(),
        "SELECT lease.fence('f', 'k', 0)".to_string(),
        "SELECT * FROM lease.inspect_guard('r')".to_string(),
        "SELECT * FROM lease.renew_many(ARRAY['k'], 'o', ARRAY[1::bigint], interval '1 min')"
            .to_string(),
        "SELECT * FROM lease.release('k', 'o', 1)".to_string(),
        "SELECT lease.bind_namespace(repeat('p', 1024), current_user)".to_string(),
        "SELECT * FROM lease.force_release('never-leased', 1)".to_string(),
        "SELECT * FROM lease.renew_many(ARRAY['k'], 'o', ARRAY[1::bigint], interval '1 min', ARRAY[lease._key_hash('k')])".to_string(),
        "SELECT count(*) FROM lease.renew_many(ARRAY(SELECT 'many/' || i FROM generate_series(1, 1000) AS i), 'o',
                                               ARRAY(SELECT 1::bigint FROM generate_series(1, 1000)), interval '1 min')".to_string(),
        "SELECT lease.force_release('never-leased')".to_string(),
    ];
    conn.batch_execute("BEGIN").expect("begin");
    for call in &calls {
        conn.batch_execute(call)
            .unwrap_or_else(|error| panic!("{call}: {error}"));
    }
    let counts = query_lines(
        &mut conn,
        "SELECT format('full checks %s, settling steps %s',
                   COALESCE(pg_stat_get_xact_function_calls('lease._raise_invalid(text, text[])'::regprocedure), 0),
                   COALESCE(pg_stat_get_xact_function_calls(
                       'lease._acquire_settle(bytea, text, text, interval, interval)'::regprocedure), 0)) AS line",
    );
    conn.batch_execute("COMMIT").expect("commit");
    assert_eq!(counts, ["full checks 0, settling steps 1"]);
}

/// A batch whose every grant matches is renewed, or released, by its first
/// pass: no key's answer is looked up alone (`lease._status`) and no
/// per-key input rule runs (`lease._check_many_keys`); those are the slow
/// path of a batch with a grant that does not match, which is the control:
/// one such renew and one such release of two keys take both.
#[test]
fn a_batch_whose_every_grant_matches_takes_one_pass() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.batch_execute(
        "SET track_functions = 'all';
         SELECT * FROM lease.acquire('a', 'o', interval '1 hour');
         SELECT * FROM lease.acquire('b', 'o', interval '1 hour');
         SELECT * FROM lease.acquire('c', 'o', interval '1 hour');
         SELECT * FROM lease.acquire('d', 'o', interval '1 hour');",
    )
    .expect("four first grants, epoch 1 each (superuser counts calls)");
    let counts = |conn: &mut diesel::PgConnection| {
        query_lines(
            conn,
            "SELECT format('answers looked up %s, per-key checks %s',
                       COALESCE(pg_stat_get_xact_function_calls(
                           'lease._status(bytea, text, text, bigint)'::regprocedure), 0),
                       COALESCE(pg_stat_get_xact_function_calls(
                           'lease._check_many_keys(text, text[], bigint[], bytea[])'::regprocedure), 0)) AS line",
        )
    };
    // One statement: renew the two grants, then release them (Append runs
    // the branches in order); the statuses of both, in that order.
    let renew_then_release = |conn: &mut diesel::PgConnection, keys: &str, epochs: &str| {
        query_lines(
            conn,
            &format!(
                "SELECT string_agg(status, ',') AS line FROM (
                     SELECT status FROM lease.renew_many({keys}, 'o', {epochs}, interval '1 hour')
                     UNION ALL
                     SELECT status FROM lease.release_many({keys}, 'o', {epochs})) AS s"
            ),
        )
    };
    conn.batch_execute("BEGIN").expect("begin");
    let matching = renew_then_release(&mut conn, "ARRAY['a', 'b']", "ARRAY[1, 1]::bigint[]");
    assert_eq!(matching, ["ok,ok,ok,ok"]);
    assert_eq!(counts(&mut conn), ["answers looked up 0, per-key checks 0"]);
    let one_off = renew_then_release(&mut conn, "ARRAY['c', 'd']", "ARRAY[1, 2]::bigint[]");
    assert_eq!(one_off, ["ok,epoch_mismatch,ok,epoch_mismatch"]);
    assert_eq!(counts(&mut conn), ["answers looked up 4, per-key checks 2"]);
    conn.batch_execute("COMMIT").expect("commit");
}
