//! Renewing and releasing many keys of one owner in one call: what a worker
//! that holds hundreds of keys (partitions, shards, tenants) sends once per
//! heartbeat instead of one renew per key.
//!
//! Each function is one SQL call (`lease.renew_many`, `lease.release_many`)
//! and answers per key, in input order, exactly what the single-key call
//! would have answered for that key (docs/SPECIFICATION.md §1.3). Input
//! rules are the server's: it refuses arrays it cannot pair, duplicate keys
//! and more than [`MAX_KEYS_PER_CALL`] keys with
//! [`LeaseError::InvalidInput`] naming every violation, and a call with one
//! key in another role's namespace with [`LeaseError::Forbidden`] naming
//! that key; in both cases nothing changes for any key.
//!
//! Each call also sends every key's SHA-256 digest, the value the server
//! looks keys up by: computed here, it saves the server one digest per key
//! (about a quarter of a 1,000-key heartbeat's server time,
//! docs/PERFORMANCE.md). The server trusts a digest only as far as it
//! finds a row with that digest *and* that key, so a wrong digest can only
//! make a key miss, and a key that misses has its digest checked.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use crate::error::{LeaseError, Operation};
use crate::lease::outcome::{KeyRelease, KeyRenewal, Release, Renewal};
use crate::lease::token::FencingToken;
use crate::lease::{check_text, interval, refusal, unexpected};
use crate::sql::calls::{ReleaseManyCall, RenewManyCall};
use crate::sql::execute::Execute;
use crate::telemetry;

/// The most keys one [`renew_many`](crate::Leases::renew_many) or [`release_many`](crate::Leases::release_many) call may carry
/// (the SQL functions' own cap). A call's row locks last until its
/// transaction ends, and each key may be up to 16 KiB, so the cap bounds
/// what one statement holds and sends; a worker with more keys splits them
/// over several calls.
pub const MAX_KEYS_PER_CALL: usize = 1000;

/// One owner and its `(key, epoch)` pairs, in the order given.
pub(crate) type OwnerBatch<'a> = (&'a str, Vec<(&'a str, i64)>);

/// [`split_grants`]' answer, which the batch and group calls take: split
/// before the call's future is made, so that future holds `&str`s and
/// epochs, never the caller's grant type (the async face's futures are
/// `Send` whatever that type is).
pub(crate) type SplitGrants<'a> = Result<Option<OwnerBatch<'a>>, LeaseError>;

/// The grants of one batch call as the SQL functions take them: their one
/// owner, and each key with its epoch, in the order given. `None` for no
/// grants (a batch of nothing is answered with nothing, without a call).
/// Grants of different owners cannot share a call: the SQL functions act
/// for one owner, so mixing them is [`LeaseError::InvalidInput`].
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

/// The connection's [`crate::Leases::renew_many`]: its documentation is there.
pub(crate) async fn renew_many(
    conn: &mut impl Execute,
    grants: SplitGrants<'_>,
    ttl: Duration,
) -> Result<Vec<KeyRenewal>, LeaseError> {
    let Some((owner, grants)) = grants? else {
        return Ok(Vec::new());
    };
    telemetry::lease_call(
        Operation::RenewMany,
        "",
        owner,
        None,
        renew_many_unobserved(conn, owner, &grants, ttl),
    )
    .await
}

/// [`renew_many`](crate::Leases::renew_many) without its span and counters.
async fn renew_many_unobserved(
    conn: &mut impl Execute,
    owner: &str,
    grants: &[(&str, i64)],
    ttl: Duration,
) -> Result<Vec<KeyRenewal>, LeaseError> {
    let batch = Batch::new(owner, grants)?;
    let on_error = batch.on_error(Operation::RenewMany, conn);
    let call = RenewManyCall {
        keys: batch.keys,
        owner,
        epochs: batch.epochs,
        ttl: interval("ttl", ttl)?,
        key_hashes: batch.key_hashes,
        _borrow: std::marker::PhantomData,
    };
    let rows = conn.load(call).await.map_err(on_error)?;
    check_answers(Operation::RenewMany, grants, rows.iter().map(|row| &row.0))?;
    let mut answers = Vec::with_capacity(rows.len());
    for ((key, status, expires_at), (_, epoch)) in rows.into_iter().zip(grants) {
        let grant = (key, owner, *epoch);
        answers.push(key_renewal(conn, Operation::RenewMany, grant, &status, expires_at).await?);
    }
    Ok(answers)
}

/// The connection's [`crate::Leases::release_many`]: its documentation is there.
pub(crate) async fn release_many(
    conn: &mut impl Execute,
    grants: SplitGrants<'_>,
) -> Result<Vec<KeyRelease>, LeaseError> {
    let Some((owner, grants)) = grants? else {
        return Ok(Vec::new());
    };
    telemetry::lease_call(
        Operation::ReleaseMany,
        "",
        owner,
        None,
        release_many_unobserved(conn, owner, &grants),
    )
    .await
}

/// [`release_many`](crate::Leases::release_many) without its span and counters.
async fn release_many_unobserved(
    conn: &mut impl Execute,
    owner: &str,
    grants: &[(&str, i64)],
) -> Result<Vec<KeyRelease>, LeaseError> {
    let batch = Batch::new(owner, grants)?;
    let on_error = batch.on_error(Operation::ReleaseMany, conn);
    let call = ReleaseManyCall {
        keys: batch.keys,
        owner,
        epochs: batch.epochs,
        key_hashes: batch.key_hashes,
        _borrow: std::marker::PhantomData,
    };
    let rows = conn.load(call).await.map_err(on_error)?;
    check_answers(
        Operation::ReleaseMany,
        grants,
        rows.iter().map(|row| &row.0),
    )?;
    let mut answers = Vec::with_capacity(rows.len());
    for ((key, status), (_, epoch)) in rows.into_iter().zip(grants) {
        let grant = (key.as_str(), owner, *epoch);
        let release = match refusal(conn, Operation::ReleaseMany, grant, &status).await? {
            None => Release::Released,
            Some(refusal) => Release::Refused(refusal),
        };
        answers.push(KeyRelease { key, release });
    }
    Ok(answers)
}

/// One batch call's input, checked and split as the SQL functions take
/// it: the keys, the epochs, and each key's digest.
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

    /// What turns the failure of this batch's call into its typed error
    /// (taken before the call consumes the batch's arrays).
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

/// One key's renewal as a batch call answers it: `ok` with the new
/// expiry, or a refusal and why (asked on `conn`).
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

/// Each key's digest as the server computes it: SHA-256 of the key's UTF-8
/// bytes.
fn key_hashes(grants: &[(&str, i64)]) -> Vec<Vec<u8>> {
    grants
        .iter()
        .map(|(key, _)| Sha256::digest(key.as_bytes()).to_vec())
        .collect()
}

/// The server answers one row per key, in input order; anything else is an
/// installed SQL this client does not understand, and its answers must not
/// be attributed to the wrong keys.
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
