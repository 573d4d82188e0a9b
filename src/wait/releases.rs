//! Release wake-ups as events (what `leasehold watch --events` shows as `wake`),
//! registered on the waiters' listener as a waiter's keys are, so they share its
//! session and [`WAITER_LIMIT`]. Releases while the session is down or before a
//! registration completes are never announced: [`ReleaseEvent::Resync`] and
//! [`ReleaseWatch::armed`] say when to re-read the keys' state.

use crate::error::Repr;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::listener::{Listener, Watch};
use super::shared::{lock, Delivery, Subscription};
use super::WAITER_LIMIT;
use crate::error::LeaseError;
use crate::sql::input;

/// What a [`ReleaseWatch`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleaseEvent {
    /// A release notification carried this key's digest (one event however many
    /// releases). Any role may notify: read the key's state rather than act on it.
    Released {
        /// The key.
        key: String,
    },
    /// Releases may have gone unannounced (the session was lost or is new): read
    /// the keys' state again; the listener re-registers them by itself.
    Resync,
}

/// Release wake-ups for a set of keys, from
/// [`LeaseWaiter::watch_releases`](super::LeaseWaiter::watch_releases), queueing
/// at most one event per key plus one resync. Dropping it withdraws unshared registrations.
pub struct ReleaseWatch {
    listener: Arc<Listener>,
    subscription: Arc<Subscription>,
    watches: HashMap<String, Watch>,
}

impl std::fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseWatch")
            .field("keys", &self.watches.len())
            .field("armed", &self.armed())
            .finish()
    }
}

impl ReleaseWatch {
    /// A watch of `keys` on `listener`; keys are checked first, so an error registers none.
    pub(crate) fn start<I, K>(listener: Arc<Listener>, keys: I) -> Result<Self, LeaseError>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
    {
        let mut distinct: Vec<String> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut violations = Vec::new();
        for key in keys {
            let key = key.as_ref();
            if let Err(violation) = check_key(key) {
                violations.push(violation);
            } else if seen.insert(key.to_owned()) {
                distinct.push(key.to_owned());
            }
        }
        if distinct.len() > WAITER_LIMIT {
            violations.push(too_many(distinct.len()));
        }
        if !violations.is_empty() {
            return Err(LeaseError::from(Repr::InvalidInput { violations }));
        }
        let subscription = listener.subscribe();
        let mut watch = ReleaseWatch {
            listener,
            subscription,
            watches: HashMap::with_capacity(distinct.len()),
        };
        for key in distinct {
            watch.register(key);
        }
        Ok(watch)
    }

    /// Adds `key`; `false` if already watched. An invalid key or one past
    /// [`WAITER_LIMIT`] is [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput).
    pub fn add(&mut self, key: &str) -> Result<bool, LeaseError> {
        check_key(key).map_err(LeaseError::invalid)?;
        if self.watches.contains_key(key) {
            return Ok(false);
        }
        if self.watches.len() >= WAITER_LIMIT {
            return Err(LeaseError::invalid(too_many(self.watches.len() + 1)));
        }
        self.register(key.to_owned());
        Ok(true)
    }

    /// Stops watching `key` (queued events stay); `false` if it was not watched.
    pub fn remove(&mut self, key: &str) -> bool {
        lock(&self.subscription.state).keys.remove(key);
        self.watches.remove(key).is_some()
    }

    /// Subscribed before registering, so a notification right after registration finds it.
    fn register(&mut self, key: String) {
        lock(&self.subscription.state).keys.insert(key.clone());
        let watch = self.listener.watch(&key);
        self.watches.insert(key, watch);
    }

    /// Whether `key` is watched.
    pub fn contains(&self, key: &str) -> bool {
        self.watches.contains_key(key)
    }

    /// How many keys are watched.
    pub fn len(&self) -> usize {
        self.watches.len()
    }

    /// Whether no key is watched.
    pub fn is_empty(&self) -> bool {
        self.watches.is_empty()
    }

    /// The watched keys, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.watches.keys().map(String::as_str)
    }

    /// How many watched keys are registered in the listener's current, listening
    /// session, so a release from now on is reported; the others are pending, refused
    /// ([`LeaseWaiter::listener_status`](super::LeaseWaiter::listener_status)) or down.
    pub fn armed(&self) -> usize {
        self.listener.armed(self.keys())
    }

    /// Whether `key` is watched and armed (see [`ReleaseWatch::armed`]).
    pub fn is_armed(&self, key: &str) -> bool {
        self.contains(key) && self.listener.armed([key]) == 1
    }

    /// Blocks until every key is armed or refused, or `timeout`; answers how many are
    /// armed. Read the keys' state after it.
    pub fn wait_armed(&self, timeout: Duration) -> usize {
        let keys: Vec<&str> = self.keys().collect();
        self.listener.wait_settled(&keys, timeout)
    }

    /// The oldest unread event, waiting up to `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<ReleaseEvent> {
        let until = Instant::now().checked_add(timeout);
        self.subscription.next(until).map(public)
    }

    /// The oldest event not yet read, without waiting.
    pub fn try_recv(&self) -> Option<ReleaseEvent> {
        self.subscription.next(Some(Instant::now())).map(public)
    }

    /// The oldest event not yet read, waiting as long as it takes.
    pub fn recv(&self) -> ReleaseEvent {
        loop {
            if let Some(delivery) = self.subscription.next(None) {
                return public(delivery);
            }
        }
    }
}

/// The async face's reads (`aio::ReleaseWatch`).
#[cfg(feature = "async")]
impl ReleaseWatch {
    /// The oldest event not yet read, waiting without blocking a thread.
    pub(crate) async fn recv_async(&self) -> ReleaseEvent {
        public(self.subscription.next_async().await)
    }

    /// The keys and their listener, for a settle wait on a blocking-pool thread.
    pub(crate) fn settle_parts(&self) -> (Arc<Listener>, Vec<String>) {
        (
            self.listener.clone(),
            self.keys().map(str::to_owned).collect(),
        )
    }
}

/// Every event as it comes: blocks until the next one, and never ends.
impl Iterator for ReleaseWatch {
    type Item = ReleaseEvent;

    fn next(&mut self) -> Option<ReleaseEvent> {
        Some(self.recv())
    }
}

fn public(delivery: Delivery) -> ReleaseEvent {
    match delivery {
        Delivery::Released(key) => ReleaseEvent::Released { key },
        // A release watch does not ask for grants; were one told, re-reading is right.
        Delivery::Granted(_) | Delivery::Resync => ReleaseEvent::Resync,
    }
}

/// A key the server would refuse to register, so the watch would never hear of it.
fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("key must not be empty".to_owned());
    }
    input::text("key", key)
}

fn too_many(keys: usize) -> String {
    format!(
        "a release watch holds at most {WAITER_LIMIT} keys (WAITER_LIMIT, the listener session's registration cap); {keys} asked for"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    /// A listener that never connects: registration stays pending, all the limits need.
    fn nowhere() -> Arc<Listener> {
        Listener::for_url("host=/nonexistent/leasehold-release-watch-test dbname=none")
    }

    #[test]
    fn a_watch_holds_at_most_the_waiter_limit_and_refuses_unreportable_keys() {
        let keys: Vec<String> = (0..WAITER_LIMIT).map(|i| format!("key-{i}")).collect();
        let mut watch = ReleaseWatch::start(nowhere(), &keys).expect("the limit itself");
        assert_eq!(watch.len(), WAITER_LIMIT);
        assert_eq!(watch.add("key-0").ok(), Some(false), "already watched");
        match watch.add("one-more") {
            Err(error) if error.kind() == ErrorKind::InvalidInput => {
                assert!(
                    error.violations()[0].contains("at most 10000 keys"),
                    "{error:?}"
                )
            }
            other => panic!("expected InvalidInput, got {other:?}"),
        }
        assert!(!watch.contains("one-more"));
        assert!(watch.remove("key-0"));
        assert_eq!(watch.add("one-more").ok(), Some(true));
        for bad in ["", "a\0b"] {
            assert!(
                matches!(watch.add(bad), Err(error) if error.kind() == ErrorKind::InvalidInput)
            );
        }
        // Not connected: nothing is armed, and waiting says so in time.
        assert_eq!(watch.armed(), 0);
        assert!(!watch.is_armed("key-1"));
        assert_eq!(watch.wait_armed(Duration::from_millis(20)), 0);
        assert_eq!(watch.try_recv(), None);
    }

    #[test]
    fn a_key_released_twice_before_it_is_read_is_one_event_and_so_is_a_resync() {
        let listener = nowhere();
        let watch = ReleaseWatch::start(listener.clone(), ["a", "b"]).expect("a watch");
        {
            let mut state = lock(listener.shared_state_for_tests());
            for delivery in [
                Delivery::Released("a".to_owned()),
                Delivery::Resync,
                Delivery::Released("a".to_owned()),
                Delivery::Released("elsewhere".to_owned()),
                Delivery::Released("b".to_owned()),
                Delivery::Resync,
            ] {
                state.deliver(&delivery);
            }
        }
        let events: Vec<ReleaseEvent> = std::iter::from_fn(|| watch.try_recv()).collect();
        assert_eq!(
            events,
            [
                ReleaseEvent::Released {
                    key: "a".to_owned()
                },
                ReleaseEvent::Resync,
                ReleaseEvent::Released {
                    key: "b".to_owned()
                },
            ]
        );
        // Read, a key is reported again.
        lock(listener.shared_state_for_tests()).deliver(&Delivery::Released("a".to_owned()));
        assert_eq!(
            watch.recv_timeout(Duration::ZERO),
            Some(ReleaseEvent::Released {
                key: "a".to_owned()
            })
        );
    }
}
