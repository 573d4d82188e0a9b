use std::future::Future;

use crate::admin::listing::{ListFilter, Listing};
use crate::admin::operator::{ForcedRelease, Generation, NamespaceRule};
use crate::admin::prune::{PruneOptions, PruneReport};
use crate::error::LeaseError;
use crate::guard::table::FencedTable;
use crate::lease::epoch::Epoch;

use super::on_connection;
use super::sealed::{OnAsyncConnection, Token};

/// [`Operator`](crate::admin::Operator) as `Send` futures: the same calls, answers and errors.
pub trait AsyncOperator: OnAsyncConnection {
    /// [`Operator::bind_namespace`](crate::admin::Operator::bind_namespace), awaited.
    fn bind_namespace(
        &mut self,
        prefix: &str,
        role: &str,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send {
        on_connection!(self, |conn| crate::admin::operator::bind_namespace(
            conn, prefix, role
        ))
    }

    /// [`Operator::unbind_namespace`](crate::admin::Operator::unbind_namespace), awaited.
    fn unbind_namespace(
        &mut self,
        prefix: &str,
    ) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        on_connection!(self, |conn| crate::admin::operator::unbind_namespace(
            conn, prefix
        ))
    }

    /// [`Operator::list_namespaces`](crate::admin::Operator::list_namespaces), awaited.
    fn list_namespaces(
        &mut self,
    ) -> impl Future<Output = Result<Vec<NamespaceRule>, LeaseError>> + Send {
        on_connection!(self, |conn| crate::admin::operator::list_namespaces(conn))
    }

    /// [`Operator::force_release`](crate::admin::Operator::force_release), awaited.
    fn force_release(
        &mut self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Epoch>, LeaseError>> + Send {
        on_connection!(self, |conn| crate::admin::operator::force_release(
            conn, key
        ))
    }

    /// [`Operator::force_release_epoch`](crate::admin::Operator::force_release_epoch), awaited.
    fn force_release_epoch(
        &mut self,
        key: &str,
        epoch: Epoch,
    ) -> impl Future<Output = Result<ForcedRelease, LeaseError>> + Send {
        on_connection!(self, |conn| crate::admin::operator::force_release_epoch(
            conn, key, epoch
        ))
    }

    /// [`Operator::generation`](crate::admin::Operator::generation), awaited.
    fn generation(&mut self) -> impl Future<Output = Result<Generation, LeaseError>> + Send {
        on_connection!(self, |conn| crate::admin::operator::generation(conn))
    }

    /// [`Operator::raise_generation`](crate::admin::Operator::raise_generation), awaited.
    fn raise_generation(
        &mut self,
        generation: i64,
    ) -> impl Future<Output = Result<i64, LeaseError>> + Send {
        on_connection!(self, |conn| crate::admin::operator::raise_generation(
            conn, generation
        ))
    }

    /// [`Operator::prune`](crate::admin::Operator::prune), awaited.
    fn prune(
        &mut self,
        options: &PruneOptions,
    ) -> impl Future<Output = Result<PruneReport, LeaseError>> + Send {
        on_connection!(self, |conn| crate::admin::prune::prune(conn, options))
    }

    /// [`Operator::list_leases`](crate::admin::Operator::list_leases), awaited.
    fn list_leases(
        &mut self,
        filter: &ListFilter,
    ) -> impl Future<Output = Result<Listing, LeaseError>> + Send {
        on_connection!(self, |conn| crate::admin::listing::list_leases(
            conn, filter
        ))
    }

    /// [`Operator::protect_table`](crate::admin::Operator::protect_table), awaited: the same call, the
    /// same answers and errors.
    fn protect_table(
        &mut self,
        table: &str,
        key: &str,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send {
        on_connection!(self, |conn| crate::guard::table::protect_table(
            conn, table, key
        ))
    }

    /// [`Operator::protect_rows`](crate::admin::Operator::protect_rows), awaited: the same call, the
    /// same answers and errors.
    fn protect_rows(
        &mut self,
        table: &str,
        key_prefix: &str,
        key_columns: &[&str],
    ) -> impl Future<Output = Result<(), LeaseError>> + Send {
        on_connection!(self, |conn| crate::guard::table::protect_rows(
            conn,
            table,
            key_prefix,
            key_columns
        ))
    }

    /// [`Operator::unprotect_table`](crate::admin::Operator::unprotect_table), awaited: the same call, the
    /// same answers and errors.
    fn unprotect_table(
        &mut self,
        table: &str,
    ) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        on_connection!(self, |conn| crate::guard::table::unprotect_table(
            conn, table
        ))
    }

    /// [`Operator::fenced_tables`](crate::admin::Operator::fenced_tables), awaited: the same call, the
    /// same answers and errors.
    fn fenced_tables(
        &mut self,
    ) -> impl Future<Output = Result<Vec<FencedTable>, LeaseError>> + Send {
        on_connection!(self, |conn| crate::guard::table::fenced_tables(conn))
    }
}
