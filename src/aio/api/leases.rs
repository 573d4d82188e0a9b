use std::future::Future;
use std::time::Duration;

use crate::batch::groups::{GroupId, GroupJoin, GroupRenewal};
use crate::batch::many::split_grants;
use crate::error::LeaseError;
use crate::lease::outcome::{
    Acquisition, KeyRelease, KeyRenewal, Lease, LeaseState, Release, Renewal,
};
use crate::lease::token::FencingToken;

use super::on_connection;
use super::sealed::{OnAsyncConnection, Token};

/// [`Leases`](crate::Leases) as `Send` futures: the same calls, answers and errors.
pub trait AsyncLeases: OnAsyncConnection {
    /// [`Leases::acquire`](crate::Leases::acquire), awaited.
    fn acquire(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Acquisition, LeaseError>> + Send {
        on_connection!(self, |conn| crate::lease::acquire(conn, key, owner, ttl))
    }

    /// [`Leases::acquire_waiting`](crate::Leases::acquire_waiting), awaited.
    fn acquire_waiting(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> impl Future<Output = Result<Lease, LeaseError>> + Send {
        on_connection!(self, |conn| crate::lease::acquire_waiting(
            conn, key, owner, ttl, wait
        ))
    }

    /// [`Leases::renew`](crate::Leases::renew), awaited.
    fn renew(
        &mut self,
        grant: &impl AsRef<FencingToken>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Renewal, LeaseError>> + Send {
        let token = grant.as_ref();
        on_connection!(self, |conn| crate::lease::renew(conn, token, ttl))
    }

    /// [`Leases::release`](crate::Leases::release), awaited.
    fn release(
        &mut self,
        grant: &impl AsRef<FencingToken>,
    ) -> impl Future<Output = Result<Release, LeaseError>> + Send {
        let token = grant.as_ref();
        on_connection!(self, |conn| crate::lease::release(conn, token))
    }

    /// [`Leases::inspect`](crate::Leases::inspect), awaited.
    fn inspect(
        &mut self,
        key: &str,
    ) -> impl Future<Output = Result<Option<LeaseState>, LeaseError>> + Send {
        on_connection!(self, |conn| crate::lease::inspect(conn, key))
    }

    /// [`Leases::renew_many`](crate::Leases::renew_many), awaited.
    fn renew_many(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
        ttl: Duration,
    ) -> impl Future<Output = Result<Vec<KeyRenewal>, LeaseError>> + Send {
        let grants = split_grants(grants);
        on_connection!(self, |conn| crate::batch::many::renew_many(
            conn, grants, ttl
        ))
    }

    /// [`Leases::release_many`](crate::Leases::release_many), awaited.
    fn release_many(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
    ) -> impl Future<Output = Result<Vec<KeyRelease>, LeaseError>> + Send {
        let grants = split_grants(grants);
        on_connection!(self, |conn| crate::batch::many::release_many(conn, grants))
    }

    /// [`Leases::join_group`](crate::Leases::join_group), awaited.
    fn join_group(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
        ttl: Duration,
    ) -> impl Future<Output = Result<GroupJoin, LeaseError>> + Send {
        let grants = split_grants(grants);
        on_connection!(self, |conn| crate::batch::groups::join_group(
            conn, grants, ttl
        ))
    }

    /// [`Leases::renew_group`](crate::Leases::renew_group), awaited.
    fn renew_group(
        &mut self,
        group: GroupId,
        owner: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<GroupRenewal, LeaseError>> + Send {
        on_connection!(self, |conn| crate::batch::groups::renew_group(
            conn, group, owner, ttl
        ))
    }
}
