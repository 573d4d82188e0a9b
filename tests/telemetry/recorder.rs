//! A `metrics` recorder that keeps every series in memory, keyed by its
//! name and sorted labels (`name{label=value,...}`), for exact assertions.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

#[derive(Default)]
pub struct TestRecorder {
    counters: Mutex<BTreeMap<String, Arc<AtomicU64>>>,
    gauges: Mutex<BTreeMap<String, Arc<AtomicU64>>>,
    histograms: Mutex<BTreeMap<String, Arc<Samples>>>,
    described: Mutex<BTreeMap<String, String>>,
}

#[derive(Default)]
struct Samples(Mutex<Vec<f64>>);

impl HistogramFn for Samples {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

/// `name{a=x,b=y}` with the labels sorted; `name` without labels.
fn series(key: &Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|label| format!("{}={}", label.key(), label.value()))
        .collect();
    labels.sort();
    if labels.is_empty() {
        key.name().to_owned()
    } else {
        format!("{}{{{}}}", key.name(), labels.join(","))
    }
}

impl TestRecorder {
    pub fn clear(&self) {
        self.counters.lock().unwrap().clear();
        self.gauges.lock().unwrap().clear();
        self.histograms.lock().unwrap().clear();
        self.described.lock().unwrap().clear();
    }

    /// Every counter series and its value.
    pub fn counters(&self) -> BTreeMap<String, u64> {
        self.counters
            .lock()
            .unwrap()
            .iter()
            .map(|(name, value)| (name.clone(), value.load(Ordering::SeqCst)))
            .collect()
    }

    /// One counter's value (0 when never incremented).
    pub fn counter(&self, series: &str) -> u64 {
        self.counters().get(series).copied().unwrap_or(0)
    }

    /// One gauge's value (0 when never set).
    pub fn gauge(&self, series: &str) -> f64 {
        self.gauges
            .lock()
            .unwrap()
            .get(series)
            .map_or(0.0, |bits| f64::from_bits(bits.load(Ordering::SeqCst)))
    }

    /// The samples one histogram series recorded.
    pub fn samples(&self, series: &str) -> Vec<f64> {
        self.histograms
            .lock()
            .unwrap()
            .get(series)
            .map(|samples| samples.0.lock().unwrap().clone())
            .unwrap_or_default()
    }

    /// Every histogram series and its sample count.
    pub fn histogram_counts(&self) -> BTreeMap<String, usize> {
        self.histograms
            .lock()
            .unwrap()
            .iter()
            .map(|(name, samples)| (name.clone(), samples.0.lock().unwrap().len()))
            .collect()
    }

    /// The names described so far, with their help text.
    pub fn described(&self) -> BTreeMap<String, String> {
        self.described.lock().unwrap().clone()
    }

    fn describe(&self, key: KeyName, description: SharedString) {
        self.described
            .lock()
            .unwrap()
            .insert(key.as_str().to_owned(), description.to_string());
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn describe_gauge(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn describe_histogram(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let cell = self
            .counters
            .lock()
            .unwrap()
            .entry(series(key))
            .or_default()
            .clone();
        Counter::from_arc(cell)
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let cell = self
            .gauges
            .lock()
            .unwrap()
            .entry(series(key))
            .or_default()
            .clone();
        Gauge::from_arc(cell)
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let cell = self
            .histograms
            .lock()
            .unwrap()
            .entry(series(key))
            .or_default()
            .clone();
        Histogram::from_arc(cell)
    }
}
