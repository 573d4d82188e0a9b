//! [`ReleaseWatch`] for tasks: the sync watch on the same listener, its reads
//! awaiting a `tokio::sync::Notify` the listener wakes beside the condvar.
//!
//! ```no_run
//! # async fn demo(waiter: &leasehold::aio::LeaseWaiter) -> Result<(), leasehold::LeaseError> {
//! let watch = waiter.watch_releases(["job-1", "job-2"])?;
//! watch.wait_armed(std::time::Duration::from_secs(15)).await; // then read the keys' state
//! loop { println!("{:?}", watch.recv().await) }
//! # }
//! ```

use std::time::Duration;

use crate::error::LeaseError;
use crate::wait::ReleaseEvent;

/// Release wake-ups for a set of keys: the sync [`crate::wait::ReleaseWatch`] with
/// awaitable reads, queueing at most one event per key plus one resync.
#[derive(Debug)]
pub struct ReleaseWatch {
    watch: crate::wait::ReleaseWatch,
}

impl ReleaseWatch {
    pub(super) fn new(watch: crate::wait::ReleaseWatch) -> Self {
        Self { watch }
    }

    /// The oldest unread event; cancel-safe (taken only when the future resolves).
    pub async fn recv(&self) -> ReleaseEvent {
        self.watch.recv_async().await
    }

    /// The oldest unread event, waiting up to `timeout`.
    pub async fn recv_timeout(&self, timeout: Duration) -> Option<ReleaseEvent> {
        tokio::time::timeout(timeout, self.recv()).await.ok()
    }

    /// The oldest event not yet read, without waiting.
    pub fn try_recv(&self) -> Option<ReleaseEvent> {
        self.watch.try_recv()
    }

    /// Resolves when every key is armed or refused, or `timeout` passes; answers how
    /// many are armed. Read the keys' state after it. (Waits on a blocking-pool thread.)
    pub async fn wait_armed(&self, timeout: Duration) -> usize {
        let (listener, keys) = self.watch.settle_parts();
        tokio::task::spawn_blocking(move || {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            listener.wait_settled(&keys, timeout)
        })
        .await
        .unwrap_or(0)
    }

    /// Adds `key`, as [`crate::wait::ReleaseWatch::add`] does.
    pub fn add(&mut self, key: &str) -> Result<bool, LeaseError> {
        self.watch.add(key)
    }

    /// Stops watching `key`; `false` when it was not watched.
    pub fn remove(&mut self, key: &str) -> bool {
        self.watch.remove(key)
    }

    /// Whether `key` is watched.
    pub fn contains(&self, key: &str) -> bool {
        self.watch.contains(key)
    }

    /// How many keys are watched.
    pub fn len(&self) -> usize {
        self.watch.len()
    }

    /// Whether no key is watched.
    pub fn is_empty(&self) -> bool {
        self.watch.is_empty()
    }

    /// The watched keys, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.watch.keys()
    }

    /// How many watched keys are armed ([`crate::wait::ReleaseWatch::armed`]).
    pub fn armed(&self) -> usize {
        self.watch.armed()
    }

    /// Whether `key` is watched and armed.
    pub fn is_armed(&self, key: &str) -> bool {
        self.watch.is_armed(key)
    }
}
