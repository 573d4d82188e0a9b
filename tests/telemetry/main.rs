//! What the instrumentation emits (features `tracing` and `metrics`),
//! against a real PostgreSQL: a test recorder and a capturing subscriber
//! are installed process-wide, and the tests run one at a time so each
//! sees only its own calls.
//!
//! A binary of its own because both facades allow one global recorder and
//! one global subscriber per process, and a keeper's or listener's thread
//! reports outside the test's thread (thread-local ones would miss them).

mod capture;
mod every_call;
mod metrics_scenario;
mod recorder;
mod tracing_spans;

use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use capture::Capture;
use recorder::TestRecorder;

/// The process's recorder and subscriber, installed on first use.
pub struct Installed {
    /// The metrics recorder every test reads its counters from.
    pub metrics: &'static TestRecorder,
    /// The spans and events the subscriber captured.
    pub spans: Capture,
}

/// Installs the recorder and subscriber (once), and serialises the tests:
/// the returned guard keeps other tests of this binary out until dropped.
pub fn exclusive() -> (MutexGuard<'static, ()>, &'static Installed) {
    static SERIAL: Mutex<()> = Mutex::new(());
    static INSTALLED: OnceLock<Installed> = OnceLock::new();
    let guard = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let installed = INSTALLED.get_or_init(|| {
        let metrics: &'static TestRecorder = Box::leak(Box::default());
        metrics::set_global_recorder(metrics).expect("no other recorder in this binary");
        let spans = Capture::default();
        tracing::subscriber::set_global_default(spans.clone())
            .expect("no other subscriber in this binary");
        Installed { metrics, spans }
    });
    installed.metrics.clear();
    installed.spans.clear();
    leasehold::telemetry::set_trace_keys(leasehold::telemetry::TraceKeys::Hidden);
    (guard, installed)
}

/// Polls `done` until it holds; panics with `what` after 30 s.
pub fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
