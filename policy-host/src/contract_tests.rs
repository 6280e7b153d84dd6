//! The plugin contract has one source, `sdk/wit/policy.wit`: every record,
//! variant and enum it declares, with every field and case, must be named
//! by both hand-written converters (the SDK's and the host's). The compiler
//! catches a new field or case of a type the converters already handle (they
//! destructure without `..` and match every case); this test catches a type
//! that no converter handles at all.

use std::collections::BTreeMap;

const WIT: &str = include_str!("../../sdk/wit/policy.wit");
const SDK_CONVERT: &str = include_str!("../../sdk/src/convert.rs");
const HOST_CONVERT: &str = include_str!("convert.rs");

/// `record x { a: t, b: t }`, `variant v { c(t), d }`, `enum e { f, g }` of
/// the `types` interface, as (kind, name) → member names.
fn declarations(wit: &str) -> BTreeMap<(String, String), Vec<String>> {
    let mut out = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in wit.lines().map(str::trim) {
        if line.starts_with("///") || line.is_empty() {
            continue;
        }
        if let Some(key) = &current {
            if line == "}" {
                current = None;
                continue;
            }
            let member = line.split([':', '(', ',']).next().unwrap().trim();
            out.entry(key.clone())
                .or_insert_with(Vec::new)
                .push(member.to_string());
            continue;
        }
        let mut words = line.split_whitespace();
        if let (Some(kind @ ("record" | "variant" | "enum")), Some(name)) =
            (words.next(), words.next())
        {
            current = Some((kind.to_string(), name.to_string()));
        }
    }
    out
}

fn camel(kebab: &str) -> String {
    kebab
        .split('-')
        .map(|w| {
            let mut c = w.chars();
            c.next().unwrap().to_ascii_uppercase().to_string() + c.as_str()
        })
        .collect()
}

fn snake(kebab: &str) -> String {
    kebab.replace('-', "_")
}

fn names_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !ident(before) && !ident(after)
    })
}

#[test]
fn the_wit_declares_what_the_converters_need() {
    let decls = declarations(WIT);
    for (kind, name) in [
        ("record", "goaway"),
        ("variant", "event"),
        ("variant", "action"),
        ("enum", "log-level"),
    ] {
        assert!(
            decls.contains_key(&(kind.to_string(), name.to_string())),
            "the WIT parser in this test missed {kind} {name}: {decls:?}"
        );
    }
    let goaway = &decls[&("record".to_string(), "goaway".to_string())];
    assert!(goaway.contains(&"close-notify".to_string()), "{goaway:?}");
}

/// The WIT parts that one of the converters never names.
fn unconverted(wit: &str, sdk: &str, host: &str) -> Vec<String> {
    let mut missing = Vec::new();
    for ((kind, name), members) in declarations(wit) {
        let ty = camel(&name);
        for (side, text) in [("sdk", sdk), ("host", host)] {
            // Types of the `types` interface are `wit::…`; the one record of
            // the `policy` interface (`metadata-reads`) is `policy::…`.
            if !text.contains(&format!("wit::{ty}")) && !text.contains(&format!("policy::{ty}")) {
                missing.push(format!("{side}: {kind} {name} (wit::{ty})"));
            }
            for m in &members {
                let rust = if kind == "record" { snake(m) } else { camel(m) };
                if !names_word(text, &rust) {
                    missing.push(format!("{side}: {kind} {name}.{m} ({rust})"));
                }
            }
        }
    }
    missing
}

#[test]
fn every_wit_type_field_and_case_is_converted_by_the_sdk_and_the_host() {
    let missing = unconverted(WIT, SDK_CONVERT, HOST_CONVERT);
    assert!(
        missing.is_empty(),
        "WIT parts with no conversion:\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_wit_record_or_case_nobody_converts_is_reported() {
    let wit = WIT.replacen(
        "interface types {",
        "interface types {\n    record drain-hint {\n        hint-window-ms: u64,\n    }",
        1,
    );
    let missing = unconverted(&wit, SDK_CONVERT, HOST_CONVERT);
    assert!(
        missing.contains(&"sdk: record drain-hint (wit::DrainHint)".to_string())
            && missing
                .contains(&"host: record drain-hint.hint-window-ms (hint_window_ms)".to_string()),
        "{missing:?}"
    );
    let host_without_close_notify = HOST_CONVERT.replace("close_notify", "closing");
    let missing = unconverted(WIT, SDK_CONVERT, &host_without_close_notify);
    assert_eq!(
        missing,
        ["host: record goaway.close-notify (close_notify)"],
        "{missing:?}"
    );
}
