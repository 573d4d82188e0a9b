//! [`KeeperSet`] as tokio tasks: the sync [`crate::hold::KeeperSet`]'s code run
//! on the async pool, its loops as tasks and each key's loss as a future.

use crate::error::Repr;
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
    /// The ttl each heartbeat asks for (default: the set's shortest [`Lease::ttl`]).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.settings.ttl = Some(ttl);
        self
    }

    /// Time between heartbeats (default ttl / 3); shorter than ttl - margin.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.settings.renew_every = Some(every);
        self
    }

    /// Time between retries of a failed heartbeat (default ttl / 30).
    pub fn retry_every(mut self, every: Duration) -> Self {
        self.settings.retry_every = Some(every);
        self
    }

    /// How much earlier than `sent + ttl` the deadline lies (default ttl / 10).
    pub fn margin(mut self, margin: Duration) -> Self {
        self.settings.margin = Some(margin);
        self
    }

    /// Called on a set's task for every heartbeat, failure and lost key; keep it short.
    pub fn on_event(mut self, handler: impl Fn(&KeeperSetEvent) + Send + Sync + 'static) -> Self {
        self.settings.on_event = Some(Box::new(handler));
        self
    }

    /// Validates as [`start`](crate::hold::KeeperSetBuilder::start) does, sends the
    /// first heartbeat and spawns the two tasks.
    pub async fn start(self) -> Result<KeeperSet, LeaseError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|error| {
            LeaseError::from(Repr::Spawn(std::io::Error::other(format!(
                "an async keeper set runs on a tokio runtime: {error}"
            ))))
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

/// Keeps one owner's grants alive in one call per heartbeat, by the sync
/// [`crate::hold::KeeperSet`]'s rules; [`KeeperSet::lost`] is a key's loss as a
/// future. Dropping it releases the keys from a task of its own, best effort.
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
    /// Keeps `leases` (one owner's, distinct keys) alive with the defaults; heartbeats once first.
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

    /// Resolves with `key`'s loss; `None` once stopped, or at once for a key not in the set.
    pub fn lost(
        &self,
        key: &str,
    ) -> impl std::future::Future<Output = Option<LeaseLoss>> + Send + 'static {
        let shared = self.shared.clone();
        let key = key.to_owned();
        async move { shared.key_lost(&key).await }
    }

    /// Resolves when more than `seen` keys are lost, or the set stops, with every loss so far.
    pub fn losses_after(
        &self,
        seen: usize,
    ) -> impl std::future::Future<Output = Vec<(String, LeaseLoss)>> + Send + 'static {
        let shared = self.shared.clone();
        async move { shared.losses_after(seen).await }
    }

    /// Stops, waits for the tasks and releases the unrefused keys in one call, per key in order.
    pub async fn stop(mut self) -> Result<Vec<KeyRelease>, LeaseError> {
        let refused = self.shared.begin_stop();
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
        self.shared.release_kept(refused).await
    }
}

impl Drop for KeeperSet {
    /// Stops the tasks and releases the keys from a task of its own (best effort).
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
