//! Durations in the config, the admin API and `--set`: `250ms`, `10s`,
//! `5m`, `1h` (a bare number means seconds).

use std::time::Duration;

use serde::{Deserialize, Deserializer};
use serde_yaml::Value;

/// The longest duration any key accepts. Longer values are refused rather
/// than wrapped or saturated: added to an `Instant` they would panic, and a
/// grace period of centuries is a typo, not a policy.
pub const MAX: Duration = Duration::from_secs(MAX_SECS);
const MAX_SECS: u64 = 366 * 24 * 3600;

const FORM: &str = "a duration like 500ms, 10s, 5m or 1h";

fn too_long(s: &str) -> String {
    format!("{s:?} is too long: durations must be between 0ms and 8784h (366 days)")
}

/// Parses `500ms`, `10s`, `5m`, `1h` or a bare number of seconds, at most [`MAX`].
pub fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err(format!("{s:?} is not {FORM}"));
    }
    let n: u64 = match num.parse() {
        Ok(n) => n,
        // All digits, so the only way to fail is to overflow u64.
        Err(_) => return Err(too_long(s)),
    };
    let ms_per_unit: u64 = match unit.trim() {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(format!("{s:?} is not {FORM}")),
    };
    let ms = n.checked_mul(ms_per_unit).ok_or_else(|| too_long(s))?;
    let d = Duration::from_millis(ms);
    if d > MAX {
        return Err(too_long(s));
    }
    Ok(d)
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    match Value::deserialize(d)? {
        Value::Number(n) if n.as_u64().is_some() => parse(&n.to_string()),
        Value::String(s) => parse(&s),
        other => Err(format!("{other:?} is not {FORM}")),
    }
    .map_err(serde::de::Error::custom)
}

pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{}ms", d.as_millis()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_bare_seconds() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse(" 5m "), Ok(Duration::from_secs(300)));
        assert_eq!(parse("8784h"), Ok(MAX));
        assert!(parse("soon").unwrap_err().contains("500ms"));
        assert!(parse("5d").unwrap_err().contains("500ms"));
    }

    #[test]
    fn absurd_durations_are_errors_not_overflows() {
        // `n * 60` / `n * 3600` used to overflow (a panic in debug builds, a
        // wrapped short duration in release).
        for s in [
            "99999999999999h",
            "307445734561825861m",
            "18446744073709551615s",
            "99999999999999999999999",
            "8785h",
        ] {
            let e = parse(s).unwrap_err();
            assert!(e.contains("8784h"), "{s}: {e}");
        }
    }
}
