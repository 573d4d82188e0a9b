//! The SQL suites in PostgreSQL's own harness (sql/tests/, run by
//! sql/tests/run.sh): pg_regress files for each public function's
//! contract and isolationtester specs for the concurrency rules, each run
//! on a database of its own on the test server, so they run on every
//! major the version matrix starts and count for the SQL mutation runner
//! (its patch is applied to that database's install, as to every other).

use std::path::{Path, PathBuf};
use std::process::Command;

use diesel::sql_types::Text;
use diesel::{QueryableByName, RunQueryDsl};
use leasehold_test_support::TestDb;

/// Where libpq reaches the test server: host (or socket directory), port, user.
#[derive(QueryableByName)]
struct Reach {
    #[diesel(sql_type = Text)]
    host: String,
    #[diesel(sql_type = Text)]
    port: String,
    #[diesel(sql_type = Text)]
    role: String,
}

/// Runs `suite` (`regress` or `isolation`) on a new database with
/// leasehold installed; panics with the harness's diffs when it fails.
fn run(suite: &str) {
    let db = TestDb::new();
    let reach: Reach = diesel::sql_query(
        "SELECT coalesce(host(inet_server_addr()),
                         split_part(current_setting('unix_socket_directories'), ',', 1)) AS host,
                current_setting('port') AS port, current_user::text AS role",
    )
    .get_result(&mut db.conn())
    .expect("where the test server listens");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out: PathBuf = std::env::temp_dir().join(format!("leasehold-sql-{suite}-{}", db.name));
    let ran = Command::new(root.join("sql/tests/run.sh"))
        .args([suite, &db.name])
        .arg(&out)
        .env("PGHOST", reach.host.trim())
        .env("PGPORT", &reach.port)
        .env("PGUSER", &reach.role)
        .output()
        .expect("run sql/tests/run.sh");
    if !ran.status.success() {
        let diffs = std::fs::read_to_string(out.join("regression.diffs")).unwrap_or_default();
        panic!(
            "the {suite} suite failed ({}); results in {}:\n{}{}\n{diffs}",
            ran.status,
            out.display(),
            String::from_utf8_lossy(&ran.stdout),
            String::from_utf8_lossy(&ran.stderr),
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn the_regression_suite_passes() {
    run("regress");
}

#[test]
fn the_isolation_specs_pass() {
    run("isolation");
}
