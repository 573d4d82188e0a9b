//! Lost answers: what a call remembers about its conditional PUTs whose
//! answer never arrived, and how a re-read of the object settles them.
//!
//! A conditional PUT can be applied by the store and its answer lost on the
//! way back (dropped connection, timeout, a 5xx from a proxy or from S3
//! after the commit). Re-sending it blindly turns that success into a 412,
//! which reads as "someone else wrote": the caller would be told its write
//! did not happen when it did. So a lost answer is settled by reading the
//! object again:
//!
//! * it carries the write id of one of our PUTs: that PUT landed;
//! * it is still exactly the version the PUTs were conditioned on: none has
//!   landed *yet*. A re-send is safe, because every PUT of this call is
//!   conditioned on that same version and the store applies at most one
//!   of them (if an earlier one is merely late, the re-send gets 412 and
//!   the next re-read finds the late one's write id);
//! * anything else: another write replaced that version, and ours may have
//!   landed before it or not at all. Nothing visible can tell these apart
//!   (the epochs cannot: ours may have landed before a higher epoch), so
//!   the answer is [`FenceError::OutcomeUnknown`], never `StaleEpoch`.

use object_store::path::Path;

use crate::error::FenceError;
use crate::record::{fence_state, Current, FenceState};
use crate::META_WRITE_ID;

/// One version of an object, as precisely as the store lets us name it.
/// The write id is part of it because an ETag alone can repeat (S3 hashes
/// the body, and objects written around the guard may repeat bodies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VersionStamp {
    e_tag: Option<String>,
    version: Option<String>,
    write_id: Option<String>,
}

impl VersionStamp {
    pub(crate) fn of(current: &Current) -> Self {
        Self {
            e_tag: current.e_tag.clone(),
            version: current.version.clone(),
            write_id: current
                .attributes
                .get(&object_store::Attribute::Metadata(META_WRITE_ID.into()))
                .map(|id| id.as_ref().to_owned()),
        }
    }
}

/// The PUTs of one call whose answers were lost. All of them were
/// conditioned on the same version: a re-send only follows a re-read that
/// found that version unchanged.
pub(crate) struct Unresolved {
    write_ids: Vec<String>,
    /// `None`: the PUTs were creates (`If-None-Match: *`).
    conditioned_on: Option<VersionStamp>,
    /// The fence record of the version the PUTs would replace, for the
    /// receipt if one of them landed.
    replaced: Option<FenceState>,
    /// The error of the first lost answer.
    source: object_store::Error,
}

/// What a re-read says about the lost PUTs.
pub(crate) enum Verdict {
    /// One of them is the current version.
    Landed(FenceState),
    /// The object is still at the version they were conditioned on.
    NotYet,
    /// Another write replaced that version; ours may or may not have
    /// landed before it. The text says what was found.
    Unknowable(String),
}

impl Unresolved {
    pub(crate) fn new(
        write_id: String,
        conditioned_on: Option<VersionStamp>,
        replaced: Option<FenceState>,
        source: object_store::Error,
    ) -> Self {
        Self {
            write_ids: vec![write_id],
            conditioned_on,
            replaced,
            source,
        }
    }

    /// Records a re-send (conditioned on the same version).
    pub(crate) fn resent(&mut self, write_id: String) {
        self.write_ids.push(write_id);
    }

    /// How many re-sends were made after the first lost answer.
    pub(crate) fn resends(&self) -> u32 {
        u32::try_from(self.write_ids.len().saturating_sub(1)).unwrap_or(u32::MAX)
    }

    /// The fence record a landed PUT replaced.
    pub(crate) fn replaced(&self) -> Option<FenceState> {
        self.replaced.clone()
    }

    /// Settles the lost PUTs against what a re-read found.
    pub(crate) fn judge(&self, location: &Path, found: Option<&Current>) -> Verdict {
        let Some(current) = found else {
            return match self.conditioned_on {
                None => Verdict::NotYet,
                Some(_) => Verdict::Unknowable("the object has been deleted since".into()),
            };
        };
        if let Ok(Some(state)) = fence_state(location, current.clone()) {
            if let Some(id) = &state.write_id {
                if self.write_ids.contains(id) {
                    return Verdict::Landed(state);
                }
            }
        }
        match &self.conditioned_on {
            Some(stamp) if *stamp == VersionStamp::of(current) => Verdict::NotYet,
            Some(_) => Verdict::Unknowable(
                "another write has replaced the version it was conditioned on".into(),
            ),
            None => Verdict::Unknowable("another write has created the object".into()),
        }
    }

    /// The error for the caller: the write may or may not have landed.
    pub(crate) fn into_error(self, location: &Path, attempts: u32, reason: String) -> FenceError {
        FenceError::OutcomeUnknown {
            resource: location.to_string(),
            reason,
            attempts,
            write_ids: self.write_ids,
            source: Box::new(self.source),
        }
    }
}
