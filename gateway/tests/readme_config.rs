//! The README's configuration example shows the embedded default's policy
//! lines, so what a reader sees is what `cargo xtask demo` runs: the same
//! default, fallback and bindings, and for every plugin the example names,
//! the same file and configuration.

use tidegate::config::Config;

const README: &str = include_str!("../../README.md");

/// The first YAML block of the README's "## Configuration" section.
fn config_example() -> &'static str {
    let section = README
        .split_once("\n## Configuration\n")
        .expect("README has a Configuration section")
        .1;
    let block = section
        .split_once("```yaml\n")
        .expect("the Configuration section has a yaml block")
        .1;
    block.split_once("```").expect("the yaml block ends").0
}

fn json<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap()
}

#[test]
fn the_readme_config_example_binds_like_the_embedded_default() {
    let readme = Config::from_yaml(config_example())
        .unwrap_or_else(|e| panic!("the README's config example: {e}"));
    let default = Config::from_yaml(tidegate::app::DEFAULT_CONFIG).unwrap();
    let (r, d) = (&readme.policies, &default.policies);
    assert_eq!(r.default, d.default, "policies.default");
    assert_eq!(r.fallback, d.fallback, "policies.fallback");
    assert_eq!(json(&r.bindings), json(&d.bindings), "policies.bindings");
    for name in r.bindings.iter().map(|b| &b.policy).chain(&r.default) {
        assert!(
            r.plugins.contains_key(name),
            "the README example binds {name} but does not list it under plugins"
        );
    }
    for (name, plugin) in &r.plugins {
        let embedded = d
            .plugins
            .get(name)
            .unwrap_or_else(|| panic!("the README names plugin {name}, the default does not"));
        assert_eq!(json(plugin), json(embedded), "policies.plugins.{name}");
    }
    assert_eq!(
        readme.listeners.admin, default.listeners.admin,
        "listeners.admin (tidegate workloads asks it)"
    );
}

/// `docs/configuration.md`: a table row per configuration key with its
/// default and range as the code has them (the meaning column is written by
/// hand). `cargo xtask config-reference` rewrites the generated part.
mod reference {
    use std::collections::BTreeMap;
    use std::fmt::Write as _;
    use std::path::PathBuf;

    use serde_yaml::Value;
    use tidegate::config::{key_ranges, Config};
    use tidegate_base::range::KeyRange;

    const BEGIN: &str = "<!-- config-reference:begin -->";
    const END: &str = "<!-- config-reference:end -->";
    /// Set by `cargo xtask config-reference`: write the table, then check it.
    const WRITE: &str = "TIDEGATE_WRITE_CONFIG_REFERENCE";
    const FIX: &str = "run `cargo xtask config-reference` to rewrite the table from the code \
        (the meanings already written are kept), then write the meaning of each new key";

    /// Configurations that between them reach every key: the default, then
    /// one per variant of a tagged section and one filling every optional
    /// section and collection. A key first met in a later specimen and
    /// written in it is required (when its section is used).
    const SPECIMENS: &[&str] = &[
        "{}",
        "certificates: {source: dir, dir: /d, trust_bundle: /b}",
        "certificates: {source: istio-ca}",
        "policies: {plugins: {'<name>': {file: /p.wasm}}, bindings: [{policy: '<name>'}]}",
        "oci: {auth: {mode: api-key, tenancy: t, user: u, fingerprint: f, key_file: /k},
               opt_in: [{namespace: n}]}",
        "oci: {auth: {mode: workload-identity, proxymux_endpoint: 'https://p'}}",
        "demo: {echo: 127.0.0.1:1}",
    ];

    /// Sections that are internally tagged enums, and their tag: the keys
    /// under them belong to one variant.
    const TAGGED: &[(&str, &str)] = &[("certificates", "source"), ("oci.auth", "mode")];

    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Seg {
        Field(String),
        /// An element of a list (`[]`).
        Elem,
        /// The variant of a tagged section (`source: dir`).
        Variant(String),
    }

    #[derive(Clone, Debug, PartialEq, Eq)]
    struct Key(Vec<Seg>);

    impl Key {
        /// The dotted path as written in a config (`policies.bindings[].policy`).
        fn path(&self) -> String {
            let mut s = String::new();
            for seg in &self.0 {
                match seg {
                    Seg::Field(f) if s.is_empty() => s.push_str(f),
                    Seg::Field(f) => {
                        s.push('.');
                        s.push_str(f)
                    }
                    Seg::Elem => s.push_str("[]"),
                    Seg::Variant(_) => {}
                }
            }
            s
        }

        /// The table's key cell.
        fn cell(&self) -> String {
            let variant = self.0.iter().find_map(|s| match s {
                Seg::Variant(v) => Some(v),
                _ => None,
            });
            match variant {
                Some(v) => format!("`{}` (`{v}`)", self.path()),
                None => format!("`{}`", self.path()),
            }
        }

        fn section(&self) -> &str {
            match &self.0[0] {
                Seg::Field(f) => f,
                _ => unreachable!("a key starts with a field"),
            }
        }
    }

    /// Every leaf of a serialized configuration with its key: a scalar, an
    /// empty list or map, or a list of scalars. A list of maps stands for
    /// its first element.
    fn leaves(v: &Value, key: Vec<Seg>, out: &mut Vec<(Key, Value)>) {
        match v {
            Value::Mapping(m) if !m.is_empty() => {
                let path = Key(key.clone()).path();
                let tag = TAGGED.iter().find(|(p, _)| *p == path).map(|(_, t)| *t);
                let variant = tag.and_then(|t| {
                    let value = m.get(t)?.as_str()?;
                    Some(Seg::Variant(format!("{t}: {value}")))
                });
                for (k, v) in m {
                    let k = k.as_str().expect("string keys").to_owned();
                    let mut sub = key.clone();
                    if let Some(variant) = variant.as_ref().filter(|_| Some(k.as_str()) != tag) {
                        sub.push(variant.clone());
                    }
                    sub.push(Seg::Field(k));
                    leaves(v, sub, out);
                }
            }
            Value::Sequence(s) if s.first().is_some_and(Value::is_mapping) => {
                let mut sub = key;
                sub.push(Seg::Elem);
                leaves(&s[0], sub, out);
            }
            _ => out.push((Key(key), v.clone())),
        }
    }

    fn flatten(v: &Value) -> Vec<(Key, Value)> {
        let mut out = Vec::new();
        leaves(v, Vec::new(), &mut out);
        out
    }

    /// One row as the code says it.
    struct Row {
        key: Key,
        default: String,
        range: String,
    }

    fn show(value: &Value, range: Option<&KeyRange>) -> String {
        if let Some(r) = range {
            return format!("`{}`", r.value);
        }
        match value {
            Value::Null => "unset".into(),
            Value::String(s) if s.is_empty() => "`\"\"`".into(),
            Value::String(s) => format!("`{s}`"),
            Value::Bool(b) => format!("`{b}`"),
            Value::Number(n) => format!("`{n}`"),
            Value::Sequence(s) if s.is_empty() => "`[]`".into(),
            Value::Mapping(m) if m.is_empty() => "`{}`".into(),
            other => format!("`{}`", serde_json::to_string(other).unwrap()),
        }
    }

    /// Every key of the configuration types, in the order a reader meets
    /// them: a key first met in a later specimen goes after the last key
    /// sharing most of its path.
    fn rows() -> Vec<Row> {
        let mut rows: Vec<Row> = Vec::new();
        for (i, text) in SPECIMENS.iter().enumerate() {
            let config = Config::from_yaml(text)
                .unwrap_or_else(|e| panic!("specimen {text:?} does not load: {e}"));
            let ranges: BTreeMap<&str, KeyRange> = key_ranges(&config)
                .into_iter()
                .map(|r| (r.key, r))
                .collect();
            let given = flatten(&serde_yaml::from_str(text).unwrap());
            for (key, value) in flatten(&serde_yaml::to_value(&config).unwrap()) {
                if rows.iter().any(|r| r.key == key) {
                    continue;
                }
                let range = ranges.get(key.path().as_str());
                let default = if i > 0 && given.iter().any(|(k, _)| *k == key) {
                    "required".to_owned()
                } else {
                    show(&value, range)
                };
                let range =
                    range.map_or("—".to_owned(), |r| format!("`{}` – `{}`", r.min, r.max));
                let shared = |r: &Row| {
                    r.key
                        .0
                        .iter()
                        .zip(&key.0)
                        .take_while(|(a, b)| a == b)
                        .count()
                };
                let best = rows.iter().map(shared).max().unwrap_or(0);
                let at = match rows.iter().rposition(|r| best > 0 && shared(r) == best) {
                    Some(p) => p + 1,
                    None => rows.len(),
                };
                rows.insert(
                    at,
                    Row {
                        key,
                        default,
                        range,
                    },
                );
            }
        }
        rows
    }

    fn doc_path() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md")
    }

    /// The document's rows inside the markers: key cell → (default, range, meaning).
    fn doc_rows(region: &str) -> BTreeMap<String, [String; 3]> {
        region
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| {
                let inner = l.trim().trim_start_matches('|').trim_end_matches('|');
                let cells: Vec<String> = inner
                    .splitn(4, " | ")
                    .map(|c| c.trim().to_owned())
                    .collect();
                let cell = |i: usize| cells.get(i).cloned().unwrap_or_default();
                (cell(0), [cell(1), cell(2), cell(3)])
            })
            .collect()
    }

    /// The generated part: a table per section, meanings from `meanings`.
    fn render(rows: &[Row], meanings: &BTreeMap<String, [String; 3]>) -> String {
        let sections: Vec<&str> =
            rows.iter()
                .map(|r| r.key.section())
                .fold(Vec::new(), |mut v, s| {
                    if !v.contains(&s) {
                        v.push(s);
                    }
                    v
                });
        let is_top = |s: &str| {
            rows.iter()
                .filter(|r| r.key.section() == s)
                .all(|r| r.key.0.len() == 1)
        };
        let mut groups: Vec<(String, Vec<&Row>)> = Vec::new();
        for s in sections {
            let title = if is_top(s) {
                "top level".to_owned()
            } else {
                format!("`{s}`")
            };
            let members = rows.iter().filter(|r| r.key.section() == s);
            match groups.iter_mut().find(|(t, _)| *t == title) {
                Some((_, g)) => g.extend(members),
                None => groups.push((title, members.collect())),
            }
        }
        let mut out = String::new();
        for (title, group) in groups {
            let _ = write!(
                out,
                "\n### {title}\n\n| key | default | range | meaning |\n|---|---|---|---|\n"
            );
            for r in group {
                let cell = r.key.cell();
                let meaning = meanings.get(&cell).map(|m| m[2].as_str()).unwrap_or("");
                let _ = writeln!(out, "| {cell} | {} | {} | {meaning} |", r.default, r.range);
            }
        }
        out.push('\n');
        out
    }

    /// What differs between the document's rows and the code's, key by key.
    fn differences(rows: &[Row], doc: &BTreeMap<String, [String; 3]>) -> Vec<String> {
        let mut out = Vec::new();
        for r in rows {
            let cell = r.key.cell();
            match doc.get(&cell) {
                None => out.push(format!(
                    "{cell} is a key of the config types but has no row"
                )),
                Some([d, range, meaning]) => {
                    if *d != r.default {
                        out.push(format!(
                            "{cell}: the default cell says {d}, the code {}",
                            r.default
                        ));
                    }
                    if *range != r.range {
                        out.push(format!(
                            "{cell}: the range cell says {range}, the code {}",
                            r.range
                        ));
                    }
                    if meaning.is_empty() {
                        out.push(format!("{cell} has no meaning written"));
                    }
                }
            }
        }
        for cell in doc.keys() {
            if !rows.iter().any(|r| r.key.cell() == *cell) {
                out.push(format!(
                    "{cell} has a row but is no key of the config types"
                ));
            }
        }
        out
    }

    #[test]
    fn docs_configuration_lists_every_key_with_its_default_and_range() {
        let path = doc_path();
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (head, rest) = text
            .split_once(BEGIN)
            .unwrap_or_else(|| panic!("{} has no {BEGIN} marker", path.display()));
        let (region, tail) = rest
            .split_once(END)
            .unwrap_or_else(|| panic!("{} has no {END} marker", path.display()));
        let rows = rows();
        let doc = doc_rows(region);
        let generated = render(&rows, &doc);
        if std::env::var_os(WRITE).is_some() && generated != region {
            std::fs::write(&path, format!("{head}{BEGIN}{generated}{END}{tail}"))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            println!("{} rewritten from the config types", path.display());
            return docs_configuration_lists_every_key_with_its_default_and_range();
        }
        let problems = differences(&rows, &doc);
        assert!(
            problems.is_empty(),
            "docs/configuration.md does not match the config types:\n  {}\n{FIX}",
            problems.join("\n  ")
        );
        assert!(
            generated == region,
            "docs/configuration.md lists the right keys, defaults and ranges, but not in the \
             generated order or layout; {FIX}"
        );
    }

    #[test]
    fn a_key_the_document_lacks_or_misstates_is_reported() {
        let rows = rows();
        let mut doc = doc_rows(&render(&rows, &BTreeMap::new()));
        let some = "`hbone.connect_timeout`";
        assert!(
            differences(&rows, &doc)
                .iter()
                .all(|p| p.ends_with("has no meaning written")),
            "a freshly generated table differs only by its empty meanings"
        );
        doc.values_mut().for_each(|m| m[2] = "described".into());
        assert_eq!(differences(&rows, &doc), Vec::<String>::new());
        let [default, ..] = doc.remove(some).expect("a numeric key has a row");
        assert_eq!(
            default, "`5s`",
            "defaults are shown in the units errors use"
        );
        assert_eq!(
            differences(&rows, &doc),
            vec![format!(
                "{some} is a key of the config types but has no row"
            )]
        );
        doc.insert(
            some.into(),
            ["`9s`".into(), "`100ms` – `5m`".into(), "x".into()],
        );
        doc.insert(
            "`hbone.gone`".into(),
            ["`1`".into(), "—".into(), "x".into()],
        );
        let problems = differences(&rows, &doc);
        assert!(
            problems
                .iter()
                .any(|p| p.contains("default cell says `9s`")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.contains("`hbone.gone` has a row but")),
            "{problems:?}"
        );
    }

    #[test]
    fn every_variant_and_collection_is_reached() {
        let cells: Vec<String> = rows()
            .iter()
            .map(|r| format!("{} {}", r.key.cell(), r.default))
            .collect();
        for expected in [
            "`certificates.validity` (`source: dev-ca`) `1h`",
            "`certificates.validity` (`source: istio-ca`) `24h`",
            "`certificates.dir` (`source: dir`) required",
            "`policies.plugins.<name>.file` required",
            "`policies.bindings[].namespace` unset",
            "`oci.auth.token_file` (`mode: workload-identity`) `/var/run/secrets/kubernetes.io/serviceaccount/token`",
            "`oci.opt_in[].selector` `{}`",
            "`demo.echo` required",
            "`tcp.tunnel_congestion_control` `\"\"`",
        ] {
            assert!(cells.iter().any(|c| c == expected), "no row {expected}: {cells:#?}");
        }
    }
}
