//! [`ReleaseWatch`] for tasks: the sync watch's release events
//! (`crate::wait::ReleaseWatch`), read with `.await` instead of a blocked
//! thread.
//!
//! It is the sync watch itself, on the same shared listener, with the same
//! registrations, limits and events; only the reads that wait differ: the
//! listener's delivery wakes a `tokio::sync::Notify` beside the condvar a
//! blocking read waits on.
//!
//! ```no_run
//! # async fn demo(waiter: &leasehold::aio::LeaseWaiter) -> Result<(), leasehold::LeaseError> {
//! use std::time::Duration;
//! use leasehold::wait::ReleaseEvent;
//! let watch = waiter.watch_releases(["job-1", "job-2"])?;
//! watch.wait_armed(Duration::from_secs(15)).await;
//! // ... read the keys' state ...
//! loop {
//!     match watch.recv().await {
//!         ReleaseEvent::Released { key } => println!("{key} was released"),
//!         _ => println!("releases may have been missed: read the keys' state again"),
//!     }
//! }
//! # }
//! ```

use std::time::Duration;

use crate::error::LeaseError;
use crate::wait::ReleaseEvent;

/// A stream of release wake-ups for a set of keys, from
/// [`LeaseWaiter::watch_releases`](super::LeaseWaiter::watch_releases);
/// the sync [`crate::wait::ReleaseWatch`] with awaitable reads. Events
/// queue while nobody reads them, at most one per key plus one resync.
/// Dropping it withdraws its keys' registrations, unless a waiter or
/// another watch of the process still needs them.
#[derive(Debug)]
pub struct ReleaseWatch {
    watch: crate::wait::ReleaseWatch,
}

impl ReleaseWatch {
    pub(super) fn new(watch: crate::wait::ReleaseWatch) -> Self {
        Self { watch }
    }

    /// The oldest event not yet read, waiting as long as it takes.
    /// Cancel-safe: an event is taken from the queue only when the future
    /// resolves with it.
    pub async fn recv(&self) -> ReleaseEvent {
        self.watch.recv_async().await
    }

    /// The oldest event not yet read, waiting up to `timeout`; `None` when
    /// none came.
    pub async fn recv_timeout(&self, timeout: Duration) -> Option<ReleaseEvent> {
        tokio::time::timeout(timeout, self.recv()).await.ok()
    }

    /// The oldest event not yet read, without waiting.
    pub fn try_recv(&self) -> Option<ReleaseEvent> {
        self.watch.try_recv()
    }

    /// Resolves when every watched key is registered or refused in a
    /// listener session that is up, or `timeout` passes; answers how many
    /// are armed then. Read the keys' state after it: a release from then
    /// on is reported. (It waits on a blocking-pool thread: a start-up
    /// step, not a loop.)
    pub async fn wait_armed(&self, timeout: Duration) -> usize {
        let (listener, keys) = self.watch.settle_parts();
        tokio::task::spawn_blocking(move || {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            listener.wait_settled(&keys, timeout)
        })
        .await
        .unwrap_or(0)
    }

    /// Adds `key` to the watched keys, as
    /// [`crate::wait::ReleaseWatch::add`] does.
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

    /// How many watched keys are armed (see
    /// [`crate::wait::ReleaseWatch::armed`]).
    pub fn armed(&self) -> usize {
        self.watch.armed()
    }

    /// Whether `key` is watched and armed.
    pub fn is_armed(&self, key: &str) -> bool {
        self.watch.is_armed(key)
    }
}
