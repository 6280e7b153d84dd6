//! `certificates.source: istio-ca` in a render: the gateway's token and
//! roots are where the config says, and either `tidegate-ca` is rendered
//! beside it (its Service is the address the gateways dial, its settings
//! match theirs, its RBAC is exactly what it calls) or the CA is istiod and
//! `tidegate-ca` is left out.

use std::collections::BTreeSet;
use std::path::Path;

use clap::{CommandFactory, FromArgMatches};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, PodSpec, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tidegate::config::IstioCaConfig;
use tidegate_ca::server::CaServerConfig;

use super::{cluster_roles_of, environment, volume_of, Rendered};

/// (group, resource, verb, resource name or "") — what `tidegate-ca` calls:
/// TokenReview create, pods list/watch (and get), its root Secret
/// get/create, its root ConfigMap get/create/update.
fn ca_needs(root: &str) -> BTreeSet<(String, String, String, String)> {
    let row = |g: &str, r: &str, v: &str, n: &str| (g.into(), r.into(), v.into(), n.into());
    BTreeSet::from([
        row("authentication.k8s.io", "tokenreviews", "create", ""),
        row("", "pods", "get", ""),
        row("", "pods", "list", ""),
        row("", "pods", "watch", ""),
        row("", "secrets", "create", ""),
        row("", "secrets", "get", root),
        row("", "configmaps", "create", ""),
        row("", "configmaps", "get", root),
        row("", "configmaps", "update", root),
    ])
}

fn rows(rules: &[PolicyRule], out: &mut BTreeSet<(String, String, String, String)>) {
    for rule in rules {
        let names = rule
            .resource_names
            .clone()
            .unwrap_or_else(|| vec![String::new()]);
        for g in rule.api_groups.iter().flatten() {
            for res in rule.resources.iter().flatten() {
                for v in &rule.verbs {
                    assert!(g != "*" && res != "*" && v != "*", "no wildcards");
                    for n in &names {
                        out.insert((g.clone(), res.clone(), v.clone(), n.clone()));
                    }
                }
            }
        }
    }
}

/// `tidegate-ca`'s settings as its container would parse them: each
/// environment variable a flag reads, the flag's default otherwise; the
/// downward API's `metadata.namespace` is the pod's namespace `ns`.
fn ca_settings(r: &Rendered, c: &Container, ns: &str) -> CaServerConfig {
    let mut env = environment(r, c);
    for e in c.env.iter().flatten() {
        let field = e.value_from.as_ref().and_then(|v| v.field_ref.as_ref());
        if field.is_some_and(|f| f.field_path == "metadata.namespace") {
            env.insert(e.name.clone(), ns.to_owned());
        }
    }
    let cmd = CaServerConfig::command();
    let mut argv = vec!["tidegate-ca".to_owned()];
    for arg in cmd.get_arguments() {
        let (Some(name), Some(long)) = (arg.get_env(), arg.get_long()) else {
            continue;
        };
        if let Some(v) = env.get(name.to_str().unwrap()) {
            argv.push(format!("--{long}={v}"));
        }
    }
    let m = cmd
        .try_get_matches_from(&argv)
        .unwrap_or_else(|e| panic!("{}: tidegate-ca refuses {argv:?}: {e}", r.dir));
    CaServerConfig::from_arg_matches(&m).unwrap()
}

/// `https://host:port` → (host, port).
fn host_port(address: &str) -> (String, u16) {
    let rest = address
        .strip_prefix("https://")
        .unwrap_or_else(|| panic!("certificates.address {address}: https://host:port"));
    let (host, port) = rest.rsplit_once(':').expect("an explicit port");
    (host.to_owned(), port.parse().unwrap())
}

pub(super) fn check_istio_ca(
    r: &Rendered,
    pod: &PodSpec,
    gw: &Container,
    cfg: &IstioCaConfig,
    ns: &str,
    gateway_sa: &ServiceAccount,
    trust_domain: &str,
) {
    let Some(token_path) = &cfg.token else {
        // Cilium's agent: no token; its CA on the node's loopback, verified
        // against its bootstrap certificate (a Secret's), the workloads'
        // root learned from its answers; tidegate-ca is not installed.
        assert!(
            cfg.trust_answer_root,
            "{}: no token but not Cilium's CA",
            r.dir
        );
        assert!(host_port(&cfg.address).0.starts_with("127."), "{}", r.dir);
        let (v, key) = volume_of(pod, gw, &cfg.roots);
        assert!(
            v.secret.is_some(),
            "{}: the bootstrap certificate is a Secret's",
            r.dir
        );
        assert_eq!(key, Path::new("bootstrap-root.crt"));
        assert!(!r.contains("Deployment", "tidegate-ca"), "{}", r.dir);
        return;
    };
    // The token: this pod's own projected token, for the CA's audience.
    let (v, key) = volume_of(pod, gw, token_path);
    let projected = v
        .projected
        .as_ref()
        .unwrap_or_else(|| panic!("{}: certificates.token is not a projected token", r.dir));
    let token = projected
        .sources
        .iter()
        .flatten()
        .find_map(|s| s.service_account_token.as_ref())
        .expect("a serviceAccountToken source");
    assert_eq!(Path::new(&token.path), key, "{}: the token's file", r.dir);
    assert!(
        token.expiration_seconds.unwrap_or(3600) <= 48 * 3600,
        "a short-lived token"
    );
    // The roots: a ConfigMap's root-cert.pem.
    let (v, key) = volume_of(pod, gw, &cfg.roots);
    let roots_cm = v
        .config_map
        .as_ref()
        .unwrap_or_else(|| panic!("{}: certificates.roots is not on a ConfigMap", r.dir));
    assert_eq!(key, Path::new("root-cert.pem"));

    let (host, port) = host_port(&cfg.address);
    let service = r.all::<Service>("Service").into_iter().find(|s| {
        let (name, namespace) = (s.metadata.name.clone(), s.metadata.namespace.clone());
        host == format!("{}.{}.svc", name.unwrap(), namespace.unwrap())
    });
    let Some(service) = service else {
        // Another CA (istiod): tidegate-ca is not installed, and its root
        // is the one Istio publishes.
        assert!(
            !r.contains("Deployment", "tidegate-ca"),
            "{}: tidegate-ca rendered but the gateways ask {host}",
            r.dir
        );
        assert_eq!(
            token.audience.as_deref(),
            Some(tidegate_ca::DEFAULT_AUDIENCE),
            "{}: istiod's TOKEN_AUDIENCES default",
            r.dir
        );
        assert_eq!(roots_cm.name, "istio-ca-root-cert", "{}", r.dir);
        return;
    };

    // tidegate-ca behind that Service.
    let spec = service.spec.clone().unwrap();
    let sp = spec
        .ports
        .iter()
        .flatten()
        .find(|p| p.port == i32::from(port))
        .unwrap_or_else(|| panic!("{}: Service {host} has no port {port}", r.dir));
    let selector = spec.selector.clone().expect("a selector");
    let deployment = r
        .all::<Deployment>("Deployment")
        .into_iter()
        .find(|d| {
            let labels = d
                .spec
                .as_ref()
                .unwrap()
                .template
                .metadata
                .as_ref()
                .unwrap()
                .labels
                .clone();
            selector
                .iter()
                .all(|(k, v)| labels.as_ref().and_then(|l| l.get(k)) == Some(v))
        })
        .unwrap_or_else(|| panic!("{}: Service {host} selects no Deployment", r.dir));
    let ca_pod = deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .clone()
        .unwrap();
    assert_eq!(ca_pod.containers.len(), 1);
    let c = &ca_pod.containers[0];
    assert_eq!(
        c.command.as_deref(),
        Some(&["/usr/local/bin/tidegate-ca".to_owned()][..]),
        "{}: runs `tidegate-ca`",
        r.dir
    );
    let settings = ca_settings(r, c, ns);
    let listen = i32::from(settings.listen.port());
    assert_eq!(sp.target_port, Some(IntOrString::Int(listen)), "{}", r.dir);
    assert!(
        c.ports.iter().flatten().any(|p| p.container_port == listen),
        "{}: the CA's container declares {listen}",
        r.dir
    );
    let probe = c
        .readiness_probe
        .as_ref()
        .and_then(|p| p.tcp_socket.as_ref());
    assert_eq!(
        probe.map(|t| t.port.clone()),
        Some(IntOrString::Int(listen)),
        "{}: ready once it listens (after the first list of pods)",
        r.dir
    );
    let agent = format!("{ns}/{}", gateway_sa.metadata.name.as_deref().unwrap());
    assert!(
        settings.trusted.contains(&agent),
        "{}: the CA trusts the gateways ({agent}): {:?}",
        r.dir,
        settings.trusted
    );
    assert_eq!(
        settings.trust_domain, trust_domain,
        "{}: one trust domain",
        r.dir
    );
    assert_eq!(settings.namespace, ns);
    assert!(
        settings.serving_names.contains(&host),
        "{}: the CA's certificate names {host}: {:?}",
        r.dir,
        settings.serving_names
    );
    assert_eq!(
        token.audience.as_deref(),
        Some(settings.audience.as_str()),
        "{}: the gateways' tokens are for the CA's audience",
        r.dir
    );
    assert_eq!(
        roots_cm.name, settings.root_configmap,
        "{}: the gateways mount the root the CA publishes",
        r.dir
    );
    assert_eq!(
        settings.secret, settings.root_configmap,
        "one name in the RBAC"
    );

    // Least privilege: exactly what the CA calls.
    let ca_sa = ca_pod
        .service_account_name
        .clone()
        .expect("its own ServiceAccount");
    assert_ne!(Some(&ca_sa), gateway_sa.metadata.name.as_ref());
    let mut have = BTreeSet::new();
    for role in cluster_roles_of(r, &ca_sa, ns) {
        rows(role.rules.as_deref().unwrap_or_default(), &mut have);
    }
    let roles: Vec<Role> = r.all("Role");
    for b in r.all::<RoleBinding>("RoleBinding") {
        if b.subjects.iter().flatten().any(|s| s.name == ca_sa) {
            assert_eq!(b.role_ref.kind, "Role");
            let role = roles
                .iter()
                .find(|x| x.metadata.name.as_ref() == Some(&b.role_ref.name))
                .unwrap();
            rows(role.rules.as_deref().unwrap_or_default(), &mut have);
        }
    }
    assert_eq!(
        have,
        ca_needs(&settings.secret),
        "{}: tidegate-ca's RBAC",
        r.dir
    );

    let sc = c.security_context.clone().expect("a securityContext");
    assert_eq!(
        sc.run_as_non_root,
        Some(true),
        "{}: the CA runs as non-root",
        r.dir
    );
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let caps = sc.capabilities.expect("capabilities");
    assert_eq!(caps.drop, Some(vec!["ALL".to_owned()]));
    assert!(
        caps.add.unwrap_or_default().is_empty(),
        "no capability added"
    );
    let res = c.resources.as_ref().expect("resources");
    assert!(res.requests.is_some() && res.limits.is_some());
}
