//! What [`Keeper`](super::Keeper) and [`KeeperSet`](super::KeeperSet) share: the
//! heartbeat schedule and its checks, and small thread helpers.

use crate::error::Repr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::LeaseError;

/// A poisoned lock only means another keeper thread panicked; every update is
/// a single assignment, so the state stays consistent.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts a named keeper thread.
pub(super) fn spawn(
    name: &str,
    body: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>, LeaseError> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(body)
        .map_err(|error| LeaseError::from(Repr::Spawn(error)))
}

/// The timing of a heartbeat, checked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    /// What each beat asks for.
    pub(crate) ttl: Duration,
    /// How much earlier than `sent + ttl` the deadline lies.
    pub(crate) margin: Duration,
    /// Time between beats.
    pub(crate) renew_every: Duration,
    /// Time between retries of a failed beat.
    pub(crate) retry_every: Duration,
}

impl Schedule {
    /// Fills in the defaults (margin ttl / 10, beat ttl / 3, retry ttl / 30, at least
    /// 1 ms) and refuses a schedule under which the grant could lapse between beats.
    pub(crate) fn resolve(
        ttl: Duration,
        margin: Option<Duration>,
        renew_every: Option<Duration>,
        retry_every: Option<Duration>,
    ) -> Result<Self, LeaseError> {
        let invalid = |reason: String| {
            Err(LeaseError::from(Repr::InvalidInput {
                violations: vec![reason],
            }))
        };
        if ttl.is_zero() {
            return invalid("ttl must be positive".into());
        }
        let margin = margin.unwrap_or(ttl / 10);
        if margin >= ttl {
            return invalid(format!(
                "margin ({margin:?}) must be shorter than the ttl ({ttl:?})"
            ));
        }
        let renew_every = renew_every.unwrap_or(ttl / 3);
        if renew_every.is_zero() || renew_every >= ttl - margin {
            return invalid(format!(
                "renew_every ({renew_every:?}) must be positive and shorter than ttl - margin ({:?})",
                ttl - margin
            ));
        }
        let retry_every = retry_every
            .unwrap_or(ttl / 30)
            .max(Duration::from_millis(1));
        Ok(Self {
            ttl,
            margin,
            renew_every,
            retry_every,
        })
    }
}

/// The deadline after a renew for `ttl` sent at `sent_at`: `sent_at + ttl - margin`
/// on the monotonic clock (the server counted from later), never before `previous`
/// since renews may answer out of order. Every keeper's rule.
pub(crate) fn safe_until(
    sent_at: Instant,
    ttl: Duration,
    margin: Duration,
    previous: Instant,
) -> Instant {
    (sent_at + ttl - margin).max(previous)
}

/// How often a keeper sends a release a read-only server refused: each refusal
/// discards its connection, so within the pool's size one reaches the new primary.
pub(crate) fn release_attempts(pool_size: usize) -> usize {
    pool_size.saturating_add(1)
}
