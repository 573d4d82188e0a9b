//! Real OS processes: concurrent writers with mixed epochs, and writers
//! killed with SIGKILL in the middle of a write.
//!
//! Children are this test executable re-run with `LHFS_CHILD_ROLE` set, which
//! makes the otherwise empty `child_entry` test play the role. Parent and
//! children synchronise on lines the children print (prefixed `LHFS `), never
//! on timing.

mod common;

use std::collections::HashSet;
use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::OnceLock;
use std::time::Duration;

use common::{
    env, message, payload, say, scratch, spawn_child, temp_files, wait_for, watchdog, ROLE,
};
use leasehold::FencingToken;
use leasehold_fs::{hooks, FenceError, FencedFile};

const BIG: usize = 4 * 1024 * 1024;

fn token(epoch: i64) -> FencingToken {
    FencingToken::new(
        "shared",
        &format!("pid-{}", std::process::id()),
        leasehold::Epoch::from(epoch),
    )
    .unwrap()
}

fn append_line(path: &Path, line: &str) {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    file.write_all(format!("{line}\n").as_bytes()).unwrap();
}

/// Entry point of the child roles; does nothing in a normal test run.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        "mixed-writer" => mixed_writer(),
        "hang-at" => hang_at(),
        "loop-writer" => loop_writer(),
        "soak-writer" => soak_writer(),
        other => panic!("unknown child role {other}"),
    }
    std::process::exit(0);
}

// ---- concurrent writers with mixed epochs ----------------------------------

static CURRENT: OnceLock<std::sync::Mutex<(String, usize)>> = OnceLock::new();

/// Runs while the write lock is held, right after the rename: the order of
/// lines in the shared commit log is therefore the commit order.
fn log_commit(phase: &'static str, _path: &Path, epoch: i64) {
    if phase == "renamed" {
        let (child, seq) = CURRENT.get().unwrap().lock().unwrap().clone();
        append_line(
            Path::new(&env("LHFS_COMMIT_LOG")),
            &format!("{epoch} {child} {seq}"),
        );
    }
}

fn mixed_payload(child: &str, seq: usize, epoch: i64) -> Vec<u8> {
    let mut bytes = format!("child={child} seq={seq} epoch={epoch};").into_bytes();
    bytes.extend(payload(epoch, 8 * 1024));
    bytes
}

fn mixed_epoch(child: usize, seq: usize) -> i64 {
    // Rising baseline plus per-child jitter: lots of overlap between children.
    let mut x = (child as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (seq as u64 * 0xBF58_476D);
    x ^= x >> 29;
    1 + seq as i64 + (x % 7) as i64
}

fn mixed_writer() {
    let child = env("LHFS_CHILD");
    let index: usize = child.parse().unwrap();
    let count: usize = env("LHFS_COUNT").parse().unwrap();
    let own_log = PathBuf::from(env("LHFS_OWN_LOG"));
    CURRENT
        .set(std::sync::Mutex::new((child.clone(), 0)))
        .unwrap();
    assert!(hooks::install(log_commit));
    let file = FencedFile::new(env("LHFS_FILE")).unwrap();

    say("ready");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    assert_eq!(go.trim(), "go");

    for seq in 0..count {
        let epoch = mixed_epoch(index, seq);
        *CURRENT.get().unwrap().lock().unwrap() = (child.clone(), seq);
        match file.write(&token(epoch), &mixed_payload(&child, seq, epoch)) {
            // Logged only after write() returned Ok.
            Ok(record) => {
                assert_eq!(record.accepted_epoch, epoch);
                append_line(&own_log, &format!("ok {epoch} {seq}"));
            }
            Err(FenceError::StaleEpoch {
                presented,
                accepted,
                ..
            }) => append_line(&own_log, &format!("stale {presented} {accepted} {seq}")),
            Err(other) => panic!("unexpected error: {other}"),
        }
    }
}

#[test]
fn concurrent_writer_processes_commit_epochs_in_non_decreasing_order() {
    let _watchdog = watchdog("concurrent_writer_processes_commit_epochs_in_non_decreasing_order");
    const CHILDREN: usize = 4;
    const COUNT: usize = 60;
    let dir = scratch("mixed");
    let data = dir.join("data");
    let commit_log = dir.join("commits.log");
    let mut children: Vec<Child> = (0..CHILDREN)
        .map(|child| {
            spawn_child(
                "mixed-writer",
                &[
                    ("LHFS_CHILD", child.to_string()),
                    ("LHFS_COUNT", COUNT.to_string()),
                    ("LHFS_FILE", data.display().to_string()),
                    (
                        "LHFS_OWN_LOG",
                        dir.join(format!("child-{child}.log")).display().to_string(),
                    ),
                    ("LHFS_COMMIT_LOG", commit_log.display().to_string()),
                ],
            )
        })
        .collect();
    // Start them together: wait until every child is ready, then release all.
    for child in &mut children {
        let mut out = BufReader::new(child.stdout.take().unwrap());
        wait_for(&mut out, |m| m == "ready");
        child.stdout = Some(out.into_inner());
    }
    for child in &mut children {
        child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    }
    for child in &mut children {
        assert!(child.wait().unwrap().success(), "a writer process failed");
    }

    // Commit order (written under the lock): epochs never go down.
    let commits: Vec<(i64, usize, usize)> = fs::read_to_string(&commit_log)
        .unwrap()
        .lines()
        .map(|line| {
            let mut parts = line.split(' ').map(|p| p.parse::<i64>().unwrap());
            let (e, c, s) = (
                parts.next().unwrap(),
                parts.next().unwrap(),
                parts.next().unwrap(),
            );
            (e, c as usize, s as usize)
        })
        .collect();
    for pair in commits.windows(2) {
        assert!(
            pair[1].0 >= pair[0].0,
            "epoch went down in commit order: {pair:?}"
        );
    }
    let committed: HashSet<(usize, usize)> = commits.iter().map(|&(_, c, s)| (c, s)).collect();
    let committed_epochs: HashSet<i64> = commits.iter().map(|c| c.0).collect();

    // Every acknowledged write was committed, at its position in that order;
    // every refusal named a higher epoch that really was accepted.
    let (mut oks, mut stales) = (0, 0);
    for child in 0..CHILDREN {
        let log = fs::read_to_string(dir.join(format!("child-{child}.log"))).unwrap();
        let mut last_ok = 0;
        for line in log.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let seq: usize = fields.last().unwrap().parse().unwrap();
            let presented: i64 = fields[1].parse().unwrap();
            assert_eq!(presented, mixed_epoch(child, seq));
            if fields[0] == "ok" {
                oks += 1;
                assert!(
                    committed.contains(&(child, seq)),
                    "ok write {line} not in commit log"
                );
                assert!(
                    presented >= last_ok,
                    "child {child} saw its own epochs go down"
                );
                last_ok = presented;
            } else {
                stales += 1;
                let accepted: i64 = fields[2].parse().unwrap();
                assert!(presented < accepted, "refused without cause: {line}");
                assert!(
                    committed_epochs.contains(&accepted),
                    "refused by a phantom epoch: {line}"
                );
            }
        }
        assert_eq!(log.lines().count(), COUNT);
    }
    assert_eq!(oks, commits.len());
    assert!(
        oks > 20 && stales > 20,
        "test should exercise both ({oks} ok, {stales} stale)"
    );

    // The file holds the last commit, which has the maximum epoch.
    let &(max_epoch, child, seq) = commits.last().unwrap();
    assert_eq!(max_epoch, commits.iter().map(|c| c.0).max().unwrap());
    let (epoch, bytes) = FencedFile::new(&data).unwrap().read().unwrap();
    assert_eq!(epoch, max_epoch);
    assert_eq!(bytes, mixed_payload(&child.to_string(), seq, epoch.get()));
    fs::remove_dir_all(dir).unwrap();
}

// ---- SIGKILL at each crash point -------------------------------------------

fn hang_hook(phase: &'static str, _path: &Path, _epoch: i64) {
    if phase == env("LHFS_PHASE") {
        say(&format!("at {phase}"));
        // Stay inside the write until killed. Should the parent die instead,
        // stdin reaches end of file and this child does not linger.
        let _ = std::io::stdin().read_line(&mut String::new());
        std::process::exit(3);
    }
}

fn hang_at() {
    assert!(hooks::install(hang_hook));
    let epoch: i64 = env("LHFS_EPOCH").parse().unwrap();
    let file = FencedFile::new(env("LHFS_FILE")).unwrap();
    file.write(&token(epoch), &payload(epoch, BIG)).unwrap();
    panic!("the hook should have stopped this write");
}

/// Checks that the file holds exactly one whole version and returns its
/// epoch.
fn assert_one_whole_version(path: &Path) -> i64 {
    let file = FencedFile::new(path).unwrap();
    let (epoch, bytes) = file.read().expect("header and payload must parse");
    assert!(
        bytes == payload(epoch.get(), BIG),
        "payload is not exactly version {epoch}"
    );
    assert_eq!(file.record().unwrap().unwrap().accepted_epoch, epoch);
    epoch.get()
}

#[test]
fn sigkill_at_every_crash_point_leaves_one_whole_version() {
    let _watchdog = watchdog("sigkill_at_every_crash_point_leaves_one_whole_version");
    let dir = scratch("crashpoints");
    // (phase, whether the new version is in place when the writer dies)
    let phases = [
        ("locked", false),
        ("temp-partial", false),
        ("temp-synced", false),
        ("renamed", true),
        ("dir-synced", true),
    ];
    for (round, (phase, committed)) in phases.into_iter().enumerate() {
        let path = dir.join(format!("data-{round}"));
        let file = FencedFile::new(&path).unwrap();
        file.write(&token(10), &payload(10, BIG)).unwrap();

        let mut child = spawn_child(
            "hang-at",
            &[
                ("LHFS_PHASE", phase.to_string()),
                ("LHFS_EPOCH", "11".to_string()),
                ("LHFS_FILE", path.display().to_string()),
            ],
        );
        let mut out = BufReader::new(child.stdout.take().unwrap());
        wait_for(&mut out, |m| m == format!("at {phase}"));
        child.kill().unwrap(); // SIGKILL
        assert!(!child.wait().unwrap().success());

        let epoch = assert_one_whole_version(&path);
        assert_eq!(epoch, if committed { 11 } else { 10 }, "killed at {phase}");
        assert_eq!(
            !temp_files(&path).is_empty(),
            matches!(phase, "temp-partial" | "temp-synced"),
            "temp file after kill at {phase}"
        );
        // The dead writer's lock is gone and its leftovers don't get in the way.
        assert!(file
            .write(&token(epoch - 1), b"stale")
            .unwrap_err()
            .is_stale());
        file.write(&token(12), &payload(12, BIG)).unwrap();
        assert_eq!(assert_one_whole_version(&path), 12);
        assert!(temp_files(&path).is_empty());
    }
    fs::remove_dir_all(dir).unwrap();
}

// ---- SIGKILL at arbitrary moments ------------------------------------------

fn loop_writer() {
    let file = FencedFile::new(env("LHFS_FILE")).unwrap();
    let first: i64 = env("LHFS_FIRST_EPOCH").parse().unwrap();
    for epoch in first.. {
        let bytes = payload(epoch, BIG);
        say(&format!("begin {epoch}"));
        file.write(&token(epoch), &bytes).unwrap();
        say(&format!("ok {epoch}"));
    }
}

#[test]
fn sigkill_at_arbitrary_moments_never_tears_or_lowers_the_file() {
    let _watchdog = watchdog("sigkill_at_arbitrary_moments_never_tears_or_lowers_the_file");
    let dir = scratch("randomkill");
    let path = dir.join("data");
    let mut floor = 0;
    let mut torn_temp_seen = 0;
    for round in 0..10u64 {
        let first = floor + 1;
        let mut child = spawn_child(
            "loop-writer",
            &[
                ("LHFS_FILE", path.display().to_string()),
                ("LHFS_FIRST_EPOCH", first.to_string()),
            ],
        );
        let mut out = BufReader::new(child.stdout.take().unwrap());
        // Kill inside or between writes: after the (round % 3 + 1)-th write
        // began, plus a varying delay to land at different points of it.
        // Correctness never depends on where the kill lands.
        let target = first + (round % 3) as i64;
        wait_for(&mut out, |m| m == format!("begin {target}"));
        std::thread::sleep(Duration::from_micros(round * 2_300 % 17_000));
        child.kill().unwrap();
        child.wait().unwrap();
        // Everything the child printed before it died: acknowledged writes.
        let mut acknowledged = floor;
        let mut began = floor;
        for line in out.lines() {
            let line = line.unwrap();
            let message = message(&line).unwrap_or("");
            if let Some(epoch) = message.strip_prefix("ok ") {
                acknowledged = acknowledged.max(epoch.parse().unwrap());
            }
            if let Some(epoch) = message.strip_prefix("begin ") {
                began = began.max(epoch.parse().unwrap());
            }
        }
        began = began.max(target);
        if !temp_files(&path).is_empty() {
            torn_temp_seen += 1;
        }
        let epoch = if round == 0 && !path.exists() {
            0
        } else {
            assert_one_whole_version(&path)
        };
        assert!(
            epoch >= acknowledged,
            "round {round}: acknowledged {acknowledged} lost, file at {epoch}"
        );
        assert!(
            epoch >= floor,
            "round {round}: record went down from {floor} to {epoch}"
        );
        assert!(epoch <= began, "round {round}: epoch {epoch} never written");
        floor = epoch;
    }
    eprintln!("kills that left a temporary file behind: {torn_temp_seen}/10; final epoch {floor}");
    assert!(floor >= 5, "writes should have made progress across rounds");
    fs::remove_dir_all(dir).unwrap();
}

// ---- soak: random SIGSTOP, SIGCONT and SIGKILL (not part of the suite) ----

/// Writes rising epochs forever. Refused as stale, it takes over as a new
/// holder would: the next epoch above the one the file accepted. Says
/// `ok <epoch>` after every acknowledged write.
fn soak_writer() {
    let file = FencedFile::new(env("LHFS_FILE")).unwrap();
    let mut epoch: i64 = env("LHFS_FIRST_EPOCH").parse().unwrap();
    loop {
        match file.write(&token(epoch), &payload(epoch, 256 * 1024)) {
            Ok(_) => {
                say(&format!("ok {epoch}"));
                epoch += 1;
            }
            Err(FenceError::StaleEpoch { accepted, .. }) => epoch = accepted.get(),
            Err(FenceError::Busy { .. }) => {}
            Err(other) => panic!("unexpected error: {other}"),
        }
    }
}

/// Soak: three writer processes on one file while the parent stops,
/// resumes and kills them at random for `LHFS_SOAK_SECS` seconds (default
/// 60); the file must always hold one whole version, its epoch must never
/// go down, and it must never be below an epoch a writer was told was
/// written. Run with
/// `cargo test -p leasehold-fs --all-features --test processes -- --ignored soak`.
#[test]
#[ignore = "soak: run on demand (see the crate README)"]
fn soak_random_stops_and_kills_never_tear_lower_or_lose_an_acknowledged_write() {
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::sync::Arc;
    let seconds: u64 = std::env::var("LHFS_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let dir = scratch("soak");
    let path = dir.join("data");
    let acknowledged = Arc::new(AtomicI64::new(0));
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("soak seed {seed}, {seconds} s");
    let mut random = move |bound: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % bound
    };
    let spawn = |first: i64, acknowledged: Arc<AtomicI64>| {
        let mut child = spawn_child(
            "soak-writer",
            &[
                ("LHFS_FILE", path.display().to_string()),
                ("LHFS_FIRST_EPOCH", first.to_string()),
            ],
        );
        let out = BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if let Some(epoch) = message(&line).and_then(|m| m.strip_prefix("ok ")) {
                    acknowledged.fetch_max(epoch.parse().unwrap(), Ordering::SeqCst);
                }
            }
        });
        child
    };
    let mut children: Vec<Child> = (0..3).map(|i| spawn(1 + i, acknowledged.clone())).collect();
    let pid = |child: &Child| nix::unistd::Pid::from_raw(child.id() as i32);
    let started = std::time::Instant::now();
    let (mut floor, mut checks, mut kills, mut stops) = (0, 0, 0, 0);
    while started.elapsed() < Duration::from_secs(seconds) {
        let victim = random(3) as usize;
        match random(4) {
            0 => {
                nix::sys::signal::kill(pid(&children[victim]), nix::sys::signal::Signal::SIGKILL)
                    .unwrap();
                children[victim].wait().unwrap();
                let first = acknowledged.load(Ordering::SeqCst) + 1;
                children[victim] = spawn(first, acknowledged.clone());
                kills += 1;
            }
            _ => {
                nix::sys::signal::kill(pid(&children[victim]), nix::sys::signal::Signal::SIGSTOP)
                    .unwrap();
                std::thread::sleep(Duration::from_millis(random(50)));
                nix::sys::signal::kill(pid(&children[victim]), nix::sys::signal::Signal::SIGCONT)
                    .unwrap();
                stops += 1;
            }
        }
        // Read the acknowledged epoch before the file: the file must be at
        // or above it.
        let known = acknowledged.load(Ordering::SeqCst);
        if path.exists() {
            let epoch = assert_one_whole_soak_version(&path);
            assert!(
                epoch >= floor,
                "the epoch went down from {floor} to {epoch}"
            );
            assert!(
                epoch >= known,
                "acknowledged epoch {known} lost: the file is at {epoch}"
            );
            floor = epoch;
            checks += 1;
        }
    }
    for child in &mut children {
        let _ = nix::sys::signal::kill(pid(child), nix::sys::signal::Signal::SIGCONT);
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let epoch = assert_one_whole_soak_version(&path);
    assert!(epoch >= acknowledged.load(Ordering::SeqCst));
    eprintln!("soak: {checks} checks, {stops} stops, {kills} kills, final epoch {epoch}");
    assert!(epoch > 10, "the writers should have made progress");
    fs::remove_dir_all(dir).unwrap();
}

fn assert_one_whole_soak_version(path: &Path) -> i64 {
    let (epoch, bytes) = FencedFile::new(path)
        .unwrap()
        .read()
        .expect("header and payload must parse");
    assert!(
        bytes == payload(epoch.get(), 256 * 1024),
        "not exactly version {epoch}"
    );
    epoch.get()
}
