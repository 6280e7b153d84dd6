//! A number's accepted range, and the error naming its key when it is out of
//! it: the one check every tidegate configuration (the gateway's keys,
//! `tidegate-ca`'s flags) runs over its numbers at load.

use std::time::Duration;

/// What a number is, for the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unit {
    Millis,
    Bytes,
    Count,
}

/// One row: a key, its value and its accepted range, inclusive.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    pub key: &'static str,
    value: u64,
    min: u64,
    max: u64,
    unit: Unit,
    /// Why the range is what it is, when that is not obvious.
    why: &'static str,
}

const fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// A duration between `min` and `max`.
pub fn dur(key: &'static str, value: Duration, min: Duration, max: Duration) -> Row {
    Row::new(key, ms(value), ms(min), ms(max), Unit::Millis)
}

/// A size in bytes between `min` and `max`.
pub fn bytes(key: &'static str, value: u32, min: u64, max: u64) -> Row {
    Row::new(key, value.into(), min, max, Unit::Bytes)
}

/// A count between `min` and `max`.
pub fn count(key: &'static str, value: u64, min: u64, max: u64) -> Row {
    Row::new(key, value, min, max, Unit::Count)
}

/// One numeric key's value and accepted range, written as the load errors
/// write them (`10s`, `4MiB`), for generated references.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRange {
    pub key: &'static str,
    pub value: String,
    pub min: String,
    pub max: String,
}

impl Row {
    fn new(key: &'static str, value: u64, min: u64, max: u64, unit: Unit) -> Row {
        Row {
            key,
            value,
            min,
            max,
            unit,
            why: "",
        }
    }

    /// The reason the message gives for the range.
    pub fn because(mut self, why: &'static str) -> Row {
        self.why = why;
        self
    }

    fn show(&self, v: u64) -> String {
        match self.unit {
            Unit::Millis => show_duration(v),
            Unit::Bytes => show_size(v),
            Unit::Count => v.to_string(),
        }
    }

    /// `None` when the value is in range, else the message for the key.
    pub fn check(&self) -> Option<String> {
        if (self.min..=self.max).contains(&self.value) {
            return None;
        }
        let why = if self.why.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.why)
        };
        Some(format!(
            "{} is out of range: must be between {} and {}{why}",
            self.show(self.value),
            self.show(self.min),
            self.show(self.max),
        ))
    }

    /// The row as a reference shows it.
    pub fn key_range(&self) -> KeyRange {
        KeyRange {
            key: self.key,
            value: self.show(self.value),
            min: self.show(self.min),
            max: self.show(self.max),
        }
    }
}

/// The first row out of range, as (key, message).
pub fn first_out_of_range(rows: &[Row]) -> Result<(), (&'static str, String)> {
    match rows.iter().find_map(|r| r.check().map(|m| (r.key, m))) {
        Some(bad) => Err(bad),
        None => Ok(()),
    }
}

/// `90000` → `90s`, `3600000` → `1h`: the largest unit that is exact.
pub fn show_duration(ms: u64) -> String {
    for (unit, per) in [("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
        if ms != 0 && ms % per == 0 {
            return format!("{}{unit}", ms / per);
        }
    }
    format!("{ms}ms")
}

/// `65536` → `64KiB`: the largest binary unit that is exact.
pub fn show_size(b: u64) -> String {
    for (unit, per) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if b != 0 && b % per == 0 {
            return format!("{}{unit}", b / per);
        }
    }
    format!("{b} bytes")
}

pub const fn millis(n: u64) -> Duration {
    Duration::from_millis(n)
}
pub const fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}
pub const MIN: Duration = secs(60);
pub const HOUR: Duration = secs(3600);
pub const DAY: Duration = secs(24 * 3600);
pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_read_in_the_units_they_were_written_in() {
        assert_eq!(show_duration(90_000), "90s");
        assert_eq!(show_duration(3_600_000), "1h");
        assert_eq!(show_duration(1_500), "1500ms");
        assert_eq!(show_size(16 * MIB - 1), "16777215 bytes");
        assert_eq!(show_size(64 * KIB), "64KiB");
    }

    #[test]
    fn a_value_out_of_range_names_the_range_and_the_reason() {
        let r = count("--max-connections", 0, 1, 10).because("each holds a descriptor");
        assert_eq!(
            r.check().as_deref(),
            Some("0 is out of range: must be between 1 and 10 (each holds a descriptor)")
        );
        assert_eq!(dur("t", secs(5), secs(1), MIN).check(), None);
        assert_eq!(
            first_out_of_range(&[count("a", 1, 1, 2), dur("b", HOUR, secs(1), MIN)]),
            Err(("b", "1h is out of range: must be between 1s and 1m".into()))
        );
    }
}
