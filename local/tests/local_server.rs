//! Tests of `leasehold-local`, against real PostgreSQL servers.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use diesel::pg::PgConnection;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use diesel::sql_types::Text;
use leasehold_local::{LocalPostgres, LocalServerError, StopMode};

/// Set in the child process of `watchdog_cleans_up_after_owner_is_sigkilled`.
const HELPER_ENV: &str = "LEASEHOLD_LOCAL_WATCHDOG_HELPER";

#[derive(QueryableByName)]
struct Value {
    #[diesel(sql_type = Text)]
    value: String,
}

fn connect(url: &str) -> PgConnection {
    PgConnection::establish(url).unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// Runs a query returning one text column named `value`.
fn value(conn: &mut PgConnection, sql: &str) -> String {
    let rows: Vec<Value> = diesel::sql_query(sql)
        .load(conn)
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    assert_eq!(rows.len(), 1, "{sql} returned {} rows", rows.len());
    rows.into_iter().next().unwrap().value
}

fn setting(conn: &mut PgConnection, name: &str) -> String {
    value(conn, &format!("SELECT current_setting('{name}') AS value"))
}

fn exec(conn: &mut PgConnection, sql: &str) {
    diesel::sql_query(sql)
        .execute(conn)
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Whether a process exists and is not a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let after_comm = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
            after_comm.split_whitespace().next() != Some("Z")
        }
        Err(_) => false,
    }
}

fn socket_file(pg: &LocalPostgres) -> PathBuf {
    pg.socket_dir().join(format!(".s.PGSQL.{}", pg.port()))
}

#[test]
fn durable_server_runs_with_fsync_on() {
    let pg = LocalPostgres::start().unwrap();
    let mut conn = connect(&pg.url());
    assert_eq!(setting(&mut conn, "fsync"), "on");
    assert_eq!(setting(&mut conn, "synchronous_commit"), "on");
    assert_eq!(setting(&mut conn, "full_page_writes"), "on");
    assert_eq!(setting(&mut conn, "listen_addresses"), "");
    assert_eq!(
        value(&mut conn, "SELECT current_user::text AS value"),
        "postgres"
    );
    assert_eq!(
        value(&mut conn, "SELECT current_database()::text AS value"),
        "postgres"
    );
    assert_eq!(setting(&mut conn, "server_encoding"), "UTF8");
    assert_eq!(
        value(
            &mut conn,
            "SELECT datcollate::text AS value FROM pg_database WHERE datname = current_database()"
        ),
        "C"
    );
    let version = pg.server_version().unwrap();
    let major = setting(&mut conn, "server_version");
    assert!(major.starts_with(&version), "{major} vs {version}");
    assert!(pg.tcp_url_for("postgres").is_none());
    let pid = pg.postmaster_pid().expect("running server has a pid");
    assert!(alive(pid));
    assert!(socket_file(&pg).exists());
}

#[test]
fn non_durable_server_runs_with_fsync_off() {
    let pg = LocalPostgres::builder().durable(false).start().unwrap();
    let mut conn = connect(&pg.url());
    assert_eq!(setting(&mut conn, "fsync"), "off");
    assert_eq!(setting(&mut conn, "synchronous_commit"), "off");
    assert_eq!(setting(&mut conn, "full_page_writes"), "off");
}

#[test]
fn two_servers_are_independent() {
    let a = LocalPostgres::builder().durable(false).start().unwrap();
    let b = LocalPostgres::builder().durable(false).start().unwrap();
    assert_ne!(a.url(), b.url());
    assert_ne!(a.data_dir(), b.data_dir());
    assert_ne!(a.postmaster_pid(), b.postmaster_pid());

    let mut ca = connect(&a.url());
    let mut cb = connect(&b.url());
    exec(&mut ca, "CREATE TABLE only_in_a (x int)");
    assert_eq!(
        value(
            &mut cb,
            "SELECT (to_regclass('only_in_a') IS NULL)::text AS value"
        ),
        "true"
    );
    assert_eq!(
        value(
            &mut ca,
            "SELECT (to_regclass('only_in_a') IS NULL)::text AS value"
        ),
        "false"
    );

    drop(ca);
    drop(a);
    assert_eq!(value(&mut cb, "SELECT 'still here' AS value"), "still here");
}

#[test]
fn drop_stops_the_server_and_removes_its_directory() {
    let pg = LocalPostgres::builder().durable(false).start().unwrap();
    let root = pg.root_dir().to_owned();
    let socket = socket_file(&pg);
    let pid = pg.postmaster_pid().unwrap();
    let url = pg.url();
    assert!(root.starts_with(std::env::temp_dir()) || root.starts_with("/tmp"));
    assert!(pg.data_dir().starts_with(&root));
    assert!(pg.log_path().starts_with(&root));
    assert!(socket.exists());
    let mut conn = connect(&url);

    drop(pg);
    assert!(!root.exists(), "{} still exists", root.display());
    assert!(!socket.exists());
    assert!(!alive(pid), "postmaster {pid} still running");
    assert!(diesel::sql_query("SELECT 1").execute(&mut conn).is_err());
    assert!(PgConnection::establish(&url).is_err());
}

#[test]
fn fast_stop_and_restart_keep_committed_data() {
    let pg = LocalPostgres::builder().durable(false).start().unwrap();
    let url = pg.url();
    {
        let mut conn = connect(&url);
        exec(&mut conn, "CREATE TABLE kept (v text)");
        exec(&mut conn, "INSERT INTO kept VALUES ('committed')");
    }
    let old_pid = pg.postmaster_pid().unwrap();

    pg.stop(StopMode::Fast).unwrap();
    assert_eq!(pg.postmaster_pid(), None);
    assert!(!alive(old_pid));
    assert!(PgConnection::establish(&url).is_err());
    // Stopping a stopped server is a no-op.
    pg.stop(StopMode::Fast).unwrap();

    pg.restart().unwrap();
    assert_eq!(pg.url(), url);
    let new_pid = pg.postmaster_pid().unwrap();
    assert_ne!(new_pid, old_pid);
    let mut conn = connect(&url);
    assert_eq!(value(&mut conn, "SELECT v AS value FROM kept"), "committed");
}

#[test]
fn kill_postmaster_and_restart_recover_committed_data() {
    let pg = LocalPostgres::start().unwrap();
    let pool = Pool::builder()
        .max_size(2)
        .build(ConnectionManager::<PgConnection>::new(pg.url()))
        .unwrap();
    {
        let mut conn = pool.get().unwrap();
        exec(&mut conn, "CREATE TABLE survived (v text)");
        exec(&mut conn, "INSERT INTO survived VALUES ('committed')");
    }
    // A transaction in flight at the crash must be rolled back.
    let mut in_flight = connect(&pg.url());
    exec(&mut in_flight, "BEGIN");
    exec(
        &mut in_flight,
        "INSERT INTO survived VALUES ('uncommitted')",
    );
    let old_pid = pg.postmaster_pid().unwrap();

    pg.kill_postmaster().unwrap();
    assert!(!alive(old_pid));
    assert_eq!(pg.postmaster_pid(), None, "stale pid file must not count");
    assert!(matches!(
        pg.kill_postmaster(),
        Err(LocalServerError::NotRunning { .. })
    ));

    pg.restart().unwrap();
    let log = std::fs::read_to_string(pg.log_path()).unwrap();
    assert!(
        log.contains("not properly shut down") || log.contains("was interrupted"),
        "no crash recovery in log:\n{log}"
    );
    // The pool's old connections are dead; r2d2 replaces them.
    let mut conn = pool.get().unwrap();
    assert_eq!(
        value(
            &mut conn,
            "SELECT string_agg(v, ',' ORDER BY v) AS value FROM survived"
        ),
        "committed"
    );
}

#[test]
fn bogus_bin_dir_says_what_to_install() {
    let err = LocalPostgres::builder()
        .bin_dir("/nonexistent/leasehold/pg/bin")
        .start()
        .unwrap_err();
    match &err {
        LocalServerError::BinariesNotFound { searched } => {
            assert_eq!(searched, &[PathBuf::from("/nonexistent/leasehold/pg/bin")]);
        }
        other => panic!("expected BinariesNotFound, got {other:?}"),
    }
    let message = err.to_string();
    for needle in [
        "apt-get install postgresql",
        "LEASEHOLD_PG_BIN",
        "/nonexistent/leasehold/pg/bin",
    ] {
        assert!(message.contains(needle), "{needle:?} missing in: {message}");
    }
}

#[test]
fn extra_settings_are_applied() {
    let pg = LocalPostgres::builder()
        .durable(false)
        .setting("max_connections", "37")
        .setting("application_name", "leasehold-test")
        .start()
        .unwrap();
    let mut conn = connect(&pg.url());
    assert_eq!(setting(&mut conn, "max_connections"), "37");
    assert_eq!(setting(&mut conn, "application_name"), "leasehold-test");
}

#[test]
fn invalid_setting_fails_fast_with_the_log() {
    let started = Instant::now();
    let err = LocalPostgres::builder()
        .durable(false)
        .setting("shared_buffers", "lots")
        .start()
        .unwrap_err();
    match &err {
        LocalServerError::StartFailed { log_tail, .. } => {
            assert!(log_tail.contains("shared_buffers"), "{log_tail}");
        }
        other => panic!("expected StartFailed, got {other:?}"),
    }
    // Reported when the server died, not after the readiness deadline.
    assert!(started.elapsed() < Duration::from_secs(30), "{err}");
}

#[test]
fn tcp_server_accepts_tcp_connections() {
    let pg = LocalPostgres::builder()
        .durable(false)
        .tcp(true)
        .start()
        .unwrap();
    let url = pg.tcp_url_for("postgres").expect("tcp enabled");
    assert_eq!(
        url,
        format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port())
    );
    let mut conn = connect(&url);
    assert_eq!(
        value(&mut conn, "SELECT host(inet_server_addr()) AS value"),
        "127.0.0.1"
    );
    // The socket works too.
    let mut conn = connect(&pg.url_for("template1"));
    assert_eq!(
        value(&mut conn, "SELECT current_database()::text AS value"),
        "template1"
    );
}

/// Not a test on its own: the child process of
/// `watchdog_cleans_up_after_owner_is_sigkilled`. Starts a server, reports
/// its root directory and postmaster pid, and blocks until killed.
#[test]
fn watchdog_helper_process() {
    if std::env::var_os(HELPER_ENV).is_none() {
        return;
    }
    let pg = LocalPostgres::builder().durable(false).start().unwrap();
    // Straight to the stdout pipe: println! may be captured by the harness.
    let report = format!(
        "\nROOT={}\nPID={}\n",
        pg.root_dir().display(),
        pg.postmaster_pid().unwrap()
    );
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(report.as_bytes()).unwrap();
    stdout.flush().unwrap();
    drop(stdout);
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    // Only reached if the parent closes stdin instead of killing us.
    drop(pg);
}

#[test]
fn watchdog_cleans_up_after_owner_is_sigkilled() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "watchdog_helper_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut root, mut pid) = (None, None);
        for line in stdout.lines() {
            let Ok(line) = line else { break };
            // libtest may print "test name ... " before our line.
            if let Some((_, r)) = line.split_once("ROOT=") {
                root = Some(PathBuf::from(r));
            } else if let Some((_, p)) = line.split_once("PID=") {
                pid = p.parse::<u32>().ok();
            }
            if let (Some(root), Some(pid)) = (&root, pid) {
                let _ = tx.send((root.clone(), pid));
                break;
            }
        }
    });
    let Ok((root, pid)) = rx.recv_timeout(Duration::from_secs(120)) else {
        let _ = child.kill();
        let status = child.wait().unwrap();
        panic!("helper ({status}) did not report its server within 120 s");
    };
    assert!(root.exists());
    assert!(alive(pid));

    child.kill().unwrap(); // SIGKILL: no destructor runs in the child
    child.wait().unwrap();

    let deadline = Instant::now() + Duration::from_secs(30);
    while (root.exists() || alive(pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(pid), "postmaster {pid} survived its owner");
    assert!(!root.exists(), "{} survived its owner", root.display());
}

/// `from_base_backup(Standby)` streams the source's writes; `promote` makes
/// it writable on timeline 2. `RestoreAndPromote` comes up writable on a new
/// timeline with the backup's data only. Both directories go on drop.
#[test]
fn standby_streams_and_promotes_and_a_restore_ends_on_a_new_timeline() {
    use leasehold_local::BackupMode;
    let primary = LocalPostgres::builder().durable(false).start().unwrap();
    let mut p = connect(&primary.url());
    exec(&mut p, "CREATE TABLE t (n int)");
    exec(&mut p, "INSERT INTO t VALUES (1)");
    let standby = LocalPostgres::builder()
        .durable(false)
        .from_base_backup(&primary, BackupMode::Standby)
        .start()
        .unwrap();
    let restored = LocalPostgres::builder()
        .durable(false)
        .from_base_backup(&primary, BackupMode::RestoreAndPromote)
        .start()
        .unwrap();
    assert!(standby.in_recovery().unwrap());
    assert!(!restored.in_recovery().unwrap());
    exec(&mut p, "INSERT INTO t VALUES (2)");
    let lsn = value(&mut p, "SELECT pg_current_wal_insert_lsn()::text AS value");
    let mut s = connect(&standby.url());
    let caught_up = format!("SELECT (pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn)::text AS value");
    let mut polls = 0;
    while value(&mut s, &caught_up) != "true" {
        polls += 1;
        assert!(polls < 12_000, "the standby never replayed {lsn}");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(value(&mut s, "SELECT count(*)::text AS value FROM t"), "2");
    standby.promote().unwrap();
    assert!(!standby.in_recovery().unwrap());
    let mut s = connect(&standby.url());
    exec(&mut s, "INSERT INTO t VALUES (3)");
    let timeline = "SELECT substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8) AS value";
    assert_eq!(value(&mut s, timeline), "00000002");
    let mut r = connect(&restored.url());
    assert_eq!(value(&mut r, timeline), "00000002");
    assert_eq!(value(&mut r, "SELECT count(*)::text AS value FROM t"), "1");
    let roots = [
        standby.root_dir().to_owned(),
        restored.root_dir().to_owned(),
    ];
    drop(s);
    drop(r);
    drop(standby);
    drop(restored);
    for root in roots {
        assert!(!root.exists(), "{} left behind", root.display());
    }
}
