//! Holding a lease over time: [`Keeper`] for one grant, [`KeeperSet`] for one
//! owner's many in one call per beat, [`run_while_held`] to stop work when the
//! lease goes, [`Election`] to elect a leader with one, and [`CancelToken`] to
//! stop them (and waiters).

pub(crate) mod cancel;
pub(crate) mod election;
pub(crate) mod heartbeat;
pub(crate) mod keeper;
pub(crate) mod keeper_set;
pub(crate) mod schedule;
pub(crate) mod worker;

pub use cancel::CancelToken;
pub use election::{Election, Leader, LeaderChange, LeaderWatch, Leadership};
pub use keeper::{Keeper, KeeperBuilder, KeeperEvent, LeaseLoss};
pub use keeper_set::{KeeperSet, KeeperSetBuilder, KeeperSetEvent};
pub use worker::{run_while_held, StopReason, WorkContext, WorkOutcome};
