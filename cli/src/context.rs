//! What every command gets from the global flags: where its results go,
//! and which database it works on.
//!
//! Commands connect through [`Context::connect`] only when they need a
//! database, so `demo`, `extension` and `local` run without one.

use crate::connect::{self, Needs, Session};
use crate::failure::CliError;
use crate::output::Printer;

/// The global flags, as the commands use them.
#[derive(Debug)]
pub struct Context {
    /// `--database-url` / `DATABASE_URL`.
    database_url: Option<String>,
    /// `--throwaway`.
    throwaway: bool,
    /// Where results go (`--json` or text).
    pub out: Printer,
}

impl Context {
    /// The context of one invocation.
    pub fn new(database_url: Option<String>, throwaway: bool, out: Printer) -> Self {
        Self {
            database_url,
            throwaway,
            out,
        }
    }

    /// The database URL given, if any.
    pub fn database_url(&self) -> Option<&str> {
        self.database_url.as_deref()
    }

    /// Opens the session the command works in (see [`connect::open`]).
    pub fn connect(&self, needs: Needs) -> Result<Session, CliError> {
        connect::open(self.database_url(), self.throwaway, needs)
    }
}
