//! Spans, events and metrics, behind the features `tracing` and `metrics` (off by
//! default: then this compiles to inline pass-throughs). The library installs no
//! subscriber or recorder. Spans `lease`, `guard` and `lease_wait` (targets under
//! `leasehold::`) carry `operation`, `owner`, `epoch` and `outcome`; metrics are
//! named `leasehold_*`, and [`describe_metrics`] gives a recorder their help texts.
//! Keys and resource names are the application's own and
//! traces leave the process, so they are recorded only after
//! [`set_trace_keys`]`(`[`TraceKeys::Recorded`]`)`; metric labels are closed sets, never names.
//
// The only module that talks to the facades; call sites stay one short line each
// (in `lease`, `guard`, `hold`, `wait`).

use std::sync::atomic::{AtomicBool, Ordering};

use chrono::{DateTime, Utc};

use crate::error::{LeaseError, Operation, Repr};
use crate::lease::outcome::{Acquisition, Lease, LeaseState, Release, Renewal};

/// Whether spans and events may carry lease keys and resource names
/// ([`set_trace_keys`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TraceKeys {
    /// Keys and resource names are left out (the default): they may be personal or secret.
    #[default]
    Hidden,
    /// Keys and resource names are recorded as the `key` and `resource` fields.
    Recorded,
}

static RECORD_KEYS: AtomicBool = AtomicBool::new(false);

/// Sets, process-wide, whether spans and events carry keys and resource names
/// (default [`TraceKeys::Hidden`]), for calls that start afterwards.
pub fn set_trace_keys(keys: TraceKeys) {
    RECORD_KEYS.store(keys == TraceKeys::Recorded, Ordering::Relaxed);
}

/// The current [`set_trace_keys`] setting.
pub fn trace_keys() -> TraceKeys {
    if RECORD_KEYS.load(Ordering::Relaxed) {
        TraceKeys::Recorded
    } else {
        TraceKeys::Hidden
    }
}

/// Describes every metric to the installed recorder (Prometheus `# HELP`); optional.
pub fn describe_metrics() {
    #[cfg(feature = "metrics")]
    metered::describe();
}

/// The label a call's result is counted and traced under.
pub(crate) trait Outcome {
    /// The `outcome` label.
    fn outcome(&self) -> &'static str;
    /// The epoch the result names, if the call did not know it beforehand.
    fn epoch(&self) -> Option<i64> {
        None
    }
}

impl Outcome for Acquisition {
    fn outcome(&self) -> &'static str {
        match self {
            Acquisition::Granted(_) => "granted",
            Acquisition::Denied => "denied",
        }
    }
    fn epoch(&self) -> Option<i64> {
        match self {
            Acquisition::Granted(lease) => Some(lease.epoch().get()),
            Acquisition::Denied => None,
        }
    }
}

impl Outcome for Lease {
    fn outcome(&self) -> &'static str {
        "granted"
    }
    fn epoch(&self) -> Option<i64> {
        Some(self.epoch().get())
    }
}

impl Outcome for Renewal {
    fn outcome(&self) -> &'static str {
        match self {
            Renewal::Renewed { .. } => "renewed",
            Renewal::Refused(why) => why.as_status(),
        }
    }
}

impl Outcome for Release {
    fn outcome(&self) -> &'static str {
        match self {
            Release::Released => "released",
            Release::Refused(why) => why.as_status(),
        }
    }
}

impl Outcome for Option<LeaseState> {
    fn outcome(&self) -> &'static str {
        match self {
            Some(LeaseState::Held { .. }) => "held",
            Some(LeaseState::Lapsed { .. }) => "lapsed",
            Some(LeaseState::Free { .. }) => "free",
            None => "unknown",
        }
    }
    fn epoch(&self) -> Option<i64> {
        self.as_ref().map(|state| state.epoch().get())
    }
}

/// A batch's label: `all` when every key got the first answer (`renewed`,
/// `released`), `partial` when some did, `none` when none did (an empty
/// batch is `all`).
fn batch_outcome<'a>(answers: impl Iterator<Item = &'a str> + Clone, first: &str) -> &'static str {
    match (
        answers.clone().all(|answer| answer == first),
        answers.clone().any(|answer| answer == first),
    ) {
        (true, _) => "all",
        (false, true) => "partial",
        (false, false) => "none",
    }
}

impl Outcome for Vec<crate::lease::outcome::KeyRenewal> {
    fn outcome(&self) -> &'static str {
        batch_outcome(self.iter().map(|k| k.renewal.outcome()), "renewed")
    }
}

impl Outcome for Vec<crate::lease::outcome::KeyRelease> {
    fn outcome(&self) -> &'static str {
        batch_outcome(self.iter().map(|k| k.release.outcome()), "released")
    }
}

/// `force_release` by key: the counter after, or `None` for a key never
/// leased.
impl Outcome for Option<i64> {
    fn outcome(&self) -> &'static str {
        match self {
            Some(_) => "released",
            None => "never_leased",
        }
    }
}

/// `bind_namespace`.
impl Outcome for () {
    fn outcome(&self) -> &'static str {
        "done"
    }
}

/// `unbind_namespace`: whether there was a rule.
impl Outcome for bool {
    fn outcome(&self) -> &'static str {
        if *self {
            "done"
        } else {
            "absent"
        }
    }
}

/// `raise_generation`: the generation now.
impl Outcome for i64 {
    fn outcome(&self) -> &'static str {
        "done"
    }
}

impl Outcome for LeaseError {
    fn outcome(&self) -> &'static str {
        if let Some(kind) = self.refusal_kind() {
            return kind;
        }
        match self.repr() {
            Repr::InvalidInput { .. } | Repr::GenerationTooHigh { .. } => "invalid",
            Repr::GenerationNotAbove { .. } => "not_above",
            Repr::TimedOut { .. } => "timed_out",
            Repr::ListNotPermitted { .. } => "forbidden",
            Repr::OutcomeUnknown { .. } => "outcome_unknown",
            Repr::ReadOnlyServer { .. } => "read_only",
            Repr::Retry { .. } => "retry",
            Repr::NotInstalled { .. } => "not_installed",
            _ => "error",
        }
    }
}

impl LeaseError {
    /// The `kind` label when the guard refused the writer (as opposed to
    /// failing): counted in `leasehold_guard_refused_total`.
    fn refusal_kind(&self) -> Option<&'static str> {
        match self.repr() {
            Repr::StaleEpoch { .. } => Some("stale_epoch"),
            Repr::WrongLeaseKey { .. } => Some("wrong_lease_key"),
            Repr::EpochNotGranted { .. } => Some("epoch_not_granted"),
            Repr::LeaseNotHeld { .. } => Some("lease_not_held"),
            Repr::Forbidden { .. } => Some("forbidden"),
            _ => None,
        }
    }
}

/// A guard call's successful outcome: what its answer means.
fn guard_success(operation: Operation, found: bool) -> &'static str {
    // The guard calls' own names: which answer each one's success is.
    match operation.as_str() {
        "check_held" => "held",
        "fence" => "fenced",
        "inspect_guard" if found => "found",
        "inspect_guard" => "absent",
        _ => "admitted",
    }
}

/// Whether a guard call's answer found something (only `inspect_guard`'s
/// can be empty).
pub(crate) trait GuardAnswer {
    fn found(&self) -> bool {
        true
    }
}

impl GuardAnswer for () {}
impl GuardAnswer for i64 {}
impl GuardAnswer for DateTime<Utc> {}
impl<T> GuardAnswer for Option<T> {
    fn found(&self) -> bool {
        self.is_some()
    }
}

/// Whether [`TraceKeys::Recorded`] is in force: the name itself if so.
#[cfg(feature = "tracing")]
fn traced_name(name: &str) -> Option<&str> {
    (RECORD_KEYS.load(Ordering::Relaxed) && !name.is_empty()).then_some(name)
}

/// Non-empty text, or nothing (operator guard calls have no owner).
#[cfg(feature = "tracing")]
fn present(text: &str) -> Option<&str> {
    (!text.is_empty()).then_some(text)
}

#[cfg(any(feature = "tracing", feature = "metrics"))]
mod timing {
    use std::future::Future;
    use std::time::{Duration, Instant};

    /// Runs the operation `call` to its end inside `span` (entered at
    /// every poll, so for the whole call whichever face runs it), timing it
    /// from its first poll.
    pub(super) async fn timed_call<R>(
        #[cfg(feature = "tracing")] span: &tracing::Span,
        call: impl Future<Output = R>,
    ) -> (R, Duration) {
        let started = Instant::now();
        #[cfg(feature = "tracing")]
        let result = tracing::Instrument::instrument(call, span.clone()).await;
        #[cfg(not(feature = "tracing"))]
        let result = call.await;
        (result, started.elapsed())
    }

    /// Records the result's fields on the span.
    #[cfg(feature = "tracing")]
    pub(super) fn close(
        span: &tracing::Span,
        outcome: &'static str,
        epoch: Option<i64>,
        elapsed: Duration,
    ) {
        span.record("outcome", outcome);
        if let Some(epoch) = epoch {
            span.record("epoch", epoch);
        }
        span.record(
            "duration_us",
            u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
        );
    }
}

/// Runs one lease call in its span and counts it: acquire, renew,
/// release, inspect, the batch and group calls, the operator calls and
/// prune (`key` empty when a call names no single key, `owner` empty when
/// it has none). `epoch` is the one the caller presented, if any. The
/// operation is a future so that both faces run it through here: the sync
/// face's finishes in its first poll (`sql::execute`).
#[cfg(not(any(feature = "tracing", feature = "metrics")))]
#[inline(always)]
pub(crate) async fn lease_call<T, E, F>(
    _operation: Operation,
    _key: &str,
    _owner: &str,
    _epoch: Option<i64>,
    call: F,
) -> Result<T, E>
where
    F: std::future::Future<Output = Result<T, E>>,
{
    call.await
}

/// Runs one lease call in its span and counts it (see the other
/// definition, used when both features are off).
#[cfg(any(feature = "tracing", feature = "metrics"))]
pub(crate) async fn lease_call<T, E, F>(
    operation: Operation,
    key: &str,
    owner: &str,
    epoch: Option<i64>,
    call: F,
) -> Result<T, E>
where
    T: Outcome,
    E: Outcome,
    F: std::future::Future<Output = Result<T, E>>,
{
    #[cfg(feature = "tracing")]
    let span = tracing::debug_span!(
        target: "leasehold::lease",
        "lease",
        operation = operation.as_str(),
        key = traced_name(key),
        owner = present(owner),
        epoch = epoch,
        outcome = tracing::field::Empty,
        duration_us = tracing::field::Empty,
    );
    #[cfg(not(feature = "tracing"))]
    let _ = (key, owner, epoch);
    let (result, elapsed) = timing::timed_call(
        #[cfg(feature = "tracing")]
        &span,
        call,
    )
    .await;
    let (outcome, granted) = match &result {
        Ok(value) => (value.outcome(), value.epoch()),
        Err(error) => (error.outcome(), None),
    };
    #[cfg(feature = "tracing")]
    timing::close(&span, outcome, granted, elapsed);
    #[cfg(not(feature = "tracing"))]
    let _ = granted;
    #[cfg(feature = "metrics")]
    metered::call(operation, outcome, None, elapsed);
    result
}

/// Runs one guard call in its span and counts it (refusals by kind).
#[cfg(not(any(feature = "tracing", feature = "metrics")))]
#[inline(always)]
pub(crate) async fn guard_call<T, F>(
    _operation: Operation,
    _resource: &str,
    _key: &str,
    _owner: &str,
    _epoch: Option<i64>,
    call: F,
) -> Result<T, LeaseError>
where
    F: std::future::Future<Output = Result<T, LeaseError>>,
{
    call.await
}

/// Runs one guard call in its span and counts it (refusals by kind).
#[cfg(any(feature = "tracing", feature = "metrics"))]
pub(crate) async fn guard_call<T, F>(
    operation: Operation,
    resource: &str,
    key: &str,
    owner: &str,
    epoch: Option<i64>,
    call: F,
) -> Result<T, LeaseError>
where
    T: GuardAnswer,
    F: std::future::Future<Output = Result<T, LeaseError>>,
{
    #[cfg(feature = "tracing")]
    let span = tracing::debug_span!(
        target: "leasehold::guard",
        "guard",
        operation = operation.as_str(),
        resource = traced_name(resource),
        key = traced_name(key),
        owner = present(owner),
        epoch = epoch,
        outcome = tracing::field::Empty,
        duration_us = tracing::field::Empty,
    );
    #[cfg(not(feature = "tracing"))]
    let _ = (resource, key, owner, epoch);
    let (result, elapsed) = timing::timed_call(
        #[cfg(feature = "tracing")]
        &span,
        call,
    )
    .await;
    let (outcome, refused) = match &result {
        Ok(answer) => (guard_success(operation, answer.found()), None),
        Err(error) => (error.outcome(), error.refusal_kind()),
    };
    #[cfg(feature = "tracing")]
    timing::close(&span, outcome, None, elapsed);
    #[cfg(not(feature = "metrics"))]
    let _ = (refused, elapsed);
    #[cfg(feature = "metrics")]
    metered::call(operation, outcome, refused, elapsed);
    result
}

/// Runs a waiter's whole acquire in its span and times the wait (either
/// face's waiter: the sync one finishes it on its own thread).
#[cfg(not(any(feature = "tracing", feature = "metrics")))]
#[inline(always)]
pub(crate) async fn wait<R, F>(_key: &str, _owner: &str, call: F) -> R
where
    R: Outcome,
    F: std::future::Future<Output = R>,
{
    call.await
}

/// Runs a waiter's whole acquire in its span and times the wait.
#[cfg(any(feature = "tracing", feature = "metrics"))]
pub(crate) async fn wait<R, F>(key: &str, owner: &str, call: F) -> R
where
    R: Outcome,
    F: std::future::Future<Output = R>,
{
    #[cfg(feature = "tracing")]
    let span = tracing::debug_span!(
        target: "leasehold::waiter",
        "lease_wait",
        key = traced_name(key),
        owner = owner,
        epoch = tracing::field::Empty,
        outcome = tracing::field::Empty,
        duration_us = tracing::field::Empty,
    );
    #[cfg(not(feature = "tracing"))]
    let _ = (key, owner);
    let (result, elapsed) = timing::timed_call(
        #[cfg(feature = "tracing")]
        &span,
        call,
    )
    .await;
    let outcome = result.outcome();
    #[cfg(feature = "tracing")]
    timing::close(&span, outcome, result.epoch(), elapsed);
    #[cfg(feature = "metrics")]
    metrics::histogram!("leasehold_wait_duration_seconds", "outcome" => outcome)
        .record(elapsed.as_secs_f64());
    result
}

/// Reports a blocked waiter's wake-up by its `cause` label; `None` (it was
/// cancelled: the wait ends there) reports nothing.
#[inline(always)]
pub(crate) fn waiter_woke(cause: Option<&'static str>) {
    #[cfg(any(feature = "tracing", feature = "metrics"))]
    if let Some(cause) = cause {
        #[cfg(feature = "tracing")]
        tracing::debug!(target: "leasehold::waiter", cause, "waiter woke");
        #[cfg(feature = "metrics")]
        metrics::counter!("leasehold_waiter_wakeups_total", "cause" => cause).increment(1);
    }
    #[cfg(not(any(feature = "tracing", feature = "metrics")))]
    let _ = cause;
}

/// Reports a keeper's loss of `lease`: once per `Keeper`, once per key of
/// a `KeeperSet`.
#[inline(always)]
pub(crate) fn lease_lost(lease: &Lease, reason: &'static str, loss: &dyn std::fmt::Display) {
    #[cfg(feature = "tracing")]
    tracing::warn!(
        target: "leasehold::keeper",
        key = traced_name(lease.key()),
        owner = lease.owner(),
        epoch = lease.epoch().get(),
        reason,
        "lease lost: {loss}"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("leasehold_lease_lost_total", "reason" => reason).increment(1);
    let _ = (lease, reason, loss);
}

/// Reports that the waiters' listener session is up.
#[inline(always)]
pub(crate) fn listener_up(backend_pid: i32) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("leasehold_listener_up").increment(1.0);
    #[cfg(feature = "tracing")]
    tracing::info!(target: "leasehold::listener", backend_pid, "waiters' listener connected");
    let _ = backend_pid;
}

/// Reports that a listener session that was up has ended (`Ok`: the last
/// waiter handle dropped; `Err`: the session was lost); returns `ended`
/// unchanged.
#[inline(always)]
pub(crate) fn listener_ended(ended: Result<(), String>) -> Result<(), String> {
    #[cfg(feature = "metrics")]
    metrics::gauge!("leasehold_listener_up").decrement(1.0);
    #[cfg(feature = "tracing")]
    match &ended {
        Ok(()) => tracing::info!(target: "leasehold::listener", "waiters' listener stopped"),
        Err(error) => tracing::warn!(
            target: "leasehold::listener",
            error = error.as_str(),
            "waiters' listener disconnected; waiters poll until it is back"
        ),
    }
    ended
}

/// The `metrics` half: names, labels and descriptions in one place.
#[cfg(feature = "metrics")]
mod metered {
    use std::time::Duration;

    use metrics::Unit;

    use crate::error::Operation;

    /// Counts one lease or guard call and records its duration.
    pub(super) fn call(
        operation: Operation,
        outcome: &'static str,
        refused: Option<&'static str>,
        elapsed: Duration,
    ) {
        let name = operation.as_str();
        metrics::counter!("leasehold_calls_total", "operation" => name, "outcome" => outcome)
            .increment(1);
        metrics::histogram!("leasehold_call_duration_seconds", "operation" => name)
            .record(elapsed.as_secs_f64());
        if operation.as_str() == "acquire" {
            metrics::counter!("leasehold_acquire_total", "outcome" => outcome).increment(1);
        }
        if let Some(kind) = refused {
            metrics::counter!("leasehold_guard_refused_total", "kind" => kind).increment(1);
        }
    }

    pub(super) fn describe() {
        metrics::describe_counter!(
            "leasehold_calls_total",
            Unit::Count,
            "Lease and guard calls, by operation and outcome."
        );
        metrics::describe_counter!(
            "leasehold_acquire_total",
            Unit::Count,
            "Acquire attempts (each attempt of a waiter too), by outcome."
        );
        metrics::describe_counter!(
            "leasehold_guard_refused_total",
            Unit::Count,
            "Guard calls that refused a writer, by kind of refusal."
        );
        metrics::describe_histogram!(
            "leasehold_call_duration_seconds",
            Unit::Seconds,
            "Client-side duration of one lease or guard call, by operation."
        );
        metrics::describe_counter!(
            "leasehold_lease_lost_total",
            Unit::Count,
            "Leases a Keeper lost and keys a KeeperSet lost, by reason."
        );
        metrics::describe_histogram!(
            "leasehold_wait_duration_seconds",
            Unit::Seconds,
            "How long a waiter's acquire waited, by outcome."
        );
        metrics::describe_counter!(
            "leasehold_waiter_wakeups_total",
            Unit::Count,
            "Blocked waiters woken to try again, by cause."
        );
        metrics::describe_gauge!(
            "leasehold_listener_up",
            Unit::Count,
            "Waiters' listener sessions connected (one per database URL)."
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hold::LeaseLoss;
    use crate::lease::outcome::Refusal;

    #[test]
    fn refusals_label_calls_by_sql_status_and_losses_by_reason() {
        let every = [
            Refusal::Lapsed {
                taken_over_by: None,
            },
            Refusal::EpochMismatch { held: None },
            Refusal::Superseded { by: 3.into() },
            Refusal::Released,
            Refusal::ForceReleased,
            Refusal::NeverHeld,
        ];
        for why in every {
            assert_eq!(Renewal::Refused(why).outcome(), why.as_status());
            assert_eq!(LeaseLoss::Refused(why).reason(), why.as_reason());
        }
        assert_eq!(
            LeaseLoss::DeadlinePassed { last_error: None }.reason(),
            "deadline_passed"
        );
    }

    #[test]
    fn key_names_are_hidden_unless_recorded() {
        assert_eq!(TraceKeys::default(), TraceKeys::Hidden);
        assert_eq!(trace_keys(), TraceKeys::Hidden);
    }
}
