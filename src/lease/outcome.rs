//! What the lease operations return. Ordinary outcomes (a denial, a refusal) are
//! values, not errors. The enums are closed on purpose: they mirror the SQL's fixed
//! answers, so a new one would break the SQL API too.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::lease::epoch::Epoch;
pub use crate::lease::refusal::Refusal;
use crate::lease::token::FencingToken;

/// A grant of `key` to `owner` until `expires_at` (server time), fenced by `epoch`.
/// Equality ignores the ttl: it is this handle's renewal setting, not the grant.
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

    /// The acquire's ttl: what [`Lease::renew`] and a `Keeper` renew for.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The grant's fencing token, for other services; calls on the grant take the lease.
    pub fn token(&self) -> &FencingToken {
        &self.token
    }
}

/// Every call on a grant takes `&impl AsRef<FencingToken>`, so a `&Lease` too.
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

/// Outcome of `Leases::acquire`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a denied acquire does not grant the lease"]
pub enum Acquisition {
    /// The caller holds the lease (the same grant, if it already held it).
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

/// Outcome of `Leases::renew`.
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

/// Outcome of `Leases::release`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a refused release did nothing"]
pub enum Release {
    /// The key is free and its fencing counter moved past the released epoch.
    Released,
    /// Nothing changed.
    Refused(Refusal),
}

/// One key's answer to `Leases::renew_many`, as `Leases::renew` would give.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a refused renewal must stop the holder of that key"]
pub struct KeyRenewal {
    /// The key, as passed.
    pub key: String,
    /// Renewed with its new expiry, or refused with the reason.
    pub renewal: Renewal,
}

/// One key's answer to `Leases::release_many`, as `Leases::release` would give.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a refused release did nothing for that key"]
pub struct KeyRelease {
    /// The key, as passed.
    pub key: String,
    /// Released, or refused with the reason.
    pub release: Release,
}

/// A key's state, as `Leases::inspect` reports it.
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
    /// The ttl passed without a renewal: anyone may acquire the key. Until then
    /// `epoch` is its newest grant: fence through it to refuse the lapsed holder.
    Lapsed {
        /// The lapsed grant's holder.
        owner: String,
        /// The lapsed grant's epoch.
        epoch: Epoch,
        /// When it expired, server time.
        expired_at: DateTime<Utc>,
    },
    /// No grant: released by its holder or an operator.
    Free {
        /// The fencing counter: every epoch up to it is stale.
        epoch: Epoch,
        /// Whether an operator ended the last grant (`force_release`).
        force_released: bool,
    },
}

impl LeaseState {
    /// The grant's epoch, or the counter when free.
    pub fn epoch(&self) -> Epoch {
        match self {
            LeaseState::Held { epoch, .. }
            | LeaseState::Lapsed { epoch, .. }
            | LeaseState::Free { epoch, .. } => *epoch,
        }
    }

    /// `held`, `lapsed` or `free`, as `leasehold ls` and `lease.key_state` spell it.
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
