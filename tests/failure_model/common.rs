//! What every failure-model check shares: its own cluster, waits on
//! observable server state, and readers of the lease and guard tables.

pub use std::io::{BufRead, BufReader, Write};
pub use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
pub use std::time::Duration;

pub use chrono::{DateTime, Utc};
pub use diesel::connection::SimpleConnection;
pub use diesel::prelude::*;
pub use diesel::sql_types::Text;
pub use leasehold::guard::Check;
use leasehold::guard::Fencing;
pub use leasehold::{
    error::{LeaseError, Operation},
    guard::FencedError,
    Acquisition, Epoch, ErrorKind, Lease, LeaseState, Leases, Refusal, Release, Renewal,
};
pub use leasehold_local::{LocalPostgres, StopMode};
pub use leasehold_test_support::{
    query_bool, query_lines, server_now, wait_until_server_time_passes,
};

pub const TTL: Duration = Duration::from_secs(600);

/// Selects the child role of this test binary: a lease holder in its own
/// process (see `holders::holder_process`). The value is the database URL.
pub const HOLDER_ENV: &str = "LEASEHOLD_FAILURE_MODEL_HOLDER";
/// The holder's ttl in milliseconds.
pub const HOLDER_TTL_ENV: &str = "LEASEHOLD_FAILURE_MODEL_HOLDER_TTL_MS";

pub struct Cluster {
    pub pg: LocalPostgres,
}

impl Cluster {
    /// A fresh server with leasehold installed in database `postgres` and a
    /// guarded table `writes`.
    pub fn start(durable: bool) -> Cluster {
        Self::from(LocalPostgres::builder().durable(durable))
    }

    pub fn from(builder: leasehold_local::LocalPostgresBuilder) -> Cluster {
        let pg = builder
            .start()
            .unwrap_or_else(|e| panic!("start a throwaway server: {e}"));
        let cluster = Cluster { pg };
        // A version matrix run (.ci/pg-matrix) must test the major it names.
        leasehold_test_support::server::check_expected_major(&cluster.url());
        let mut conn = cluster.conn();
        leasehold::install(&mut conn).expect("install leasehold");
        conn.batch_execute(
            "CREATE TABLE writes (seq bigserial PRIMARY KEY, owner text NOT NULL, epoch bigint NOT NULL)",
        )
        .expect("create the guarded table");
        cluster
    }

    pub fn url(&self) -> String {
        self.pg.url()
    }

    pub fn conn(&self) -> PgConnection {
        PgConnection::establish(&self.url()).unwrap_or_else(|e| panic!("connect: {e}"))
    }

    pub fn crash_and_recover(&self) {
        self.pg.kill_postmaster().expect("SIGKILL the postmaster");
        self.pg.restart().expect("restart with crash recovery");
    }
}

/// Polls an observable server condition (a boolean query) until it holds.
pub fn wait_for(conn: &mut PgConnection, what: &str, sql: &str) {
    for _ in 0..4_000 {
        if query_bool(conn, sql) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("never observed: {what} ({sql})");
}

/// Waits until backend `pid` polls inside a blocking acquire.
pub fn wait_until_polling(conn: &mut PgConnection, pid: i32) {
    wait_for(
        conn,
        "the waiter polling in lease.acquire",
        &format!(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {pid} AND wait_event = 'PgSleep') AS flag"
        ),
    );
}

pub fn wait_until_backend_gone(conn: &mut PgConnection, pid: i32) {
    wait_for(
        conn,
        "the backend exiting",
        &format!("SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {pid}) AS flag"),
    );
}

pub fn backend_pid(conn: &mut PgConnection) -> i32 {
    query_lines(conn, "SELECT pg_backend_pid()::text AS line")[0]
        .parse()
        .expect("pid")
}

/// Every lease row and guard row, exactly: what "nothing changed" compares.
pub fn snapshot(conn: &mut PgConnection) -> Vec<String> {
    let mut rows = query_lines(
        conn,
        "SELECT format('lease %s|%s|%s|%s|%s', key, owner, epoch, expires_at, lapsed_owner) AS line \
         FROM lease.leases ORDER BY key",
    );
    rows.extend(query_lines(
        conn,
        "SELECT format('guard %s|%s|%s', resource, lease_key, accepted_epoch) AS line \
         FROM lease.guards ORDER BY resource",
    ));
    rows.extend(query_lines(
        conn,
        "SELECT format('write %s|%s|%s', seq, owner, epoch) AS line FROM writes ORDER BY seq",
    ));
    rows
}

pub fn granted(acquisition: Acquisition) -> Lease {
    acquisition.granted().expect("expected a grant")
}

pub fn writes(conn: &mut PgConnection) -> Vec<String> {
    query_lines(
        conn,
        "SELECT format('%s@%s', owner, epoch) AS line FROM writes ORDER BY seq",
    )
}

/// A guarded write to resource `r` with the lease's token.
pub fn fenced_write(
    conn: &mut PgConnection,
    lease_token: &leasehold::FencingToken,
    check: Check,
) -> Result<(), FencedError<diesel::result::Error>> {
    let (owner, epoch) = (lease_token.owner().to_owned(), lease_token.epoch());
    conn.run_fenced("r", lease_token, check, |conn| {
        diesel::sql_query("INSERT INTO writes (owner, epoch) VALUES ($1, $2)")
            .bind::<Text, _>(&owner)
            .bind::<diesel::sql_types::BigInt, _>(epoch)
            .execute(conn)
            .map(|_| ())
    })
}

/// Starts a blocking acquire of `k` by `b` on its own connection and
/// returns its backend pid once it polls inside the SQL function.
pub fn blocked_waiter(
    cluster: &Cluster,
    observer: &mut PgConnection,
    setup: &'static str,
) -> (i32, std::thread::JoinHandle<Result<Lease, LeaseError>>) {
    let mut conn = cluster.conn();
    conn.batch_execute(setup).unwrap();
    let pid = backend_pid(&mut conn);
    let waiter =
        std::thread::spawn(move || conn.acquire_waiting("k", "b", TTL, Duration::from_secs(60)));
    wait_until_polling(observer, pid);
    (pid, waiter)
}

/// The diesel error of the old `LeaseError::Database` (the database failed
/// the call otherwise): kind Other, or Unavailable when the connection died.
pub fn database_error(error: &LeaseError) -> Option<&diesel::result::Error> {
    let operation = error.operation()?;
    let fits = matches!(error.kind(), ErrorKind::Other | ErrorKind::Unavailable)
        && error
            .to_string()
            .starts_with(&format!("lease {operation} failed in the database"));
    if !fits {
        return None;
    }
    std::error::Error::source(error)?.downcast_ref::<diesel::result::Error>()
}

/// The old `LeaseError::ReadOnlyServer`: the call the read-only server refused.
pub fn read_only_refusal(error: &LeaseError) -> Option<Operation> {
    let read_only = error.kind() == ErrorKind::Unavailable
        && error.to_string().contains("the server is read-only");
    if read_only {
        error.operation()
    } else {
        None
    }
}

/// The old `LeaseError::Pool`: no connection from the pool in time.
pub fn is_pool_error(error: &LeaseError) -> bool {
    error.kind() == ErrorKind::Unavailable
        && error.operation().is_none()
        && error
            .to_string()
            .starts_with("no database connection available from the pool")
}

/// The old `LeaseError::StaleEpoch`: its resource, presented epoch and the
/// resource's accepted epoch.
pub fn stale_epoch_of(error: &LeaseError) -> Option<(&str, Epoch, Epoch)> {
    match (error.kind(), error.refusal()) {
        (ErrorKind::Fenced, Some(Refusal::StaleEpoch { accepted })) => {
            Some((error.resource()?, error.epoch()?, accepted))
        }
        _ => None,
    }
}

/// The old `LeaseError::LeaseNotHeld`: why the lease is not held.
pub fn not_held_reason(error: &LeaseError) -> Option<Refusal> {
    let not_held = error.kind() == ErrorKind::Fenced
        && error.table().is_none()
        && error.key().is_some()
        && error.owner().is_some()
        && error.epoch().is_some();
    if not_held {
        error.refusal()
    } else {
        None
    }
}
