//! `cargo xtask test`: from a fresh machine to the test run in one command.
//!
//! The test suites start real servers: PostgreSQL (server binaries, and
//! libpq to build against), PgBouncer, Patroni with etcd, and moto (an
//! S3-compatible server, from PyPI). This task looks for each; when
//! something is missing it installs it if it runs as root (Debian or
//! Ubuntu packages through apt-get; moto, and psycopg for the Python
//! client of the fenced-table tests, into a virtual environment under
//! `target/`, so the system's Python is left alone), and otherwise prints
//! the one command that would and stops before running anything. Then it
//! runs `cargo test --workspace --all-features`, with any arguments after
//! `--` passed on.
//!
//! `cargo xtask setup` does the first half only.

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// A Debian package the suites need, and how to tell it is there.
struct Package {
    name: &'static str,
    why: &'static str,
    present: fn() -> bool,
}

const PACKAGES: &[Package] = &[
    Package {
        name: "postgresql",
        why: "server binaries for the throwaway test clusters",
        present: || any_exists("/usr/lib/postgresql/*/bin/initdb") || on_path("initdb"),
    },
    Package {
        name: "postgresql-client",
        why: "pg_regress and isolationtester, for the SQL suites of sql/tests",
        present: || {
            any_exists("/usr/lib/postgresql/*/lib/pgxs/src/test/regress/pg_regress")
                && any_exists("/usr/lib/postgresql/*/lib/pgxs/src/test/isolation/isolationtester")
        },
    },
    Package {
        name: "libpq-dev",
        why: "diesel's postgres backend links libpq",
        present: || {
            Path::new("/usr/include/postgresql/libpq-fe.h").exists() && on_path("pg_config")
        },
    },
    Package {
        name: "pgbouncer",
        why: "the connection pooler tests",
        present: || on_path("pgbouncer") || Path::new("/usr/sbin/pgbouncer").exists(),
    },
    Package {
        name: "patroni",
        why: "the HA manager of the failover tests",
        present: || on_path("patroni"),
    },
    Package {
        name: "etcd-server",
        why: "Patroni's store in the failover tests",
        present: || on_path("etcd"),
    },
    Package {
        name: "etcd-client",
        why: "etcdctl, to look at that store",
        present: || on_path("etcdctl"),
    },
    Package {
        name: "python3-venv",
        why: "a virtual environment for moto",
        present: || {
            moto_on_path()
                || Command::new("python3")
                    .args(["-c", "import ensurepip, venv"])
                    .output()
                    .is_ok_and(|out| out.status.success())
        },
    },
];

fn main() -> ExitCode {
    let args: Vec<OsString> = env::args_os().skip(1).collect();
    let (task, rest) = match args.split_first() {
        Some((task, rest)) => (task.to_string_lossy().into_owned(), rest.to_vec()),
        None => (String::new(), Vec::new()),
    };
    match task.as_str() {
        "test" => match setup() {
            Ok(path) => test(&path, &rest),
            Err(code) => code,
        },
        "setup" => match setup() {
            Ok(_) => ExitCode::SUCCESS,
            Err(code) => code,
        },
        _ => {
            eprintln!("usage: cargo xtask test [-- <cargo test arguments>]   install what the suites need (as root), then run them");
            eprintln!("       cargo xtask setup                               only install what the suites need");
            ExitCode::from(2)
        }
    }
}

/// Installs what is missing (as root) or says how; returns the PATH the
/// tests run with (the moto environment first when there is one).
fn setup() -> Result<OsString, ExitCode> {
    let missing: Vec<&Package> = PACKAGES.iter().filter(|p| !(p.present)()).collect();
    let root = is_root();
    if !missing.is_empty() {
        let names: Vec<&str> = missing.iter().map(|p| p.name).collect();
        for package in &missing {
            eprintln!("xtask: missing {} ({})", package.name, package.why);
        }
        if !root {
            eprintln!(
                "xtask: install them, then run this again:\n\n    sudo apt-get install -y --no-install-recommends {}\n",
                names.join(" ")
            );
            return Err(ExitCode::from(2));
        }
        eprintln!("xtask: installing {}", names.join(" "));
        run_checked(Command::new("apt-get").arg("update"))?;
        run_checked(
            Command::new("apt-get")
                .args(["install", "-y", "--no-install-recommends"])
                .args(&names)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    let mut path = env::var_os("PATH").unwrap_or_default();
    // One virtual environment under the target directory holds moto (unless
    // one is on PATH) and psycopg, the Python client the fenced-table tests
    // write with (they look for it here).
    let venv = target_dir().join("xtask-moto");
    let bin = venv.join("bin");
    let needs_moto = !moto_on_path() && !bin.join("moto_server").exists();
    let has_psycopg = bin.join("python3").exists()
        && Command::new(bin.join("python3"))
            .args(["-c", "import psycopg"])
            .status()
            .is_ok_and(|status| status.success());
    if needs_moto || !has_psycopg {
        eprintln!(
            "xtask: installing moto[server] and psycopg[binary] into {} (a virtual environment; no root needed)",
            venv.display()
        );
        if !bin.join("pip").exists() {
            run_checked(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        }
        run_checked(Command::new(bin.join("pip")).args([
            "install",
            "--quiet",
            "moto[server]",
            "psycopg[binary]",
        ]))?;
    }
    if !moto_on_path() {
        let mut parts = vec![bin];
        parts.extend(env::split_paths(&path));
        path = env::join_paths(parts).map_err(|error| {
            eprintln!("xtask: cannot extend PATH: {error}");
            ExitCode::FAILURE
        })?;
    }
    Ok(path)
}

/// `cargo test --workspace --all-features`, plus `extra`.
fn test(path: &OsString, extra: &[OsString]) -> ExitCode {
    let extra: Vec<&OsString> = match extra.first() {
        Some(first) if first == "--" => extra[1..].iter().collect(),
        _ => extra.iter().collect(),
    };
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("xtask: cargo test --workspace --all-features");
    let status = Command::new(cargo)
        .args(["test", "--workspace", "--all-features"])
        .args(extra)
        .env("PATH", path)
        .current_dir(workspace_root())
        .status();
    match status {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => ExitCode::from(u8::try_from(status.code().unwrap_or(1)).unwrap_or(1)),
        Err(error) => {
            eprintln!("xtask: cannot run cargo: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run_checked(command: &mut Command) -> Result<(), ExitCode> {
    match command.status() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => {
            eprintln!("xtask: {command:?} failed ({status})");
            Err(ExitCode::FAILURE)
        }
        Err(error) => {
            eprintln!("xtask: cannot run {command:?}: {error}");
            Err(ExitCode::FAILURE)
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn target_dir() -> PathBuf {
    env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

fn is_root() -> bool {
    // The effective uid, from the kernel (no libc in this crate).
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|uid| uid == "0"))
        })
        .unwrap_or(false)
}

fn on_path(program: &str) -> bool {
    env::var_os("PATH")
        .map(|path| env::split_paths(&path).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}

fn moto_on_path() -> bool {
    on_path("moto_server")
}

/// Whether `pattern` (one `*` component) matches an existing path.
fn any_exists(pattern: &str) -> bool {
    let Some((head, tail)) = pattern.split_once("/*/") else {
        return Path::new(pattern).exists();
    };
    std::fs::read_dir(head)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .any(|entry| entry.path().join(tail).exists())
        })
        .unwrap_or(false)
}
