//! What `/proc` says about processes: liveness, children, our own uid.
//!
//! Linux only; elsewhere each function falls back to a portable command or
//! an empty answer, which only weakens the waits that use them.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

/// The effective uid of this process.
pub(crate) fn effective_uid() -> Option<u32> {
    if let Ok(status) = fs::read_to_string("/proc/self/status") {
        if let Some(line) = status.lines().find(|l| l.starts_with("Uid:")) {
            // Uid: real effective saved fs
            if let Some(euid) = line.split_whitespace().nth(2) {
                return euid.parse().ok();
            }
        }
    }
    let out = Command::new("id").arg("-u").output().ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// Whether a process with this pid exists and is not a zombie (a zombie
/// holds no resources, and our orphans may be reparented to an init that
/// does not reap them).
pub(crate) fn process_alive(pid: u32) -> bool {
    if Path::new("/proc/self/stat").exists() {
        return match fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => stat_fields(&stat).is_some_and(|f| f.first() != Some(&"Z")),
            Err(_) => false,
        };
    }
    Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Pids of the live children of `parent` (Linux only; empty elsewhere).
pub(crate) fn child_pids(parent: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let parent = parent.to_string();
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(entry.path().join("stat")).ok()?;
            let fields = stat_fields(&stat)?;
            (fields.get(1) == Some(&parent.as_str())).then_some(pid)
        })
        .collect()
}

/// The fields of `/proc/<pid>/stat` after the command name: state, ppid, ...
/// The name is skipped up to the *last* `)`, because it may itself contain
/// spaces and parentheses.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_skip_command_names_with_spaces() {
        let stat = "42 (postgres: check pointer) S 7 42 42 0";
        assert_eq!(stat_fields(stat).and_then(|f| f.get(1).copied()), Some("7"));
    }
}
