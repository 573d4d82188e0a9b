//! Why a presented grant was refused, in a leaf file that imports no answer or error type.

use crate::lease::epoch::Epoch;
use crate::sql::decode::Status;

/// Why a holder or a writer was refused: stop acting on the lease.
///
/// A renew or release refuses with one of the first six, which say what
/// happened to the grant; a guard (`LeaseError::refusal`)
/// or a fenced table may also refuse with the others, which say what the
/// resource holds against the presented token.
/// [`as_status`](Self::as_status) is the SQL status, [`as_reason`](Self::as_reason)
/// the word the CLI and `lease.why_refused` use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
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
    /// A guarded resource already admitted a later epoch: a newer holder wrote.
    StaleEpoch {
        /// The lowest epoch the resource admits.
        accepted: Epoch,
    },
    /// Another key's epochs fence the resource (`LeaseError::fenced_by` names it).
    WrongKey,
    /// The presented epoch was never granted for the key, so it fences nothing.
    EpochNotGranted {
        /// The key's counter: the highest epoch it has granted or passed.
        counter: Epoch,
    },
    /// A fenced table's writer presented no token of the key in its transaction.
    NoToken,
    /// A written row of a row-fenced table has a NULL key column.
    NullKey,
    /// TRUNCATE of a row-fenced table, which would remove every key's rows.
    Truncate,
}

impl Refusal {
    /// The SQL status: `not_owner`, `lapsed` or `epoch_mismatch`; a guard's
    /// or table's own refusal has no status and answers its reason word.
    pub fn as_status(self) -> &'static str {
        match self {
            Refusal::Lapsed { .. } => "lapsed",
            Refusal::EpochMismatch { .. } => "epoch_mismatch",
            Refusal::Superseded { .. }
            | Refusal::Released
            | Refusal::ForceReleased
            | Refusal::NeverHeld => "not_owner",
            other => other.as_reason(),
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
            Refusal::StaleEpoch { .. } => "stale_epoch",
            Refusal::WrongKey => "wrong_lease_key",
            Refusal::EpochNotGranted { .. } => "epoch_not_granted",
            Refusal::NoToken => "no_token",
            Refusal::NullKey => "null_key",
            Refusal::Truncate => "truncate",
        }
    }

    /// The key's newest grant above the caller's, if the refusal knows one.
    pub fn newer_epoch(self) -> Option<Epoch> {
        match self {
            Refusal::Superseded { by } => Some(by),
            Refusal::Lapsed { taken_over_by } => taken_over_by,
            Refusal::EpochMismatch { held } => held,
            _ => None,
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
            Refusal::StaleEpoch { accepted } => {
                write!(
                    f,
                    "stale_epoch: the resource accepts only epochs >= {accepted}"
                )
            }
            Refusal::WrongKey => f.write_str("wrong_lease_key: another key fences the resource"),
            Refusal::EpochNotGranted { counter } => {
                write!(f, "epoch_not_granted: the key's counter is {counter}")
            }
            Refusal::NoToken => f.write_str("no_token: no token of the key was presented"),
            Refusal::NullKey => f.write_str("null_key: a written row has a NULL key column"),
            Refusal::Truncate => f.write_str("truncate: it would remove every key's rows"),
        }
    }
}
