//! Finding the PostgreSQL server binaries (`initdb`, `postgres`, `pg_ctl`)
//! installed on this machine.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::LocalServerError;

/// Environment variable naming a directory with `initdb`, `postgres` and
/// `pg_ctl`; it takes precedence over every automatic search.
pub const BIN_DIR_ENV: &str = "LEASEHOLD_PG_BIN";

/// Where the Debian/Ubuntu packages install each major version's binaries
/// (`<base>/<version>/bin`).
const VERSIONED_INSTALLS: &str = "/usr/lib/postgresql";

/// Finds the server binaries; see [`crate::LocalPostgresBuilder::bin_dir`]
/// for the search order and why an explicit choice is never replaced.
pub(crate) fn find_bin_dir(explicit: Option<&Path>) -> Result<PathBuf, LocalServerError> {
    if let Some(dir) = explicit {
        return only(dir.to_owned());
    }
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV).filter(|v| !v.is_empty()) {
        return only(PathBuf::from(dir));
    }
    let mut searched = Vec::new();
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if is_executable(&dir.join("initdb")) && is_executable(&dir.join("postgres")) {
                if qualifies(&dir) {
                    return Ok(dir);
                }
                searched.push(dir);
            }
        }
        searched.push(PathBuf::from("$PATH"));
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        if out.status.success() {
            let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if qualifies(&dir) {
                return Ok(dir);
            }
            searched.push(dir);
        }
    }
    if let Some(dir) = highest_versioned_install() {
        return Ok(dir);
    }
    searched.push(Path::new(VERSIONED_INSTALLS).join("*").join("bin"));
    Err(LocalServerError::BinariesNotFound { searched })
}

/// `dir` if it qualifies, else an error naming only `dir`: an explicit
/// choice that is wrong must not silently fall back to another install.
fn only(dir: PathBuf) -> Result<PathBuf, LocalServerError> {
    if qualifies(&dir) {
        Ok(dir)
    } else {
        Err(LocalServerError::BinariesNotFound {
            searched: vec![dir],
        })
    }
}

/// The `bin` directory of the highest qualifying version under
/// [`VERSIONED_INSTALLS`], comparing versions numerically (`15` > `9.6`).
fn highest_versioned_install() -> Option<PathBuf> {
    let mut versions: Vec<(Vec<u64>, PathBuf)> = fs::read_dir(VERSIONED_INSTALLS)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let version = name
                        .split('.')
                        .map(|part| part.parse::<u64>().ok())
                        .collect::<Option<Vec<u64>>>()?;
                    Some((version, entry.path().join("bin")))
                })
                .collect()
        })
        .unwrap_or_default();
    versions.sort();
    versions
        .into_iter()
        .rev()
        .map(|(_, dir)| dir)
        .find(|dir| qualifies(dir))
}

/// Whether `dir` holds all three programs a server's life cycle needs.
fn qualifies(dir: &Path) -> bool {
    ["initdb", "postgres", "pg_ctl"]
        .iter()
        .all(|name| is_executable(&dir.join(name)))
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}
