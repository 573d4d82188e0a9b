//! Reading values out of JSON answers (the CLI's `--json` output, the web
//! example's responses).

use chrono::{DateTime, Utc};
use serde_json::Value;

/// A server timestamp written as an RFC 3339 JSON string.
pub fn time_of(value: &Value) -> DateTime<Utc> {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("not a timestamp: {value}"));
    DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|error| panic!("{text}: {error}"))
        .with_timezone(&Utc)
}
