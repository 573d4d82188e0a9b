//! The web backend example's service: a small synchronous job service over
//! leasehold, where workers claim jobs, heartbeat them, and submit results
//! fenced by their token (routes and status codes in [`service`] and
//! [`api_error`]), and serves leasehold's metrics for Prometheus
//! ([`metrics`]).
//!
//! A library so that the binary (`src/main.rs`) and the integration test
//! (`tests/web_backend.rs`) run the same code.

pub mod api_error;
pub mod metrics;
pub mod service;
