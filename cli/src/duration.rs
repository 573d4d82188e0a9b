//! Human durations on the command line: `30s`, `1m30s`, `250ms`, `2h`.
//!
//! Why not bare numbers? A ttl of `30` is ambiguous (seconds? milliseconds?)
//! and a wrong guess is a liveness bug that shows up only under load, so
//! every number needs its unit. Output uses the same form, so what the CLI
//! prints can be pasted back into it.

use std::time::Duration;

/// Units accepted, longest suffix first so `ms` is not read as `m` + `s`.
const UNITS: [(&str, u64); 4] = [("ms", 1), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)];

/// Parses `30s`, `1m30s`, `250ms`, `2h`, `1h2m3s4ms`: one or more whole
/// numbers, each followed by a unit. Used as a clap value parser, so the
/// message says what to write instead.
pub fn parse(text: &str) -> Result<Duration, String> {
    let hint = "write a whole number with a unit, e.g. 30s, 1m30s, 250ms or 2h";
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(format!("empty duration; {hint}"));
    }
    let mut rest = trimmed;
    let mut total_ms: u64 = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!(
                "{text:?} is not a duration (expected a number at {rest:?}); {hint}"
            ));
        }
        let (number, after) = rest.split_at(digits);
        let Some((unit, factor)) = UNITS.iter().find(|(unit, _)| after.starts_with(unit)) else {
            return Err(format!(
                "{text:?} has a number without a unit (ms, s, m or h) at {after:?}; {hint}"
            ));
        };
        let value: u64 = number
            .parse()
            .map_err(|_| format!("{text:?} is too large; {hint}"))?;
        total_ms = value
            .checked_mul(*factor)
            .and_then(|ms| total_ms.checked_add(ms))
            .ok_or_else(|| format!("{text:?} is too large; {hint}"))?;
        rest = &after[unit.len()..];
    }
    Ok(Duration::from_millis(total_ms))
}

/// Formats like [`parse`] reads, to millisecond precision: `1m30s`, `250ms`.
pub fn format(duration: Duration) -> String {
    let mut ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return "0ms".to_owned();
    }
    let mut out = String::new();
    for (unit, factor) in [("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
        if ms >= factor {
            out.push_str(&format!("{}{unit}", ms / factor));
            ms %= factor;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit_and_combinations() {
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("1h2m3s4ms"), Ok(Duration::from_millis(3_723_004)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_numbers_without_units_and_garbage() {
        for bad in ["", "30", "s", "1.5s", "10x", "-1s", "99999999999999999999h"] {
            let error = parse(bad).expect_err(bad);
            assert!(error.contains("e.g. 30s"), "{bad}: {error}");
        }
    }

    #[test]
    fn format_round_trips() {
        for text in ["250ms", "30s", "1m30s", "2h", "1h2m3s4ms"] {
            assert_eq!(format(parse(text).unwrap()), text);
        }
        assert_eq!(format(Duration::ZERO), "0ms");
    }
}
