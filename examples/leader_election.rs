//! Three replicas elect a leader that writes to a fenced table; the leader
//! is killed (-9), paused (-STOP, then -CONT) and stopped (SIGTERM), and
//! each replica says what it sees and when. A paused leader that wakes sees
//! its term lost before it writes again; had a write been under way, the
//! table would refuse it by itself, its term's token being no longer live.
//!
//! Run: `cargo run --example leader_election` (embedded throwaway
//! PostgreSQL, or the server in `DATABASE_URL`).

use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection};
use leasehold::guard::Fencing;
use leasehold::hold::{CancelToken, Election, LeaderChange, LeaderWatch, StopReason, WorkOutcome};
use leasehold::{LeaseClient, LeaseError};
use leasehold_local::{DatabaseServer, LocalPostgres};
use leasehold_test_support::process::{send_signal, SIGCONT, SIGKILL, SIGSTOP, SIGTERM};

const TTL: Duration = Duration::from_secs(2);
static TERMINATED: AtomicBool = AtomicBool::new(false);

/// One replica: campaign, lead (a fenced write every 200 ms) until the term
/// ends, campaign again; SIGTERM resigns and exits.
#[allow(unsafe_code)] // signal(2), for SIGTERM.
fn replica(url: &str, me: &str) -> Result<(), Box<dyn std::error::Error>> {
    extern "C" fn on_term(_: libc::c_int) {
        TERMINATED.store(true, Ordering::SeqCst);
    }
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe { libc::signal(libc::SIGTERM, on_term as *const () as libc::sighandler_t) };
    let client = LeaseClient::builder(url).max_size(3).build()?;
    let election = Election::new(&client, "scheduler", me, TTL);
    let mut conn = PgConnection::establish(url)?;
    // A replica paused inside its fenced write holds off its successor
    // until the transaction ends: let the server end it.
    conn.batch_execute("SET idle_in_transaction_session_timeout = '1s'")?;
    let shutdown = CancelToken::new();
    while !shutdown.is_cancelled() {
        let term = election.campaign(Duration::from_millis(300));
        let Ok(term) = term else { continue };
        let epoch = term.token().epoch();
        println!("  {me}: leading, term {epoch}");
        let ended: WorkOutcome<(), StopReason> = term.lead(&shutdown, |ctx| loop {
            ctx.sleep(Duration::from_millis(200))?;
            if TERMINATED.load(Ordering::SeqCst) {
                shutdown.cancel();
                return Err(StopReason::Cancelled);
            }
            let written = conn.transaction(|conn| {
                conn.present(ctx.token())?;
                let insert =
                    format!("INSERT INTO results (term, replica) VALUES ({epoch}, '{me}')");
                conn.batch_execute(&insert).map_err(LeaseError::from)
            });
            if let Err(refused) = written {
                println!("  {me}: write of term {epoch} refused: {refused}");
            }
        });
        println!("  {me}: stopped leading term {epoch}: {ended:?}");
    }
    Ok(())
}

/// Waits until a replica other than `old` leads, as the watch reports
/// changes (notified, not polled); its name and how long it took.
fn next_leader(watch: &mut LeaderWatch, old: Option<&str>) -> (String, Duration) {
    let started = Instant::now();
    loop {
        match watch.recv() {
            LeaderChange::Elected(leader) if Some(leader.candidate.as_str()) != old => {
                return (leader.candidate, started.elapsed());
            }
            LeaderChange::Lapsed { candidate, .. } => {
                println!("  (the term of {candidate} lapsed)")
            }
            _ => {}
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, role, url, me] = &args[..] {
        if role == "replica" {
            return replica(url, me);
        }
    }
    let server = DatabaseServer::from_env_or_start(LocalPostgres::builder())?;
    let url = server.url();
    let mut setup = PgConnection::establish(&url)?;
    leasehold::install(&mut setup)?;
    setup.batch_execute(
        "DROP TABLE IF EXISTS results;
         CREATE TABLE results (id bigserial PRIMARY KEY, term bigint, replica text);
         SELECT lease.protect_table('results', 'scheduler');",
    )?;
    let spawn = |me: &str| -> std::io::Result<Child> {
        Command::new(&args[0]).args(["replica", &url, me]).spawn()
    };
    let mut replicas: Vec<(String, Child)> = Vec::new();
    for me in ["replica-1", "replica-2", "replica-3"] {
        replicas.push((me.to_owned(), spawn(me)?));
    }
    let watcher = Election::new(&LeaseClient::connect(&url, 1)?, "scheduler", "watcher", TTL);
    let mut watch = watcher.observe()?;
    let pid = |name: &str, replicas: &[(String, Child)]| {
        replicas
            .iter()
            .find(|(me, _)| me == name)
            .map(|(_, child)| child.id())
    };
    let (mut leader, _) = next_leader(&mut watch, None);
    println!("{leader} leads");
    for (signal, what) in [
        (SIGKILL, "kill -9"),
        (SIGSTOP, "kill -STOP"),
        (SIGTERM, "kill -TERM"),
    ] {
        std::thread::sleep(Duration::from_secs(1));
        println!("{what} {leader}");
        let old = pid(&leader, &replicas).ok_or("no such replica")?;
        send_signal(old, signal)?;
        let (next, took) = next_leader(&mut watch, Some(&leader));
        println!("{next} leads, {} ms later", took.as_millis());
        if signal == SIGSTOP {
            std::thread::sleep(Duration::from_secs(1));
            println!("kill -CONT {leader}: it wakes past its safe deadline and stops");
            send_signal(old, SIGCONT)?;
            std::thread::sleep(Duration::from_secs(1));
        }
        if signal == SIGKILL {
            replicas.retain(|(me, _)| *me != leader);
            replicas.push((
                format!("{leader}-again"),
                spawn(&format!("{leader}-again"))?,
            ));
        }
        leader = next;
    }
    std::thread::sleep(Duration::from_secs(1));
    for (_, child) in &mut replicas {
        let _ = send_signal(child.id(), SIGTERM);
        let _ = child.wait();
    }
    // Every term wrote after the one before it: never two leaders at once.
    setup.batch_execute(
        "DO $$ BEGIN IF EXISTS (SELECT FROM (SELECT term, lag(term) OVER (ORDER BY id) AS before
             FROM results) AS t WHERE term < before) THEN RAISE 'terms interleaved'; END IF; END $$",
    )?;
    println!("the table's rows: every term after the one before it");
    Ok(())
}
