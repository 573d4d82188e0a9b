//! [`ObjectGuard`]: one object of a [`FencedStore`] as the workspace's one
//! guard contract ([`leasehold::guard::Guard`]), so the guard conformance
//! suite runs against objects as it does against files and database
//! resources.

use std::sync::Arc;

use leasehold::guard::{Guard, GuardRecord, Refused};
use leasehold::Epoch;
use object_store::path::Path;

use crate::error::FenceError;
use crate::store::FencedStore;
use crate::FencingToken;

/// The owner recorded on an object by [`ObjectGuard::fence`]: an object has
/// no separate floor, so a fence through N is an admission of N + 1 that
/// names no holder.
pub const FENCE_OWNER: &str = "leasehold-fence";

/// One object of a fenced store, as a [`Guard`]: `admit` is
/// [`FencedStore::admit`], the floor is the object's recorded epoch, and a
/// fence through N admits epoch N + 1 under [`FENCE_OWNER`] unless the
/// object is there already.
#[derive(Debug, Clone)]
pub struct ObjectGuard {
    store: Arc<FencedStore>,
    location: Path,
}

impl ObjectGuard {
    /// The guard of the object at `location` in `store`.
    pub fn new(store: Arc<FencedStore>, location: Path) -> Self {
        Self { store, location }
    }

    /// The object's path.
    pub fn location(&self) -> &Path {
        &self.location
    }
}

impl Guard for ObjectGuard {
    type Error = FenceError;

    fn admit(&self, token: &FencingToken) -> Result<(), FenceError> {
        self.store.admit(&self.location, token).map(drop)
    }

    fn fence(&self, key: &str, through: Epoch) -> Result<(), FenceError> {
        if let Some(state) = self.store.state(&self.location)? {
            if state.key() == key && state.epoch() > through {
                return Ok(()); // refused through `through` already
            }
        }
        let next = through
            .get()
            .checked_add(1)
            .map(Epoch::new)
            .ok_or_else(|| FenceError::InvalidFence {
                resource: self.location.to_string(),
                reason: format!("cannot fence through epoch {through}: no epoch is above it"),
            })?;
        let token = FencingToken::new(key, FENCE_OWNER, next).map_err(|error| {
            FenceError::InvalidFence {
                resource: self.location.to_string(),
                reason: format!("cannot fence with key {key:?}: {error}"),
            }
        })?;
        match self.store.admit(&self.location, &token) {
            // Raised above `through` meanwhile by someone else: the fence
            // holds without us.
            Err(FenceError::StaleEpoch { .. }) => Ok(()),
            other => other.map(drop),
        }
    }

    fn record(&self) -> Result<Option<GuardRecord>, FenceError> {
        Ok(self
            .store
            .state(&self.location)?
            .map(|state| state.guard_record()))
    }

    fn refused(error: &FenceError) -> Option<Refused> {
        match error {
            FenceError::StaleEpoch {
                presented,
                accepted,
                ..
            } => Some(Refused::Stale {
                presented: *presented,
                accepted: *accepted,
            }),
            FenceError::WrongLeaseKey {
                presented,
                fenced_by,
                ..
            } => Some(Refused::WrongKey {
                fenced_by: fenced_by.clone(),
                presented: presented.clone(),
            }),
            _ => None,
        }
    }
}
