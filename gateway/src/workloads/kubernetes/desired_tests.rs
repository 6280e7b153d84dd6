use super::*;

fn cfg() -> KubernetesConfig {
    KubernetesConfig::default()
}

fn pod(v: serde_json::Value) -> Arc<Pod> {
    Arc::new(serde_json::from_value(v).unwrap())
}

fn running(name: &str, uid: &str, ip: &str, created: &str) -> Arc<Pod> {
    pod(serde_json::json!({
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "creationTimestamp": created},
        "spec": {"nodeName": "n1", "serviceAccountName": "sa", "containers": []},
        "status": {"phase": "Running", "podIP": ip},
    }))
}

fn ns(name: &str, labels: serde_json::Value) -> Arc<PartialObjectMeta<Namespace>> {
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": name, "labels": labels},
        }))
        .unwrap(),
    )
}

#[test]
fn pods_become_workloads_with_mesh_and_namespace_policy() {
    let mut p = (*running("a", "u1", "10.0.0.1", "2026-01-01T00:00:00Z")).clone();
    p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2026-01-01T00:01:00Z".parse().unwrap(),
    ));
    let opted_out = pod(serde_json::json!({
        "metadata": {"name": "b", "namespace": "ns", "uid": "u2", "labels": {"tidegate.io/mesh": "disabled"}},
        "spec": {"containers": []},
        "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.2"}]},
    }));
    let done = pod(serde_json::json!({
        "metadata": {"name": "c", "namespace": "ns", "uid": "u3"},
        "status": {"phase": "Succeeded", "podIP": "10.0.0.3"},
    }));
    let pending =
        pod(serde_json::json!({"metadata": {"name": "d", "namespace": "ns", "uid": "u4"}}));
    let host = pod(serde_json::json!({
        "metadata": {"name": "e", "namespace": "ns", "uid": "u5"},
        "spec": {"hostNetwork": true, "containers": []},
        "status": {"phase": "Running", "podIP": "192.168.0.10"},
    }));
    let stores = Stores {
        pods: vec![Arc::new(p), opted_out, done, pending, host],
        namespaces: vec![ns(
            "ns",
            serde_json::json!({"tidegate.io/mesh": "enabled", "tidegate.io/drain-policy": "p"}),
        )],
        ..Default::default()
    };
    let d = build(&stores, &cfg());
    assert_eq!(
        d.specs.len(),
        2,
        "succeeded, IP-less and host-network pods are not workloads"
    );
    let a = &d.specs[0];
    assert_eq!((a.uid.as_str(), a.protocol), ("u1", Protocol::Hbone));
    assert_eq!(a.state, LifecycleState::Terminating);
    assert_eq!(a.deletion_deadline_unix_ms, Some(1_767_225_660_000));
    assert_eq!(a.namespace_policy.as_deref(), Some("p"));
    assert_eq!(a.service_account, "sa");
    let b = &d.specs[1];
    assert_eq!(
        (b.protocol, b.service_account.as_str()),
        (Protocol::Tcp, "default")
    );
    assert_eq!(b.ips, ["10.0.0.2".parse::<IpAddr>().unwrap()]);
}

#[test]
fn a_reused_ip_belongs_to_the_newer_running_pod() {
    let old = running("old", "u-old", "10.0.0.9", "2026-01-01T00:00:00Z");
    let new = running("new", "u-new", "10.0.0.9", "2026-01-02T00:00:00Z");
    for pods in [vec![old.clone(), new.clone()], vec![new, old]] {
        let d = build(
            &Stores {
                pods,
                ..Default::default()
            },
            &cfg(),
        );
        let by_uid = |u: &str| d.specs.iter().find(|s| s.uid == u).unwrap();
        assert!(by_uid("u-old").ips.is_empty());
        assert_eq!(by_uid("u-new").ips.len(), 1);
    }
}

#[test]
fn slices_mark_terminating_peers_and_report_unknown_pods() {
    let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "s1", "namespace": "ns", "labels": {SERVICE_NAME_LABEL: "svc"}},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": ["10.0.0.1"], "conditions": {"terminating": true},
             "targetRef": {"kind": "Pod", "name": "a", "namespace": "ns", "uid": "u1"}},
            {"addresses": ["10.0.0.5"], "targetRef": {"kind": "Pod", "name": "gone", "uid": "u9"}},
        ],
    }))
    .unwrap();
    let d = build(
        &Stores {
            pods: vec![running("a", "u1", "10.0.0.1", "2026-01-01T00:00:00Z")],
            slices: vec![Arc::new(slice)],
            ..Default::default()
        },
        &cfg(),
    );
    assert_eq!(d.specs[0].state, LifecycleState::Terminating);
    assert!(!d.specs[0].oci_backend_draining);
    assert_eq!(d.unknown_endpoints.len(), 1);
    assert!(
        d.unknown_endpoints[0].contains("u9"),
        "{:?}",
        d.unknown_endpoints
    );
}
