//! The job service's error responses: one variant per thing a client must
//! handle differently, each with its HTTP status and a JSON body that says
//! what was wrong and what to do next.
//!
//! Status choices:
//! - 400 Bad Request: malformed input (body, header, token, job name).
//! - 423 Locked: the job is claimed by another worker. Distinct from 409 so
//!   a client can tell "try another job" from "you lost this one".
//! - 409 Conflict: the presented fencing token is stale (lapsed, taken over,
//!   fenced out); the body names the presented and the accepted epoch.
//! - 503 Service Unavailable: the database failed; retry later.

use serde_json::{json, Value};

/// A request that did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request itself is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// No such route.
    #[error("no route for {method} {path}; see the routes in examples/web_backend/src/service.rs")]
    NotFound {
        /// The method asked for.
        method: String,
        /// The path asked for.
        path: String,
    },
    /// Another worker holds the job.
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
    /// The token is no longer current for the job.
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
    /// The database failed.
    #[error("the database failed: {0}; retry later")]
    Unavailable(String),
}

impl ApiError {
    /// The HTTP status code.
    pub fn status(&self) -> u16 {
        match self {
            ApiError::BadRequest(_) => 400,
            ApiError::NotFound { .. } => 404,
            ApiError::Locked { .. } => 423,
            ApiError::StaleToken { .. } => 409,
            ApiError::Unavailable(_) => 503,
        }
    }

    /// The JSON body: `error` (a stable name), `message`, and the facts.
    pub fn body(&self) -> Value {
        let message = self.to_string();
        match self {
            ApiError::BadRequest(_) => json!({"error": "bad_request", "message": message}),
            ApiError::NotFound { .. } => json!({"error": "not_found", "message": message}),
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
}
