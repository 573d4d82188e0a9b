//! Checks made before a call is sent. The server validates everything
//! again; these cover what cannot even be encoded for it, and say so in the
//! same terms as its own validation.

use std::time::Duration;

use diesel::pg::data_types::PgInterval;

/// PostgreSQL text cannot hold NUL; `Err` names the violation.
pub(crate) fn text(field: &str, value: &str) -> Result<(), String> {
    if value.contains('\0') {
        return Err(format!("{field} must not contain NUL characters"));
    }
    Ok(())
}

/// A duration as an interval of whole microseconds, rounding up so that a
/// positive duration never becomes a zero interval. `Err` names the
/// violation when it does not fit.
pub(crate) fn interval(field: &str, duration: Duration) -> Result<PgInterval, String> {
    let micros = duration.as_nanos().div_ceil(1_000);
    i64::try_from(micros)
        .map(PgInterval::from_microseconds)
        .map_err(|_| format!("{field} must be at most 100 years"))
}
