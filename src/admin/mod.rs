//! Operating leasehold: install, uninstall and the installed check, and the
//! [`Operator`] calls, granted to nobody by default: the installing role runs them
//! or grants EXECUTE on each to an operator role.

pub(crate) mod extension;
pub(crate) mod listing;
pub(crate) mod operator;
pub(crate) mod prune;

pub use crate::api::Operator;
pub use crate::install::{
    install, installed_versions, is_installed, uninstall, InstallReport, Migrations, MIGRATIONS,
};
pub use crate::sql::install::INSTALL_LOCK_TIMEOUT;
pub use extension::{extension_files, extension_version, ExtensionFile};
pub use listing::{KeyState, ListFilter, ListOrder, ListedLease, Listing};
pub use operator::{
    function_privilege, BoundRole, ForcedRelease, FunctionPrivilege, Generation, NamespaceRule,
    GENERATION_SHIFT, MAX_GENERATION,
};
pub use prune::{PruneOptions, PruneReport, DEFAULT_PRUNE_BATCH};
