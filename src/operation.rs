//! The library call an error or a telemetry record came from, in a leaf
//! module so every layer can name it. Each operation's constant is defined
//! beside the operation itself (`Operation::ACQUIRE` with `lease::acquire`),
//! so adding an operation touches no list here.

use std::fmt;

/// A leasehold call, for matching an error's `operation()` and for
/// reporting. The constants are the calls (`Operation::ACQUIRE`,
/// `Operation::RENEW`, …); compare with `==` or match on them.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Operation {
    name: &'static str,
    mutates: bool,
}

impl Operation {
    /// A call that can change state, so a lost autocommit leaves its outcome unknown.
    pub(crate) const fn writes(name: &'static str) -> Self {
        Operation {
            name,
            mutates: true,
        }
    }

    /// A call that only reads.
    pub(crate) const fn reads(name: &'static str) -> Self {
        Operation {
            name,
            mutates: false,
        }
    }

    /// Not a leasehold call: the caller's own statement, or a fenced table's
    /// refusal of it.
    pub const STATEMENT: Operation = Operation::writes("statement");

    /// `lease.present`: a token presented for the writes of a transaction
    /// to fenced tables; also what a write's refusal by a namespace rule names.
    pub const PRESENT: Operation = Operation::writes("present");

    /// Installing or uninstalling leasehold, and the install's own checks.
    pub const INSTALL: Operation = Operation::reads("install");

    /// Whether the call can change state, so a lost autocommit leaves its outcome unknown.
    pub(crate) fn mutates(self) -> bool {
        self.mutates
    }

    /// The operation's name, as the SQL function is called.
    pub fn as_str(self) -> &'static str {
        self.name
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

impl fmt::Debug for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}
