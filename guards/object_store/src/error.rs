//! The adapter's one error type and the constructors its modules share.

use leasehold::Epoch;
use object_store::path::Path;

use crate::{META_EPOCH, META_TOKEN};

/// Why a fenced operation was refused or failed.
///
/// The first three variants are the guard doing its job; the rest are
/// configuration or infrastructure problems.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// The token's epoch is below the one the object already accepted: the
    /// lease was taken over. The object was not modified by this call.
    ///
    /// Only answered when that is certain: after a conditional PUT whose
    /// answer was lost the adapter answers [`FenceError::OutcomeUnknown`]
    /// instead, even if the object now carries a higher epoch.
    #[error("stale epoch {presented} for {resource}: it accepts only epochs >= {accepted}")]
    StaleEpoch {
        /// The object path.
        resource: String,
        /// The epoch of the refused token.
        presented: Epoch,
        /// The highest epoch the object has accepted.
        accepted: Epoch,
    },
    /// The token belongs to a different lease than the one the object is
    /// fenced by. This is a programming or configuration error.
    #[error("{resource} is fenced by lease key {fenced_by:?}, not {presented:?}")]
    WrongLeaseKey {
        /// The object path.
        resource: String,
        /// The lease key of the refused token.
        presented: String,
        /// The lease key recorded on the object.
        fenced_by: String,
    },
    /// Every compare-and-swap attempt lost a race with another writer
    /// (each attempt was refused by the store's precondition, so none of
    /// them was applied).
    #[error("gave up on {resource} after {attempts} compare-and-swap attempts lost races")]
    Contended {
        /// The object path.
        resource: String,
        /// How many attempts were made.
        attempts: u32,
    },
    /// A conditional PUT was sent, but its answer was lost (connection
    /// dropped, timeout, a 5xx from the store or a proxy), and re-reading
    /// the object could not settle whether it was applied: another write
    /// replaced the version it was conditioned on, or the re-read failed,
    /// or the retries the adapter allows itself ran out.
    ///
    /// The write **may or may not have landed**; it must not be taken as
    /// refused. Read the object ([`FencedStore::read`](crate::FencedStore::read))
    /// and decide from what is there: if its
    /// [`FenceState::write_id`](crate::FenceState::write_id) is one of
    /// `write_ids`, this call's write is the current version. A different
    /// id does not prove the write was never applied (it may have been
    /// overwritten since).
    #[error("the outcome of a conditional write to {resource} is unknown: {reason}")]
    OutcomeUnknown {
        /// The object path.
        resource: String,
        /// What the re-read found (or why there was none).
        reason: String,
        /// Conditional PUTs sent by this call.
        attempts: u32,
        /// The write ids of the PUTs whose answer was lost (each PUT carries
        /// a fresh random id in its metadata and first line).
        write_ids: Vec<String>,
        /// The store's error for the first PUT whose answer was lost
        /// (boxed to keep `FenceError` small).
        #[source]
        source: Box<object_store::Error>,
    },
    /// The token's text form is too long for the store's metadata limit
    /// (S3: 2 KB of user metadata per object, see
    /// [`S3_MAX_TOKEN_TEXT`](crate::S3_MAX_TOKEN_TEXT)). Refused before any
    /// request was sent.
    #[error(
        "the token for {resource} is {token_len} bytes in text form; this store takes at most {max} (shorten the lease key or owner)"
    )]
    TokenTooLong {
        /// The object path.
        resource: String,
        /// Length of the token's text form (percent-encoded key and owner).
        token_len: usize,
        /// The longest text form this store accepts.
        max: usize,
    },
    /// A fence that cannot be expressed as a token: an empty key, or an
    /// epoch with nothing above it. Nothing was changed.
    #[error("cannot fence {resource}: {reason}")]
    InvalidFence {
        /// The object path.
        resource: String,
        /// What is wrong with the fence.
        reason: String,
    },
    /// The object exists but carries no leasehold metadata: it was written
    /// around the guard.
    #[error(
        "{resource} was not written through leasehold (no {META_EPOCH}/{META_TOKEN} metadata)"
    )]
    NotFenced {
        /// The object path.
        resource: String,
    },
    /// The object's leasehold metadata or header line is unreadable or
    /// inconsistent.
    #[error("fence record of {resource} is corrupt: {reason}")]
    Corrupt {
        /// The object path.
        resource: String,
        /// What exactly is wrong.
        reason: String,
    },
    /// The object does not exist.
    #[error("{resource} does not exist")]
    NotFound {
        /// The object path.
        resource: String,
    },
    /// The store cannot enforce fencing (found by the construction probe or
    /// at run time).
    /// Use a store with conditional PUT (If-Match / If-None-Match) and user
    /// metadata, e.g. S3 with `S3ConditionalPut::ETagMatch`, or `InMemory`.
    #[error("store {store} cannot be fenced: {reason}")]
    UnsupportedStore {
        /// The store's `Display` form.
        store: String,
        /// Which capability is missing.
        reason: String,
        /// The store's own error, when the probe or a write got one.
        #[source]
        source: Option<object_store::Error>,
    },
    /// The store failed for another reason (network, permissions, ...).
    #[error("object store error on {resource}")]
    Store {
        /// The object path (or what was being configured).
        resource: String,
        /// The underlying error.
        #[source]
        source: object_store::Error,
    },
    /// The internal tokio runtime could not be created.
    #[error("could not start the adapter's tokio runtime")]
    Runtime {
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A blocking method was called from inside an async runtime, where
    /// blocking would stall (or panic) the caller's executor.
    #[error("FencedStore was called from inside an async runtime")]
    InsideAsyncRuntime,
}

pub(crate) fn not_fenced(location: &Path) -> FenceError {
    FenceError::NotFenced {
        resource: location.to_string(),
    }
}

pub(crate) fn contended(location: &Path, attempts: u32) -> FenceError {
    FenceError::Contended {
        resource: location.to_string(),
        attempts,
    }
}

pub(crate) fn store_error(location: &Path, source: object_store::Error) -> FenceError {
    FenceError::Store {
        resource: location.to_string(),
        source,
    }
}
