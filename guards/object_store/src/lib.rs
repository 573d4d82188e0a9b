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
//! use leasehold::{Epoch, FencingToken};
//! use leasehold_object_store::object_store::{memory::InMemory, path::Path};
//! use leasehold_object_store::{FenceError, FencedStore};
//! use std::sync::Arc;
//!
//! let store = FencedStore::new(Arc::new(InMemory::new()))?;
//! let path = Path::from("jobs/42/output.json");
//! let old = FencingToken::new("job-42", "worker-a", Epoch::new(1))?;
//! let new = FencingToken::new("job-42", "worker-b", Epoch::new(2))?;
//!
//! store.write(&path, &new, "from b")?;
//! let refused = store.write(&path, &old, "from a, too late");
//! assert!(matches!(refused, Err(FenceError::StaleEpoch { presented: Epoch(1), accepted: Epoch(2), .. })));
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
//!   ([`PutMode::Update`](object_store::PutMode::Update)), or `If-None-Match: *` ([`PutMode::Create`](object_store::PutMode::Create)) when
//!   the object does not exist yet. A lost race re-reads and re-checks,
//!   a bounded number of times ([`FencedStore::with_max_attempts`]). So no
//!   write can overwrite a state it did not check, and a lower epoch can never
//!   land after a higher one.
//! * **G6** A write is reported refused ([`FenceError::StaleEpoch`],
//!   [`FenceError::Contended`]) only when the store's answers prove none of
//!   its PUTs was applied. When an answer is lost the call settles it by
//!   re-reading, and if that cannot settle it, says so with
//!   [`FenceError::OutcomeUnknown`] (see "Lost answers").
//! * **G5** A token for a different lease key gets
//!   [`FenceError::WrongLeaseKey`]: that is a wiring mistake, not a lost
//!   race, and it is reported as such.
//!
//! # Lost answers
//!
//! A conditional PUT can be applied by the store while its answer is lost:
//! the connection drops, a proxy or load balancer answers 5xx, S3 answers
//! 503 or 500 after committing, the request times out. If the client then
//! re-sends the same PUT, the re-send meets the version the first one
//! created and gets 412, which reads exactly like "another writer got there
//! first": the caller would be told its write did not happen when it did,
//! or the adapter would write a second time.
//!
//! So the adapter owns that decision. Every PUT carries a fresh random
//! *write id* ([`META_WRITE_ID`], also on the first body line). After a
//! lost answer the call re-reads the object:
//!
//! * it carries the write id of one of the call's PUTs: the write landed,
//!   and the call returns its [`WriteReceipt`], naming the version it
//!   really replaced;
//! * it is still exactly the version the PUT was conditioned on (ETag,
//!   version id and write id): nothing landed yet, and the call re-sends
//!   on that same version (at most [`UNKNOWN_OUTCOME_RETRIES`] times). A
//!   late first PUT and the re-send cannot both land: they have the same
//!   condition;
//! * anything else: another write replaced that version, and ours may have
//!   landed before it or never. The call returns
//!   [`FenceError::OutcomeUnknown`], never `StaleEpoch`, even if the object
//!   now carries a higher epoch (ours may have landed before that epoch
//!   did). The error lists the lost PUTs' write ids.
//!
//! A PUT answer counts as lost unless it is a success, a precondition
//! refusal (412, or 409 for a create), "not implemented/supported", or a
//! permission, authentication or not-found refusal: object_store reports
//! transport errors, timeouts and 5xx as one `Generic` error, so all of
//! them are settled by re-reading.
//!
//! **The client must not retry conditional PUTs itself.** object_store's
//! default [`RetryConfig`](https://docs.rs/object_store/0.14/object_store/struct.RetryConfig.html)
//! re-sends a PUT after a 5xx or a dropped connection (it takes a
//! connection closed before the answer for "not sent"), which turns a
//! write that landed into a 412 before the adapter sees anything.
//! [`FencedStore::s3`] builds its client with
//! `RetryConfig { max_retries: 0, .. }`. If you build the `AmazonS3` (or
//! another HTTP store) yourself and pass it to [`FencedStore::new`], do the
//! same: `builder.with_retry(RetryConfig { max_retries: 0, ..Default::default() })`.
//! `FencedStore::new` cannot check this: the retry configuration is not
//! visible through `ObjectStore`, and the construction probe only sees
//! answers, which look the same either way. With retries left on, the
//! adapter is still safe in the fencing sense (no stale epoch lands after a
//! higher one), but a write that landed can be reported as `StaleEpoch` or
//! `Contended`, or be applied twice.
//!
//! # Stored layout
//!
//! The bytes stored for a fenced object are one header line, the text form
//! of the token that last wrote it and the write id of that PUT
//! (`lh1.<epoch>.<key>.<owner> <write id>\n`), followed by the content.
//! Read it back with [`FencedStore::read`] (which strips and verifies the
//! header), or by hand by skipping the first line. Objects written before
//! write ids existed (`lh1.<epoch>.<key>.<owner>\n`, no write id metadata)
//! are still read and overwritten normally.
//!
//! Why the header: S3 (and MinIO, moto, ...) derive the ETag from the body
//! bytes only, not from metadata. Without the header, an operator
//! [`FencedStore::admit`] (same content, higher epoch) would keep the ETag, and
//! a stale writer that had read the object before the fence would pass its
//! `If-Match` and land its lower epoch after the higher one (an ABA). With the
//! token in the body, two states with the same ETag have the same epoch and
//! key, so an ETag match really means "nothing relevant changed". With the
//! write id in it too, no two PUTs of the adapter produce the same bytes,
//! so an ETag names exactly one write.
//!
//! # Limits
//!
//! The fence record is user metadata, and S3 allows 2 KB of it per object
//! (names and values together). A token whose text form (percent-encoded
//! key and owner, see [`FencingToken`]) is longer than
//! [`S3_MAX_TOKEN_TEXT`] (1791 bytes) is refused on S3 with
//! [`FenceError::TokenTooLong`] before any request: leasehold's keys may be
//! up to 16 KiB, but on S3 key plus owner must stay within about 1766
//! bytes once encoded. `InMemory` has no limit. The limit is set by
//! [`FencedStore::s3`], and by [`FencedStore::new`] for a store whose
//! `Display` names `AmazonS3`; set it for other stores with
//! [`FencedStore::with_max_token_text`].
//!
//! # Assumptions
//!
//! * The store's conditional PUT is linearizable per object: of two PUTs
//!   conditioned on the same version, at most one succeeds, and a successful
//!   PUT is visible to every later read (S3 has been strongly consistent
//!   since 2020; `InMemory` trivially is). The construction probe races two
//!   such PUTs of [`PROBE_RACE_BODY_BYTES`] a few times
//!   ([`PROBE_RACE_ROUNDS`]) and refuses a store where both succeed (moto
//!   as shipped, for one). A race that happens not to overlap proves
//!   nothing, so passing the probe is evidence, not proof.
//! * The store honours `If-None-Match: *` and `If-Match`. For S3 this means
//!   conditional put is enabled on the client,
//!   `AmazonS3Builder::with_conditional_put(S3ConditionalPut::ETagMatch)`
//!   (the default in object_store 0.14; [`FencedStore::s3`] sets it
//!   explicitly). [`FencedStore::new`] checks all this with a probe and
//!   refuses stores that fail it, e.g. `LocalFileSystem`, which implements
//!   neither conditional updates nor user metadata.
//! * The client does not re-send conditional PUTs on its own (see "Lost
//!   answers").
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
//!   Without it only the core (and any [`ObjectStore`](object_store::ObjectStore) you construct
//!   yourself, e.g. `InMemory`) is available.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod error;
mod guard;
mod limits;
mod outcome;
mod probe;
mod record;
mod runtime;
mod store;

pub use error::FenceError;
pub use guard::{ObjectGuard, FENCE_OWNER};
pub use limits::{S3_MAX_TOKEN_TEXT, S3_USER_METADATA_BYTES};
pub use probe::{PROBE_RACERS, PROBE_RACE_BODY_BYTES, PROBE_RACE_ROUNDS};
pub use record::FenceState;
pub use store::{FencedObject, FencedStore, WriteReceipt};

pub use leasehold::guard::GuardRecord;
pub use leasehold::{Epoch, FencingToken};
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

/// User-metadata name of the write id: a fresh random id per PUT (also on
/// the object's first body line), by which the adapter recognises its own
/// write after the store's answer was lost.
pub const META_WRITE_ID: &str = "leasehold-write";

/// Default bound on compare-and-swap attempts per call.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 64;

/// How many times one call re-sends a conditional PUT after answers were
/// lost, each time only after a re-read showed the object still exactly at
/// the version the lost PUT was conditioned on. Then the call answers
/// [`FenceError::OutcomeUnknown`].
pub const UNKNOWN_OUTCOME_RETRIES: u32 = 3;
