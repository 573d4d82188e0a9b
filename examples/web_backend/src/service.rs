//! A small synchronous job service over leasehold: workers claim jobs,
//! heartbeat them, and submit results fenced by their token.
//!
//! Routes (JSON bodies; the token travels in the `Fencing-Token` header in
//! its text form, e.g. `lh1.2.job-7.worker-b`):
//!
//! | route                          | body                          | success                              |
//! |--------------------------------|-------------------------------|--------------------------------------|
//! | `POST /jobs/{job}/claim`       | `{"worker": "w1", "ttl_ms": 30000}` | 200 `{job, worker, epoch, token, expires_at}` |
//! | `POST /jobs/{job}/heartbeat`   | `{"ttl_ms": 30000}` + token   | 200 `{job, epoch, expires_at}`       |
//! | `PUT /jobs/{job}/result`       | `{"result": <any JSON>}` + token | 200 `{job, stored, epoch}`        |
//! | `GET /jobs/{job}`              |                               | 200 `{job, lease, result}`           |
//! | `GET /metrics`                 |                               | 200 Prometheus text (see `metrics.rs`) |
//!
//! Failures: 400 bad input, 404 unknown route, 423 job claimed by another
//! worker, 409 stale token (body names presented and accepted epochs), 503
//! database failure; see `api_error.rs`.
//!
//! Why tiny_http: it is a plain blocking HTTP/1.1 server with a handful of
//! dependencies, so the example stays synchronous end to end, like the
//! library (diesel + r2d2), without an async runtime or a framework whose
//! conventions would hide the leasehold calls. Each of a few threads takes
//! a request, checks a connection out of the pool for one call, answers.
//!
//! Results are written with `...run_fenced(Check::LeaseHeld, ..)`: the
//! write commits only if the token's lease is held by its owner and epoch
//! right now (and no takeover can commit in between), and the guard of
//! resource `job-results/{job}` refuses any epoch below the highest one it
//! has admitted. So a worker that stalled past its ttl cannot store a result,
//! whether or not its successor has written yet.

use std::io::Read;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text, Timestamptz};
use leasehold::{
    error::{ErrorKind, LeaseError},
    Acquisition, FencingToken, LeaseClient, LeaseState, Leases, Refusal, Renewal,
};
use leasehold::{guard::Check, guard::FencedError};
use serde_json::{json, Value};
use tiny_http::{Header, Method, Request, Response, Server};

use crate::api_error::ApiError;
use crate::metrics::{self, MetricsError, PrometheusHandle};
use leasehold::guard::Fencing;

/// Largest request body read; larger ones are refused with 400.
const MAX_BODY: u64 = 64 * 1024;
/// The header carrying the fencing token.
const TOKEN_HEADER: &str = "Fencing-Token";
/// Bounds on a requested ttl: long enough to be meaningful, short enough
/// that a dead worker's job is picked up again the same day.
const MIN_TTL_MS: u64 = 100;
const MAX_TTL_MS: u64 = 3_600_000;

/// The results table, in a schema of the example's own so that it never
/// writes into a table of the user's; created if missing when the service
/// starts.
///
/// Replicas that start at once queue on a transaction-scoped advisory lock
/// first: `CREATE ... IF NOT EXISTS` is not safe against a creator that has
/// not committed yet (the second fails on the catalog's unique index). The
/// batch runs as one implicit transaction, so the lock lasts until the
/// table is committed.
pub const SCHEMA: &str = "\
SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('leasehold_example.job_results', 0));
CREATE SCHEMA IF NOT EXISTS leasehold_example;
CREATE TABLE IF NOT EXISTS leasehold_example.job_results (
    job       text        PRIMARY KEY,
    worker    text        NOT NULL,
    epoch     bigint      NOT NULL,
    result    jsonb       NOT NULL,
    stored_at timestamptz NOT NULL DEFAULT clock_timestamp()
)";

/// Reads no row but names every column with the type the service binds: a
/// table of that name with another shape fails here, at start, instead of
/// at the first request.
const SHAPE_PROBE: &str = "\
SELECT job::text, worker::text, epoch::bigint, result::jsonb, stored_at::timestamptz
  FROM leasehold_example.job_results LIMIT 0";

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Installing leasehold or creating the results table failed.
    #[error("could not prepare the database: {0}; check DATABASE_URL and that the role may create tables")]
    Database(String),
    /// The metrics recorder could not be installed (another recorder is
    /// installed in this process).
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    /// The listening socket could not be bound.
    #[error("could not listen on {addr}: {message}; pick another address or free the port")]
    Bind {
        /// The address asked for.
        addr: String,
        /// What the OS said.
        message: String,
    },
}

/// A running service; [`Service::shutdown`] stops it (dropping it does too).
pub struct Service {
    server: Arc<Server>,
    addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Service {
    /// Installs leasehold and the results table, binds `listen` (use
    /// `127.0.0.1:0` for a free port) and serves on `threads` threads.
    pub fn start(client: LeaseClient, listen: &str, threads: usize) -> Result<Self, StartError> {
        prepare(&client)?;
        let prometheus = metrics::handle()?;
        let bind_error = |message: String| StartError::Bind {
            addr: listen.to_owned(),
            message,
        };
        let server = Server::http(listen).map_err(|error| bind_error(error.to_string()))?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| bind_error("not an IP socket".to_owned()))?;
        let server = Arc::new(server);
        let stopping = Arc::new(AtomicBool::new(false));
        let threads = (0..threads.max(1))
            .map(|_| {
                let server = Arc::clone(&server);
                let stopping = Arc::clone(&stopping);
                let client = client.clone();
                let prometheus = prometheus.clone();
                std::thread::spawn(move || serve(&server, &stopping, &client, &prometheus))
            })
            .collect();
        Ok(Self {
            server,
            addr,
            stopping,
            threads,
        })
    }

    /// The bound address, e.g. `127.0.0.1:43117`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting requests and waits for the serving threads.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        for _ in &self.threads {
            self.server.unblock();
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop();
    }
}

fn prepare(client: &LeaseClient) -> Result<(), StartError> {
    let mut conn = client
        .pool()
        .get()
        .map_err(|error| StartError::Database(error.to_string()))?;
    leasehold::install(&mut conn).map_err(|error| StartError::Database(error.to_string()))?;
    conn.batch_execute(SCHEMA)
        .map_err(|error| StartError::Database(error.to_string()))?;
    conn.batch_execute(SHAPE_PROBE).map_err(|error| {
        StartError::Database(format!(
            "leasehold_example.job_results exists but is not the example's table ({error})"
        ))
    })
}

/// One serving thread: take a request, answer it, until stopped.
fn serve(
    server: &Server,
    stopping: &AtomicBool,
    client: &LeaseClient,
    prometheus: &PrometheusHandle,
) {
    // A clone of the client per serving thread: its calls take it mutably
    // (leasehold::Leases), and clones share one pool.
    let mut client = client.clone();
    loop {
        match server.recv() {
            Ok(request) if *request.method() == Method::Get && request.url() == metrics::PATH => {
                metrics::respond(prometheus, request)
            }
            Ok(request) => respond(&mut client, request),
            Err(_) if stopping.load(Ordering::SeqCst) => return,
            // An accept error on one connection; keep serving the others.
            Err(_) => continue,
        }
    }
}

fn respond(client: &mut LeaseClient, mut request: Request) {
    let (status, body) = match handle(client, &mut request) {
        Ok(body) => (200, body),
        Err(error) => (error.status(), error.body()),
    };
    let mut response = Response::from_string(body.to_string()).with_status_code(status);
    if let Ok(header) = Header::from_bytes("Content-Type", "application/json") {
        response = response.with_header(header);
    }
    // The client may have gone away; nothing to do about it here.
    let _ = request.respond(response);
}

fn handle(client: &mut LeaseClient, request: &mut Request) -> Result<Value, ApiError> {
    let path = request.url().split('?').next().unwrap_or("").to_owned();
    let method = request.method().clone();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (&method, segments.as_slice()) {
        (Method::Post, ["jobs", job, "claim"]) => {
            let job = job_name(job)?;
            let body = json_body(request)?;
            claim(client, job, &body)
        }
        (Method::Post, ["jobs", job, "heartbeat"]) => {
            let job = job_name(job)?;
            let token = token_header(request, job)?;
            let body = json_body(request)?;
            heartbeat(client, job, &token, &body)
        }
        (Method::Put, ["jobs", job, "result"]) => {
            let job = job_name(job)?;
            let token = token_header(request, job)?;
            let body = json_body(request)?;
            submit(client, job, &token, &body)
        }
        (Method::Get, ["jobs", job]) => show(client, job_name(job)?),
        _ => Err(ApiError::NotFound {
            method: method.to_string(),
            path,
        }),
    }
}

/// Job names are path segments; keep them to a plain alphabet so the lease
/// key, the guard resource and the URL all spell them the same.
fn job_name(segment: &str) -> Result<&str, ApiError> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if segment.is_empty() || segment.len() > 200 || !segment.chars().all(plain) {
        return Err(ApiError::BadRequest(format!(
            "job name {segment:?} is not allowed; use 1 to 200 characters from A-Z a-z 0-9 - _ ."
        )));
    }
    Ok(segment)
}

fn json_body(request: &mut Request) -> Result<Value, ApiError> {
    let mut text = String::new();
    request
        .as_reader()
        .take(MAX_BODY + 1)
        .read_to_string(&mut text)
        .map_err(|error| {
            ApiError::BadRequest(format!(
                "could not read the body as UTF-8 text: {error}; send a JSON object"
            ))
        })?;
    if text.len() as u64 > MAX_BODY {
        return Err(ApiError::BadRequest(format!(
            "the body is larger than {MAX_BODY} bytes; send a smaller result"
        )));
    }
    if text.trim().is_empty() {
        return Ok(json!({}));
    }
    let value: Value = serde_json::from_str(&text).map_err(|error| {
        ApiError::BadRequest(format!(
            "the body is not valid JSON ({error}); send a JSON object"
        ))
    })?;
    if !value.is_object() {
        return Err(ApiError::BadRequest(
            "the body must be a JSON object, e.g. {\"ttl_ms\": 30000}".into(),
        ));
    }
    Ok(value)
}

fn token_header(request: &Request, job: &str) -> Result<FencingToken, ApiError> {
    let text = request
        .headers()
        .iter()
        .find(|header| header.field.equiv(TOKEN_HEADER))
        .map(|header| header.value.as_str().trim().to_owned())
        .ok_or_else(|| {
            ApiError::BadRequest(format!(
                "missing {TOKEN_HEADER} header; send the token the claim returned, e.g. {TOKEN_HEADER}: lh1.2.{job}.worker-b"
            ))
        })?;
    let token: FencingToken = text.parse().map_err(|error| {
        ApiError::BadRequest(format!(
            "{TOKEN_HEADER} {text:?} is not a fencing token: {error}"
        ))
    })?;
    if token.key() != job {
        return Err(ApiError::BadRequest(format!(
            "{TOKEN_HEADER} is for job {:?}, not {job:?}; send the token of this job's claim",
            token.key()
        )));
    }
    Ok(token)
}

fn ttl_field(body: &Value) -> Result<Duration, ApiError> {
    let ttl = body.get("ttl_ms").and_then(Value::as_u64).ok_or_else(|| {
        ApiError::BadRequest(
            "ttl_ms is missing or not a whole number; send e.g. {\"ttl_ms\": 30000}".into(),
        )
    })?;
    if !(MIN_TTL_MS..=MAX_TTL_MS).contains(&ttl) {
        return Err(ApiError::BadRequest(format!(
            "ttl_ms {ttl} is out of range; use {MIN_TTL_MS} to {MAX_TTL_MS}"
        )));
    }
    Ok(Duration::from_millis(ttl))
}

fn time(instant: DateTime<Utc>) -> String {
    instant.to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn unavailable(error: impl std::fmt::Display) -> ApiError {
    ApiError::Unavailable(error.to_string())
}

fn lease_error(error: LeaseError) -> ApiError {
    match error.kind() {
        ErrorKind::InvalidInput => ApiError::BadRequest(error.violations().join("; ")),
        _ => unavailable(error),
    }
}

/// The epoch the job accepts now: the holder's, or none while unheld.
fn accepted_epoch(client: &mut LeaseClient, job: &str) -> Result<Option<i64>, ApiError> {
    Ok(match client.inspect(job).map_err(lease_error)? {
        Some(LeaseState::Held { epoch, .. }) => Some(epoch.get()),
        _ => None,
    })
}

fn stale(
    client: &mut LeaseClient,
    job: &str,
    token: &FencingToken,
    reason: &str,
    accepted: Option<Option<i64>>,
) -> Result<ApiError, ApiError> {
    let accepted_epoch = match accepted {
        Some(known) => known,
        None => accepted_epoch(client, job)?,
    };
    Ok(ApiError::StaleToken {
        job: job.to_owned(),
        token: token.to_string(),
        reason: reason.to_owned(),
        presented_epoch: token.epoch().get(),
        accepted_epoch,
    })
}

fn claim(client: &mut LeaseClient, job: &str, body: &Value) -> Result<Value, ApiError> {
    let worker = body
        .get("worker")
        .and_then(Value::as_str)
        .filter(|w| !w.is_empty() && !w.contains('\0'))
        .ok_or_else(|| {
            ApiError::BadRequest("worker is missing or empty; send e.g. {\"worker\": \"worker-b\", \"ttl_ms\": 30000}".into())
        })?;
    let ttl = ttl_field(body)?;
    match client.acquire(job, worker, ttl).map_err(lease_error)? {
        Acquisition::Granted(lease) => Ok(json!({
            "job": job,
            "worker": worker,
            "epoch": lease.epoch().get(),
            "token": lease.token().to_string(),
            "expires_at": time(lease.expires_at()),
        })),
        Acquisition::Denied => match client.inspect(job).map_err(lease_error)? {
            Some(LeaseState::Held {
                owner,
                epoch,
                expires_at,
            }) => Err(ApiError::Locked {
                job: job.to_owned(),
                holder: owner,
                epoch: epoch.get(),
                expires_at: time(expires_at),
            }),
            // Released or lapsed between the two calls: say so plainly.
            _ => Err(unavailable(
                "the job's claim changed while it was being refused",
            )),
        },
    }
}

fn heartbeat(
    client: &mut LeaseClient,
    job: &str,
    token: &FencingToken,
    body: &Value,
) -> Result<Value, ApiError> {
    let ttl = ttl_field(body)?;
    match client.renew(token, ttl).map_err(lease_error)? {
        Renewal::Renewed { expires_at } => Ok(json!({
            "job": job,
            "epoch": token.epoch().get(),
            "expires_at": time(expires_at),
        })),
        Renewal::Refused(why) => Err(stale(client, job, token, why.as_status(), None)?),
    }
}

fn submit(
    client: &mut LeaseClient,
    job: &str,
    token: &FencingToken,
    body: &Value,
) -> Result<Value, ApiError> {
    let result = body.get("result").ok_or_else(|| {
        ApiError::BadRequest("result is missing; send e.g. {\"result\": {\"rows\": 42}}".into())
    })?;
    let resource = format!("job-results/{job}");
    let stored = client.run_fenced(&resource, token, Check::LeaseHeld, |conn| {
        diesel::sql_query(
            "INSERT INTO leasehold_example.job_results (job, worker, epoch, result) VALUES ($1, $2, $3, $4::jsonb)
             ON CONFLICT (job) DO UPDATE SET worker = excluded.worker, epoch = excluded.epoch,
                 result = excluded.result, stored_at = excluded.stored_at",
        )
        .bind::<Text, _>(job)
        .bind::<Text, _>(token.owner())
        .bind::<BigInt, _>(token.epoch())
        .bind::<Text, _>(result.to_string())
        .execute(conn)
    });
    match stored {
        Ok(_) => Ok(json!({"job": job, "stored": true, "epoch": token.epoch().get()})),
        Err(FencedError::Guard(refused)) if refused.kind() == ErrorKind::Fenced => {
            match refused.refusal() {
                Some(Refusal::StaleEpoch { accepted }) => Err(stale(
                    client,
                    job,
                    token,
                    "stale_epoch",
                    Some(Some(accepted.get())),
                )?),
                Some(reason) => Err(stale(client, job, token, reason.as_status(), None)?),
                None => Err(unavailable(refused)),
            }
        }
        Err(other) => Err(unavailable(other)),
    }
}

#[derive(QueryableByName)]
struct StoredResult {
    #[diesel(sql_type = Text)]
    worker: String,
    #[diesel(sql_type = BigInt)]
    epoch: i64,
    #[diesel(sql_type = Text)]
    result: String,
    #[diesel(sql_type = Timestamptz)]
    stored_at: DateTime<Utc>,
}

fn show(client: &mut LeaseClient, job: &str) -> Result<Value, ApiError> {
    let lease = match client.inspect(job).map_err(lease_error)? {
        None => Value::Null,
        Some(LeaseState::Held {
            owner,
            epoch,
            expires_at,
        }) => {
            json!({"held": true, "owner": owner, "epoch": epoch.get(), "expires_at": time(expires_at)})
        }
        Some(state) => {
            json!({"held": false, "state": state.as_str(), "epoch": state.epoch().get()})
        }
    };
    let mut conn = client.pool().get().map_err(unavailable)?;
    let stored = diesel::sql_query(
        "SELECT worker, epoch, result::text AS result, stored_at FROM leasehold_example.job_results WHERE job = $1",
    )
    .bind::<Text, _>(job)
    .get_results::<StoredResult>(&mut conn)
    .map_err(unavailable)?
    .into_iter()
    .next();
    let result = match stored {
        None => Value::Null,
        Some(row) => json!({
            "worker": row.worker,
            "epoch": row.epoch,
            "result": serde_json::from_str::<Value>(&row.result).map_err(unavailable)?,
            "stored_at": time(row.stored_at),
        }),
    };
    Ok(json!({"job": job, "lease": lease, "result": result}))
}
