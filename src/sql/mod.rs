//! How this crate talks to the SQL side: the one place that knows the SQL
//! text, the machine-readable names the functions raise, and how their
//! answers are encoded.
//!
//! Everything above this module (lease operations, guards, waiting,
//! holding) works with typed values; nothing else in the crate writes SQL
//! or parses an error's DETAIL. This module depends on nothing else in the
//! crate, so it can be read and changed on its own.
//!
//! - [`calls`]: every statement the library sends, as prepared-statement
//!   cacheable queries (one round trip per statement once prepared): the
//!   SQL functions, the operator's listing of keys and the privilege
//!   questions; and the listener session's statements.
//! - [`names`]: the stable names the SQL functions put in an error's
//!   `CONSTRAINT` field (diesel does not expose SQLSTATE, but it does expose
//!   that field) and the status texts of renew and release.
//! - [`decode`]: reading those answers back: statuses, DETAIL fields,
//!   violation lists.
//! - [`execute`]: the execute step, the one thing the sync and the async
//!   face do differently (every operation is written once over it).
//! - [`input`]: the checks made before a call is sent, in the same terms as
//!   the server's own validation.
//! - [`install`]: the installer's lock, bookkeeping and schema-ownership
//!   check, and whether leasehold is installed.

pub(crate) mod calls;
pub(crate) mod decode;
pub(crate) mod execute;
pub(crate) mod input;
pub(crate) mod install;
pub(crate) mod names;
