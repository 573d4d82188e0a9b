//! Showing leasehold's spans and events on stderr, when `LEASEHOLD_LOG`
//! asks for them.
//!
//! The library emits its telemetry through the `tracing` facade and leaves
//! the choice of a subscriber to the application; this command is one, and
//! an operator debugging a slow acquire or a waiter that never wakes wants
//! to see those spans. They go to stderr only: stdout carries the results,
//! and with `--json` scripts parse it.
//!
//! Only `LEASEHOLD_LOG` switches this on, not `RUST_LOG`: shells and
//! service units often export `RUST_LOG` for some other program, and an
//! operator tool that started writing debug lines because of it would
//! surprise the scripts that read its stderr. Without the variable (or with
//! it empty) no subscriber is installed and the output is what it always
//! was.
//!
//! Metrics are left alone on purpose: a one-shot command ends before any
//! scraper could read a recorder, so applications that want leasehold's
//! metrics install their own recorder.

use std::ffi::OsString;
use std::io::IsTerminal;

use tracing_subscriber::filter::{EnvFilter, ParseError};
use tracing_subscriber::fmt::format::FmtSpan;

/// The environment variable holding the filter, e.g. `leasehold=debug`.
pub const LOG_VARIABLE: &str = "LEASEHOLD_LOG";

/// Why the subscriber `LEASEHOLD_LOG` asked for could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum LogSetupError {
    /// The variable's value is not a filter (`tracing-subscriber`'s
    /// `EnvFilter` syntax).
    #[error("{LOG_VARIABLE}={value:?} is not a log filter ({source}); use e.g. {LOG_VARIABLE}=leasehold=debug, or unset it")]
    InvalidFilter {
        /// The value as given.
        value: String,
        /// What the filter parser refused.
        #[source]
        source: ParseError,
    },
    /// The variable's value is not UTF-8, so it cannot be a filter.
    #[error("{LOG_VARIABLE} is not valid UTF-8 ({value:?}); use e.g. {LOG_VARIABLE}=leasehold=debug, or unset it")]
    NotUnicode {
        /// The value, lossily decoded for the message.
        value: String,
    },
    /// Another global subscriber was installed first (a bug of this
    /// command: it installs one, once, at start-up).
    #[error("cannot install the {LOG_VARIABLE} log subscriber: {0}")]
    Install(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Applies `--trace-keys`, then installs the stderr subscriber if
/// `LEASEHOLD_LOG` is set to a filter. Call once, before any lease call.
pub fn install(trace_keys: bool) -> Result<(), LogSetupError> {
    if trace_keys {
        leasehold::telemetry::set_trace_keys(leasehold::telemetry::TraceKeys::Recorded);
    }
    let Some(filter) = filter_from(std::env::var_os(LOG_VARIABLE))? else {
        return Ok(());
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // leasehold's lease and guard spans contain no events of their
        // own: a line when each one closes is what shows the call, with
        // the outcome and duration recorded by then.
        .with_span_events(FmtSpan::CLOSE)
        // Colours for a person at a terminal, plain text for a file or a
        // pipe that a script reads.
        .with_ansi(std::io::stderr().is_terminal())
        .try_init()
        .map_err(LogSetupError::Install)
}

/// The filter the variable's value asks for; `None` when it is unset or
/// empty (nothing is installed then).
fn filter_from(value: Option<OsString>) -> Result<Option<EnvFilter>, LogSetupError> {
    let Some(value) = value.filter(|value| !value.is_empty()) else {
        return Ok(None);
    };
    let text = value
        .into_string()
        .map_err(|value| LogSetupError::NotUnicode {
            value: value.to_string_lossy().into_owned(),
        })?;
    EnvFilter::try_new(&text)
        .map(Some)
        .map_err(|source| LogSetupError::InvalidFilter {
            value: text,
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_or_empty_installs_nothing() {
        assert!(filter_from(None).unwrap().is_none());
        assert!(filter_from(Some(OsString::new())).unwrap().is_none());
    }

    #[test]
    fn a_target_filter_is_accepted_and_a_bad_level_refused() {
        assert!(filter_from(Some("leasehold=debug".into()))
            .unwrap()
            .is_some());
        match filter_from(Some("leasehold=loud".into())) {
            Err(LogSetupError::InvalidFilter { value, .. }) => assert_eq!(value, "leasehold=loud"),
            other => panic!("expected InvalidFilter, got {other:?}"),
        }
    }
}
