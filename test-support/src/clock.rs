//! The server's clock, which alone decides lease expiry: tests synchronise
//! on it rather than on this process's clock or on sleeps.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::Timestamptz;

/// How often [`wait_until_server_time_passes`] reads the clock at the most
/// before giving up: at up to 50 ms a read, far longer than any test waits.
const MAX_CLOCK_READS: usize = 10_000;

#[derive(QueryableByName)]
struct Now {
    #[diesel(sql_type = Timestamptz)]
    now: DateTime<Utc>,
}

/// The server's current time (`clock_timestamp()`, which advances within a
/// transaction, unlike `now()`), or the error reading it; for callers that
/// expect the server to go away (crash tests).
pub fn try_server_now(conn: &mut PgConnection) -> QueryResult<DateTime<Utc>> {
    diesel::sql_query("SELECT clock_timestamp() AS now")
        .get_result::<Now>(conn)
        .map(|row| row.now)
}

/// The server's current time; panics if it cannot be read.
pub fn server_now(conn: &mut PgConnection) -> DateTime<Utc> {
    try_server_now(conn).unwrap_or_else(|error| panic!("read the server clock: {error}"))
}

/// Blocks until the *server's* clock is past `instant`: expiry is decided by
/// the server clock alone, so that is the state to synchronise on. Sleeps
/// for the remaining time (at most 50 ms at a time) between reads.
pub fn wait_until_server_time_passes(conn: &mut PgConnection, instant: DateTime<Utc>) {
    for _ in 0..MAX_CLOCK_READS {
        let now = server_now(conn);
        if now > instant {
            return;
        }
        let remaining = (instant - now).to_std().unwrap_or_default();
        std::thread::sleep(remaining.min(Duration::from_millis(50)) + Duration::from_micros(100));
    }
    panic!("server clock never passed {instant}");
}
