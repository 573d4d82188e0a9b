//! The lease operations, one SQL function call each, on either face's connection
//! (`sql::execute`), committing or rolling back with the caller's transaction, if any.
//! Time is the server's `clock_timestamp()`; the client's clock is never consulted.

pub(crate) mod epoch;
pub(crate) mod outcome;
pub(crate) mod refusal;
pub(crate) mod token;

use crate::error::Repr;
use chrono::{DateTime, Utc};
use diesel::pg::data_types::PgInterval;
use diesel::pg::sql_types::Record;
use diesel::sql_types::{BigInt, Bool, Interval, Nullable, Text, Timestamptz};
use std::time::Duration;

use crate::error::{LeaseError, Operation};
use crate::lease::epoch::Epoch;
use crate::lease::outcome::{Acquisition, Lease, LeaseState, Refusal, Release, Renewal};
use crate::lease::token::FencingToken;
use crate::sql::decode::Status;
use crate::sql::execute::{get_result, Execute};
use crate::sql::input;
use crate::telemetry;

impl Operation {
    /// `lease.acquire` (also each attempt of a waiter).
    pub const ACQUIRE: Operation = Operation::writes("acquire");
    /// `lease.renew`.
    pub const RENEW: Operation = Operation::writes("renew");
    /// `lease.release`.
    pub const RELEASE: Operation = Operation::writes("release");
    /// `lease.inspect`.
    pub const INSPECT: Operation = Operation::reads("inspect");
}

crate::sql::calls::lease_call! {
    /// `lease.acquire(key, owner, ttl, wait)`.
    AcquireCall { key: &'a str => Text, owner: &'a str => Text, ttl: PgInterval => Interval, wait: PgInterval => Interval }
    sql = "SELECT lease.acquire";
    row = Record<(Bool, Nullable<BigInt>, Nullable<Timestamptz>)>;
    rust = (bool, Option<i64>, Option<DateTime<Utc>>);
}

crate::sql::calls::lease_call! {
    /// `lease.renew(key, owner, epoch, ttl)`.
    RenewCall { key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt, ttl: PgInterval => Interval }
    sql = "SELECT lease.renew";
    row = Record<(Text, Nullable<Timestamptz>)>;
    rust = (String, Option<DateTime<Utc>>);
}

crate::sql::calls::lease_call! {
    /// `lease.release(key, owner, epoch)`.
    ReleaseCall { key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt }
    sql = "SELECT lease.release";
    row = Text;
    rust = String;
}

crate::sql::calls::lease_call! {
    /// `lease.why_refused(key, owner, epoch)`: one row.
    WhyRefusedCall { key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt }
    sql = "SELECT status, reason, newest_epoch FROM lease.why_refused";
    row = (Text, Text, Nullable<BigInt>);
    rust = (String, String, Option<i64>);
}

crate::sql::calls::lease_call! {
    /// `lease.key_state(key)`: no row for a never-seen key.
    KeyStateCall { key: &'a str => Text }
    sql = "SELECT lease.key_state";
    row = Record<(Text, Nullable<Text>, BigInt, Nullable<Timestamptz>, Nullable<Text>)>;
    rust = (String, Option<String>, i64, Option<DateTime<Utc>>, Option<String>);
}

/// The connection's `Leases::acquire`.
pub(crate) async fn acquire(
    conn: &mut impl Execute,
    key: &str,
    owner: &str,
    ttl: Duration,
) -> Result<Acquisition, LeaseError> {
    acquire_call(conn, key, owner, ttl, Duration::ZERO).await
}

/// The connection's `Leases::acquire_waiting`.
pub(crate) async fn acquire_waiting(
    conn: &mut impl Execute,
    key: &str,
    owner: &str,
    ttl: Duration,
    wait: Duration,
) -> Result<Lease, LeaseError> {
    match acquire_call(conn, key, owner, ttl, wait).await? {
        Acquisition::Granted(lease) => Ok(lease),
        // A zero wait denies like `acquire`; here the caller asked for an error.
        Acquisition::Denied => Err(LeaseError::from(Repr::TimedOut {
            operation: Operation::ACQUIRE,
            key: key.to_owned(),
            waited: wait,
        })),
    }
}

async fn acquire_call(
    conn: &mut impl Execute,
    key: &str,
    owner: &str,
    ttl: Duration,
    wait: Duration,
) -> Result<Acquisition, LeaseError> {
    telemetry::lease_call(Operation::ACQUIRE, key, owner, None, async move {
        check_text("key", key)?;
        check_text("owner", owner)?;
        let ttl_interval = interval("ttl", ttl)?;
        let wait_interval = interval("wait", wait)?;
        let autocommit = conn.in_autocommit();
        let call = AcquireCall {
            key,
            owner,
            ttl: ttl_interval,
            wait: wait_interval,
            _borrow: std::marker::PhantomData,
        };
        let (acquired, epoch, expires_at) = get_result(conn, call).await.map_err(|error| {
            LeaseError::from_diesel(Operation::ACQUIRE, error, key, wait, autocommit)
        })?;
        match (acquired, epoch, expires_at) {
            (true, Some(epoch), Some(expires_at)) => Ok(Acquisition::Granted(Lease {
                token: FencingToken::from_grant(key, owner, epoch),
                expires_at,
                ttl,
            })),
            _ => Ok(Acquisition::Denied),
        }
    })
    .await
}

/// The connection's `Leases::renew`.
pub(crate) async fn renew(
    conn: &mut impl Execute,
    grant: &FencingToken,
    ttl: Duration,
) -> Result<Renewal, LeaseError> {
    let (key, owner, epoch) = (grant.key(), grant.owner(), grant.epoch().get());
    telemetry::lease_call(Operation::RENEW, key, owner, Some(epoch), async move {
        check_text("key", key)?;
        check_text("owner", owner)?;
        let ttl_interval = interval("ttl", ttl)?;
        let autocommit = conn.in_autocommit();
        let call = RenewCall {
            key,
            owner,
            epoch,
            ttl: ttl_interval,
            _borrow: std::marker::PhantomData,
        };
        let (status, expires_at) = get_result(conn, call).await.map_err(|error| {
            LeaseError::from_diesel(Operation::RENEW, error, key, Duration::ZERO, autocommit)
        })?;
        match (
            refusal(conn, Operation::RENEW, (key, owner, epoch), &status).await?,
            expires_at,
        ) {
            (None, Some(expires_at)) => Ok(Renewal::Renewed { expires_at }),
            (Some(refusal), _) => Ok(Renewal::Refused(refusal)),
            (None, None) => Err(unexpected(Operation::RENEW, "ok without an expiry")),
        }
    })
    .await
}

/// The connection's `Leases::release`.
pub(crate) async fn release(
    conn: &mut impl Execute,
    grant: &FencingToken,
) -> Result<Release, LeaseError> {
    let (key, owner, epoch) = (grant.key(), grant.owner(), grant.epoch().get());
    telemetry::lease_call(Operation::RELEASE, key, owner, Some(epoch), async move {
        check_text("key", key)?;
        check_text("owner", owner)?;
        let autocommit = conn.in_autocommit();
        let call = ReleaseCall {
            key,
            owner,
            epoch,
            _borrow: std::marker::PhantomData,
        };
        let status = get_result(conn, call).await.map_err(|error| {
            LeaseError::from_diesel(Operation::RELEASE, error, key, Duration::ZERO, autocommit)
        })?;
        match refusal(conn, Operation::RELEASE, (key, owner, epoch), &status).await? {
            None => Ok(Release::Released),
            Some(refusal) => Ok(Release::Refused(refusal)),
        }
    })
    .await
}

/// The connection's `Leases::inspect`.
pub(crate) async fn inspect(
    conn: &mut impl Execute,
    key: &str,
) -> Result<Option<LeaseState>, LeaseError> {
    telemetry::lease_call(Operation::INSPECT, key, "", None, async move {
        check_text("key", key)?;
        let call = KeyStateCall {
            key,
            _borrow: std::marker::PhantomData,
        };
        let autocommit = conn.in_autocommit();
        let row = conn
            .load(call)
            .await
            .map_err(|error| {
                LeaseError::from_diesel(Operation::INSPECT, error, key, Duration::ZERO, autocommit)
            })?
            .into_iter()
            .next();
        row.map(|(state, owner, epoch, expires_at, ended)| {
            let epoch = Epoch::new(epoch);
            match (state.as_str(), owner, expires_at) {
                ("held", Some(owner), Some(expires_at)) => Ok(LeaseState::Held {
                    owner,
                    epoch,
                    expires_at,
                }),
                ("lapsed", Some(owner), Some(expired_at)) => Ok(LeaseState::Lapsed {
                    owner,
                    epoch,
                    expired_at,
                }),
                ("free", None, None) => Ok(LeaseState::Free {
                    epoch,
                    force_released: ended.as_deref() == Some("force_released"),
                }),
                _ => Err(unexpected(Operation::INSPECT, &state)),
            }
        })
        .transpose()
    })
    .await
}

/// The refusal a renew or release status names (`None` for `ok`), refined by
/// `lease.why_refused`, asked on the same connection only on a refusal.
pub(crate) async fn refusal(
    conn: &mut impl Execute,
    operation: Operation,
    (key, owner, epoch): (&str, &str, i64),
    status: &str,
) -> Result<Option<Refusal>, LeaseError> {
    let status = Status::parse(status).ok_or_else(|| unexpected(operation, status))?;
    if status == Status::Ok {
        return Ok(None);
    }
    let autocommit = conn.in_autocommit();
    let call = WhyRefusedCall {
        key,
        owner,
        epoch,
        _borrow: std::marker::PhantomData,
    };
    let (now, reason, newest) = get_result(conn, call).await.map_err(|error| {
        LeaseError::from_diesel(operation, error, key, Duration::ZERO, autocommit)
    })?;
    // A change committed since makes the later answer the truer one.
    let now = Status::parse(&now)
        .filter(|now| *now != Status::Ok)
        .unwrap_or(status);
    Ok(Refusal::from_answer(now, Some(&reason), newest, epoch))
}

/// The refusal a status alone names (a heartbeat group's renew).
pub(crate) fn status_refusal(
    operation: Operation,
    status: &str,
) -> Result<Option<Refusal>, LeaseError> {
    let parsed = Status::parse(status).ok_or_else(|| unexpected(operation, status))?;
    Ok(Refusal::from_answer(parsed, None, None, 0))
}

/// An answer this client cannot read: the installed SQL is newer than it.
pub(crate) fn unexpected(operation: Operation, answer: &str) -> LeaseError {
    LeaseError::from(Repr::Database {
        operation,
        source: diesel::result::Error::DeserializationError(
            format!("unexpected lease {operation} answer {answer:?}: the installed SQL is newer than this client").into(),
        ),
    })
}

/// Checks text for what PostgreSQL cannot store.
pub(crate) fn check_text(field: &str, value: &str) -> Result<(), LeaseError> {
    input::text(field, value).map_err(LeaseError::invalid)
}

/// Converts a duration to an interval (see [`input::interval`]).
pub(crate) fn interval(
    field: &str,
    duration: Duration,
) -> Result<diesel::pg::data_types::PgInterval, LeaseError> {
    input::interval(field, duration).map_err(LeaseError::invalid)
}

impl Lease {
    /// Records a renewal's expiry (either face's; `renew_async` is in `aio`).
    pub(crate) fn renewed(
        &mut self,
        renewal: Result<Renewal, LeaseError>,
    ) -> Result<Renewal, LeaseError> {
        let renewal = renewal?;
        if let Renewal::Renewed { expires_at } = renewal {
            self.expires_at = expires_at;
        }
        Ok(renewal)
    }
}
