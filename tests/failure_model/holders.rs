//! Holder death and hangs: the lease lapses at expiry, no earlier (I6, G2, G6).

use crate::common::*;
use leasehold::Leases;

/// The session dying does not free the lease; expiry does.
fn held_until_expiry_then_taken_over(conn: &mut PgConnection, lease: &Lease) {
    assert_eq!(
        conn.inspect("k").unwrap(),
        Some(LeaseState::Held {
            owner: lease.owner().to_owned(),
            epoch: lease.epoch(),
            expires_at: lease.expires_at()
        }),
        "the holder's death must not free the lease"
    );
    assert_eq!(
        conn.acquire("k", "b", TTL).unwrap(),
        Acquisition::Denied,
        "nobody may take the lease before it expires"
    );
    wait_until_server_time_passes(conn, lease.expires_at());
    let taken = granted(conn.acquire("k", "b", TTL).unwrap());
    assert_eq!(taken.epoch(), lease.epoch().get() + 1);
}

#[test]
fn holder_backend_terminated_keeps_the_lease_until_expiry_then_it_is_taken_over() {
    let cluster = Cluster::start(false);
    let mut holder = cluster.conn();
    let mut observer = cluster.conn();
    let lease = granted(holder.acquire("k", "a", Duration::from_secs(2)).unwrap());
    let pid = backend_pid(&mut holder);
    assert!(query_bool(
        &mut observer,
        &format!("SELECT pg_terminate_backend({pid}) AS flag")
    ));
    wait_until_backend_gone(&mut observer, pid);
    held_until_expiry_then_taken_over(&mut observer, &lease);
    assert!(matches!(
        holder.renew(&leasehold_test_support::grant("k", "a", 1), TTL),
        Err(e) if e.kind() == ErrorKind::OutcomeUnknown || database_error(&e).is_some()
    ));
}

/// A lease holder in a process of its own, driven over stdin/stdout.
struct HolderProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl HolderProcess {
    /// Starts the holder; it acquires `k` as `stalled` with `ttl`.
    fn start(cluster: &Cluster, ttl: Duration) -> (HolderProcess, i64, DateTime<Utc>, i32) {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "holders::holder_process",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HOLDER_ENV, cluster.url())
            .env(HOLDER_TTL_ENV, ttl.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the holder process");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut holder = HolderProcess {
            child,
            stdin,
            stdout,
        };
        let granted = holder.expect_line("GRANTED");
        let fields: Vec<&str> = granted.split(' ').collect();
        let epoch = fields[0].parse().unwrap();
        let expires_at = DateTime::from_timestamp_micros(fields[1].parse().unwrap()).unwrap();
        let backend = fields[2].parse().unwrap();
        (holder, epoch, expires_at, backend)
    }

    /// The rest of the first line starting with `tag `.
    fn expect_line(&mut self, tag: &str) -> String {
        loop {
            let mut line = String::new();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "the holder exited before reporting {tag}");
            // The child's test harness may have printed "test holder_process
            // ... " without a newline first, so look anywhere in the line.
            let line = line.trim_end();
            if let Some(at) = line.find(&format!("{tag} ")) {
                return line[at + tag.len() + 1..].to_owned();
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, sig: libc::c_int) {
        leasehold_test_support::process::send_signal(self.pid(), sig)
            .unwrap_or_else(|error| panic!("signal {sig} to {}: {error}", self.pid()));
    }

    /// The process state letter from /proc (R, S, T, Z...).
    fn state(&self) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        let rest = stat.rsplit_once(')').unwrap().1;
        rest.trim_start().chars().next().unwrap()
    }

    /// Waits (bounded) until the process shows `state` in /proc: a signal is
    /// delivered asynchronously, so `kill` returning does not mean the
    /// process has stopped yet.
    fn wait_for_state(&self, state: char) -> char {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut seen = self.state();
        while seen != state && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
            seen = self.state();
        }
        seen
    }
}

impl Drop for HolderProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Not a test on its own: the holder process of the tests above, selected
/// by [`HOLDER_ENV`]. Acquires `k` as `stalled`, reports, then on `GO`
/// tries to carry on as if nothing had happened and reports each answer.
#[test]
fn holder_process() {
    let Ok(url) = std::env::var(HOLDER_ENV) else {
        return;
    };
    let ttl_ms: u64 = std::env::var(HOLDER_TTL_ENV).unwrap().parse().unwrap();
    let mut conn = PgConnection::establish(&url).unwrap();
    let lease = granted(
        conn.acquire("k", "stalled", Duration::from_millis(ttl_ms))
            .unwrap(),
    );
    let pid = backend_pid(&mut conn);
    let say = |text: String| {
        // Straight to the pipe: println! may be captured by the harness.
        let mut out = std::io::stdout().lock();
        out.write_all(format!("{text}\n").as_bytes()).unwrap();
        out.flush().unwrap();
    };
    say(format!(
        "GRANTED {} {} {pid}",
        lease.epoch(),
        lease.expires_at().timestamp_micros()
    ));
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let renewal = match conn
        .renew(
            &leasehold_test_support::grant("k", "stalled", lease.epoch()),
            TTL,
        )
        .unwrap()
    {
        Renewal::Renewed { .. } => "renewed".to_owned(),
        Renewal::Refused(why) => why.to_string(),
    };
    say(format!("RENEW {renewal}"));
    let describe = |result: Result<(), FencedError<diesel::result::Error>>| match result {
        Ok(()) => "written".to_owned(),
        Err(FencedError::Guard(e)) if stale_epoch_of(&e).is_some() => {
            let (_, _, accepted) = stale_epoch_of(&e).unwrap();
            format!("stale_epoch accepted={accepted}")
        }
        Err(FencedError::Guard(e)) if not_held_reason(&e).is_some() => {
            let reason = not_held_reason(&e).unwrap();
            format!("lease_not_held reason={reason}")
        }
        Err(other) => format!("other {other}"),
    };
    say(format!(
        "TOKEN {}",
        describe(fenced_write(&mut conn, lease.token(), Check::Token))
    ));
    say(format!(
        "HELD {}",
        describe(fenced_write(&mut conn, lease.token(), Check::LeaseHeld))
    ));
}

#[test]
fn holder_process_killed_keeps_the_lease_until_expiry_then_it_is_taken_over() {
    let cluster = Cluster::start(false);
    let mut observer = cluster.conn();
    let (mut holder, epoch, expires_at, backend) =
        HolderProcess::start(&cluster, Duration::from_secs(2));
    holder.signal(libc::SIGKILL);
    holder.child.wait().unwrap();
    // The server notices the dead client and ends its backend.
    wait_until_backend_gone(&mut observer, backend);
    let lease = granted_view("stalled", epoch, expires_at, &mut observer);
    held_until_expiry_then_taken_over(&mut observer, &lease);
}

/// The lease as inspect reports it, checked to be the given grant.
fn granted_view(
    owner: &str,
    epoch: i64,
    expires_at: DateTime<Utc>,
    conn: &mut PgConnection,
) -> Lease {
    assert_eq!(
        conn.inspect("k").unwrap(),
        Some(LeaseState::Held {
            owner: owner.into(),
            epoch: epoch.into(),
            expires_at
        })
    );
    // Re-acquiring as the owner is idempotent: the same grant, as a Lease,
    // and nothing changes.
    granted(conn.acquire("k", owner, TTL).unwrap())
}

/// pg_lease example 3 with a real hang: the holder's process is stopped
/// (no death, no disconnect), its lease lapses and is taken over, the new
/// holder writes; when the old holder resumes, its renew says `lapsed`, its
/// token-checked write is refused as stale and its lease-checked write as
/// lapsed, and nothing of either is visible.
#[test]
fn hung_holder_is_taken_over_at_expiry_and_fenced_when_it_resumes() {
    let cluster = Cluster::start(false);
    let mut conn = cluster.conn();
    let (mut holder, epoch, expires_at, _) =
        HolderProcess::start(&cluster, Duration::from_millis(800));
    holder.signal(libc::SIGSTOP);
    assert_eq!(
        holder.wait_for_state('T'),
        'T',
        "the holder must be stopped"
    );
    wait_until_server_time_passes(&mut conn, expires_at);
    let new = granted(conn.acquire("k", "b", TTL).unwrap());
    assert_eq!(new.epoch(), epoch + 1);
    fenced_write(&mut conn, new.token(), Check::Token).unwrap();
    holder.signal(libc::SIGCONT);
    holder.stdin.write_all(b"GO\n").unwrap();
    assert_eq!(
        holder.expect_line("RENEW"),
        "lapsed, and taken over at epoch 2"
    );
    assert_eq!(holder.expect_line("TOKEN"), "stale_epoch accepted=2");
    assert_eq!(
        holder.expect_line("HELD"),
        "lease_not_held reason=lapsed, and taken over at epoch 2"
    );
    assert_eq!(writes(&mut conn), ["b@2"]);
    assert_eq!(
        conn.inspect("k").unwrap(),
        Some(LeaseState::Held {
            owner: "b".into(),
            epoch: 2.into(),
            expires_at: new.expires_at()
        })
    );
}
