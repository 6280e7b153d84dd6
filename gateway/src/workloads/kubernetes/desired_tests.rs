use super::*;
use crate::workloads::WholeSet;

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
    let d = build(&stores, &cfg(), &Default::default());
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

fn terminating(name: &str, uid: &str, ip: &str, created: &str) -> Arc<Pod> {
    let mut p = (*running(name, uid, ip, created)).clone();
    p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2026-01-03T00:00:00Z".parse().unwrap(),
    ));
    Arc::new(p)
}

fn build_pods(pods: Vec<Arc<Pod>>) -> Desired {
    build(
        &Stores {
            pods,
            ..Default::default()
        },
        &cfg(),
        &Default::default(),
    )
}

fn ips_of<'a>(d: &'a Desired, uid: &str) -> &'a [IpAddr] {
    &d.specs.iter().find(|s| s.uid == uid).unwrap().ips
}

/// Two running pods on one IP: neither has it — not the newer, not the
/// uid that sorts last, whatever order the watch gave them — and the
/// address is a conflict naming both. Each keeps its other addresses.
#[test]
fn two_running_pods_on_one_ip_are_a_conflict_neither_has_it() {
    let ip: IpAddr = "10.0.0.9".parse().unwrap();
    let old = running("old", "u-old", "10.0.0.9", "2026-01-01T00:00:00Z");
    let mut new = (*running("new", "u-new", "10.0.0.9", "2026-01-02T00:00:00Z")).clone();
    new.status.as_mut().unwrap().pod_ips = Some(vec![
        k8s_openapi::api::core::v1::PodIP {
            ip: "10.0.0.9".into(),
        },
        k8s_openapi::api::core::v1::PodIP {
            ip: "fd00::9".into(),
        },
    ]);
    let new = Arc::new(new);
    for pods in [
        vec![old.clone(), new.clone()],
        vec![new.clone(), old.clone()],
    ] {
        let d = build_pods(pods);
        assert!(ips_of(&d, "u-old").is_empty());
        assert_eq!(ips_of(&d, "u-new"), ["fd00::9".parse::<IpAddr>().unwrap()]);
        assert_eq!(
            d.conflicts,
            [IpConflict {
                ip,
                pods: vec!["ns/new (u-new)".into(), "ns/old (u-old)".into()],
            }]
        );
        assert_eq!(d.conflicts[0].resource(), "address 10.0.0.9");
    }
}

/// A running pod over a terminating one, whichever is newer: the address
/// is reused the way Kubernetes reuses it, no conflict.
#[test]
fn a_reused_ip_belongs_to_the_running_pod_over_a_terminating_one() {
    let cases = [
        (
            terminating("old", "u-old", "10.0.0.9", "2026-01-01T00:00:00Z"),
            running("new", "u-new", "10.0.0.9", "2026-01-02T00:00:00Z"),
        ),
        (
            running("old", "u-old", "10.0.0.9", "2026-01-01T00:00:00Z"),
            terminating("new", "u-new", "10.0.0.9", "2026-01-02T00:00:00Z"),
        ),
    ];
    for (i, (a, b)) in cases.into_iter().enumerate() {
        let winner = if i == 0 { "u-new" } else { "u-old" };
        let loser = if i == 0 { "u-old" } else { "u-new" };
        let d = build_pods(vec![a, b]);
        assert_eq!(ips_of(&d, winner).len(), 1, "case {i}");
        assert!(ips_of(&d, loser).is_empty(), "case {i}");
        assert!(d.conflicts.is_empty(), "case {i}: {:?}", d.conflicts);
    }
}

/// Published, a conflict is held closed the way the istio source holds
/// one (the same name, the same refusal): no workload on the address, the
/// address the mesh's (never plaintext); once one pod is terminating, the
/// other has it and nothing is held.
#[test]
fn a_published_conflict_is_held_closed_until_one_pod_leaves() {
    let ip: IpAddr = "10.0.0.9".parse().unwrap();
    let store = crate::workloads::WorkloadStore::new("cluster.local", "n1");
    let publish = |d: Desired| {
        let closed = d
            .conflicts
            .iter()
            .map(|c| (c.resource(), vec![c.ip]))
            .collect();
        store.publish(
            WholeSet::new(d.specs)
                .services(d.services)
                .members(Default::default())
                .policies(Default::default())
                .held_closed(closed),
        );
    };
    publish(build_pods(vec![
        running("old", "u-old", "10.0.0.9", "2026-01-01T00:00:00Z"),
        running("new", "u-new", "10.0.0.9", "2026-01-02T00:00:00Z"),
    ]));
    let snap = store.snapshot();
    assert!(snap.by_ip(ip).is_none());
    let known = snap.formerly_known(ip);
    assert!(
        matches!(&known, Some(crate::workloads::FormerlyKnown::Refused { resource }) if &**resource == "address 10.0.0.9"),
        "{known:?}"
    );
    assert_eq!(snap.formerly_known_len().1, 1, "what /config_dump counts");
    publish(build_pods(vec![
        terminating("old", "u-old", "10.0.0.9", "2026-01-01T00:00:00Z"),
        running("new", "u-new", "10.0.0.9", "2026-01-02T00:00:00Z"),
    ]));
    let snap = store.snapshot();
    assert_eq!(snap.by_ip(ip).map(|w| w.uid()), Some("u-new"));
    assert_eq!(snap.formerly_known(ip), None);
    assert_eq!(snap.formerly_known_len().1, 0);
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
        &Default::default(),
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

fn slice_of(service: &str, name: &str, endpoints: serde_json::Value) -> Arc<EndpointSlice> {
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "labels": {SERVICE_NAME_LABEL: service}},
            "addressType": "IPv4",
            "endpoints": endpoints,
        }))
        .unwrap(),
    )
}

fn endpoint(uid: &str, conditions: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"addresses": ["10.0.0.1"], "conditions": conditions,
        "targetRef": {"kind": "Pod", "name": uid, "namespace": "ns", "uid": uid}})
}

#[test]
fn services_get_vips_tcp_ports_and_their_slices_endpoints() {
    let svc =
        |v: serde_json::Value| -> Arc<Service> { Arc::new(serde_json::from_value(v).unwrap()) };
    let web = svc(serde_json::json!({
        "metadata": {"name": "web", "namespace": "ns"},
        "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00::10"],
            "ports": [
                {"name": "http", "port": 80, "targetPort": "http"},
                {"name": "admin", "port": 9000, "targetPort": 9001},
                {"name": "same", "port": 7000},
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
            ]}
    }));
    let headless = svc(serde_json::json!({
        "metadata": {"name": "db", "namespace": "ns"},
        "spec": {"clusterIP": "None", "clusterIPs": ["None"], "ports": [{"port": 5432}]}
    }));
    let empty = svc(serde_json::json!({
        "metadata": {"name": "empty", "namespace": "ns"},
        "spec": {"clusterIP": "10.96.0.11", "ports": [{"port": 80}]}
    }));
    let mut a = (*running("a", "u1", "10.0.0.1", "2026-01-01T00:00:00Z")).clone();
    a.spec.as_mut().unwrap().containers = serde_json::from_value(serde_json::json!([
        {"name": "app", "ports": [{"name": "http", "containerPort": 8080},
                                  {"name": "metrics", "containerPort": 9090, "protocol": "UDP"},
                                  {"containerPort": 7000}]}
    ]))
    .unwrap();
    let stores = Stores {
        pods: vec![
            Arc::new(a),
            running("b", "u2", "10.0.0.2", "2026-01-01T00:00:00Z"),
            running("c", "u3", "10.0.0.3", "2026-01-01T00:00:00Z"),
        ],
        services: vec![web, headless, empty],
        slices: vec![
            // u2 terminating in one slice and ready in the next (a transition):
            // the more usable reading wins.
            slice_of(
                "web",
                "web-1",
                serde_json::json!([
                    endpoint("u1", serde_json::json!({})),
                    endpoint(
                        "u2",
                        serde_json::json!({"ready": false, "serving": true, "terminating": true})
                    ),
                    endpoint(
                        "u3",
                        serde_json::json!({"ready": false, "serving": false, "terminating": true})
                    ),
                ]),
            ),
            slice_of(
                "web",
                "web-2",
                serde_json::json!([endpoint("u2", serde_json::json!({"ready": true}))]),
            ),
        ],
        ..Default::default()
    };
    let d = build(&stores, &cfg(), &Default::default());
    let keys: Vec<String> = d.services.iter().map(ServiceSpec::key).collect();
    assert_eq!(
        keys,
        ["ns/empty", "ns/web"],
        "the headless Service is not routed"
    );
    let web = &d.services[1];
    assert_eq!(
        web.vips,
        [
            "10.96.0.10".parse::<IpAddr>().unwrap(),
            "fd00::10".parse().unwrap()
        ]
    );
    let ports: Vec<(u16, Option<TargetPort>)> = web
        .ports
        .iter()
        .map(|p| (p.port, p.target_port.clone()))
        .collect();
    assert_eq!(
        ports,
        [
            (80, Some(TargetPort::Name("http".into()))),
            (9000, Some(TargetPort::Number(9001))),
            (7000, None),
        ],
        "the UDP port is dropped"
    );
    let eps = web.endpoints.as_ref().unwrap();
    let c = |ready, serving, terminating| Conditions {
        ready,
        serving,
        terminating,
    };
    assert_eq!(
        eps["u1"],
        c(true, true, false),
        "unset conditions: ready, serving"
    );
    assert_eq!(eps["u2"], c(true, true, false));
    assert_eq!(eps["u3"], c(false, false, true));
    assert_eq!(d.services[0].endpoints.as_ref().map(|e| e.len()), Some(0));
    // Named TCP container ports only.
    let a = d.specs.iter().find(|s| s.uid == "u1").unwrap();
    assert_eq!(a.ports, [("http".to_owned(), 8080)].into());
}

fn in_ns(name: &str, uid: &str, ns: &str, labels: serde_json::Value) -> Arc<Pod> {
    pod(serde_json::json!({
        "metadata": {"name": name, "namespace": ns, "uid": uid, "labels": labels},
        "spec": {"nodeName": "n1", "containers": []},
        "status": {"phase": "Running", "podIP": format!("10.0.1.{}", uid.len())},
    }))
}

#[test]
fn the_mesh_rule_decides_the_protocol_and_the_local_members_alike() {
    let pods = vec![
        // Namespace "shop" opts in with tidegate's label, "amb" with Istio's.
        in_ns("a", "u1", "shop", serde_json::json!({})),
        in_ns("b", "u22", "amb", serde_json::json!({})),
        in_ns(
            "c",
            "u333",
            "amb",
            serde_json::json!({"istio.io/dataplane-mode": "none"}),
        ),
        // kube-system never, even labelled.
        in_ns(
            "d",
            "u4444",
            "kube-system",
            serde_json::json!({"tidegate.io/mesh": "enabled"}),
        ),
        // An unlabelled namespace: only a pod label opts in.
        in_ns("e", "u55555", "plain", serde_json::json!({})),
        in_ns(
            "f",
            "u666666",
            "plain",
            serde_json::json!({"istio.io/dataplane-mode": "ambient"}),
        ),
    ];
    let namespaces = vec![
        ns("shop", serde_json::json!({"tidegate.io/mesh": "enabled"})),
        ns(
            "amb",
            serde_json::json!({"istio.io/dataplane-mode": "ambient"}),
        ),
        ns(
            "kube-system",
            serde_json::json!({"tidegate.io/mesh": "enabled"}),
        ),
        ns("plain", serde_json::json!({})),
    ];
    let want = [
        ("u1", true),
        ("u22", true),
        ("u333", false),
        ("u4444", false),
        ("u55555", false),
        ("u666666", true),
    ];
    let d = build(
        &Stores {
            pods: pods.clone(),
            namespaces: namespaces.clone(),
            ..Default::default()
        },
        &cfg(),
        &Default::default(),
    );
    let members = members(&pods, &namespaces, &cfg());
    for (uid, member) in want {
        let spec = d.specs.iter().find(|s| s.uid == uid).unwrap();
        let protocol = if member {
            Protocol::Hbone
        } else {
            Protocol::Tcp
        };
        assert_eq!(spec.protocol, protocol, "{uid}: protocol");
        assert_eq!(members[uid].member, member, "{uid}: membership");
    }
}

#[test]
fn members_include_pods_without_an_ip_and_leave_out_unknown_namespaces() {
    // A pod's CNI ADD comes before its IP: it is no workload yet, but its
    // membership is known.
    let pending = pod(serde_json::json!({
        "metadata": {"name": "p", "namespace": "shop", "uid": "u-pending"},
        "spec": {"nodeName": "n1", "containers": []},
        "status": {"phase": "Pending"},
    }));
    // Its namespace not (yet) in the namespace store: unknown, not "not a
    // member" (the namespace's labels may opt it in).
    let orphan = in_ns("o", "u-orphan", "new-ns", serde_json::json!({}));
    let namespaces = vec![ns(
        "shop",
        serde_json::json!({"tidegate.io/mesh": "enabled"}),
    )];
    let pods = vec![pending, orphan];
    let d = build(
        &Stores {
            pods: pods.clone(),
            namespaces: namespaces.clone(),
            ..Default::default()
        },
        &cfg(),
        &Default::default(),
    );
    assert!(d.specs.iter().all(|s| s.uid != "u-pending"));
    let members = members(&pods, &namespaces, &cfg());
    assert!(members["u-pending"].member);
    assert!(!members.contains_key("u-orphan"), "{members:?}");
    // A namespace without labels is known: its pods are decided.
    let namespaces = vec![Arc::new(
        serde_json::from_value(serde_json::json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": "new-ns"},
        }))
        .unwrap(),
    )];
    let members = super::members(&pods, &namespaces, &cfg());
    assert!(!members["u-orphan"].member);
}

#[test]
fn pods_name_the_authorization_policies_that_select_them() {
    use kube::core::DynamicObject;
    let object = |v: serde_json::Value| -> Arc<DynamicObject> {
        Arc::new(serde_json::from_value(v).unwrap())
    };
    let aps = [
        object(serde_json::json!({
            "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
            "metadata": {"name": "web-only", "namespace": "ns"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}},
        })),
        object(serde_json::json!({
            "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
            "metadata": {"name": "broken", "namespace": "ns"},
            "spec": {"action": "ALLOW-ISH"},
        })),
    ];
    let conversion = super::super::authorization::convert(
        "istio-system",
        &aps,
        &[],
        &tidegate_authz::PolicyStore::default(),
    );
    assert!(
        matches!(&conversion.outcomes["ns/broken"],
            tidegate_authz::kubernetes::Outcome::Refused(m) if m.starts_with("authorization ns/broken: spec: unknown variant `ALLOW-ISH`")),
        "{:?}",
        conversion.outcomes
    );
    let mut web = (*running("web", "u1", "10.0.0.1", "2026-01-01T00:00:00Z")).clone();
    web.metadata.labels = Some([("app".to_owned(), "web".to_owned())].into());
    let other = running("db", "u2", "10.0.0.2", "2026-01-01T00:00:00Z");
    let stores = Stores {
        pods: vec![Arc::new(web), other],
        namespaces: vec![ns("ns", serde_json::json!({"tidegate.io/mesh": "enabled"}))],
        ..Default::default()
    };
    let d = build(&stores, &cfg(), &conversion);
    let named: Vec<_> = d
        .specs
        .iter()
        .map(|s| (s.name.as_str(), s.authorization_policies.clone()))
        .collect();
    assert_eq!(
        named,
        [("web", vec!["ns/web-only".to_owned()]), ("db", vec![])]
    );
}

#[test]
fn the_workload_name_is_the_deployment_or_job_else_the_pod() {
    let with_owner = |kind: &str, owner: &str, hash: Option<&str>| {
        let mut p = (*running("p-1", "u1", "10.0.0.1", "2026-01-01T00:00:00Z")).clone();
        p.metadata.owner_references = Some(vec![serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": kind, "name": owner, "uid": "o", "controller": true,
        }))
        .unwrap()]);
        if let Some(h) = hash {
            p.metadata.labels = Some([("pod-template-hash".to_owned(), h.to_owned())].into());
        }
        workload_name(&p)
    };
    assert_eq!(
        with_owner("ReplicaSet", "checkout-7d9f6c", Some("7d9f6c")).as_deref(),
        Some("checkout")
    );
    assert_eq!(with_owner("ReplicaSet", "bare-rs", None), None);
    assert_eq!(
        with_owner("Job", "nightly-28211", None).as_deref(),
        Some("nightly-28211")
    );
    assert_eq!(with_owner("StatefulSet", "db", None), None);
}

/// A dual-stack cluster: every address of a pod (`status.podIPs`, the
/// primary first; an IPv6-only pod too), a Service's endpoints from its
/// EndpointSlices of both address types, its `clusterIPs` of both
/// families, and the IPv6 pod and Service ranges.
#[test]
fn dual_stack_pods_services_slices_and_ranges_keep_both_families() {
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let mut dual = (*running("dual", "u1", "10.0.0.1", "2026-01-01T00:00:00Z")).clone();
    dual.status.as_mut().unwrap().pod_ips = Some(
        serde_json::from_value(serde_json::json!([{"ip": "10.0.0.1"}, {"ip": "fd00:10::1"}]))
            .unwrap(),
    );
    let v6_only = running("six", "u2", "fd00:10::2", "2026-01-01T00:00:00Z");
    let svc =
        |v: serde_json::Value| -> Arc<Service> { Arc::new(serde_json::from_value(v).unwrap()) };
    let web = svc(serde_json::json!({
        "metadata": {"name": "web", "namespace": "ns"},
        "spec": {"clusterIP": "fd00:96::10", "clusterIPs": ["fd00:96::10", "10.96.0.10"],
                 "ipFamilies": ["IPv6", "IPv4"], "ports": [{"port": 80}]}
    }));
    let six = svc(serde_json::json!({
        "metadata": {"name": "six", "namespace": "ns"},
        "spec": {"clusterIP": "fd00:96::11", "clusterIPs": ["fd00:96::11"],
                 "ipFamilies": ["IPv6"], "ports": [{"port": 80}]}
    }));
    let slice = |name: &str, service: &str, family: &str, eps: serde_json::Value| {
        Arc::new(
            serde_json::from_value::<EndpointSlice>(serde_json::json!({
                "metadata": {"name": name, "namespace": "ns",
                             "labels": {SERVICE_NAME_LABEL: service}},
                "addressType": family,
                "endpoints": eps,
            }))
            .unwrap(),
        )
    };
    let ep = |addr: &str, uid: &str, ready: bool| {
        serde_json::json!({"addresses": [addr], "conditions": {"ready": ready},
            "targetRef": {"kind": "Pod", "name": uid, "namespace": "ns", "uid": uid}})
    };
    let stores = Stores {
        pods: vec![Arc::new(dual), v6_only],
        services: vec![web, six],
        slices: vec![
            slice(
                "web-v4",
                "web",
                "IPv4",
                serde_json::json!([ep("10.0.0.1", "u1", true)]),
            ),
            slice(
                "web-v6",
                "web",
                "IPv6",
                serde_json::json!([ep("fd00:10::1", "u1", true), ep("fd00:10::2", "u2", true)]),
            ),
            slice(
                "six-v6",
                "six",
                "IPv6",
                serde_json::json!([ep("fd00:10::2", "u2", false)]),
            ),
        ],
        ..Default::default()
    };
    let d = build(&stores, &cfg(), &Default::default());
    assert_eq!(ips_of(&d, "u1"), [ip("10.0.0.1"), ip("fd00:10::1")]);
    assert_eq!(ips_of(&d, "u2"), [ip("fd00:10::2")]);
    let keys: Vec<String> = d.services.iter().map(ServiceSpec::key).collect();
    assert_eq!(keys, ["ns/six", "ns/web"]);
    let (six, web) = (&d.services[0], &d.services[1]);
    assert_eq!(web.vips, [ip("fd00:96::10"), ip("10.96.0.10")]);
    assert_eq!(six.vips, [ip("fd00:96::11")]);
    // Each pod once, whichever family's slice named it.
    let uids = |s: &ServiceSpec| -> Vec<String> {
        s.endpoints
            .as_ref()
            .unwrap()
            .keys()
            .map(|k| k.to_string())
            .collect()
    };
    assert_eq!(uids(web), ["u1", "u2"]);
    assert_eq!(uids(six), ["u2"]);
    assert!(!six.endpoints.as_ref().unwrap()["u2"].ready);

    let node = |cidrs: serde_json::Value| -> Arc<Node> {
        Arc::new(
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}, "spec": cidrs}))
                .unwrap(),
        )
    };
    let service_cidr = |cidrs: serde_json::Value| -> Arc<ServiceCIDR> {
        Arc::new(
            serde_json::from_value(
                serde_json::json!({"metadata": {"name": "k"}, "spec": {"cidrs": cidrs}}),
            )
            .unwrap(),
        )
    };
    let ranges = cluster_ranges(
        &[
            node(serde_json::json!({"podCIDR": "10.244.1.0/24",
                                    "podCIDRs": ["10.244.1.0/24", "fd00:10:244:1::/64"]})),
            // An IPv6-only node.
            node(serde_json::json!({"podCIDR": "fd00:10:244:2::/64"})),
        ],
        &[service_cidr(serde_json::json!([
            "10.96.0.0/16",
            "fd00:96::/112"
        ]))],
    );
    let ranges: Vec<String> = ranges.iter().map(ToString::to_string).collect();
    assert_eq!(
        ranges,
        [
            "10.244.1.0/24",
            "10.96.0.0/16",
            "fd00:10:244:1::/64",
            "fd00:10:244:2::/64",
            "fd00:96::/112"
        ]
    );
}
