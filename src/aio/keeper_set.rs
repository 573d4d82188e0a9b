//! [`KeeperSet`] as tokio tasks: the sync [`crate::hold::KeeperSet`]'s code run
//! on the async pool, its loops as tasks and each key's loss as a future.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::AsyncLeaseClient;
use crate::error::LeaseError;
use crate::hold::heartbeat::{Calls, Heart, Loops};
use crate::hold::keeper::keeper_setters;
use crate::hold::keeper_set::{release_on_drop, set_accessors, SetSettings, Shared};
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
    keeper_setters!(KeeperSetEvent);

    /// Validates as [`start`](crate::hold::KeeperSetBuilder::start) does, sends the
    /// first heartbeat and spawns the two tasks.
    pub async fn start(self) -> Result<KeeperSet, LeaseError> {
        let (shared, loops) = self
            .settings
            .start(Calls::Tasks(self.client.pool().clone()))
            .await?;
        Ok(KeeperSet {
            shared,
            loops: Some(loops),
        })
    }
}

/// Keeps one owner's grants alive in one call per heartbeat, by the sync
/// [`crate::hold::KeeperSet`]'s rules; [`KeeperSet::lost`] is a key's loss as a
/// future. Dropping it releases the keys from a task of its own, best effort.
pub struct KeeperSet {
    shared: Arc<Shared>,
    /// `None` once stopped.
    loops: Option<Loops>,
}

impl std::fmt::Debug for KeeperSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt(f)
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
        async move { shared.key_loss_within(&key, None).await }
    }

    /// Resolves when `key` is lost or `timeout` passes, with its loss.
    pub async fn wait_for_loss(&self, key: &str, timeout: Duration) -> Option<LeaseLoss> {
        self.shared
            .key_loss_within(key, Some(Instant::now() + timeout))
            .await
    }

    /// Resolves when more than `seen` keys are lost, or the set stops, with every loss so far.
    pub fn losses_after(
        &self,
        seen: usize,
    ) -> impl std::future::Future<Output = Vec<(String, LeaseLoss)>> + Send + 'static {
        let shared = self.shared.clone();
        async move { shared.losses_within(seen, None).await }
    }

    /// Resolves when more than `seen` keys are lost or `timeout` passes, with every loss so far.
    pub async fn wait_for_losses(
        &self,
        seen: usize,
        timeout: Duration,
    ) -> Vec<(String, LeaseLoss)> {
        self.shared
            .losses_within(seen, Some(Instant::now() + timeout))
            .await
    }

    /// Stops, releases the unrefused keys in one call and waits for the
    /// tasks; per key in order.
    /// Within the stop bound, whatever the database does (down, silent,
    /// refusing): until the safe deadline, or the margin once it has passed.
    /// A release not answered by then finishes on its own and this answers
    /// [`ErrorKind::TimedOut`](crate::ErrorKind::TimedOut); the leases lapse at its ttl.
    pub async fn stop(mut self) -> Result<Vec<KeyRelease>, LeaseError> {
        let deadline = self.shared.stop_deadline();
        let refused = self.shared.begin_stop();
        let released = self.shared.release_kept(refused).await;
        if let Some(loops) = self.loops.take() {
            loops.join_until(deadline).await;
        }
        released
    }
}

impl Drop for KeeperSet {
    /// Stops the tasks and releases the keys from a task of its own (best effort).
    fn drop(&mut self) {
        release_on_drop(&self.shared, self.loops.take());
    }
}
