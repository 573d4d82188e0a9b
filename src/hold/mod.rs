//! Holding a lease over time: the heartbeat that keeps a grant alive and
//! says until when its holder may act ([`Keeper`]), the heartbeat that keeps
//! a set of one owner's grants alive with one call per beat
//! ([`KeeperSet`]), the worker loop that
//! stops the work when the lease is lost ([`run_while_held`]), and the
//! cancellation both (and the waiters) can be stopped with
//! ([`CancelToken`]).

pub(crate) mod cancel;
mod keeper;
pub(crate) mod keeper_set;
pub(crate) mod schedule;
pub(crate) mod worker;

pub use cancel::CancelToken;
pub use keeper::{Keeper, KeeperBuilder, KeeperEvent, LeaseLoss};
pub use keeper_set::{KeeperSet, KeeperSetBuilder, KeeperSetEvent};
pub use worker::{run_while_held, StopReason, WorkContext, WorkOutcome};
