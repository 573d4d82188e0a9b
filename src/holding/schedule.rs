//! What a [`Keeper`](super::Keeper) and a [`KeeperSet`](super::KeeperSet)
//! share: the heartbeat schedule (its defaults and the rules that keep a
//! grant from lapsing between beats), and the small thread helpers of both.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::errors::KeeperError;

/// A poisoned lock only means another keeper thread panicked; the state it
/// guards stays consistent (every update is a single assignment).
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts a named keeper thread.
pub(super) fn spawn(
    name: &str,
    body: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>, KeeperError> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(body)
        .map_err(KeeperError::Spawn)
}

/// The timing of a heartbeat, checked.
#[derive(Debug, Clone, Copy)]
pub(super) struct Schedule {
    /// What each beat asks for.
    pub(super) ttl: Duration,
    /// How much earlier than `sent + ttl` the deadline lies.
    pub(super) margin: Duration,
    /// Time between beats.
    pub(super) renew_every: Duration,
    /// Time between retries of a failed beat.
    pub(super) retry_every: Duration,
}

impl Schedule {
    /// Fills in the defaults (margin ttl / 10, a beat every ttl / 3, a
    /// retry every ttl / 30 but at least 1 ms) and refuses a schedule under
    /// which the grant could lapse between beats.
    pub(super) fn resolve(
        ttl: Duration,
        margin: Option<Duration>,
        renew_every: Option<Duration>,
        retry_every: Option<Duration>,
    ) -> Result<Self, KeeperError> {
        let invalid = |reason: String| Err(KeeperError::InvalidConfig { reason });
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
