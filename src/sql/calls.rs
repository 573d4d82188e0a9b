//! Every statement the library sends. Cacheable `QueryFragment`s rather than
//! `sql_query` (never cached): once prepared, a call costs one Bind/Execute round
//! trip. Hot-path functions are called in the select list, not `FROM`, which
//! costs a function scan (docs/PERFORMANCE.md).

use chrono::{DateTime, Utc};
use diesel::pg::data_types::PgInterval;
use diesel::pg::sql_types::Record;
use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{
    Array, BigInt, Binary, Bool, Double, Integer, Interval, Nullable, Text, Timestamptz,
};
use diesel::{QueryResult, RunQueryDsl};

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

        impl QueryId for $name<'_> {
            type QueryId = $name<'static>;
            const HAS_STATIC_QUERY_ID: bool = true;
        }

        impl QueryFragment<Pg> for $name<'_> {
            // A call without arguments never uses `first` or its values.
            #[allow(unused_mut, unused_variables)]
            fn walk_ast<'b>(&'b self, mut $out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
                let $self_ = self;
                $walk
            }
        }

        impl Query for $name<'_> {
            type SqlType = $row;
        }

        impl<Conn> RunQueryDsl<Conn> for $name<'_> {}

        impl super::execute::Statement for $name<'_> {
            type Row = $rust;

            fn load_blocking(
                self,
                conn: &mut diesel::pg::PgConnection,
            ) -> QueryResult<Vec<$rust>> {
                RunQueryDsl::load(self, conn)
            }

            #[cfg(feature = "async")]
            fn load_async<'c>(
                self,
                conn: &'c mut diesel_async::AsyncPgConnection,
            ) -> impl std::future::Future<Output = QueryResult<Vec<$rust>>> + Send + 'c
            where
                Self: 'c,
            {
                diesel_async::RunQueryDsl::load(self, conn)
            }
        }
    };
}

/// Declares one cacheable call of a SQL function: `SQL(arguments)`.
macro_rules! lease_call {
    (
        $(#[$doc:meta])*
        $name:ident { $($field:ident : $field_ty:ty => $sql_ty:ty),* $(,)? }
        sql = $sql:expr;
        row = $row:ty;
        rust = $rust:ty;
    ) => {
        cacheable_query! {
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

lease_call! {
    /// `lease.acquire(key, owner, ttl, wait)`.
    AcquireCall { key: &'a str => Text, owner: &'a str => Text, ttl: PgInterval => Interval, wait: PgInterval => Interval }
    sql = "SELECT lease.acquire";
    row = Record<(Bool, Nullable<BigInt>, Nullable<Timestamptz>)>;
    rust = (bool, Option<i64>, Option<DateTime<Utc>>);
}

lease_call! {
    /// `lease.renew(key, owner, epoch, ttl)`.
    RenewCall { key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt, ttl: PgInterval => Interval }
    sql = "SELECT lease.renew";
    row = Record<(Text, Nullable<Timestamptz>)>;
    rust = (String, Option<DateTime<Utc>>);
}

lease_call! {
    /// `lease.release(key, owner, epoch)`.
    ReleaseCall { key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt }
    sql = "SELECT lease.release";
    row = Text;
    rust = String;
}

lease_call! {
    /// `lease.renew_many(keys, owner, epochs, ttl, key_hashes)`: a row per key, in order.
    RenewManyCall { keys: Vec<&'a str> => Array<Text>, owner: &'a str => Text, epochs: Vec<i64> => Array<BigInt>, ttl: PgInterval => Interval, key_hashes: Vec<Vec<u8>> => Array<Binary> }
    sql = "SELECT key, status, expires_at FROM lease.renew_many";
    row = (Text, Text, Nullable<Timestamptz>);
    rust = (String, String, Option<DateTime<Utc>>);
}

lease_call! {
    /// `lease.release_many(keys, owner, epochs, key_hashes)`: a row per key, in order.
    ReleaseManyCall { keys: Vec<&'a str> => Array<Text>, owner: &'a str => Text, epochs: Vec<i64> => Array<BigInt>, key_hashes: Vec<Vec<u8>> => Array<Binary> }
    sql = "SELECT key, status FROM lease.release_many";
    row = (Text, Text);
    rust = (String, String);
}

lease_call! {
    /// `lease.join_group(keys, owner, epochs, ttl, key_hashes)`: a row per key, with the new group.
    JoinGroupCall { keys: Vec<&'a str> => Array<Text>, owner: &'a str => Text, epochs: Vec<i64> => Array<BigInt>, ttl: PgInterval => Interval, key_hashes: Vec<Vec<u8>> => Array<Binary> }
    sql = "SELECT key, status, expires_at, group_id FROM lease.join_group";
    row = (Text, Text, Nullable<Timestamptz>, Nullable<BigInt>);
    rust = (String, String, Option<DateTime<Utc>>, Option<i64>);
}

lease_call! {
    /// `lease.renew_group(group_id, owner, ttl)`: one row.
    RenewGroupCall { group_id: i64 => BigInt, owner: &'a str => Text, ttl: PgInterval => Interval }
    sql = "SELECT status, expires_at, members FROM lease.renew_group";
    row = (Text, Nullable<Timestamptz>, Nullable<Integer>);
    rust = (String, Option<DateTime<Utc>>, Option<i32>);
}

lease_call! {
    /// `lease.why_refused(key, owner, epoch)`: one row.
    WhyRefusedCall { key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt }
    sql = "SELECT status, reason, newest_epoch FROM lease.why_refused";
    row = (Text, Text, Nullable<BigInt>);
    rust = (String, String, Option<i64>);
}

lease_call! {
    /// `lease.key_state(key)`: no row for a never-seen key.
    KeyStateCall { key: &'a str => Text }
    sql = "SELECT lease.key_state";
    row = Record<(Text, Nullable<Text>, BigInt, Nullable<Timestamptz>, Nullable<Text>)>;
    rust = (String, Option<String>, i64, Option<DateTime<Utc>>, Option<String>);
}

lease_call! {
    /// `lease.admit(resource, key, epoch)`.
    AdmitCall { resource: &'a str => Text, key: &'a str => Text, epoch: i64 => BigInt }
    sql = "SELECT true AS admitted FROM lease.admit";
    row = Bool;
    rust = bool;
}

lease_call! {
    /// `lease.check_held(key, owner, epoch)`.
    CheckHeldCall { key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt }
    sql = "SELECT lease.check_held";
    row = Timestamptz;
    rust = DateTime<Utc>;
}

lease_call! {
    /// `lease.admit_held(resource, key, owner, epoch)`.
    AdmitHeldCall { resource: &'a str => Text, key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt }
    sql = "SELECT lease.admit_held";
    row = Timestamptz;
    rust = DateTime<Utc>;
}

lease_call! {
    /// `lease.renew_admit(resource, key, owner, epoch, ttl)`.
    RenewAdmitCall { resource: &'a str => Text, key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt, ttl: PgInterval => Interval }
    sql = "SELECT lease.renew_admit";
    row = Timestamptz;
    rust = DateTime<Utc>;
}

lease_call! {
    /// `lease.fence(resource, key, up_to)`.
    FenceCall { resource: &'a str => Text, key: &'a str => Text, up_to: i64 => BigInt }
    sql = "SELECT lease.fence";
    row = BigInt;
    rust = i64;
}

lease_call! {
    /// `lease.inspect_guard(resource)`.
    InspectGuardCall { resource: &'a str => Text }
    sql = "SELECT lease_key, accepted_epoch FROM lease.inspect_guard";
    row = (Text, BigInt);
    rust = (String, i64);
}

lease_call! {
    /// `lease.inspect(key)` plus the holder's remaining seconds on the server's
    /// clock, so a waiter can sleep until expiry without comparing clocks.
    RemainingCall { key: &'a str => Text }
    sql = "SELECT held, EXTRACT(epoch FROM expires_at - clock_timestamp())::float8 FROM lease.inspect";
    row = (Bool, Nullable<Double>);
    rust = (bool, Option<f64>);
}

lease_call! {
    /// `lease.force_release(key)`: the counter after, NULL if never leased.
    ForceReleaseCall { key: &'a str => Text }
    sql = "SELECT lease.force_release";
    row = Nullable<BigInt>;
    rust = Option<i64>;
}

lease_call! {
    /// `lease.force_release(key, epoch)`: what became of the grant, and the counter.
    ForceReleaseEpochCall { key: &'a str => Text, epoch: i64 => BigInt }
    sql = "SELECT status, counter FROM lease.force_release";
    row = (Text, Nullable<BigInt>);
    rust = (String, Option<i64>);
}

lease_call! {
    /// `lease.bind_namespace(prefix, role)`.
    BindNamespaceCall { prefix: &'a str => Text, role: &'a str => Text }
    sql = "SELECT true AS bound FROM lease.bind_namespace";
    row = Bool;
    rust = bool;
}

lease_call! {
    /// `lease.unbind_namespace(prefix)`: whether a rule was removed.
    UnbindNamespaceCall { prefix: &'a str => Text }
    sql = "SELECT lease.unbind_namespace";
    row = Bool;
    rust = bool;
}

lease_call! {
    /// `lease.list_namespaces()`: every rule, by prefix.
    ListNamespacesCall {}
    sql = "SELECT prefix, role, created_at FROM lease.list_namespaces";
    row = (Text, Text, Timestamptz);
    rust = (String, String, DateTime<Utc>);
}

lease_call! {
    /// `lease.raise_generation(generation)`: the new generation.
    RaiseGenerationCall { generation: i64 => BigInt }
    sql = "SELECT lease.raise_generation";
    row = BigInt;
    rust = i64;
}

lease_call! {
    /// `lease.prune_keys(idle, after, batch, dry_run)`: one batch of key pruning.
    PruneKeysCall { idle: PgInterval => Interval, after: Option<&'a [u8]> => Nullable<Binary>, batch: i32 => Integer, dry_run: bool => Bool }
    sql = "SELECT examined, pruned, sighted, waiters, watermark, next_after FROM lease.prune_keys";
    row = (Integer, Integer, Integer, Integer, BigInt, Nullable<Binary>);
    rust = (i32, i32, i32, i32, i64, Option<Vec<u8>>);
}

lease_call! {
    /// `lease.prune_guards(idle, after, batch, dry_run)`: one batch of guard pruning.
    PruneGuardsCall { idle: PgInterval => Interval, after: Option<&'a [u8]> => Nullable<Binary>, batch: i32 => Integer, dry_run: bool => Bool }
    sql = "SELECT examined, pruned, next_after FROM lease.prune_guards";
    row = (Integer, Integer, Nullable<Binary>);
    rust = (i32, i32, Option<Vec<u8>>);
}

lease_call! {
    /// `lease.generation()`: the current generation and timeline.
    GenerationCall {}
    sql = "SELECT generation, timeline FROM lease.generation";
    row = (BigInt, BigInt);
    rust = (i64, i64);
}

cacheable_query! {
    /// (allowed, role): whether the connected role may execute the function named.
    FunctionPrivilegeCall { function: &'a str => Text }
    row = (Nullable<Bool>, Text);
    rust = (Option<bool>, String);
    |call, out| {
        out.push_sql("SELECT has_function_privilege(to_regprocedure(");
        out.push_bind_param::<Text, _>(&call.function)?;
        out.push_sql("), 'EXECUTE'), current_user::text");
        Ok(())
    }
}

/// (allowed, role) for a listing's SELECTs, asked first so a refusal names the
/// role instead of aborting the caller's transaction.
pub(crate) const LIST_PRIVILEGE: &str = "SELECT has_table_privilege('lease.leases', 'SELECT') \
AND has_table_privilege('lease.groups', 'SELECT'), current_user::text";

cacheable_query! {
    /// [`LIST_PRIVILEGE`]: (allowed, role).
    ListPrivilegeCall {}
    row = (Bool, Text);
    rust = (bool, String);
    |_call, out| {
        out.push_sql(LIST_PRIVILEGE);
        Ok(())
    }
}

lease_call! {
    /// `lease.list_leases(prefix, holder, states, sort, max_rows)`, states and expiries
    /// decided by the SQL's own rules; every row carries `read_at`, the one row if none matched.
    ListLeasesCall {
        prefix: &'a str => Text,
        owner: Option<&'a str> => Nullable<Text>,
        states: Vec<&'a str> => Array<Text>,
        order: &'static str => Text,
        limit: i64 => BigInt
    }
    sql = "SELECT read_at, key, digest, state, owner, epoch, expires_at FROM lease.list_leases";
    row = (Timestamptz, Nullable<Text>, Nullable<Text>, Nullable<Text>, Nullable<Text>, Nullable<BigInt>, Nullable<Timestamptz>);
    rust = (DateTime<Utc>, Option<String>, Option<String>, Option<String>, Option<String>, Option<i64>, Option<DateTime<Utc>>);
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
    /// The delivery check's channel: a notification from another session must arrive.
    pub(crate) const DELIVERY_CHANNEL: &str = "lease_listener_check";
    /// Listens on [`DELIVERY_CHANNEL`].
    pub(crate) const LISTEN_DELIVERY: &str = "LISTEN lease_listener_check";
    /// Stops listening on [`DELIVERY_CHANNEL`].
    pub(crate) const UNLISTEN_DELIVERY: &str = "UNLISTEN lease_listener_check";
    /// Sends the delivery check's notification, payload `$1`.
    pub(crate) const SEND_DELIVERY: &str = "SELECT pg_notify('lease_listener_check', $1)";
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_listener_listens_on_the_release_channel() {
        assert_eq!(
            super::listener::LISTEN_RELEASES,
            format!("LISTEN {}", crate::sql::names::RELEASE_CHANNEL)
        );
    }
}

cacheable_query! {
    /// `lease.present(key, owner, epoch)`, its void answer read as text.
    PresentCall { key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt }
    row = Text;
    rust = String;
    |call, out| {
        out.push_sql("SELECT lease.present(");
        out.push_bind_param::<Text, _>(&call.key)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&call.owner)?;
        out.push_sql(", ");
        out.push_bind_param::<BigInt, _>(&call.epoch)?;
        out.push_sql(")::text");
        Ok(())
    }
}

cacheable_query! {
    /// `lease.protect_table(table, key)`; the table's name resolved as
    /// `regclass` resolves it (the session's search_path).
    ProtectTableCall { table: &'a str => Text, key: &'a str => Text }
    row = Text;
    rust = String;
    |call, out| {
        out.push_sql("SELECT lease.protect_table(");
        out.push_bind_param::<Text, _>(&call.table)?;
        out.push_sql("::regclass, ");
        out.push_bind_param::<Text, _>(&call.key)?;
        out.push_sql(")::text");
        Ok(())
    }
}

cacheable_query! {
    /// `lease.protect_rows(table, key_prefix, key_columns)`.
    ProtectRowsCall { table: &'a str => Text, key_prefix: &'a str => Text, key_columns: Vec<&'a str> => Array<Text> }
    row = Text;
    rust = String;
    |call, out| {
        out.push_sql("SELECT lease.protect_rows(");
        out.push_bind_param::<Text, _>(&call.table)?;
        out.push_sql("::regclass, ");
        out.push_bind_param::<Text, _>(&call.key_prefix)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Text>, _>(&call.key_columns)?;
        out.push_sql(")::text");
        Ok(())
    }
}

cacheable_query! {
    /// `lease.unprotect_table(table)`: whether the table had a fence.
    UnprotectTableCall { table: &'a str => Text }
    row = Bool;
    rust = bool;
    |call, out| {
        out.push_sql("SELECT lease.unprotect_table(");
        out.push_bind_param::<Text, _>(&call.table)?;
        out.push_sql("::regclass)");
        Ok(())
    }
}

lease_call! {
    /// `lease.fenced_tables()`: (table, kind, key, key_prefix, key_columns).
    FencedTablesCall {}
    sql = "SELECT fenced_table, kind, key, key_prefix, key_columns FROM lease.fenced_tables";
    row = (Text, Text, Nullable<Text>, Nullable<Text>, Nullable<Array<Text>>);
    rust = (String, String, Option<String>, Option<String>, Option<Vec<String>>);
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
        cacheable_query! {
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
                out.push_bind_param::<Text, _>(&call.key)?;
                out.push_sql(", ");
                out.push_bind_param::<Text, _>(&call.owner)?;
                out.push_sql(", ");
                out.push_bind_param::<BigInt, _>(&call.epoch)?;
                out.push_sql(")::text");
                Ok(())
            }
        }
    };
}

admit_then_present! {
    /// `lease.admit(resource, key, epoch)`, then `lease.present`.
    AdmitPresentCall { resource: &'a str => Text, key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt }
    call = "lease.admit"; args = [resource: Text, key: Text, epoch: BigInt]; cast = "::text";
    row = (Text, Text);
    rust = (String, String);
}

admit_then_present! {
    /// `lease.admit_held(resource, key, owner, epoch)`, then `lease.present`.
    AdmitHeldPresentCall { resource: &'a str => Text, key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt }
    call = "lease.admit_held"; args = [resource: Text, key: Text, owner: Text, epoch: BigInt]; cast = "";
    row = (Timestamptz, Text);
    rust = (DateTime<Utc>, String);
}

admit_then_present! {
    /// `lease.renew_admit(resource, key, owner, epoch, ttl)`, then `lease.present`.
    RenewAdmitPresentCall { resource: &'a str => Text, key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt, ttl: PgInterval => Interval }
    call = "lease.renew_admit"; args = [resource: Text, key: Text, owner: Text, epoch: BigInt, ttl: Interval];
    cast = "";
    row = (Timestamptz, Text);
    rust = (DateTime<Utc>, String);
}
