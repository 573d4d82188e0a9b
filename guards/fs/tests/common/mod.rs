//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

/// A fresh, empty directory on the real disk (under cargo's target dir, not
/// tmpfs), unique per test and process.
pub fn scratch(name: &str) -> PathBuf {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("lhfs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// A self-describing payload: length and every byte derive from `epoch`, so
/// a reader can tell whether it holds exactly one whole version.
pub fn payload(epoch: i64, base_len: usize) -> Vec<u8> {
    let len = base_len + (epoch as usize * 7919) % 4096;
    let mut state = (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// The temporary files (of any writer) the guard keeps next to `path`.
pub fn temp_files(path: &Path) -> Vec<PathBuf> {
    let name = path.file_name().unwrap().to_str().unwrap();
    let prefix = format!(".{name}.lhfs-tmp.");
    let mut found: Vec<PathBuf> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|entry| {
            entry
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .collect();
    found.sort();
    found
}

/// The lock file the guard keeps next to `path`.
pub fn lock_path(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap().to_str().unwrap();
    path.with_file_name(format!(".{name}.lhfs-lock"))
}

pub const ROLE: &str = "LHFS_CHILD_ROLE";

/// A variable the parent set for a child.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("child needs {name}"))
}

/// Re-runs this test executable as a child playing `role` (see each test
/// file's `child_entry`), with `vars` in its environment.
pub fn spawn_child(role: &str, vars: &[(&str, String)]) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["child_entry", "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    for (name, value) in vars {
        command.env(name, value);
    }
    command.spawn().unwrap()
}

/// The message of a line a child printed with [`say`]. The test harness of
/// the child may print `test child_entry ... ` before it on the same line.
pub fn message(line: &str) -> Option<&str> {
    line.trim_end()
        .split_once("LHFS ")
        .map(|(_, message)| message)
}

/// Reads the child's stdout until a `LHFS ` line satisfying `want`; returns
/// it. Panics if the child exits first.
pub fn wait_for(out: &mut BufReader<ChildStdout>, want: impl Fn(&str) -> bool) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child exited early");
        if let Some(message) = message(&line) {
            if want(message) {
                return message.to_owned();
            }
        }
    }
}

/// Safety net only: aborts the test process if a test hangs (a bug), so it
/// fails instead of blocking forever. Children notice the parent's death
/// (broken stdout or closed stdin) and exit too.
pub struct Watchdog(#[allow(dead_code)] std::sync::mpsc::Sender<()>);

/// Starts the safety-net timer for the test `name`.
pub fn watchdog(name: &'static str) -> Watchdog {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
            rx.recv_timeout(Duration::from_secs(600))
        {
            eprintln!("{name} hung for 10 minutes; aborting");
            std::process::abort();
        }
    });
    Watchdog(tx)
}

/// Prints a line the parent waits for.
pub fn say(message: &str) {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "LHFS {message}").unwrap();
    stdout.flush().unwrap();
}
