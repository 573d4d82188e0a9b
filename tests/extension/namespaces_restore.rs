//! Namespace rules across a dump restored into ANOTHER cluster
//! (docs/PRIVILEGES.md, "Namespace rules in another cluster"): the roles
//! are recreated there by name, with new oids, and a rule must keep naming
//! its role, as PostgreSQL's own privileges do. The target cluster is a
//! second server of the same private installation; its first role,
//! `mallory`, is given the old oid of the rule's role (`pg_resetwal -o`),
//! and must gain nothing from it.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::process::Command;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use leasehold_local::{LocalPostgres, StopMode};

use super::privileges::{
    conn_as, conn_as_on, fresh_role, install_as_app, pg_restore_into, refused, Restore,
};
use super::{dump_tool, pg_dump_file, rows, server};

/// The oid of role `name` on `conn`'s cluster.
fn oid_of(conn: &mut PgConnection, name: &str) -> u32 {
    rows(
        conn,
        &format!("SELECT oid::text AS t FROM pg_roles WHERE rolname = '{name}'"),
    )[0]
    .parse()
    .unwrap()
}

/// A second cluster whose next oid is `next_oid`: a fresh server, stopped
/// before anything is created in it, `pg_resetwal -o`, started again (or,
/// without `pg_resetwal`, [`advance_oid_counter`]).
fn cluster_with_next_oid(next_oid: u32) -> LocalPostgres {
    let pg = LocalPostgres::builder()
        .bin_dir(server().pg.bin_dir())
        .durable(false)
        .start()
        .unwrap_or_else(|error| panic!("cannot start the target server: {error}"));
    if !pg.tool_path("pg_resetwal").exists() {
        advance_oid_counter(&pg, next_oid);
        return pg;
    }
    pg.stop(StopMode::Fast).unwrap();
    let mut resetwal = Command::new(pg.tool_path("pg_resetwal"));
    resetwal
        .arg("-o")
        .arg(next_oid.to_string())
        .arg("-D")
        .arg(pg.data_dir());
    // pg_resetwal refuses to run as root; the server runs as the data
    // directory's owner (leasehold-local), and so must it.
    let data = std::fs::metadata(pg.data_dir()).unwrap();
    if std::fs::metadata("/proc/self").unwrap().uid() != data.uid() {
        resetwal.uid(data.uid()).gid(data.gid());
    }
    let out = resetwal.output().unwrap();
    assert!(
        out.status.success(),
        "pg_resetwal: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    pg.restart().unwrap();
    pg
}

/// Moves the oid counter of a fresh, idle server to `next_oid`, for the
/// server-only trees of the version matrix, which carry no `pg_resetwal`:
/// large objects take their oids from the same counter, one after another,
/// so creating them up to `next_oid - 1` (and removing them) leaves
/// `next_oid` for the next object. Panics when the counter is already past.
fn advance_oid_counter(pg: &LocalPostgres, next_oid: u32) {
    let mut admin = PgConnection::establish(&pg.url()).unwrap();
    let mut last: u32 = rows(&mut admin, "SELECT lo_create(0)::text AS t")[0]
        .parse()
        .unwrap();
    assert!(
        last < next_oid,
        "the target's oid counter ({last}) is past {next_oid}"
    );
    while last + 1 < next_oid {
        let batch = (next_oid - last - 1).min(50_000);
        last = rows(
            &mut admin,
            &format!("SELECT max(lo_create(0))::text AS t FROM generate_series(1, {batch})"),
        )[0]
        .parse()
        .unwrap();
    }
    assert_eq!(last + 1, next_oid, "the oid counter moved unevenly");
    admin
        .batch_execute("SELECT count(lo_unlink(oid)) FROM pg_largeobject_metadata")
        .unwrap();
}

/// The statements of `pg_dumpall --globals-only` of the test server that
/// create `roles`, set their attributes and grant them to each other, with
/// the roles created in the reverse of the dump's order.
fn globals_of(roles: &[&str]) -> String {
    let out = Command::new(dump_tool("pg_dumpall"))
        .args(["--globals-only", "--no-role-passwords", "-d"])
        .arg(server().pg.url())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pg_dumpall: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump = String::from_utf8(out.stdout).unwrap();
    let ours = |word: &str| roles.contains(&word.trim_end_matches(';'));
    let (mut creates, mut rest) = (Vec::new(), Vec::new());
    for line in dump.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["CREATE", "ROLE", role, ..] if ours(role) => creates.push(line),
            ["ALTER", "ROLE", role, ..] if ours(role) => rest.push(line),
            ["GRANT", granted, "TO", grantee, ..] if ours(granted) && ours(grantee) => {
                rest.push(line)
            }
            _ => {}
        }
    }
    assert_eq!(creates.len(), roles.len(), "{dump}");
    creates.reverse();
    creates.extend(rest);
    creates.join("\n")
}

fn acquire(key: &str) -> String {
    format!("SELECT epoch::text AS t FROM lease.acquire('{key}', 'w', interval '5 minutes') WHERE acquired")
}

fn restored_rules_follow_role_names(use_extension: bool) {
    let alice = fresh_role("lh_alice");
    let bob = fresh_role("lh_bob");
    let ghost = fresh_role("lh_ghost");
    let db = super::database();
    let mut c = install_as_app(&db, use_extension);
    for (prefix, role) in [("team/", &alice), ("bob/", &bob), ("ghost/", &ghost)] {
        c.batch_execute(&format!(
            "SELECT lease.bind_namespace('{prefix}', '{role}')"
        ))
        .unwrap();
    }
    let epoch = rows(&mut conn_as(&db, &alice), &acquire("team/job"));
    assert_eq!(epoch.len(), 1, "alice holds team/job");
    let old_oid = oid_of(&mut super::conn(&db), &alice);
    let file = pg_dump_file(&db);

    // The target: mallory first (alice's old oid), then the dumped roles,
    // in another order; `ghost` is not recreated.
    let target = cluster_with_next_oid(old_oid);
    let mut admin = PgConnection::establish(&target.url()).unwrap();
    admin.batch_execute("CREATE ROLE mallory LOGIN").unwrap();
    assert_eq!(oid_of(&mut admin, "mallory"), old_oid);
    admin
        .batch_execute(&globals_of(&["app", &alice, &bob]))
        .unwrap();
    assert_ne!(oid_of(&mut admin, &alice), old_oid);
    admin.batch_execute("CREATE DATABASE restored").unwrap();
    admin
        .batch_execute("GRANT CREATE ON DATABASE restored TO app")
        .unwrap();
    // The extension is restored as its owner, a migrations install by the
    // superuser (as tests/extension/main.rs's dump tests do).
    let how = if use_extension {
        Restore::AsOwner
    } else {
        Restore::Plain
    };
    pg_restore_into(&target, "restored", &file, how);
    let as_role = |role: &str| conn_as_on(&target, "restored", role);

    // Every rule names the role it named; the one whose role is missing
    // here says so.
    assert_eq!(
        rows(
            &mut as_role("app"),
            "SELECT prefix || ' ' || role AS t FROM lease.list_namespaces()"
        ),
        [
            format!("bob/ {bob}"),
            format!("ghost/ pg_missing_role({ghost})"),
            format!("team/ {alice}"),
        ]
    );
    // mallory, with alice's old oid, gains nothing.
    let message = refused(&mut as_role("mallory"), &acquire("team/m"));
    assert!(message.contains("may not act on"), "{message}");
    // alice keeps her key, with her epoch, and her prefix.
    let mut a = as_role(&alice);
    assert_eq!(
        rows(
            &mut a,
            &format!(
                "SELECT status AS t FROM lease.renew('team/job', 'w', {}, interval '5 minutes')",
                epoch[0]
            )
        ),
        ["ok"]
    );
    assert_eq!(rows(&mut a, &acquire("team/next")).len(), 1);
    assert_eq!(
        rows(
            &mut a,
            &format!(
                "SELECT status AS t FROM lease.release('team/job', 'w', {})",
                epoch[0]
            )
        ),
        ["ok"]
    );
    // The missing role's rule admits nobody but superusers.
    for role in ["app", "mallory", alice.as_str()] {
        let message = refused(&mut as_role(role), &acquire("ghost/x"));
        assert!(message.contains("may not act on"), "{role}: {message}");
    }
    let mut superuser = PgConnection::establish(&target.url_for("restored")).unwrap();
    assert_eq!(rows(&mut superuser, &acquire("ghost/x")).len(), 1);

    // alice's grants started this cluster's lineage, which pinned every
    // rule whose role exists here to that role's oid here: from now on a
    // role dropped and created again fails closed, as in one cluster.
    assert_eq!(
        rows(
            &mut superuser,
            "SELECT prefix || ' ' || COALESCE(role_oid = (SELECT oid FROM pg_roles WHERE rolname = role_name), false)::text \
                    || ' ' || (system_identifier = (pg_control_system()).system_identifier)::text AS t \
               FROM lease.namespaces ORDER BY prefix"
        ),
        ["bob/ true true", "ghost/ false false", "team/ true true"]
    );
    admin
        .batch_execute(&format!("DROP ROLE {bob}; CREATE ROLE {bob} LOGIN"))
        .unwrap();
    let message = refused(&mut as_role(&bob), &acquire("bob/x"));
    assert!(message.contains("may not act on"), "{message}");
    assert!(rows(
        &mut as_role("app"),
        "SELECT role AS t FROM lease.list_namespaces() WHERE prefix = 'bob/'"
    )[0]
    .starts_with("pg_dropped_role("));

    // Creating the missing role repairs its rule (it follows the name).
    admin
        .batch_execute(&format!("CREATE ROLE {ghost} LOGIN"))
        .unwrap();
    assert_eq!(rows(&mut as_role(&ghost), &acquire("ghost/y")).len(), 1);
}

#[test]
fn pg_dump_namespace_rules_of_an_extension_install_follow_role_names_into_another_cluster() {
    restored_rules_follow_role_names(true);
}

#[test]
fn pg_dump_namespace_rules_of_a_migrations_install_follow_role_names_into_another_cluster() {
    restored_rules_follow_role_names(false);
}
