//! `GET /metrics`: leasehold's metrics (and any other `metrics` facade
//! counters of the process) in the Prometheus text format.
//!
//! The recorder is metrics-exporter-prometheus, built without its own HTTP
//! listener: axum already serves the process, so the route renders through
//! the exporter's handle. A recorder is process-wide, so it is installed
//! once, by the first service started, and shared by every later one (a
//! test binary starts several).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
pub use metrics_exporter_prometheus::PrometheusHandle;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

use crate::service::App;

/// The Prometheus text exposition format's content type.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Bucket bounds of the `_seconds` histograms: a lease call takes about a
/// millisecond on a local server, a wait up to the holder's ttl.
const SECONDS_BUCKETS: &[f64] = &[
    0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// How often histogram samples are folded into their buckets between
/// scrapes, so an unscraped process does not keep every sample.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Why the recorder could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("could not install the Prometheus recorder: {0}")]
pub struct MetricsError(#[source] metrics_exporter_prometheus::BuildError);

/// The process's Prometheus handle, installing the recorder on first use.
///
/// The upkeep runs on a thread of its own rather than a tokio task: the
/// recorder outlives any one runtime (each test has its own), and a task
/// would stop with the runtime that spawned it.
pub fn handle() -> Result<PrometheusHandle, MetricsError> {
    static INSTALLED: Mutex<Option<PrometheusHandle>> = Mutex::new(None);
    let mut installed = INSTALLED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(handle) = installed.as_ref() {
        return Ok(handle.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(MetricsError)?;
    // HELP and TYPE lines for leasehold's metrics.
    leasehold::telemetry::describe_metrics();
    let upkeep = handle.clone();
    std::thread::spawn(move || loop {
        std::thread::sleep(UPKEEP_EVERY);
        upkeep.run_upkeep();
    });
    *installed = Some(handle.clone());
    Ok(handle)
}

/// `GET /metrics`: the current values. Rendering is a few microseconds of
/// string building, so it runs on the request's task.
pub(crate) async fn scrape(State(app): State<App>) -> impl IntoResponse {
    app.prometheus.run_upkeep();
    ([(CONTENT_TYPE, TEXT_FORMAT)], app.prometheus.render())
}
