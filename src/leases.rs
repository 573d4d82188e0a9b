//! The lease operations: acquire, renew, release, inspect.
//!
//! Each function is one SQL call (one round trip once its statement is
//! prepared on the connection) and takes `&mut PgConnection`, so it runs in
//! whatever transaction the caller has open: an acquire inside the caller's
//! transaction commits or rolls back with it (SPEC §1.5). Outside a
//! transaction each call autocommits.
//!
//! Ordinary outcomes are values, not errors: a key held by someone else is
//! [`Acquisition::Denied`]; a renew or release that finds the lease gone is
//! [`LostLease`]. Errors ([`LeaseError`]) are failures of the call itself.
//!
//! Time is the server's: `expires_at` values are the database clock's
//! `clock_timestamp()` plus the ttl, and the client's clock is never
//! consulted.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::pg::data_types::PgInterval;
use diesel::pg::PgConnection;
use diesel::RunQueryDsl;

use crate::calls::{AcquireCall, InspectCall, ReleaseCall, RenewCall};
use crate::errors::LeaseError;
use crate::token::FencingToken;

/// A grant: exclusive ownership of `key` by `owner` until `expires_at`
/// (server time), fenced by `epoch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    key: String,
    owner: String,
    epoch: i64,
    expires_at: DateTime<Utc>,
}

impl Lease {
    /// The leased key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The owner the grant was made to.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The grant's fencing epoch: present it to guards with every write.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// When the grant lapses unless renewed, on the server's clock.
    pub fn expires_at(&self) -> DateTime<Utc> {
        self.expires_at
    }

    /// The fencing token of this grant, for guards and other services.
    pub fn token(&self) -> FencingToken {
        FencingToken::from_grant(&self.key, &self.owner, self.epoch)
    }
}

/// Outcome of [`acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a denied acquire does not grant the lease"]
pub enum Acquisition {
    /// The caller holds the lease. For a caller that already held it, this is
    /// the same grant (same epoch, same expiry).
    Granted(Lease),
    /// Another owner holds a live grant.
    Denied,
}

impl Acquisition {
    /// The lease, if granted.
    pub fn granted(self) -> Option<Lease> {
        match self {
            Acquisition::Granted(lease) => Some(lease),
            Acquisition::Denied => None,
        }
    }
}

/// Why a renew or release did not apply: the caller no longer holds the grant
/// it presented. Stop acting on the lease at once; re-acquire if needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LostLease {
    /// The key is unknown, free, or held (or last held) by someone else.
    NotOwner,
    /// The caller's grant expired (and may have been taken over).
    Lapsed,
    /// The caller holds the key, but under a different epoch.
    EpochMismatch,
}

impl LostLease {
    /// The SQL status text: `not_owner`, `lapsed` or `epoch_mismatch`.
    pub fn as_status(self) -> &'static str {
        match self {
            LostLease::NotOwner => "not_owner",
            LostLease::Lapsed => "lapsed",
            LostLease::EpochMismatch => "epoch_mismatch",
        }
    }

    fn from_status(status: &str) -> Option<Self> {
        match status {
            "not_owner" => Some(LostLease::NotOwner),
            "lapsed" => Some(LostLease::Lapsed),
            "epoch_mismatch" => Some(LostLease::EpochMismatch),
            _ => None,
        }
    }
}

impl std::fmt::Display for LostLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_status())
    }
}

/// Outcome of [`renew`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a lost lease must stop the holder"]
pub enum Renewal {
    /// Extended; the epoch is unchanged.
    Renewed {
        /// The new expiry, server time.
        expires_at: DateTime<Utc>,
    },
    /// Not extended, and nothing changed.
    Lost(LostLease),
}

/// Outcome of [`release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a lost lease means the release did nothing"]
pub enum Release {
    /// The key is free and its fencing counter moved past the released epoch.
    Released,
    /// Nothing changed.
    Lost(LostLease),
}

/// A key's observable state, as [`inspect`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// A live grant.
    Held {
        /// The holder.
        owner: String,
        /// The grant's epoch.
        epoch: i64,
        /// Server-time expiry.
        expires_at: DateTime<Utc>,
    },
    /// Free or lapsed: nobody holds it and anyone may acquire it.
    Unowned {
        /// The fencing counter: every epoch up to and including this one is
        /// stale, and the next grant is strictly greater.
        epoch: i64,
    },
}

impl LeaseState {
    /// The epoch reported: the holder's, or the counter when unowned.
    pub fn epoch(&self) -> i64 {
        match self {
            LeaseState::Held { epoch, .. } | LeaseState::Unowned { epoch } => *epoch,
        }
    }

    /// Whether a live grant exists.
    pub fn is_held(&self) -> bool {
        matches!(self, LeaseState::Held { .. })
    }
}

/// Tries to acquire `key` for `owner` for `ttl`, without waiting.
///
/// ```no_run
/// # fn demo(conn: &mut diesel::PgConnection) -> Result<(), leasehold::LeaseError> {
/// use std::time::Duration;
/// match leasehold::acquire(conn, "job-42", "worker-a1", Duration::from_secs(30))? {
///     leasehold::Acquisition::Granted(lease) => println!("epoch {}", lease.epoch()),
///     leasehold::Acquisition::Denied => println!("someone else has it"),
/// }
/// # Ok(()) }
/// ```
pub fn acquire(
    conn: &mut PgConnection,
    key: &str,
    owner: &str,
    ttl: Duration,
) -> Result<Acquisition, LeaseError> {
    acquire_call(conn, key, owner, ttl, Duration::ZERO)
}

/// Acquires `key`, letting the database poll (every 50 ms, like the seed) for
/// up to `wait` while another owner holds it.
///
/// This holds a connection and a transaction open for the whole wait; the
/// client-side waiting in [`crate::wait`] needs neither. On timeout returns
/// [`LeaseError::WaitTimedOut`] (SQLSTATE 57014 in SQL).
pub fn acquire_waiting_in_sql(
    conn: &mut PgConnection,
    key: &str,
    owner: &str,
    ttl: Duration,
    wait: Duration,
) -> Result<Lease, LeaseError> {
    match acquire_call(conn, key, owner, ttl, wait)? {
        Acquisition::Granted(lease) => Ok(lease),
        // The SQL function never returns a denial when wait > 0; a zero wait
        // denies like `acquire`, which the caller asked to be an error here.
        Acquisition::Denied => Err(LeaseError::WaitTimedOut {
            key: key.to_owned(),
            wait,
        }),
    }
}

fn acquire_call(
    conn: &mut PgConnection,
    key: &str,
    owner: &str,
    ttl: Duration,
    wait: Duration,
) -> Result<Acquisition, LeaseError> {
    check_text("key", key)?;
    check_text("owner", owner)?;
    let call = AcquireCall {
        key,
        owner,
        ttl: interval("ttl", ttl)?,
        wait: interval("wait", wait)?,
        _borrow: std::marker::PhantomData,
    };
    let autocommit = in_autocommit(conn);
    let (acquired, epoch, expires_at) = call
        .get_result::<(bool, Option<i64>, Option<DateTime<Utc>>)>(conn)
        .map_err(|error| map_error(autocommit, "acquire", error, key, wait))?;
    match (acquired, epoch, expires_at) {
        (true, Some(epoch), Some(expires_at)) => Ok(Acquisition::Granted(Lease {
            key: key.to_owned(),
            owner: owner.to_owned(),
            epoch,
            expires_at,
        })),
        _ => Ok(Acquisition::Denied),
    }
}

/// Extends the grant `(key, owner, epoch)` to server time + `ttl`. Never
/// changes the epoch.
///
/// ```no_run
/// # fn demo(conn: &mut diesel::PgConnection, lease: &leasehold::Lease) -> Result<(), leasehold::LeaseError> {
/// use std::time::Duration;
/// let ttl = Duration::from_secs(30);
/// if let leasehold::Renewal::Lost(why) = leasehold::renew(conn, lease.key(), lease.owner(), lease.epoch(), ttl)? {
///     eprintln!("lease lost ({why}); stop working on it");
/// }
/// # Ok(()) }
/// ```
pub fn renew(
    conn: &mut PgConnection,
    key: &str,
    owner: &str,
    epoch: i64,
    ttl: Duration,
) -> Result<Renewal, LeaseError> {
    check_text("key", key)?;
    check_text("owner", owner)?;
    let call = RenewCall {
        key,
        owner,
        epoch,
        ttl: interval("ttl", ttl)?,
        _borrow: std::marker::PhantomData,
    };
    let autocommit = in_autocommit(conn);
    let (status, expires_at) = call
        .get_result::<(String, Option<DateTime<Utc>>)>(conn)
        .map_err(|error| map_error(autocommit, "renew", error, key, Duration::ZERO))?;
    match (status.as_str(), expires_at) {
        ("ok", Some(expires_at)) => Ok(Renewal::Renewed { expires_at }),
        (other, _) => Ok(Renewal::Lost(unexpected_status("renew", other)?)),
    }
}

/// Releases the grant `(key, owner, epoch)`: the key becomes free and its
/// fencing counter moves past `epoch`, so the released epoch is stale at
/// every guard from now on.
pub fn release(
    conn: &mut PgConnection,
    key: &str,
    owner: &str,
    epoch: i64,
) -> Result<Release, LeaseError> {
    check_text("key", key)?;
    check_text("owner", owner)?;
    let call = ReleaseCall {
        key,
        owner,
        epoch,
        _borrow: std::marker::PhantomData,
    };
    let autocommit = in_autocommit(conn);
    let status = call
        .get_result::<String>(conn)
        .map_err(|error| map_error(autocommit, "release", error, key, Duration::ZERO))?;
    match status.as_str() {
        "ok" => Ok(Release::Released),
        other => Ok(Release::Lost(unexpected_status("release", other)?)),
    }
}

/// Reports `key`'s state; `None` for a key that was never leased.
///
/// Advisory only: the answer may be stale by the time it arrives. Use it to
/// decide what to try, never as permission to act.
pub fn inspect(conn: &mut PgConnection, key: &str) -> Result<Option<LeaseState>, LeaseError> {
    check_text("key", key)?;
    let call = InspectCall {
        key,
        _borrow: std::marker::PhantomData,
    };
    let autocommit = in_autocommit(conn);
    let row = call
        .get_results::<(bool, Option<String>, i64, Option<DateTime<Utc>>)>(conn)
        .map_err(|error| map_error(autocommit, "inspect", error, key, Duration::ZERO))?
        .into_iter()
        .next();
    Ok(row.map(
        |(held, owner, epoch, expires_at)| match (held, owner, expires_at) {
            (true, Some(owner), Some(expires_at)) => LeaseState::Held {
                owner,
                epoch,
                expires_at,
            },
            _ => LeaseState::Unowned { epoch },
        },
    ))
}

/// Whether the connection is outside any transaction diesel knows of, so a
/// call autocommits. Read *before* the call: once a call fails on a broken
/// connection, diesel marks its transaction manager broken and the depth
/// can no longer be read.
fn in_autocommit(conn: &mut PgConnection) -> bool {
    use diesel::connection::{AnsiTransactionManager, TransactionManager};
    let depth = <AnsiTransactionManager as TransactionManager<PgConnection>>::transaction_manager_status_mut(conn)
        .transaction_depth();
    matches!(depth, Ok(None))
}

/// Maps a failed call's error; a broken connection outside any transaction
/// diesel knows of means the autocommit may or may not have happened.
fn map_error(
    autocommit: bool,
    operation: &'static str,
    error: diesel::result::Error,
    key: &str,
    wait: Duration,
) -> LeaseError {
    LeaseError::from_diesel(operation, error, key, wait, autocommit)
}

/// Maps a SQL status text to the lost-lease reason it names.
pub(crate) fn lost_from_status(status: &str) -> Option<LostLease> {
    LostLease::from_status(status)
}

fn unexpected_status(operation: &'static str, status: &str) -> Result<LostLease, LeaseError> {
    LostLease::from_status(status).ok_or_else(|| LeaseError::Database {
        operation,
        source: diesel::result::Error::DeserializationError(
            format!(
                "unexpected lease status {status:?}; the installed SQL is newer than this client"
            )
            .into(),
        ),
    })
}

/// PostgreSQL text cannot hold NUL; say so before the server does, in the
/// same terms as its own validation.
pub(crate) fn check_text(field: &str, value: &str) -> Result<(), LeaseError> {
    if value.contains('\0') {
        return Err(LeaseError::InvalidInput {
            violations: vec![format!("{field} must not contain NUL characters")],
        });
    }
    Ok(())
}

/// Converts a duration to an interval of whole microseconds, rounding up so
/// that a positive duration never becomes a zero interval.
pub(crate) fn interval(field: &str, duration: Duration) -> Result<PgInterval, LeaseError> {
    let micros = duration.as_nanos().div_ceil(1_000);
    i64::try_from(micros)
        .map(PgInterval::from_microseconds)
        .map_err(|_| LeaseError::InvalidInput {
            violations: vec![format!("{field} must be at most 100 years")],
        })
}
