//! The database guard: per resource, the highest epoch
//! admitted, refusing lower ones so a stalled, superseded holder cannot write after
//! its successor. Calls run in the caller's transaction so admission and writes
//! commit together, a refusal aborts it, and the locked guard row
//! serialises writers. [`Check`] picks the strength.

use diesel::pg::data_types::PgInterval;
use diesel::sql_types::{BigInt, Bool, Interval, Text, Timestamptz};
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::pg::PgConnection;
use diesel::result::Error as DieselError;
use diesel::Connection;

use crate::error::{LeaseError, Operation};
use crate::lease::epoch::Epoch;
use crate::lease::token::FencingToken;
use crate::server_error::GuardContext;
use crate::sql::execute::{get_result, Execute};
use crate::sql::input;
use crate::telemetry;

impl Operation {
    /// `lease.admit`: a token-checked guard.
    pub const ADMIT: Operation = Operation::writes("admit");
    /// `lease.check_held`: the lease is held right now.
    pub const CHECK_HELD: Operation = Operation::writes("check_held");
    /// `lease.admit_held`: admit, checking the lease is held.
    pub const ADMIT_HELD: Operation = Operation::writes("admit_held");
    /// `lease.renew_admit`: renew and admit together.
    pub const RENEW_AND_ADMIT: Operation = Operation::writes("renew_admit");
    /// `lease.fence`: raise a resource's record by hand.
    pub const FENCE: Operation = Operation::writes("fence");
    /// `lease.inspect_guard`.
    pub const INSPECT_GUARD: Operation = Operation::reads("inspect_guard");
}

crate::sql::calls::lease_call! {
    /// `lease.admit(resource, key, epoch)`.
    AdmitCall { resource: &'a str => Text, key: &'a str => Text, epoch: i64 => BigInt }
    sql = "SELECT true AS admitted FROM lease.admit";
    row = Bool;
    rust = bool;
}

crate::sql::calls::lease_call! {
    /// `lease.check_held(key, owner, epoch)`.
    CheckHeldCall { key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt }
    sql = "SELECT lease.check_held";
    row = Timestamptz;
    rust = DateTime<Utc>;
}

crate::sql::calls::lease_call! {
    /// `lease.admit_held(resource, key, owner, epoch)`.
    AdmitHeldCall { resource: &'a str => Text, key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt }
    sql = "SELECT lease.admit_held";
    row = Timestamptz;
    rust = DateTime<Utc>;
}

crate::sql::calls::lease_call! {
    /// `lease.renew_admit(resource, key, owner, epoch, ttl)`.
    RenewAdmitCall { resource: &'a str => Text, key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt, ttl: PgInterval => Interval }
    sql = "SELECT lease.renew_admit";
    row = Timestamptz;
    rust = DateTime<Utc>;
}

crate::sql::calls::lease_call! {
    /// `lease.fence(resource, key, up_to)`.
    FenceCall { resource: &'a str => Text, key: &'a str => Text, up_to: i64 => BigInt }
    sql = "SELECT lease.fence";
    row = BigInt;
    rust = i64;
}

crate::sql::calls::lease_call! {
    /// `lease.inspect_guard(resource)`.
    InspectGuardCall { resource: &'a str => Text }
    sql = "SELECT lease_key, accepted_epoch FROM lease.inspect_guard";
    row = (Text, BigInt);
    rust = (String, i64);
}

crate::sql::calls::admit_then_present! {
    /// `lease.admit(resource, key, epoch)`, then `lease.present`.
    AdmitPresentCall { resource: &'a str => Text, key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt }
    call = "lease.admit"; args = [resource: Text, key: Text, epoch: BigInt]; cast = "::text";
    row = (Text, Text);
    rust = (String, String);
}

crate::sql::calls::admit_then_present! {
    /// `lease.admit_held(resource, key, owner, epoch)`, then `lease.present`.
    AdmitHeldPresentCall { resource: &'a str => Text, key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt }
    call = "lease.admit_held"; args = [resource: Text, key: Text, owner: Text, epoch: BigInt]; cast = "";
    row = (Timestamptz, Text);
    rust = (DateTime<Utc>, String);
}

crate::sql::calls::admit_then_present! {
    /// `lease.renew_admit(resource, key, owner, epoch, ttl)`, then `lease.present`.
    RenewAdmitPresentCall { resource: &'a str => Text, key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt, ttl: PgInterval => Interval }
    call = "lease.renew_admit"; args = [resource: Text, key: Text, owner: Text, epoch: BigInt, ttl: Interval];
    cast = "";
    row = (Timestamptz, Text);
    rust = (DateTime<Utc>, String);
}

/// How strictly `Fencing::run_fenced` checks the writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Check {
    /// Compare the token with the resource's record: an epoch below it, or another
    /// key, is refused.
    Token,
    /// Also require the lease held by the token now, and block takeovers until commit.
    LeaseHeld,
    /// Also renew the lease by this ttl in the same transaction, so the heartbeat
    /// commits only with the write.
    RenewAndAdmit(Duration),
}

/// What every guard (database, file, object) remembers per resource: the fencing
/// key and the lowest epoch admitted (`Guard::record`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardRecord {
    /// The lease key whose epochs fence the resource.
    pub lease_key: String,
    /// The lowest epoch admitted: the highest admitted, or one past a fence, if greater.
    pub accepted_epoch: Epoch,
}

/// Error of `Fencing::run_fenced`; everything was rolled back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FencedError<E> {
    /// The guard refused the write; nothing of it is visible.
    #[error(transparent)]
    Guard(LeaseError),
    /// The caller's closure failed; its writes and the guard record were rolled back.
    #[error("the fenced work failed; it was rolled back")]
    Work(#[source] E),
    /// Beginning or committing failed; only a connection broken mid-commit leaves the
    /// outcome unknown: re-read the resource.
    #[error("the fenced transaction failed; it was rolled back")]
    Transaction(#[source] LeaseError),
}

/// So `?` on the transaction's own statements reads them as leasehold errors.
impl<E> From<DieselError> for FencedError<E> {
    fn from(error: DieselError) -> Self {
        FencedError::Transaction(LeaseError::from(error))
    }
}

impl<E> FencedError<E> {
    /// The guard's refusal, if that is what this is.
    pub fn guard(&self) -> Option<&LeaseError> {
        match self {
            FencedError::Guard(error) => Some(error),
            _ => None,
        }
    }
}

fn context<'a>(
    operation: Operation,
    resource: &'a str,
    token: &'a FencingToken,
) -> GuardContext<'a> {
    GuardContext {
        operation,
        resource,
        key: token.key(),
        owner: token.owner(),
        epoch: token.epoch(),
    }
}

fn check_resource(resource: &str) -> Result<(), LeaseError> {
    input::text("resource", resource).map_err(LeaseError::invalid)
}

/// The connection's `Fencing::admit`.
pub(crate) async fn admit(
    conn: &mut impl Execute,
    resource: &str,
    token: &FencingToken,
) -> Result<(), LeaseError> {
    telemetry::guard_call(
        Operation::ADMIT,
        resource,
        token.key(),
        token.owner(),
        Some(token.epoch().get()),
        async move {
            check_resource(resource)?;
            get_result(
                conn,
                AdmitCall {
                    resource,
                    key: token.key(),
                    epoch: token.epoch().get(),
                    _borrow: std::marker::PhantomData,
                },
            )
            .await
            .map(|_| ())
            .map_err(|error| {
                LeaseError::from_guard_diesel(&context(Operation::ADMIT, resource, token), error)
            })
        },
    )
    .await
}

/// The connection's `Fencing::check_held`.
pub(crate) async fn check_held(
    conn: &mut impl Execute,
    token: &FencingToken,
) -> Result<DateTime<Utc>, LeaseError> {
    telemetry::guard_call(
        Operation::CHECK_HELD,
        "",
        token.key(),
        token.owner(),
        Some(token.epoch().get()),
        async move {
            get_result(
                conn,
                CheckHeldCall {
                    key: token.key(),
                    owner: token.owner(),
                    epoch: token.epoch().get(),
                    _borrow: std::marker::PhantomData,
                },
            )
            .await
            .map_err(|error| {
                LeaseError::from_guard_diesel(&context(Operation::CHECK_HELD, "", token), error)
            })
        },
    )
    .await
}

/// `Fencing::admit` with [`Check::LeaseHeld`].
pub(crate) async fn admit_held(
    conn: &mut impl Execute,
    resource: &str,
    token: &FencingToken,
) -> Result<DateTime<Utc>, LeaseError> {
    telemetry::guard_call(
        Operation::ADMIT_HELD,
        resource,
        token.key(),
        token.owner(),
        Some(token.epoch().get()),
        async move {
            check_resource(resource)?;
            get_result(
                conn,
                AdmitHeldCall {
                    resource,
                    key: token.key(),
                    owner: token.owner(),
                    epoch: token.epoch().get(),
                    _borrow: std::marker::PhantomData,
                },
            )
            .await
            .map_err(|error| {
                LeaseError::from_guard_diesel(
                    &context(Operation::ADMIT_HELD, resource, token),
                    error,
                )
            })
        },
    )
    .await
}

/// `Fencing::admit` with [`Check::RenewAndAdmit`].
pub(crate) async fn renew_and_admit(
    conn: &mut impl Execute,
    resource: &str,
    token: &FencingToken,
    ttl: Duration,
) -> Result<DateTime<Utc>, LeaseError> {
    telemetry::guard_call(
        Operation::RENEW_AND_ADMIT,
        resource,
        token.key(),
        token.owner(),
        Some(token.epoch().get()),
        async move {
            check_resource(resource)?;
            let ttl = input::interval("ttl", ttl).map_err(LeaseError::invalid)?;
            get_result(
                conn,
                RenewAdmitCall {
                    resource,
                    key: token.key(),
                    owner: token.owner(),
                    epoch: token.epoch().get(),
                    ttl,
                    _borrow: std::marker::PhantomData,
                },
            )
            .await
            .map_err(|error| {
                LeaseError::from_guard_diesel(
                    &context(Operation::RENEW_AND_ADMIT, resource, token),
                    error,
                )
            })
        },
    )
    .await
}

/// The connection's `Fencing::fence`.
pub(crate) async fn fence(
    conn: &mut impl Execute,
    resource: &str,
    lease_key: &str,
    up_to: Epoch,
) -> Result<Epoch, LeaseError> {
    let up_to = up_to.get();
    telemetry::guard_call(
        Operation::FENCE,
        resource,
        lease_key,
        "",
        Some(up_to),
        async move {
            check_resource(resource)?;
            get_result(
                conn,
                FenceCall {
                    resource,
                    key: lease_key,
                    up_to,
                    _borrow: std::marker::PhantomData,
                },
            )
            .await
            .map_err(|error| {
                LeaseError::from_guard_diesel(
                    &GuardContext {
                        operation: Operation::FENCE,
                        resource,
                        key: lease_key,
                        owner: "",
                        epoch: Epoch::new(up_to),
                    },
                    error,
                )
            })
        },
    )
    .await
    .map(Epoch::new)
}

/// The connection's `Fencing::inspect_guard`.
pub(crate) async fn inspect_guard(
    conn: &mut impl Execute,
    resource: &str,
) -> Result<Option<GuardRecord>, LeaseError> {
    telemetry::guard_call(
        Operation::INSPECT_GUARD,
        resource,
        "",
        "",
        None,
        async move {
            check_resource(resource)?;
            let rows = conn
                .load(InspectGuardCall {
                    resource,
                    _borrow: std::marker::PhantomData,
                })
                .await
                .map_err(|error| {
                    LeaseError::from_guard_diesel(
                        &GuardContext {
                            operation: Operation::INSPECT_GUARD,
                            resource,
                            key: "",
                            owner: "",
                            epoch: Epoch::new(0),
                        },
                        error,
                    )
                })?;
            Ok(rows
                .into_iter()
                .next()
                .map(|(lease_key, accepted_epoch)| GuardRecord {
                    lease_key,
                    accepted_epoch: Epoch::new(accepted_epoch),
                }))
        },
    )
    .await
}

/// The connection's `Fencing::run_fenced`.
pub(crate) fn run_fenced<T, E, F>(
    conn: &mut PgConnection,
    resource: &str,
    token: &FencingToken,
    check: Check,
    work: F,
) -> Result<T, FencedError<E>>
where
    F: FnOnce(&mut PgConnection) -> Result<T, E>,
{
    conn.transaction(|conn| {
        crate::sql::execute::finish(admit_and_present(conn, resource, token, check))
            .map_err(FencedError::Guard)?;
        work(conn).map_err(FencedError::Work)
    })
}

/// The admission of the strength `check` asks for.
pub(crate) async fn admit_checked(
    conn: &mut impl Execute,
    resource: &str,
    token: &FencingToken,
    check: Check,
) -> Result<Option<DateTime<Utc>>, LeaseError> {
    match check {
        Check::Token => admit(conn, resource, token).await.map(|()| None),
        Check::LeaseHeld => admit_held(conn, resource, token).await.map(Some),
        Check::RenewAndAdmit(ttl) => renew_and_admit(conn, resource, token, ttl).await.map(Some),
    }
}

/// Both faces' `run_fenced` first step: the admission, then the token
/// presented for the closure's writes to fenced tables.
pub(crate) async fn admit_and_present(
    conn: &mut impl Execute,
    resource: &str,
    token: &FencingToken,
    check: Check,
) -> Result<(), LeaseError> {
    let operation = match check {
        Check::Token => Operation::ADMIT,
        Check::LeaseHeld => Operation::ADMIT_HELD,
        Check::RenewAndAdmit(_) => Operation::RENEW_AND_ADMIT,
    };
    telemetry::guard_call(
        operation,
        resource,
        token.key(),
        token.owner(),
        Some(token.epoch().get()),
        async move {
            check_resource(resource)?;
            let (key, owner, epoch) = (token.key(), token.owner(), token.epoch().get());
            let _borrow = std::marker::PhantomData;
            let sent = match check {
                Check::Token => get_result(
                    conn,
                    AdmitPresentCall {
                        resource,
                        key,
                        owner,
                        epoch,
                        _borrow,
                    },
                )
                .await
                .map(drop),
                Check::LeaseHeld => get_result(
                    conn,
                    AdmitHeldPresentCall {
                        resource,
                        key,
                        owner,
                        epoch,
                        _borrow,
                    },
                )
                .await
                .map(drop),
                Check::RenewAndAdmit(ttl) => {
                    let ttl = input::interval("ttl", ttl).map_err(LeaseError::invalid)?;
                    get_result(
                        conn,
                        RenewAdmitPresentCall {
                            resource,
                            key,
                            owner,
                            epoch,
                            ttl,
                            _borrow,
                        },
                    )
                    .await
                    .map(drop)
                }
            };
            sent.map_err(|error| {
                LeaseError::from_guard_diesel(&context(operation, resource, token), error)
            })
        },
    )
    .await
}
