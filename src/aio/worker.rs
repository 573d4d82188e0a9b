//! Running async work while a lease is held, and knowing why it ended: the
//! sync [`crate::hold::run_while_held`] for tasks.
//!
//! The outcome rules are the sync face's, from the same code
//! (`hold::worker::{lost_now, stop_reason, decide}`): the work runs until it
//! returns, and what it returned counts only if the lease was still safe
//! then. What the async form adds is a future to wait on:
//! [`WorkContext::stopped`] resolves when the lease is lost or the work is
//! cancelled, so a step that waits (a request, a sleep) can `select!` on it
//! instead of polling [`WorkContext::should_stop`].
//!
//! Cancellation is a future, as in
//! [`LeaseWaiter::acquire_cancellable`](super::LeaseWaiter::acquire_cancellable):
//! once it resolves the context says so, and the work decides how to stop.
//!
//! ```no_run
//! # async fn demo(keeper: leasehold::aio::Keeper, shutdown: tokio::sync::oneshot::Receiver<()>) {
//! use leasehold::aio::run_while_held;
//! use leasehold::hold::WorkOutcome;
//! let outcome = run_while_held(keeper, async { let _ = shutdown.await; }, async |ctx| {
//!     for step in 0..100 {
//!         tokio::select! {
//!             why = ctx.stopped() => return Err(format!("stopped after {step} steps: {why:?}")),
//!             () = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
//!         }
//!         // ... one step, writing through guards with ctx.token() ...
//!     }
//!     Ok(100)
//! })
//! .await;
//! match outcome {
//!     WorkOutcome::Finished(steps) => println!("done: {steps}"),
//!     WorkOutcome::LeaseLost(why) => println!("lost the lease: {why}"),
//!     WorkOutcome::Cancelled => println!("cancelled"),
//!     WorkOutcome::Failed(error) => println!("failed: {error}"),
//! }
//! # }
//! ```

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use super::keeper::{Keeper, Shared};
use crate::hold::worker::{decide, lost_now, or_deadline, stop_reason};
use crate::hold::{StopReason, WorkOutcome};
use crate::lease::token::FencingToken;

/// What the work sees: the grant's token, whether to stop, and a future
/// that resolves when it should. Cheap to clone; it borrows nothing, so
/// the work may move it into tasks of its own.
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

    /// Whether to stop now: the lease is no longer safe or the work was
    /// cancelled. Two loads and a clock read: call it often.
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

    /// `Err(reason)` when the work should stop; for `?` with an error type
    /// that converts from [`StopReason`].
    pub fn check(&self) -> Result<(), StopReason> {
        self.stop_reason().map_or(Ok(()), Err)
    }

    /// Resolves when the work should stop, with the reason: the lease was
    /// lost (its safe deadline passed included) or the cancellation
    /// resolved. Cancel-safe: dropping it changes nothing, and it may be
    /// awaited any number of times.
    pub async fn stopped(&self) -> StopReason {
        let mut cancelled = self.cancelled.clone();
        tokio::select! {
            // `None`: the keeper stopped, which it does only after the work
            // returned; the deadline is what ends a lease then.
            loss = self.keeper.lost() => StopReason::LeaseLost(or_deadline(loss)),
            _ = cancelled.wait_for(|cancelled| *cancelled) => StopReason::Cancelled,
        }
    }
}

/// Runs `work` under `keeper`'s lease, then stops the keeper, which
/// releases the lease (a failing release is ignored: the lease then lapses
/// at its expiry).
///
/// `cancel` is polled beside the work: once it resolves, the context's
/// [`should_stop`](WorkContext::should_stop) and
/// [`stopped`](WorkContext::stopped) say so, and the work still runs until
/// it returns. The outcome is decided when it returns, as the sync
/// [`crate::hold::run_while_held`] decides it: lease not safe any more →
/// [`WorkOutcome::LeaseLost`]; else `Ok` → [`WorkOutcome::Finished`]; else
/// cancelled → [`WorkOutcome::Cancelled`]; else [`WorkOutcome::Failed`].
/// Dropping the returned future drops the work and the keeper (which
/// releases from a task of its own).
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
