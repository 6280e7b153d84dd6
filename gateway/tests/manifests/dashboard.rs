//! `deploy/dashboards/tidegate-dashboard.json`, the panels of Istio's
//! ztunnel dashboard selecting tidegate's pods: every query selects the
//! pods the base DaemonSet creates (`pod=~"<its name>-.*"`) and, for the
//! kubelet's series, its gateway container; none selects ztunnel's; and
//! every series of Istio's ztunnel dashboard that tidegate exports is
//! queried.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::DaemonSet;
use serde_json::Value;

use super::read::{deploy, documents};
use super::{container, typed};

/// The series Istio's ztunnel dashboard queries (istio/istio
/// `manifests/addons/dashboards/lib/queries.libsonnet`, the queries
/// `ztunnel.libsonnet` uses) that tidegate exports. Left out, as
/// docs/observability.md says: `istio_build` and
/// `istio_dns_requests_total`.
const ZTUNNEL_DASHBOARD_SERIES: &[&str] = &[
    "container_memory_working_set_bytes",
    "container_cpu_usage_seconds_total",
    "istio_tcp_connections_opened_total",
    "istio_tcp_connections_closed_total",
    "istio_tcp_sent_bytes_total",
    "istio_tcp_received_bytes_total",
    "istio_xds_connection_terminations_total",
    "istio_xds_message_total",
    "workload_manager_active_proxy_count",
    "workload_manager_pending_proxy_count",
];

/// The kubelet's series, selected by container as well as by pod.
const KUBELET_SERIES: &[&str] = &[
    "container_memory_working_set_bytes",
    "container_cpu_usage_seconds_total",
];

fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            if let Some(Value::String(e)) = o.get("expr") {
                out.push(e.clone());
            }
            o.values().for_each(|v| exprs(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

/// The value of `label` in a selector of `expr` (`label="v"` or
/// `label=~"v"`), each occurrence.
fn selected(expr: &str, label: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in expr.match_indices(label) {
        let before = expr[..i].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &expr[i + label.len()..];
        let Some(rest) = rest.strip_prefix("=~\"").or(rest.strip_prefix("=\"")) else {
            continue;
        };
        out.push(rest[..rest.find('"').unwrap()].to_owned());
    }
    out
}

#[test]
fn the_dashboard_selects_tidegates_pods() {
    let ds_file = deploy().join("base/daemonset.yaml");
    let ds: DaemonSet = documents(&ds_file)
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .map(|d| typed(d, &ds_file.display().to_string()))
        .unwrap();
    let name = ds.metadata.name.clone().unwrap();
    let gateway = container(
        ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap(),
        "tidegate",
    );
    let pods = format!("{name}-.*");

    let path = deploy().join("dashboards/tidegate-dashboard.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut all = Vec::new();
    exprs(&dashboard, &mut all);
    assert!(!all.is_empty(), "no query in {}", path.display());
    for e in &all {
        assert!(!e.contains("ztunnel"), "selects ztunnel: {e}");
        assert_eq!(selected(e, "pod"), [pods.as_str()], "pod selector of {e}");
        if KUBELET_SERIES.iter().any(|s| e.contains(s)) {
            assert_eq!(selected(e, "container"), [gateway.name.as_str()], "{e}");
        }
    }
    let queried: BTreeSet<&str> = ZTUNNEL_DASHBOARD_SERIES
        .iter()
        .copied()
        .filter(|s| all.iter().any(|e| e.contains(&format!("{s}{{"))))
        .collect();
    let missing: Vec<&&str> = ZTUNNEL_DASHBOARD_SERIES
        .iter()
        .filter(|s| !queried.contains(**s))
        .collect();
    assert!(missing.is_empty(), "not queried: {missing:?}");
    // The data source is a variable, as in Istio's dashboards.
    assert_eq!(dashboard["templating"]["list"][0]["type"], "datasource");
}

#[test]
fn a_ztunnel_selector_is_seen() {
    assert_eq!(
        selected(
            r#"sum(rate(x{pod=~"ztunnel-.*", container="istio-proxy"}[1m]))"#,
            "pod"
        ),
        ["ztunnel-.*"]
    );
    assert_eq!(
        selected(r#"x{pod=~"a", container="istio-proxy"}"#, "container"),
        ["istio-proxy"]
    );
    assert!(selected(r#"x{subpod="a"}"#, "pod").is_empty());
}
