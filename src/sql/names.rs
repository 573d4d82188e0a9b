//! Names the SQL functions raise and return, shared by the migrations and
//! this crate. Changing one here means changing it in `migrations/` too.

/// `CONSTRAINT` name of invalid-input errors (SQLSTATE 22023).
pub(crate) const INVALID_INPUT: &str = "lease_invalid_input";
/// `CONSTRAINT` name of blocking-acquire timeouts (SQLSTATE 57014).
pub(crate) const WAIT_TIMEOUT: &str = "lease_wait_timeout";
/// `CONSTRAINT` name of a refused stale epoch (SQLSTATE 55000).
pub(crate) const GUARD_STALE: &str = "lease_guard_stale_epoch";
/// `CONSTRAINT` name of a token of the wrong lease key (SQLSTATE 22023).
pub(crate) const GUARD_WRONG_KEY: &str = "lease_guard_wrong_key";
/// `CONSTRAINT` name of an epoch above the key's counter, never granted
/// (SQLSTATE 22023).
pub(crate) const GUARD_EPOCH_NOT_GRANTED: &str = "lease_guard_epoch_not_granted";
/// `CONSTRAINT` name of a lease-checked write whose lease is not held (55000).
pub(crate) const GUARD_NOT_HELD: &str = "lease_guard_lease_not_held";

/// `CONSTRAINT` name of a call refused because an operator bound the key's
/// or resource's prefix to a role the caller is not a member of (SQLSTATE
/// 42501; DETAIL `<argument>=<name> role=<session user>`).
pub(crate) const NAMESPACE_DENIED: &str = "lease_namespace_denied";

/// `CONSTRAINT` name of an install refused because schema `lease` exists
/// and another role owns it (SQLSTATE 42501).
pub(crate) const SCHEMA_NOT_OWNED: &str = "lease_schema_not_owned";

/// `CONSTRAINT` name of an install refused because the server is older than
/// PostgreSQL 14 (SQLSTATE 0A000; DETAIL
/// `minimum=14 server_version=<server_version>`).
pub(crate) const UNSUPPORTED_VERSION: &str = "lease_unsupported_version";

/// `CONSTRAINT` name of a waiter registration beyond the session's cap
/// (SQLSTATE 22023).
pub(crate) const WAITER_LIMIT: &str = "lease_waiter_limit";

/// `CONSTRAINT` name of a `lease.raise_generation` to a generation at or
/// below the current one (SQLSTATE 22023; DETAIL `current=<generation>
/// requested=<generation>`).
pub(crate) const GENERATION_NOT_ABOVE: &str = "lease_generation_not_above";

/// The channel `lease.release` notifies waiters on (payload: the hex
/// SHA-256 digest of the released key).
pub(crate) const RELEASE_CHANNEL: &str = "lease_released";

/// `CONSTRAINT` name of a call that could not settle a key's state in its
/// fixed number of steps because it changed under the call twice (SQLSTATE
/// 40001; retry the call).
pub(crate) const CONTENTION: &str = "lease_contention";

/// `CONSTRAINT` name of a call whose transaction's snapshot predates a
/// change of the namespace rules, under REPEATABLE READ or SERIALIZABLE
/// (SQLSTATE 40001; retry the transaction).
pub(crate) const NAMESPACE_CHANGED: &str = "lease_namespace_changed";
