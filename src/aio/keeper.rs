//! [`Keeper`] on tokio: the sync [`crate::Keeper`]'s state and loops, run as two
//! tasks on the async pool; the loss is also a future to `select!` on. Nothing
//! cancels a renew in flight.
//!
//! ```no_run
//! # async fn demo(client: &leasehold::aio::AsyncLeaseClient, lease: leasehold::Lease) -> Result<(), Box<dyn std::error::Error>> {
//! let keeper = leasehold::aio::Keeper::start(client, lease).await?;
//! tokio::select! { loss = keeper.lost() => eprintln!("lost: {loss:?}"), () = async { /* work */ } => {} }
//! keeper.stop().await?;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::AsyncLeaseClient;
use crate::error::LeaseError;
use crate::hold::heartbeat::{Calls, Heart, Loops};
use crate::hold::keeper::{
    keeper_accessors, keeper_setters, release_on_drop, KeeperSettings, Shared,
};
use crate::hold::{KeeperEvent, LeaseLoss};
use crate::lease::outcome::{Lease, Release};

/// Configures a [`Keeper`]; see [`Keeper::builder`].
#[must_use = "a builder does nothing until start() is called"]
pub struct KeeperBuilder {
    client: AsyncLeaseClient,
    settings: KeeperSettings,
}

impl std::fmt::Debug for KeeperBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.settings.fmt(f)
    }
}

impl KeeperBuilder {
    keeper_setters!(KeeperEvent);

    /// Validates, renews once for the first deadline, spawns the two tasks.
    pub async fn start(self) -> Result<Keeper, LeaseError> {
        let (shared, loops) = self
            .settings
            .start(Calls::Tasks(self.client.pool().clone()))
            .await?;
        Ok(Keeper {
            shared,
            loops: Some(loops),
        })
    }
}

/// Keeps one grant alive with a renewer and a deadline monitor task, by the sync
/// [`crate::Keeper`]'s rules and code; [`Keeper::lost`] is the loss as a future.
/// Dropping it stops the tasks and releases from a task of its own, best effort.
pub struct Keeper {
    shared: Arc<Shared>,
    /// `None` once stopped.
    loops: Option<Loops>,
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt(f)
    }
}

impl Keeper {
    /// Keeps `lease` alive with the defaults on `client`'s pool; renews once first.
    pub async fn start(client: &AsyncLeaseClient, lease: Lease) -> Result<Keeper, LeaseError> {
        Self::builder(client, lease).start().await
    }

    /// A builder to change intervals, margin, or observe events.
    pub fn builder(client: &AsyncLeaseClient, lease: Lease) -> KeeperBuilder {
        KeeperBuilder {
            client: client.clone(),
            settings: KeeperSettings::new(lease),
        }
    }

    keeper_accessors!();

    /// Resolves with the loss, for `select!` beside the work; `None` once stopped
    /// without one. Cancel-safe.
    pub fn lost(&self) -> impl std::future::Future<Output = Option<LeaseLoss>> + Send + 'static {
        let shared = self.shared.clone();
        async move { shared.loss_within(None).await }
    }

    /// Resolves when the lease is lost or `timeout` passes, with the loss.
    pub async fn wait_for_loss(&self, timeout: Duration) -> Option<LeaseLoss> {
        self.shared
            .loss_within(Some(Instant::now() + timeout))
            .await
    }

    /// The shared state, for `run_while_held`'s context, which must not borrow the keeper.
    pub(super) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Stops renewing, releases ([`Release::Refused`] if already lost; a
    /// read-only refusal is resent on another connection) and waits for the
    /// tasks.
    /// Within the stop bound, whatever the database does (down, silent,
    /// refusing): until the safe deadline, or the margin once it has passed.
    /// A release not answered by then finishes on its own and this answers
    /// [`ErrorKind::TimedOut`](crate::ErrorKind::TimedOut); the lease lapses at its ttl.
    pub async fn stop(mut self) -> Result<Release, LeaseError> {
        let deadline = self.shared.stop_deadline();
        let refused = self.shared.begin_stop();
        let released = self.shared.release(refused).await;
        if let Some(loops) = self.loops.take() {
            loops.join_until(deadline).await;
        }
        released
    }

    /// Stops renewing and keeps the grant, which lapses unless the caller renews or releases it.
    pub async fn stop_renewing(mut self) -> Lease {
        let deadline = self.shared.stop_deadline();
        self.shared.begin_stop();
        if let Some(loops) = self.loops.take() {
            loops.join_until(deadline).await;
        }
        self.shared.lease().clone()
    }
}

impl Drop for Keeper {
    /// Stops the tasks and releases from a task of its own (best effort).
    fn drop(&mut self) {
        release_on_drop(&self.shared, self.loops.take());
    }
}
