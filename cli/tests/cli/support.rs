//! Running the real `leasehold` binary against a real server.
//!
//! One throwaway PostgreSQL per test binary, a fresh database per test, and
//! the binary pointed at it with `--database-url` (DATABASE_URL is removed
//! from the child's environment so the tests never touch another server,
//! and LEASEHOLD_LOG and RUST_LOG so no inherited filter adds log lines).

use std::ops::Deref;
use std::process::{Command, Output, Stdio};

use leasehold_test_support::{TestDb, TestServer};
use serde_json::Value;

pub use leasehold_test_support::{time_of, wait_until_server_time_passes};

pub const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

/// A database of its own for one test, on a throwaway local server (never
/// the one `DATABASE_URL` names), and the binary pointed at it.
pub struct Db(TestDb);

impl Db {
    /// An empty database (leasehold not installed).
    pub fn empty() -> Db {
        Db(TestDb::empty_on(TestServer::local()))
    }

    /// A database with leasehold installed through the library.
    pub fn installed() -> Db {
        Db(TestDb::installed_on(TestServer::local()))
    }

    /// Runs the binary with `--database-url` pointing here.
    pub fn run(&self, args: &[&str]) -> Run {
        let mut full = vec!["--database-url", self.url.as_str()];
        full.extend_from_slice(args);
        run(&full)
    }

    /// Runs the binary with `--database-url` pointing here and the extra
    /// environment variables `env`.
    pub fn run_with_env(&self, env: &[(&str, &str)], args: &[&str]) -> Run {
        let mut full = vec!["--database-url", self.url.as_str()];
        full.extend_from_slice(args);
        let mut command = command(&full);
        command.envs(env.iter().copied());
        output_of(command)
    }

    /// Runs the binary with `--json` and parses stdout as one JSON value.
    pub fn json(&self, args: &[&str]) -> (i32, Value) {
        let mut full = vec!["--json"];
        full.extend_from_slice(args);
        let run = self.run(&full);
        (run.code, run.json())
    }
}

impl Deref for Db {
    type Target = TestDb;

    fn deref(&self) -> &TestDb {
        &self.0
    }
}

pub fn admin_exec(sql: &str) {
    TestServer::local().admin_exec(sql);
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

/// A command for the binary, without any inherited DATABASE_URL or log
/// filter.
pub fn command(args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("LEASEHOLD_LOG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    command
}

pub fn run(args: &[&str]) -> Run {
    output_of(command(args))
}

/// Runs `command` to its end, collecting its exit code and output.
fn output_of(mut command: Command) -> Run {
    let Output {
        status,
        stdout,
        stderr,
    } = command
        .output()
        .unwrap_or_else(|error| panic!("cannot run {BIN}: {error}"));
    Run {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// The version `leasehold install` records last (its functions step) and
/// the extension's `default_version`.
pub fn newest_migration_version() -> String {
    leasehold::admin::extension_version()
}
