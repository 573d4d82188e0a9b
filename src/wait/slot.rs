//! The per-key wake-up point: a sequence number the listener moves whenever a
//! key's waiters should look again, plus a condvar. Read before an attempt, wait after.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use crate::hold::cancel::{CancelToken, Wake};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Why [`Slot::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woken {
    /// The sequence moved: look at the key again.
    Changed,
    /// The time limit passed.
    TimedOut,
    /// The cancel token fired.
    Cancelled,
}

impl Woken {
    /// The wake-up's telemetry `cause`; `None` when cancelled (no retry).
    pub(crate) fn cause(self) -> Option<&'static str> {
        match self {
            Woken::Changed => Some("listener"),
            Woken::TimedOut => Some("timer"),
            Woken::Cancelled => None,
        }
    }
}

#[derive(Default)]
struct SlotState {
    seq: u64,
    /// `seq` when the key's registration last completed in this session; `None` unarmed.
    armed_at: Option<u64>,
    /// Waiters asleep after an armed attempt, not woken since. Counted for the
    /// current `seq` only (a bump zeroes it), so a woken waiter is never counted.
    armed_sleepers: usize,
}

/// The per-key wake-up point waiters block on.
#[derive(Default)]
pub(crate) struct Slot {
    state: Mutex<SlotState>,
    changed: Condvar,
    /// Where async waiters wait instead of the condvar; every bump notifies both.
    #[cfg(feature = "async")]
    tasks: tokio::sync::Notify,
}

impl Slot {
    /// Whether an attempt made after reading `seen` was armed (a release will notify).
    pub(crate) fn is_armed(&self, seen: u64) -> bool {
        lock(&self.state).armed_at.is_some_and(|at| seen >= at)
    }

    /// The current sequence number: read before an attempt, wait for it to move after.
    pub(crate) fn seq(&self) -> u64 {
        lock(&self.state).seq
    }

    pub(super) fn bump(&self, armed: Option<bool>) {
        let mut state = lock(&self.state);
        state.seq += 1;
        state.armed_sleepers = 0;
        match armed {
            Some(true) => state.armed_at = Some(state.seq),
            Some(false) => state.armed_at = None,
            None => {}
        }
        self.changed.notify_all();
        #[cfg(feature = "async")]
        self.tasks.notify_waiters();
    }

    /// Blocks until the sequence moves past `seen`, `until` passes, or `cancel` fires.
    pub(crate) fn wait(&self, seen: u64, until: Instant, cancel: Option<&CancelToken>) -> Woken {
        let mut state = lock(&self.state);
        let armed = Self::begin_sleep(&mut state, seen);
        let woken = loop {
            if cancel.is_some_and(CancelToken::is_cancelled) {
                break Woken::Cancelled;
            }
            if state.seq != seen {
                break Woken::Changed;
            }
            let now = Instant::now();
            if now >= until {
                break Woken::TimedOut;
            }
            state = self
                .changed
                .wait_timeout(state, until - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        };
        Self::end_sleep(&mut state, seen, armed);
        woken
    }

    /// Counts an armed sleeper (if the attempt after `seen` was armed); answers whether.
    fn begin_sleep(state: &mut SlotState, seen: u64) -> bool {
        let armed = state.seq == seen && state.armed_at.is_some_and(|at| seen >= at);
        if armed {
            state.armed_sleepers += 1;
        }
        armed
    }

    /// Undoes [`Slot::begin_sleep`] for a waiter that woke.
    fn end_sleep(state: &mut SlotState, seen: u64, armed: bool) {
        // A bump since zeroed the count already.
        if armed && state.seq == seen {
            state.armed_sleepers = state.armed_sleepers.saturating_sub(1);
        }
    }

    /// [`Slot::wait`] for a task, without blocking a thread; cancelled by dropping it.
    #[cfg(feature = "async")]
    pub(crate) async fn wait_async(&self, seen: u64, until: Instant) -> Woken {
        /// Ends the sleep however the future ends, dropped included.
        struct Sleeping<'s> {
            slot: &'s Slot,
            seen: u64,
            armed: bool,
        }
        impl Drop for Sleeping<'_> {
            fn drop(&mut self) {
                Slot::end_sleep(&mut lock(&self.slot.state), self.seen, self.armed);
            }
        }
        let armed = Self::begin_sleep(&mut lock(&self.state), seen);
        let _sleeping = Sleeping {
            slot: self,
            seen,
            armed,
        };
        loop {
            let notified = self.tasks.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the state is read, so a bump in between is not missed.
            notified.as_mut().enable();
            if self.seq() != seen {
                return Woken::Changed;
            }
            if Instant::now() >= until {
                return Woken::TimedOut;
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(until.into()) => {}
            }
        }
    }
}

impl Wake for Slot {
    fn wake(&self) {
        let _state = lock(&self.state);
        self.changed.notify_all();
        #[cfg(feature = "async")]
        self.tasks.notify_waiters();
    }
}

impl Slot {
    /// Waiters asleep after an armed attempt; 0 while the key is not armed.
    pub(super) fn armed_sleepers(&self) -> usize {
        let state = lock(&self.state);
        if state.armed_at.is_some() {
            state.armed_sleepers
        } else {
            0
        }
    }
}
