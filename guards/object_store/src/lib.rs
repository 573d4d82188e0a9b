//! Fenced objects: object-store writes that refuse a superseded lease holder.
//!
//! A [`leasehold`] lease hands each holder a [`FencingToken`] whose epoch
//! grows with every grant. A holder that stalls (GC pause, network partition,
//! suspended VM) can wake up after its lease was taken over and still try to
//! write. This crate makes the *object* refuse that write: every object
//! written through a [`FencedStore`] remembers the highest epoch it accepted
//! and the lease key it is bound to, and every write is a compare-and-swap
//! against that record.
//!
//! ```
//! use leasehold::FencingToken;
//! use leasehold_object_store::object_store::{memory::InMemory, path::Path};
//! use leasehold_object_store::{FenceError, FencedStore};
//! use std::sync::Arc;
//!
//! let store = FencedStore::new(Arc::new(InMemory::new()))?;
//! let path = Path::from("jobs/42/output.json");
//! let old = FencingToken::new("job-42", "worker-a", 1)?;
//! let new = FencingToken::new("job-42", "worker-b", 2)?;
//!
//! store.write(&path, &new, "from b")?;
//! let refused = store.write(&path, &old, "from a, too late");
//! assert!(matches!(refused, Err(FenceError::StaleEpoch { presented: 1, accepted: 2, .. })));
//! assert_eq!(store.read(&path)?.content, "from b");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The rules
//!
//! * **G1** The fence travels with the object: its highest accepted epoch and
//!   its lease key are stored in the object's own user metadata
//!   (`leasehold-epoch`, `leasehold-token`; on S3 these are the
//!   `x-amz-meta-leasehold-*` headers). A companion "fence object" was
//!   rejected because content and fence would then be two PUTs that can be
//!   observed (or interrupted) in between.
//! * **G2** A token with an epoch below the accepted one gets
//!   [`FenceError::StaleEpoch`] and the object is not touched.
//! * **G3** Equal or higher epochs are admitted; the new epoch is recorded in
//!   the same PUT as the content, so content and epoch change atomically.
//! * **G4** Every write reads the current version (epoch, key, ETag/version),
//!   checks it, then PUTs with `If-Match` on exactly that version
//!   ([`PutMode::Update`]), or `If-None-Match: *` ([`PutMode::Create`]) when
//!   the object does not exist yet. A lost race re-reads and re-checks,
//!   a bounded number of times ([`FencedStore::with_max_attempts`]). So no
//!   write can overwrite a state it did not check, and a lower epoch can never
//!   land after a higher one.
//! * **G5** A token for a different lease key gets
//!   [`FenceError::WrongLeaseKey`]: that is a wiring mistake, not a lost
//!   race, and it is reported as such.
//!
//! # Stored layout
//!
//! The bytes stored for a fenced object are one header line, the text form
//! of the token that last wrote it (`lh1.<epoch>.<key>.<owner>\n`), followed
//! by the content. Read it back with [`FencedStore::read`] (which strips and
//! verifies the header), or by hand by skipping the first line.
//!
//! Why the header: S3 (and MinIO, moto, ...) derive the ETag from the body
//! bytes only, not from metadata. Without the header, an operator
//! [`FencedStore::admit`] (same content, higher epoch) would keep the ETag, and
//! a stale writer that had read the object before the fence would pass its
//! `If-Match` and land its lower epoch after the higher one (an ABA). With the
//! token in the body, two states with the same ETag have the same epoch and
//! key, so an ETag match really means "nothing relevant changed".
//!
//! # Assumptions
//!
//! * The store's conditional PUT is linearizable per object: of two PUTs
//!   conditioned on the same version, at most one succeeds, and a successful
//!   PUT is visible to every later read (S3 has been strongly consistent
//!   since 2020; `InMemory` trivially is).
//! * The store honours `If-None-Match: *` and `If-Match`. For S3 this means
//!   conditional put is enabled on the client,
//!   `AmazonS3Builder::with_conditional_put(S3ConditionalPut::ETagMatch)`
//!   (the default in object_store 0.14; [`FencedStore::s3`] sets it
//!   explicitly). [`FencedStore::new`] checks all this with a probe and
//!   refuses stores that fail it, e.g. `LocalFileSystem`, which implements
//!   neither conditional updates nor user metadata.
//! * User metadata written with a PUT is returned by HEAD/GET.
//! * Every write goes through a `FencedStore` (any process, any host). A
//!   plain PUT or DELETE bypasses the fence: deleting a fenced object forgets
//!   its floor, so retire an object by fencing it to a high epoch instead.
//! * Clocks play no role: no timestamps are compared, no timeouts decide
//!   anything. Retries back off with a short random pause only to spread
//!   out contending writers; correctness never depends on timing.
//! * Content goes in a single PUT (no multipart), so it is bounded by the
//!   store's single-PUT limit (5 GiB on S3).
//!
//! # Threads and runtimes
//!
//! The API is synchronous. A `FencedStore` owns a current-thread tokio
//! runtime and blocks on it; it is `Send + Sync` and may be shared between
//! threads. Do not call it from async code (it returns
//! [`FenceError::InsideAsyncRuntime`] instead of panicking); use
//! `tokio::task::spawn_blocking` there.
//!
//! # Features
//!
//! * `s3`: enables object_store's `aws` feature and [`FencedStore::s3`].
//!   Without it only the core (and any [`ObjectStore`] you construct
//!   yourself, e.g. `InMemory`) is available.

#![deny(missing_docs)]

use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
pub use leasehold::FencingToken;
use object_store::path::Path;
use object_store::{
    Attribute, AttributeValue, Attributes, GetOptions, GetResult, ObjectStore, ObjectStoreExt,
    PutMode, PutOptions, PutPayload, UpdateVersion,
};

/// The `object_store` crate this adapter is built against, re-exported so
/// callers construct stores and paths of the matching version.
pub use object_store;

/// Objects under this prefix are written and deleted by the construction
/// probe of [`FencedStore::new`]; do not store anything there.
pub const PROBE_PREFIX: &str = ".leasehold-probe";

/// User-metadata name of the accepted epoch (decimal).
pub const META_EPOCH: &str = "leasehold-epoch";

/// User-metadata name of the text form of the token that set the epoch; it
/// carries the lease key the object is bound to and the last writer.
pub const META_TOKEN: &str = "leasehold-token";

/// Default bound on compare-and-swap attempts per call.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 64;

/// Why a fenced operation was refused or failed.
///
/// The first three variants are the guard doing its job; the rest are
/// configuration or infrastructure problems.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// The token's epoch is below the one the object already accepted: the
    /// lease was taken over. The object was not modified.
    #[error("stale epoch {presented} for {resource}: it accepts only epochs >= {accepted}")]
    StaleEpoch {
        /// The object path.
        resource: String,
        /// The epoch of the refused token.
        presented: i64,
        /// The highest epoch the object has accepted.
        accepted: i64,
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
    /// Every compare-and-swap attempt lost a race with another writer.
    #[error("gave up on {resource} after {attempts} compare-and-swap attempts lost races")]
    Contended {
        /// The object path.
        resource: String,
        /// How many attempts were made.
        attempts: u32,
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
    // `Option` only so `Drop` can shut it down without blocking.
    runtime: Option<tokio::runtime::Runtime>,
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

impl Drop for FencedStore {
    fn drop(&mut self) {
        // A plain drop of a runtime panics inside async contexts; this does not.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// What a HEAD/GET found at a path, before interpretation.
struct Current {
    attributes: Attributes,
    e_tag: Option<String>,
    version: Option<String>,
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
    /// [`PROBE_PREFIX`] it creates an object with `If-None-Match: *` and user
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
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(FenceError::InsideAsyncRuntime);
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| FenceError::Runtime { source })?;
        let fenced = Self {
            store,
            runtime: Some(runtime),
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
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(FenceError::InsideAsyncRuntime);
        }
        match &self.runtime {
            Some(runtime) => Ok(runtime.block_on(future)),
            // Only `Drop` takes the runtime, and then nobody can call us.
            None => Err(FenceError::Runtime {
                source: std::io::Error::other("runtime already shut down"),
            }),
        }
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

/// Checks key (G5) then epoch (G2) of `token` against `state`.
fn admit(location: &Path, state: &FenceState, token: &FencingToken) -> Result<(), FenceError> {
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
fn fence_state(location: &Path, current: Current) -> Result<Option<FenceState>, FenceError> {
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
fn strip_header(location: &Path, state: &FenceState, body: Bytes) -> Result<Bytes, FenceError> {
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

fn not_fenced(location: &Path) -> FenceError {
    FenceError::NotFenced {
        resource: location.to_string(),
    }
}

fn contended(location: &Path, attempts: u32) -> FenceError {
    FenceError::Contended {
        resource: location.to_string(),
        attempts,
    }
}

fn store_error(location: &Path, source: object_store::Error) -> FenceError {
    FenceError::Store {
        resource: location.to_string(),
        source,
    }
}

/// A random number without a dependency: `RandomState` is seeded randomly.
fn random_u64() -> u64 {
    RandomState::new().build_hasher().finish()
}

/// Short randomized exponential pause after a lost race, so contending
/// writers spread out. Liveness only; correctness never depends on it.
async fn backoff(attempt: u32) {
    let ceiling_micros = 100u64 << attempt.min(7); // up to 12.8 ms
    let pause = random_u64() % ceiling_micros;
    tokio::time::sleep(Duration::from_micros(pause)).await;
}

/// Checks the capabilities fencing relies on; see [`FencedStore::new`].
/// The outer error is an infrastructure failure, the inner one the verdict.
async fn probe(store: &dyn ObjectStore) -> Result<(), FenceError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "{PROBE_PREFIX}/{}-{}-{:016x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        random_u64()
    );
    let location = Path::from(name);
    let verdict = probe_steps(store, &location).await;
    // Best effort: a leftover probe object is harmless.
    let _ = store.delete(&location).await;
    verdict
}

async fn probe_steps(store: &dyn ObjectStore, location: &Path) -> Result<(), FenceError> {
    let unsupported = |reason: String| FenceError::UnsupportedStore {
        store: store.to_string(),
        reason,
        source: None,
    };
    let classify = |step: &str, error: object_store::Error| match error {
        object_store::Error::NotImplemented { .. } | object_store::Error::NotSupported { .. } => {
            FenceError::UnsupportedStore {
                store: store.to_string(),
                reason: format!("{step} failed"),
                source: Some(error),
            }
        }
        other => store_error(location, other),
    };
    let marker = Attribute::Metadata("leasehold-probe".into());
    let put = |body: &'static str, mode: PutMode| {
        let mut options = PutOptions::from(mode);
        options
            .attributes
            .insert(marker.clone(), AttributeValue::from("1"));
        store.put_opts(location, PutPayload::from_static(body.as_bytes()), options)
    };

    put("probe-1", PutMode::Create)
        .await
        .map_err(|e| classify("a create with If-None-Match and user metadata", e))?;
    match put("probe-1b", PutMode::Create).await {
        Err(object_store::Error::AlreadyExists { .. }) => {}
        Ok(_) => {
            return Err(unsupported(
                "a second create of the same object succeeded, so If-None-Match is ignored".into(),
            ))
        }
        Err(error) => return Err(classify("a repeated create", error)),
    }
    let head = store
        .get_opts(
            location,
            GetOptions {
                head: true,
                ..GetOptions::default()
            },
        )
        .await
        .map_err(|e| classify("a HEAD", e))?;
    if head.attributes.get(&marker).map(|v| v.as_ref()) != Some("1") {
        return Err(unsupported(
            "user metadata written with a PUT is not returned by HEAD".into(),
        ));
    }
    if head.meta.e_tag.is_none() && head.meta.version.is_none() {
        return Err(unsupported(
            "HEAD reports neither an ETag nor a version to compare-and-swap on".into(),
        ));
    }
    let read_version = UpdateVersion {
        e_tag: head.meta.e_tag,
        version: head.meta.version,
    };
    put("probe-2", PutMode::Update(read_version.clone()))
        .await
        .map_err(|e| classify("an update with If-Match", e))?;
    match put("probe-3", PutMode::Update(read_version)).await {
        Err(object_store::Error::Precondition { .. }) => Ok(()),
        Ok(_) => Err(unsupported(
            "an update on a superseded version succeeded, so If-Match is ignored".into(),
        )),
        Err(error) => Err(classify("an update on a superseded version", error)),
    }
}
