//! [`FencedStore`]: fenced writes, admissions and reads as compare-and-swap
//! rounds against the store.

use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{
    Attribute, AttributeValue, Attributes, GetOptions, GetResult, ObjectStore, PutMode, PutOptions,
    PutPayload, UpdateVersion,
};

use crate::error::{contended, not_fenced, store_error, FenceError};
use crate::probe::probe;
use crate::record::{admit, fence_state, strip_header, Current, FenceState};
use crate::runtime::RuntimeBridge;
use crate::{FencingToken, DEFAULT_MAX_ATTEMPTS, META_EPOCH, META_TOKEN};

/// The content of a fenced object together with its fence record, read in
/// one request so the two belong to the same version.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FencedObject {
    /// The content as written (header line stripped).
    pub content: Bytes,
    /// The fence record of this version.
    pub state: FenceState,
}

/// Proof that a write was accepted, and what it replaced.
///
/// `replaced` together with `state` lets a caller reconstruct the exact order
/// in which the store accepted writes (each write names the version it
/// replaced), which is how the tests check that no update was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteReceipt {
    /// The fence record of the version this write created.
    pub state: FenceState,
    /// The fence record of the version it replaced, `None` if it created the
    /// object. An adopted unfenced object has no record and also gives `None`.
    pub replaced: Option<FenceState>,
    /// Compare-and-swap attempts used (1 when uncontended).
    pub attempts: u32,
}

/// An object store whose writes are fenced by lease epochs.
///
/// Construct it once per store with [`FencedStore::new`] (or
/// [`FencedStore::s3`]) and share it; see the [crate docs](crate) for the
/// rules it enforces and what it assumes.
pub struct FencedStore {
    store: Arc<dyn ObjectStore>,
    runtime: RuntimeBridge,
    max_attempts: u32,
}

impl std::fmt::Debug for FencedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedStore")
            .field("store", &self.store.to_string())
            .field("max_attempts", &self.max_attempts)
            .finish()
    }
}

/// The outcome of one compare-and-swap attempt.
enum Attempt<T> {
    Done(T),
    LostRace,
}

impl FencedStore {
    /// Wraps `store` after checking that it can enforce fencing.
    ///
    /// The check is a probe, because object_store does not report
    /// capabilities and some stores silently ignore preconditions: under
    /// [`PROBE_PREFIX`](crate::PROBE_PREFIX) it creates an object with `If-None-Match: *` and user
    /// metadata, checks a second create is refused, that HEAD returns the
    /// metadata and an ETag or version, that an `If-Match` update on that
    /// version succeeds and that a second one on the now stale version is
    /// refused. It then deletes the probe object. Stores failing any step
    /// are refused with [`FenceError::UnsupportedStore`] saying which.
    ///
    /// ```
    /// use leasehold_object_store::object_store::{local::LocalFileSystem, memory::InMemory};
    /// use leasehold_object_store::{FenceError, FencedStore};
    /// use std::sync::Arc;
    ///
    /// assert!(FencedStore::new(Arc::new(InMemory::new())).is_ok());
    /// # let dir = std::env::temp_dir();
    /// let local = LocalFileSystem::new_with_prefix(dir)?;
    /// let refused = FencedStore::new(Arc::new(local));
    /// assert!(matches!(refused, Err(FenceError::UnsupportedStore { .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(store: Arc<dyn ObjectStore>) -> Result<Self, FenceError> {
        let fenced = Self {
            store,
            runtime: RuntimeBridge::new()?,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        };
        fenced.block_on(probe(&*fenced.store))??;
        Ok(fenced)
    }

    /// Builds an S3 store from `builder` with conditional PUT
    /// (`If-Match`/`If-None-Match`) switched on, then probes it like
    /// [`FencedStore::new`].
    ///
    /// The bucket must support conditional writes (AWS S3 does since 2024;
    /// MinIO, R2 and moto do too).
    ///
    /// ```no_run
    /// use leasehold_object_store::object_store::aws::AmazonS3Builder;
    /// use leasehold_object_store::FencedStore;
    ///
    /// let store = FencedStore::s3(AmazonS3Builder::from_env().with_bucket_name("my-bucket"))?;
    /// # Ok::<(), leasehold_object_store::FenceError>(())
    /// ```
    #[cfg(feature = "s3")]
    pub fn s3(builder: object_store::aws::AmazonS3Builder) -> Result<Self, FenceError> {
        let store = builder
            .with_conditional_put(object_store::aws::S3ConditionalPut::ETagMatch)
            .build()
            .map_err(|source| FenceError::Store {
                resource: "S3 configuration".to_owned(),
                source,
            })?;
        Self::new(Arc::new(store))
    }

    /// Sets how many compare-and-swap attempts one call makes before giving
    /// up with [`FenceError::Contended`] (default [`DEFAULT_MAX_ATTEMPTS`];
    /// values below 1 are treated as 1). Each lost attempt means another
    /// writer succeeded, so the system as a whole always makes progress; the
    /// bound only limits how long one caller can starve.
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The underlying store, for reads and operations that need no fence.
    pub fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// Writes `content` to `location` if `token` may: its key must be the
    /// object's lease key (or the object must not exist yet, which binds it
    /// to the key) and its epoch must be at least the accepted one. The
    /// epoch is recorded in the same PUT as the content.
    ///
    /// ```
    /// # use leasehold::FencingToken;
    /// # use leasehold_object_store::object_store::{memory::InMemory, path::Path};
    /// # use leasehold_object_store::{FenceError, FencedStore};
    /// # use std::sync::Arc;
    /// let store = FencedStore::new(Arc::new(InMemory::new()))?;
    /// let path = Path::from("report.csv");
    /// let token = FencingToken::new("reports", "worker-a", 3)?;
    /// let receipt = store.write(&path, &token, "a,b\n1,2\n")?;
    /// assert_eq!(receipt.state.epoch(), 3);
    /// assert!(receipt.replaced.is_none()); // created it
    /// store.write(&path, &token, "a,b\n3,4\n")?; // same epoch again: admitted
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write(
        &self,
        location: &Path,
        token: &FencingToken,
        content: impl Into<Bytes>,
    ) -> Result<WriteReceipt, FenceError> {
        let content = content.into();
        self.block_on(async {
            let mut attempt = 0;
            while attempt < self.max_attempts {
                attempt += 1;
                let current = self.head(location).await?;
                let replaced = match current {
                    None => None,
                    Some(current) => {
                        let state =
                            fence_state(location, current)?.ok_or_else(|| not_fenced(location))?;
                        admit(location, &state, token)?;
                        Some(state)
                    }
                };
                match self
                    .put(location, token, content.clone(), replaced.as_ref())
                    .await?
                {
                    Attempt::Done(state) => {
                        return Ok(WriteReceipt {
                            state,
                            replaced,
                            attempts: attempt,
                        })
                    }
                    Attempt::LostRace => backoff(attempt).await,
                }
            }
            Err(contended(location, attempt))
        })?
    }

    /// Admits `token` without writing: raises the object's record to the
    /// token's epoch and keeps its content, so holders of lower epochs are
    /// refused from now on (the same as `leasehold::admit` for a database
    /// resource).
    ///
    /// This is the operator's (or a new holder's) move after a takeover:
    /// fence first, then whatever the old holder still has in flight bounces.
    /// If the object does not exist it is created empty, so a stale holder
    /// cannot create it either. An existing object without a fence record
    /// (written around the guard) is adopted: its content is kept and the
    /// record added. The same rules as [`FencedStore::write`] apply: wrong
    /// key and lower epochs are refused, the equal epoch is admitted.
    ///
    /// ```
    /// # use leasehold::FencingToken;
    /// # use leasehold_object_store::object_store::{memory::InMemory, path::Path};
    /// # use leasehold_object_store::{FenceError, FencedStore};
    /// # use std::sync::Arc;
    /// let store = FencedStore::new(Arc::new(InMemory::new()))?;
    /// let path = Path::from("state");
    /// store.write(&path, &FencingToken::new("k", "a", 1)?, "v1")?;
    /// store.admit(&path, &FencingToken::new("k", "operator", 5)?)?;
    /// let late = store.write(&path, &FencingToken::new("k", "b", 4)?, "v2");
    /// assert!(matches!(late, Err(FenceError::StaleEpoch { accepted: 5, .. })));
    /// assert_eq!(store.read(&path)?.content, "v1");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn admit(&self, location: &Path, token: &FencingToken) -> Result<WriteReceipt, FenceError> {
        self.block_on(async {
            let mut attempt = 0;
            while attempt < self.max_attempts {
                attempt += 1;
                // A full GET: the content must be rewritten with the new
                // header, and must be the content of the version we CAS on.
                let (replaced, content, version) = match self.get(location, false).await? {
                    None => (None, Bytes::new(), None),
                    Some((current, body)) => {
                        let version = UpdateVersion {
                            e_tag: current.e_tag.clone(),
                            version: current.version.clone(),
                        };
                        match fence_state(location, current)? {
                            None => (None, body, Some(version)),
                            Some(state) => {
                                admit(location, &state, token)?;
                                let content = strip_header(location, &state, body)?;
                                (Some(state), content, Some(version))
                            }
                        }
                    }
                };
                match self.put_raw(location, token, content, version).await? {
                    Attempt::Done(state) => {
                        return Ok(WriteReceipt {
                            state,
                            replaced,
                            attempts: attempt,
                        })
                    }
                    Attempt::LostRace => backoff(attempt).await,
                }
            }
            Err(contended(location, attempt))
        })?
    }

    /// Reads the content and the fence record of one version, in one request.
    pub fn read(&self, location: &Path) -> Result<FencedObject, FenceError> {
        self.block_on(async {
            let (current, body) =
                self.get(location, false)
                    .await?
                    .ok_or_else(|| FenceError::NotFound {
                        resource: location.to_string(),
                    })?;
            let state = fence_state(location, current)?.ok_or_else(|| not_fenced(location))?;
            let content = strip_header(location, &state, body)?;
            Ok(FencedObject { content, state })
        })?
    }

    /// The fence record of the object (a HEAD request), `None` if the object
    /// does not exist. Fails with [`FenceError::NotFenced`] for an object
    /// written around the guard.
    pub fn state(&self, location: &Path) -> Result<Option<FenceState>, FenceError> {
        self.block_on(async {
            match self.head(location).await? {
                None => Ok(None),
                Some(current) => Ok(Some(
                    fence_state(location, current)?.ok_or_else(|| not_fenced(location))?,
                )),
            }
        })?
    }

    fn block_on<F: Future>(&self, future: F) -> Result<F::Output, FenceError> {
        self.runtime.block_on(future)
    }

    async fn head(&self, location: &Path) -> Result<Option<Current>, FenceError> {
        Ok(self.get(location, true).await?.map(|(current, _)| current))
    }

    async fn get(
        &self,
        location: &Path,
        head: bool,
    ) -> Result<Option<(Current, Bytes)>, FenceError> {
        let options = GetOptions {
            head,
            ..GetOptions::default()
        };
        let result: GetResult = match self.store.get_opts(location, options).await {
            Ok(result) => result,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(source) => return Err(store_error(location, source)),
        };
        let current = Current {
            attributes: result.attributes.clone(),
            e_tag: result.meta.e_tag.clone(),
            version: result.meta.version.clone(),
        };
        let body = if head {
            Bytes::new()
        } else {
            result
                .bytes()
                .await
                .map_err(|source| store_error(location, source))?
        };
        Ok(Some((current, body)))
    }

    /// Conditional PUT of `content` under `token`, on the version `replaced`
    /// was read from (or as a create).
    async fn put(
        &self,
        location: &Path,
        token: &FencingToken,
        content: Bytes,
        replaced: Option<&FenceState>,
    ) -> Result<Attempt<FenceState>, FenceError> {
        let version = replaced.map(|state| UpdateVersion {
            e_tag: state.e_tag.clone(),
            version: state.version.clone(),
        });
        self.put_raw(location, token, content, version).await
    }

    async fn put_raw(
        &self,
        location: &Path,
        token: &FencingToken,
        content: Bytes,
        version: Option<UpdateVersion>,
    ) -> Result<Attempt<FenceState>, FenceError> {
        let mode = match version {
            None => PutMode::Create,
            Some(version) => {
                if version.e_tag.is_none() && version.version.is_none() {
                    return Err(FenceError::UnsupportedStore {
                        store: self.store.to_string(),
                        reason: format!(
                            "it reported neither an ETag nor a version for {location}, \
                             so there is nothing to compare-and-swap on"
                        ),
                        source: None,
                    });
                }
                PutMode::Update(version)
            }
        };
        let text = token.to_string();
        let mut attributes = Attributes::new();
        attributes.insert(
            Attribute::Metadata(META_EPOCH.into()),
            AttributeValue::from(token.epoch().to_string()),
        );
        attributes.insert(
            Attribute::Metadata(META_TOKEN.into()),
            AttributeValue::from(text.clone()),
        );
        let header = Bytes::from(format!("{text}\n"));
        let payload: PutPayload = [header, content].into_iter().collect();
        let mut options = PutOptions::from(mode);
        options.attributes = attributes;
        match self.store.put_opts(location, payload, options).await {
            Ok(result) => Ok(Attempt::Done(FenceState {
                token: token.clone(),
                e_tag: result.e_tag,
                version: result.version,
            })),
            Err(object_store::Error::Precondition { .. })
            | Err(object_store::Error::AlreadyExists { .. }) => Ok(Attempt::LostRace),
            Err(
                source @ (object_store::Error::NotImplemented { .. }
                | object_store::Error::NotSupported { .. }),
            ) => Err(FenceError::UnsupportedStore {
                store: self.store.to_string(),
                reason: "conditional PUT refused".to_owned(),
                source: Some(source),
            }),
            Err(source) => Err(store_error(location, source)),
        }
    }
}

/// A random number without a dependency: `RandomState` is seeded randomly.
pub(crate) fn random_u64() -> u64 {
    RandomState::new().build_hasher().finish()
}

/// Short randomized exponential pause after a lost race, so contending
/// writers spread out. Liveness only; correctness never depends on it.
pub(crate) async fn backoff(attempt: u32) {
    let ceiling_micros = 100u64 << attempt.min(7); // up to 12.8 ms
    let pause = random_u64() % ceiling_micros;
    tokio::time::sleep(Duration::from_micros(pause)).await;
}
