//! Three candidates in processes of their own elect a leader that writes
//! to a fenced table; the leader is killed (SIGKILL), then the next one
//! paused (SIGSTOP, then SIGCONT). One leader at a time: the table itself
//! is the independent record, every row carrying the term that wrote it,
//! and no row of a term follows a row of a later term. A killed or paused
//! leader is replaced within its ttl plus the takeover margin; a leader
//! paused inside its fenced write holds off the next grant (as
//! SPECIFICATION.md §1.5 says) until the server's
//! `idle_in_transaction_session_timeout` ends its transaction, so each
//! candidate sets one and most pauses here land inside a write.

use std::sync::mpsc;
use std::time::Instant;

use leasehold::guard::Fencing;
use leasehold::hold::{CancelToken, Election, StopReason, WorkOutcome};
use leasehold::LeaseClient;

use crate::common::*;

const ELECTION_ENV: &str = "LEASEHOLD_FAILURE_MODEL_CANDIDATE";
const CANDIDATE_TTL: Duration = Duration::from_secs(1);
/// How long after its grant lapses a waiting candidate may take to lead:
/// it wakes at the holder's expiry on the server's clock, or at its poll.
const TAKEOVER_MARGIN: Duration = Duration::from_secs(2);
/// The candidates' `idle_in_transaction_session_timeout`: how long a
/// paused leader's open fenced write can hold off its successor.
const IDLE_WRITE_LIMIT: Duration = Duration::from_secs(1);

/// Not a test on its own: a candidate, selected by [`ELECTION_ENV`]
/// (`<url> <name>`). Campaigns, and while leading writes a row of its term
/// in a transaction held open 20 ms, every 25 ms, saying `LEADING <term>`
/// when a term begins.
#[test]
fn candidate_process() {
    let Ok(args) = std::env::var(ELECTION_ENV) else {
        return;
    };
    let (url, me) = args.split_once(' ').unwrap();
    let client = LeaseClient::builder(url).max_size(3).build().unwrap();
    let election = Election::new(&client, "scheduler", me, CANDIDATE_TTL);
    let mut conn = PgConnection::establish(url).unwrap();
    conn.batch_execute(&format!(
        "SET idle_in_transaction_session_timeout = {}",
        IDLE_WRITE_LIMIT.as_millis()
    ))
    .unwrap();
    loop {
        let Ok(term) = election.campaign(Duration::from_secs(1)) else {
            continue;
        };
        let epoch = term.token().epoch();
        let mut out = std::io::stdout().lock();
        out.write_all(format!("LEADING {epoch} {me}\n").as_bytes())
            .unwrap();
        out.flush().unwrap();
        drop(out);
        let _: WorkOutcome<(), StopReason> = term.lead(&CancelToken::new(), |ctx| loop {
            ctx.sleep(Duration::from_millis(5))?;
            let _ = conn.transaction(|conn| {
                conn.present(ctx.token())?;
                conn.batch_execute(&format!(
                    "INSERT INTO results (term, candidate) VALUES ({epoch}, '{me}');
                     SELECT pg_sleep(0.02)"
                ))
                .map_err(leasehold::LeaseError::from)
            });
        });
    }
}

/// A candidate process and the terms it reports.
struct Candidate {
    child: Child,
}

impl Drop for Candidate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts candidate `name`; its `LEADING` lines go to `terms`.
fn candidate(cluster: &Cluster, name: &str, terms: mpsc::Sender<(i64, String)>) -> Candidate {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "election::candidate_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ELECTION_ENV, format!("{} {name}", cluster.url()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start a candidate");
    let stdout = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if let Some(at) = line.find("LEADING ") {
                let mut fields = line[at + "LEADING ".len()..].split(' ');
                let term = fields.next().unwrap().parse().unwrap();
                let _ = terms.send((term, fields.next().unwrap().to_owned()));
            }
        }
    });
    Candidate { child }
}

#[test]
fn three_candidates_lead_one_at_a_time_through_a_kill_and_a_pause() {
    let cluster = Cluster::start(false);
    cluster
        .conn()
        .batch_execute(
            "CREATE TABLE results (id bigserial PRIMARY KEY, term bigint NOT NULL, candidate text NOT NULL);
             SELECT lease.protect_table('results', 'scheduler');",
        )
        .unwrap();
    let (terms, led) = mpsc::channel();
    let candidates: Vec<(String, Candidate)> = ["c1", "c2", "c3"]
        .into_iter()
        .map(|name| (name.to_owned(), candidate(&cluster, name, terms.clone())))
        .collect();
    let pid = |name: &str| {
        candidates
            .iter()
            .find(|(candidate, _)| candidate == name)
            .map(|(_, c)| c.child.id())
            .unwrap()
    };
    let bound = CANDIDATE_TTL + TAKEOVER_MARGIN;
    // A pause inside a write first waits out the server's idle limit.
    let paused_bound = bound + IDLE_WRITE_LIMIT;
    let next = |after: i64| {
        let (term, leader): (i64, String) = led.recv_timeout(Duration::from_secs(30)).unwrap();
        assert!(term > after, "term {term} after {after}");
        (term, leader)
    };
    let (first, leader) = next(0);
    // Let it write a while, then kill it: the next leads within the bound.
    std::thread::sleep(Duration::from_millis(300));
    leasehold_test_support::process::send_signal(pid(&leader), libc::SIGKILL).unwrap();
    let killed = Instant::now();
    let (second, paused) = next(first);
    assert!(
        killed.elapsed() < bound,
        "took over after {:?}",
        killed.elapsed()
    );
    std::thread::sleep(Duration::from_millis(300));
    leasehold_test_support::process::send_signal(pid(&paused), libc::SIGSTOP).unwrap();
    let stopped = Instant::now();
    let (third, _) = next(second);
    assert!(
        stopped.elapsed() < paused_bound,
        "took over after {:?}",
        stopped.elapsed()
    );
    // The paused leader wakes past its term and writes no more under it.
    leasehold_test_support::process::send_signal(pid(&paused), libc::SIGCONT).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    drop(candidates);

    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        count: i64,
    }
    let count = |sql: &str| -> i64 {
        diesel::sql_query(sql)
            .get_result::<Count>(&mut cluster.conn())
            .unwrap()
            .count
    };
    // Every term wrote, and in order: no row of a term after one of a later term.
    for term in [first, second, third] {
        assert!(
            count(&format!(
                "SELECT count(*) AS count FROM results WHERE term = {term}"
            )) > 0
        );
    }
    assert_eq!(
        count(
            "SELECT count(*) AS count FROM (SELECT term, max(term) OVER (ORDER BY id) AS highest
             FROM results) AS t WHERE term < highest"
        ),
        0,
        "a deposed leader's write landed after its successor's"
    );
    // One candidate per term.
    assert_eq!(
        count(
            "SELECT count(*) AS count FROM (SELECT term FROM results GROUP BY term
             HAVING count(DISTINCT candidate) > 1) AS t"
        ),
        0
    );
}
