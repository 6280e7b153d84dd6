//! Tests of the control-plane switch: Cilium's preset, ztunnel's variables, the errors.

use std::time::Duration;

use crate::config::{CaptureMode, CertificatesConfig, Config, ConfigError, WorkloadSourceKind};

use super::*;

fn load(
    yaml: &str,
    env: &[(&str, &str)],
    sets: &[&str],
    default: ControlPlaneKind,
) -> Result<Config, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, yaml).unwrap();
    Config::load_as(
        Some(&path),
        env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        &sets.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        default,
    )
}

/// What Cilium's DaemonSet sets (its chart's `templates/ztunnel/`).
const CILIUM_ENV: &[(&str, &str)] = &[
    ("XDS_ADDRESS", "unix:///var/run/cilium/xds.sock"),
    ("XDS_ROOT_CA", "/etc/ztunnel/bootstrap-root.crt"),
    ("CA_ADDRESS", "https://localhost:15012"),
    ("CA_ROOT_CA", "/etc/ztunnel/bootstrap-root.crt"),
    ("INPOD_UDS", "/var/run/cilium/ztunnel.sock"),
    ("ISTIO_META_DNS_CAPTURE", "false"),
    ("NODE_NAME", "192.168.1.7"),
    ("INSTANCE_IP", "192.168.1.7"),
];

#[test]
fn cilium_sets_what_the_agent_expects() {
    let c = load(
        "control_plane: cilium\n",
        &[],
        &[],
        ControlPlaneKind::Standalone,
    )
    .unwrap();
    assert_eq!(c.capture.mode, CaptureMode::Inpod);
    assert_eq!(
        c.capture.zds_socket.as_deref(),
        Some(std::path::Path::new(CILIUM_ZDS_SOCKET))
    );
    assert!(
        !c.capture.binds_node_listeners(),
        "nothing on 15001/15006/15008 in the host"
    );
    assert!(!c.dns.enabled, "Cilium's rules capture no DNS");
    assert_eq!(c.workloads.source, WorkloadSourceKind::Istio);
    assert_eq!(c.workloads.istio.address, CILIUM_XDS_ADDRESS);
    assert_eq!(c.workloads.istio.token, None, "no token for xDS");
    assert!(c.workloads.istio.workloads_only);
    let CertificatesConfig::IstioCa(ca) = &c.certificates else {
        panic!("certificates: {:?}", c.certificates);
    };
    assert_eq!(ca.address, CILIUM_CA_ADDRESS);
    assert_eq!(ca.token, None, "no token for the CA");
    assert!(
        ca.trust_answer_root,
        "the bootstrap certificate is not the root that signs workloads"
    );
    assert_eq!(ca.roots, std::path::Path::new(CILIUM_BOOTSTRAP_ROOT));
    assert_eq!(c.listeners.readiness.port(), 15021);
    assert_eq!(
        tidegate_netns::namespace::MESH_MARK,
        0x539,
        "the mark Cilium's rules match"
    );
    // The same from the environment and from a flag.
    for (env, sets) in [
        (&[("TIDEGATE_CONTROL_PLANE", "cilium")][..], &[][..]),
        (&[][..], &["control_plane=cilium"][..]),
    ] {
        let c = load("", env, sets, ControlPlaneKind::Standalone).unwrap();
        assert_eq!(
            c.capture.zds_socket.as_deref(),
            Some(std::path::Path::new(CILIUM_ZDS_SOCKET))
        );
        assert!(c.workloads.istio.workloads_only);
    }
}

#[test]
fn ztunnel_variables_apply_under_cilium_only_and_below_tidegate_ones() {
    let mut env = CILIUM_ENV.to_vec();
    env.push(("TIDEGATE_CONTROL_PLANE", "cilium"));
    let c = load("", &env, &[], ControlPlaneKind::Standalone).unwrap();
    assert_eq!(
        c.node_name, "192.168.1.7",
        "NODE_NAME is the host IP, as the workloads' node"
    );
    assert_eq!(c.workloads.istio.pod_ip, "192.168.1.7");
    let CertificatesConfig::IstioCa(ca) = &c.certificates else {
        panic!("certificates");
    };
    assert_eq!(ca.address, "https://localhost:15012");
    // Cilium 1.19: xDS on the agent's TLS server.
    env.push(("XDS_ADDRESS", "https://localhost:15012"));
    env.retain(|(k, v)| *k != "XDS_ADDRESS" || v.starts_with("https"));
    env.push(("ISTIO_META_DNS_CAPTURE", "true"));
    env.retain(|(k, v)| *k != "ISTIO_META_DNS_CAPTURE" || *v == "true");
    env.push(("TIDEGATE_NODE_NAME", "worker-1"));
    let c = load(
        "capture: {max_pods: 50}\n",
        &env,
        &[],
        ControlPlaneKind::Standalone,
    )
    .unwrap();
    assert_eq!(c.workloads.istio.address, "https://localhost:15012");
    assert!(c.dns.enabled);
    assert_eq!(
        c.node_name, "worker-1",
        "TIDEGATE_* outranks ztunnel's variables"
    );
    assert_eq!(c.capture.max_pods, 50, "the file merges over the preset");
    assert_eq!(c.capture.mode, CaptureMode::Inpod);
    // Standalone reads none of them.
    let c = load("", CILIUM_ENV, &[], ControlPlaneKind::Standalone).unwrap();
    assert_eq!(c.node_name, "node-a");
    assert_eq!(c.capture.zds_socket, None);
}

/// A file written for another control plane (the deploy base's:
/// `workloads.source: kubernetes`, certificates from `tidegate-ca`) merges
/// over the preset key by key; only another `certificates.source` replaces
/// that section whole.
#[test]
fn a_file_merges_over_the_preset_key_by_key() {
    let c = load(
        "workloads: {source: kubernetes}\ncertificates: {source: istio-ca, address: 'https://tidegate-ca.tidegate-system.svc:15012'}\n",
        &[("TIDEGATE_CONTROL_PLANE", "cilium"), ("TIDEGATE_WORKLOADS__SOURCE", "istio")],
        &[],
        ControlPlaneKind::Standalone,
    )
    .unwrap();
    assert_eq!(
        c.workloads.istio.address, CILIUM_XDS_ADDRESS,
        "the preset's istio section kept"
    );
    assert!(c.workloads.istio.workloads_only);
    let CertificatesConfig::IstioCa(ca) = &c.certificates else {
        panic!("certificates");
    };
    assert_eq!(ca.address, "https://tidegate-ca.tidegate-system.svc:15012");
    assert!(
        ca.trust_answer_root,
        "the rest of the preset's section kept"
    );
    let c = load(
        "certificates: {source: dev-ca}\n",
        &[("TIDEGATE_CONTROL_PLANE", "cilium")],
        &[],
        ControlPlaneKind::Standalone,
    )
    .unwrap();
    assert!(
        matches!(c.certificates, CertificatesConfig::DevCa { .. }),
        "another source replaces the section"
    );
}

#[test]
fn proxy_ztunnel_defaults_to_cilium_unless_a_layer_names_another() {
    let c = load("", CILIUM_ENV, &[], ControlPlaneKind::Cilium).unwrap();
    assert_eq!(c.workloads.source, WorkloadSourceKind::Istio);
    assert_eq!(c.node_name, "192.168.1.7");
    let c = load(
        "control_plane: standalone\n",
        CILIUM_ENV,
        &[],
        ControlPlaneKind::Cilium,
    )
    .unwrap();
    assert_eq!(c.workloads.source, WorkloadSourceKind::File);
}

#[test]
fn the_limits_section_stays_beside_the_switch() {
    let c = load(
        "control_plane: {max_connections: 7}\n",
        &[
            ("TIDEGATE_CONTROL_PLANE", "cilium"),
            ("TIDEGATE_CONTROL_PLANE__HEADER_READ_TIMEOUT", "3s"),
        ],
        &[],
        ControlPlaneKind::Standalone,
    )
    .unwrap();
    assert_eq!(c.control_plane.max_connections, 7);
    assert_eq!(c.control_plane.header_read_timeout, Duration::from_secs(3));
    assert!(c.workloads.istio.workloads_only);
}

#[test]
fn bad_values_name_the_key_and_where_they_came_from() {
    let e = load(
        "control_plane: ciliun\n",
        &[],
        &[],
        ControlPlaneKind::Standalone,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("`control_plane`") && e.contains("\"ciliun\"") && e.contains(ACCEPTED),
        "{e}"
    );
    let e = load(
        "",
        &[("TIDEGATE_CONTROL_PLANE", "istio-ish")],
        &[],
        ControlPlaneKind::Standalone,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("TIDEGATE_CONTROL_PLANE"), "{e}");
    let e = load(
        "control_plane: cilium\n",
        &[("XDS_ADDRESS", "unix://cilium/xds.sock")],
        &[],
        ControlPlaneKind::Standalone,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("`workloads.istio.address`")
            && e.contains("XDS_ADDRESS")
            && e.contains("localhost"),
        "{e}"
    );
    let e = load(
        "control_plane: cilium\n",
        &[("XDS_ADDRESS", "http://127.0.0.1:15010")],
        &[],
        ControlPlaneKind::Standalone,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("never plaintext") && e.contains("XDS_ADDRESS"),
        "{e}"
    );
    let e = load(
        "control_plane: cilium\n",
        &[("ISTIO_META_DNS_CAPTURE", "maybe")],
        &[],
        ControlPlaneKind::Standalone,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("`dns.enabled`") && e.contains("ISTIO_META_DNS_CAPTURE"),
        "{e}"
    );
}

#[test]
fn a_unix_xds_address_is_accepted_in_its_three_forms() {
    for form in [
        "unix:///var/run/cilium/xds.sock",
        "unix:/var/run/cilium/xds.sock",
        "unix://localhost/var/run/cilium/xds.sock",
    ] {
        let c = load(
            "",
            &[],
            &[
                &format!("workloads.istio.address={form}"),
                "control_plane=cilium",
            ],
            ControlPlaneKind::Standalone,
        )
        .unwrap();
        assert_eq!(c.workloads.istio.address, form);
    }
}
