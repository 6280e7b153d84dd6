//! The install as the documents tell it: the namespace label is a step of
//! it (a fresh install meshes nothing without one), the commands that show
//! it worked ask for what the gateway serves, and the scrape annotations
//! point at the metrics listener the config opens.

use tidegate::admin::dump_query::SECTIONS;
use tidegate::workloads::membership;

use super::read::{install_dirs, install_docs, repo};
use super::{check_invariants, kustomize};

/// The text of `doc` after the heading `heading`, up to the next heading of
/// the same or a higher level (outside code blocks, where `#` is a comment).
fn section(doc: &str, heading: &str) -> String {
    let text = std::fs::read_to_string(repo().join(doc)).unwrap();
    let level = heading.chars().take_while(|c| *c == '#').count();
    let mut lines = text.lines();
    assert!(
        lines.by_ref().any(|l| l == heading),
        "{doc}: no section {heading:?}"
    );
    let mut out = String::new();
    let mut in_code = false;
    for l in lines {
        if l.trim_start().starts_with("```") {
            in_code = !in_code;
        }
        let hashes = l.chars().take_while(|c| *c == '#').count();
        if !in_code && hashes > 0 && hashes <= level && l[hashes..].starts_with(' ') {
            break;
        }
        out.push_str(l);
        out.push('\n');
    }
    out
}

/// The lines of the ```sh blocks of `text`.
fn shell_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            inside = !inside && t == "```sh";
            continue;
        }
        if inside {
            out.push(t.to_owned());
        }
    }
    out
}

/// A `kubectl label namespace <ns> <key>=<value>` command among `lines`.
fn labels_a_namespace(lines: &[String], key: &str, value: &str) -> bool {
    lines.iter().any(|l| {
        let words: Vec<&str> = l.split('#').next().unwrap().split_whitespace().collect();
        words.starts_with(&["kubectl", "label", "namespace"])
            && words.len() >= 5
            && words[4..].contains(&format!("{key}={value}").as_str())
    })
}

#[test]
fn the_install_steps_label_a_namespace() {
    let mesh = (membership::MESH_LABEL, membership::ENABLED);
    let ambient = (membership::ISTIO_DATAPLANE_MODE, membership::AMBIENT);
    for (doc, heading, (key, value)) in [
        ("README.md", "## Deploying on Kubernetes", mesh),
        ("deploy/README.md", "## Install", mesh),
        (
            "deploy/README.md",
            "### Istio ambient (`components/istio-ambient`)",
            ambient,
        ),
    ] {
        let lines = shell_lines(&section(doc, heading));
        assert!(
            labels_a_namespace(&lines, key, value),
            "{doc} {heading:?}: no `kubectl label namespace <ns> {key}={value}` step in {lines:#?}"
        );
        // ... after the apply, not before it.
        let apply = lines.iter().position(|l| l.starts_with("kubectl apply -k"));
        let label = lines
            .iter()
            .position(|l| l.starts_with("kubectl label namespace"));
        assert!(
            apply.is_some() && apply < label,
            "{doc} {heading:?}: the label comes after the install"
        );
    }
}

#[test]
fn a_section_ends_at_the_next_heading_of_its_level() {
    let dir = tempfile::tempdir().unwrap();
    let doc = dir.path().join("d.md");
    std::fs::write(
        &doc,
        "# t\n\n## A\na\n```sh\n# a comment\n```\n### A.1\nb\n## B\nc\n",
    )
    .unwrap();
    let doc = doc.to_str().unwrap();
    assert_eq!(
        section(doc, "## A"),
        "a\n```sh\n# a comment\n```\n### A.1\nb\n"
    );
    assert_eq!(section(doc, "### A.1"), "b\n");
    let lines = vec!["kubectl label namespace shop tidegate.io/mesh=true".to_owned()];
    assert!(!labels_a_namespace(&lines, "tidegate.io/mesh", "enabled"));
    let lines = vec!["kubectl label namespace shop tidegate.io/mesh=enabled  # x".to_owned()];
    assert!(labels_a_namespace(&lines, "tidegate.io/mesh", "enabled"));
}

/// Every `/config_dump?only=…` the documents show asks for sections the
/// admin API has (an unknown one is a 400).
#[test]
fn the_config_dump_queries_shown_name_real_sections() {
    let mut asked = 0;
    for (doc, text) in install_docs() {
        for (at, _) in text.match_indices("config_dump?only=") {
            let rest = &text[at + "config_dump?only=".len()..];
            let list: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ',')
                .collect();
            for s in list.split(',') {
                assert!(
                    SECTIONS.contains(&s),
                    "{doc}: /config_dump section {s:?} does not exist ({SECTIONS:?})"
                );
                asked += 1;
            }
        }
    }
    assert!(asked >= 3, "the install checks use /config_dump?only=");
}

/// Where a render asks Prometheus to scrape the gateway, it names the port
/// and path of the metrics listener its config opens, on an address a
/// scraper reaches (the pod is on the host network: not loopback).
#[test]
fn the_scrape_annotations_point_at_the_metrics_listener() {
    let mut annotated = 0;
    for dir in install_dirs() {
        let Some(r) = kustomize(&dir) else { return };
        let config = check_invariants(&r);
        let (ds, _) = r.pod();
        let template = ds.spec.unwrap().template.metadata.unwrap_or_default();
        let annotations = template.annotations.unwrap_or_default();
        if annotations.get("prometheus.io/scrape").map(String::as_str) != Some("true") {
            continue;
        }
        let metrics = config.listeners.metrics;
        assert_eq!(
            annotations.get("prometheus.io/port").map(String::as_str),
            Some(metrics.port().to_string().as_str()),
            "deploy/{dir}: prometheus.io/port"
        );
        assert_eq!(
            annotations
                .get("prometheus.io/path")
                .map_or("/metrics", String::as_str),
            "/metrics",
            "deploy/{dir}: prometheus.io/path"
        );
        assert!(
            !metrics.ip().is_loopback(),
            "deploy/{dir}: metrics on {metrics}, which no scraper reaches"
        );
        annotated += 1;
    }
    assert!(annotated > 0, "the base asks to be scraped");
}
