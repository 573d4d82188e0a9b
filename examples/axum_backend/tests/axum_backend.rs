//! The axum job service, served on a loopback port against a real
//! PostgreSQL (a throwaway server, a database per test) and driven by a
//! real HTTP client (reqwest). Every wait is on state the service or the
//! database reports, bounded; none is a sleep that hopes.

use std::time::Duration;

use axum_backend::service::Service;
use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use leasehold::aio::AsyncFencing;
use leasehold::aio::AsyncLeases;
use leasehold::aio::AsyncOperator;
use leasehold::{Epoch, LeaseState};
use leasehold_test_support::{wait_for_lock_waiter, TestDb, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

/// A fresh database and the service on a free loopback port.
struct Fixture {
    // Fields drop in order: the service is told to stop before its
    // database is dropped.
    _service: Service,
    db: TestDb,
    base: String,
    http: reqwest::Client,
}

impl Fixture {
    async fn start() -> Fixture {
        // An empty database: the service installs leasehold itself.
        let db = TestDb::empty_on(TestServer::local());
        let service = Service::start(&db.url, "127.0.0.1:0", 4)
            .await
            .expect("start the service");
        assert!(service.addr().ip().is_loopback());
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("HTTP client");
        Fixture {
            base: format!("http://{}", service.addr()),
            _service: service,
            db,
            http,
        }
    }

    /// A connection of the test's own, beside the service's pool.
    async fn conn(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&self.db.url)
            .await
            .expect("connect to the test database")
    }

    /// One request; `body` is sent as JSON (with its content type).
    async fn send(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.header("Fencing-Token", token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|error| panic!("{method} {path}: {error}"));
        let status = response.status().as_u16();
        let text = response.text().await.expect("read the response body");
        let body = serde_json::from_str(&text)
            .unwrap_or_else(|error| panic!("{method} {path}: not JSON ({error}): {text}"));
        (status, body)
    }

    async fn claim(&self, job: &str, worker: &str, ttl_ms: u64) -> (u16, Value) {
        let body = json!({"worker": worker, "ttl_ms": ttl_ms});
        self.send(
            Method::POST,
            &format!("/jobs/{job}/claim"),
            None,
            Some(body),
        )
        .await
    }

    async fn heartbeat(&self, job: &str, token: &str) -> (u16, Value) {
        let body = json!({"ttl_ms": 30_000});
        let path = format!("/jobs/{job}/heartbeat");
        self.send(Method::POST, &path, Some(token), Some(body))
            .await
    }

    async fn submit(&self, job: &str, token: &str, result: Value) -> (u16, Value) {
        let path = format!("/jobs/{job}/result");
        let body = json!({ "result": result });
        self.send(Method::PUT, &path, Some(token), Some(body)).await
    }

    async fn show(&self, job: &str) -> (u16, Value) {
        self.send(Method::GET, &format!("/jobs/{job}"), None, None)
            .await
    }

    /// Every stored result, read from the table itself.
    async fn stored(&self) -> Vec<StoredRow> {
        diesel::sql_query(
            "SELECT job, worker, epoch, result::text AS result
               FROM leasehold_example.job_results ORDER BY job",
        )
        .load::<StoredRow>(&mut self.conn().await)
        .await
        .expect("read leasehold_example.job_results")
    }
}

#[derive(QueryableByName, Debug, PartialEq)]
struct StoredRow {
    #[diesel(sql_type = Text)]
    job: String,
    #[diesel(sql_type = Text)]
    worker: String,
    #[diesel(sql_type = BigInt)]
    epoch: i64,
    #[diesel(sql_type = Text)]
    result: String,
}

fn row(job: &str, worker: &str, epoch: i64, result: &str) -> StoredRow {
    StoredRow {
        job: job.into(),
        worker: worker.into(),
        epoch,
        result: result.into(),
    }
}

fn token_of(claim: &Value) -> String {
    claim["token"]
        .as_str()
        .unwrap_or_else(|| panic!("no token in {claim}"))
        .to_owned()
}

#[tokio::test]
async fn a_claimed_job_heartbeats_and_its_result_is_stored() {
    let fixture = Fixture::start().await;
    let (status, claim) = fixture.claim("job-1", "worker-a", 30_000).await;
    assert_eq!(status, 200, "{claim}");
    assert_eq!(claim["job"], "job-1");
    assert_eq!(claim["worker"], "worker-a");
    assert_eq!(claim["epoch"], 1);
    let token = token_of(&claim);
    assert_eq!(token, "lh1.1.job-1.worker-a");

    let (status, beat) = fixture.heartbeat("job-1", &token).await;
    assert_eq!(status, 200, "{beat}");
    assert_eq!(beat["epoch"], 1);
    assert!(beat["expires_at"]
        .as_str()
        .is_some_and(|at| at.ends_with('Z')));

    let (status, stored) = fixture.submit("job-1", &token, json!({"rows": 42})).await;
    assert_eq!(status, 200, "{stored}");
    assert_eq!(stored, json!({"job": "job-1", "stored": true, "epoch": 1}));
    assert_eq!(
        fixture.stored().await,
        vec![row("job-1", "worker-a", 1, r#"{"rows": 42}"#)]
    );
    let (status, shown) = fixture.show("job-1").await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["lease"]["owner"], "worker-a");
    assert_eq!(shown["result"]["result"], json!({"rows": 42}));
}

/// worker-a's claim is released by an operator (as for a worker presumed
/// dead), worker-b takes the job over, and worker-a, still working, comes
/// back: its heartbeat and its result are refused with 409 both before and
/// after worker-b has written, and only worker-b's result is in the table.
#[tokio::test]
async fn after_a_takeover_the_first_workers_late_result_is_refused_and_not_stored() {
    let fixture = Fixture::start().await;
    let (status, claim_a) = fixture.claim("job-7", "worker-a", 30_000).await;
    assert_eq!(status, 200, "{claim_a}");
    let token_a = token_of(&claim_a);

    // Held by worker-a: worker-b is told to go elsewhere.
    let (status, locked) = fixture.claim("job-7", "worker-b", 30_000).await;
    assert_eq!(status, 423, "{locked}");
    assert_eq!(locked["error"], "locked");
    assert_eq!(locked["holder"], "worker-a");
    assert_eq!(locked["epoch"], 1);

    // The operator's release is the synchronisation point: once it has
    // answered, the job is free, and its counter moved past epoch 1.
    let released = fixture.conn().await.force_release("job-7").await;
    assert_eq!(released.expect("force release"), Some(Epoch::from(2)));
    let (status, claim_b) = fixture.claim("job-7", "worker-b", 30_000).await;
    assert_eq!(status, 200, "{claim_b}");
    // Past the counter the release left.
    assert_eq!(claim_b["epoch"], 3);
    let token_b = token_of(&claim_b);

    // Before worker-b writes: refused by the lease check.
    let (status, early) = fixture.submit("job-7", &token_a, json!({"rows": 1})).await;
    assert_eq!(status, 409, "{early}");
    assert_eq!(early["error"], "stale_token");
    assert_eq!(early["reason"], "not_owner");
    assert_eq!(early["presented_epoch"], 1);
    assert_eq!(early["accepted_epoch"], 3);
    assert!(fixture.stored().await.is_empty());

    let (status, stored) = fixture.submit("job-7", &token_b, json!({"rows": 42})).await;
    assert_eq!(status, 200, "{stored}");

    // After worker-b wrote: refused, naming both epochs, and nothing of
    // worker-a's is stored.
    let (status, late) = fixture.submit("job-7", &token_a, json!({"rows": 1})).await;
    assert_eq!(status, 409, "{late}");
    assert_eq!(late["error"], "stale_token");
    assert_eq!(late["token"], token_a);
    assert_eq!(late["reason"], "not_owner");
    assert_eq!(late["presented_epoch"], 1);
    assert_eq!(late["accepted_epoch"], 3);
    assert!(
        late["message"]
            .as_str()
            .is_some_and(|message| message.contains("claim it again")),
        "{late}"
    );
    let (status, lost) = fixture.heartbeat("job-7", &token_a).await;
    assert_eq!(status, 409, "{lost}");
    assert_eq!(lost["reason"], "not_owner");
    let (status, beat) = fixture.heartbeat("job-7", &token_b).await;
    assert_eq!(status, 200, "{beat}");

    assert_eq!(
        fixture.stored().await,
        vec![row("job-7", "worker-b", 3, r#"{"rows": 42}"#)]
    );
}

/// A claim that lapses (short ttl, no heartbeat) is refused at once, before
/// anyone else claims the job: 409 `lapsed`, no accepted epoch.
#[tokio::test]
async fn a_lapsed_claim_is_refused_before_anyone_takes_over() {
    let fixture = Fixture::start().await;
    let (status, claim) = fixture.claim("job-3", "worker-a", 200).await;
    assert_eq!(status, 200, "{claim}");
    let token = token_of(&claim);

    // Poll the lease's state (the server's clock decides), bounded.
    let mut conn = fixture.conn().await;
    let mut polls = 0;
    while let Some(LeaseState::Held { .. }) = conn.inspect("job-3").await.expect("inspect") {
        polls += 1;
        assert!(polls < 500, "job-3's 200 ms claim never lapsed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let (status, refused) = fixture.submit("job-3", &token, json!("done")).await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["reason"], "lapsed");
    assert_eq!(refused["presented_epoch"], 1);
    assert_eq!(refused["accepted_epoch"], Value::Null);
    let (status, lost) = fixture.heartbeat("job-3", &token).await;
    assert_eq!(status, 409, "{lost}");
    assert_eq!(lost["reason"], "lapsed");
    assert!(fixture.stored().await.is_empty());
}

/// An operator fences the resource past the token's epoch while the lease
/// is still held: the guard's own refusal (not the lease check) answers
/// 409 `stale_epoch`, and the transaction stores nothing.
#[tokio::test]
async fn a_token_fenced_out_by_an_operator_gets_409_stale_epoch_and_stores_nothing() {
    let fixture = Fixture::start().await;
    let (status, claim) = fixture.claim("job-9", "worker-a", 30_000).await;
    assert_eq!(status, 200, "{claim}");
    let token = token_of(&claim);
    fixture
        .conn()
        .await
        .fence("job-results/job-9", "job-9", Epoch::from(1))
        .await
        .expect("fence");
    let (status, refused) = fixture.submit("job-9", &token, json!("done")).await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["reason"], "stale_epoch");
    assert_eq!(refused["presented_epoch"], 1);
    assert_eq!(refused["accepted_epoch"], 2);
    assert!(fixture.stored().await.is_empty());
}

/// A request the service must refuse with 400: method, path, token, JSON
/// body, and what the error message must say.
type BadRequest<'a> = (Method, &'a str, Option<&'a str>, Option<Value>, &'a str);

#[tokio::test]
async fn bad_input_gets_400_saying_what_was_wrong_and_changes_nothing() {
    let fixture = Fixture::start().await;
    // A live claim of job-1 whose token the cases below misuse.
    let (status, claim) = fixture.claim("job-1", "worker-a", 30_000).await;
    assert_eq!(status, 200, "{claim}");
    let token = token_of(&claim);
    let too_large = json!({ "result": "x".repeat(70_000) });
    let cases: Vec<BadRequest> = vec![
        (
            Method::POST,
            "/jobs/job-2/claim",
            None,
            Some(json!({"worker": "w"})),
            "ttl_ms",
        ),
        (
            Method::POST,
            "/jobs/job-2/claim",
            None,
            Some(json!({"worker": "w", "ttl_ms": 5})),
            "out of range",
        ),
        (
            Method::POST,
            "/jobs/job-2/claim",
            None,
            Some(json!({"worker": "", "ttl_ms": 30000})),
            "worker is empty",
        ),
        (
            Method::POST,
            "/jobs/job-2/claim",
            None,
            None,
            "Expected request with `Content-Type",
        ),
        (
            Method::POST,
            "/jobs/job%202/claim",
            None,
            Some(json!({})),
            "not allowed",
        ),
        (
            Method::PUT,
            "/jobs/job-1/result",
            None,
            Some(json!({"result": 1})),
            "missing Fencing-Token",
        ),
        (
            Method::PUT,
            "/jobs/job-1/result",
            Some("lh9.1.job-1.w"),
            Some(json!({"result": 1})),
            "not a fencing token",
        ),
        (
            Method::PUT,
            "/jobs/job-1/result",
            Some("lh1.1.job-2.w"),
            Some(json!({"result": 1})),
            "is for job",
        ),
        (
            Method::PUT,
            "/jobs/job-1/result",
            Some(&token),
            Some(json!({"rows": 1})),
            "missing field `result`",
        ),
        (
            Method::PUT,
            "/jobs/job-1/result",
            Some(&token),
            Some(too_large),
            "length limit exceeded",
        ),
        (
            Method::POST,
            "/jobs/job-1/heartbeat",
            Some(&token),
            Some(json!({"ttl_ms": "soon"})),
            "invalid type",
        ),
    ];
    for (method, path, token, body, expected) in cases {
        let (status, error) = fixture
            .send(method.clone(), path, token, body.clone())
            .await;
        assert_eq!(status, 400, "{method} {path} {body:?}: {error}");
        assert_eq!(error["error"], "bad_request", "{error}");
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains(expected), "{method} {path}: {message}");
    }
    let (status, missing) = fixture.send(Method::GET, "/nothing", None, None).await;
    assert_eq!(status, 404, "{missing}");
    assert_eq!(missing["error"], "not_found");
    let (status, wrong) = fixture
        .send(Method::GET, "/jobs/job-1/result", None, None)
        .await;
    assert_eq!(status, 405, "{wrong}");
    assert_eq!(wrong["error"], "method_not_allowed");

    // Nothing changed: no result, no claim of job-2, job-1 still worker-a's
    // at epoch 1.
    assert!(fixture.stored().await.is_empty());
    let mut conn = fixture.conn().await;
    assert_eq!(conn.inspect("job-2").await.expect("inspect job-2"), None);
    match conn.inspect("job-1").await.expect("inspect job-1") {
        Some(LeaseState::Held { owner, epoch, .. }) => {
            assert_eq!((owner.as_str(), epoch), ("worker-a", Epoch::from(1)));
        }
        other => panic!("job-1 should still be worker-a's: {other:?}"),
    }
}

/// Two replicas that start at once on a fresh database both start. The
/// test plays the first, holding its creating transaction open with the
/// service's own statements, until the second (the service) is seen
/// waiting; then commits. Without the service's advisory lock the second
/// would fail on the catalog's unique index instead of waiting.
#[tokio::test]
async fn a_replica_starting_while_another_creates_the_table_waits_and_starts() {
    use diesel_async::SimpleAsyncConnection;
    let db = TestDb::empty_on(TestServer::local());
    leasehold::install(&mut db.conn()).expect("install");
    let mut first = AsyncPgConnection::establish(&db.url)
        .await
        .expect("connect");
    first.batch_execute("BEGIN").await.expect("begin");
    first
        .batch_execute(axum_backend::service::SCHEMA)
        .await
        .expect("the first replica's table");
    let url = db.url.clone();
    let second = tokio::spawn(async move { Service::start(&url, "127.0.0.1:0", 1).await });
    // The wait blocks its thread; the service's start must go on meanwhile.
    let (mut observer, name) = (db.conn(), db.name.clone());
    tokio::task::spawn_blocking(move || wait_for_lock_waiter(&mut observer, &name))
        .await
        .expect("the wait");
    assert!(!second.is_finished(), "the second replica did not wait");
    first.batch_execute("COMMIT").await.expect("commit");
    second
        .await
        .expect("the starting task")
        .expect("the second replica starts");
}

/// A table of the example's name with another shape stops the service at
/// start with an error that names it, instead of failing requests later.
#[tokio::test]
async fn a_foreign_table_of_the_examples_name_is_refused_at_start() {
    use diesel_async::SimpleAsyncConnection;
    let db = TestDb::empty_on(TestServer::local());
    AsyncPgConnection::establish(&db.url)
        .await
        .expect("connect")
        .batch_execute(
            "CREATE SCHEMA leasehold_example;
             CREATE TABLE leasehold_example.job_results (job int PRIMARY KEY)",
        )
        .await
        .expect("a foreign table");
    let error = Service::start(&db.url, "127.0.0.1:0", 1)
        .await
        .err()
        .expect("refused at start");
    assert!(
        error.to_string().contains("is not the example's table"),
        "{error}"
    );
}

/// The binary, as a service manager runs it: standard input closed, it
/// serves; SIGTERM stops it cleanly (exit status 0, after saying so).
#[tokio::test]
async fn the_binary_serves_and_stops_cleanly_on_sigterm() {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Command, Stdio};

    let db = TestDb::empty_on(TestServer::local());
    let mut child = Command::new(env!("CARGO_BIN_EXE_axum_backend"))
        .env("DATABASE_URL", &db.url)
        .env("LISTEN", "127.0.0.1:0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the binary");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    // The address it bound, from the line it prints once it listens (a
    // blocking read: nothing else runs on this test's runtime meanwhile).
    let mut line = String::new();
    let addr = loop {
        line.clear();
        let read = stderr.read_line(&mut line).expect("read stderr");
        assert!(read > 0, "the binary exited before listening");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split(';').next().unwrap_or_default().trim().to_owned();
        }
    };
    let claimed = reqwest::Client::new()
        .post(format!("http://{addr}/jobs/job-1/claim"))
        .json(&json!({"worker": "w", "ttl_ms": 30_000}))
        .send()
        .await
        .expect("claim");
    assert_eq!(claimed.status().as_u16(), 200);

    leasehold_test_support::process::send_signal(
        child.id(),
        leasehold_test_support::process::SIGTERM,
    )
    .expect("SIGTERM to the server");
    let mut polls = 0;
    let exit = loop {
        if let Some(exit) = child.try_wait().expect("wait") {
            break exit;
        }
        polls += 1;
        assert!(polls < 3_000, "still running a minute after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(exit.success(), "{exit:?}");
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).expect("rest of stderr");
    assert!(rest.contains("SIGTERM: stopping"), "{rest}");
}
