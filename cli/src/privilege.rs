//! How a refused operator action is explained.
//!
//! Operator functions are granted to nobody by default, so "you were not
//! granted this" is their most common failure, and it deserves a message
//! that says which GRANT fixes it. PostgreSQL reports it as SQLSTATE 42501
//! "permission denied for function", but diesel exposes neither the
//! SQLSTATE nor anything else stable about it, and message text is never
//! parsed here. So when an operator call fails, the command asks the server
//! whether the role holds EXECUTE on the function
//! ([`leasehold::admin::function_privilege`]) and says so; otherwise the
//! failure is reported as it came.

use diesel::PgConnection;
use leasehold::admin::{function_privilege, FunctionPrivilege};

use crate::failure::CliError;

/// The error to show for a failed call of operator function `function`
/// (its SQL signature, as a GRANT names it):
/// [`CliError::NotGranted`] when the role lacks EXECUTE on it, a note that
/// the installed leasehold predates it when it does not exist, else
/// `failure` as it is.
pub fn explain(conn: &mut PgConnection, function: &'static str, failure: CliError) -> CliError {
    match function_privilege(conn, function) {
        Ok(FunctionPrivilege::NotGranted { role }) => CliError::NotGranted { role, function },
        Ok(FunctionPrivilege::Missing) => CliError::Database(format!(
            "{function} does not exist in this database: the installed leasehold is older than this command; run `leasehold install` as the role that installed it"
        )),
        // Granted after all (or the check itself failed): the call failed
        // for another reason, which `failure` tells.
        _ => failure,
    }
}
