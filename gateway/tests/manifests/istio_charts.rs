//! The Helm values for Istio that swapping ztunnel for tidegate needs
//! (`deploy/istio/*-values.yaml`, and the blocks of the swap guide in
//! docs/istio.md): every key is one the chart's templates read, per the
//! facts below; `CA_TRUSTED_NODE_ACCOUNTS` keeps ztunnel's account beside
//! tidegate's, read as istiod reads it; ztunnel's affinity keeps it off
//! exactly the nodes the istio-ambient example's DaemonSet selects.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Affinity, NodeSelectorTerm, ServiceAccount};
use serde_json::Value;

use super::read::{deploy, documents, install_docs, repo};
use super::{kustomize, typed};

/// The Istio release whose charts the facts below were read from (istio/istio
/// at this tag; the same lines at 1.24.0, 1.26.0, 1.28.0, 1.30.0 and at
/// 86c9f01fd735).
pub const ISTIO_CHARTS_READ: &str = "1.30.3";

/// ztunnel's account as istiod's chart names it by default: the release
/// namespace `istio-system`, `trustedZtunnelName` defaulting to `ztunnel`
/// (istio-discovery/templates/deployment.yaml).
const ZTUNNEL_ACCOUNT: (&str, &str) = ("istio-system", "ztunnel");

/// The `istiod` chart (manifests/charts/istio-control/istio-discovery):
/// values its templates read that the swap may set, and what each is.
/// - `env`: a map, each entry rendered as a container variable; with
///   `env.CA_TRUSTED_NODE_ACCOUNTS` set, the chart's own
///   `CA_TRUSTED_NODE_ACCOUNTS` is not rendered (templates/deployment.yaml);
/// - `trustedZtunnelNamespace`, `trustedZtunnelName`: the one account the
///   chart renders otherwise (replacing ztunnel's when set to tidegate's);
/// - `pilot`: copied over the top level (templates/zzy_descope_legacy.yaml).
const ISTIOD_KEYS: &[&str] = &["env", "trustedZtunnelNamespace", "trustedZtunnelName"];

/// The `ztunnel` chart (manifests/charts/ztunnel, templates/daemonset.yaml):
/// `affinity` rendered as the pod's affinity, `nodeSelector` beside
/// `kubernetes.io/os: linux`. Neither is in its values.yaml; both are read.
const ZTUNNEL_KEYS: &[&str] = &["affinity", "nodeSelector"];

/// The umbrella `ambient` chart (manifests/sample-charts/ambient): its
/// dependencies, each one's values under its name.
const AMBIENT_SUBCHARTS: &[&str] = &["base", "cni", "istiod", "ztunnel"];

/// istioctl (operator/pkg/component/component.go): `spec.values.pilot`
/// reaches the istiod chart as `pilot.*`; `spec.values.ztunnel` reaches the
/// ztunnel chart without the prefix (FlattenValues).
const ISTIO_OPERATOR: (&str, &str) = ("install.istio.io/v1alpha1", "IstioOperator");

/// istio-cni's annotation on a pod it captured (cni/pkg/util/podutil.go):
/// `enabled` once a node proxy took it, `pending` while none has.
const REDIRECTION_ANNOTATION: &str = "ambient.istio.io/redirection";
const REDIRECTION_VALUES: &[&str] = &["enabled", "pending"];

/// What one set of values gives each chart, after Istio's own prefixes.
#[derive(Debug, Default)]
struct Given {
    istiod: Vec<Value>,
    ztunnel: Vec<Value>,
}

/// Splits `values` as `form` hands them to the charts; every key no fact
/// above covers is a problem.
fn route(form: &str, values: &Value, given: &mut Given, problems: &mut Vec<String>) {
    let Some(map) = values.as_object() else {
        problems.push(format!("{form}: not a map of values"));
        return;
    };
    match form {
        "istiod" => {
            let mut top = map.clone();
            if let Some(pilot) = top.remove("pilot") {
                route("istiod", &pilot, given, problems);
            }
            for k in top.keys() {
                if !ISTIOD_KEYS.contains(&k.as_str()) {
                    problems.push(format!(
                        "istiod chart: `{k}` is not one of the values read ({ISTIOD_KEYS:?}, \
                         Istio {ISTIO_CHARTS_READ})"
                    ));
                }
            }
            given.istiod.push(Value::Object(top));
        }
        "ztunnel" => {
            for k in map.keys() {
                if !ZTUNNEL_KEYS.contains(&k.as_str()) {
                    problems.push(format!(
                        "ztunnel chart: `{k}` is not one of the values read ({ZTUNNEL_KEYS:?}, \
                         Istio {ISTIO_CHARTS_READ})"
                    ));
                }
            }
            given.ztunnel.push(values.clone());
        }
        "ambient" => {
            for (k, v) in map {
                match k.as_str() {
                    "istiod" | "ztunnel" => route(k, v, given, problems),
                    k if AMBIENT_SUBCHARTS.contains(&k) => {
                        problems.push(format!("ambient chart: `{k}` is not needed by the swap"))
                    }
                    k => problems.push(format!(
                        "ambient chart: `{k}` is no dependency of it ({AMBIENT_SUBCHARTS:?})"
                    )),
                }
            }
        }
        "IstioOperator" => {
            if (map.get("apiVersion"), map.get("kind"))
                != (
                    Some(&Value::from(ISTIO_OPERATOR.0)),
                    Some(&Value::from(ISTIO_OPERATOR.1)),
                )
            {
                problems.push(format!("istioctl: not an {ISTIO_OPERATOR:?}"));
            }
            let spec = map.get("spec").cloned().unwrap_or_default();
            let values = &spec["values"];
            for (k, v) in values.as_object().into_iter().flatten() {
                match k.as_str() {
                    // The istiod chart copies `pilot.*` to the top.
                    "pilot" => route("istiod", &serde_json::json!({"pilot": v}), given, problems),
                    "ztunnel" => route("ztunnel", v, given, problems),
                    k => problems.push(format!(
                        "istioctl: `spec.values.{k}` is not one the swap sets (pilot, ztunnel)"
                    )),
                }
            }
        }
        other => problems.push(format!("no facts for the chart {other:?}")),
    }
}

/// `CA_TRUSTED_NODE_ACCOUNTS` as istiod reads it
/// (pilot/pkg/features/security.go): split at commas, each entry cut at its
/// first `/`, nothing trimmed; an entry without `/` is ignored with a
/// warning (here: a problem).
fn trusted_accounts(value: &str) -> Result<BTreeSet<(String, String)>, String> {
    let mut out = BTreeSet::new();
    for entry in value.split(',') {
        let Some((ns, sa)) = entry.split_once('/') else {
            return Err(format!(
                "CA_TRUSTED_NODE_ACCOUNTS entry {entry:?}: no `/`, istiod ignores it"
            ));
        };
        if entry.chars().any(char::is_whitespace) || ns.is_empty() || sa.is_empty() {
            return Err(format!(
                "CA_TRUSTED_NODE_ACCOUNTS entry {entry:?}: istiod trims nothing, so this names \
                 no account"
            ));
        }
        out.insert((ns.to_owned(), sa.to_owned()));
    }
    Ok(out)
}

/// Whether a node with `labels` satisfies `term` (the operators a
/// required node affinity can use on labels).
fn term_matches(term: &NodeSelectorTerm, labels: &BTreeMap<String, String>) -> bool {
    term.match_expressions.iter().flatten().all(|e| {
        let value = labels.get(&e.key);
        let listed = || value.is_some_and(|v| e.values.iter().flatten().any(|w| w == v));
        match e.operator.as_str() {
            "In" => listed(),
            "NotIn" => !listed(),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => panic!("operator {other}: extend this check"),
        }
    }) && term.match_fields.as_ref().is_none_or(Vec::is_empty)
}

/// Whether ztunnel, with these chart values, may run on a node with `labels`.
fn ztunnel_schedules(values: &Value, labels: &BTreeMap<String, String>) -> bool {
    if let Some(selector) = values["nodeSelector"].as_object() {
        if selector
            .iter()
            .any(|(k, v)| labels.get(k).map(String::as_str) != v.as_str())
        {
            return false;
        }
    }
    let affinity: Affinity = match values.get("affinity") {
        Some(a) => typed(a, "ztunnel chart value `affinity`"),
        None => return true,
    };
    let required = affinity
        .node_affinity
        .and_then(|n| n.required_during_scheduling_ignored_during_execution);
    required.is_none_or(|r| {
        r.node_selector_terms
            .iter()
            .any(|t| term_matches(t, labels))
    })
}

/// The account tidegate's pods run as in the istio-ambient example, and
/// the node label its DaemonSet selects; None without kubectl.
fn tidegate_in_ambient() -> Option<((String, String), (String, String))> {
    let r = kustomize("examples/istio-ambient")?;
    let (ds, pod) = r.pod();
    let ns = ds
        .metadata
        .namespace
        .clone()
        .expect("the DaemonSet's namespace");
    let sa = pod.service_account_name.clone().expect("a ServiceAccount");
    assert!(
        r.all::<ServiceAccount>("ServiceAccount")
            .iter()
            .any(|a| a.metadata.name.as_deref() == Some(sa.as_str())),
        "the render creates {sa}"
    );
    let selector = pod.node_selector.clone().unwrap_or_default();
    let node_label = selector
        .into_iter()
        .find(|(k, _)| k == "tidegate.io/node-proxy")
        .expect("tidegate runs only on the nodes labelled for it");
    Some(((ns, sa), node_label))
}

/// Everything wrong with one set of values in `form`, given tidegate's
/// account and the node label its DaemonSet selects.
fn problems_of(
    form: &str,
    values: &Value,
    account: &(String, String),
    node_label: &(String, String),
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut given = Given::default();
    route(form, values, &mut given, &mut problems);
    for istiod in &given.istiod {
        for key in ["trustedZtunnelNamespace", "trustedZtunnelName"] {
            if istiod.get(key).is_some() {
                problems.push(format!(
                    "istiod chart: `{key}` replaces ztunnel's trusted account; \
                     add to it with env.CA_TRUSTED_NODE_ACCOUNTS"
                ));
            }
        }
        let Some(value) = istiod["env"].get("CA_TRUSTED_NODE_ACCOUNTS") else {
            continue;
        };
        match value.as_str().map(trusted_accounts) {
            None => problems.push("CA_TRUSTED_NODE_ACCOUNTS: not a string".into()),
            Some(Err(e)) => problems.push(e),
            Some(Ok(accounts)) => {
                let ztunnel = (ZTUNNEL_ACCOUNT.0.to_owned(), ZTUNNEL_ACCOUNT.1.to_owned());
                for (who, needed) in [("ztunnel's", &ztunnel), ("tidegate's", account)] {
                    if !accounts.contains(needed) {
                        problems.push(format!(
                            "CA_TRUSTED_NODE_ACCOUNTS {value}: lacks {who} account {}/{}",
                            needed.0, needed.1
                        ));
                    }
                }
            }
        }
    }
    if form != "ztunnel" && given.istiod.is_empty() {
        problems.push(format!("{form}: no values for the istiod chart"));
    }
    if form != "istiod" && given.ztunnel.is_empty() {
        problems.push(format!("{form}: no values for the ztunnel chart"));
    }
    let linux = ("kubernetes.io/os".to_owned(), "linux".to_owned());
    let handed_over = BTreeMap::from([linux.clone(), node_label.clone()]);
    let elsewhere = BTreeMap::from([linux]);
    for ztunnel in &given.ztunnel {
        if ztunnel_schedules(ztunnel, &handed_over) {
            problems.push(format!(
                "ztunnel may run on a node labelled {}={}, beside tidegate",
                node_label.0, node_label.1
            ));
        }
        if !ztunnel_schedules(ztunnel, &elsewhere) {
            problems.push("ztunnel is kept off nodes that were not handed over".into());
        }
    }
    problems
}

/// The ```yaml blocks of the swap guide that are Istio values: the first
/// line says for what (`# chart: <name>` or `# istioctl: IstioOperator`).
fn guide_blocks() -> Vec<(String, String, Value)> {
    let text = std::fs::read_to_string(repo().join("docs/istio.md")).unwrap();
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "```yaml" {
            continue;
        }
        let body: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
        let head = body.first().copied().unwrap_or_default();
        let form = if let Some(rest) = head.strip_prefix("# chart: ") {
            rest.split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned()
        } else if head.starts_with("# istioctl: IstioOperator") {
            "IstioOperator".to_owned()
        } else {
            continue;
        };
        let values: Value = serde_yaml::from_str(&body.join("\n"))
            .unwrap_or_else(|e| panic!("docs/istio.md block {head:?}: {e}"));
        out.push((form, head.to_owned(), values));
    }
    out
}

#[test]
fn the_istio_values_add_tidegate_beside_ztunnel_and_keep_ztunnel_off_its_nodes() {
    let Some((account, node_label)) = tidegate_in_ambient() else {
        return;
    };
    let mut files = BTreeMap::new();
    for (chart, file) in [
        ("istiod", "istio/istiod-values.yaml"),
        ("ztunnel", "istio/ztunnel-values.yaml"),
    ] {
        let mut docs = documents(&deploy().join(file));
        assert_eq!(docs.len(), 1, "{file}: one set of values");
        let values = docs.pop().unwrap();
        let problems = problems_of(chart, &values, &account, &node_label);
        assert!(problems.is_empty(), "deploy/{file}: {problems:#?}");
        files.insert(chart.to_owned(), (file, values));
    }
    // Every form the guide shows is right, and the two files' blocks say
    // exactly what the files say.
    let blocks = guide_blocks();
    let forms: BTreeSet<&str> = blocks.iter().map(|(f, _, _)| f.as_str()).collect();
    assert_eq!(
        forms,
        BTreeSet::from(["IstioOperator", "ambient", "istiod", "ztunnel"]),
        "docs/istio.md shows the values for each chart, the umbrella chart and istioctl"
    );
    for (form, head, values) in &blocks {
        let problems = problems_of(form, values, &account, &node_label);
        assert!(problems.is_empty(), "docs/istio.md {head:?}: {problems:#?}");
        if let Some((file, file_values)) = files.get(form) {
            assert!(head.contains(file), "{head:?} names {file}");
            assert_eq!(
                values, file_values,
                "docs/istio.md {head:?} = deploy/{file}"
            );
        }
    }
}

#[test]
fn values_that_replace_or_misspell_are_reported() {
    let account = ("tidegate-system".to_owned(), "tidegate".to_owned());
    let label = ("tidegate.io/node-proxy".to_owned(), "tidegate".to_owned());
    let check = |form: &str, yaml: &str| {
        let values: Value = serde_yaml::from_str(yaml).unwrap();
        problems_of(form, &values, &account, &label).join("\n")
    };
    let affinity = |op: &str| {
        format!(
            "affinity: {{nodeAffinity: {{requiredDuringSchedulingIgnoredDuringExecution: \
             {{nodeSelectorTerms: [{{matchExpressions: [{{key: tidegate.io/node-proxy, \
             operator: {op}, values: [tidegate]}}]}}]}}}}}}"
        )
    };
    // The values the swap guide once gave: tidegate's account instead of ztunnel's.
    let replaced = check(
        "istiod",
        "trustedZtunnelNamespace: tidegate-system\ntrustedZtunnelName: tidegate",
    );
    assert!(
        replaced.contains("replaces ztunnel's trusted account"),
        "{replaced}"
    );
    let only_ours = check(
        "istiod",
        "env: {CA_TRUSTED_NODE_ACCOUNTS: tidegate-system/tidegate}",
    );
    assert!(
        only_ours.contains("lacks ztunnel's account istio-system/ztunnel"),
        "{only_ours}"
    );
    let spaced = check(
        "istiod",
        "env: {CA_TRUSTED_NODE_ACCOUNTS: 'istio-system/ztunnel, tidegate-system/tidegate'}",
    );
    assert!(spaced.contains("\" tidegate-system/tidegate\""), "{spaced}");
    let no_slash = check(
        "istiod",
        "env: {CA_TRUSTED_NODE_ACCOUNTS: 'istio-system/ztunnel,tidegate'}",
    );
    assert!(no_slash.contains("no `/`"), "{no_slash}");
    // A key the chart does not read, a prefix the chart does not take.
    let unknown = check("istiod", "values: {pilot: {env: {}}}");
    assert!(
        unknown.contains("`values` is not one of the values read"),
        "{unknown}"
    );
    let umbrella = check(
        "ambient",
        "pilot: {env: {CA_TRUSTED_NODE_ACCOUNTS: 'istio-system/ztunnel,tidegate-system/tidegate'}}",
    );
    assert!(umbrella.contains("`pilot` is no dependency"), "{umbrella}");
    // The pilot prefix is the same value to the istiod chart.
    let prefixed = check(
        "istiod",
        "pilot: {env: {CA_TRUSTED_NODE_ACCOUNTS: 'istio-system/ztunnel,tidegate-system/tidegate'}}",
    );
    assert_eq!(prefixed, "");
    // ztunnel: on tidegate's nodes, off everyone's, a misspelt field.
    let on_ours_only = check("ztunnel", &affinity("In"));
    assert!(
        on_ours_only.contains("may run on a node labelled"),
        "{on_ours_only}"
    );
    assert!(
        on_ours_only.contains("kept off nodes that were not handed over"),
        "{on_ours_only}"
    );
    let everywhere = check("ztunnel", "nodeSelector: {kubernetes.io/os: linux}");
    assert!(
        everywhere.contains("may run on a node labelled"),
        "{everywhere}"
    );
    assert_eq!(check("ztunnel", &affinity("NotIn")), "");
    let misspelt = std::panic::catch_unwind(|| {
        check(
            "ztunnel",
            &affinity("NotIn").replace("nodeSelectorTerms", "nodeSelectorTerm"),
        )
    });
    let msg = *misspelt.unwrap_err().downcast::<String>().unwrap();
    assert!(msg.contains("nodeSelectorTerm"), "{msg}");
    // istioctl: the ztunnel prefix is flattened, anything else is reported.
    let operator = check(
        "IstioOperator",
        &format!(
            "apiVersion: install.istio.io/v1alpha1\nkind: IstioOperator\nspec:\n  values:\n    \
             pilot: {{env: {{CA_TRUSTED_NODE_ACCOUNTS: 'istio-system/ztunnel,tidegate-system/tidegate'}}}}\n    \
             ztunnel: {{{}}}\n    global: {{}}",
            affinity("NotIn")
        ),
    );
    assert!(operator.contains("`spec.values.global`"), "{operator}");
    assert!(!operator.contains("CA_TRUSTED"), "{operator}");
}

/// Every `ambient.istio.io/redirection` value the documents show is one
/// istio-cni sets.
#[test]
fn the_redirection_annotation_values_shown_are_istio_cnis() {
    let mut seen = BTreeSet::new();
    for (doc, text) in install_docs() {
        for (at, _) in text.match_indices(REDIRECTION_ANNOTATION) {
            let rest = &text[at + REDIRECTION_ANNOTATION.len()..];
            let Some(rest) = [": ", "="].iter().find_map(|s| rest.strip_prefix(s)) else {
                continue;
            };
            let value: String = rest
                .trim_start_matches('`')
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            assert!(
                REDIRECTION_VALUES.contains(&value.as_str()),
                "{doc}: {REDIRECTION_ANNOTATION}={value} is not a value istio-cni sets"
            );
            seen.insert(value);
        }
    }
    assert!(
        seen.contains("enabled"),
        "the enrolled value is shown: {seen:?}"
    );
}
