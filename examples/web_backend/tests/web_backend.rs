//! The web backend example, served on a loopback port against a real
//! PostgreSQL and driven by real HTTP clients (ureq).

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use leasehold::guard::Fencing;
use leasehold::LeaseClient;
use leasehold_test_support::{
    time_of, wait_for_lock_waiter, wait_until_server_time_passes, TestDb, TestServer,
};
use serde_json::{json, Value};
use web_backend::service;

/// A fresh database and the job service on a free loopback port.
struct Fixture {
    db: TestDb,
    base: String,
    service: Option<service::Service>,
}

impl Fixture {
    fn start() -> Fixture {
        // The service installs leasehold itself, into an empty database on
        // a throwaway local server.
        let db = TestDb::empty_on(TestServer::local());
        let client = LeaseClient::connect(&db.url, 4).expect("pool");
        let service = service::Service::start(client, "127.0.0.1:0", 4).expect("start service");
        assert!(service.addr().ip().is_loopback());
        Fixture {
            db,
            base: format!("http://{}", service.addr()),
            service: Some(service),
        }
    }

    fn conn(&self) -> PgConnection {
        self.db.conn()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(service) = self.service.take() {
            service.shutdown();
        }
    }
}

/// One worker's HTTP client: its own agent (connection pool).
struct Worker {
    agent: ureq::Agent,
    base: String,
}

impl Worker {
    fn new(fixture: &Fixture) -> Worker {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        Worker {
            agent,
            base: fixture.base.clone(),
        }
    }

    fn finish(response: ureq::http::Response<ureq::Body>) -> (u16, Value) {
        let status = response.status().as_u16();
        let text = response
            .into_body()
            .read_to_string()
            .expect("read response body");
        let body = serde_json::from_str(&text)
            .unwrap_or_else(|error| panic!("response is not JSON ({error}): {text}"));
        (status, body)
    }

    fn send(&self, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let response = match method {
            "POST" => {
                let mut request = self.agent.post(&url).content_type("application/json");
                if let Some(token) = token {
                    request = request.header("Fencing-Token", token);
                }
                request.send(body)
            }
            "PUT" => {
                let mut request = self.agent.put(&url).content_type("application/json");
                if let Some(token) = token {
                    request = request.header("Fencing-Token", token);
                }
                request.send(body)
            }
            _ => self.agent.get(&url).call(),
        }
        .unwrap_or_else(|error| panic!("{method} {path}: {error}"));
        Self::finish(response)
    }

    fn claim(&self, job: &str, worker: &str, ttl_ms: u64) -> (u16, Value) {
        let body = json!({"worker": worker, "ttl_ms": ttl_ms}).to_string();
        self.send("POST", &format!("/jobs/{job}/claim"), None, &body)
    }

    fn heartbeat(&self, job: &str, token: &str, ttl_ms: u64) -> (u16, Value) {
        let body = json!({ "ttl_ms": ttl_ms }).to_string();
        self.send(
            "POST",
            &format!("/jobs/{job}/heartbeat"),
            Some(token),
            &body,
        )
    }

    fn submit(&self, job: &str, token: &str, result: Value) -> (u16, Value) {
        let body = json!({ "result": result }).to_string();
        self.send("PUT", &format!("/jobs/{job}/result"), Some(token), &body)
    }

    fn show(&self, job: &str) -> (u16, Value) {
        self.send("GET", &format!("/jobs/{job}"), None, "")
    }
}

#[derive(QueryableByName, Debug, PartialEq)]
struct StoredRow {
    #[diesel(sql_type = Text)]
    worker: String,
    #[diesel(sql_type = BigInt)]
    epoch: i64,
    #[diesel(sql_type = Text)]
    result: String,
}

#[test]
fn paused_worker_late_result_is_refused_with_409_and_the_successors_is_stored() {
    let fixture = Fixture::start();
    let a = Worker::new(&fixture);
    let b = Worker::new(&fixture);

    let (status, claim_a) = a.claim("job-7", "worker-a", 500);
    assert_eq!(status, 200, "{claim_a}");
    assert_eq!(claim_a["epoch"], 1);
    let token_a = claim_a["token"].as_str().unwrap().to_owned();
    assert_eq!(token_a, "lh1.1.job-7.worker-a");
    let (status, beat) = a.heartbeat("job-7", &token_a, 500);
    assert_eq!(status, 200, "{beat}");
    let a_expires = time_of(&beat["expires_at"]);

    // Held by worker-a: worker-b is told to go elsewhere.
    let (status, locked) = b.claim("job-7", "worker-b", 30_000);
    assert_eq!(status, 423, "{locked}");
    assert_eq!(locked["error"], "locked");
    assert_eq!(locked["holder"], "worker-a");

    // worker-a pauses past its ttl.
    wait_until_server_time_passes(&mut fixture.conn(), a_expires);

    // Lapsed, not yet taken over: the lease check already refuses it.
    let (status, early) = a.submit("job-7", &token_a, json!({"rows": 1}));
    assert_eq!(status, 409, "{early}");
    assert_eq!(early["reason"], "lapsed");
    assert_eq!(early["presented_epoch"], 1);
    assert_eq!(early["accepted_epoch"], Value::Null);

    let (status, claim_b) = b.claim("job-7", "worker-b", 30_000);
    assert_eq!(status, 200, "{claim_b}");
    assert_eq!(claim_b["epoch"], 2);
    let token_b = claim_b["token"].as_str().unwrap().to_owned();
    assert_eq!(token_b, "lh1.2.job-7.worker-b");
    let (status, stored) = b.submit("job-7", &token_b, json!({"rows": 42}));
    assert_eq!(status, 200, "{stored}");
    assert_eq!(stored["stored"], true);

    // worker-a wakes and submits late: 409, naming both epochs.
    let (status, late) = a.submit("job-7", &token_a, json!({"rows": 1}));
    assert_eq!(status, 409, "{late}");
    assert_eq!(late["error"], "stale_token");
    assert_eq!(late["presented_epoch"], 1);
    assert_eq!(late["accepted_epoch"], 2);
    assert_eq!(late["token"], token_a);
    assert!(
        late["message"].as_str().unwrap().contains("claim it again"),
        "{late}"
    );
    let (status, lost) = a.heartbeat("job-7", &token_a, 30_000);
    assert_eq!(status, 409, "{lost}");
    assert_eq!(lost["reason"], "lapsed");

    // Only worker-b's result is there, through the API and in the table.
    let (status, shown) = b.show("job-7");
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["result"]["worker"], "worker-b");
    assert_eq!(shown["result"]["epoch"], 2);
    assert_eq!(shown["result"]["result"], json!({"rows": 42}));
    assert_eq!(shown["lease"]["owner"], "worker-b");
    let rows = diesel::sql_query(
        "SELECT worker, epoch, result::text AS result FROM leasehold_example.job_results",
    )
    .load::<StoredRow>(&mut fixture.conn())
    .expect("read leasehold_example.job_results");
    assert_eq!(
        rows,
        vec![StoredRow {
            worker: "worker-b".into(),
            epoch: 2,
            result: r#"{"rows": 42}"#.into(),
        }]
    );
}

#[test]
fn a_token_fenced_out_by_an_operator_gets_409_stale_epoch() {
    let fixture = Fixture::start();
    let worker = Worker::new(&fixture);
    let (status, claim) = worker.claim("job-9", "worker-a", 30_000);
    assert_eq!(status, 200, "{claim}");
    let token = claim["token"].as_str().unwrap().to_owned();
    fixture
        .conn()
        .fence("job-results/job-9", "job-9", leasehold::Epoch::from(1))
        .expect("fence");
    let (status, refused) = worker.submit("job-9", &token, json!("done"));
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["reason"], "stale_epoch");
    assert_eq!(refused["presented_epoch"], 1);
    assert_eq!(refused["accepted_epoch"], 2);
}

#[test]
fn bad_input_gets_400_saying_what_was_wrong() {
    let fixture = Fixture::start();
    let worker = Worker::new(&fixture);
    let cases: [(&str, &str, Option<&str>, &str, &str); 7] = [
        (
            "POST",
            "/jobs/job-1/claim",
            None,
            "{\"worker\":\"w\"}",
            "ttl_ms",
        ),
        (
            "POST",
            "/jobs/job-1/claim",
            None,
            "{\"worker\":\"w\",\"ttl_ms\":5}",
            "out of range",
        ),
        (
            "POST",
            "/jobs/job-1/claim",
            None,
            "not json",
            "not valid JSON",
        ),
        ("POST", "/jobs/job%201/claim", None, "{}", "not allowed"),
        (
            "PUT",
            "/jobs/job-1/result",
            None,
            "{\"result\":1}",
            "missing Fencing-Token",
        ),
        (
            "PUT",
            "/jobs/job-1/result",
            Some("lh9.1.job-1.w"),
            "{\"result\":1}",
            "not a fencing token",
        ),
        (
            "PUT",
            "/jobs/job-1/result",
            Some("lh1.1.job-2.w"),
            "{\"result\":1}",
            "is for job",
        ),
    ];
    for (method, path, token, body, expected) in cases {
        let (status, error) = worker.send(method, path, token, body);
        assert_eq!(status, 400, "{method} {path} {body}: {error}");
        assert_eq!(error["error"], "bad_request");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(expected), "{method} {path}: {message}");
    }
    let (status, missing) = worker.send("GET", "/nothing", None, "");
    assert_eq!(status, 404, "{missing}");
}

/// The binary, as a service manager runs it: standard input closed from
/// the start, it keeps serving; SIGTERM stops it cleanly (exit status 0);
/// and its results live in a schema of its own, beside a user's table of
/// the same name that it leaves alone.
#[test]
fn the_binary_serves_with_stdin_closed_and_stops_cleanly_on_sigterm() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::time::Instant;

    let db = TestDb::empty_on(TestServer::local());
    // A user's own table named like the example's: never touched.
    db.conn()
        .batch_execute("CREATE TABLE public.job_results (id int PRIMARY KEY)")
        .expect("the user's table");
    let mut child = Command::new(env!("CARGO_BIN_EXE_web_backend"))
        .env("DATABASE_URL", &db.url)
        .env("LISTEN", "127.0.0.1:0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the binary");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    let addr = loop {
        line.clear();
        let read = stderr.read_line(&mut line).expect("read stderr");
        assert!(read > 0, "the binary exited before listening");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split(';').next().unwrap_or_default().trim().to_owned();
        }
    };
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let claimed = agent
        .post(&format!("http://{addr}/jobs/job-1/claim"))
        .send(json!({"worker": "w", "ttl_ms": 30000}).to_string())
        .expect("claim");
    assert_eq!(claimed.status(), 200, "serving with stdin closed");
    assert_eq!(
        db.conn()
            .batch_execute("SELECT id FROM public.job_results")
            .map(|()| "untouched"),
        Ok("untouched")
    );

    leasehold_test_support::process::send_signal(
        child.id(),
        leasehold_test_support::process::SIGTERM,
    )
    .expect("SIGTERM to the server");
    let deadline = Instant::now() + Duration::from_secs(60);
    let exit = loop {
        if let Some(exit) = child.try_wait().expect("wait") {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "still running a minute after SIGTERM"
        );
        std::thread::park_timeout(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit:?}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).expect("rest of stderr");
    assert!(rest.contains("stopping"), "{rest}");
}

/// Two replicas that start at once on a fresh database both start. The
/// test plays the first, holding its creating transaction open with the
/// service's own statements, until the second (the service) is seen
/// waiting; then commits. Without the service's advisory lock the second
/// would fail on the catalog's unique index instead of waiting.
#[test]
fn a_replica_starting_while_another_creates_the_table_waits_and_starts() {
    let db = TestDb::empty_on(TestServer::local());
    let mut first = db.conn();
    leasehold::install(&mut first).expect("install");
    first.batch_execute("BEGIN").expect("begin");
    first
        .batch_execute(service::SCHEMA)
        .expect("the first replica's table");
    let client = LeaseClient::connect(&db.url, 2).expect("pool");
    let second = std::thread::spawn(move || service::Service::start(client, "127.0.0.1:0", 1));
    wait_for_lock_waiter(&mut db.conn(), &db.name);
    assert!(!second.is_finished(), "the second replica did not wait");
    first.batch_execute("COMMIT").expect("commit");
    let service = second
        .join()
        .expect("the starting thread")
        .expect("the second replica starts");
    service.shutdown();
}

/// A table of the example's name with another shape stops the service at
/// start with an error that names it, instead of failing requests later.
#[test]
fn a_foreign_table_of_the_examples_name_is_refused_at_start() {
    let db = TestDb::empty_on(TestServer::local());
    db.conn()
        .batch_execute(
            "CREATE SCHEMA leasehold_example;
             CREATE TABLE leasehold_example.job_results (job int PRIMARY KEY)",
        )
        .expect("a foreign table");
    let client = LeaseClient::connect(&db.url, 2).expect("pool");
    let error = service::Service::start(client, "127.0.0.1:0", 1)
        .err()
        .expect("refused at start");
    assert!(
        error.to_string().contains("is not the example's table"),
        "{error}"
    );
}
