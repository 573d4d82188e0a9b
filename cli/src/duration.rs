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
    if trimmed.starts_with('-') {
        return Err(format!(
            "{text:?} is negative; a duration is zero or more: {hint}"
        ));
    }
    let mut rest = trimmed;
    let mut total_ms: u64 = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && rest[digits..].starts_with('.') {
            return Err(fraction(text, rest));
        }
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

/// The message for a number with a fraction at the start of `rest`
/// (`1.5s`): durations are whole numbers, so it names the whole-number
/// spelling of that part when there is one (`1s500ms`).
fn fraction(text: &str, rest: &str) -> String {
    let hint =
        "durations are whole numbers with a unit (ms, s, m or h), e.g. 30s, 1m30s, 250ms or 2h";
    let number: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let after = &rest[number.len()..];
    let whole = UNITS
        .iter()
        .find(|(unit, _)| after.starts_with(unit))
        .and_then(|(_, factor)| {
            let (int, frac) = number.split_once('.')?;
            let scale = 10u64.checked_pow(u32::try_from(frac.len()).ok()?)?;
            let int: u64 = if int.is_empty() { 0 } else { int.parse().ok()? };
            let frac: u64 = if frac.is_empty() {
                0
            } else {
                frac.parse().ok()?
            };
            let scaled = frac.checked_mul(*factor)?;
            (scaled % scale == 0)
                .then(|| int.checked_mul(*factor)?.checked_add(scaled / scale))
                .flatten()
        });
    match whole {
        Some(ms) => format!(
            "{text:?} has a fraction; {hint}: write {} for {number}{}",
            format(Duration::from_millis(ms)),
            after
                .chars()
                .take_while(|c| c.is_ascii_alphabetic())
                .collect::<String>()
        ),
        None => format!("{text:?} has a fraction; {hint}"),
    }
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
    fn fractions_and_negatives_say_what_is_accepted() {
        let half = parse("1.5s").unwrap_err();
        assert!(
            half.contains("has a fraction") && half.contains("write 1s500ms for 1.5s"),
            "{half}"
        );
        let minutes = parse("2m0.25s").unwrap_err();
        assert!(minutes.contains("write 250ms for 0.25s"), "{minutes}");
        let tiny = parse("0.0001s").unwrap_err();
        assert!(
            tiny.contains("has a fraction") && !tiny.contains("write"),
            "{tiny}"
        );
        let negative = parse("-5s").unwrap_err();
        assert!(negative.contains("is negative"), "{negative}");
    }

    #[test]
    fn format_round_trips() {
        for text in ["250ms", "30s", "1m30s", "2h", "1h2m3s4ms"] {
            assert_eq!(format(parse(text).unwrap()), text);
        }
        assert_eq!(format(Duration::ZERO), "0ms");
    }
}
