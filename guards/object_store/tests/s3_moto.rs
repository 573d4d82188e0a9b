//! The guard suite against a real S3-compatible server: `moto_server`,
//! started on loopback by these tests and killed when the last test using it
//! is done.
//!
//! Needs `pip install 'moto[server]'`. Without `moto_server` on PATH these
//! tests fail (they do not skip silently) unless `LEASEHOLD_SKIP_S3=1`.

#![cfg(feature = "s3")]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use leasehold_object_store::object_store::aws::AmazonS3Builder;
use leasehold_object_store::object_store::path::Path;
use leasehold_object_store::FencedStore;
use leasehold_test_support::moto::{self, MotoServer};

/// One server shared by the tests that run concurrently; started again if
/// all previous users are gone.
fn shared_moto() -> Arc<MotoServer> {
    static SHARED: Mutex<Weak<MotoServer>> = Mutex::new(Weak::new());
    let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(moto) = slot.upgrade() {
        return moto;
    }
    let moto = Arc::new(MotoServer::start().unwrap_or_else(|why| panic!("{why}")));
    *slot = Arc::downgrade(&moto);
    moto
}

/// A builder for `bucket`, created on `moto` first.
fn s3_builder(moto: &MotoServer, bucket: &str) -> AmazonS3Builder {
    moto.create_bucket(bucket).unwrap_or_else(|e| panic!("{e}"));
    AmazonS3Builder::new()
        .with_endpoint(moto.endpoint())
        .with_allow_http(true)
        .with_bucket_name(bucket)
        .with_region(moto::REGION)
        .with_access_key_id(moto::ACCESS_KEY_ID)
        .with_secret_access_key(moto::SECRET_ACCESS_KEY)
}

/// A fenced store on a fresh bucket, or `None` when S3 tests are skipped.
fn fenced() -> Option<(FencedStore, Arc<MotoServer>)> {
    if std::env::var("LEASEHOLD_SKIP_S3").as_deref() == Ok("1") {
        eprintln!("LEASEHOLD_SKIP_S3=1: skipping S3 test");
        return None;
    }
    static BUCKETS: AtomicUsize = AtomicUsize::new(0);
    let moto = shared_moto();
    let bucket = format!(
        "leasehold-{}-{}",
        std::process::id(),
        BUCKETS.fetch_add(1, Ordering::Relaxed)
    );
    let builder = s3_builder(&moto, &bucket);
    Some((FencedStore::s3(builder).unwrap(), moto))
}

#[test]
fn s3_stale_epoch_is_rejected_and_object_untouched() {
    let Some((store, _moto)) = fenced() else {
        return;
    };
    common::stale_epoch_is_rejected_and_object_untouched(&store, &Path::from("o"));
}

#[test]
fn s3_equal_and_higher_epochs_are_admitted() {
    let Some((store, _moto)) = fenced() else {
        return;
    };
    common::equal_and_higher_epochs_are_admitted(&store, &Path::from("o"));
}

#[test]
fn s3_wrong_lease_key_is_rejected() {
    let Some((store, _moto)) = fenced() else {
        return;
    };
    common::wrong_lease_key_is_rejected(&store, &Path::from("o"));
}

#[test]
fn s3_admit_raises_the_floor_without_changing_content() {
    let Some((store, _moto)) = fenced() else {
        return;
    };
    common::admit_raises_the_floor_without_changing_content(&store, &Path::from("o"));
}

#[test]
fn s3_fence_record_round_trips_as_object_metadata() {
    let Some((store, _moto)) = fenced() else {
        return;
    };
    common::fence_record_round_trips_as_object_metadata(&store, &Path::from("o"));
}

#[test]
fn s3_racing_writers_never_lose_updates_or_go_back() {
    let Some((store, _moto)) = fenced() else {
        return;
    };
    let store = Arc::new(store.with_max_attempts(10_000));
    common::racing_writers_never_lose_updates_or_go_back(store, &Path::from("race"), 8, 8);
}

#[test]
fn s3_without_conditional_put_is_refused_at_construction() {
    let Some((_store, moto)) = fenced() else {
        return;
    };
    let plain = s3_builder(&moto, "leasehold-plain")
        .with_conditional_put(leasehold_object_store::object_store::aws::S3ConditionalPut::Disabled)
        .build()
        .unwrap();
    let err = FencedStore::new(Arc::new(plain)).unwrap_err();
    assert!(
        matches!(
            err,
            leasehold_object_store::FenceError::UnsupportedStore { .. }
        ),
        "{err:?}"
    );
}
