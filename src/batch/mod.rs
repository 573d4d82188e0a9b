//! The types of the calls on many keys of one owner: [`Leases::renew_many`](crate::Leases::renew_many)
//! and [`Leases::release_many`](crate::Leases::release_many) answer per key what the single-key calls
//! would; a heartbeat group ([`Leases::join_group`](crate::Leases::join_group),
//! [`Leases::renew_group`](crate::Leases::renew_group)) keeps many grants alive with one row write.

pub(crate) mod groups;
pub(crate) mod many;

pub use crate::lease::outcome::{KeyRelease, KeyRenewal};
pub use groups::{GroupId, GroupJoin, GroupRenewal};
pub use many::MAX_KEYS_PER_CALL;
