//! Cooperative cancellation shared between threads: cancelling wakes every
//! registered wait at once. It never interrupts a database call in flight: a commit
//! waiting for a synchronous standby would be reported done though a failover can
//! lose it, so an attempt granted while cancelling returns the grant.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

/// Something blocked that a cancellation must wake (a waiter's condvar).
pub(crate) trait Wake: Send + Sync {
    /// Wakes every thread blocked on it; they re-check their conditions.
    fn wake(&self);
}

/// A cancellation flag shared by clones: cancel once, seen everywhere.
///
/// ```
/// use leasehold::hold::CancelToken;
/// let token = CancelToken::new();
/// let for_shutdown = token.clone();
/// std::thread::spawn(move || for_shutdown.cancel()).join().unwrap();
/// assert!(token.is_cancelled());
/// ```
#[derive(Clone, Default)]
pub struct CancelToken {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    cancelled: AtomicBool,
    next_id: AtomicU64,
    /// The flag again, under the condvar's mutex, plus the waits to wake.
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    cancelled: bool,
    wakers: Vec<(u64, Weak<dyn Wake>)>,
}

impl std::fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelToken")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl CancelToken {
    /// A token that is not cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels: every check sees it and every registered wait wakes now. Idempotent.
    pub fn cancel(&self) {
        let wakers = {
            let mut state = lock(&self.inner.state);
            state.cancelled = true;
            self.inner.cancelled.store(true, Ordering::SeqCst);
            self.inner.changed.notify_all();
            std::mem::take(&mut state.wakers)
        };
        for (_, waker) in wakers {
            if let Some(waker) = waker.upgrade() {
                waker.wake();
            }
        }
    }

    /// Whether [`CancelToken::cancel`] was called; one atomic load.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }

    /// An interruptible sleep: blocks until cancelled or `timeout`; whether cancelled.
    /// ```
    /// # use std::time::Duration;
    /// let token = leasehold::hold::CancelToken::new();
    /// assert!(!token.sleep(Duration::from_millis(1)));
    /// token.cancel();
    /// assert!(token.sleep(Duration::from_secs(60)));
    /// ```
    pub fn sleep(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        let mut state = lock(&self.inner.state);
        loop {
            if state.cancelled {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            state = self
                .inner
                .changed
                .wait_timeout(state, until - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Wakes `waker` on cancellation until the guard drops (at once if already cancelled).
    pub(crate) fn register(&self, waker: Weak<dyn Wake>) -> Registration {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let already = {
            let mut state = lock(&self.inner.state);
            if !state.cancelled {
                state.wakers.retain(|(_, w)| w.strong_count() > 0);
                state.wakers.push((id, waker.clone()));
            }
            state.cancelled
        };
        if already {
            if let Some(waker) = waker.upgrade() {
                waker.wake();
            }
        }
        Registration {
            token: Arc::downgrade(&self.inner),
            id,
        }
    }
}

/// Removes a waker from its token when dropped.
pub(crate) struct Registration {
    token: Weak<Inner>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(inner) = self.token.upgrade() {
            lock(&inner.state).wakers.retain(|(id, _)| *id != self.id);
        }
    }
}
