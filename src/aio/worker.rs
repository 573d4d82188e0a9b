//! [`run_while_held`] for tasks, with the sync face's outcome rules from the same
//! code; [`WorkContext::stopped`] is a future a waiting step can `select!` on.
//!
//! ```no_run
//! # async fn demo(keeper: leasehold::aio::Keeper, shutdown: tokio::sync::oneshot::Receiver<()>) {
//! let outcome = leasehold::aio::run_while_held(keeper, async { let _ = shutdown.await; }, async |ctx| {
//!     tokio::select! { why = ctx.stopped() => Err(format!("{why:?}")), () = async {} => Ok(1) }
//! }).await;
//! # let _ = outcome; }
//! ```

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use super::keeper::Keeper;
use crate::hold::keeper::Shared;
use crate::hold::worker::{decide, lost_now, or_deadline, stop_reason};
use crate::hold::{StopReason, WorkOutcome};
use crate::lease::token::FencingToken;

/// What the work sees: the token, whether to stop, and a future for when.
/// Borrows nothing, so the work may move it into tasks of its own.
#[derive(Clone)]
pub struct WorkContext {
    keeper: Arc<Shared>,
    cancelled: watch::Receiver<bool>,
}

impl std::fmt::Debug for WorkContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkContext")
            .field("token", self.keeper.token())
            .field("stop_reason", &self.stop_reason())
            .finish()
    }
}

impl WorkContext {
    /// The fencing token of the held grant: present it with every write.
    pub fn token(&self) -> &FencingToken {
        self.keeper.token()
    }

    /// Until when the lease is safe to act on (client monotonic clock).
    pub fn safe_until(&self) -> Instant {
        self.keeper.safe_until()
    }

    /// Whether to stop now (lease unsafe or cancelled); cheap, call it often.
    pub fn should_stop(&self) -> bool {
        !self.keeper.is_valid() || *self.cancelled.borrow()
    }

    /// Why to stop, if [`WorkContext::should_stop`].
    pub fn stop_reason(&self) -> Option<StopReason> {
        stop_reason(
            lost_now(self.keeper.is_valid(), || self.keeper.loss()),
            *self.cancelled.borrow(),
        )
    }

    /// `Err(reason)` when the work should stop, for `?`.
    pub fn check(&self) -> Result<(), StopReason> {
        self.stop_reason().map_or(Ok(()), Err)
    }

    /// Sleeps for `duration`, waking at once with `Err(reason)` when the work
    /// must stop: the lease lost, its safe deadline passed, or cancelled.
    pub async fn sleep(&self, duration: std::time::Duration) -> Result<(), StopReason> {
        self.check()?;
        tokio::select! {
            () = tokio::time::sleep(duration) => self.check(),
            why = self.stopped() => Err(why),
        }
    }

    /// Resolves with why the work should stop (lost, deadline passed, or cancelled).
    /// Cancel-safe.
    pub async fn stopped(&self) -> StopReason {
        let mut cancelled = self.cancelled.clone();
        tokio::select! {
            // `None`: the keeper stopped, only after the work returned; the deadline decides.
            loss = self.keeper.loss_within(None) => StopReason::LeaseLost(or_deadline(loss)),
            _ = cancelled.wait_for(|cancelled| *cancelled) => StopReason::Cancelled,
        }
    }
}

/// Runs `work` under `keeper`'s lease, then stops the keeper (releasing). `cancel`
/// only tells the context; the outcome is decided when the work returns, as the sync
/// [`crate::hold::run_while_held`] decides it ([`WorkOutcome`]).
pub async fn run_while_held<T, E, F>(
    keeper: Keeper,
    cancel: impl Future<Output = ()>,
    work: F,
) -> WorkOutcome<T, E>
where
    F: AsyncFnOnce(WorkContext) -> Result<T, E>,
{
    let (cancelled, cancelled_receiver) = watch::channel(false);
    let context = WorkContext {
        keeper: keeper.shared(),
        cancelled: cancelled_receiver,
    };
    let mut work = pin!(work(context));
    let mut cancel = pin!(cancel);
    let mut cancel_resolved = false;
    let result = loop {
        tokio::select! {
            result = work.as_mut() => break result,
            () = cancel.as_mut(), if !cancel_resolved => {
                cancel_resolved = true;
                cancelled.send_replace(true);
            }
        }
    };
    let lost = lost_now(keeper.is_valid(), || keeper.loss());
    let outcome = decide(lost, result, *cancelled.borrow());
    let _ = keeper.stop().await;
    outcome
}
