//! `-o table|json|yaml`: every read command prints a table by default, or
//! the same facts as JSON or YAML with the keys docs/cli.md lists (stable:
//! a key is added, never renamed or removed, within a major version).

use serde::Serialize;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    #[default]
    Table,
    Json,
    Yaml,
}

impl Output {
    /// `value` as JSON or YAML, or the table `table` draws.
    pub fn render<T: Serialize>(self, value: &T, table: impl FnOnce() -> String) -> String {
        match self {
            Output::Table => table(),
            Output::Json => {
                let mut out = serde_json::to_string_pretty(value).expect("values serialize");
                out.push('\n');
                out
            }
            Output::Yaml => serde_yaml::to_string(value).expect("values serialize"),
        }
    }
}

/// Columns padded to their widest cell; the last one is not padded.
pub fn table<const N: usize>(header: [&str; N], rows: &[[String; N]]) -> String {
    let header = header.map(str::to_owned);
    let mut width = [0; N];
    for r in std::iter::once(&header).chain(rows) {
        for (w, cell) in width.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for r in std::iter::once(&header).chain(rows) {
        for (i, (w, cell)) in width.iter().zip(r).enumerate() {
            if i + 1 == N {
                out += cell;
            } else {
                out += &format!("{cell:<width$}  ", width = *w);
            }
        }
        out += "\n";
    }
    out
}

/// A table cell from a string field of `v`: `-` when absent.
pub fn str_of<'a>(v: &'a serde_json::Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("-")
}

/// The elements of an array value (none when it is not one).
pub fn list(v: &serde_json::Value) -> &[serde_json::Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// A table cell from an array of strings, joined by `sep`: `-` when empty.
pub fn joined(v: &serde_json::Value, sep: &str) -> String {
    let all: Vec<&str> = list(v)
        .iter()
        .filter_map(serde_json::Value::as_str)
        .collect();
    if all.is_empty() {
        "-".into()
    } else {
        all.join(sep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_yaml_parse_back_and_tables_line_up() {
        let v = serde_json::json!({"a": [1, 2], "b": "x"});
        let json = Output::Json.render(&v, || unreachable!());
        assert_eq!(serde_json::from_str::<serde_json::Value>(&json).unwrap(), v);
        let yaml = Output::Yaml.render(&v, || unreachable!());
        assert_eq!(serde_yaml::from_str::<serde_json::Value>(&yaml).unwrap(), v);
        let t = table(
            ["NAME", "WHY"],
            &[["long-name".into(), "a".into()], ["x".into(), "b c".into()]],
        );
        assert_eq!(t, "NAME       WHY\nlong-name  a\nx          b c\n");
    }
}
