//! Reading a policy's JSON configuration with errors that name the key.
//!
//! ```
//! use tidegate_sdk::config::Config;
//! let mut c = Config::parse(r#"{"hold-ms": 3000}"#).unwrap();
//! assert_eq!(c.u64("hold-ms", 5_000, 0..=60_000).unwrap(), 3_000);
//! assert_eq!(c.bool("close-notify", true).unwrap(), true);
//! c.finish().unwrap();
//!
//! let mut c = Config::parse(r#"{"hold-ms": "soon"}"#).unwrap();
//! let err = c.u64("hold-ms", 5_000, 0..=60_000).unwrap_err();
//! assert!(err.contains("`hold-ms`"), "{err}");
//! ```

use std::collections::BTreeSet;
use std::ops::RangeInclusive;

use serde_json::{Map, Value};

/// A flat JSON object of settings. Read each key with a typed getter that
/// takes its default and accepted range, then call [`Config::finish`] to
/// refuse keys nobody read (typos).
#[derive(Debug)]
pub struct Config {
    map: Map<String, Value>,
    read: BTreeSet<String>,
}

impl Config {
    /// Parses `text`, which must be a JSON object; empty text (or only
    /// whitespace) means `{}`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let map = if text.trim().is_empty() {
            Map::new()
        } else {
            match serde_json::from_str::<Value>(text) {
                Ok(Value::Object(map)) => map,
                Ok(other) => {
                    return Err(format!(
                        "config must be a JSON object, got {}",
                        kind_of(&other)
                    ))
                }
                Err(e) => return Err(format!("config is not valid JSON: {e}")),
            }
        };
        Ok(Self {
            map,
            read: BTreeSet::new(),
        })
    }

    fn get(&mut self, key: &str) -> Option<&Value> {
        self.read.insert(key.to_owned());
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// An unsigned integer in `range`, or `default` when the key is absent
    /// or null.
    pub fn u64(
        &mut self,
        key: &str,
        default: u64,
        range: RangeInclusive<u64>,
    ) -> Result<u64, String> {
        let Some(v) = self.get(key) else {
            return Ok(default);
        };
        match v.as_u64() {
            Some(n) if range.contains(&n) => Ok(n),
            _ => Err(format!(
                "config key `{key}`: expected an integer from {} to {}, got {v}",
                range.start(),
                range.end()
            )),
        }
    }

    /// Like [`Config::u64`] for `u32` values.
    pub fn u32(
        &mut self,
        key: &str,
        default: u32,
        range: RangeInclusive<u32>,
    ) -> Result<u32, String> {
        let wide = RangeInclusive::new(u64::from(*range.start()), u64::from(*range.end()));
        let n = self.u64(key, u64::from(default), wide)?;
        Ok(u32::try_from(n).expect("range is within u32"))
    }

    /// A number in `range`, or `default`.
    pub fn f64(
        &mut self,
        key: &str,
        default: f64,
        range: RangeInclusive<f64>,
    ) -> Result<f64, String> {
        let Some(v) = self.get(key) else {
            return Ok(default);
        };
        match v.as_f64() {
            Some(n) if range.contains(&n) => Ok(n),
            _ => Err(format!(
                "config key `{key}`: expected a number from {} to {}, got {v}",
                range.start(),
                range.end()
            )),
        }
    }

    /// `true` or `false`, or `default`.
    pub fn bool(&mut self, key: &str, default: bool) -> Result<bool, String> {
        let Some(v) = self.get(key) else {
            return Ok(default);
        };
        v.as_bool()
            .ok_or_else(|| format!("config key `{key}`: expected true or false, got {v}"))
    }

    /// A non-empty string, or `default`.
    pub fn string(&mut self, key: &str, default: &str) -> Result<String, String> {
        let Some(v) = self.get(key) else {
            return Ok(default.to_owned());
        };
        match v.as_str() {
            Some(s) if !s.is_empty() => Ok(s.to_owned()),
            _ => Err(format!(
                "config key `{key}`: expected a non-empty string, got {v}"
            )),
        }
    }

    /// One of the named `choices`, or `default`.
    pub fn choice<T: Copy>(
        &mut self,
        key: &str,
        default: T,
        choices: &[(&str, T)],
    ) -> Result<T, String> {
        let Some(v) = self.get(key) else {
            return Ok(default);
        };
        let found = v
            .as_str()
            .and_then(|s| choices.iter().find(|(name, _)| *name == s));
        match found {
            Some((_, value)) => Ok(*value),
            None => {
                let names: Vec<String> = choices.iter().map(|(n, _)| format!("\"{n}\"")).collect();
                Err(format!(
                    "config key `{key}`: expected one of {}, got {v}",
                    names.join(", ")
                ))
            }
        }
    }

    /// Fails on keys no getter asked for, naming them and the known keys.
    pub fn finish(self) -> Result<(), String> {
        let unknown: Vec<&str> = self
            .map
            .keys()
            .filter(|k| !self.read.contains(*k))
            .map(String::as_str)
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        let known: Vec<&str> = self.read.iter().map(String::as_str).collect();
        Err(format!(
            "unknown config key `{}` (known keys: {})",
            unknown.join("`, `"),
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            }
        ))
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_text_is_an_empty_object_and_defaults_apply() {
        let mut c = Config::parse("  \n").unwrap();
        assert_eq!(c.u64("a", 7, 0..=10).unwrap(), 7);
        assert_eq!(c.f64("b", 0.5, 0.0..=1.0).unwrap(), 0.5);
        assert!(!c.bool("c", false).unwrap());
        assert_eq!(c.string("d", "x").unwrap(), "x");
        c.finish().unwrap();
    }

    #[test]
    fn values_are_read_and_null_means_default() {
        let mut c =
            Config::parse(r#"{"a": 3, "b": 0.25, "c": true, "d": "y", "e": "two", "n": null}"#)
                .unwrap();
        assert_eq!(c.u32("a", 7, 0..=10).unwrap(), 3);
        assert_eq!(c.f64("b", 0.5, 0.0..=1.0).unwrap(), 0.25);
        assert!(c.bool("c", false).unwrap());
        assert_eq!(c.string("d", "x").unwrap(), "y");
        assert_eq!(c.choice("e", 1, &[("one", 1), ("two", 2)]).unwrap(), 2);
        assert_eq!(c.u64("n", 9, 0..=10).unwrap(), 9);
        c.finish().unwrap();
    }

    #[test]
    fn errors_name_the_key_and_the_accepted_form() {
        let mut c =
            Config::parse(r#"{"a": 11, "b": -1, "c": "yes", "e": "three", "d": ""}"#).unwrap();
        let e = c.u64("a", 0, 0..=10).unwrap_err();
        assert!(
            e.contains("`a`") && e.contains("from 0 to 10") && e.contains("11"),
            "{e}"
        );
        let e = c.f64("b", 0.0, 0.0..=1.0).unwrap_err();
        assert!(e.contains("`b`") && e.contains("-1"), "{e}");
        let e = c.bool("c", false).unwrap_err();
        assert!(e.contains("`c`") && e.contains("true or false"), "{e}");
        let e = c.choice("e", 1, &[("one", 1), ("two", 2)]).unwrap_err();
        assert!(e.contains("`e`") && e.contains("\"one\", \"two\""), "{e}");
        let e = c.string("d", "x").unwrap_err();
        assert!(e.contains("`d`") && e.contains("non-empty"), "{e}");
    }

    #[test]
    fn unknown_keys_are_refused_by_name() {
        let mut c = Config::parse(r#"{"hold-ms": 1, "hodl-ms": 2}"#).unwrap();
        c.u64("hold-ms", 0, 0..=10).unwrap();
        let e = c.finish().unwrap_err();
        assert!(
            e.contains("`hodl-ms`") && e.contains("known keys: hold-ms"),
            "{e}"
        );
    }

    #[test]
    fn non_objects_and_bad_json_are_refused() {
        assert!(Config::parse("[1]").unwrap_err().contains("an array"));
        assert!(Config::parse("{").unwrap_err().contains("not valid JSON"));
    }
}
