//! A primary and a streaming standby on this machine, for the failover
//! tests (docs/SPECIFICATION.md §1.7): the servers come from
//! `leasehold-local` (root-safe, removed on drop or panic), the waits here
//! synchronise on what the servers report (`pg_stat_replication`,
//! `pg_last_wal_replay_lsn()`, `pg_is_in_recovery()`), never on sleeps.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use leasehold_local::{BackupMode, LocalPostgres, LocalPostgresBuilder};

use crate::sql::{query_bool, query_lines};

/// How many times a wait polls (every 5 ms) before it fails the test.
const POLLS: usize = 12_000;

/// A primary with leasehold installed in database `postgres`, and a
/// streaming standby made from a base backup of it.
pub struct ReplicatedPair {
    /// The primary.
    pub primary: LocalPostgres,
    /// The standby (read only until promoted).
    pub standby: LocalPostgres,
}

impl ReplicatedPair {
    /// Starts the pair. With `synchronous`, the primary waits for the
    /// standby's flush on every commit that asks for it
    /// (`synchronous_standby_names = '*'`, `synchronous_commit = on`, which
    /// leasehold's writes raise the session to), and this returns once
    /// `pg_stat_replication` reports the standby as `sync`. Otherwise it
    /// returns once the standby streams. When `LEASEHOLD_TEST_SQL_PATCH`
    /// names a file, its SQL runs on the primary right after the install
    /// (see [`crate::database::apply_sql_patch`]; for the SQL mutation
    /// runner, test-support/mutation/README.md).
    pub fn start(synchronous: bool) -> ReplicatedPair {
        let primary = start(LocalPostgres::builder().durable(false));
        let mut conn = connect(&primary);
        leasehold::install(&mut conn).expect("install leasehold on the primary");
        crate::database::apply_sql_patch(&mut conn);
        crate::coverage::record_everything();
        let standby = start(
            LocalPostgres::builder()
                .durable(false)
                .from_base_backup(&primary, BackupMode::Standby),
        );
        if synchronous {
            // Two statements: ALTER SYSTEM refuses to run in the implicit
            // transaction of a multi-statement query.
            conn.batch_execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                .expect("make the standby synchronous");
            conn.batch_execute("SELECT pg_reload_conf()")
                .expect("reload the primary's configuration");
        }
        let state = if synchronous { "sync" } else { "async" };
        wait_for(
            &mut conn,
            &format!("the standby streaming as {state}"),
            &format!(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_replication \
                 WHERE state = 'streaming' AND sync_state = '{state}') AS flag"
            ),
        );
        let pair = ReplicatedPair { primary, standby };
        pair.wait_caught_up();
        pair
    }

    /// A connection to the primary.
    pub fn primary_conn(&self) -> PgConnection {
        connect(&self.primary)
    }

    /// A connection to the standby (or the promoted server).
    pub fn standby_conn(&self) -> PgConnection {
        connect(&self.standby)
    }

    /// Waits until the standby has replayed everything the primary has
    /// written so far (the primary's current insert position).
    pub fn wait_caught_up(&self) {
        let lsn = wal_insert_lsn(&mut self.primary_conn());
        wait_for(
            &mut self.standby_conn(),
            &format!("the standby replaying up to {lsn}"),
            &format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn AS flag"),
        );
    }
}

/// Starts a server, panicking with the reason.
pub fn start(builder: LocalPostgresBuilder) -> LocalPostgres {
    builder
        .start()
        .unwrap_or_else(|e| panic!("start a throwaway server: {e}"))
}

/// A connection to `server`'s database `postgres`.
pub fn connect(server: &LocalPostgres) -> PgConnection {
    PgConnection::establish(&server.url()).unwrap_or_else(|e| panic!("connect: {e}"))
}

/// The server's current WAL insert position.
pub fn wal_insert_lsn(conn: &mut PgConnection) -> String {
    query_lines(conn, "SELECT pg_current_wal_insert_lsn()::text AS line").remove(0)
}

/// Polls a boolean query (a column named `flag`) until it answers true.
pub fn wait_for(conn: &mut PgConnection, what: &str, sql: &str) {
    for _ in 0..POLLS {
        if query_bool(conn, sql) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("never observed: {what} ({sql})");
}
