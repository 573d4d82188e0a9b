//! The workspace's guard conformance suite against a database resource
//! (`leasehold::guard::DatabaseGuard`): the same cases fenced files and
//! fenced objects pass.

use std::sync::Mutex;

use leasehold::guard::DatabaseGuard;
use leasehold::{pool::PgPool, FencingToken, LeaseClient};
use leasehold_test_support::guard_conformance::Harness;

use crate::common::*;

/// A database of its own per case.
struct Database {
    db: TestDb,
    pool: PgPool,
    /// Grants are made one at a time (the harness raises counters).
    granting: Mutex<()>,
}

impl Database {
    fn new() -> Self {
        let db = TestDb::new();
        let pool = LeaseClient::connect(&db.url, 8).unwrap().pool().clone();
        Database {
            db,
            pool,
            granting: Mutex::new(()),
        }
    }
}

impl Harness for Database {
    type G = DatabaseGuard;

    fn guard(&self, case: &str) -> DatabaseGuard {
        DatabaseGuard::new(self.pool.clone(), format!("resource-{case}"))
    }

    /// A database guard admits only the epoch of its key's newest grant:
    /// it refuses an epoch the key never reached (G7) and, as stale, one
    /// below its newest grant (G2). Grants skip the counter a release
    /// leaves, so real grants cannot reach every epoch: the key's newest
    /// grant is made `epoch` directly ([`pretend_granted`]); an `epoch` the
    /// key has passed already gives a token that is stale.
    fn token(&self, _case: &str, key: &str, owner: &str, epoch: i64) -> FencingToken {
        let _one_at_a_time = self.granting.lock().unwrap();
        pretend_granted(&mut self.db.conn(), key, epoch);
        FencingToken::new(key, owner, leasehold::Epoch::from(epoch)).unwrap()
    }
}

leasehold_test_support::guard_conformance!(Database::new());
