//! What the lease operations return: grants, refusals and observed
//! states, as values. Ordinary outcomes are values, not errors: a key held
//! by someone else is [`Acquisition::Denied`]; a renew or release that
//! finds the lease gone is [`Refusal`].
//!
//! These enums are closed on purpose (no `#[non_exhaustive]`): they mirror
//! the SQL functions' fixed set of answers, and a caller must handle each
//! one; a new answer would be a breaking change of the SQL API too.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::lease::epoch::Epoch;
pub use crate::lease::refusal::Refusal;
use crate::lease::token::FencingToken;

/// A grant: exclusive ownership of `key` by `owner` until `expires_at`
/// (server time), fenced by `epoch`.
///
/// Two `Lease` values are equal when they are the same grant: same key,
/// owner, epoch and expiry. The ttl is this handle's renewal setting, not
/// part of the grant (an idempotent re-acquire with another ttl returns the
/// same grant), so it is left out of the comparison.
#[derive(Debug, Clone)]
pub struct Lease {
    /// The grant's key, owner and epoch.
    pub(crate) token: FencingToken,
    pub(crate) expires_at: DateTime<Utc>,
    pub(crate) ttl: Duration,
}

impl Lease {
    /// The leased key.
    pub fn key(&self) -> &str {
        self.token.key()
    }

    /// The owner the grant was made to.
    pub fn owner(&self) -> &str {
        self.token.owner()
    }

    /// The grant's fencing epoch: present it to guards with every write.
    pub fn epoch(&self) -> Epoch {
        self.token.epoch()
    }

    /// When the grant lapses unless renewed, on the server's clock.
    pub fn expires_at(&self) -> DateTime<Utc> {
        self.expires_at
    }

    /// The ttl passed to the acquire that returned this handle: what
    /// [`Lease::renew`] and a [`crate::Keeper`] renew the grant for.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The fencing token of this grant, for other services (clone it to
    /// keep it). Calls on the grant take the lease itself.
    pub fn token(&self) -> &FencingToken {
        &self.token
    }
}

/// A lease is a grant: every call that acts on a grant takes
/// `&impl AsRef<FencingToken>`, so it takes a `&Lease` as it takes a token.
impl AsRef<FencingToken> for Lease {
    fn as_ref(&self) -> &FencingToken {
        &self.token
    }
}

impl PartialEq for Lease {
    fn eq(&self, other: &Self) -> bool {
        (&self.token, self.expires_at) == (&other.token, other.expires_at)
    }
}

impl Eq for Lease {}

/// Outcome of [`crate::Leases::acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a denied acquire does not grant the lease"]
pub enum Acquisition {
    /// The caller holds the lease. For a caller that already held it, this is
    /// the same grant (same epoch, same expiry).
    Granted(Lease),
    /// Another owner holds a live grant.
    Denied,
}

impl Acquisition {
    /// The lease, if granted.
    pub fn granted(self) -> Option<Lease> {
        match self {
            Acquisition::Granted(lease) => Some(lease),
            Acquisition::Denied => None,
        }
    }
}

/// Outcome of [`crate::Leases::renew`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a refused renewal must stop the holder"]
pub enum Renewal {
    /// Extended; the epoch is unchanged.
    Renewed {
        /// The new expiry, server time.
        expires_at: DateTime<Utc>,
    },
    /// Not extended, and nothing changed.
    Refused(Refusal),
}

/// Outcome of [`crate::Leases::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a refused release did nothing"]
pub enum Release {
    /// The key is free and its fencing counter moved past the released epoch.
    Released,
    /// Nothing changed.
    Refused(Refusal),
}

/// One key's answer to [`crate::Leases::renew_many`]: what [`crate::Leases::renew`] would
/// have answered for that key alone.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a refused renewal must stop the holder of that key"]
pub struct KeyRenewal {
    /// The key, as passed.
    pub key: String,
    /// Renewed with its new expiry, or refused with the reason.
    pub renewal: Renewal,
}

/// One key's answer to [`crate::Leases::release_many`]: what [`crate::Leases::release`]
/// would have answered for that key alone.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a refused release did nothing for that key"]
pub struct KeyRelease {
    /// The key, as passed.
    pub key: String,
    /// Released, or refused with the reason.
    pub release: Release,
}

/// A key's observable state, as [`crate::Leases::inspect`] reports it, in
/// the words `leasehold inspect` and `leasehold ls` print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// A live grant.
    Held {
        /// The holder.
        owner: String,
        /// The grant's epoch.
        epoch: Epoch,
        /// Server-time expiry (its heartbeat group's, when that is later).
        expires_at: DateTime<Utc>,
    },
    /// A grant whose ttl passed without a renewal: anyone may acquire the
    /// key, and its holder's renew answers `lapsed`. Until someone does,
    /// `epoch` is still the key's newest grant: fence resources through it
    /// to refuse the lapsed holder's writes.
    Lapsed {
        /// The lapsed grant's holder.
        owner: String,
        /// The lapsed grant's epoch.
        epoch: Epoch,
        /// When it expired, server time.
        expired_at: DateTime<Utc>,
    },
    /// No grant: its last holder released it, or an operator did. Anyone
    /// may acquire it.
    Free {
        /// The fencing counter: every epoch up to and including this one is
        /// stale, and the next grant is strictly greater.
        epoch: Epoch,
        /// Whether the last grant was ended by an operator
        /// (`force_release`) rather than by its holder.
        force_released: bool,
    },
}

impl LeaseState {
    /// The epoch reported: the grant's, held or lapsed, or the counter when
    /// free.
    pub fn epoch(&self) -> Epoch {
        match self {
            LeaseState::Held { epoch, .. }
            | LeaseState::Lapsed { epoch, .. }
            | LeaseState::Free { epoch, .. } => *epoch,
        }
    }

    /// The state's word: `held`, `lapsed` or `free`, as `leasehold ls`
    /// and SQL's `lease.key_state` spell it.
    pub fn as_str(&self) -> &'static str {
        match self {
            LeaseState::Held { .. } => "held",
            LeaseState::Lapsed { .. } => "lapsed",
            LeaseState::Free { .. } => "free",
        }
    }

    /// Whether a live grant exists.
    pub fn is_held(&self) -> bool {
        matches!(self, LeaseState::Held { .. })
    }
}
