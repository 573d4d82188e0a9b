//! `GET /metrics`, scraped with a real HTTP client (reqwest) from the
//! service on a loopback port against a real PostgreSQL: leasehold's
//! counters move by exactly what the requests in between did.
//!
//! A test binary of its own: the Prometheus recorder is process-wide, so
//! another test's requests would move the same counters.

use std::collections::BTreeMap;
use std::time::Duration;

use axum_backend::service::Service;
use leasehold_test_support::{TestDb, TestServer};
use serde_json::{json, Value};

/// One scrape: the content type, the text, and every sample line as
/// series -> value.
async fn scrape(http: &reqwest::Client, base: &str) -> (String, String, BTreeMap<String, f64>) {
    let response = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("GET /metrics");
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let text = response.text().await.expect("body");
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

async fn post(
    http: &reqwest::Client,
    url: String,
    token: Option<&str>,
    body: Value,
) -> (u16, Value) {
    let mut request = http.post(url).json(&body);
    if let Some(token) = token {
        request = request.header("Fencing-Token", token);
    }
    let response = request.send().await.expect("POST");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

#[tokio::test]
async fn metrics_are_served_in_prometheus_text_and_move_with_the_requests() {
    let db = TestDb::empty_on(TestServer::local());
    let service = Service::start(&db.url, "127.0.0.1:0", 2)
        .await
        .expect("start the service");
    let base = format!("http://{}", service.addr());
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("HTTP client");

    let (content_type, _, before) = scrape(&http, &base).await;
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    let value =
        |samples: &BTreeMap<String, f64>, series: &str| samples.get(series).copied().unwrap_or(0.0);

    let claim = |worker: &str| {
        let body = json!({"worker": worker, "ttl_ms": 30_000});
        post(&http, format!("{base}/jobs/job-1/claim"), None, body)
    };
    let (status, granted) = claim("worker-a").await;
    assert_eq!(status, 200, "{granted}");
    let (status, locked) = claim("worker-b").await;
    assert_eq!(status, 423, "{locked}");
    let token = granted["token"].as_str().expect("a token").to_owned();
    let (status, beat) = post(
        &http,
        format!("{base}/jobs/job-1/heartbeat"),
        Some(&token),
        json!({"ttl_ms": 30_000}),
    )
    .await;
    assert_eq!(status, 200, "{beat}");
    let stored = http
        .put(format!("{base}/jobs/job-1/result"))
        .header("Fencing-Token", &token)
        .json(&json!({"result": 1}))
        .send()
        .await
        .expect("PUT result");
    assert_eq!(stored.status().as_u16(), 200);

    let (_, text, after) = scrape(&http, &base).await;
    let moved = |series: &str| value(&after, series) - value(&before, series);
    assert_eq!(moved(r#"leasehold_acquire_total{outcome="granted"}"#), 1.0);
    assert_eq!(moved(r#"leasehold_acquire_total{outcome="denied"}"#), 1.0);
    // The refused claim looked up the holder to name it.
    assert_eq!(
        moved(r#"leasehold_calls_total{operation="inspect",outcome="held"}"#),
        1.0
    );
    assert_eq!(
        moved(r#"leasehold_calls_total{operation="renew",outcome="renewed"}"#),
        1.0
    );
    // The fenced write's admission, in the request's own transaction, is
    // counted like any other guard call.
    assert_eq!(
        moved(r#"leasehold_calls_total{operation="admit_held",outcome="admitted"}"#),
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

    service.shutdown().await.expect("a clean stop");
}
