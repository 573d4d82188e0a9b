//! Tokens from loose parts, for tests that name a grant by key, owner and
//! epoch instead of holding the `Lease` an acquire returned (a grant of
//! another process, a stale epoch on purpose, a forged one).

use leasehold::{Epoch, FencingToken};

/// The token of `key`, `owner` and `epoch` (an `i64` or an [`Epoch`]).
/// Panics on parts no token can have (empty names, an epoch below 1):
/// tests of those build their tokens with [`FencingToken::new`].
pub fn grant(key: &str, owner: &str, epoch: impl Into<Epoch>) -> FencingToken {
    let epoch = epoch.into();
    FencingToken::new(key, owner, epoch)
        .unwrap_or_else(|error| panic!("token ({key:?}, {owner:?}, {epoch}): {error}"))
}

/// The tokens of `owner` for each `(key, epoch)` pair, in order: the
/// argument of a batch call.
pub fn grants<E: Into<Epoch> + Copy>(owner: &str, pairs: &[(&str, E)]) -> Vec<FencingToken> {
    pairs
        .iter()
        .map(|&(key, epoch)| grant(key, owner, epoch))
        .collect()
}
