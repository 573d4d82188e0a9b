//! Checks before a call is sent, for what cannot even be encoded; the server
//! validates everything again.

use std::time::Duration;

use diesel::pg::data_types::PgInterval;

/// PostgreSQL text cannot hold NUL; `Err` names the violation.
pub(crate) fn text(field: &str, value: &str) -> Result<(), String> {
    if value.contains('\0') {
        return Err(format!("{field} must not contain NUL characters"));
    }
    Ok(())
}

/// `duration` as whole microseconds, rounded up so it never becomes zero.
pub(crate) fn interval(field: &str, duration: Duration) -> Result<PgInterval, String> {
    let micros = duration.as_nanos().div_ceil(1_000);
    i64::try_from(micros)
        .map(PgInterval::from_microseconds)
        .map_err(|_| format!("{field} must be at most 100 years"))
}
