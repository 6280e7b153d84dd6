//! `deploy/` parsed into typed Kubernetes objects (k8s-openapi) and checked
//! for the invariants that matter, against the gateway's own config parser.
//!
//! Two levels:
//! - every YAML file under `deploy/` parses into its typed object, and every
//!   kustomization references only files that exist and every file beside it;
//! - every kustomization that is not a component (the base, the overlays, the
//!   worked examples of the components) is rendered with `kubectl kustomize`,
//!   which is what `kubectl apply -k` sends, and the rendered objects are
//!   checked: typed, the DaemonSet's invariants, the embedded gateway config
//!   as the container would load it (ConfigMap file + `envFrom` + `env`), and
//!   RBAC against what discovery watches with that config.
//!
//! k8s-openapi ignores fields it does not know, so every object is also
//! serialized back and compared key by key with the file: a misspelt field
//! name (which Kubernetes would silently drop too) fails here.
//!
//! `kubectl` (with its bundled kustomize) must be on PATH (or named by
//! `$KUBECTL`): with `CI` set its absence fails the render tests; otherwise
//! they print why they skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

#[path = "manifests/ca.rs"]
mod ca;
#[path = "manifests/dashboard.rs"]
mod dashboard;
#[path = "manifests/image.rs"]
mod image;
#[path = "manifests/install_docs.rs"]
mod install_docs;
#[path = "manifests/istio_charts.rs"]
mod istio_charts;
#[path = "manifests/read.rs"]
mod read;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodSpec, Secret, Service, ServiceAccount, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidegate::config::{CaptureMode, CertificatesConfig, Config, WorkloadSourceKind};
use tidegate::oci::OciAuth;
use tidegate::workloads::membership;

use read::{deploy, documents, documents_of, install_dirs, kustomization_dirs, repo, yaml_files};

/// Objects the manifests reference but do not create, and who does. A
/// volume naming anything else must name an object of the render.
const PROVIDED_ELSEWHERE: &[(&str, &str, &str)] = &[
    (
        "ConfigMap",
        "istio-ca-root-cert",
        "istiod publishes it in every namespace",
    ),
    (
        "ConfigMap",
        "tidegate-ca-root",
        "tidegate-ca publishes its root there at its first start (base/ca-deployment.yaml)",
    ),
    (
        "Secret",
        "cilium-ztunnel-bootstrap",
        "the operator copies Cilium's bootstrap certificate into it with kubectl (deploy/README.md)",
    ),
    (
        "Secret",
        "tidegate-oci-api-key",
        "the operator creates it with kubectl (deploy/README.md); a key is never committed",
    ),
];

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

fn typed<T: DeserializeOwned + Serialize>(doc: &Value, origin: &str) -> T {
    let t: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{origin}: not a valid object: {e}"));
    let mut lost = Vec::new();
    lost_keys(doc, &serde_json::to_value(&t).unwrap(), "", &mut lost);
    assert!(
        lost.is_empty(),
        "{origin}: fields not in the Kubernetes schema (misspelt?): {lost:?}"
    );
    t
}

/// Parses one Kubernetes object into its typed form; returns its kind.
fn check_typed(doc: &Value, origin: &str) -> String {
    let kind = doc["kind"]
        .as_str()
        .unwrap_or_else(|| panic!("{origin}: no kind"))
        .to_owned();
    let origin = format!("{origin} ({kind} {})", doc["metadata"]["name"]);
    match kind.as_str() {
        "Namespace" => drop(typed::<Namespace>(doc, &origin)),
        "ServiceAccount" => drop(typed::<ServiceAccount>(doc, &origin)),
        "ClusterRole" => drop(typed::<ClusterRole>(doc, &origin)),
        "ClusterRoleBinding" => drop(typed::<ClusterRoleBinding>(doc, &origin)),
        "Role" => drop(typed::<Role>(doc, &origin)),
        "RoleBinding" => drop(typed::<RoleBinding>(doc, &origin)),
        "DaemonSet" => drop(typed::<DaemonSet>(doc, &origin)),
        "Deployment" => drop(typed::<Deployment>(doc, &origin)),
        "Service" => drop(typed::<Service>(doc, &origin)),
        "ConfigMap" => drop(typed::<ConfigMap>(doc, &origin)),
        "Secret" => drop(typed::<Secret>(doc, &origin)),
        other => panic!("{origin}: no typed check for kind {other}"),
    }
    kind
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Kustomization {
    api_version: String,
    kind: String,
    #[allow(dead_code)]
    namespace: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    labels: Vec<Value>,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    components: Vec<String>,
    #[serde(default)]
    config_map_generator: Vec<Generator>,
    #[serde(default)]
    patches: Vec<PatchRef>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Generator {
    #[allow(dead_code)]
    name: String,
    #[allow(dead_code)]
    namespace: Option<String>,
    #[serde(default)]
    files: Vec<String>,
    #[serde(default)]
    envs: Vec<String>,
    #[allow(dead_code)]
    behavior: Option<String>,
    #[allow(dead_code)]
    options: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchRef {
    /// A patch file beside the kustomization, or ...
    path: Option<String>,
    /// ... an inline patch applied to every object `target` selects.
    #[allow(dead_code)]
    patch: Option<String>,
    #[allow(dead_code)]
    target: Option<Value>,
}

impl Kustomization {
    fn read(dir: &Path) -> Kustomization {
        let path = dir.join("kustomization.yaml");
        let k: Kustomization = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        match k.kind.as_str() {
            "Kustomization" => assert_eq!(k.api_version, "kustomize.config.k8s.io/v1beta1"),
            "Component" => assert_eq!(k.api_version, "kustomize.config.k8s.io/v1alpha1"),
            other => panic!("{}: kind {other}", path.display()),
        }
        k
    }

    fn is_component(&self) -> bool {
        self.kind == "Component"
    }

    /// Every path the kustomization names, relative to its directory.
    fn references(&self) -> Vec<&str> {
        let generated = self
            .config_map_generator
            .iter()
            .flat_map(|g| g.files.iter().chain(&g.envs));
        self.resources
            .iter()
            .chain(&self.components)
            .chain(self.patches.iter().filter_map(|p| p.path.as_ref()))
            .chain(generated)
            .map(|s| s.as_str())
            .collect()
    }
}

/// `$KUBECTL`, else `kubectl` on PATH. Missing: a failure under CI (the
/// render tests are the point of this file), else a printed skip.
fn kubectl() -> Option<PathBuf> {
    let found = std::env::var_os("KUBECTL").map(PathBuf::from).or_else(|| {
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|d| d.join("kubectl"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        let why = "kubectl is not on PATH (nor named by $KUBECTL): the deploy/ render tests \
                   run `kubectl kustomize` (kubectl >= 1.27 bundles kustomize v5)";
        if std::env::var_os("CI").is_some() {
            panic!("{why}; CI must install kubectl");
        }
        eprintln!("SKIPPED: {why}");
    }
    found
}

/// What `kubectl apply -k <dir>` would send.
struct Rendered {
    dir: String,
    objects: Vec<Value>,
}

/// Renders `dir` (relative to `deploy/`) with `kubectl kustomize`; None
/// when kubectl is missing outside CI.
fn kustomize(dir: &str) -> Option<Rendered> {
    let kubectl = kubectl()?;
    let out = Command::new(&kubectl)
        .arg("kustomize")
        .arg(deploy().join(dir))
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", kubectl.display()));
    assert!(
        out.status.success(),
        "kubectl kustomize deploy/{dir} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let objects = documents_of(&text, &format!("kubectl kustomize deploy/{dir}"));
    assert!(!objects.is_empty(), "deploy/{dir} renders nothing");
    Some(Rendered {
        dir: format!("deploy/{dir}"),
        objects,
    })
}

impl Rendered {
    fn all<T: DeserializeOwned + Serialize>(&self, kind: &str) -> Vec<T> {
        self.objects
            .iter()
            .filter(|o| o["kind"] == kind)
            .map(|o| typed(o, &format!("{} ({kind})", self.dir)))
            .collect()
    }

    fn one<T: DeserializeOwned + Serialize>(&self, kind: &str) -> T {
        let mut found = self.all::<T>(kind);
        assert_eq!(found.len(), 1, "{}: expected one {kind}", self.dir);
        found.pop().unwrap()
    }

    fn contains(&self, kind: &str, name: &str) -> bool {
        self.objects
            .iter()
            .any(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }

    fn config_map(&self, name: &str) -> ConfigMap {
        self.all::<ConfigMap>("ConfigMap")
            .into_iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("{}: no ConfigMap {name} in the render", self.dir))
    }

    /// The pod template of the gateway DaemonSet.
    fn pod(&self) -> (DaemonSet, PodSpec) {
        let ds: DaemonSet = self.one("DaemonSet");
        let pod = ds.spec.as_ref().unwrap().template.spec.clone().unwrap();
        (ds, pod)
    }
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

/// What the install-cni sidecar does: `install` (chains tidegate-cni and
/// keeps it chained) or `uninstall` (unchains it and keeps it out).
fn installer_mode(c: &Container) -> &str {
    let cmd = c.command.as_deref().unwrap_or_default();
    assert_eq!(
        cmd.first().map(String::as_str),
        Some("/usr/local/bin/tidegate-cni"),
        "{}: runs tidegate-cni",
        c.name
    );
    let mode = cmd.get(1).map(String::as_str).unwrap_or_default();
    assert!(
        mode == "install" || mode == "uninstall",
        "{}: tidegate-cni {mode}",
        c.name
    );
    mode
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

/// The mount of `c` that holds `path` (the deepest one), if any.
fn mount_of<'a>(c: &'a Container, path: &Path) -> Option<&'a VolumeMount> {
    c.volume_mounts
        .iter()
        .flatten()
        .filter(|m| path.starts_with(&m.mount_path))
        .max_by_key(|m| m.mount_path.len())
}

/// The volume `path` lies on in `c`, and the path inside the volume.
fn volume_of<'a>(pod: &'a PodSpec, c: &Container, path: &Path) -> (&'a Volume, PathBuf) {
    let m = mount_of(c, path)
        .unwrap_or_else(|| panic!("{}: {} is not on a mounted volume", c.name, path.display()));
    let v = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == m.name)
        .unwrap_or_else(|| panic!("no volume {}", m.name));
    (v, path.strip_prefix(&m.mount_path).unwrap().to_owned())
}

/// The container's environment as the kubelet builds it: `envFrom` first,
/// then `env` (which wins). Downward-API values get a stand-in.
fn environment(r: &Rendered, c: &Container) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for from in c.env_from.iter().flatten() {
        assert!(from.prefix.is_none() && from.secret_ref.is_none());
        let name = &from
            .config_map_ref
            .as_ref()
            .expect("envFrom a ConfigMap")
            .name;
        let cm = r.config_map(name);
        env.extend(cm.data.unwrap_or_default());
    }
    for e in c.env.iter().flatten() {
        let v = match (&e.value, &e.value_from) {
            (Some(v), _) => v.clone(),
            // The downward API: an address where one is expected.
            (None, Some(from)) => match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                Some("status.podIP" | "status.hostIP") => "10.0.0.1".into(),
                _ => "from-downward-api".into(),
            },
            (None, None) => String::new(),
        };
        env.insert(e.name.clone(), v);
    }
    env
}

/// The gateway's config as the container would load it: the file named by
/// `TIDEGATE_CONFIG`, read from the ConfigMap volume it lies on, plus the
/// container's environment.
fn gateway_config(r: &Rendered, pod: &PodSpec, c: &Container) -> Config {
    let env = environment(r, c);
    let config_path = PathBuf::from(
        env.get("TIDEGATE_CONFIG")
            .expect("TIDEGATE_CONFIG names the config file"),
    );
    let (volume, key) = volume_of(pod, c, &config_path);
    let cm = volume
        .config_map
        .as_ref()
        .unwrap_or_else(|| panic!("{}: the config is not on a ConfigMap", r.dir));
    let key = key.to_str().unwrap();
    let text = r
        .config_map(&cm.name)
        .data
        .unwrap_or_default()
        .remove(key)
        .unwrap_or_else(|| panic!("{}: ConfigMap {} has no key {key}", r.dir, cm.name));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(key);
    std::fs::write(&file, text).unwrap();
    Config::load(Some(&file), env, &[])
        .unwrap_or_else(|e| panic!("{}: the gateway refuses its config: {e}", r.dir))
}

/// Every (Cluster)RoleBinding binds one ServiceAccount of the render to a
/// role of the render, and every role is bound.
fn check_bindings(r: &Rendered) {
    let accounts: BTreeSet<String> = r
        .all::<ServiceAccount>("ServiceAccount")
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    let mut roles: BTreeSet<(String, String)> = BTreeSet::new();
    for kind in ["ClusterRole", "Role"] {
        for o in r.objects.iter().filter(|o| o["kind"] == kind) {
            roles.insert((kind.into(), o["metadata"]["name"].as_str().unwrap().into()));
        }
    }
    let mut bound = BTreeSet::new();
    let bindings = r
        .all::<ClusterRoleBinding>("ClusterRoleBinding")
        .into_iter()
        .map(|b| (b.metadata.name, b.subjects, b.role_ref))
        .chain(
            r.all::<RoleBinding>("RoleBinding")
                .into_iter()
                .map(|b| (b.metadata.name, b.subjects, b.role_ref)),
        );
    for (name, subjects, role_ref) in bindings {
        let name = name.unwrap();
        let subjects = subjects.unwrap_or_default();
        assert_eq!(subjects.len(), 1, "{}: {name} binds one subject", r.dir);
        assert_eq!(subjects[0].kind, "ServiceAccount");
        assert!(
            accounts.contains(&subjects[0].name),
            "{}: {name} binds {}, not a ServiceAccount of the render",
            r.dir,
            subjects[0].name
        );
        let role = (role_ref.kind.clone(), role_ref.name.clone());
        assert!(
            roles.contains(&role),
            "{}: {name} binds {role:?}, not in the render",
            r.dir
        );
        bound.insert(role);
    }
    let unbound: Vec<_> = roles.difference(&bound).collect();
    assert!(
        unbound.is_empty(),
        "{}: roles bound to nobody: {unbound:?}",
        r.dir
    );
}

/// The ClusterRoles bound to `service_account` of `namespace`.
fn cluster_roles_of(r: &Rendered, service_account: &str, namespace: &str) -> Vec<ClusterRole> {
    let roles: BTreeMap<String, ClusterRole> = r
        .all::<ClusterRole>("ClusterRole")
        .into_iter()
        .map(|c| (c.metadata.name.clone().unwrap(), c))
        .collect();
    r.all::<ClusterRoleBinding>("ClusterRoleBinding")
        .into_iter()
        .filter(|b| {
            b.subjects
                .iter()
                .flatten()
                .any(|s| s.name == service_account && s.namespace.as_deref() == Some(namespace))
        })
        .map(|b| roles[&b.role_ref.name].clone())
        .collect()
}

/// (API group, resource) pairs the gateway's ServiceAccount may read, from
/// every ClusterRole bound to it; every rule read-only and without
/// wildcards, and no namespaced Role at all.
fn granted(r: &Rendered, service_account: &str, namespace: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for b in r.all::<RoleBinding>("RoleBinding") {
        assert!(
            !b.subjects
                .iter()
                .flatten()
                .any(|s| s.name == service_account),
            "{}: the gateway has no namespaced Role",
            r.dir
        );
    }
    for role in cluster_roles_of(r, service_account, namespace) {
        for rule in role.rules.clone().unwrap_or_default() {
            let verbs: BTreeSet<_> = rule.verbs.iter().map(String::as_str).collect();
            assert_eq!(verbs, BTreeSet::from(["get", "list", "watch"]), "read-only");
            assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
            for g in rule.api_groups.unwrap() {
                for res in rule.resources.clone().unwrap() {
                    assert!(g != "*" && res != "*", "no wildcards");
                    out.insert((g.clone(), res));
                }
            }
        }
    }
    out
}

/// What discovery reads with this config (the Service watch and Istio's
/// security resources are optional).
fn watched(config: &Config) -> BTreeSet<(String, String)> {
    let services = <Service as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    let k = &config.workloads.kubernetes;
    tidegate::workloads::kubernetes::WATCHED_RESOURCES
        .iter()
        .filter(|(_, res)| k.services || *res != services)
        .filter(|(group, _)| k.authorization || *group != "security.istio.io")
        .filter(|(_, res)| {
            config.outbound.learn_cluster_ranges || !matches!(*res, "nodes" | "servicecidrs")
        })
        .map(|(g, r)| (g.to_string(), r.to_string()))
        .collect()
}

/// Every invariant of a rendered install; returns the gateway's config.
fn check_invariants(r: &Rendered) -> Config {
    for o in &r.objects {
        check_typed(o, &r.dir);
    }
    let (ds, pod) = r.pod();
    let spec = ds.spec.as_ref().unwrap();
    let template = spec.template.metadata.as_ref().unwrap();
    let template_labels = template.labels.clone().unwrap();
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
            "{}: selector {k}={v} does not match the template",
            r.dir
        );
    }
    let gw = container(&pod, "tidegate");
    let config = gateway_config(r, &pod, gw);

    // Probes point at the readiness listener the config really opens.
    let ready = config.listeners.readiness.port();
    assert_eq!(port(&gw.readiness_probe), (ready, "/healthz/ready".into()));
    assert_eq!(port(&gw.liveness_probe), (ready, "/healthz/live".into()));
    let annotations = template.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("prometheus.io/port").map(String::as_str),
        Some(config.listeners.metrics.port().to_string().as_str()),
        "{}: the scrape annotation names the metrics port",
        r.dir
    );
    assert!(
        config.listeners.admin.ip().is_loopback(),
        "{}: the admin API (policy swaps) stays on the node's loopback",
        r.dir
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

    // The CNI plugin talks to the socket the gateway listens on, on a host
    // path; it is chained (install) or kept out (uninstall) for as long as
    // the pod runs: a native sidecar that re-checks (`--watch`).
    let socket = config
        .drains
        .cni_socket
        .clone()
        .expect("drains.cni_socket is set");
    let cni = container(&pod, "install-cni");
    let chains = installer_mode(cni) == "install";
    assert_eq!(cni.restart_policy.as_deref(), Some("Always"));
    assert!(arg_after(cni, "--watch").parse::<u64>().unwrap() > 0);
    if chains {
        assert_eq!(Path::new(arg_after(cni, "--socket")), socket);
        // The gateway answers a pod's ADD (waiting for discovery to know
        // the pod) before the plugin gives up on it.
        let timeout = Duration::from_millis(arg_after(cni, "--timeout-ms").parse().unwrap());
        assert!(
            config.capture.membership_wait < timeout,
            "{}: capture.membership_wait {:?} must be below the plugin's --timeout-ms {timeout:?}",
            r.dir,
            config.capture.membership_wait
        );
    }
    let (run, _) = volume_of(&pod, gw, &socket);
    assert!(run.host_path.is_some(), "the socket dir is a hostPath");
    let volumes: BTreeMap<_, _> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.clone(), v))
        .collect();
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

    // In-pod capture: tidegate-cni enrolls pods (or, with ZDS, istio-cni
    // does and tidegate-cni passes them through); the records it writes are
    // where the gateway reads them; pods' namespaces are visible to it.
    if config.capture.mode == CaptureMode::Inpod {
        // Unchained (uninstall), tidegate-cni enrolls nothing; the gateway
        // keeps serving the pods it enrolled before (their records).
        let enrolls = chains && arg_after(cni, "--capture") == "inpod";
        if chains {
            assert_eq!(
                enrolls,
                config.capture.zds_socket.is_none(),
                "{}: exactly one of tidegate-cni ADD and istio-cni (ZDS) enrolls pods",
                r.dir
            );
        }
        if enrolls {
            let state = config
                .capture
                .state_dir
                .as_deref()
                .expect("capture.state_dir is set");
            assert_eq!(Path::new(arg_after(cni, "--state-dir")), state);
            assert!(volume_of(&pod, gw, state).0.host_path.is_some());
        }
        if let Some(zds) = &config.capture.zds_socket {
            // The node agent's socket directory on the node: istio-cni's,
            // or Cilium's agent's.
            let (v, _) = volume_of(&pod, gw, zds);
            let dir = zds.parent().and_then(Path::to_str);
            assert!(
                matches!(dir, Some("/var/run/ztunnel" | "/var/run/cilium")),
                "{}: a node agent's socket directory: {zds:?}",
                r.dir
            );
            assert_eq!(
                v.host_path.as_ref().map(|h| h.path.as_str()),
                dir,
                "{}: the node agent's socket directory on the node",
                r.dir
            );
        }
        let netns = mount_of(gw, Path::new("/var/run/netns"))
            .expect("pods' namespaces are mounted at /var/run/netns");
        assert_eq!(netns.mount_propagation.as_deref(), Some("HostToContainer"));
        assert_eq!(
            volumes[&netns.name]
                .host_path
                .as_ref()
                .map(|h| h.path.as_str()),
            Some("/var/run/netns")
        );
    }

    // Every mount has its volume; a ConfigMap or Secret volume names an
    // object of the render or one the cluster provides (PROVIDED_ELSEWHERE).
    let elsewhere = |kind: &str, name: &str| {
        PROVIDED_ELSEWHERE
            .iter()
            .any(|(k, n, _)| *k == kind && *n == name)
    };
    for v in volumes.values() {
        if let Some(cm) = &v.config_map {
            assert!(
                r.contains("ConfigMap", &cm.name) || elsewhere("ConfigMap", &cm.name),
                "{}: volume {}: ConfigMap {} is neither rendered nor provided elsewhere",
                r.dir,
                v.name,
                cm.name
            );
        }
        if let Some(s) = &v.secret {
            let name = s.secret_name.clone().unwrap_or_default();
            assert!(
                r.contains("Secret", &name) || elsewhere("Secret", &name),
                "{}: volume {}: Secret {name} is neither rendered nor provided elsewhere",
                r.dir,
                v.name
            );
        }
    }
    for c in pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
    {
        for m in c.volume_mounts.iter().flatten() {
            assert!(
                volumes.contains_key(&m.name),
                "{}: no volume {}",
                c.name,
                m.name
            );
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
        // In-pod capture: the gateway enters pods' namespaces (SYS_ADMIN),
        // marks its sockets there and delivers with the client's address
        // (NET_ADMIN, NET_RAW). Nothing else, and nothing for the installer.
        let added: BTreeSet<&str> = caps.add.iter().flatten().map(String::as_str).collect();
        let expected: BTreeSet<&str> =
            if c.name == "tidegate" && config.capture.mode == CaptureMode::Inpod {
                ["NET_ADMIN", "NET_RAW", "SYS_ADMIN"].into()
            } else {
                BTreeSet::new()
            };
        assert_eq!(added, expected, "{}: capabilities added", c.name);
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

    // Files the config names are where the pod can read them (istio-ca's
    // token and roots: `ca::check_istio_ca`).
    if let CertificatesConfig::Dir {
        dir, trust_bundle, ..
    } = &config.certificates
    {
        volume_of(&pod, gw, dir);
        volume_of(&pod, gw, trust_bundle);
    }
    for (name, p) in &config.policies.plugins {
        if p.file.starts_with("/opt/tidegate/plugins") {
            assert!(
                repo().join("plugins").join(name).exists(),
                "plugin {name} is not one the image builds"
            );
        } else {
            volume_of(&pod, gw, &p.file);
        }
    }
    match &config.oci.auth {
        _ if !config.oci.enabled => {}
        Some(OciAuth::ApiKey { key_file, .. }) => {
            let (v, _) = volume_of(&pod, gw, key_file);
            assert!(
                v.secret.is_some(),
                "{}: the OCI API key is on a Secret volume",
                r.dir
            );
        }
        Some(OciAuth::WorkloadIdentity { token_file, .. }) => {
            if !token_file.starts_with("/var/run/secrets/kubernetes.io/serviceaccount") {
                volume_of(&pod, gw, token_file);
            }
        }
        None => unreachable!("the config parser requires oci.auth when enabled"),
    }

    // Namespaced objects live in the one Namespace; the ServiceAccount the
    // pod uses is the one the bindings grant.
    let namespace: Namespace = r.one("Namespace");
    let ns = namespace.metadata.name.clone().unwrap();
    for o in &r.objects {
        let cluster_scoped = ["Namespace", "ClusterRole", "ClusterRoleBinding"]
            .contains(&o["kind"].as_str().unwrap());
        let expected = if cluster_scoped {
            Value::Null
        } else {
            Value::from(ns.as_str())
        };
        assert_eq!(
            o["metadata"]["namespace"], expected,
            "{}: namespace of {} {}",
            r.dir, o["kind"], o["metadata"]["name"]
        );
    }
    check_outside_the_mesh(r, &config, &namespace);
    let sa: ServiceAccount = r
        .all::<ServiceAccount>("ServiceAccount")
        .into_iter()
        .find(|s| s.metadata.name == pod.service_account_name)
        .unwrap_or_else(|| panic!("{}: the gateway's ServiceAccount is not rendered", r.dir));
    let granted_to_gateway = granted(r, sa.metadata.name.as_deref().unwrap(), &ns);
    if config.workloads.source == WorkloadSourceKind::Istio {
        // istiod is the source: the API server grants the gateway nothing.
        assert_eq!(
            granted_to_gateway,
            BTreeSet::new(),
            "{}: nothing granted to a gateway that reads istiod",
            r.dir
        );
    } else {
        // Discovery uses the in-cluster credentials of that ServiceAccount
        // and may read exactly what it watches with this config.
        assert_eq!(config.workloads.source, WorkloadSourceKind::Kubernetes);
        assert_ne!(sa.automount_service_account_token, Some(false));
        assert_ne!(pod.automount_service_account_token, Some(false));
        assert_eq!(
            granted_to_gateway,
            watched(&config),
            "{}: RBAC grants exactly what discovery watches",
            r.dir
        );
    }
    check_bindings(r);
    if let CertificatesConfig::IstioCa(ca_config) = &config.certificates {
        ca::check_istio_ca(r, &pod, gw, ca_config, &ns, &sa, &config.trust_domain);
    }
    config
}

/// The label the gateway reads is the one the docs name, and the mesh's own
/// pods (the gateway on the host network, `tidegate-ca` in its namespace)
/// are not members by the rule that decides capture and HBONE alike.
fn check_outside_the_mesh(r: &Rendered, config: &Config, namespace: &Namespace) {
    let mesh_label = &config.workloads.kubernetes.mesh_label;
    assert_eq!(mesh_label, membership::MESH_LABEL, "{}", r.dir);
    let ns = namespace.metadata.name.as_deref().unwrap();
    let (ds, _) = r.pod();
    let templates = std::iter::once(("DaemonSet", ds.spec.unwrap().template)).chain(
        r.all::<Deployment>("Deployment")
            .into_iter()
            .map(|d| ("Deployment", d.spec.unwrap().template)),
    );
    for (kind, template) in templates {
        let spec = template.spec.unwrap();
        let labels = template.metadata.and_then(|m| m.labels);
        let m = membership::decide(
            mesh_label,
            membership::PodFacts {
                namespace: ns,
                pod_labels: labels.as_ref(),
                namespace_labels: namespace.metadata.labels.as_ref(),
                host_network: spec.host_network == Some(true),
            },
        );
        assert!(
            !m.member,
            "{}: the {kind}'s pods would be mesh members ({})",
            r.dir,
            m.reason.describe()
        );
    }
}

#[test]
fn every_manifest_parses_into_typed_objects() {
    let files = yaml_files();
    let mut kinds = BTreeSet::new();
    for f in &files {
        if f.file_name().unwrap() == "tidegate.yaml" {
            Config::load(Some(f), Vec::new(), &[])
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            continue;
        }
        if f.file_name().unwrap() == "kustomization.yaml" {
            kinds.insert(Kustomization::read(f.parent().unwrap()).kind);
            continue;
        }
        if f.starts_with(deploy().join("istio")) {
            // Helm values for Istio's charts, no Kubernetes objects:
            // checked against the charts in manifests/istio_charts.rs.
            continue;
        }
        for doc in documents(f) {
            kinds.insert(check_typed(&doc, &f.display().to_string()));
        }
    }
    for k in ["DaemonSet", "ClusterRole", "Kustomization", "Component"] {
        assert!(kinds.contains(k), "{k} missing from {kinds:?}");
    }

    // Every kustomization names files that exist, and every file beside it
    // is named (a patch nobody references would silently do nothing).
    for dir in kustomization_dirs() {
        let k = Kustomization::read(&dir);
        let refs = k.references();
        for r in &refs {
            assert!(
                dir.join(r).exists(),
                "{}: {r} does not exist",
                dir.display()
            );
        }
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_str().unwrap();
            assert!(
                p.is_dir() || name == "kustomization.yaml" || refs.contains(&name),
                "{} is not referenced by its kustomization",
                p.display()
            );
        }
    }
}

#[test]
fn a_misspelt_field_is_caught() {
    let doc: Value = serde_yaml::from_str(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: x, namespce: y}\n",
    )
    .unwrap();
    let r = std::panic::catch_unwind(|| typed::<ServiceAccount>(&doc, "t.yaml"));
    let msg = *r.unwrap_err().downcast::<String>().unwrap();
    assert!(msg.contains(".metadata.namespce"), "{msg}");
}

#[test]
fn every_kustomization_renders_and_keeps_its_invariants() {
    let dirs = install_dirs();
    for expected in [
        "base",
        "overlays/example",
        "overlays/uninstall",
        "examples/oci-draining",
        "examples/istio-ambient",
        "examples/cilium",
    ] {
        assert!(dirs.iter().any(|d| d == expected), "{expected}: {dirs:?}");
    }
    for dir in &dirs {
        let Some(r) = kustomize(dir) else { return };
        check_invariants(&r);
    }
}

#[test]
fn the_base_keeps_its_invariants() {
    let Some(r) = kustomize("base") else { return };
    let config = check_invariants(&r);
    assert_eq!(config.listeners.readiness.port(), 15021);
    // Off in the base: OCI draining. On: the Service watch (routing by
    // ClusterIP), and granted.
    assert!(!config.oci.enabled);
    assert!(config.workloads.kubernetes.services);
    assert!(granted(&r, "tidegate", "tidegate-system")
        .contains(&(String::new(), "services".to_owned())));
    // Certificates from `tidegate-ca`, installed beside the gateways
    // (check_invariants checked the two fit together).
    let CertificatesConfig::IstioCa(ca) = &config.certificates else {
        panic!("certificates from the Istio CA protocol")
    };
    assert_eq!(ca.address, "https://tidegate-ca.tidegate-system.svc:15012");
    assert!(r.contains("Deployment", "tidegate-ca"));
    // Its metrics are scraped where the binary serves them.
    let ca = r
        .all::<Deployment>("Deployment")
        .into_iter()
        .find(|d| d.metadata.name.as_deref() == Some("tidegate-ca"))
        .unwrap();
    let template = ca.spec.unwrap().template;
    let served = <tidegate_ca::config::CaServerConfig as clap::CommandFactory>::command()
        .get_arguments()
        .find(|a| a.get_id() == "metrics_listen")
        .and_then(|a| a.get_default_values().first().cloned())
        .and_then(|v| v.to_str()?.parse::<std::net::SocketAddr>().ok())
        .expect("tidegate-ca's default metrics address")
        .port();
    let annotations = template.metadata.unwrap().annotations.unwrap_or_default();
    assert_eq!(
        annotations.get("prometheus.io/port"),
        Some(&served.to_string())
    );
    let declared: Vec<i32> = container(&template.spec.unwrap(), "tidegate-ca")
        .ports
        .iter()
        .flatten()
        .map(|p| p.container_port)
        .collect();
    assert!(declared.contains(&i32::from(served)), "{declared:?}");
}

#[test]
fn the_example_overlay_keeps_its_invariants_and_sets_its_values() {
    let Some(r) = kustomize("overlays/example") else {
        return;
    };
    let config = check_invariants(&r);
    assert_eq!(config.trust_domain, "example.org");
    assert_eq!(
        config.policies.default.as_deref(),
        Some("goaway-on-term-start")
    );
    assert_eq!(config.listeners.readiness.port(), 16021);
}

#[test]
fn the_oci_draining_example_turns_draining_on_with_its_key_and_rbac() {
    let Some(r) = kustomize("examples/oci-draining") else {
        return;
    };
    let config = check_invariants(&r);
    assert!(config.oci.enabled, "the component enables oci");
    // The overlay's values (oci.env) reach the gateway through envFrom.
    assert_eq!(config.oci.region, "us-ashburn-1");
    assert_eq!(
        config.oci.load_balancers,
        ["ocid1.loadbalancer.oc1.iad.aaaaaaaaexample"]
    );
    assert_eq!(config.oci.node_networks.len(), 1);
    let Some(OciAuth::ApiKey {
        key_file,
        fingerprint,
        ..
    }) = &config.oci.auth
    else {
        panic!("api-key auth: {:?}", config.oci.auth)
    };
    assert_eq!(
        fingerprint,
        "12:34:56:78:9a:bc:de:f0:12:34:56:78:9a:bc:de:f0"
    );
    let (_, pod) = r.pod();
    let (v, key) = volume_of(&pod, container(&pod, "tidegate"), key_file);
    let secret = v.secret.as_ref().expect("the key is on a Secret volume");
    assert_eq!(secret.secret_name.as_deref(), Some("tidegate-oci-api-key"));
    assert_eq!(key, Path::new("key.pem"), "the Secret's key is key.pem");
    assert_eq!(secret.default_mode, Some(0o400));
    // The opt-in annotation is read from Services: watched and granted.
    assert!(config.workloads.kubernetes.services);
    assert!(granted(&r, "tidegate", "tidegate-system")
        .contains(&(String::new(), "services".to_owned())));
}

/// The Cilium example: `control_plane: cilium` over the base's file, the
/// agent's sockets and bootstrap certificate mounted, the node named by its
/// host IP, no token, tidegate-cni's DEL hook only, and the nodes handed over.
#[test]
fn the_cilium_example_takes_everything_from_the_agent() {
    let Some(r) = kustomize("examples/cilium") else {
        return;
    };
    let config = check_invariants(&r);
    assert_eq!(config.workloads.source, WorkloadSourceKind::Istio);
    let istio = &config.workloads.istio;
    assert_eq!(istio.address, "unix:///var/run/cilium/xds.sock");
    assert!(istio.workloads_only);
    assert_eq!(istio.token, None);
    assert_eq!(
        config.capture.zds_socket.as_deref(),
        Some(Path::new("/var/run/cilium/ztunnel.sock"))
    );
    assert!(!config.dns.enabled);
    let CertificatesConfig::IstioCa(ca) = &config.certificates else {
        panic!("certificates from the agent's CA")
    };
    assert_eq!(ca.address, "https://127.0.0.1:15012");
    assert_eq!(ca.token, None);
    assert_eq!(istio.roots, ca.roots, "both verified against the bootstrap");
    let (_, pod) = r.pod();
    let gw = container(&pod, "tidegate");
    let (v, _) = volume_of(&pod, gw, Path::new("/var/run/cilium/ztunnel.sock"));
    assert_eq!(
        v.host_path.as_ref().map(|h| h.path.as_str()),
        Some("/var/run/cilium")
    );
    let node = gw
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "TIDEGATE_NODE_NAME")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|f| f.field_ref.as_ref())
        .map(|f| f.field_path.clone());
    assert_eq!(node.as_deref(), Some("status.hostIP"));
    assert_eq!(
        arg_after(container(&pod, "install-cni"), "--capture"),
        "node"
    );
    let selector = pod.node_selector.clone().unwrap_or_default();
    assert_eq!(
        selector.get("tidegate.io/node-proxy").map(String::as_str),
        Some("tidegate")
    );
    for kind in ["Deployment", "Service", "ClusterRole"] {
        assert!(
            !r.contains(kind, "tidegate-ca"),
            "{kind} tidegate-ca left out"
        );
    }
}

#[test]
fn the_istio_ambient_example_takes_certificates_from_istiod() {
    let Some(r) = kustomize("examples/istio-ambient") else {
        return;
    };
    let config = check_invariants(&r);
    assert_eq!(config.trust_domain, "cluster.local");
    // Certificates from istiod, verified against the root it publishes;
    // tidegate-ca is not installed.
    let CertificatesConfig::IstioCa(ca) = &config.certificates else {
        panic!("certificates from istiod")
    };
    assert_eq!(ca.address, "https://istiod.istio-system.svc:15012");
    let (_, pod) = r.pod();
    let gw = container(&pod, "tidegate");
    let (v, key) = volume_of(&pod, gw, &ca.roots);
    assert_eq!(
        v.config_map.as_ref().map(|c| c.name.as_str()),
        Some("istio-ca-root-cert")
    );
    assert_eq!(key, Path::new("root-cert.pem"));
    for kind in [
        "Deployment",
        "Service",
        "ServiceAccount",
        "ClusterRole",
        "Role",
    ] {
        assert!(
            !r.contains(kind, "tidegate-ca"),
            "{kind} tidegate-ca left out"
        );
    }
    // Pods come from istio-cni over ZDS; tidegate-cni keeps only its DEL hook.
    assert_eq!(config.capture.mode, CaptureMode::Inpod);
    assert_eq!(
        config.capture.zds_socket.as_deref(),
        Some(Path::new("/var/run/ztunnel/ztunnel.sock"))
    );
    assert_eq!(
        arg_after(container(&pod, "install-cni"), "--capture"),
        "node"
    );
    // Workloads, Services and policies from istiod, over TLS, as a node
    // proxy named after this pod.
    let istio = &config.workloads.istio;
    assert_eq!(config.workloads.source, WorkloadSourceKind::Istio);
    assert_eq!(istio.address, "https://istiod.istio-system.svc:15012");
    assert_eq!(
        istio.roots, ca.roots,
        "istiod verified against its own root"
    );
    assert_eq!(istio.token, ca.token);
    let env = environment(&r, gw);
    for key in ["POD_IP", "POD_NAME", "POD_NAMESPACE"] {
        let name = format!("TIDEGATE_WORKLOADS__ISTIO__{key}");
        let var = gw.env.iter().flatten().find(|e| e.name == name);
        assert!(
            var.is_some_and(|v| v.value_from.is_some()),
            "{name} from the downward API ({env:?})"
        );
    }
    // Only the nodes handed over (`tidegate.io/node-proxy`), and ztunnel
    // kept off exactly those: istio_charts.rs.
    let selector = pod.node_selector.clone().unwrap_or_default();
    assert!(
        selector.contains_key("tidegate.io/node-proxy"),
        "tidegate runs only on the nodes labelled for it"
    );
}

/// Uninstalling never strands a pod: the uninstall overlay is the base
/// with only the installer changed — it unchains tidegate-cni on each node
/// and keeps it out — while the gateway keeps serving (same config, same
/// everything). It rolls out like an upgrade, the new pod started before
/// the old one stops, so on no node is the plugin (which fails closed)
/// chained while no gateway answers it; `kubectl delete -k` comes after.
#[test]
fn uninstalling_unchains_the_plugin_while_the_gateway_still_serves() {
    let (Some(base), Some(un)) = (kustomize("base"), kustomize("overlays/uninstall")) else {
        return;
    };
    let (_, base_pod) = base.pod();
    let (ds, un_pod) = un.pod();
    let install = container(&base_pod, "install-cni");
    let uninstall = container(&un_pod, "install-cni");
    assert_eq!(installer_mode(install), "install");
    assert_eq!(installer_mode(uninstall), "uninstall");
    for flag in ["--cni-bin-dir", "--cni-conf-dir"] {
        assert_eq!(
            arg_after(install, flag),
            arg_after(uninstall, flag),
            "{flag}"
        );
    }
    assert_eq!(install.volume_mounts, uninstall.volume_mounts);
    // Nothing but the installer's command differs: the gateway, its config,
    // the CA and RBAC stay exactly as installed until they are deleted.
    let without_installer_command = |objects: &[Value]| -> Vec<Value> {
        let mut objects = objects.to_vec();
        for o in objects.iter_mut().filter(|o| o["kind"] == "DaemonSet") {
            let init = &mut o["spec"]["template"]["spec"]["initContainers"];
            for c in init.as_array_mut().unwrap() {
                if c["name"] == "install-cni" {
                    c["command"] = Value::Null;
                }
            }
        }
        objects
    };
    assert_eq!(
        without_installer_command(&base.objects),
        without_installer_command(&un.objects),
        "deploy/overlays/uninstall changes only the installer's command"
    );
    let update = ds.spec.unwrap().update_strategy.unwrap();
    assert_eq!(update.type_.as_deref(), Some("RollingUpdate"));
    let rolling = update.rolling_update.unwrap();
    assert_eq!(
        rolling.max_unavailable,
        Some(IntOrString::Int(0)),
        "a node keeps a gateway while its pod is replaced"
    );
    assert!(
        matches!(rolling.max_surge, Some(IntOrString::Int(n)) if n >= 1),
        "the new pod starts before the old one stops"
    );
}

/// The mesh labels the docs and the manifests show (`kubectl label ...
/// tidegate.io/mesh=enabled`, `istio.io/dataplane-mode: ambient`) are
/// values the membership rule reads: an example that says `true` would
/// leave its pods out of the mesh without a word.
#[test]
fn mesh_labels_in_the_docs_and_manifests_are_ones_the_rule_reads() {
    let mut files = vec![
        repo().join("README.md"),
        deploy().join("README.md"),
        repo().join("docs/istio.md"),
    ];
    files.extend(yaml_files());
    let rules = [
        (
            membership::MESH_LABEL,
            [membership::ENABLED, membership::DISABLED],
        ),
        (
            membership::ISTIO_DATAPLANE_MODE,
            [membership::AMBIENT, membership::NONE],
        ),
    ];
    let mut seen = BTreeSet::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (key, values) in rules {
            for (at, _) in text.match_indices(key) {
                let rest = &text[at + key.len()..];
                // `key=value`, `key: value`, `"key": "value"`; `key-` (a
                // label's removal) and the bare key name no value.
                let Some(rest) = ["=", ": ", "\": \""]
                    .iter()
                    .find_map(|sep| rest.strip_prefix(sep))
                else {
                    continue;
                };
                let value: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                assert!(
                    values.contains(&value.as_str()),
                    "{}: {key}={value} is not a value the membership rule reads ({values:?})",
                    f.display()
                );
                seen.insert(format!("{key}={value}"));
            }
        }
    }
    // Both labels are shown somewhere (the base's config comment, the Istio
    // ambient section): the check above is not vacuous.
    for shown in [
        "tidegate.io/mesh=enabled",
        "istio.io/dataplane-mode=ambient",
    ] {
        assert!(seen.contains(shown), "{shown} appears nowhere: {seen:?}");
    }
}

#[test]
fn every_component_has_a_worked_example() {
    let components = deploy().join("components");
    let readme = std::fs::read_to_string(deploy().join("README.md")).unwrap();
    let mut names = Vec::new();
    for e in std::fs::read_dir(&components).unwrap() {
        let dir = e.unwrap().path();
        let name = dir.file_name().unwrap().to_str().unwrap().to_owned();
        let k = Kustomization::read(&dir);
        assert!(k.is_component(), "{}: kind Component", dir.display());
        let example = deploy().join("examples").join(&name);
        let uses = Kustomization::read(&example).components;
        assert!(
            uses.contains(&format!("../../components/{name}")),
            "{}: uses the {name} component",
            example.display()
        );
        assert!(
            readme.contains(&format!("deploy/examples/{name}")),
            "deploy/README.md has no worked example of {name}"
        );
        names.push(name);
    }
    names.sort();
    assert_eq!(names, ["cilium", "istio-ambient", "oci-draining"]);
}

/// `.dockerignore` as Docker reads it, for the patterns used there: literal
/// paths (a directory excludes everything under it) and `**/<name>`.
fn docker_ignores(patterns: &[String], path: &str) -> bool {
    patterns.iter().any(|p| {
        let p = p.trim_start_matches('/').trim_end_matches('/');
        if let Some(name) = p.strip_prefix("**/") {
            assert!(!name.contains(['*', '?', '[', '/']), "pattern {p}");
            path.split('/').any(|c| c == name)
        } else {
            assert!(
                !p.contains(['*', '?', '[', '!']),
                "pattern {p}: extend this matcher"
            );
            path == p || path.starts_with(&format!("{p}/"))
        }
    })
}

#[test]
fn the_docker_build_context_leaves_out_build_output() {
    let text = std::fs::read_to_string(repo().join(".dockerignore"))
        .expect(".dockerignore at the repository root (deploy/Dockerfile builds from there)");
    let patterns: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    // Build output (gigabytes) and history stay out ...
    for out in [
        "target",
        "target/debug/tidegate",
        "plugins/target/wasm32-unknown-unknown/release/recommended.wasm",
        "gateway/target/x",
        ".git/HEAD",
    ] {
        assert!(docker_ignores(&patterns, out), "{out} is sent as context");
    }
    // ... and everything the image's `cargo` build reads stays in: the
    // workspace, its members, the plugins workspace, the cargo alias, the
    // files compiled in with include_str!.
    let dockerfile = std::fs::read_to_string(deploy().join("Dockerfile")).unwrap();
    assert!(
        dockerfile.contains("COPY . .") && dockerfile.contains("cargo xtask plugins"),
        "the Dockerfile copies the whole context and builds the plugins"
    );
    let manifest = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let members = manifest
        .lines()
        .find_map(|l| l.strip_prefix("members = "))
        .expect("workspace members");
    let members: Vec<String> = serde_json::from_str(members).unwrap();
    let mut needed = vec![
        "Cargo.toml".to_owned(),
        "Cargo.lock".to_owned(),
        ".cargo/config.toml".to_owned(),
        "plugins/Cargo.toml".to_owned(),
        "plugins/recommended/src/lib.rs".to_owned(),
        "sdk/README.md".to_owned(),
        "sdk/wit/policy.wit".to_owned(),
        "gateway/defaults/tidegate.yaml".to_owned(),
    ];
    needed.extend(members.iter().map(|m| format!("{m}/Cargo.toml")));
    for path in &needed {
        assert!(repo().join(path).exists(), "{path} does not exist");
        assert!(
            !docker_ignores(&patterns, path),
            "{path} is left out of the build context"
        );
    }
}
