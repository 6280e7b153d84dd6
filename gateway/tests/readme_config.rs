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
