//! Running the real `leasehold` binary against a real server.
//!
//! One throwaway PostgreSQL per test binary, a fresh database per test, and
//! the binary pointed at it with `--database-url` (DATABASE_URL is removed
//! from the child's environment so the tests never touch another server).

use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::Timestamptz;
use leasehold::local::LocalPostgres;
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

fn server() -> &'static LocalPostgres {
    static SERVER: OnceLock<LocalPostgres> = OnceLock::new();
    SERVER.get_or_init(|| {
        LocalPostgres::builder()
            .durable(false)
            .start()
            .unwrap_or_else(|error| panic!("cannot start the test server: {error}"))
    })
}

/// A database of its own for one test.
pub struct Db {
    pub name: String,
    pub url: String,
}

impl Db {
    /// An empty database (leasehold not installed).
    pub fn empty() -> Db {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "cli_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        admin_exec(&format!("CREATE DATABASE {name}"));
        let url = server().url_for(&name);
        Db { name, url }
    }

    /// A database with leasehold installed through the library.
    pub fn installed() -> Db {
        let db = Db::empty();
        leasehold::install(&mut db.conn()).unwrap_or_else(|error| panic!("install: {error}"));
        db
    }

    pub fn conn(&self) -> PgConnection {
        PgConnection::establish(&self.url)
            .unwrap_or_else(|error| panic!("connect to {}: {error}", self.name))
    }

    /// Runs the binary with `--database-url` pointing here.
    pub fn run(&self, args: &[&str]) -> Run {
        let mut full = vec!["--database-url", self.url.as_str()];
        full.extend_from_slice(args);
        run(&full)
    }

    /// Runs the binary with `--json` and parses stdout as one JSON value.
    pub fn json(&self, args: &[&str]) -> (i32, Value) {
        let mut full = vec!["--json"];
        full.extend_from_slice(args);
        let run = self.run(&full);
        (run.code, run.json())
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Ok(mut conn) = PgConnection::establish(&server().url()) {
            let _ = conn.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

pub fn admin_exec(sql: &str) {
    let mut conn = PgConnection::establish(&server().url())
        .unwrap_or_else(|error| panic!("connect to the admin database: {error}"));
    conn.batch_execute(sql)
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

/// What a run of the binary produced.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|error| panic!("stdout is not one JSON value ({error}): {self:?}"))
    }
}

/// A command for the binary, without any inherited DATABASE_URL.
pub fn command(args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null());
    command
}

pub fn run(args: &[&str]) -> Run {
    let Output {
        status,
        stdout,
        stderr,
    } = command(args)
        .output()
        .unwrap_or_else(|error| panic!("cannot run {BIN}: {error}"));
    Run {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// A server timestamp from the CLI's JSON output.
pub fn time_of(value: &Value) -> DateTime<Utc> {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("not a timestamp: {value}"));
    DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|error| panic!("{text}: {error}"))
        .with_timezone(&Utc)
}

#[derive(QueryableByName)]
struct Now {
    #[diesel(sql_type = Timestamptz)]
    now: DateTime<Utc>,
}

/// Blocks until the *server's* clock is past `instant`: expiry is decided by
/// that clock alone, so that is the state to synchronise on.
pub fn wait_until_server_time_passes(conn: &mut PgConnection, instant: DateTime<Utc>) {
    for _ in 0..10_000 {
        let now = diesel::sql_query("SELECT clock_timestamp() AS now")
            .get_result::<Now>(conn)
            .expect("server clock")
            .now;
        if now > instant {
            return;
        }
        let remaining = (instant - now).to_std().unwrap_or_default();
        std::thread::sleep(remaining.min(Duration::from_millis(50)) + Duration::from_micros(100));
    }
    panic!("server clock never passed {instant}");
}
