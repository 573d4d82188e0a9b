//! `leasehold run KEY -- CMD`: real child processes (sh scripts) under a
//! real lease. The scripts announce what they reach by creating files; the
//! tests wait for those files and for database state, never for a time.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::connection::SimpleConnection;
use leasehold::{LeaseState, Leases};

use crate::support::{command, wait_until_server_time_passes, Db, BIN};
use leasehold::guard::Check;
use leasehold::guard::Fencing;

/// A scratch directory for one test's scripts and marker files.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-run-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Waits (bounded) until `path` exists.
fn wait_for_file(path: &Path) {
    let started = Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Starts `leasehold run` in the background against `db`.
fn spawn_run(db: &Db, args: &[&str]) -> Child {
    let mut full = vec!["--database-url", db.url.as_str(), "run"];
    full.extend_from_slice(args);
    command(&full)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("cannot start {BIN}: {error}"))
}

/// Waits (bounded) for `child` to exit; its exit code.
fn exit_code(child: Child) -> (i32, String) {
    let output = child.wait_with_output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn held_by(db: &Db, key: &str) -> Option<(String, i64, DateTime<Utc>)> {
    match db.conn().inspect(key).unwrap() {
        Some(LeaseState::Held {
            owner,
            epoch,
            expires_at,
        }) => Some((owner, epoch.get(), expires_at)),
        _ => None,
    }
}

/// The nanoseconds since the epoch a script wrote with `date +%s%N`.
fn stamp(path: &Path) -> DateTime<Utc> {
    let nanos: i64 = fs::read_to_string(path).unwrap().trim().parse().unwrap();
    DateTime::from_timestamp_nanos(nanos)
}

#[test]
fn the_command_gets_the_grant_and_run_exits_with_its_status_and_releases() {
    let db = Db::installed();
    let dir = scratch("status");
    let env_file = dir.join("env");
    let script = format!(
        "echo \"$LEASEHOLD_KEY|$LEASEHOLD_OWNER|$LEASEHOLD_EPOCH|$LEASEHOLD_TOKEN\" > {}; exit 3",
        env_file.display()
    );
    let run = db.run(&["run", "job", "--owner", "cron-a", "--", "sh", "-c", &script]);
    assert_eq!(run.code, 3, "{run:?}");
    let line = fs::read_to_string(&env_file).unwrap();
    let fields: Vec<&str> = line.trim().split('|').collect();
    assert_eq!(&fields[..3], &["job", "cron-a", "1"]);
    let token: leasehold::FencingToken = fields[3].parse().unwrap();
    assert_eq!(
        (token.key(), token.owner(), token.epoch()),
        ("job", "cron-a", leasehold::Epoch::new(1))
    );
    assert_eq!(held_by(&db, "job"), None, "released after the command");

    // A command ended by a signal: 128 + the signal, as a shell reports it.
    let run = db.run(&["run", "job", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(run.code, 128 + 15, "{run:?}");
    assert_eq!(held_by(&db, "job"), None);

    // A held key: denied (3) and the command never runs.
    let mut holder = db.conn();
    let _held = holder
        .acquire("job", "other", Duration::from_secs(60))
        .unwrap();
    let never = dir.join("never");
    let run = db.run(&["run", "job", "--", "touch", never.to_str().unwrap()]);
    assert_eq!(run.code, 3, "{run:?}");
    assert!(!never.exists());

    // A command that cannot start: 13, and the lease is released.
    let run = db.run(&["run", "free-key", "--", "/nonexistent/command"]);
    assert_eq!(run.code, 13, "{run:?}");
    assert!(run.stderr.contains("/nonexistent/command"), "{run:?}");
    assert_eq!(held_by(&db, "free-key"), None);

    // No command: a usage error.
    let run = db.run(&["run", "job"]);
    assert_eq!(run.code, 2, "{run:?}");
    fs::remove_dir_all(dir).unwrap();
}

/// The lease is taken away (an operator's force-release, a successor's
/// grant and its fence of the resource): the keeper's next renew is
/// refused, the command gets SIGTERM, and the guarded write it attempts
/// then with its token is refused as stale. `run` exits 4.
#[test]
fn a_lost_lease_stops_the_command_and_its_stale_guarded_write_is_refused() {
    let db = Db::installed();
    let dir = scratch("lost");
    let started = dir.join("started");
    let script = dir.join("job.sh");
    fs::write(
        &script,
        format!(
            r#"on_term() {{
    date +%s%N > {dir}/term
    psql "$TEST_URL" -v ON_ERROR_STOP=1 -qAt -c "SELECT lease.admit('res', '$LEASEHOLD_KEY', $LEASEHOLD_EPOCH)" > /dev/null 2> {dir}/admit.err
    echo $? > {dir}/admit.code
    exit 0
}}
trap on_term TERM
touch {started}
while :; do sleep 0.02; done
"#,
            dir = dir.display(),
            started = started.display()
        ),
    )
    .unwrap();
    let mut run_cmd = {
        let mut full = vec![
            "--database-url",
            db.url.as_str(),
            "run",
            "job",
            "--ttl",
            "3s",
        ];
        full.extend_from_slice(&["--", "sh", script.to_str().unwrap()]);
        command(&full)
    };
    let child = run_cmd
        .env("TEST_URL", db.url.as_str())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_file(&started);
    let mut operator = db.conn();
    // The job's own guarded write while it holds the lease is admitted.
    let (owner, epoch, _) = held_by(&db, "job").unwrap();
    let job_token =
        leasehold::FencingToken::new("job", &owner, leasehold::Epoch::from(epoch)).unwrap();
    operator.admit("res", &job_token, Check::Token).unwrap();
    // Taken away: freed, granted to a successor, the resource fenced to it.
    let taken_at = chrono::Utc::now();
    operator
        .batch_execute("SELECT lease.force_release('job')")
        .unwrap();
    let successor = match operator
        .acquire("job", "successor", Duration::from_secs(60))
        .unwrap()
    {
        leasehold::Acquisition::Granted(lease) => lease,
        leasehold::Acquisition::Denied => panic!("the successor was denied"),
    };
    operator.admit("res", &successor, Check::Token).unwrap();

    let (code, stderr) = exit_code(child);
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("lost"), "{stderr}");
    // The keeper renews every ttl/3 = 1 s: the refusal is seen at the next
    // renew, and SIGTERM follows it at once, well within the ttl.
    assert!(dir.join("term").exists(), "the command never got SIGTERM");
    let reacted = (stamp(&dir.join("term")) - taken_at)
        .to_std()
        .unwrap_or(Duration::ZERO);
    assert!(
        reacted < Duration::from_secs(3),
        "SIGTERM {reacted:?} after the loss"
    );
    let admit_code = fs::read_to_string(dir.join("admit.code")).unwrap();
    assert_ne!(admit_code.trim(), "0", "the stale write was admitted");
    let admit_err = fs::read_to_string(dir.join("admit.err")).unwrap();
    assert!(admit_err.contains("stale"), "{admit_err}");
    // The successor's grant is untouched.
    assert_eq!(
        held_by(&db, "job").map(|(owner, epoch, _)| (owner, epoch)),
        Some(("successor".to_owned(), successor.epoch().get()))
    );
    eprintln!("lost lease: SIGTERM {reacted:?} after the force-release");
    fs::remove_dir_all(dir).unwrap();
}

/// Renewals cannot get through (the lease row is locked by an open
/// transaction): the keeper's safe deadline passes, and the command gets
/// SIGTERM at that deadline, before the server's expiry of the last
/// renewed grant, never later.
#[test]
fn when_renewals_stall_the_command_is_stopped_at_the_safe_deadline() {
    let db = Db::installed();
    let dir = scratch("stall");
    let started = dir.join("started");
    let term = dir.join("term");
    let script = format!(
        "trap 'date +%s%N > {term}; exit 0' TERM; touch {started}; while :; do sleep 0.02; done",
        term = term.display(),
        started = started.display()
    );
    let child = spawn_run(
        &db,
        &[
            "job", "--ttl", "3s", "--grace", "1s", "--", "sh", "-c", &script,
        ],
    );
    wait_for_file(&started);
    // Hold the row: every renew from now on waits, and none commits.
    let mut blocker = db.conn();
    blocker
        .batch_execute("BEGIN; SELECT 1 FROM lease.leases WHERE key = 'job' FOR UPDATE")
        .unwrap();
    let (_, _, expires_at) = held_by(&db, "job").unwrap();
    wait_for_file(&term);
    blocker.batch_execute("ROLLBACK").unwrap();
    let (code, stderr) = exit_code(child);
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("before the safe deadline"), "{stderr}");
    let stopped = stamp(&term);
    // The last renew that committed set expires_at = its server time + 3 s;
    // its safe deadline was sent + 3 s - 0.3 s (the margin, ttl/10).
    let before_expiry = (expires_at - stopped).to_std().unwrap_or(Duration::ZERO);
    assert!(
        stopped < expires_at,
        "SIGTERM at {stopped}, after the server's expiry {expires_at}"
    );
    // No earlier than the deadline of that renew: its expiry less the
    // margin, less however long the renew took to reach the server (up to
    // the ttl on a loaded machine; here bounded below the ttl).
    assert!(
        before_expiry < Duration::from_millis(2_900),
        "SIGTERM {before_expiry:?} before the expiry: earlier than the safe deadline"
    );
    eprintln!("stalled renewals: SIGTERM {before_expiry:?} before the server's expiry (margin 300 ms); run said: {stderr}");
    fs::remove_dir_all(dir).unwrap();
}

/// A command that ignores SIGTERM is killed (SIGKILL) once the grace after
/// the loss has passed.
#[test]
fn a_command_that_ignores_sigterm_is_killed_after_the_grace() {
    let db = Db::installed();
    let dir = scratch("ignores");
    let started = dir.join("started");
    let script = format!(
        "trap '' TERM; touch {started}; while :; do sleep 0.02; done",
        started = started.display()
    );
    let child = spawn_run(
        &db,
        &[
            "job", "--ttl", "3s", "--grace", "500ms", "--", "sh", "-c", &script,
        ],
    );
    wait_for_file(&started);
    let taken = Instant::now();
    db.conn()
        .batch_execute("SELECT lease.force_release('job')")
        .unwrap();
    let (code, stderr) = exit_code(child);
    let reacted = taken.elapsed();
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("ended by signal 9"), "{stderr}");
    // The refusal at the next renew (at most ttl/3 = 1 s), then the grace:
    // never before the grace, and not left running.
    assert!(
        reacted >= Duration::from_millis(500) && reacted < Duration::from_secs(10),
        "killed {reacted:?} after the loss"
    );
    fs::remove_dir_all(dir).unwrap();
}

/// `--hold-at-least`: the command ends at once, the grant stays until the
/// minimum since it began, and a second runner is denied meanwhile; after
/// that, the next runner gets the key.
#[test]
fn hold_at_least_keeps_a_second_runner_out_until_it_has_passed() {
    let db = Db::installed();
    let began = leasehold_test_support::server_now(&mut db.conn());
    let run = db.run(&[
        "run",
        "job",
        "--owner",
        "first",
        "--hold-at-least",
        "4s",
        "--",
        "true",
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    let (owner, epoch, expires_at) = held_by(&db, "job").expect("held after the command ended");
    assert_eq!((owner.as_str(), epoch), ("first", 1));
    let held_for = (expires_at - began).to_std().unwrap();
    // At least the 4 s asked for, and not the 30 s ttl it was granted for.
    assert!(
        held_for >= Duration::from_secs(4) && held_for < Duration::from_secs(20),
        "held until {held_for:?} after it began"
    );
    let second = db.run(&["run", "job", "--owner", "second", "--", "true"]);
    assert_eq!(second.code, 3, "{second:?}");
    wait_until_server_time_passes(&mut db.conn(), expires_at);
    let third = db.run(&["run", "job", "--owner", "third", "--", "true"]);
    assert_eq!(third.code, 0, "{third:?}");
    assert_eq!(held_by(&db, "job"), None);
}

/// SIGTERM to `run` reaches the command; when the command exits, the lease
/// is released and `run` exits with the command's status.
#[test]
fn a_signal_to_run_reaches_the_command_and_the_lease_is_released() {
    let db = Db::installed();
    let dir = scratch("signal");
    let started = dir.join("started");
    let got = dir.join("got");
    let script = format!(
        "trap 'touch {got}; exit 7' TERM; touch {started}; while :; do sleep 0.02; done",
        got = got.display(),
        started = started.display()
    );
    let child = spawn_run(&db, &["job", "--", "sh", "-c", &script]);
    wait_for_file(&started);
    assert!(held_by(&db, "job").is_some());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let (code, stderr) = exit_code(child);
    assert_eq!(code, 7, "{stderr}");
    assert!(got.exists(), "the command never got the signal");
    assert_eq!(held_by(&db, "job"), None, "released after the signal");
    fs::remove_dir_all(dir).unwrap();
}

/// Whether process `pid` is gone (or only a zombie nobody reaped yet).
fn gone(pid: &str) -> bool {
    match fs::read_to_string(format!("/proc/{}/stat", pid.trim())) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// A script that starts a child and a grandchild (their output away from
/// `run`'s pipes, so a `run` that left them running still ends), writes
/// their pids, and then `then` (a shell command).
fn family_script(dir: &Path, then: &str) -> String {
    format!(
        "sleep 1000 >/dev/null 2>&1 & echo $! > {dir}/child.pid
         sh -c 'sleep 1000 & echo $! > {dir}/grandchild.pid; wait' >/dev/null 2>&1 &
         while [ ! -s {dir}/grandchild.pid ]; do sleep 0.01; done
         touch {dir}/started
         {then}",
        dir = dir.display()
    )
}

/// The lease lost: the command's children and grandchildren stop with it,
/// before `run` reports the loss.
#[test]
fn a_lost_lease_stops_the_commands_children_and_grandchildren() {
    let db = Db::installed();
    let dir = scratch("family");
    let script = family_script(&dir, "wait");
    let child = spawn_run(
        &db,
        &[
            "job", "--ttl", "3s", "--grace", "500ms", "--", "sh", "-c", &script,
        ],
    );
    wait_for_file(&dir.join("started"));
    let pids = [
        fs::read_to_string(dir.join("child.pid")).unwrap(),
        fs::read_to_string(dir.join("grandchild.pid")).unwrap(),
    ];
    assert!(pids.iter().all(|pid| !gone(pid)), "the family never ran");
    db.conn()
        .batch_execute("SELECT lease.force_release('job')")
        .unwrap();
    let (code, stderr) = exit_code(child);
    assert_eq!(code, 4, "{stderr}");
    for pid in &pids {
        assert!(
            gone(pid),
            "process {} outlived the lost lease: {stderr}",
            pid.trim()
        );
    }
    fs::remove_dir_all(dir).unwrap();
}

/// The command exits and leaves a process behind in its group: `run` stops
/// it before it releases the lease, so no part of the job runs unleased.
#[test]
fn what_the_command_leaves_running_stops_before_the_lease_is_released() {
    let db = Db::installed();
    let dir = scratch("leftovers");
    let script = family_script(&dir, "exit 0");
    let child = spawn_run(&db, &["job", "--grace", "500ms", "--", "sh", "-c", &script]);
    let (code, stderr) = exit_code(child);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("left processes"), "{stderr}");
    for name in ["child.pid", "grandchild.pid"] {
        let pid = fs::read_to_string(dir.join(name)).unwrap();
        assert!(gone(&pid), "{name} {} outlived the job", pid.trim());
    }
    assert_eq!(held_by(&db, "job"), None);
    fs::remove_dir_all(dir).unwrap();
}

/// `run --help` says that the whole job is stopped, not only CMD.
#[test]
fn run_help_says_the_whole_process_group_is_stopped() {
    let help = crate::support::run(&["run", "--help"]);
    assert_eq!(help.code, 0);
    let text = help.stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        text.contains("CMD runs in a process group of its own")
            && text.contains("children and grandchildren"),
        "{}",
        help.stdout
    );
}
