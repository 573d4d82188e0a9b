//! A `tracing` subscriber that keeps every span and event with its fields
//! as text, for assertions on what was (and was not) recorded.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// A span or an event as captured.
#[derive(Debug, Clone)]
pub struct Captured {
    pub name: String,
    pub target: String,
    pub level: Level,
    pub fields: BTreeMap<String, String>,
}

impl Captured {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

#[derive(Default)]
struct Store {
    /// By id; ids are never reused, so a span recorded after a clear()
    /// cannot land on another one.
    spans: BTreeMap<u64, Captured>,
    last_id: u64,
    events: Vec<Captured>,
}

#[derive(Clone, Default)]
pub struct Capture {
    store: Arc<Mutex<Store>>,
}

impl Capture {
    pub fn clear(&self) {
        let mut store = self.store.lock().unwrap();
        store.spans.clear();
        store.events.clear();
    }

    pub fn spans(&self) -> Vec<Captured> {
        self.store.lock().unwrap().spans.values().cloned().collect()
    }

    pub fn events(&self) -> Vec<Captured> {
        self.store.lock().unwrap().events.clone()
    }

    /// Every field value of every span and event, for "never recorded"
    /// checks.
    pub fn all_text(&self) -> String {
        let store = self.store.lock().unwrap();
        store
            .spans
            .values()
            .chain(store.events.iter())
            .flat_map(|captured| captured.fields.iter().map(|(k, v)| format!("{k}={v}\n")))
            .collect()
    }
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

fn captured(metadata: &Metadata<'_>) -> Captured {
    Captured {
        name: metadata.name().to_owned(),
        target: metadata.target().to_owned(),
        level: *metadata.level(),
        fields: BTreeMap::new(),
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, attributes: &Attributes<'_>) -> Id {
        let mut span = captured(attributes.metadata());
        attributes.record(&mut Fields(&mut span.fields));
        let mut store = self.store.lock().unwrap();
        store.last_id += 1;
        let id = store.last_id;
        store.spans.insert(id, span);
        Id::from_u64(id)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut store = self.store.lock().unwrap();
        if let Some(span) = store.spans.get_mut(&span.into_u64()) {
            values.record(&mut Fields(&mut span.fields));
        }
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut captured = captured(event.metadata());
        event.record(&mut Fields(&mut captured.fields));
        self.store.lock().unwrap().events.push(captured);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}
