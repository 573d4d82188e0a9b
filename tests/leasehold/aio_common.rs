//! What the async tests share (feature `async`): a runtime, a pooled
//! client of a test's database, and a bounded poll of observable state.

use std::time::Duration;

use leasehold::aio::AsyncLeaseClient;
use leasehold_test_support::TestDb;

/// A runtime with two workers: a case that parks a blocking call (a sync
/// face's waiter) still has a thread left for its own steps.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A client of the test's database with a pool of four.
pub async fn client(db: &TestDb) -> AsyncLeaseClient {
    AsyncLeaseClient::builder(&db.url)
        .max_size(4)
        .build()
        .await
        .expect("an async client")
}

/// Polls `done` (state of the server or the process) every 5 ms until it
/// holds; fails the test after 30 s.
pub async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..6_000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never observed: {what}");
}
