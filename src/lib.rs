//! leasehold: PostgreSQL-native leases with fencing epochs.
#![deny(missing_docs)]
#![deny(clippy::unwrap_used)]

mod token;

pub use token::{FencingToken, TokenError};
