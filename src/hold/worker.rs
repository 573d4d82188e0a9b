//! Running work while a lease is held, and knowing why it ended.
//!
//! A lease protects work only if the work stops when the lease goes. The
//! database fences writes that pass through guards; everything else (an
//! in-memory batch, a call to a third party) must stop by itself.
//! [`run_while_held`] runs a closure with a [`WorkContext`] that says, with
//! one cheap call, whether to stop now (lease lost, deadline passed, or
//! cancelled), hands out the fencing token for guards, and afterwards
//! releases the lease and reports why the work ended.
//!
//! ```no_run
//! # fn demo(keeper: leasehold::Keeper) {
//! use leasehold::{hold::{run_while_held, CancelToken, WorkOutcome}};
//! let cancel = CancelToken::new();
//! let outcome = run_while_held(keeper, &cancel, |ctx| {
//!     for step in 0..100 {
//!         if ctx.should_stop() {
//!             return Err(format!("stopped after {step} steps")); // the outcome says why
//!         }
//!         // ... one step, writing through guards with ctx.token() ...
//!     }
//!     Ok(100)
//! });
//! match outcome {
//!     WorkOutcome::Finished(steps) => println!("done: {steps}"),
//!     WorkOutcome::LeaseLost(why) => println!("lost the lease: {why}"),
//!     WorkOutcome::Cancelled => println!("cancelled"),
//!     WorkOutcome::Failed(error) => println!("failed: {error}"),
//! }
//! # }
//! ```

use std::time::Instant;

use super::cancel::CancelToken;
use super::keeper::{Keeper, LeaseLoss};
use crate::lease::token::FencingToken;

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

    /// Whether to stop now: the lease is no longer safe or the work was
    /// cancelled. Two atomic loads and a clock read: call it often.
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

    /// `Err(reason)` when the work should stop; for `?` with an error type
    /// that converts from [`StopReason`].
    pub fn check(&self) -> Result<(), StopReason> {
        self.stop_reason().map_or(Ok(()), Err)
    }
}

/// The loss that ends work now, if the lease is no longer safe: the one
/// rule both faces' work contexts and `run_while_held` apply. `loss` is
/// what the keeper reports; a deadline that passed before the keeper said
/// so is `DeadlinePassed`.
pub(crate) fn lost_now(valid: bool, loss: impl FnOnce() -> Option<LeaseLoss>) -> Option<LeaseLoss> {
    (!valid).then(|| or_deadline(loss()))
}

/// The loss of a lease that is no longer safe: the keeper's, or, before
/// it said so, the safe deadline that passed.
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
    /// The closure returned `Ok` while the lease was still safe (also when
    /// cancelled meanwhile: the closure chose to finish).
    Finished(T),
    /// The lease was lost before the closure returned (whatever it
    /// returned: its results were produced without a safe lease).
    LeaseLost(LeaseLoss),
    /// The token was cancelled and the closure returned `Err` (typically
    /// after seeing [`WorkContext::should_stop`]).
    Cancelled,
    /// The closure failed while the lease was safe and not cancelled.
    Failed(E),
}

/// Runs `work` under `keeper`'s lease; releases the lease afterwards (a
/// failing release is ignored: the lease then lapses at its expiry).
///
/// The outcome is decided when the closure returns: lease not safe any more
/// → [`WorkOutcome::LeaseLost`]; else `Ok` → [`WorkOutcome::Finished`]
/// (even if cancelled meanwhile: the work completed); else cancelled →
/// [`WorkOutcome::Cancelled`]; else [`WorkOutcome::Failed`].
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

/// The outcome of work that returned `result`: the one rule both faces'
/// `run_while_held` apply (`lost` from [`lost_now`]).
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
