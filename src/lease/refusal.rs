//! Why a presented grant was refused, in a leaf file that imports no answer or error type.

use crate::lease::epoch::Epoch;
use crate::sql::decode::Status;

/// Why a renew, release or lease-checked write was refused: stop acting on the
/// lease. [`as_status`](Self::as_status) is the SQL status, [`as_reason`](Self::as_reason)
/// the word the CLI and `lease.why_refused` use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The grant's ttl passed without a renewal (`lapsed`).
    Lapsed {
        /// The successor's epoch, once the key was granted again.
        taken_over_by: Option<Epoch>,
    },
    /// The owner holds the key, under another epoch (`epoch_mismatch`).
    EpochMismatch {
        /// The epoch the owner holds, when it could be read.
        held: Option<Epoch>,
    },
    /// A later grant of the key exists (`not_owner`): this one ended and the key was granted again.
    Superseded {
        /// The key's newest grant.
        by: Epoch,
    },
    /// Its holder released this grant; the key is still free (`not_owner`).
    Released,
    /// An operator force-released this grant; the key is still free (`not_owner`).
    ForceReleased,
    /// No grant at or after this epoch for this owner (`not_owner`): unknown, never
    /// granted, another owner's, or pruned.
    NeverHeld,
}

impl Refusal {
    /// The SQL status: `not_owner`, `lapsed` or `epoch_mismatch`.
    pub fn as_status(self) -> &'static str {
        match self {
            Refusal::Lapsed { .. } => "lapsed",
            Refusal::EpochMismatch { .. } => "epoch_mismatch",
            Refusal::Superseded { .. }
            | Refusal::Released
            | Refusal::ForceReleased
            | Refusal::NeverHeld => "not_owner",
        }
    }

    /// What happened, in one word, as the CLI prints it.
    pub fn as_reason(self) -> &'static str {
        match self {
            Refusal::Lapsed { .. } => "lapsed",
            Refusal::EpochMismatch { .. } => "epoch_mismatch",
            Refusal::Superseded { .. } => "superseded",
            Refusal::Released => "released",
            Refusal::ForceReleased => "force_released",
            Refusal::NeverHeld => "never_held",
        }
    }

    /// The key's newest grant above the caller's, if the refusal knows one.
    pub fn newer_epoch(self) -> Option<Epoch> {
        match self {
            Refusal::Superseded { by } => Some(by),
            Refusal::Lapsed { taken_over_by } => taken_over_by,
            Refusal::EpochMismatch { held } => held,
            Refusal::Released | Refusal::ForceReleased | Refusal::NeverHeld => None,
        }
    }

    /// The refusal a SQL status and `lease._refusal`'s reason name; `None` for `ok` or
    /// an unknown word. A reason of another status is ignored; `presented` is the caller's epoch.
    pub(crate) fn from_answer(
        status: Status,
        reason: Option<&str>,
        newest: Option<i64>,
        presented: i64,
    ) -> Option<Self> {
        let newer = newest.filter(|&newest| newest > presented).map(Epoch::new);
        Some(match (status, reason) {
            (Status::Ok, _) => return None,
            (Status::Lapsed, _) => Refusal::Lapsed {
                taken_over_by: newer,
            },
            (Status::EpochMismatch, _) => Refusal::EpochMismatch {
                held: newest.map(Epoch::new),
            },
            (Status::NotOwner, Some("released")) => Refusal::Released,
            (Status::NotOwner, Some("force_released")) => Refusal::ForceReleased,
            (Status::NotOwner, _) => match newer {
                Some(by) => Refusal::Superseded { by },
                None => Refusal::NeverHeld,
            },
        })
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Lapsed {
                taken_over_by: Some(by),
            } => write!(f, "lapsed, and taken over at epoch {by}"),
            Refusal::Lapsed {
                taken_over_by: None,
            } => f.write_str("lapsed: the ttl passed without a renewal"),
            Refusal::EpochMismatch { held: Some(held) } => {
                write!(f, "epoch_mismatch: the owner holds the key at epoch {held}")
            }
            Refusal::EpochMismatch { held: None } => {
                f.write_str("epoch_mismatch: the owner holds the key at another epoch")
            }
            Refusal::Superseded { by } => write!(f, "superseded by epoch {by}"),
            Refusal::Released => f.write_str("released by its holder"),
            Refusal::ForceReleased => f.write_str("force_released by an operator"),
            Refusal::NeverHeld => {
                f.write_str("never_held: this owner holds no grant at this epoch")
            }
        }
    }
}
