//! The workspace's guard conformance suite against fenced objects: the same
//! cases database resources and fenced files pass, on an in-memory store
//! and, with feature `s3`, on a real S3-compatible server (moto with its
//! requests serialised, so that its conditional PUT is atomic; see
//! `s3_moto.rs`).

use std::sync::Arc;

use leasehold::FencingToken;
use leasehold_object_store::object_store::memory::InMemory;
use leasehold_object_store::object_store::path::Path;
use leasehold_object_store::{FencedStore, ObjectGuard};
use leasehold_test_support::guard_conformance::Harness;

/// One fenced store per case; each case's object a path of its own.
struct Objects {
    store: Arc<FencedStore>,
    /// The server behind the store, if any: kept running while a case
    /// uses it, stopped when the last one is done.
    _server: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl Harness for Objects {
    type G = ObjectGuard;

    fn guard(&self, case: &str) -> ObjectGuard {
        ObjectGuard::new(self.store.clone(), Path::from(format!("contract/{case}")))
    }

    fn token(&self, _case: &str, key: &str, owner: &str, epoch: i64) -> FencingToken {
        FencingToken::new(key, owner, leasehold::Epoch::from(epoch)).unwrap()
    }
}

mod in_memory {
    use super::*;

    fn objects() -> Objects {
        Objects {
            store: Arc::new(FencedStore::new(Arc::new(InMemory::new())).unwrap()),
            _server: None,
        }
    }

    leasehold_test_support::guard_conformance!(objects());
}

#[cfg(feature = "s3")]
mod s3 {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Mutex, Weak};

    use leasehold_object_store::object_store::aws::AmazonS3Builder;
    use leasehold_test_support::moto::{self, MotoServer};

    use super::*;

    fn objects() -> Objects {
        static SHARED: Mutex<Weak<MotoServer>> = Mutex::new(Weak::new());
        static BUCKETS: AtomicUsize = AtomicUsize::new(0);
        let moto = {
            let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
            match slot.upgrade() {
                Some(moto) => moto,
                None => {
                    let moto = Arc::new(
                        MotoServer::start_serialized().unwrap_or_else(|why| panic!("{why}")),
                    );
                    *slot = Arc::downgrade(&moto);
                    moto
                }
            }
        };
        let bucket = format!(
            "contract-{}-{}",
            std::process::id(),
            BUCKETS.fetch_add(1, Ordering::Relaxed)
        );
        moto.create_bucket(&bucket)
            .unwrap_or_else(|e| panic!("{e}"));
        let builder = AmazonS3Builder::new()
            .with_endpoint(moto.endpoint())
            .with_allow_http(true)
            .with_bucket_name(&bucket)
            .with_region(moto::REGION)
            .with_access_key_id(moto::ACCESS_KEY_ID)
            .with_secret_access_key(moto::SECRET_ACCESS_KEY);
        Objects {
            store: Arc::new(FencedStore::s3(builder).unwrap()),
            _server: Some(moto),
        }
    }

    leasehold_test_support::guard_conformance!(objects());
}
