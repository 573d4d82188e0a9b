//! The workspace's guard conformance suite against fenced files: the same
//! cases the database guard and the object-store guard pass.

mod common;

use std::path::PathBuf;

use leasehold::FencingToken;
use leasehold_fs::FencedFile;
use leasehold_test_support::guard_conformance::Harness;

/// Each case in a scratch directory of its own.
struct Files {
    dir: PathBuf,
}

impl Files {
    fn new() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Files {
            dir: common::scratch(&format!("contract-{n}")),
        }
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Harness for Files {
    type G = FencedFile;

    fn guard(&self, case: &str) -> FencedFile {
        FencedFile::new(self.dir.join(case)).unwrap()
    }

    fn token(&self, _case: &str, key: &str, owner: &str, epoch: i64) -> FencingToken {
        FencingToken::new(key, owner, leasehold::Epoch::from(epoch)).unwrap()
    }
}

leasehold_test_support::guard_conformance!(Files::new());
