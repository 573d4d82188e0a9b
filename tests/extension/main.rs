//! The PostgreSQL extension `leasehold` (src/admin/extension.rs): `CREATE
//! EXTENSION` installs what `install()` and Diesel's runner install, to the
//! same catalog; `ALTER EXTENSION ... UPDATE` from an earlier release
//! applies the functions again, keeping every lease and guard record;
//! `pg_dump`/`pg_restore` keep every epoch and guard record; the two
//! install paths refuse to mix.
//!
//! The server runs from a private copy of the PostgreSQL installation (see
//! [`private_install`]) whose share directory holds the generated files, so
//! the tests never write into the system's extension directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::Text;
use leasehold::guard::{Check, Fencing};
use leasehold::{error::LeaseError, install, ErrorKind, Leases};
use leasehold_local::LocalPostgres;

mod fenced_restore;
mod namespaces_restore;
mod privileges;
mod tampering;

const TTL: Duration = Duration::from_secs(300);

/// The version of an earlier release with today's migrations and other
/// functions, which `ALTER EXTENSION leasehold UPDATE` upgrades from: its
/// install script is today's under that version, its update script the one
/// `update_script` generates for a release that lists it.
const EARLIER_VERSION: &str = "20261201000001.000000000000";

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = Text)]
    t: String,
}

/// The `t` column of every row of `sql`.
fn rows(conn: &mut PgConnection, sql: &str) -> Vec<String> {
    diesel::sql_query(sql)
        .load::<Row>(conn)
        .unwrap_or_else(|error| panic!("{sql}: {error}"))
        .into_iter()
        .map(|row| row.t)
        .collect()
}

/// The extension files the library generates, and those of an earlier
/// release [`EARLIER_VERSION`] (its install script and the update script
/// from it), so that an update can be tested.
fn extension_files() -> Vec<(String, String)> {
    static FILES: OnceLock<Vec<(String, String)>> = OnceLock::new();
    FILES
        .get_or_init(|| {
            let mut files: Vec<(String, String)> = leasehold::admin::extension_files()
                .expect("generate the extension files")
                .into_iter()
                .map(|file| (file.name, file.contents))
                .collect();
            let install = format!("leasehold--{}.sql", extension_version());
            let earlier = files
                .iter()
                .find(|(name, _)| *name == install)
                .unwrap()
                .1
                .clone();
            files.push((format!("leasehold--{EARLIER_VERSION}.sql"), earlier));
            files.push((
                format!("leasehold--{EARLIER_VERSION}--{}.sql", extension_version()),
                leasehold::__private::sql_files::update_script(EARLIER_VERSION)
                    .expect("generate the update script"),
            ));
            files.sort();
            files
        })
        .clone()
}

/// The version `CREATE EXTENSION leasehold` installs.
fn extension_version() -> String {
    leasehold::admin::extension_version()
}

/// A private copy of the PostgreSQL installation: the binaries hard-linked
/// (copied when that fails), the library directory linked, and a share
/// directory of links plus an `extension` directory holding the generated
/// files. PostgreSQL finds its share directory relative to its binary, so
/// the copy keeps the installation's layout.
/// The binary, share and package library directories of the installation
/// whose server binaries are in `real_bin`: from its `pg_config` where it
/// has one (a distribution's packages), otherwise from the layout of the
/// server-only trees the version matrix fetches (`.ci/fetch-postgres`:
/// `bin/`, `share/postgresql/`, `lib/postgresql/`), which have no
/// `pg_config`.
fn installation_dirs(real_bin: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let pg_config = real_bin.join("pg_config");
    if !pg_config.exists() {
        let root = real_bin
            .parent()
            .expect("the binary directory has a parent");
        return (
            real_bin.to_path_buf(),
            root.join("share/postgresql"),
            root.join("lib/postgresql"),
        );
    }
    let config = |what: &str| -> PathBuf {
        let out = Command::new(&pg_config)
            .arg(what)
            .output()
            .expect("run pg_config");
        assert!(out.status.success(), "pg_config {what} failed");
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    };
    (
        config("--bindir"),
        config("--sharedir"),
        config("--pkglibdir"),
    )
}

fn private_install() -> PathBuf {
    let real_bin = std::env::var_os("LEASEHOLD_PG_BIN")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let mut dirs: Vec<(Vec<u64>, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
                .expect("PostgreSQL server binaries under /usr/lib/postgresql (or set LEASEHOLD_PG_BIN)")
                .filter_map(Result::ok)
                .filter_map(|e| {
                    let v = e
                        .file_name()
                        .to_string_lossy()
                        .split('.')
                        .map(|p| p.parse().ok())
                        .collect::<Option<Vec<u64>>>()?;
                    Some((v, e.path().join("bin")))
                })
                .filter(|(_, bin)| bin.join("postgres").exists())
                .collect();
            dirs.sort();
            dirs.pop().expect("a PostgreSQL installation").1
        });
    let (bin, share, lib) = installation_dirs(&real_bin);
    // The longest common ancestor of the three; the copy keeps the rest.
    let mut common = bin.clone();
    while !(share.starts_with(&common) && lib.starts_with(&common)) {
        assert!(common.pop(), "no common ancestor of {bin:?} and {share:?}");
    }
    // Earlier runs' trees whose process is gone.
    for entry in std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_prefix("leasehold-ext-") {
            if !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let root = std::env::temp_dir().join(format!("leasehold-ext-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let inside = |dir: &Path| root.join(dir.strip_prefix(&common).unwrap());
    let (my_bin, my_share, my_lib) = (inside(&bin), inside(&share), inside(&lib));
    std::fs::create_dir_all(&my_bin).unwrap();
    for entry in std::fs::read_dir(&bin).unwrap() {
        let entry = entry.unwrap();
        let to = my_bin.join(entry.file_name());
        let from = std::fs::canonicalize(entry.path()).unwrap();
        if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to).unwrap();
        }
    }
    std::fs::create_dir_all(my_lib.parent().unwrap()).unwrap();
    if !my_lib.exists() {
        std::os::unix::fs::symlink(&lib, &my_lib).unwrap();
    }
    // A server-only tree keeps its shared libraries next to the package
    // library directory (`lib/`), where its binaries look for them.
    if !real_bin.join("pg_config").exists() {
        for entry in std::fs::read_dir(lib.parent().unwrap()).unwrap() {
            let entry = entry.unwrap();
            let to = my_lib.parent().unwrap().join(entry.file_name());
            if !to.exists() {
                std::os::unix::fs::symlink(entry.path(), to).unwrap();
            }
        }
    }
    let extension_dir = my_share.join("extension");
    std::fs::create_dir_all(&extension_dir).unwrap();
    for entry in std::fs::read_dir(&share).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "extension" {
            std::os::unix::fs::symlink(entry.path(), my_share.join(entry.file_name())).unwrap();
        }
    }
    for entry in std::fs::read_dir(share.join("extension")).unwrap() {
        let entry = entry.unwrap();
        std::os::unix::fs::symlink(entry.path(), extension_dir.join(entry.file_name())).unwrap();
    }
    for (name, contents) in extension_files() {
        std::fs::write(extension_dir.join(name), contents).unwrap();
    }
    // The server may run as another user (postgres, when the tests run as
    // root): everything must be readable.
    let _ = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(&root)
        .status();
    my_bin
}

struct Server {
    pg: LocalPostgres,
    counter: Mutex<u32>,
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let bin = private_install();
        let pg = LocalPostgres::builder()
            .bin_dir(&bin)
            .durable(false)
            .start()
            .unwrap_or_else(|error| panic!("cannot start the test server: {error}"));
        // The version matrix (.ci/pg-matrix) names the major it means to
        // test; a run that reached another one must fail, not pass.
        if let Some(major) = std::env::var(leasehold_test_support::server::EXPECT_MAJOR_ENV)
            .ok()
            .filter(|v| !v.is_empty())
        {
            let mut conn = PgConnection::establish(&pg.url()).unwrap();
            let found = leasehold_test_support::query_lines(
                &mut conn,
                "SELECT (current_setting('server_version_num')::int / 10000)::text AS line",
            );
            assert_eq!(found, [major], "the extension tests reached another major");
        }
        let (_, share, _) = installation_dirs(&bin);
        assert!(
            share.join("extension/leasehold.control").exists(),
            "the private installation's share directory {share:?} lacks the extension files"
        );
        let mut admin = PgConnection::establish(&pg.url()).unwrap();
        create_login_role_once(&mut admin, "app");
        Server {
            pg,
            counter: Mutex::new(0),
        }
    })
}

/// Creates a login role of the whole cluster unless it exists. Tests run in
/// parallel, so two may create the same role at once: checking first and
/// then creating races (the loser fails on the catalog's unique index), so
/// this creates and treats "already there" from either path as success.
fn create_login_role_once(admin: &mut PgConnection, name: &str) {
    admin
        .batch_execute(&format!(
            "DO $$ BEGIN
               CREATE ROLE {name} LOGIN NOSUPERUSER;
             EXCEPTION WHEN duplicate_object OR unique_violation THEN
               NULL;
             END $$;"
        ))
        .unwrap();
}

/// A new database owned by nobody special, where role `app` has CREATE.
fn database() -> String {
    let server = server();
    let name = {
        let mut n = server.counter.lock().unwrap();
        *n += 1;
        format!("ext_{}", *n)
    };
    let mut admin = PgConnection::establish(&server.pg.url()).unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .unwrap();
    admin
        .batch_execute(&format!("GRANT CREATE ON DATABASE {name} TO app"))
        .unwrap();
    name
}

fn conn(database: &str) -> PgConnection {
    PgConnection::establish(&server().pg.url_for(database)).unwrap()
}

/// `app`'s connection: a role that is not a superuser.
fn app_conn(database: &str) -> PgConnection {
    let url = server()
        .pg
        .url_for(database)
        .replacen("postgres@", "app@", 1);
    assert!(url.contains("app@"), "{url}");
    PgConnection::establish(&url).unwrap()
}

/// What was installed, object by object: functions (signature, security,
/// settings, volatility, body), table columns, indexes, triggers,
/// constraints. Ownership and privileges are left out (docs/PRIVILEGES.md
/// says who owns what on each path), and so is the extension's own
/// lineage-restore trigger.
fn installed_objects(conn: &mut PgConnection) -> Vec<String> {
    rows(
        conn,
        "SELECT format('function %s security_definer=%s config=%s volatile=%s strict=%s md5=%s',
                       p.oid::regprocedure, p.prosecdef, p.proconfig, p.provolatile, p.proisstrict,
                       md5(p.prosrc)) AS t
           FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
          WHERE n.nspname = 'lease' AND p.proname <> '_lineage_restore'
         UNION ALL
         SELECT format('column %s.%s %s notnull=%s default=%s', c.relname, a.attname,
                       format_type(a.atttypid, a.atttypmod), a.attnotnull,
                       pg_get_expr(d.adbin, d.adrelid))
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
           LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
          WHERE n.nspname = 'lease' AND c.relkind = 'r' AND c.relname <> 'schema_migrations'
         UNION ALL
         SELECT format('index %s', pg_get_indexdef(i.indexrelid))
           FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
           JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = 'lease' AND c.relname <> 'schema_migrations'
         UNION ALL
         SELECT format('trigger %s', pg_get_triggerdef(t.oid))
           FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
           JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = 'lease' AND NOT t.tgisinternal AND t.tgname <> 'lineage_restore'
         UNION ALL
         SELECT format('constraint %s %s', co.conname, pg_get_constraintdef(co.oid))
           FROM pg_constraint co JOIN pg_namespace n ON n.oid = co.connamespace
          WHERE n.nspname = 'lease' AND co.conname NOT LIKE 'schema_migrations%'
         UNION ALL
         SELECT format('rule %s', pg_get_ruledef(r.oid))
           FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class
           JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = 'lease'
         UNION ALL
         SELECT format('public may %s on %s',
                       (SELECT string_agg(a.privilege_type, ',' ORDER BY a.privilege_type)
                          FROM aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) AS a
                         WHERE a.grantee = 0), c.relname)
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = 'lease' AND c.relkind IN ('r', 'v') AND c.relname <> 'schema_migrations'
         ORDER BY 1",
    )
}

/// The distinct owners of the tables and functions in schema `lease`.
fn owners(conn: &mut PgConnection) -> Vec<String> {
    rows(
        conn,
        "SELECT DISTINCT pg_get_userbyid(o)::text AS t FROM (
             SELECT p.proowner AS o FROM pg_proc p WHERE p.pronamespace = 'lease'::regnamespace
             UNION ALL
             SELECT c.relowner FROM pg_class c WHERE c.relnamespace = 'lease'::regnamespace
             UNION ALL
             SELECT t.typowner FROM pg_type t
              WHERE t.typnamespace = 'lease'::regnamespace AND t.typtype = 'd'
         ) AS x ORDER BY 1",
    )
}

/// The state a dump must keep: every lease row, heartbeat group, guard
/// record, namespace rule and the lineage row.
fn state(conn: &mut PgConnection) -> Vec<String> {
    rows(
        conn,
        "SELECT format('lease %s %s %s %s %s %s', key, owner, epoch, expires_at, lapsed_owner, group_id) AS t FROM lease.leases
         UNION ALL SELECT format('group %s %s %s %s', id, owner, expires_at, members) FROM lease.groups
         UNION ALL SELECT format('guard %s %s %s %s', resource, lease_key, accepted_epoch, updated_at) FROM lease.guards
         UNION ALL SELECT format('namespace %s %s', prefix, created_at) FROM lease.namespaces
         UNION ALL SELECT format('lineage %s %s %s %s', system_identifier, base, last_timeline, external_floor) FROM lease.lineage
         ORDER BY 1",
    )
}

/// Leases held, released and fenced, and guard records.
fn seed(conn: &mut PgConnection) {
    let a = conn.acquire("job-a", "w1", TTL).unwrap().granted().unwrap();
    conn.admit("res-a", &a, Check::Token).unwrap();
    assert_eq!(
        conn.release(&leasehold_test_support::grant("job-a", "w1", a.epoch()))
            .unwrap(),
        leasehold::Release::Released
    );
    let a2 = conn.acquire("job-a", "w2", TTL).unwrap().granted().unwrap();
    conn.admit("res-a", &a2, Check::Token).unwrap();
    let b = conn.acquire("job-b", "w1", TTL).unwrap().granted().unwrap();
    conn.admit("res-b", &b, Check::Token).unwrap();
    conn.fence("res-c", "job-b", b.epoch()).unwrap();
    let joined = conn
        .join_group(
            &leasehold_test_support::grants("w1", &[("job-b", b.epoch())]),
            TTL,
        )
        .unwrap();
    assert!(joined.group.is_some());
}

/// pg_lease's rules on a database with `seed`'s leases in it: the next grant of a
/// released key is its counter + 1, a held key is refused, a stale epoch is
/// refused by its guard.
fn seed_checks(conn: &mut PgConnection) {
    let generation: i64 = rows(conn, "SELECT generation::text AS t FROM lease.generation()")[0]
        .parse()
        .unwrap();
    let floor = (generation << 40) + 1;
    let counter: i64 = rows(
        conn,
        "SELECT epoch::text AS t FROM lease.leases WHERE key = 'job-a'",
    )[0]
    .parse()
    .unwrap();
    let held = conn.acquire("job-a", "w3", TTL).unwrap();
    assert!(held.granted().is_none(), "job-a is held by w2");
    let lease = rows(
        conn,
        "SELECT epoch::text AS t FROM lease.leases WHERE key = 'job-a'",
    );
    assert_eq!(lease, vec![counter.to_string()]);
    assert_eq!(
        conn.release(&leasehold_test_support::grant("job-a", "w2", counter))
            .unwrap(),
        leasehold::Release::Released
    );
    let next = conn.acquire("job-a", "w3", TTL).unwrap().granted().unwrap();
    assert_eq!(
        next.epoch(),
        (counter + 2).max(floor),
        "release adds one, the grant one more (at least the generation's floor)"
    );
    let stale = leasehold::FencingToken::new("job-a", "w1", leasehold::Epoch::from(1)).unwrap();
    assert!(
        conn.admit("res-a", &stale, Check::Token).is_err(),
        "a stale epoch is refused"
    );
    conn.admit("res-a", &next, Check::Token).unwrap();
    let fresh = conn
        .acquire("new-key", "w1", TTL)
        .unwrap()
        .granted()
        .unwrap();
    assert_eq!(
        fresh.epoch(),
        floor,
        "a never-seen key starts at the generation's floor"
    );
    // The heartbeat group is kept, and new groups get ids of their own.
    let group: i64 = rows(conn, "SELECT id::text AS t FROM lease.groups")[0]
        .parse()
        .unwrap();
    let group = leasehold::batch::GroupId::from_raw(group);
    assert!(matches!(
        conn.renew_group(group, "w1", TTL).unwrap(),
        leasehold::batch::GroupRenewal::Renewed { members: 1, .. }
    ));
    let joined = conn
        .join_group(
            &leasehold_test_support::grants("w3", &[("job-a", next.epoch())]),
            TTL,
        )
        .unwrap();
    assert!(joined.group.is_some_and(|new| new != group));
}

#[test]
fn create_extension_by_a_non_superuser_installs_what_the_migrations_install() {
    let by_migrations = database();
    let mut m = app_conn(&by_migrations);
    install(&mut m).unwrap();
    let by_extension = database();
    let mut e = app_conn(&by_extension);
    e.batch_execute("CREATE EXTENSION leasehold").unwrap();
    assert_eq!(
        rows(
            &mut e,
            "SELECT extversion AS t FROM pg_extension WHERE extname = 'leasehold'"
        ),
        vec![extension_version()]
    );
    assert_eq!(installed_objects(&mut e), installed_objects(&mut m));
    assert!(!installed_objects(&mut e).is_empty());
    // The extension's owner may run the operator actions, as the installing
    // role of the migrations may.
    seed(&mut e);
    seed_checks(&mut e);
    e.batch_execute("SELECT lease.force_release('job-b'); SELECT lease.raise_generation(0 + 1)")
        .unwrap();
    assert_eq!(
        rows(
            &mut e,
            "SELECT pg_get_userbyid(nspowner)::text AS t FROM pg_namespace WHERE nspname = 'lease'"
        ),
        vec!["app".to_owned()]
    );
    assert_eq!(
        owners(&mut e),
        vec!["app".to_owned()],
        "app owns every object, as with the migrations"
    );
    assert_eq!(owners(&mut m), vec!["app".to_owned()]);
}

#[test]
fn every_install_path_leaves_the_same_catalog() {
    use diesel_migrations::MigrationHarness;
    use leasehold_test_support::catalog::catalog;
    let by_install = database();
    let mut i = app_conn(&by_install);
    install(&mut i).unwrap();
    // Diesel's own bookkeeping table goes on the search_path, into a schema
    // the role may create in (PostgreSQL 15 grants no CREATE on public).
    let by_diesel = database();
    conn(&by_diesel)
        .batch_execute("CREATE SCHEMA diesel AUTHORIZATION app")
        .unwrap();
    let mut d = app_conn(&by_diesel);
    d.batch_execute("SET search_path = diesel").unwrap();
    d.run_pending_migrations(leasehold::admin::MIGRATIONS)
        .unwrap();
    let by_extension = database();
    let mut e = app_conn(&by_extension);
    e.batch_execute("CREATE EXTENSION leasehold").unwrap();
    let expected = catalog(&mut i);
    assert!(expected
        .iter()
        .any(|line| line.starts_with("function lease.acquire(")
            && line.contains("definer=t")
            && line.contains("owner=app")));
    assert!(expected
        .iter()
        .any(|line| line.starts_with("function acl lease.acquire(")
            && line.contains(" PUBLIC EXECUTE ")));
    assert_eq!(catalog(&mut d), expected, "Diesel's runner");
    assert_eq!(catalog(&mut e), expected, "CREATE EXTENSION");
}

#[test]
fn alter_extension_update_from_an_earlier_release_keeps_the_leases() {
    use leasehold_test_support::catalog::{catalog, lease_state};
    let db = database();
    let mut c = app_conn(&db);
    c.batch_execute(&format!(
        "CREATE EXTENSION leasehold VERSION '{EARLIER_VERSION}'"
    ))
    .unwrap();
    // The earlier release's functions: a body, a setting and a grant differ.
    c.batch_execute(
        "CREATE OR REPLACE FUNCTION lease._max_batch() RETURNS integer
         LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1000 /* as released */ $$;
         ALTER FUNCTION lease.renew(text, text, bigint, interval) SET work_mem = '64kB';
         REVOKE EXECUTE ON FUNCTION lease.inspect_guard(text) FROM PUBLIC;",
    )
    .unwrap();
    // A lease held, its guard records by admit and by fence, one released.
    let first = c.acquire("job-a", "w1", TTL).unwrap().granted().unwrap();
    c.admit("res-a", &first, Check::Token).unwrap();
    let other = c.acquire("job-b", "w1", TTL).unwrap().granted().unwrap();
    c.fence("res-b", "job-b", other.epoch()).unwrap();
    assert_eq!(c.release(&other).unwrap(), leasehold::Release::Released);
    let before = lease_state(&mut c);
    assert!(before
        .iter()
        .any(|line| line.starts_with("guard res-a job-a ")));
    c.batch_execute("ALTER EXTENSION leasehold UPDATE").unwrap();
    assert_eq!(
        lease_state(&mut c),
        before,
        "the update changed no lease, epoch or guard record"
    );
    assert_eq!(owners(&mut c), vec!["app".to_owned()]);
    assert_eq!(
        rows(
            &mut c,
            "SELECT extversion AS t FROM pg_extension WHERE extname = 'leasehold'"
        ),
        vec![extension_version()]
    );
    let fresh = database();
    let mut f = app_conn(&fresh);
    f.batch_execute("CREATE EXTENSION leasehold").unwrap();
    assert_eq!(installed_objects(&mut c), installed_objects(&mut f));
    assert_eq!(catalog(&mut c), catalog(&mut f));
    // Still the same lease, and its guard still admits it; the library's
    // calls work on the updated schema.
    c.admit("res-a", &first, Check::Token).unwrap();
    let next = c.acquire("job-b", "w2", TTL).unwrap().granted().unwrap();
    assert_eq!(i64::from(next.epoch()), i64::from(other.epoch()) + 2);
    assert_eq!(c.release(&next).unwrap(), leasehold::Release::Released);
}

/// `pg_dump` or `pg_restore`: the test server's own, or, for the server-only
/// trees of the version matrix (which have none), the machine's
/// PostgreSQL 15 tools, which dump and restore 15 and older servers.
/// `.ci/pg-matrix` skips the dump tests on newer majors.
fn dump_tool(program: &str) -> PathBuf {
    let own = server().pg.tool_path(program);
    if own.exists() {
        return own;
    }
    let machine = Path::new("/usr/lib/postgresql/15/bin").join(program);
    if machine.exists() {
        machine
    } else {
        own
    }
}

/// `pg_dump -Fc` of database `from` into a file of the test server's
/// directory; panics with pg_dump's stderr when it fails.
fn pg_dump_file(from: &str) -> PathBuf {
    let server = server();
    let file = server.pg.root_dir().join(format!("{from}.dump"));
    let out = Command::new(dump_tool("pg_dump"))
        .args(["-Fc", "-f"])
        .arg(&file)
        .arg("-d")
        .arg(server.pg.url_for(from))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pg_dump: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    file
}

/// Dumps `from` and restores it into a new database, `as_role` naming the
/// role pg_restore acts as (`--role`).
fn dump_and_restore(from: &str, as_role: Option<&str>) -> String {
    let server = server();
    let to = database();
    let file = pg_dump_file(from);
    let out = Command::new(dump_tool("pg_restore"))
        .args(as_role.map(|role| format!("--role={role}")))
        .args(["--exit-on-error", "-d"])
        .arg(server.pg.url_for(&to))
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pg_restore: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    to
}

fn dump_keeps_everything(use_extension: bool) {
    let db = database();
    let mut c = app_conn(&db);
    if use_extension {
        c.batch_execute("CREATE EXTENSION leasehold").unwrap();
    } else {
        install(&mut c).unwrap();
    }
    seed(&mut c);
    c.batch_execute("SELECT lease.bind_namespace('team-', 'app')")
        .unwrap();
    // A raised generation lives only in the lineage row: the restore must
    // keep the dump's row, not the one CREATE EXTENSION inserts.
    c.batch_execute("SELECT lease.raise_generation(1)").unwrap();
    let before = state(&mut c);
    assert!(before.iter().filter(|r| r.starts_with("guard ")).count() >= 3);
    // The extension is restored as its owner (docs/PRIVILEGES.md); the
    // migrations install by the superuser, which restores each owner.
    let restored = dump_and_restore(&db, use_extension.then_some("app"));
    let mut r = conn(&restored);
    assert_eq!(state(&mut r), before, "the restore kept every row");
    assert_eq!(installed_objects(&mut r), installed_objects(&mut c));
    if use_extension {
        assert_eq!(
            rows(
                &mut r,
                "SELECT extversion AS t FROM pg_extension WHERE extname = 'leasehold'"
            ),
            vec![extension_version()]
        );
    }
    seed_checks(&mut r);
}

#[test]
fn pg_dump_keeps_every_epoch_and_guard_record_of_an_extension_install() {
    dump_keeps_everything(true);
}

#[test]
fn pg_dump_keeps_every_epoch_and_guard_record_of_a_migrations_install() {
    dump_keeps_everything(false);
}

#[test]
fn install_refuses_a_database_with_the_extension() {
    let db = database();
    let mut c = app_conn(&db);
    c.batch_execute("CREATE EXTENSION leasehold").unwrap();
    match install(&mut c) {
        Err(e) if is_extension_installed(&e) => {
            let message = e.to_string();
            assert!(
                message.contains(&format!("(version {})", extension_version())),
                "{message}"
            )
        }
        other => panic!("expected ExtensionInstalled, got {other:?}"),
    }
    assert!(matches!(
        leasehold::admin::uninstall(&mut c),
        Err(e) if is_extension_installed(&e)
    ));
    assert_eq!(
        rows(
            &mut c,
            "SELECT (to_regclass('lease.schema_migrations') IS NULL)::text AS t"
        ),
        vec!["true".to_owned()],
        "nothing was written"
    );
}

#[test]
fn create_extension_refuses_a_migrations_install() {
    let db = database();
    let mut c = app_conn(&db);
    install(&mut c).unwrap();
    let error = c.batch_execute("CREATE EXTENSION leasehold").unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("already installed in this database by its migrations"),
        "{message}"
    );
    assert!(rows(
        &mut c,
        "SELECT extname::text AS t FROM pg_extension WHERE extname = 'leasehold'"
    )
    .is_empty());
}

#[test]
fn create_extension_refuses_a_schema_another_role_owns() {
    let db = database();
    let mut admin = conn(&db);
    admin.batch_execute("CREATE SCHEMA lease").unwrap();
    let mut c = app_conn(&db);
    let message = c
        .batch_execute("CREATE EXTENSION leasehold")
        .unwrap_err()
        .to_string();
    assert!(message.contains("owned by role postgres"), "{message}");
}

/// The old `LeaseError::ExtensionInstalled`: leasehold is installed as the
/// extension, so the migrations' install refuses; its version is in the message.
fn is_extension_installed(error: &LeaseError) -> bool {
    error.kind() == ErrorKind::NotInstalled
        && error.operation() == Some(leasehold::error::Operation::INSTALL)
        && error
            .to_string()
            .starts_with("leasehold is installed in this database as the extension")
}
