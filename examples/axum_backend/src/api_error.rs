//! The job service's error responses: one variant per thing a client must
//! handle differently, each with its HTTP status and a JSON body naming
//! what was wrong and what to do next. The statuses and the bodies are
//! those of the synchronous web backend (examples/web_backend), so a
//! client of one is a client of the other; only 405 is new (see the crate
//! documentation).
//!
//! Handlers return `Result<_, ApiError>` and use `?`: the `From`
//! conversions below decide which failures are the client's (400) and
//! which the database's (503), and [`IntoResponse`] renders the answer.

use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use diesel_async::pooled_connection::deadpool::PoolError;
use leasehold::{ErrorKind, LeaseError};
use serde_json::json;

/// A request that did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request itself is malformed: 400.
    #[error("{0}")]
    BadRequest(String),
    /// No such route: 404.
    #[error("no route for {method} {path}; see the routes in examples/axum_backend/src/lib.rs")]
    NotFound {
        /// The method asked for.
        method: String,
        /// The path asked for.
        path: String,
    },
    /// The route exists, not with this method: 405.
    #[error(
        "{method} is not allowed on {path}; see the routes in examples/axum_backend/src/lib.rs"
    )]
    MethodNotAllowed {
        /// The method asked for.
        method: String,
        /// The path asked for.
        path: String,
    },
    /// Another worker holds the job: 423, so that a client tells "claim
    /// another job" apart from "you lost this one" (409).
    #[error("job {job:?} is claimed by {holder:?} (epoch {epoch}) until {expires_at}; claim another job or retry after that")]
    Locked {
        /// The job.
        job: String,
        /// Its current holder.
        holder: String,
        /// The holder's epoch.
        epoch: i64,
        /// When the holder's claim lapses unless heartbeated (RFC 3339).
        expires_at: String,
    },
    /// The presented token is no longer current for the job: 409.
    #[error("fencing token {token} is stale for job {job:?} ({reason}): presented epoch {presented_epoch}, accepted {}; stop working on this job and claim it again if it still needs doing", .accepted_epoch.map_or_else(|| "none until it is claimed again".to_owned(), |e| format!("epoch {e}")))]
    StaleToken {
        /// The job.
        job: String,
        /// The token as presented.
        token: String,
        /// `stale_epoch`, `lapsed`, `not_owner` or `epoch_mismatch`.
        reason: String,
        /// The token's epoch.
        presented_epoch: i64,
        /// The epoch the job accepts now; `None` while nobody holds it.
        accepted_epoch: Option<i64>,
    },
    /// The database failed: 503, retry later.
    #[error("the database failed: {0}; retry later")]
    Unavailable(String),
}

impl ApiError {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Locked { .. } => StatusCode::LOCKED,
            ApiError::StaleToken { .. } => StatusCode::CONFLICT,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The JSON body: `error` (a stable name), `message`, and the facts.
    pub fn body(&self) -> serde_json::Value {
        let message = self.to_string();
        match self {
            ApiError::BadRequest(_) => json!({"error": "bad_request", "message": message}),
            ApiError::NotFound { .. } => json!({"error": "not_found", "message": message}),
            ApiError::MethodNotAllowed { .. } => {
                json!({"error": "method_not_allowed", "message": message})
            }
            ApiError::Locked {
                job,
                holder,
                epoch,
                expires_at,
            } => json!({
                "error": "locked", "message": message, "job": job,
                "holder": holder, "epoch": epoch, "expires_at": expires_at,
            }),
            ApiError::StaleToken {
                job,
                token,
                reason,
                presented_epoch,
                accepted_epoch,
            } => json!({
                "error": "stale_token", "message": message, "job": job, "token": token,
                "reason": reason, "presented_epoch": presented_epoch,
                "accepted_epoch": accepted_epoch,
            }),
            ApiError::Unavailable(_) => json!({"error": "unavailable", "message": message}),
        }
    }

    /// A database failure, whatever its type.
    pub fn unavailable(error: impl std::fmt::Display) -> ApiError {
        ApiError::Unavailable(error.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status(), Json(self.body())).into_response()
    }
}

/// axum's own rejection of a JSON body (no `Content-Type: application/json`,
/// not JSON, a field missing or of the wrong type, too large) is the
/// client's mistake: 400 with axum's explanation, in this service's body
/// shape rather than axum's plain text (which would also answer 415 or 422
/// where the sync example answers 400).
impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        ApiError::BadRequest(format!(
            "{}; send a JSON object with Content-Type: application/json",
            rejection.body_text()
        ))
    }
}

/// Input that the library's own checks refused is the client's; anything
/// else a lease call fails with is the database's.
impl From<LeaseError> for ApiError {
    fn from(error: LeaseError) -> Self {
        match error.kind() {
            ErrorKind::InvalidInput => ApiError::BadRequest(error.violations().join("; ")),
            _ => ApiError::unavailable(error),
        }
    }
}

/// No pooled connection for the request's own transaction.
impl From<PoolError> for ApiError {
    fn from(error: PoolError) -> Self {
        ApiError::unavailable(error)
    }
}
