//! A tiny JSON writer for `--json` output.
//!
//! Hand-written rather than serde_json because the CLI only ever writes flat
//! objects of strings, numbers and booleans, and the library's dependency
//! list should not grow for that.

use std::fmt;

use chrono::{DateTime, SecondsFormat, Utc};

/// A JSON value.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A string.
    Str(String),
    /// An array.
    Array(Vec<Json>),
    /// An object; keys keep their order.
    Object(Vec<(&'static str, Json)>),
}

impl Json {
    /// A string value.
    pub fn str(text: impl Into<String>) -> Json {
        Json::Str(text.into())
    }

    /// A server timestamp in RFC 3339 with microseconds, or `null`.
    pub fn time(instant: Option<DateTime<Utc>>) -> Json {
        instant.map_or(Json::Null, |t| {
            Json::Str(t.to_rfc3339_opts(SecondsFormat::Micros, true))
        })
    }

    /// An integer, or `null`.
    pub fn int(value: Option<i64>) -> Json {
        value.map_or(Json::Null, Json::Int)
    }

    /// A string, or `null`.
    pub fn opt_str(value: Option<&str>) -> Json {
        value.map_or(Json::Null, Json::str)
    }
}

impl fmt::Display for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Json::Null => f.write_str("null"),
            Json::Bool(value) => write!(f, "{value}"),
            Json::Int(value) => write!(f, "{value}"),
            Json::Str(text) => write_string(f, text),
            Json::Array(items) => {
                f.write_str("[")?;
                for (index, item) in items.iter().enumerate() {
                    if index > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
            Json::Object(fields) => {
                f.write_str("{")?;
                for (index, (name, value)) in fields.iter().enumerate() {
                    if index > 0 {
                        f.write_str(",")?;
                    }
                    write_string(f, name)?;
                    write!(f, ":{value}")?;
                }
                f.write_str("}")
            }
        }
    }
}

fn write_string(f: &mut fmt::Formatter<'_>, text: &str) -> fmt::Result {
    f.write_str("\"")?;
    for ch in text.chars() {
        match ch {
            '"' => f.write_str("\\\"")?,
            '\\' => f.write_str("\\\\")?,
            '\n' => f.write_str("\\n")?,
            '\r' => f.write_str("\\r")?,
            '\t' => f.write_str("\\t")?,
            c if u32::from(c) < 0x20 => write!(f, "\\u{:04x}", u32::from(c))?,
            c => write!(f, "{c}")?,
        }
    }
    f.write_str("\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_strings_and_nests() {
        let value = Json::Object(vec![
            ("a", Json::str("q\"\\\n\u{1}ä")),
            (
                "b",
                Json::Array(vec![Json::Int(-1), Json::Bool(true), Json::Null]),
            ),
        ]);
        assert_eq!(
            value.to_string(),
            r#"{"a":"q\"\\\n\u0001ä","b":[-1,true,null]}"#
        );
    }
}
