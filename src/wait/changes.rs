//! Notifications that one key changed hands (released, or granted to a new
//! term), for observers that re-read the key's state on each: registered on
//! the waiters' shared listener like a waiter's key, so they share its
//! session. A notification says only "look again"; any role may send one.

use std::sync::Arc;
use std::time::Instant;

use super::listener::{Listener, Watch};
use super::shared::{lock, Subscription};

/// One key's change notifications; dropping it withdraws an unshared registration.
pub(crate) struct KeyChanges {
    listener: Arc<Listener>,
    subscription: Arc<Subscription>,
    key: String,
    _watch: Watch,
}

impl KeyChanges {
    /// Subscribed before registering, so a notification right after registration finds it.
    pub(crate) fn start(listener: Arc<Listener>, key: &str) -> Self {
        let subscription = listener.subscribe();
        {
            let mut state = lock(&subscription.state);
            state.grants = true;
            state.keys.insert(key.to_owned());
        }
        let watch = listener.watch(key);
        KeyChanges {
            listener,
            subscription,
            key: key.to_owned(),
            _watch: watch,
        }
    }

    /// Whether the key is registered in a listening session, so a change from
    /// now on is announced; otherwise its observer polls.
    pub(crate) fn armed(&self) -> bool {
        self.listener.armed([self.key.as_str()]) == 1
    }

    /// Waits until a change or a resync is announced (`true`) or `until` passes.
    pub(crate) fn wait(&self, until: Instant) -> bool {
        self.subscription.next(Some(until)).is_some()
    }

    /// Resolves when a change or a resync is announced.
    #[cfg(feature = "async")]
    pub(crate) async fn announced(&self) {
        self.subscription.next_async().await;
    }
}
