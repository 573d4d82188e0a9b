//! [`KeeperSet`] as tokio tasks: the sync [`crate::hold::KeeperSet`] (one
//! heartbeat call for a set of one owner's grants, each key lost on its
//! own) from the same code, its heartbeat, bookkeeping and release
//! (`hold::keeper_set`, whose calls run here on the async client's
//! pool), with its two loops as tasks and the losses as futures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::client::AsyncLeaseClient;
use crate::error::LeaseError;
use crate::hold::keeper_set::{set_accessors, Calls, SetSettings, Shared};
use crate::hold::{KeeperSetEvent, LeaseLoss};
use crate::lease::outcome::{KeyRelease, Lease};
use crate::lease::token::FencingToken;

/// Configures a [`KeeperSet`]; see [`KeeperSet::builder`].
#[derive(Debug)]
#[must_use = "a builder does nothing until start() is called"]
pub struct KeeperSetBuilder {
    client: AsyncLeaseClient,
    settings: SetSettings,
}

impl KeeperSetBuilder {
    /// The ttl each heartbeat asks for (default: the shortest
    /// [`Lease::ttl`] of the set).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.settings.ttl = Some(ttl);
        self
    }

    /// Time between heartbeats (default ttl / 3). Must be shorter than
    /// ttl - margin.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.settings.renew_every = Some(every);
        self
    }

    /// Time between retries of a failed heartbeat (default ttl / 30).
    pub fn retry_every(mut self, every: Duration) -> Self {
        self.settings.retry_every = Some(every);
        self
    }

    /// How much earlier than `sent + ttl` the deadline lies (default
    /// ttl / 10). Must be shorter than the ttl.
    pub fn margin(mut self, margin: Duration) -> Self {
        self.settings.margin = Some(margin);
        self
    }

    /// Called (on one of the set's tasks) for every heartbeat, failed
    /// heartbeat, and each lost key. Keep it short.
    pub fn on_event(mut self, handler: impl Fn(&KeeperSetEvent) + Send + Sync + 'static) -> Self {
        self.settings.on_event = Some(Box::new(handler));
        self
    }

    /// Validates (the rules of the sync set's
    /// [`start`](crate::hold::KeeperSetBuilder::start)), sends the first
    /// heartbeat and spawns the set's two tasks on the current tokio
    /// runtime.
    pub async fn start(self) -> Result<KeeperSet, LeaseError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|error| {
            LeaseError::Spawn(std::io::Error::other(format!(
                "an async keeper set runs on a tokio runtime: {error}"
            )))
        })?;
        let shared = self.settings.into_shared(Calls::Tasks(self.client))?;
        shared.first_heartbeat().await?;
        let renewer = runtime.spawn(shared.clone().renew_task());
        let monitor = runtime.spawn(shared.clone().monitor_task());
        Ok(KeeperSet {
            shared,
            tasks: vec![renewer, monitor],
        })
    }
}

/// Keeps a set of one owner's grants alive with two tokio tasks, one call
/// per heartbeat: the sync [`crate::hold::KeeperSet`]'s rules (its
/// documentation has them), with each key's loss as a future,
/// [`KeeperSet::lost`], that the task working on that key `select!`s on.
///
/// Dropping it stops the tasks and releases the kept keys from a task of
/// its own, best effort; [`KeeperSet::stop`] does the same and answers
/// per key.
pub struct KeeperSet {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for KeeperSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeeperSet")
            .field("owner", &self.shared.owner())
            .field("kept", &self.shared.kept_keys().len())
            .finish()
    }
}

impl KeeperSet {
    /// Starts keeping `leases` (one owner's, distinct keys) alive with the
    /// default settings, on `client`'s pool; sends the first heartbeat
    /// before returning.
    pub async fn start(
        client: &AsyncLeaseClient,
        leases: Vec<Lease>,
    ) -> Result<KeeperSet, LeaseError> {
        Self::builder(client, leases).start().await
    }

    /// A builder to change the ttl, intervals, margin, or observe events.
    pub fn builder(client: &AsyncLeaseClient, leases: Vec<Lease>) -> KeeperSetBuilder {
        KeeperSetBuilder {
            client: client.clone(),
            settings: SetSettings::new(leases),
        }
    }

    set_accessors!();

    /// Resolves when `key` is lost, with its loss: the future the task
    /// working on `key` `select!`s on. `None` once the set stopped first,
    /// or at once for a key not in the set. Cancel-safe.
    pub fn lost(
        &self,
        key: &str,
    ) -> impl std::future::Future<Output = Option<LeaseLoss>> + Send + 'static {
        let shared = self.shared.clone();
        let key = key.to_owned();
        async move { shared.key_lost(&key).await }
    }

    /// Resolves when more than `seen` keys are lost, or the set stops;
    /// answers every loss so far. Pass the length of the last answer to
    /// wait for the next loss.
    pub fn losses_after(
        &self,
        seen: usize,
    ) -> impl std::future::Future<Output = Vec<(String, LeaseLoss)>> + Send + 'static {
        let shared = self.shared.clone();
        async move { shared.losses_after(seen).await }
    }

    /// Stops renewing, waits for the set's tasks (a heartbeat in flight
    /// finishes first), and releases every key not refused in one call.
    /// Answers per key, in the order the leases were given.
    pub async fn stop(mut self) -> Result<Vec<KeyRelease>, LeaseError> {
        let refused = self.shared.begin_stop();
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
        self.shared.release_kept(refused).await
    }
}

impl Drop for KeeperSet {
    /// Stops the tasks and releases the kept keys from a task of its own
    /// once they ended (best effort: without a runtime, or on an error,
    /// the leases lapse at their expiry).
    fn drop(&mut self) {
        if self.tasks.is_empty() {
            return;
        }
        let refused = self.shared.begin_stop();
        let tasks: Vec<JoinHandle<()>> = self.tasks.drain(..).collect();
        let shared = self.shared.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            drop(runtime.spawn(async move {
                for task in tasks {
                    let _ = task.await;
                }
                let _ = shared.release_kept(refused).await;
            }));
        }
    }
}
