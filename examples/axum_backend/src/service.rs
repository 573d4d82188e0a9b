//! The service: shared state ([`App`]), the router, its handlers, and
//! starting and stopping it ([`Service`]). Routes and statuses are listed in
//! the crate documentation (src/lib.rs), errors in [`crate::api_error`].

use std::net::SocketAddr;

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use chrono::{DateTime, SecondsFormat, Utc};
use diesel::connection::SimpleConnection;
use diesel::sql_types::{BigInt, Text, Timestamptz};
use diesel::{Connection, PgConnection, QueryableByName};
use diesel_async::{AsyncConnection, RunQueryDsl};
use leasehold::aio::{AsyncLeaseClient, AsyncLeases};
use leasehold::error::LeaseError;
use leasehold::{Acquisition, FencingToken, LeaseState, Refusal, Renewal};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api_error::ApiError;
use crate::metrics::{self, MetricsError, PrometheusHandle};
use leasehold::aio::AsyncFencing;
use leasehold::guard::Check;

/// Largest request body read; a larger one is refused with 400.
const MAX_BODY: usize = 64 * 1024;
/// The header carrying the fencing token.
const TOKEN_HEADER: &str = "Fencing-Token";
/// Bounds on a requested ttl: long enough to be meaningful, short enough
/// that a dead worker's job is picked up again the same day.
const MIN_TTL_MS: u64 = 100;
const MAX_TTL_MS: u64 = 3_600_000;

/// The results table: the same schema and table as the sync example's, so
/// the two services can take turns on one database. A schema of the
/// example's own, so that it never writes into a table of the user's;
/// created if missing when the service starts.
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

/// The fenced write: one row per job, the latest admitted epoch's result.
const STORE_RESULT: &str = "\
INSERT INTO leasehold_example.job_results (job, worker, epoch, result)
VALUES ($1, $2, $3, $4::jsonb)
ON CONFLICT (job) DO UPDATE SET worker = excluded.worker, epoch = excluded.epoch,
    result = excluded.result, stored_at = excluded.stored_at";

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Installing leasehold, creating the results table or opening the
    /// pool failed.
    #[error("could not prepare the database: {0}; check DATABASE_URL and that the role may create tables")]
    Database(String),
    /// The metrics recorder could not be installed (another recorder is
    /// installed in this process).
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    /// The listening socket could not be bound.
    #[error("could not listen on {addr}: {source}; pick another address or free the port")]
    Bind {
        /// The address asked for.
        addr: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

/// What every handler shares, through axum's [`State`]: cheap to clone
/// (the client is a handle on one pool, the Prometheus handle an `Arc`).
#[derive(Clone)]
pub(crate) struct App {
    /// Lease calls, each on a pooled connection; its pool also serves the
    /// requests' own transactions.
    pub(crate) client: AsyncLeaseClient,
    /// Renders `GET /metrics`.
    pub(crate) prometheus: PrometheusHandle,
}

/// The routes, with the state they share.
pub(crate) fn router(app: App) -> Router {
    Router::new()
        .route("/jobs/{job}/claim", post(claim))
        .route("/jobs/{job}/heartbeat", post(heartbeat))
        .route("/jobs/{job}/result", put(submit_result))
        .route("/jobs/{job}", get(show))
        .route("/metrics", get(metrics::scrape))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // axum's default is 2 MB; a job result is small, and the sync
        // example's limit is this one.
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(app)
}

/// A running service; [`Service::shutdown`] stops it and waits, dropping it
/// stops it without waiting.
pub struct Service {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Service {
    /// Installs leasehold and the results table into `database_url`'s
    /// database, opens a pool of `pool_size` connections, binds `listen`
    /// (use `127.0.0.1:0` for a free port) and serves on the current tokio
    /// runtime.
    ///
    /// Unlike the sync example's, it takes the URL rather than a client:
    /// installing is on the sync face only, so it needs a blocking
    /// connection of its own, and a client does not tell its URL.
    pub async fn start(
        database_url: &str,
        listen: &str,
        pool_size: u32,
    ) -> Result<Self, StartError> {
        prepare(database_url).await?;
        let client = AsyncLeaseClient::connect(database_url, pool_size)
            .await
            .map_err(|error| StartError::Database(error.to_string()))?;
        let app = App {
            client,
            prometheus: metrics::handle()?,
        };
        let bind_error = |source| StartError::Bind {
            addr: listen.to_owned(),
            source,
        };
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = axum::serve(listener, router(app)).with_graceful_shutdown(async {
            // A send or a dropped sender: either way, stop.
            let _ = stopped.await;
        });
        let task = tokio::spawn(async move { serving.await });
        Ok(Self { addr, stop, task })
    }

    /// The bound address, e.g. `127.0.0.1:43117`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting connections, lets the requests in flight finish, and
    /// waits for that.
    pub async fn shutdown(self) -> std::io::Result<()> {
        let Service { stop, task, .. } = self;
        // Refused only if the server already stopped on its own.
        let _ = stop.send(());
        match task.await {
            Ok(served) => served,
            Err(error) => Err(std::io::Error::other(error)),
        }
    }
}

/// Installs leasehold and the results table, and checks the table's shape.
/// One blocking connection on a blocking thread: `leasehold::install` is on
/// the sync face only (it runs once per deployment, not per request).
async fn prepare(database_url: &str) -> Result<(), StartError> {
    let url = database_url.to_owned();
    let database = |error: &dyn std::fmt::Display| StartError::Database(error.to_string());
    tokio::task::spawn_blocking(move || {
        let mut conn = PgConnection::establish(&url).map_err(|error| database(&error))?;
        leasehold::install(&mut conn).map_err(|error| database(&error))?;
        conn.batch_execute(SCHEMA)
            .map_err(|error| database(&error))?;
        conn.batch_execute(SHAPE_PROBE).map_err(|error| {
            StartError::Database(format!(
                "leasehold_example.job_results exists but is not the example's table ({error})"
            ))
        })
    })
    .await
    .map_err(|error| database(&error))?
}

/// `POST /jobs/{job}/claim`'s body.
#[derive(Deserialize)]
struct ClaimRequest {
    worker: String,
    ttl_ms: u64,
}

/// `POST /jobs/{job}/claim`'s answer.
#[derive(Serialize)]
struct Claimed {
    job: String,
    worker: String,
    epoch: i64,
    token: String,
    expires_at: String,
}

/// `POST /jobs/{job}/heartbeat`'s body.
#[derive(Deserialize)]
struct HeartbeatRequest {
    ttl_ms: u64,
}

/// `POST /jobs/{job}/heartbeat`'s answer.
#[derive(Serialize)]
struct Heartbeat {
    job: String,
    epoch: i64,
    expires_at: String,
}

/// `PUT /jobs/{job}/result`'s body: any JSON value, stored as `jsonb`.
#[derive(Deserialize)]
struct ResultRequest {
    result: Value,
}

/// `PUT /jobs/{job}/result`'s answer.
#[derive(Serialize)]
struct Stored {
    job: String,
    stored: bool,
    epoch: i64,
}

impl Stored {
    /// The result of `job` stored under `token`.
    fn of(job: String, token: &FencingToken) -> Self {
        Stored {
            job,
            stored: true,
            epoch: token.epoch().get(),
        }
    }
}

/// What can fail inside the request's transaction: the guard's refusal, or
/// the INSERT (diesel-async's `transaction` needs `From<diesel::result::Error>`).
#[derive(Debug, thiserror::Error)]
enum WriteError {
    #[error(transparent)]
    Guard(#[from] LeaseError),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// `POST /jobs/{job}/claim`: a lease on the job's key, autocommitted on a
/// pooled connection. A job someone else holds is 423 naming the holder.
async fn claim(
    State(app): State<App>,
    job: Result<Path<String>, PathRejection>,
    body: Result<Json<ClaimRequest>, JsonRejection>,
) -> Result<Json<Claimed>, ApiError> {
    let job = job_name(job?)?;
    let Json(ClaimRequest { worker, ttl_ms }) = body?;
    if worker.is_empty() || worker.contains('\0') {
        return Err(ApiError::BadRequest(
            "worker is empty; send e.g. {\"worker\": \"worker-b\", \"ttl_ms\": 30000}".into(),
        ));
    }
    let ttl = ttl(ttl_ms)?;
    // AsyncLeases takes the client mutably; a clone shares the pool.
    let mut client = app.client;
    match client.acquire(&job, &worker, ttl).await? {
        Acquisition::Granted(lease) => Ok(Json(Claimed {
            epoch: lease.epoch().get(),
            token: lease.token().to_string(),
            expires_at: time(lease.expires_at()),
            job,
            worker,
        })),
        Acquisition::Denied => match client.inspect(&job).await? {
            Some(LeaseState::Held {
                owner,
                epoch,
                expires_at,
            }) => Err(ApiError::Locked {
                job,
                holder: owner,
                epoch: epoch.get(),
                expires_at: time(expires_at),
            }),
            // Released or lapsed between the two calls: say so plainly.
            _ => Err(ApiError::unavailable(
                "the job's claim changed while it was being refused",
            )),
        },
    }
}

/// `POST /jobs/{job}/heartbeat`: renews the presented token's lease. A
/// token that no longer holds it is 409, and the worker should stop.
async fn heartbeat(
    State(app): State<App>,
    job: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Json<HeartbeatRequest>, JsonRejection>,
) -> Result<Json<Heartbeat>, ApiError> {
    let job = job_name(job?)?;
    let token = fencing_token(&headers, &job)?;
    let Json(HeartbeatRequest { ttl_ms }) = body?;
    let ttl = ttl(ttl_ms)?;
    let mut client = app.client;
    match client.renew(&token, ttl).await? {
        Renewal::Renewed { expires_at } => Ok(Json(Heartbeat {
            job,
            epoch: token.epoch().get(),
            expires_at: time(expires_at),
        })),
        Renewal::Refused(why) => Err(stale(&mut client, &job, &token, why.as_status(), None).await),
    }
}

/// `PUT /jobs/{job}/result`: the fenced write, in the request's own
/// transaction. `admit` with `Check::LeaseHeld` refuses a token whose lease is not held right
/// now (lapsed, released, taken over) or whose epoch is below one already
/// admitted for the resource, and holds off a takeover until commit; the
/// INSERT commits with that admission, or a refusal rolls both back. The
/// region between the README markers is shown in the repository's README
/// (a test in src/lib.rs keeps the two equal).
// README: begin
async fn submit_result(
    State(app): State<App>,
    job: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Json<ResultRequest>, JsonRejection>,
) -> Result<Json<Stored>, ApiError> {
    let job = job_name(job?)?;
    let token = fencing_token(&headers, &job)?;
    let Json(ResultRequest { result }) = body?;
    let resource = format!("job-results/{job}");
    let mut conn = app.client.pool().get().await?;
    let written = conn
        .transaction::<_, WriteError, _>(async |conn| {
            conn.admit(&resource, &token, Check::LeaseHeld).await?;
            diesel::sql_query(STORE_RESULT)
                .bind::<Text, _>(&job)
                .bind::<Text, _>(token.owner())
                .bind::<BigInt, _>(token.epoch())
                .bind::<Text, _>(result.to_string())
                .execute(conn)
                .await?;
            Ok(())
        })
        .await;
    drop(conn); // back to the pool: refusal() may inspect the lease
    match written {
        Ok(()) => Ok(Json(Stored::of(job, &token))),
        Err(refused) => Err(refusal(app.client, &job, &token, refused).await),
    }
}
// README: end

/// The answer to a write the transaction refused or failed.
async fn refusal(
    mut client: AsyncLeaseClient,
    job: &str,
    token: &FencingToken,
    error: WriteError,
) -> ApiError {
    let refusal = match &error {
        WriteError::Guard(refused) => refused.refusal(),
        _ => None,
    };
    match refusal {
        Some(Refusal::StaleEpoch { accepted }) => {
            stale(&mut client, job, token, "stale_epoch", Some(accepted.get())).await
        }
        // A token of an epoch never granted for the job: forged or
        // mistaken, not stale.
        Some(Refusal::EpochNotGranted { .. }) => {
            ApiError::BadRequest(format!("{error}; send the token the claim returned"))
        }
        Some(reason) => stale(&mut client, job, token, reason.as_status(), None).await,
        None => ApiError::unavailable(error),
    }
}

/// The 409 for a token that is no longer current, naming the epoch the
/// job accepts now: the guard's when it refused with one, otherwise the
/// holder's (none while nobody holds the job).
async fn stale(
    client: &mut AsyncLeaseClient,
    job: &str,
    token: &FencingToken,
    reason: &str,
    accepted: Option<i64>,
) -> ApiError {
    let accepted_epoch = match accepted {
        Some(epoch) => Some(epoch),
        None => match client.inspect(job).await {
            Ok(Some(LeaseState::Held { epoch, .. })) => Some(epoch.get()),
            Ok(_) => None,
            Err(error) => return error.into(),
        },
    };
    ApiError::StaleToken {
        job: job.to_owned(),
        token: token.to_string(),
        reason: reason.to_owned(),
        presented_epoch: token.epoch().get(),
        accepted_epoch,
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

/// `GET /jobs/{job}`: the job's lease and its stored result, if any.
async fn show(
    State(app): State<App>,
    job: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let job = job_name(job?)?;
    let mut client = app.client;
    let lease = match client.inspect(&job).await? {
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
    let mut conn = client.pool().get().await?;
    let stored = diesel::sql_query(
        "SELECT worker, epoch, result::text AS result, stored_at FROM leasehold_example.job_results WHERE job = $1",
    )
    .bind::<Text, _>(&job)
    .get_results::<StoredResult>(&mut conn)
    .await
    .map_err(ApiError::unavailable)?
    .into_iter()
    .next();
    let result = match stored {
        None => Value::Null,
        Some(row) => json!({
            "worker": row.worker,
            "epoch": row.epoch,
            "result": serde_json::from_str::<Value>(&row.result).map_err(ApiError::unavailable)?,
            "stored_at": time(row.stored_at),
        }),
    };
    Ok(Json(json!({"job": job, "lease": lease, "result": result})))
}

/// Any other path.
async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
}

/// A known path with another method (the sync example answers 404).
async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
}

/// Job names are path segments; keep them to a plain alphabet so the lease
/// key, the guard resource and the URL all spell them the same.
fn job_name(path: Path<String>) -> Result<String, ApiError> {
    let Path(segment) = path;
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if segment.is_empty() || segment.len() > 200 || !segment.chars().all(plain) {
        return Err(ApiError::BadRequest(format!(
            "job name {segment:?} is not allowed; use 1 to 200 characters from A-Z a-z 0-9 - _ ."
        )));
    }
    Ok(segment)
}

/// The `Fencing-Token` header, parsed, and for this job.
fn fencing_token(headers: &HeaderMap, job: &str) -> Result<FencingToken, ApiError> {
    let text = headers
        .get(TOKEN_HEADER)
        .ok_or_else(|| {
            ApiError::BadRequest(format!(
                "missing {TOKEN_HEADER} header; send the token the claim returned, e.g. {TOKEN_HEADER}: lh1.2.{job}.worker-b"
            ))
        })?
        .to_str()
        .map_err(|_| {
            ApiError::BadRequest(format!("{TOKEN_HEADER} is not visible ASCII text"))
        })?
        .trim();
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

fn ttl(ttl_ms: u64) -> Result<std::time::Duration, ApiError> {
    if !(MIN_TTL_MS..=MAX_TTL_MS).contains(&ttl_ms) {
        return Err(ApiError::BadRequest(format!(
            "ttl_ms {ttl_ms} is out of range; use {MIN_TTL_MS} to {MAX_TTL_MS}"
        )));
    }
    Ok(std::time::Duration::from_millis(ttl_ms))
}

fn time(instant: DateTime<Utc>) -> String {
    instant.to_rfc3339_opts(SecondsFormat::Micros, true)
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::BadRequest(rejection.body_text())
    }
}
