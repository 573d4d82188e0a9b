//! Faults outside the guard's control, played with real processes and real
//! files: a directory swapped between two writers, a lock file deleted
//! during a write, a holder stopped (SIGSTOP) inside its write while an
//! operator fences, and entries that are not regular files (a symbolic link
//! placed after `new`, a FIFO, names shaped like the guard's sidecars).
//!
//! Children are this test executable re-run with `LHFS_CHILD_ROLE` set (see
//! `child_entry`). A child pauses inside its write at the phases the parent
//! names, says where it is and waits for a line on stdin: the parent drives
//! the interleaving step by step, never by timing.

mod common;

use std::fs;
use std::io::{BufReader, Write};
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::{Child, ChildStdout};
use std::sync::mpsc;
use std::time::Duration;

use common::{env, payload, say, scratch, spawn_child, wait_for, watchdog, ROLE};
use leasehold::FencingToken;
use leasehold_fs::{hooks, FenceError, FencedFile};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const SIZE: usize = 1024 * 1024;

fn token(owner: &str, epoch: i64) -> FencingToken {
    FencingToken::new("shared", owner, leasehold::Epoch::from(epoch)).unwrap()
}

/// Entry point of the child roles; does nothing in a normal test run.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        "paused-writer" => paused_writer(),
        other => panic!("unknown child role {other}"),
    }
    std::process::exit(0);
}

/// At each phase listed in `LHFS_PAUSES`, says `at <phase>` and waits for a
/// line on stdin before it goes on.
fn pause_hook(phase: &'static str, _path: &Path, _epoch: i64) {
    if env("LHFS_PAUSES").split(',').any(|p| p == phase) {
        say(&format!("at {phase}"));
        let mut line = String::new();
        if std::io::stdin().read_line(&mut line).unwrap_or(0) == 0 {
            std::process::exit(4); // the parent is gone
        }
    }
}

/// Writes `payload(epoch)` to `LHFS_FILE` once, pausing where told, then
/// says `ok <epoch>` or `err <error>`.
fn paused_writer() {
    assert!(hooks::install(pause_hook));
    let epoch: i64 = env("LHFS_EPOCH").parse().unwrap();
    let file = FencedFile::new(env("LHFS_FILE")).unwrap();
    match file.write(&token("child", epoch), &payload(epoch, SIZE)) {
        Ok(record) => say(&format!("ok {}", record.accepted_epoch)),
        Err(error) => say(&format!("err {error:?}")),
    }
}

/// A paused writer child and its stdout.
struct Writer {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Writer {
    fn start(file: &Path, epoch: i64, pauses: &str) -> Self {
        let mut child = spawn_child(
            "paused-writer",
            &[
                ("LHFS_FILE", file.display().to_string()),
                ("LHFS_EPOCH", epoch.to_string()),
                ("LHFS_PAUSES", pauses.to_string()),
            ],
        );
        let out = BufReader::new(child.stdout.take().unwrap());
        Self { child, out }
    }

    fn wait_at(&mut self, phase: &str) {
        let want = format!("at {phase}");
        wait_for(&mut self.out, |m| m == want);
    }

    fn resume(&mut self) {
        self.child
            .stdin
            .as_mut()
            .unwrap()
            .write_all(b"go\n")
            .unwrap();
    }

    /// The child's final word: `ok <epoch>` or `err <error>`.
    fn outcome(mut self) -> String {
        let message = wait_for(&mut self.out, |m| {
            m.starts_with("ok ") || m.starts_with("err ")
        });
        assert!(self.child.wait().unwrap().success());
        message
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }
}

/// Checks that `path` holds exactly version `epoch`, whole.
fn assert_version(path: &Path, epoch: i64) {
    let (found, bytes) = FencedFile::new(path)
        .unwrap()
        .read()
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    assert_eq!(found, epoch, "{}", path.display());
    assert!(
        bytes == payload(epoch, SIZE),
        "{} does not hold exactly version {epoch}",
        path.display()
    );
}

/// `cur -> v1` is re-pointed to `v2` (a copy) while the old holder is
/// inside its write: the old holder stays in v1 from start to end, the new
/// one in v2, and neither removes, renames or tears the other's version.
#[test]
fn a_directory_swapped_between_two_writers_tears_and_loses_nothing() {
    let _watchdog = watchdog("a_directory_swapped_between_two_writers_tears_and_loses_nothing");
    let root = scratch("swap");
    let (v1, v2, cur) = (root.join("v1"), root.join("v2"), root.join("cur"));
    fs::create_dir(&v1).unwrap();
    FencedFile::new(v1.join("data"))
        .unwrap()
        .write(&token("seed", 1), &payload(1, SIZE))
        .unwrap();
    fs::create_dir(&v2).unwrap();
    fs::copy(v1.join("data"), v2.join("data")).unwrap();
    symlink("v1", &cur).unwrap();

    // The old holder (epoch 1) takes v1's lock and stops there.
    let mut old = Writer::start(&cur.join("data"), 1, "locked,temp-partial");
    old.wait_at("locked");
    // cur is atomically re-pointed to v2.
    symlink("v2", root.join("cur.next")).unwrap();
    fs::rename(root.join("cur.next"), &cur).unwrap();
    // The new holder (epoch 2) takes v2's lock and syncs its temporary file.
    let mut new = Writer::start(&cur.join("data"), 2, "temp-synced");
    new.wait_at("temp-synced");
    // The old holder resumes, writes half its version and stops again.
    old.resume();
    old.wait_at("temp-partial");
    // The new holder commits, then the old one.
    new.resume();
    assert_eq!(new.outcome(), "ok 2");
    old.resume();
    assert_eq!(
        old.outcome(),
        "ok 1",
        "the old holder wrote into v1, where it began"
    );

    assert_version(&v2.join("data"), 2);
    assert_version(&cur.join("data"), 2);
    assert_version(&v1.join("data"), 1);
    fs::remove_dir_all(root).unwrap();
}

/// The lock file is deleted while a writer holds it; a second writer then
/// locks a new lock file and commits. The first one notices before its
/// rename and abandons its write: the acknowledged write stays.
#[test]
fn a_lock_file_deleted_during_a_write_lets_only_one_writer_commit() {
    let _watchdog = watchdog("a_lock_file_deleted_during_a_write_lets_only_one_writer_commit");
    let dir = scratch("lockdeleted");
    let path = dir.join("data");
    let file = FencedFile::new(&path).unwrap();
    file.write(&token("seed", 1), &payload(1, SIZE)).unwrap();

    let mut first = Writer::start(&path, 2, "temp-synced");
    first.wait_at("temp-synced");
    fs::remove_file(common::lock_path(&path)).unwrap();
    file.write(&token("second", 3), &payload(3, SIZE)).unwrap();
    first.resume();
    let outcome = first.outcome();
    assert!(outcome.starts_with("err LockLost"), "{outcome}");

    assert_version(&path, 3);
    assert!(common::temp_files(&path).is_empty());
    fs::remove_dir_all(dir).unwrap();
}

/// A holder stopped (SIGSTOP) inside its write: an operator's fence gives
/// up after its lock wait with `Busy`, naming the holder, and changes
/// nothing. Killed, the holder's write never lands and the fence goes
/// through; resumed instead, the holder lands first and the fence after it,
/// never the other way round.
#[test]
fn a_stopped_holder_makes_a_fence_busy_and_never_overtakes_it() {
    let _watchdog = watchdog("a_stopped_holder_makes_a_fence_busy_and_never_overtakes_it");
    let dir = scratch("stopped");
    for resume in [false, true] {
        let path = dir.join(format!("data-{resume}"));
        let file = FencedFile::new(&path)
            .unwrap()
            .with_lock_wait(Duration::from_millis(300));
        file.write(&token("seed", 10), &payload(10, SIZE)).unwrap();

        let mut holder = Writer::start(&path, 11, "temp-synced");
        holder.wait_at("temp-synced");
        kill(holder.pid(), Signal::SIGSTOP).unwrap();
        match file.fence("shared", leasehold::Epoch::from(11)) {
            Err(FenceError::Busy { holder: pid, .. }) => {
                assert_eq!(
                    pid,
                    Some(holder.child.id()),
                    "Busy names the stopped holder"
                )
            }
            other => panic!("expected Busy, got {other:?}"),
        }
        assert_version(&path, 10);
        // Nothing fenced yet: the file admits from the epoch it holds.
        assert_eq!(file.record().unwrap().unwrap().accepted_epoch, 10);

        if resume {
            kill(holder.pid(), Signal::SIGCONT).unwrap();
            holder.resume();
            assert_eq!(holder.outcome(), "ok 11");
            let record = file.fence("shared", leasehold::Epoch::from(11)).unwrap();
            assert_eq!(record.accepted_epoch, 12);
            assert_version(&path, 11);
        } else {
            kill(holder.pid(), Signal::SIGKILL).unwrap();
            assert!(!holder.child.wait().unwrap().success());
            let record = file.fence("shared", leasehold::Epoch::from(11)).unwrap();
            assert_eq!(record.accepted_epoch, 12);
            assert_version(&path, 10);
        }
        // Either way, epoch 11 can never write again.
        let refused = file.write(&token("late", 11), b"late").unwrap_err();
        assert!(refused.is_stale(), "{refused:?}");
    }
    fs::remove_dir_all(dir).unwrap();
}

/// A symbolic link placed at the path after `new()` is never followed: the
/// write and the read are refused and the link and its target stay as they
/// were.
#[test]
fn a_symlink_placed_at_the_path_after_new_is_refused() {
    let dir = scratch("symlink-late");
    let path = dir.join("data");
    let target = dir.join("elsewhere");
    let file = FencedFile::new(&path).unwrap();
    FencedFile::new(&target)
        .unwrap()
        .write(&token("t", 5), b"target")
        .unwrap();
    symlink(&target, &path).unwrap();

    for outcome in [
        file.write(&token("a", 6), b"through the link").map(|_| ()),
        file.read().map(|_| ()),
        file.fence("shared", leasehold::Epoch::from(9)).map(|_| ()),
    ] {
        match outcome {
            Err(FenceError::NotRegularFile { found, entry, .. }) => {
                assert_eq!(found, "a symbolic link");
                assert_eq!(entry, path);
            }
            other => panic!("expected NotRegularFile, got {other:?}"),
        }
    }
    assert!(fs::symlink_metadata(&path)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        FencedFile::new(&target).unwrap().read().unwrap(),
        (leasehold::Epoch::new(5), b"target".to_vec())
    );
    fs::remove_dir_all(dir).unwrap();
}

/// Runs `operation` on a thread and waits for it a bounded time, so a call
/// that hangs fails the test instead of blocking it.
fn within<T: Send + 'static>(operation: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(operation());
    });
    receiver
        .recv_timeout(Duration::from_secs(30))
        .expect("the operation hung")
}

/// A FIFO at the fenced name or at its lock file is refused at once; no
/// call blocks on it.
#[test]
fn a_fifo_at_the_path_or_its_lock_is_refused_without_hanging() {
    let dir = scratch("fifo");
    for fifo_at in ["data", ".data.lhfs-lock"] {
        let sub = dir.join(fifo_at.trim_start_matches('.'));
        fs::create_dir(&sub).unwrap();
        let path = sub.join("data");
        let file = FencedFile::new(&path).unwrap();
        nix::unistd::mkfifo(&sub.join(fifo_at), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let writer = file.clone();
        let outcomes = within(move || {
            vec![
                writer.write(&token("a", 1), b"x").map(|_| ()),
                writer
                    .fence("shared", leasehold::Epoch::from(1))
                    .map(|_| ()),
            ]
        });
        for outcome in outcomes {
            match outcome {
                Err(FenceError::NotRegularFile { found, entry, .. }) => {
                    assert_eq!(found, "a FIFO");
                    assert_eq!(entry, sub.join(fifo_at));
                }
                other => panic!("FIFO at {fifo_at}: expected NotRegularFile, got {other:?}"),
            }
        }
        if fifo_at == "data" {
            let reader = file.clone();
            match within(move || reader.read()) {
                Err(FenceError::NotRegularFile {
                    found: "a FIFO", ..
                }) => {}
                other => panic!("read of a FIFO: expected NotRegularFile, got {other:?}"),
            }
        }
    }
    fs::remove_dir_all(dir).unwrap();
}

/// Names shaped like a fenced file's sidecars cannot be fenced files: a
/// write of `report` would remove or replace them.
#[test]
fn names_shaped_like_sidecars_are_refused() {
    let dir = scratch("sidecars");
    for name in [
        ".report.lhfs-tmp",
        ".report.lhfs-tmp.123.4",
        ".report.lhfs-lock",
    ] {
        match FencedFile::new(dir.join(name)) {
            Err(FenceError::InvalidPath { reason, .. }) => {
                assert!(reason.contains("lock or temporary file"), "{reason}")
            }
            other => panic!("{name}: expected InvalidPath, got {other:?}"),
        }
    }
    // Ordinary hidden names and look-alikes without the leading dot are fine.
    for name in [".report", "report.lhfs-lock", "lhfs-tmp"] {
        let file = FencedFile::new(dir.join(name)).unwrap();
        file.write(&token("a", 1), b"fine").unwrap();
    }
    fs::remove_dir_all(dir).unwrap();
}

/// Documented: deleting a fenced file deletes its record, so the next write
/// of any epoch is admitted; fencing the new file to the lease's epoch
/// before any holder writes restores the floor.
#[test]
fn deleting_a_fenced_file_forgets_its_record_until_it_is_fenced_again() {
    let dir = scratch("deleted");
    let path = dir.join("data");
    let file = FencedFile::new(&path).unwrap();
    file.write(&token("a", 5), b"five").unwrap();
    fs::remove_file(&path).unwrap();
    // What the docs warn about: the stale epoch 3 is admitted now.
    assert_eq!(
        file.write(&token("old", 3), b"three")
            .unwrap()
            .accepted_epoch,
        3
    );
    // What they recommend: fence to the lease's epoch first.
    fs::remove_file(&path).unwrap();
    file.fence("shared", leasehold::Epoch::from(5)).unwrap();
    assert!(file
        .write(&token("old", 3), b"three")
        .unwrap_err()
        .is_stale());
    assert!(file.write(&token("a", 5), b"five").unwrap_err().is_stale());
    assert_eq!(
        file.write(&token("b", 6), b"six").unwrap().accepted_epoch,
        6
    );
    fs::remove_dir_all(dir).unwrap();
}
