//! Fencing tokens: the proof of a grant (key, owner, epoch) a holder presents to a
//! guard. Tokens travel in headers and metadata, so the text form `lh1.<epoch>.<key>.<owner>`
//! percent-encodes the names; `lh1` versions it, so parsers reject unknown forms.

use crate::error::Repr;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::error::LeaseError;

use crate::field_text::{decode as percent_decode, encode as percent_encode};
use crate::lease::epoch::Epoch;

/// The version prefix of the current text form.
const TEXT_FORM_PREFIX: &str = "lh1";

/// Proof of one grant, from `Lease::token`; cheap to clone (shared strings).
///
/// ```
/// use leasehold::{Epoch, FencingToken};
/// let token = FencingToken::new("job-42", "worker-a1", Epoch::new(7)).unwrap();
/// let text = token.to_string();
/// assert_eq!(text, "lh1.7.job-42.worker-a1");
/// assert_eq!(text.parse::<FencingToken>().unwrap(), token);
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct FencingToken {
    key: Arc<str>,
    owner: Arc<str>,
    epoch: Epoch,
}

/// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the rule a token broke.
fn invalid(rule: String) -> LeaseError {
    LeaseError::from(Repr::InvalidInput {
        violations: vec![rule],
    })
}

impl FencingToken {
    /// Builds a token from its parts (e.g. from another service); rejects empty names, epochs below 1.
    pub fn new(key: &str, owner: &str, epoch: Epoch) -> Result<Self, LeaseError> {
        if key.is_empty() {
            return Err(invalid("fencing token key must not be empty".to_owned()));
        }
        if owner.is_empty() {
            return Err(invalid("fencing token owner must not be empty".to_owned()));
        }
        if epoch < 1 {
            return Err(invalid(format!(
                "fencing token epoch must be at least 1 (got {epoch})"
            )));
        }
        Ok(Self {
            key: Arc::from(key),
            owner: Arc::from(owner),
            epoch,
        })
    }

    /// A database grant's token: the SQL's rules make its parts valid.
    pub(crate) fn from_grant(key: &str, owner: &str, epoch: i64) -> Self {
        Self {
            key: Arc::from(key),
            owner: Arc::from(owner),
            epoch: Epoch::new(epoch),
        }
    }

    /// The lease key this token was granted for.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The owner the grant was made to.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The fencing epoch of the grant.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }
}

/// A token is the grant it proves, so calls take a `Lease` or a token alike.
impl AsRef<FencingToken> for FencingToken {
    fn as_ref(&self) -> &FencingToken {
        self
    }
}

impl fmt::Debug for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencingToken")
            .field("key", &&*self.key)
            .field("owner", &&*self.owner)
            .field("epoch", &self.epoch)
            .finish()
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{TEXT_FORM_PREFIX}.{}.{}.{}",
            self.epoch,
            percent_encode(&self.key),
            percent_encode(&self.owner)
        )
    }
}

impl FromStr for FencingToken {
    type Err = LeaseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let malformed = |reason: &str| invalid(format!("malformed fencing token text: {reason}"));
        let mut parts = text.split('.');
        let (Some(prefix), Some(epoch), Some(key), Some(owner), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(malformed("expected exactly four dot-separated fields"));
        };
        if prefix != TEXT_FORM_PREFIX {
            return Err(malformed("unknown version prefix"));
        }
        if epoch.is_empty() || !epoch.bytes().all(|b| b.is_ascii_digit()) {
            return Err(malformed("epoch is not a decimal number"));
        }
        let epoch: Epoch = epoch
            .parse()
            .map_err(|_| malformed("epoch does not fit in 64 bits"))?;
        let key = percent_decode(key).ok_or_else(|| malformed("bad percent-encoding in key"))?;
        let owner =
            percent_decode(owner).ok_or_else(|| malformed("bad percent-encoding in owner"))?;
        FencingToken::new(&key, &owner, epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn text_form_round_trips_awkward_names() {
        let token =
            FencingToken::new("job.42/ä 'x'", "owner%1.\"q\"", Epoch::new(i64::MAX)).unwrap();
        let text = token.to_string();
        assert!(text.is_ascii());
        assert_eq!(text.matches('.').count(), 3);
        assert_eq!(text.parse::<FencingToken>().unwrap(), token);
    }

    #[test]
    fn parse_rejects_malformed_text() {
        for bad in [
            "",
            "lh1.1.k",
            "lh2.1.k.o",
            "lh1.x.k.o",
            "lh1.-1.k.o",
            "lh1.1.k.o.extra",
            "lh1.1.k%zz.o",
            "lh1.1.k o.o",
            "lh1.99999999999999999999.k.o",
        ] {
            assert!(bad.parse::<FencingToken>().is_err(), "{bad:?} parsed");
        }
        let refused = |text: &str| match text.parse::<FencingToken>() {
            Err(error) if error.kind() == ErrorKind::InvalidInput => error.violations().join("; "),
            other => panic!("{text:?}: expected InvalidInput, got {other:?}"),
        };
        assert_eq!(
            refused("lh1.0.k.o"),
            "fencing token epoch must be at least 1 (got 0)"
        );
        assert_eq!(refused("lh1.1..o"), "fencing token key must not be empty");
    }

    #[test]
    fn new_rejects_empty_names_and_non_positive_epochs() {
        assert!(FencingToken::new("", "o", Epoch::new(1)).is_err());
        assert!(FencingToken::new("k", "", Epoch::new(1)).is_err());
        assert!(FencingToken::new("k", "o", Epoch::new(0)).is_err());
        assert!(FencingToken::new("k", "o", Epoch::new(1)).is_ok());
    }
}
