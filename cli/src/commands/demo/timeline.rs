//! The demo's timeline: who did what, when (milliseconds since the start).
//!
//! Events are stamped and printed under one lock, so the printed order is
//! the order in which the actors logged them; the scenario makes that order
//! deterministic by handing control between threads over channels.

use std::io::Write;
use std::sync::Mutex;
use std::time::Instant;

use crate::json::Json;

/// One line of the timeline.
#[derive(Debug, Clone)]
pub struct Event {
    /// Milliseconds since the demo started.
    pub elapsed_ms: u128,
    /// `demo`, `worker-a` or `worker-b`.
    pub actor: &'static str,
    /// What happened, in words.
    pub what: String,
}

/// Collects events; prints each at once unless the output is JSON.
pub struct Timeline {
    start: Instant,
    live: bool,
    events: Mutex<Vec<Event>>,
}

impl Timeline {
    /// Starts the clock. `live`: print events as they happen.
    pub fn new(live: bool) -> Self {
        Self {
            start: Instant::now(),
            live,
            events: Mutex::new(Vec::new()),
        }
    }

    /// Records (and, when live, prints) one event.
    pub fn log(&self, actor: &'static str, what: impl Into<String>) {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let event = Event {
            elapsed_ms: self.start.elapsed().as_millis(),
            actor,
            what: what.into(),
        };
        if self.live {
            let mut stdout = std::io::stdout().lock();
            // A closed stdout must not stop the scenario; the exit code
            // still reports its outcome.
            let _ = writeln!(
                stdout,
                "{:>7} ms  {:<8}  {}",
                event.elapsed_ms, event.actor, event.what
            );
            let _ = stdout.flush();
        }
        events.push(event);
    }

    /// All events so far, as JSON.
    pub fn to_json(&self) -> Json {
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        Json::Array(
            events
                .iter()
                .map(|event| {
                    Json::Object(vec![
                        (
                            "elapsed_ms",
                            Json::Int(i64::try_from(event.elapsed_ms).unwrap_or(i64::MAX)),
                        ),
                        ("actor", Json::str(event.actor)),
                        ("event", Json::str(&event.what)),
                    ])
                })
                .collect(),
        )
    }
}
