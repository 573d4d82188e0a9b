//! The job service of the web backend example (examples/web_backend), on
//! axum, tokio and leasehold's async face (feature `async`,
//! `leasehold::aio`): workers claim jobs, heartbeat them, and submit
//! results fenced by their token; `GET /metrics` serves leasehold's metrics
//! for Prometheus ([`metrics`]).
//!
//! Routes (JSON bodies; the token travels in the `Fencing-Token` header in
//! its text form, e.g. `lh1.2.job-7.worker-b`), the sync example's:
//!
//! | route                          | body                          | success                              |
//! |--------------------------------|-------------------------------|--------------------------------------|
//! | `POST /jobs/{job}/claim`       | `{"worker": "w1", "ttl_ms": 30000}` | 200 `{job, worker, epoch, token, expires_at}` |
//! | `POST /jobs/{job}/heartbeat`   | `{"ttl_ms": 30000}` + token   | 200 `{job, epoch, expires_at}`       |
//! | `PUT /jobs/{job}/result`       | `{"result": <any JSON>}` + token | 200 `{job, stored, epoch}`        |
//! | `GET /jobs/{job}`              |                               | 200 `{job, lease, result}`           |
//! | `GET /metrics`                 |                               | 200 Prometheus text                  |
//!
//! Failures, as the sync example's ([`api_error`]): 400 bad input, 404
//! unknown route, 423 job claimed by another worker, 409 stale token (the
//! body names the presented and the accepted epoch), 503 database failure.
//!
//! How a result is fenced: the handler of `PUT /jobs/{job}/result`
//! (src/service.rs, shown in the repository's README) opens a transaction
//! of its own on a pooled `AsyncPgConnection`, admits the presented token
//! for the resource `job-results/{job}` with `Check::LeaseHeld`, then
//! INSERTs.
//! That admission refuses unless the token's lease is held by its owner and
//! epoch right now and no later epoch was admitted for the resource, and
//! keeps a takeover from committing until the transaction ends; a refusal
//! rolls the transaction back, so a stale holder's result is never stored,
//! whether or not its successor has written yet. Claims, heartbeats and
//! reads are single lease calls on `AsyncLeaseClient`, each autocommitted.
//!
//! # Where it differs from the sync example, and why
//!
//! - **A JSON body needs `Content-Type: application/json`.** axum's `Json`
//!   extractor insists on it; a request without it gets 400 saying so. The
//!   sync example reads any body. All of axum's body rejections (missing
//!   field, wrong type, not JSON, larger than 64 KiB) are answered 400 in
//!   this service's error shape, as the sync example answers them, not
//!   axum's default 415, 422 or 413 in plain text.
//! - **405 for a known path with another method**, where the sync example,
//!   which matches method and path together, answers 404. axum routes by
//!   path first, so it knows the difference, and 405 says it.
//! - **`Service::start` takes the database URL, and is async**: installing
//!   leasehold is on the sync face only (docs/guide/async.md), so start-up
//!   runs it on one blocking connection before opening the async pool, and
//!   an `AsyncLeaseClient` does not tell its URL. There is no thread count:
//!   the requests are tasks on the caller's tokio runtime.
//!
//! The results table is the sync example's (`leasehold_example.job_results`,
//! checked at start), so the two services can serve one database in turns.
//!
//! A library so that the binary (`src/main.rs`) and the integration tests
//! (`tests/`) run the same code.

pub mod api_error;
pub mod metrics;
pub mod service;

/// README.md (the repository's, which is also the `leasehold` crate's
/// documentation) shows this crate's result handler in a `rust,ignore`
/// block: `leasehold`'s doc-tests cannot compile axum code. This test is
/// what keeps that block compiling: it must be, byte for byte, the region
/// of src/service.rs between the `// README: begin` and `// README: end`
/// lines, which this crate compiles.
#[cfg(test)]
mod readme {
    const README: &str = include_str!("../../../README.md");
    const SERVICE: &str = include_str!("service.rs");

    /// The one text between `start` and `end`, both present exactly once.
    fn between<'a>(text: &'a str, start: &str, end: &str, name: &str) -> &'a str {
        assert_eq!(text.matches(start).count(), 1, "{name}: {start:?} once");
        let (_, rest) = text.split_once(start).unwrap_or_default();
        let (region, _) = rest
            .split_once(end)
            .unwrap_or_else(|| panic!("{name}: no {end:?} after {start:?}"));
        region
    }

    #[test]
    fn the_readme_axum_snippet_is_the_compiled_handler() {
        let compiled = between(
            SERVICE,
            "// README: begin\n",
            "// README: end\n",
            "service.rs",
        );
        let section = between(README, "\n## An axum backend\n", "\n## ", "README.md");
        let shown = between(
            section,
            "```rust,ignore\n",
            "```\n",
            "README's axum section",
        );
        assert!(compiled.contains("Check::LeaseHeld"), "{compiled}");
        assert_eq!(
            shown, compiled,
            "README.md's axum snippet is not src/service.rs's marked region; copy the region into README.md"
        );
    }
}

/// The two job services share one results table on one database and take
/// turns on it, and replicas of either queue on the same advisory lock at
/// start: the table's statements are one text, written in each example.
/// This keeps the copies equal.
#[cfg(test)]
mod shared_schema {
    const SYNC_SERVICE: &str = include_str!("../../web_backend/src/service.rs");

    #[test]
    fn the_results_table_is_created_by_the_same_statements_as_the_sync_examples() {
        assert!(
            crate::service::SCHEMA.contains("pg_advisory_xact_lock"),
            "{}",
            crate::service::SCHEMA
        );
        assert!(
            SYNC_SERVICE.contains(crate::service::SCHEMA),
            "examples/web_backend/src/service.rs's SCHEMA differs from this crate's; make them one text"
        );
    }
}
