//! Renewing and releasing many keys of one owner in one call per heartbeat, each
//! answering per key what the single-key call would;
//! an input error changes nothing for any key. Each key's SHA-256 is sent along,
//! saving the server about a quarter of a 1,000-key heartbeat (docs/PERFORMANCE.md);
//! a wrong digest can only make a key miss, and a missing key's digest is checked.

use diesel::pg::data_types::PgInterval;
use diesel::sql_types::{Array, BigInt, Binary, Interval, Nullable, Text, Timestamptz};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use crate::error::{LeaseError, Operation};
use crate::lease::outcome::{KeyRelease, KeyRenewal, Release, Renewal};
use crate::lease::token::FencingToken;
use crate::lease::{check_text, interval, refusal, unexpected};
use crate::sql::execute::Execute;
use crate::telemetry;

impl Operation {
    /// `lease.renew_many`: renew several keys of one owner in one call.
    pub const RENEW_MANY: Operation = Operation::writes("renew_many");
    /// `lease.release_many`: release several keys of one owner in one call.
    pub const RELEASE_MANY: Operation = Operation::writes("release_many");
}

crate::sql::calls::lease_call! {
    /// `lease.renew_many(keys, owner, epochs, ttl, key_hashes)`: a row per key, in order.
    RenewManyCall { keys: Vec<&'a str> => Array<Text>, owner: &'a str => Text, epochs: Vec<i64> => Array<BigInt>, ttl: PgInterval => Interval, key_hashes: Vec<Vec<u8>> => Array<Binary> }
    sql = "SELECT key, status, expires_at FROM lease.renew_many";
    row = (Text, Text, Nullable<Timestamptz>);
    rust = (String, String, Option<DateTime<Utc>>);
}

crate::sql::calls::lease_call! {
    /// `lease.release_many(keys, owner, epochs, key_hashes)`: a row per key, in order.
    ReleaseManyCall { keys: Vec<&'a str> => Array<Text>, owner: &'a str => Text, epochs: Vec<i64> => Array<BigInt>, key_hashes: Vec<Vec<u8>> => Array<Binary> }
    sql = "SELECT key, status FROM lease.release_many";
    row = (Text, Text);
    rust = (String, String);
}

/// The most keys one `Leases::renew_many` or
/// `Leases::release_many` may carry: bounds one statement's
/// locks and size (keys up to 16 KiB); split more over several calls.
pub const MAX_KEYS_PER_CALL: usize = 1000;

/// One owner and its `(key, epoch)` pairs, in the order given.
pub(crate) type OwnerBatch<'a> = (&'a str, Vec<(&'a str, i64)>);

/// [`split_grants`]' answer, split before the call's future is made so it holds
/// `&str`s and epochs, never the caller's grant type (async futures stay `Send`).
pub(crate) type SplitGrants<'a> = Result<Option<OwnerBatch<'a>>, LeaseError>;

/// The grants of a batch call: their one owner (two are [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput))
/// and each key's epoch, in order; `None` for no grants (no call).
pub(crate) fn split_grants<G: AsRef<FencingToken>>(grants: &[G]) -> SplitGrants<'_> {
    let Some(first) = grants.first() else {
        return Ok(None);
    };
    let owner = first.as_ref().owner();
    let mut pairs = Vec::with_capacity(grants.len());
    for grant in grants {
        let token = grant.as_ref();
        if token.owner() != owner {
            return Err(LeaseError::invalid(format!(
                "every grant of one call must have one owner: {:?} and {:?} differ (key {:?})",
                owner,
                token.owner(),
                token.key()
            )));
        }
        pairs.push((token.key(), token.epoch().get()));
    }
    Ok(Some((owner, pairs)))
}

/// The connection's `Leases::renew_many`.
pub(crate) async fn renew_many(
    conn: &mut impl Execute,
    grants: SplitGrants<'_>,
    ttl: Duration,
) -> Result<Vec<KeyRenewal>, LeaseError> {
    let Some((owner, grants)) = grants? else {
        return Ok(Vec::new());
    };
    telemetry::lease_call(Operation::RENEW_MANY, "", owner, None, async move {
        let grants = &grants;
        let batch = Batch::new(owner, grants)?;
        let on_error = batch.on_error(Operation::RENEW_MANY, conn);
        let call = RenewManyCall {
            keys: batch.keys,
            owner,
            epochs: batch.epochs,
            ttl: interval("ttl", ttl)?,
            key_hashes: batch.key_hashes,
            _borrow: std::marker::PhantomData,
        };
        let rows = conn.load(call).await.map_err(on_error)?;
        check_answers(Operation::RENEW_MANY, grants, rows.iter().map(|row| &row.0))?;
        let mut answers = Vec::with_capacity(rows.len());
        for ((key, status, expires_at), (_, epoch)) in rows.into_iter().zip(grants) {
            let grant = (key, owner, *epoch);
            answers
                .push(key_renewal(conn, Operation::RENEW_MANY, grant, &status, expires_at).await?);
        }
        Ok(answers)
    })
    .await
}

/// The connection's `Leases::release_many`.
pub(crate) async fn release_many(
    conn: &mut impl Execute,
    grants: SplitGrants<'_>,
) -> Result<Vec<KeyRelease>, LeaseError> {
    let Some((owner, grants)) = grants? else {
        return Ok(Vec::new());
    };
    telemetry::lease_call(Operation::RELEASE_MANY, "", owner, None, async move {
        let grants = &grants;
        let batch = Batch::new(owner, grants)?;
        let on_error = batch.on_error(Operation::RELEASE_MANY, conn);
        let call = ReleaseManyCall {
            keys: batch.keys,
            owner,
            epochs: batch.epochs,
            key_hashes: batch.key_hashes,
            _borrow: std::marker::PhantomData,
        };
        let rows = conn.load(call).await.map_err(on_error)?;
        check_answers(
            Operation::RELEASE_MANY,
            grants,
            rows.iter().map(|row| &row.0),
        )?;
        let mut answers = Vec::with_capacity(rows.len());
        for ((key, status), (_, epoch)) in rows.into_iter().zip(grants) {
            let grant = (key.as_str(), owner, *epoch);
            let release = match refusal(conn, Operation::RELEASE_MANY, grant, &status).await? {
                None => Release::Released,
                Some(refusal) => Release::Refused(refusal),
            };
            answers.push(KeyRelease { key, release });
        }
        Ok(answers)
    })
    .await
}

/// One batch call's input as the SQL takes it: keys, epochs, digests.
pub(crate) struct Batch<'a> {
    pub(crate) keys: Vec<&'a str>,
    pub(crate) epochs: Vec<i64>,
    pub(crate) key_hashes: Vec<Vec<u8>>,
    /// The key an error names when the server's error names none.
    first_key: &'a str,
}

impl<'a> Batch<'a> {
    /// Refuses text PostgreSQL cannot store (the server checks the rest).
    pub(crate) fn new(owner: &str, grants: &[(&'a str, i64)]) -> Result<Self, LeaseError> {
        check_text("owner", owner)?;
        for (key, _) in grants {
            check_text("key", key)?;
        }
        Ok(Batch {
            keys: grants.iter().map(|(key, _)| *key).collect(),
            epochs: grants.iter().map(|(_, epoch)| *epoch).collect(),
            key_hashes: key_hashes(grants),
            first_key: grants.first().map_or("", |(key, _)| *key),
        })
    }

    /// Maps this batch's call failure to its error (taken before the call consumes the arrays).
    pub(crate) fn on_error(
        &self,
        operation: Operation,
        conn: &mut impl Execute,
    ) -> impl FnOnce(diesel::result::Error) -> LeaseError + 'a {
        let (first_key, autocommit) = (self.first_key, conn.in_autocommit());
        move |error| {
            LeaseError::from_diesel(operation, error, first_key, Duration::ZERO, autocommit)
        }
    }
}

/// One key's renewal as a batch answers it: `ok` with expiry, or why refused (asked on `conn`).
pub(crate) async fn key_renewal(
    conn: &mut impl Execute,
    operation: Operation,
    (key, owner, epoch): (String, &str, i64),
    status: &str,
    expires_at: Option<DateTime<Utc>>,
) -> Result<KeyRenewal, LeaseError> {
    let grant = (key.as_str(), owner, epoch);
    let renewal = match (refusal(conn, operation, grant, status).await?, expires_at) {
        (None, Some(expires_at)) => Renewal::Renewed { expires_at },
        (Some(refusal), _) => Renewal::Refused(refusal),
        (None, None) => return Err(unexpected(operation, "ok without an expiry")),
    };
    Ok(KeyRenewal { key, renewal })
}

/// Each key's SHA-256, as the server computes it.
fn key_hashes(grants: &[(&str, i64)]) -> Vec<Vec<u8>> {
    grants
        .iter()
        .map(|(key, _)| Sha256::digest(key.as_bytes()).to_vec())
        .collect()
}

/// One row per key in input order, or the installed SQL is not understood and no
/// answer may be attributed to the wrong key.
pub(crate) fn check_answers<'r>(
    operation: Operation,
    grants: &[(&str, i64)],
    answered: impl ExactSizeIterator<Item = &'r String>,
) -> Result<(), LeaseError> {
    if answered.len() != grants.len()
        || !answered.zip(grants).all(|(answer, (key, _))| answer == key)
    {
        return Err(unexpected(
            operation,
            "rows that do not match the keys passed, one by one",
        ));
    }
    Ok(())
}
