//! The workspace's guard conformance suite against a database resource
//! (`leasehold::guard::DatabaseGuard`): the same cases fenced files and
//! fenced objects pass.

use std::sync::Mutex;

use leasehold::guard::DatabaseGuard;
use leasehold::{pool::PgPool, FencingToken, LeaseClient, LeaseState, Leases, Release};
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

    /// A database guard refuses an epoch its key never reached (G7), so
    /// the key is granted and released until its counter reaches `epoch`.
    fn token(&self, _case: &str, key: &str, owner: &str, epoch: i64) -> FencingToken {
        let _one_at_a_time = self.granting.lock().unwrap();
        let mut conn = self.db.conn();
        loop {
            let counter = match conn.inspect(key).unwrap() {
                Some(state) => state.epoch(),
                None => 0.into(),
            };
            if counter >= epoch {
                break;
            }
            let lease = granted(conn.acquire(key, "harness", TTL).unwrap());
            assert_eq!(
                conn.release(&leasehold_test_support::grant(
                    key,
                    "harness",
                    lease.epoch()
                ))
                .unwrap(),
                Release::Released
            );
        }
        assert!(!matches!(
            conn.inspect(key).unwrap(),
            Some(LeaseState::Held { .. })
        ));
        FencingToken::new(key, owner, leasehold::Epoch::from(epoch)).unwrap()
    }
}

leasehold_test_support::guard_conformance!(Database::new());
