//! Running work while a lease is held. Guards fence database writes; anything
//! else (in-memory work, third-party calls) must stop by itself, so the
//! [`WorkContext`] says cheaply whether to stop, and the outcome says why it ended.
//!
//! ```no_run
//! # fn demo(keeper: leasehold::Keeper) {
//! use leasehold::hold::{run_while_held, CancelToken};
//! let outcome = run_while_held(keeper, &CancelToken::new(), |ctx| {
//!     if ctx.should_stop() { return Err("stopped") } // else write through guards with ctx.token()
//!     Ok(1)
//! });
//! # let _ = outcome; }
//! ```

use std::time::{Duration, Instant};

use super::cancel::CancelToken;
use super::keeper::{Keeper, LeaseLoss};
use crate::lease::token::FencingToken;
use crate::sql::execute::finish;

/// Why work should stop now.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum StopReason {
    /// The lease is lost (or its safe deadline passed).
    LeaseLost(LeaseLoss),
    /// The cancel token fired.
    Cancelled,
}

/// What the work closure sees.
#[derive(Debug)]
pub struct WorkContext<'a> {
    keeper: &'a Keeper,
    cancel: &'a CancelToken,
}

impl WorkContext<'_> {
    /// The fencing token of the held grant: present it with every write.
    pub fn token(&self) -> &FencingToken {
        self.keeper.token()
    }

    /// Until when the lease is safe to act on (client monotonic clock).
    pub fn safe_until(&self) -> Instant {
        self.keeper.safe_until()
    }

    /// Whether to stop now (lease unsafe or cancelled); two loads and a clock read.
    pub fn should_stop(&self) -> bool {
        !self.keeper.is_valid() || self.cancel.is_cancelled()
    }

    /// Why to stop, if [`WorkContext::should_stop`].
    pub fn stop_reason(&self) -> Option<StopReason> {
        stop_reason(
            lost_now(self.keeper.is_valid(), || self.keeper.loss()),
            self.cancel.is_cancelled(),
        )
    }

    /// `Err(reason)` when the work should stop, for `?`.
    pub fn check(&self) -> Result<(), StopReason> {
        self.stop_reason().map_or(Ok(()), Err)
    }

    /// Sleeps for `duration`, waking at once with `Err(reason)` when the work
    /// must stop: the lease lost, its safe deadline passed, or cancelled.
    pub fn sleep(&self, duration: Duration) -> Result<(), StopReason> {
        finish(
            self.keeper
                .shared()
                .sleep_while_held(duration, Some(self.cancel), || self.stop_reason()),
        )
    }
}

/// The loss that ends work now, if the lease is not safe: the one rule of both
/// faces; a deadline that passed before the keeper said so is `DeadlinePassed`.
pub(crate) fn lost_now(valid: bool, loss: impl FnOnce() -> Option<LeaseLoss>) -> Option<LeaseLoss> {
    (!valid).then(|| or_deadline(loss()))
}

/// The keeper's loss, or the passed safe deadline if it has not said so yet.
pub(crate) fn or_deadline(loss: Option<LeaseLoss>) -> LeaseLoss {
    loss.unwrap_or(LeaseLoss::DeadlinePassed { last_error: None })
}

/// Why work should stop now, if it should (`lost` from [`lost_now`]).
pub(crate) fn stop_reason(lost: Option<LeaseLoss>, cancelled: bool) -> Option<StopReason> {
    match lost {
        Some(loss) => Some(StopReason::LeaseLost(loss)),
        None => cancelled.then_some(StopReason::Cancelled),
    }
}

/// Why [`run_while_held`] ended.
#[derive(Debug)]
#[must_use = "the outcome says whether the work completed under the lease"]
pub enum WorkOutcome<T, E> {
    /// `Ok` while the lease was safe (also if cancelled meanwhile: the work finished).
    Finished(T),
    /// The lease was lost before the closure returned, whatever it returned.
    LeaseLost(LeaseLoss),
    /// Cancelled, and the closure returned `Err`.
    Cancelled,
    /// The closure failed while the lease was safe and not cancelled.
    Failed(E),
}

/// Runs `work` under `keeper`'s lease, then releases it (a failed release lapses).
/// The outcome is decided when the closure returns ([`WorkOutcome`]).
pub fn run_while_held<T, E, F>(keeper: Keeper, cancel: &CancelToken, work: F) -> WorkOutcome<T, E>
where
    F: FnOnce(&WorkContext<'_>) -> Result<T, E>,
{
    let result = {
        let ctx = WorkContext {
            keeper: &keeper,
            cancel,
        };
        work(&ctx)
    };
    let lost = lost_now(keeper.is_valid(), || keeper.loss());
    let outcome = decide(lost, result, cancel.is_cancelled());
    let _ = keeper.stop();
    outcome
}

/// The outcome of work that returned `result`: both faces' one rule.
pub(crate) fn decide<T, E>(
    lost: Option<LeaseLoss>,
    result: Result<T, E>,
    cancelled: bool,
) -> WorkOutcome<T, E> {
    if let Some(loss) = lost {
        return WorkOutcome::LeaseLost(loss);
    }
    match result {
        Ok(value) => WorkOutcome::Finished(value),
        Err(_) if cancelled => WorkOutcome::Cancelled,
        Err(error) => WorkOutcome::Failed(error),
    }
}
