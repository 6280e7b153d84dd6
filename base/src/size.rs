//! Byte sizes in the config: a number, or `64KiB`, `4MiB`.
//!
//! Written like [`crate::duration`].

use serde::{Deserialize, Deserializer};
use serde_yaml::Value;

fn form(s: &str) -> String {
    format!("{s:?} is not a byte size like 65536, 64KiB or 4MiB (at most 4GiB-1)")
}

/// Parses `65536`, `64KiB` or `4MiB` into at most `u32::MAX` bytes.
pub fn parse_u32(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let (num, mult) = if let Some(n) = t.strip_suffix("KiB") {
        (n, 1u64 << 10)
    } else if let Some(n) = t.strip_suffix("MiB") {
        (n, 1 << 20)
    } else {
        (t, 1)
    };
    let n = num.trim().parse::<u64>().map_err(|_| form(s))?;
    n.checked_mul(mult)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| form(s))
}

pub fn deserialize_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    match Value::deserialize(d)? {
        Value::Number(n) => parse_u32(&n.to_string()),
        Value::String(s) => parse_u32(&s),
        other => Err(form(&format!("{other:?}"))),
    }
    .map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_u32("64KiB"), Ok(64 << 10));
        assert_eq!(parse_u32("4 MiB"), Ok(4 << 20));
        assert_eq!(parse_u32("65536"), Ok(65536));
        assert!(parse_u32("4096MiB").is_err());
        assert!(parse_u32("18446744073709551615MiB").is_err());
        assert!(parse_u32("-1").is_err());
    }
}
