//! The library call an error or a telemetry record came from, in a leaf
//! module so every layer can name it.

use std::fmt;

/// The library call an error came from, for matching and reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// `lease.acquire` (also each attempt of a waiter).
    Acquire,
    /// `lease.renew`.
    Renew,
    /// `lease.release`.
    Release,
    /// `lease.renew_many`: renew several keys of one owner in one call.
    RenewMany,
    /// `lease.release_many`: release several keys of one owner in one call.
    ReleaseMany,
    /// `lease.join_group`: renew several keys into one heartbeat group.
    JoinGroup,
    /// `lease.renew_group`: one heartbeat for every key of a group.
    RenewGroup,
    /// `lease.inspect`.
    Inspect,
    /// `lease.admit`: a token-checked guard.
    Admit,
    /// `lease.check_held`: the lease is held right now.
    CheckHeld,
    /// `lease.admit_held`: admit, checking the lease is held.
    AdmitHeld,
    /// `lease.renew_admit`: renew and admit together.
    RenewAndAdmit,
    /// `lease.fence`: raise a resource's record by hand.
    Fence,
    /// `lease.inspect_guard`.
    InspectGuard,
    /// `lease.force_release`: an operator frees a key whatever its state.
    ForceRelease,
    /// `lease.bind_namespace`: an operator binds a key prefix to a role.
    BindNamespace,
    /// `lease.unbind_namespace`: an operator removes a prefix's rule.
    UnbindNamespace,
    /// `lease.list_namespaces`: an operator lists the rules.
    ListNamespaces,
    /// `lease.raise_generation`: an operator raises the generation.
    RaiseGeneration,
    /// `lease.generation`: the current generation and timeline.
    Generation,
    /// `lease.prune_keys` / `lease.prune_guards`.
    Prune,
    /// A listing of keys (`Operator::list_leases`).
    ListLeases,
    /// A privilege question (`admin::function_privilege`).
    Privilege,
    /// `lease.present`: a token presented for the writes of a transaction
    /// to fenced tables.
    Present,
    /// `lease.protect_table`, `lease.protect_rows` or
    /// `lease.unprotect_table`: a table's owner changes its fence.
    ProtectTable,
    /// `lease.fenced_tables`: the fenced tables of the database.
    FencedTables,
    /// `leasehold::install` or `admin::uninstall`.
    Install,
    /// Not a leasehold call: install bookkeeping, or the caller's own statement.
    Statement,
}

impl Operation {
    /// Whether the call can change state, so a lost autocommit leaves its outcome unknown.
    pub(crate) fn mutates(self) -> bool {
        !matches!(
            self,
            Operation::Inspect
                | Operation::InspectGuard
                | Operation::ListNamespaces
                | Operation::Generation
                | Operation::ListLeases
                | Operation::Privilege
                | Operation::FencedTables
                | Operation::Install
        )
    }

    /// The operation's name, as the SQL function is called.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Acquire => "acquire",
            Operation::Renew => "renew",
            Operation::Release => "release",
            Operation::RenewMany => "renew_many",
            Operation::ReleaseMany => "release_many",
            Operation::JoinGroup => "join_group",
            Operation::RenewGroup => "renew_group",
            Operation::Inspect => "inspect",
            Operation::Admit => "admit",
            Operation::CheckHeld => "check_held",
            Operation::AdmitHeld => "admit_held",
            Operation::RenewAndAdmit => "renew_admit",
            Operation::Fence => "fence",
            Operation::InspectGuard => "inspect_guard",
            Operation::ForceRelease => "force_release",
            Operation::BindNamespace => "bind_namespace",
            Operation::UnbindNamespace => "unbind_namespace",
            Operation::ListNamespaces => "list_namespaces",
            Operation::RaiseGeneration => "raise_generation",
            Operation::Generation => "generation",
            Operation::Prune => "prune",
            Operation::ListLeases => "list_leases",
            Operation::Privilege => "privilege",
            Operation::Present => "present",
            Operation::ProtectTable => "protect_table",
            Operation::FencedTables => "fenced_tables",
            Operation::Install => "install",
            Operation::Statement => "statement",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
