//! The types of the calls on many keys of one owner ([`Leases::renew_many`](crate::Leases::renew_many)
//! and friends) and of heartbeat groups ([`Leases::join_group`](crate::Leases::join_group)).

pub(crate) mod groups;
pub(crate) mod many;

pub use crate::lease::outcome::{KeyRelease, KeyRenewal};
pub use groups::{GroupId, GroupJoin, GroupRenewal};
pub use many::MAX_KEYS_PER_CALL;
