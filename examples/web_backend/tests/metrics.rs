//! `GET /metrics`, scraped with a real HTTP client (ureq) from the service
//! on a loopback port against a real PostgreSQL: leasehold's counters move
//! by exactly what the requests in between did.
//!
//! A test binary of its own: the Prometheus recorder is process-wide, so
//! another test's requests would move the same counters.

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold::LeaseClient;
use leasehold_test_support::{TestDb, TestServer};
use serde_json::{json, Value};
use web_backend::service;

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

/// One scrape: the content type, and every sample line as series -> value.
fn scrape(agent: &ureq::Agent, base: &str) -> (String, String, BTreeMap<String, f64>) {
    let response = agent
        .get(&format!("{base}/metrics"))
        .call()
        .expect("GET /metrics");
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let text = response.into_body().read_to_string().expect("body");
    let samples = text
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let (series, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("not a sample line: {line:?}"));
            let value = value
                .parse()
                .unwrap_or_else(|error| panic!("{line:?}: {error}"));
            (series.to_owned(), value)
        })
        .collect();
    (content_type, text, samples)
}

fn claim(agent: &ureq::Agent, base: &str, job: &str, worker: &str) -> (u16, Value) {
    let response = agent
        .post(&format!("{base}/jobs/{job}/claim"))
        .content_type("application/json")
        .send(json!({"worker": worker, "ttl_ms": 30_000}).to_string())
        .expect("claim");
    let status = response.status().as_u16();
    let body = response.into_body().read_to_string().expect("body");
    (status, serde_json::from_str(&body).expect("JSON"))
}

#[test]
fn metrics_are_served_in_prometheus_text_and_move_with_the_requests() {
    let db = TestDb::empty_on(TestServer::local());
    let client = LeaseClient::connect(&db.url, 4).expect("pool");
    let service = service::Service::start(client, "127.0.0.1:0", 2).expect("start service");
    let base = format!("http://{}", service.addr());
    let agent = agent();

    let (content_type, _, before) = scrape(&agent, &base);
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    let value =
        |samples: &BTreeMap<String, f64>, series: &str| samples.get(series).copied().unwrap_or(0.0);

    let (status, granted) = claim(&agent, &base, "job-1", "worker-a");
    assert_eq!(status, 200, "{granted}");
    let (status, locked) = claim(&agent, &base, "job-1", "worker-b");
    assert_eq!(status, 423, "{locked}");

    let (_, text, after) = scrape(&agent, &base);
    let moved = |series: &str| value(&after, series) - value(&before, series);
    assert_eq!(moved(r#"leasehold_acquire_total{outcome="granted"}"#), 1.0);
    assert_eq!(moved(r#"leasehold_acquire_total{outcome="denied"}"#), 1.0);
    // The refused claim looked up the holder to name it.
    assert_eq!(
        moved(r#"leasehold_calls_total{operation="inspect",outcome="held"}"#),
        1.0
    );
    assert_eq!(
        moved(r#"leasehold_call_duration_seconds_count{operation="acquire"}"#),
        2.0
    );
    // Histograms are rendered with buckets, and described.
    assert!(after
        .contains_key(r#"leasehold_call_duration_seconds_bucket{operation="acquire",le="+Inf"}"#));
    assert!(
        text.contains("# TYPE leasehold_acquire_total counter"),
        "{text}"
    );
    assert!(text.contains("# HELP leasehold_acquire_total "), "{text}");
    // Keys are never labels.
    assert!(!text.contains("job-1"), "{text}");

    service.shutdown();
}
