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
use crate::limits::check_token_len;
use crate::outcome::{Unresolved, Verdict, VersionStamp};
use crate::probe::probe;
use crate::record::{
    admit, fence_state, header_line, new_write_id, strip_header, Current, FenceState,
};
use crate::runtime::RuntimeBridge;
use crate::{
    FencingToken, DEFAULT_MAX_ATTEMPTS, META_EPOCH, META_TOKEN, META_WRITE_ID, S3_MAX_TOKEN_TEXT,
    UNKNOWN_OUTCOME_RETRIES,
};

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
    /// The longest token text form the store's metadata takes; `None`: no
    /// limit known.
    max_token_text: Option<usize>,
}

impl std::fmt::Debug for FencedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedStore")
            .field("store", &self.store.to_string())
            .field("max_attempts", &self.max_attempts)
            .field("max_token_text", &self.max_token_text)
            .finish()
    }
}

/// What the store answered to one conditional PUT.
enum PutOutcome {
    /// Applied: the fence record of the new version.
    Done(FenceState),
    /// Refused by its precondition (412, or 409 for a create): certainly
    /// not applied, another write got there first.
    Refused,
    /// No answer, or one that does not say whether the PUT was applied
    /// (dropped connection, timeout, 5xx, ...).
    Unknown(object_store::Error),
}

/// What one compare-and-swap round decided to PUT.
struct Plan {
    /// The fence record of the version the PUT replaces.
    replaced: Option<FenceState>,
    /// The content, without the header line.
    content: Bytes,
    /// The version to condition on; `None`: a create.
    version: Option<UpdateVersion>,
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
    /// refused. Then it races [`PROBE_RACERS`](crate::PROBE_RACERS)
    /// `If-Match` updates of
    /// [`PROBE_RACE_BODY_BYTES`](crate::PROBE_RACE_BODY_BYTES) each on the
    /// same version, [`PROBE_RACE_ROUNDS`](crate::PROBE_RACE_ROUNDS) times,
    /// and passes the store only if in every round one PUT succeeds and the
    /// others are refused by their precondition (two succeeding, or one
    /// failing otherwise, means the store may apply both: its
    /// compare-and-swap is not shown atomic). It then deletes the probe
    /// object. Stores failing any step are refused with
    /// [`FenceError::UnsupportedStore`] saying which. On an atomic store the probe uploads 128 MiB (0.6 to 0.8 s
    /// against moto on loopback, about 40 ms on `InMemory`), so construct
    /// one `FencedStore` per store and share it.
    ///
    /// The probe cannot see how the client retries. A client that re-sends
    /// a conditional PUT after a lost answer (object_store's default
    /// `RetryConfig` does, for 5xx answers and dropped connections) turns a
    /// write that landed into a 412, which this adapter then has to read as
    /// "another writer got there first". Build S3 clients with
    /// `with_retry(RetryConfig { max_retries: 0, .. })`, as
    /// [`FencedStore::s3`] does; see the crate docs, "Lost answers".
    ///
    /// Tokens whose text form is longer than the store's metadata takes are
    /// refused with [`FenceError::TokenTooLong`] before any request: for a
    /// store whose `Display` names `AmazonS3` the limit is
    /// [`S3_MAX_TOKEN_TEXT`](crate::S3_MAX_TOKEN_TEXT), for other stores
    /// none unless set with [`FencedStore::with_max_token_text`].
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
        // S3 keeps the fence record in user metadata of at most 2 KB.
        // Recognised by name, which also covers S3 wrapped in object_store's
        // prefix, limit or throttle stores (their `Display` names the inner
        // store); other S3-compatible stores can set it explicitly.
        let max_token_text = store
            .to_string()
            .contains("AmazonS3")
            .then_some(S3_MAX_TOKEN_TEXT);
        let fenced = Self {
            store,
            runtime: RuntimeBridge::new()?,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            max_token_text,
        };
        fenced.block_on(probe(&*fenced.store))??;
        Ok(fenced)
    }

    /// Builds an S3 store from `builder` with conditional PUT
    /// (`If-Match`/`If-None-Match`) switched on and object_store's own
    /// retries switched off (`RetryConfig::max_retries = 0`), then probes it
    /// like [`FencedStore::new`]. Tokens are limited to
    /// [`S3_MAX_TOKEN_TEXT`](crate::S3_MAX_TOKEN_TEXT) bytes of text form.
    ///
    /// Retries are off because object_store would re-send a conditional PUT
    /// whose answer was lost, and the re-send's 412 hides that the first one
    /// landed. The adapter decides itself when re-sending is safe (see
    /// the crate docs, "Lost answers"). Reads are not retried either, so a
    /// transient store error on a read fails the call with
    /// [`FenceError::Store`] (or [`FenceError::OutcomeUnknown`] if a PUT of
    /// the call had lost its answer).
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
        let no_retries = object_store::RetryConfig {
            max_retries: 0,
            ..object_store::RetryConfig::default()
        };
        let store = builder
            .with_conditional_put(object_store::aws::S3ConditionalPut::ETagMatch)
            .with_retry(no_retries)
            .build()
            .map_err(|source| FenceError::Store {
                resource: "S3 configuration".to_owned(),
                source,
            })?;
        Ok(Self::new(Arc::new(store))?.with_max_token_text(Some(S3_MAX_TOKEN_TEXT)))
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

    /// Sets the longest token text form (see
    /// [`S3_MAX_TOKEN_TEXT`](crate::S3_MAX_TOKEN_TEXT)) that writes and
    /// admissions accept; longer tokens get [`FenceError::TokenTooLong`]
    /// before any request. `None` removes the limit (right for `InMemory`,
    /// which has none). For S3-compatible stores that `FencedStore::new`
    /// does not recognise as S3, set `Some(S3_MAX_TOKEN_TEXT)`.
    pub fn with_max_token_text(mut self, max: Option<usize>) -> Self {
        self.max_token_text = max;
        self
    }

    /// The longest token text form this store accepts (`None`: no limit).
    pub fn max_token_text(&self) -> Option<usize> {
        self.max_token_text
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
    /// # use leasehold::{Epoch, FencingToken};
    /// # use leasehold_object_store::object_store::{memory::InMemory, path::Path};
    /// # use leasehold_object_store::{FenceError, FencedStore};
    /// # use std::sync::Arc;
    /// let store = FencedStore::new(Arc::new(InMemory::new()))?;
    /// let path = Path::from("report.csv");
    /// let token = FencingToken::new("reports", "worker-a", Epoch::new(3))?;
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
        self.block_on(self.compare_and_swap(location, token, false, |found| {
            let replaced = match found {
                None => None,
                Some((current, _)) => {
                    let state =
                        fence_state(location, current)?.ok_or_else(|| not_fenced(location))?;
                    admit(location, &state, token)?;
                    Some(state)
                }
            };
            let version = replaced.as_ref().map(|state| UpdateVersion {
                e_tag: state.e_tag.clone(),
                version: state.version.clone(),
            });
            Ok(Plan {
                replaced,
                content: content.clone(),
                version,
            })
        }))?
    }

    /// Admits `token` without writing: raises the object's record to the
    /// token's epoch and keeps its content, so holders of lower epochs are
    /// refused from now on (the same as `leasehold::guard::admit` for a database
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
    /// # use leasehold::{Epoch, FencingToken};
    /// # use leasehold_object_store::object_store::{memory::InMemory, path::Path};
    /// # use leasehold_object_store::{FenceError, FencedStore};
    /// # use std::sync::Arc;
    /// let store = FencedStore::new(Arc::new(InMemory::new()))?;
    /// let path = Path::from("state");
    /// store.write(&path, &FencingToken::new("k", "a", Epoch::new(1))?, "v1")?;
    /// store.admit(&path, &FencingToken::new("k", "operator", Epoch::new(5))?)?;
    /// let late = store.write(&path, &FencingToken::new("k", "b", Epoch::new(4))?, "v2");
    /// assert!(matches!(late, Err(FenceError::StaleEpoch { accepted: Epoch(5), .. })));
    /// assert_eq!(store.read(&path)?.content, "v1");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn admit(&self, location: &Path, token: &FencingToken) -> Result<WriteReceipt, FenceError> {
        // A full GET: the content must be rewritten with the new header,
        // and must be the content of the version we condition on.
        self.block_on(self.compare_and_swap(location, token, true, |found| {
            let Some((current, body)) = found else {
                return Ok(Plan {
                    replaced: None,
                    content: Bytes::new(),
                    version: None,
                });
            };
            let version = Some(UpdateVersion {
                e_tag: current.e_tag.clone(),
                version: current.version.clone(),
            });
            match fence_state(location, current)? {
                None => Ok(Plan {
                    replaced: None,
                    content: body,
                    version,
                }),
                Some(state) => {
                    admit(location, &state, token)?;
                    let content = strip_header(location, &state, body)?;
                    Ok(Plan {
                        replaced: Some(state),
                        content,
                        version,
                    })
                }
            }
        }))?
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

    /// The compare-and-swap loop shared by [`FencedStore::write`] and
    /// [`FencedStore::admit`]: read the object (a HEAD, or a GET when
    /// `full_read`), let `plan` check it and decide what to PUT, PUT it
    /// conditioned on exactly the version read, and go round again after a
    /// lost race. A lost answer is settled by the next read (see
    /// [`crate::outcome`]), never by the store's 412 alone.
    async fn compare_and_swap(
        &self,
        location: &Path,
        token: &FencingToken,
        full_read: bool,
        plan: impl Fn(Option<(Current, Bytes)>) -> Result<Plan, FenceError>,
    ) -> Result<WriteReceipt, FenceError> {
        check_token_len(location, token, self.max_token_text)?;
        let mut unresolved: Option<Unresolved> = None;
        let mut puts = 0;
        let mut attempt = 0;
        while attempt < self.max_attempts {
            attempt += 1;
            let found = match self.get(location, !full_read).await {
                Ok(found) => found,
                Err(error) => return Err(after_lost_answer(unresolved, location, puts, error)),
            };
            if let Some(lost) = unresolved.take() {
                match lost.judge(location, found.as_ref().map(|(current, _)| current)) {
                    Verdict::Landed(state) => {
                        return Ok(WriteReceipt {
                            state,
                            replaced: lost.replaced(),
                            attempts: attempt,
                        })
                    }
                    Verdict::Unknowable(reason) => {
                        return Err(lost.into_error(location, puts, reason))
                    }
                    Verdict::NotYet if lost.resends() >= UNKNOWN_OUTCOME_RETRIES => {
                        let reason = format!(
                            "the object is still at the version the PUTs were conditioned on \
                             after {UNKNOWN_OUTCOME_RETRIES} re-sends; a late one may still land"
                        );
                        return Err(lost.into_error(location, puts, reason));
                    }
                    Verdict::NotYet => unresolved = Some(lost),
                }
            }
            let conditioned_on = found.as_ref().map(|(current, _)| VersionStamp::of(current));
            let plan = match plan(found) {
                Ok(plan) => plan,
                Err(error) => return Err(after_lost_answer(unresolved, location, puts, error)),
            };
            let write_id = new_write_id();
            puts += 1;
            let outcome = self
                .put_raw(location, token, &write_id, plan.content, plan.version)
                .await;
            match outcome {
                Ok(PutOutcome::Done(state)) => {
                    return Ok(WriteReceipt {
                        state,
                        replaced: plan.replaced,
                        attempts: attempt,
                    })
                }
                Ok(PutOutcome::Refused) => {}
                Ok(PutOutcome::Unknown(source)) => match &mut unresolved {
                    // A re-send happens only after the re-read found the
                    // version unchanged, so it has the same condition.
                    Some(lost) => lost.resent(write_id),
                    None => {
                        unresolved = Some(Unresolved::new(
                            write_id,
                            conditioned_on,
                            plan.replaced,
                            source,
                        ))
                    }
                },
                Err(error) => return Err(after_lost_answer(unresolved, location, puts, error)),
            }
            backoff(attempt).await;
        }
        Err(match unresolved {
            None => contended(location, attempt),
            Some(lost) => lost.into_error(
                location,
                puts,
                format!("gave up after {attempt} compare-and-swap attempts"),
            ),
        })
    }

    /// One conditional PUT of `content` under `token`, with `write_id`, on
    /// `version` (or as a create), and what the store's answer proves.
    async fn put_raw(
        &self,
        location: &Path,
        token: &FencingToken,
        write_id: &str,
        content: Bytes,
        version: Option<UpdateVersion>,
    ) -> Result<PutOutcome, FenceError> {
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
        let mut attributes = Attributes::new();
        attributes.insert(
            Attribute::Metadata(META_EPOCH.into()),
            AttributeValue::from(token.epoch().to_string()),
        );
        attributes.insert(
            Attribute::Metadata(META_TOKEN.into()),
            AttributeValue::from(token.to_string()),
        );
        attributes.insert(
            Attribute::Metadata(META_WRITE_ID.into()),
            AttributeValue::from(write_id.to_owned()),
        );
        let header = Bytes::from(header_line(token, Some(write_id)));
        let payload: PutPayload = [header, content].into_iter().collect();
        let mut options = PutOptions::from(mode);
        options.attributes = attributes;
        match self.store.put_opts(location, payload, options).await {
            Ok(result) => Ok(PutOutcome::Done(FenceState {
                token: token.clone(),
                e_tag: result.e_tag,
                version: result.version,
                write_id: Some(write_id.to_owned()),
            })),
            Err(object_store::Error::Precondition { .. })
            | Err(object_store::Error::AlreadyExists { .. }) => Ok(PutOutcome::Refused),
            Err(
                source @ (object_store::Error::NotImplemented { .. }
                | object_store::Error::NotSupported { .. }),
            ) => Err(FenceError::UnsupportedStore {
                store: self.store.to_string(),
                reason: "conditional PUT refused".to_owned(),
                source: Some(source),
            }),
            // Refused before it was applied: the store checks these first.
            Err(
                source @ (object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }
                | object_store::Error::NotFound { .. }),
            ) => Err(store_error(location, source)),
            // Everything else (object_store's `Generic`: transport errors,
            // 5xx, timeouts, and whatever it does not classify) may have
            // been applied.
            Err(source) => Ok(PutOutcome::Unknown(source)),
        }
    }
}

/// An error met after a PUT of the call lost its answer: that PUT may still
/// have landed, so the caller gets [`FenceError::OutcomeUnknown`] instead.
fn after_lost_answer(
    unresolved: Option<Unresolved>,
    location: &Path,
    puts: u32,
    error: FenceError,
) -> FenceError {
    match unresolved {
        None => error,
        Some(lost) => lost.into_error(
            location,
            puts,
            format!("after the lost answer the call failed: {error}"),
        ),
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
