//! The fence record carried by every object (user metadata plus a first
//! body line), how it is read back, and the admission rule (key first,
//! then epoch) applied to it.

use bytes::Bytes;
use object_store::path::Path;
use object_store::{Attribute, Attributes};

use crate::error::FenceError;
use crate::{FencingToken, META_EPOCH, META_TOKEN};

/// What a HEAD/GET found at a path, before interpretation.
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
}

impl FenceState {
    /// The highest epoch the object has accepted: writes below it are refused.
    pub fn epoch(&self) -> i64 {
        self.token.epoch()
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
    }))
}

/// Splits off and verifies the header line written by `put_raw`.
pub(crate) fn strip_header(
    location: &Path,
    state: &FenceState,
    body: Bytes,
) -> Result<Bytes, FenceError> {
    let expected = format!("{}\n", state.token);
    if body.starts_with(expected.as_bytes()) {
        Ok(body.slice(expected.len()..))
    } else {
        Err(FenceError::Corrupt {
            resource: location.to_string(),
            reason: format!(
                "the body does not start with the header line {:?} matching its metadata",
                state.token.to_string()
            ),
        })
    }
}
