//! `deploy/` parsed into typed Kubernetes objects (k8s-openapi) and checked
//! for the invariants that matter, against the gateway's own config parser.
//!
//! k8s-openapi ignores fields it does not know, so every object is also
//! serialized back and compared key by key with the file: a misspelt field
//! name (which Kubernetes would silently drop too) fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Namespace, PodSpec, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidegate::config::Config;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The documents of a (multi-document) YAML file.
fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

/// Keys of `original` that do not survive a round trip through the typed object.
fn lost_keys(original: &Value, back: &Value, at: &str, out: &mut Vec<String>) {
    match (original, back) {
        (Value::Object(o), Value::Object(b)) => {
            for (k, v) in o {
                let path = format!("{at}.{k}");
                match b.get(k) {
                    Some(bv) => lost_keys(v, bv, &path, out),
                    None if v.is_null() => {}
                    None => out.push(path),
                }
            }
        }
        (Value::Array(o), Value::Array(b)) => {
            for (i, (ov, bv)) in o.iter().zip(b).enumerate() {
                lost_keys(ov, bv, &format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn typed<T: DeserializeOwned + Serialize>(doc: &Value, file: &Path) -> T {
    let t: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{}: not a valid object: {e}", file.display()));
    let mut lost = Vec::new();
    lost_keys(doc, &serde_json::to_value(&t).unwrap(), "", &mut lost);
    assert!(
        lost.is_empty(),
        "{}: fields not in the Kubernetes schema (misspelt?): {lost:?}",
        file.display()
    );
    t
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Kustomization {
    #[allow(dead_code)]
    api_version: String,
    kind: String,
    namespace: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    labels: Vec<Value>,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    config_map_generator: Vec<Generator>,
    #[serde(default)]
    patches: Vec<PatchRef>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Generator {
    name: String,
    #[serde(default)]
    files: Vec<String>,
    #[allow(dead_code)]
    behavior: Option<String>,
    #[allow(dead_code)]
    options: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchRef {
    path: String,
}

/// A kustomization resolved the way kustomize does it for what we use:
/// resources (files or bases), generated ConfigMaps, strategic-merge patches.
#[derive(Default)]
struct Rendered {
    objects: Vec<(PathBuf, Value)>,
    /// ConfigMap name → (key → file).
    config_maps: BTreeMap<String, BTreeMap<String, PathBuf>>,
    namespace: Option<String>,
}

fn render(dir: &Path) -> Rendered {
    let path = dir.join("kustomization.yaml");
    let k: Kustomization = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(k.kind, "Kustomization");
    let mut out = Rendered::default();
    for r in &k.resources {
        let p = dir.join(r);
        assert!(
            p.exists(),
            "{}: resource {r} does not exist",
            path.display()
        );
        if p.is_dir() {
            let base = render(&p);
            out.objects.extend(base.objects);
            out.config_maps.extend(base.config_maps);
            out.namespace = out.namespace.or(base.namespace);
        } else {
            out.objects
                .extend(documents(&p).into_iter().map(|d| (p.clone(), d)));
        }
    }
    for g in &k.config_map_generator {
        let entry = out.config_maps.entry(g.name.clone()).or_default();
        for f in &g.files {
            let p = dir.join(f);
            assert!(p.exists(), "{}: generator file {f} missing", path.display());
            entry.insert(f.clone(), p);
        }
    }
    for patch in &k.patches {
        let p = dir.join(&patch.path);
        for doc in documents(&p) {
            let target = out
                .objects
                .iter_mut()
                .find(|(_, o)| {
                    o["kind"] == doc["kind"] && o["metadata"]["name"] == doc["metadata"]["name"]
                })
                .unwrap_or_else(|| panic!("{}: patch matches no object", p.display()));
            merge(&mut target.1, &doc);
        }
    }
    out.namespace = k.namespace.or(out.namespace);
    out
}

/// Strategic merge, as far as our patches need it: maps merge, lists of
/// named items merge by name, other lists are replaced.
fn merge(into: &mut Value, patch: &Value) {
    match (into, patch) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (Value::Array(a), Value::Array(b)) if b.iter().all(|x| x.get("name").is_some()) => {
            for item in b {
                match a.iter_mut().find(|x| x.get("name") == item.get("name")) {
                    Some(existing) => merge(existing, item),
                    None => a.push(item.clone()),
                }
            }
        }
        (slot, v) => *slot = v.clone(),
    }
}

fn one<T: DeserializeOwned + Serialize>(r: &Rendered, kind: &str) -> T {
    let found: Vec<_> = r
        .objects
        .iter()
        .filter(|(_, o)| o["kind"] == kind)
        .collect();
    assert_eq!(found.len(), 1, "expected one {kind}");
    typed(&found[0].1, &found[0].0)
}

fn container<'a>(spec: &'a PodSpec, name: &str) -> &'a Container {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn arg_after<'a>(c: &'a Container, flag: &str) -> &'a str {
    let cmd = c.command.as_ref().unwrap();
    let i = cmd
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{} has no {flag}", c.name));
    &cmd[i + 1]
}

fn port(p: &Option<k8s_openapi::api::core::v1::Probe>) -> (u16, String) {
    let get = p
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
        .expect("an httpGet probe");
    let port = match &get.port {
        IntOrString::Int(n) => *n as u16,
        IntOrString::String(s) => panic!("named port {s}: the gateway declares no ports"),
    };
    (port, get.path.clone().unwrap_or_default())
}

/// Whether `path` lies inside one of the container's mounts (or the image).
fn mounted(c: &Container, path: &Path) -> bool {
    c.volume_mounts
        .iter()
        .flatten()
        .any(|m| path.starts_with(&m.mount_path))
}

/// The gateway's config as the container would load it: the generated
/// ConfigMap file plus the container's literal environment.
fn gateway_config(r: &Rendered, c: &Container) -> Config {
    let env: Vec<(String, String)> = c
        .env
        .iter()
        .flatten()
        .filter(|e| {
            e.name.starts_with("TIDEGATE_")
                && e.name != "TIDEGATE_CONFIG"
                && e.name != "TIDEGATE_LOG"
        })
        .map(|e| {
            let v = match (&e.value, &e.value_from) {
                (Some(v), _) => v.clone(),
                (None, Some(_)) => "node-from-downward-api".into(),
                (None, None) => String::new(),
            };
            (e.name.clone(), v)
        })
        .collect();
    let config_path = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "TIDEGATE_CONFIG")
        .and_then(|e| e.value.clone())
        .expect("TIDEGATE_CONFIG names the config file");
    let file_name = Path::new(&config_path)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap();
    let file = r
        .config_maps
        .get("tidegate-config")
        .and_then(|m| m.get(file_name))
        .unwrap_or_else(|| panic!("{config_path} is not a key of the tidegate-config ConfigMap"));
    Config::load(Some(file), env, &[]).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

fn check_invariants(r: &Rendered) -> Config {
    let ds: DaemonSet = one(r, "DaemonSet");
    let spec = ds.spec.as_ref().unwrap();
    let template_labels = spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    let selector = spec
        .selector
        .match_labels
        .clone()
        .expect("a matchLabels selector");
    assert!(!selector.is_empty());
    for (k, v) in &selector {
        assert_eq!(
            template_labels.get(k),
            Some(v),
            "selector {k}={v} does not match the template"
        );
    }
    let pod = spec.template.spec.as_ref().unwrap();
    let gw = container(pod, "tidegate");
    let config = gateway_config(r, gw);

    // Probes point at the readiness listener the config really opens.
    let ready = config.listeners.readiness.port();
    assert_eq!(port(&gw.readiness_probe), (ready, "/healthz/ready".into()));
    assert_eq!(port(&gw.liveness_probe), (ready, "/healthz/live".into()));
    let annotations = spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .clone()
        .unwrap_or_default();
    assert_eq!(
        annotations.get("prometheus.io/port").map(String::as_str),
        Some(config.listeners.metrics.port().to_string().as_str()),
        "the scrape annotation names the metrics port"
    );
    assert!(
        pod.host_network == Some(true),
        "ports must be on the node network"
    );
    assert!(
        gw.ports.as_ref().is_none_or(|p| p.is_empty()),
        "no host ports: they would stop the surge pod of a rolling upgrade"
    );

    // The kubelet waits longer than the gateway's own drain deadline.
    let grace = Duration::from_secs(pod.termination_grace_period_seconds.unwrap() as u64);
    assert!(
        grace >= config.shutdown.deadline + Duration::from_secs(5),
        "terminationGracePeriodSeconds {grace:?} < shutdown.deadline {:?} + 5s",
        config.shutdown.deadline
    );

    // The CNI plugin talks to the socket the gateway listens on, on a host path.
    let socket = config
        .drains
        .cni_socket
        .clone()
        .expect("drains.cni_socket is set");
    let cni = container(pod, "install-cni");
    assert_eq!(Path::new(arg_after(cni, "--socket")), socket);
    assert!(
        mounted(gw, &socket),
        "{} is not on a mounted volume",
        socket.display()
    );
    let volumes: BTreeMap<_, _> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.clone(), v))
        .collect();
    let run_mount = gw
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| socket.starts_with(&m.mount_path))
        .unwrap();
    assert!(
        volumes[&run_mount.name].host_path.is_some(),
        "the socket dir is a hostPath"
    );
    for (flag, host) in [
        ("--cni-bin-dir", "/opt/cni/bin"),
        ("--cni-conf-dir", "/etc/cni/net.d"),
    ] {
        let dir = arg_after(cni, flag);
        let m = cni
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == dir)
            .unwrap_or_else(|| panic!("{flag} {dir} is not a mount"));
        assert_eq!(volumes[&m.name].host_path.as_ref().unwrap().path, host);
    }

    // Every mount has its volume; ConfigMap volumes name generated maps.
    for c in pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
    {
        for m in c.volume_mounts.iter().flatten() {
            let v = volumes
                .get(&m.name)
                .unwrap_or_else(|| panic!("{}: no volume {}", c.name, m.name));
            if let Some(cm) = &v.config_map {
                assert!(
                    r.config_maps.contains_key(&cm.name),
                    "ConfigMap {} is not generated",
                    cm.name
                );
            }
        }
        let sc = c
            .security_context
            .as_ref()
            .unwrap_or_else(|| panic!("{}: no securityContext", c.name));
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
        assert_eq!(sc.privileged, None, "{}: never privileged", c.name);
        let caps = sc.capabilities.as_ref().unwrap();
        assert_eq!(
            caps.drop.as_deref(),
            Some(&["ALL".to_string()][..]),
            "{}",
            c.name
        );
        assert!(
            caps.add.as_ref().is_none_or(|a| a.is_empty()),
            "{}: adds capabilities",
            c.name
        );
        let res = c
            .resources
            .as_ref()
            .unwrap_or_else(|| panic!("{}: no resources", c.name));
        assert!(
            res.requests.is_some() && res.limits.is_some(),
            "{}: requests and limits",
            c.name
        );
    }
    // Certificates and plugins are where the pod can read them.
    if let tidegate::config::CertificatesConfig::Dir {
        dir, trust_bundle, ..
    } = &config.certificates
    {
        assert!(mounted(gw, dir) && mounted(gw, trust_bundle));
    }
    for (name, p) in &config.policies.plugins {
        let in_image = p.file.starts_with("/opt/tidegate/plugins");
        assert!(
            in_image || mounted(gw, &p.file),
            "plugin {name}: {} is not readable",
            p.file.display()
        );
        if in_image {
            let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../plugins")
                .join(name);
            assert!(
                crate_dir.exists(),
                "plugin {name} is not one the image builds"
            );
        }
    }

    // Namespaced objects live in the kustomization's namespace; the
    // ServiceAccount the pod uses is the one the binding grants.
    let ns = r.namespace.clone().expect("a namespace");
    let namespace: Namespace = one(r, "Namespace");
    assert_eq!(namespace.metadata.name.as_deref(), Some(ns.as_str()));
    let sa: ServiceAccount = one(r, "ServiceAccount");
    assert_eq!(pod.service_account_name, sa.metadata.name);
    // Discovery uses the in-cluster credentials of that ServiceAccount.
    assert!(matches!(
        config.workloads.source,
        tidegate::config::WorkloadSourceKind::Kubernetes
    ));
    assert_ne!(sa.automount_service_account_token, Some(false));
    assert_ne!(pod.automount_service_account_token, Some(false));
    let binding: ClusterRoleBinding = one(r, "ClusterRoleBinding");
    let role: ClusterRole = one(r, "ClusterRole");
    assert_eq!(Some(binding.role_ref.name.clone()), role.metadata.name);
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    let subjects = binding.subjects.unwrap();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(subjects[0].name, sa.metadata.name.clone().unwrap());
    assert_eq!(subjects[0].namespace.as_deref(), Some(ns.as_str()));
    config
}

#[test]
fn every_manifest_parses_into_typed_objects() {
    let mut files = Vec::new();
    let mut stack = vec![deploy()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "yaml") {
                files.push(p);
            }
        }
    }
    files.sort();
    let mut kinds = BTreeSet::new();
    for f in &files {
        if f.file_name().unwrap() == "tidegate.yaml" {
            Config::load(Some(f), Vec::new(), &[])
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            continue;
        }
        for doc in documents(f) {
            let kind = doc["kind"]
                .as_str()
                .unwrap_or_else(|| panic!("{}: no kind", f.display()))
                .to_owned();
            match kind.as_str() {
                "Kustomization" => {
                    serde_yaml::from_str::<Kustomization>(&std::fs::read_to_string(f).unwrap())
                        .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
                }
                "Namespace" => drop(typed::<Namespace>(&doc, f)),
                "ServiceAccount" => drop(typed::<ServiceAccount>(&doc, f)),
                "ClusterRole" => drop(typed::<ClusterRole>(&doc, f)),
                "ClusterRoleBinding" => drop(typed::<ClusterRoleBinding>(&doc, f)),
                "DaemonSet" => drop(typed::<DaemonSet>(&doc, f)),
                other => panic!("{}: no typed check for kind {other}", f.display()),
            }
            kinds.insert(kind);
        }
    }
    assert!(
        kinds.contains("DaemonSet") && kinds.contains("ClusterRole"),
        "{kinds:?}"
    );

    // Every file of the base is part of it.
    let base = render(&deploy().join("base"));
    for f in files
        .iter()
        .filter(|f| f.parent() == Some(&deploy().join("base")))
    {
        let name = f.file_name().unwrap();
        let used = name == "kustomization.yaml"
            || base.objects.iter().any(|(p, _)| p == f)
            || base
                .config_maps
                .values()
                .any(|m| m.values().any(|p| p == f));
        assert!(
            used,
            "{} is not referenced by the kustomization",
            f.display()
        );
    }
}

#[test]
fn a_misspelt_field_is_caught() {
    let doc: Value = serde_yaml::from_str(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: x, namespce: y}\n",
    )
    .unwrap();
    let r = std::panic::catch_unwind(|| typed::<ServiceAccount>(&doc, Path::new("t.yaml")));
    let msg = *r.unwrap_err().downcast::<String>().unwrap();
    assert!(msg.contains(".metadata.namespce"), "{msg}");
}

#[test]
fn the_base_keeps_its_invariants() {
    let config = check_invariants(&render(&deploy().join("base")));
    assert_eq!(config.listeners.readiness.port(), 15021);
}

#[test]
fn the_example_overlay_keeps_its_invariants_and_sets_its_values() {
    let config = check_invariants(&render(&deploy().join("overlays/example")));
    assert_eq!(config.trust_domain, "example.org");
    assert_eq!(
        config.policies.default.as_deref(),
        Some("goaway-on-term-start")
    );
    assert_eq!(config.listeners.readiness.port(), 16021);
}

#[test]
fn rbac_grants_only_reads_of_what_discovery_watches() {
    let r = render(&deploy().join("base"));
    let role: ClusterRole = one(&r, "ClusterRole");
    let mut granted = BTreeSet::new();
    for rule in role.rules.unwrap() {
        let verbs: BTreeSet<_> = rule.verbs.iter().map(String::as_str).collect();
        assert_eq!(verbs, BTreeSet::from(["get", "list", "watch"]), "read-only");
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
        for g in rule.api_groups.unwrap() {
            for res in rule.resources.clone().unwrap() {
                assert!(g != "*" && res != "*", "no wildcards");
                granted.insert((g.clone(), res));
            }
        }
    }
    let watched: BTreeSet<(String, String)> = tidegate::workloads::kubernetes::WATCHED_RESOURCES
        .iter()
        .map(|(g, r)| (g.to_string(), r.to_string()))
        .collect();
    assert_eq!(granted, watched);
}
