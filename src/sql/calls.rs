//! How a statement is declared: cacheable `QueryFragment`s rather than
//! `sql_query` (never cached), so once prepared a call costs one Bind/Execute
//! round trip. Each operation declares its own statement beside it with
//! these macros; the listener session's few statements are here. Hot-path
//! functions are called in the select list, not `FROM`, which costs a
//! function scan (docs/PERFORMANCE.md).

/// A cacheable statement: bound values, a static query id (prepared once per
/// connection), its row type and the SQL `walk_ast` writes.
macro_rules! cacheable_query {
    (
        $(#[$doc:meta])*
        $name:ident { $($field:ident : $field_ty:ty => $sql_ty:ty),* }
        row = $row:ty;
        rust = $rust:ty;
        |$self_:ident, $out:ident| $walk:block
    ) => {
        $(#[$doc])*
        pub(crate) struct $name<'a> {
            $(pub(crate) $field: $field_ty,)*
            pub(crate) _borrow: std::marker::PhantomData<&'a ()>,
        }

        impl diesel::query_builder::QueryId for $name<'_> {
            type QueryId = $name<'static>;
            const HAS_STATIC_QUERY_ID: bool = true;
        }

        impl diesel::query_builder::QueryFragment<diesel::pg::Pg> for $name<'_> {
            // A call without arguments never uses `first` or its values.
            #[allow(unused_mut, unused_variables)]
            fn walk_ast<'b>(
                &'b self,
                mut $out: diesel::query_builder::AstPass<'_, 'b, diesel::pg::Pg>,
            ) -> diesel::QueryResult<()> {
                let $self_ = self;
                $walk
            }
        }

        impl diesel::query_builder::Query for $name<'_> {
            type SqlType = $row;
        }

        impl<Conn> diesel::RunQueryDsl<Conn> for $name<'_> {}

        impl $crate::sql::execute::Statement for $name<'_> {
            type Row = $rust;

            fn load_blocking(
                self,
                conn: &mut diesel::pg::PgConnection,
            ) -> diesel::QueryResult<Vec<$rust>> {
                diesel::RunQueryDsl::load(self, conn)
            }

            #[cfg(feature = "async")]
            fn load_async<'c>(
                self,
                conn: &'c mut diesel_async::AsyncPgConnection,
            ) -> impl std::future::Future<Output = diesel::QueryResult<Vec<$rust>>> + Send + 'c
            where
                Self: 'c,
            {
                diesel_async::RunQueryDsl::load(self, conn)
            }
        }
    };
}

pub(crate) use cacheable_query;

/// Declares one cacheable call of a SQL function: `SQL(arguments)`.
macro_rules! lease_call {
    (
        $(#[$doc:meta])*
        $name:ident { $($field:ident : $field_ty:ty => $sql_ty:ty),* $(,)? }
        sql = $sql:expr;
        row = $row:ty;
        rust = $rust:ty;
    ) => {
        $crate::sql::calls::cacheable_query! {
            $(#[$doc])*
            $name { $($field : $field_ty => $sql_ty),* }
            row = $row;
            rust = $rust;
            |call, out| {
                let mut first = true;
                out.push_sql($sql);
                out.push_sql("(");
                $(
                    if !first {
                        out.push_sql(", ");
                    }
                    first = false;
                    out.push_bind_param::<$sql_ty, _>(&call.$field)?;
                )*
                let _ = first;
                out.push_sql(")");
                Ok(())
            }
        }
    };
}

/// The listener session's statements, as text with `$n` parameters (it uses libpq directly).
pub(crate) mod listener {
    /// Drops this session's waiter registrations (an earlier backend's may remain).
    pub(crate) const RESET: &str = "SELECT lease._waiter_reset()";
    /// Registers interest in `$1`: the key's digest, or NULL while a release is in flight (repeat).
    pub(crate) const WATCH: &str = "SELECT lease._waiter_watch($1)";
    /// Withdraws the registration of `$1`.
    pub(crate) const UNWATCH: &str = "SELECT lease._waiter_unwatch($1)";
    /// Probes an idle session.
    pub(crate) const PROBE: &str = "SELECT 1";
    /// Listens on [`crate::sql::names::RELEASE_CHANNEL`] (a unit test keeps them equal).
    pub(crate) const LISTEN_RELEASES: &str = "LISTEN lease_released";
    /// Listens on [`crate::sql::names::GRANT_CHANNEL`] (a unit test keeps them equal).
    pub(crate) const LISTEN_GRANTS: &str = "LISTEN lease_granted";
    /// The delivery check's channel: a notification from another session must arrive.
    pub(crate) const DELIVERY_CHANNEL: &str = "lease_listener_check";
    /// Listens on [`DELIVERY_CHANNEL`].
    pub(crate) const LISTEN_DELIVERY: &str = "LISTEN lease_listener_check";
    /// Stops listening on [`DELIVERY_CHANNEL`].
    pub(crate) const UNLISTEN_DELIVERY: &str = "UNLISTEN lease_listener_check";
    /// Sends the delivery check's notification, payload `$1`.
    pub(crate) const SEND_DELIVERY: &str = "SELECT pg_notify('lease_listener_check', $1)";
}

/// Declares an admission followed by `lease.present(key, owner, epoch)` in
/// one statement, a fenced transaction's first step in one round trip:
/// `SELECT <call>(<args>)<cast>, lease.present(key, owner, epoch)::text`.
macro_rules! admit_then_present {
    (
        $(#[$doc:meta])*
        $name:ident { $($field:ident : $field_ty:ty => $sql_ty:ty),* }
        call = $call:expr; args = [$($arg:ident : $arg_ty:ty),*]; cast = $cast:expr;
        row = $row:ty;
        rust = $rust:ty;
    ) => {
        $crate::sql::calls::cacheable_query! {
            $(#[$doc])*
            $name { $($field : $field_ty => $sql_ty),* }
            row = $row;
            rust = $rust;
            |call, out| {
                out.push_sql(concat!("SELECT ", $call, "("));
                let mut first = true;
                $(
                    if !first {
                        out.push_sql(", ");
                    }
                    first = false;
                    out.push_bind_param::<$arg_ty, _>(&call.$arg)?;
                )*
                let _ = first;
                out.push_sql(concat!(")", $cast, ", lease.present("));
                out.push_bind_param::<diesel::sql_types::Text, _>(&call.key)?;
                out.push_sql(", ");
                out.push_bind_param::<diesel::sql_types::Text, _>(&call.owner)?;
                out.push_sql(", ");
                out.push_bind_param::<diesel::sql_types::BigInt, _>(&call.epoch)?;
                out.push_sql(")::text");
                Ok(())
            }
        }
    };
}

pub(crate) use {admit_then_present, lease_call};

#[cfg(test)]
mod tests {
    #[test]
    fn the_listener_listens_on_the_release_and_grant_channels() {
        assert_eq!(
            super::listener::LISTEN_RELEASES,
            format!("LISTEN {}", crate::sql::names::RELEASE_CHANNEL)
        );
        assert_eq!(
            super::listener::LISTEN_GRANTS,
            format!("LISTEN {}", crate::sql::names::GRANT_CHANNEL)
        );
    }
}
