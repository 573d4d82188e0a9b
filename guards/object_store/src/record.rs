//! The fence record carried by every object (user metadata plus a first
//! body line), how it is read back, and the admission rule (key first,
//! then epoch) applied to it.

use bytes::Bytes;
use leasehold::guard::GuardRecord;
use leasehold::Epoch;
use object_store::path::Path;
use object_store::{Attribute, Attributes};

use crate::error::FenceError;
use crate::{FencingToken, META_EPOCH, META_TOKEN, META_WRITE_ID};

/// What a HEAD/GET found at a path, before interpretation.
#[derive(Clone)]
pub(crate) struct Current {
    pub(crate) attributes: Attributes,
    pub(crate) e_tag: Option<String>,
    pub(crate) version: Option<String>,
}

/// The fence record of one object: which lease guards it and how far.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FenceState {
    /// The token that last wrote (or fenced) the object. Its epoch is the
    /// highest accepted epoch, its key the lease the object is bound to, its
    /// owner the last writer.
    pub token: FencingToken,
    /// The store's ETag of this version, if it reports one.
    pub e_tag: Option<String>,
    /// The store's version id of this version, if it reports one.
    pub version: Option<String>,
    /// The random id of the PUT that created this version (metadata
    /// [`META_WRITE_ID`](crate::META_WRITE_ID), repeated in the first body
    /// line). `None` for objects written before write ids existed.
    ///
    /// It is how the adapter recognises its own write after a lost answer,
    /// and it makes every version's bytes (hence its ETag) unique.
    pub write_id: Option<String>,
}

impl FenceState {
    /// The highest epoch the object has accepted: writes below it are refused.
    pub fn epoch(&self) -> Epoch {
        self.token.epoch()
    }

    /// The object's record as every leasehold guard reports it: the key it
    /// is fenced by and the lowest epoch it admits (its accepted epoch:
    /// equal epochs are the same grant).
    pub fn guard_record(&self) -> GuardRecord {
        GuardRecord {
            lease_key: self.token.key().to_owned(),
            accepted_epoch: self.token.epoch(),
        }
    }

    /// The lease key the object is bound to.
    pub fn key(&self) -> &str {
        self.token.key()
    }
}

/// Checks key (G5) then epoch (G2) of `token` against `state`.
pub(crate) fn admit(
    location: &Path,
    state: &FenceState,
    token: &FencingToken,
) -> Result<(), FenceError> {
    if state.key() != token.key() {
        return Err(FenceError::WrongLeaseKey {
            resource: location.to_string(),
            presented: token.key().to_owned(),
            fenced_by: state.key().to_owned(),
        });
    }
    if token.epoch() < state.epoch() {
        return Err(FenceError::StaleEpoch {
            resource: location.to_string(),
            presented: token.epoch(),
            accepted: state.epoch(),
        });
    }
    Ok(())
}

/// Interprets the metadata: `None` if there is no fence record at all.
pub(crate) fn fence_state(
    location: &Path,
    current: Current,
) -> Result<Option<FenceState>, FenceError> {
    let corrupt = |reason: String| FenceError::Corrupt {
        resource: location.to_string(),
        reason,
    };
    let epoch = current
        .attributes
        .get(&Attribute::Metadata(META_EPOCH.into()));
    let token = current
        .attributes
        .get(&Attribute::Metadata(META_TOKEN.into()));
    let write_id = current
        .attributes
        .get(&Attribute::Metadata(META_WRITE_ID.into()))
        .map(|id| id.as_ref().to_owned());
    if let Some(id) = &write_id {
        if !is_write_id(id) {
            return Err(corrupt(format!("{META_WRITE_ID} {id:?} is not a write id")));
        }
    }
    let (epoch, token) = match (epoch, token) {
        (None, None) => return Ok(None),
        (Some(epoch), Some(token)) => (epoch, token),
        _ => {
            return Err(corrupt(format!(
                "only one of {META_EPOCH} and {META_TOKEN} is present"
            )))
        }
    };
    let token: FencingToken = token
        .as_ref()
        .parse()
        .map_err(|error| corrupt(format!("{META_TOKEN}: {error}")))?;
    let epoch: i64 = epoch
        .as_ref()
        .parse()
        .map_err(|_| corrupt(format!("{META_EPOCH} is not a number")))?;
    if epoch != token.epoch() {
        return Err(corrupt(format!(
            "{META_EPOCH} {epoch} disagrees with {META_TOKEN} epoch {}",
            token.epoch()
        )));
    }
    Ok(Some(FenceState {
        token,
        e_tag: current.e_tag,
        version: current.version,
        write_id,
    }))
}

/// A fresh write id: 128 random bits as 32 lowercase hex digits.
pub(crate) fn new_write_id() -> String {
    format!(
        "{:016x}{:016x}",
        crate::store::random_u64(),
        crate::store::random_u64()
    )
}

/// What [`new_write_id`] produces (and nothing that could break the
/// header line: no spaces, no line breaks).
fn is_write_id(text: &str) -> bool {
    !text.is_empty() && text.len() <= 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The first body line of a version written by `token` with `write_id`;
/// token text never contains a space (its fields are percent-encoded), so
/// the space separates the two unambiguously.
pub(crate) fn header_line(token: &FencingToken, write_id: Option<&str>) -> String {
    match write_id {
        Some(id) => format!("{token} {id}\n"),
        None => format!("{token}\n"),
    }
}

/// Splits off and verifies the header line written by `put_raw`.
pub(crate) fn strip_header(
    location: &Path,
    state: &FenceState,
    body: Bytes,
) -> Result<Bytes, FenceError> {
    let expected = header_line(&state.token, state.write_id.as_deref());
    if body.starts_with(expected.as_bytes()) {
        Ok(body.slice(expected.len()..))
    } else {
        Err(FenceError::Corrupt {
            resource: location.to_string(),
            reason: format!(
                "the body does not start with the header line {:?} matching its metadata",
                expected.trim_end()
            ),
        })
    }
}
