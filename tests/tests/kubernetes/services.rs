//! Services and EndpointSlices discovered from the API server: a VIP routed
//! to usable endpoints, a terminating peer endpoint evicting pooled
//! tunnels, informer skew and the OCI Service annotation.

use super::*;

/// A Service from the API: its ClusterIP routes to the endpoints its
/// EndpointSlices list, a named targetPort resolves from the pod's container
/// port, a not-ready endpoint is never chosen while a ready one is, a Service
/// whose every endpoint is terminating still answers, and a deleted
/// Service's VIP is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_and_endpointslices_route_a_vip_to_usable_endpoints() {
    use tidegate_e2e::{round_trip, Capture};
    let octet = 76;
    let api = FakeApiServer::start().await;
    let p = peers(&api, octet, json!({}), "echo-uid").await;
    let vip: std::net::IpAddr = format!("10.96.{octet}.1").parse().unwrap();
    // The echo pod names its port; a second pod ("ghost", where nothing
    // listens) is a not-ready endpoint: choosing it would fail the connection.
    let http = json!([{"name": "http", "containerPort": p.echo.port()}]);
    api.modify(Kind::Pod, "demo", "echo", |pod| {
        pod["spec"]["containers"][0]["ports"] = http.clone();
    });
    let mut ghost = pod("ghost", "ghost-uid", "node-b", ip(octet, 4));
    ghost["spec"]["containers"][0]["ports"] = http;
    api.apply(Kind::Pod, ghost);
    api.apply(
        Kind::Service,
        json!({"metadata": {"name": "echo", "namespace": "demo"},
            "spec": {"clusterIP": vip.to_string(), "clusterIPs": [vip.to_string()],
                "selector": {"app": "echo"},
                "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
                          {"name": "dns", "port": 53, "protocol": "UDP"}]}}),
    );
    let endpoint = |name: &str, octet_host: u8, conditions: Value| {
        json!({"addresses": [ip(octet, octet_host).to_string()], "conditions": conditions,
            "targetRef": {"kind": "Pod", "namespace": "demo", "name": name, "uid": format!("{name}-uid")}})
    };
    api.apply(
        Kind::EndpointSlice,
        slice(
            "echo-a1",
            "echo",
            json!([
                endpoint("echo", 2, json!({"ready": true})),
                endpoint(
                    "ghost",
                    4,
                    json!({"ready": false, "serving": false, "terminating": true})
                ),
            ]),
        ),
    );
    let client = &p.client;
    let endpoints = || {
        let snap = client.workloads.snapshot();
        let svc = snap.service_by_vip(vip, 80)?;
        Some(
            svc.endpoints[&80]
                .iter()
                .map(|e| {
                    (
                        e.workload.uid().to_owned(),
                        e.target_port,
                        e.conditions.ready,
                    )
                })
                .collect::<Vec<_>>(),
        )
    };
    eventually("the Service with both endpoints", WAIT, || {
        endpoints().is_some_and(|e| e.len() == 2)
    })
    .await;
    assert_eq!(
        endpoints().unwrap(),
        [
            ("echo-uid".to_owned(), p.echo.port(), true),
            ("ghost-uid".to_owned(), p.echo.port(), false),
        ],
        "named targetPort from the pod's container port; conditions from the slice"
    );
    assert!(
        client
            .workloads
            .snapshot()
            .service_by_vip(vip, 53)
            .is_none(),
        "UDP ports are not routed"
    );
    assert_eq!(
        metric(&client.metrics_text(), "tidegate_kubernetes_services"),
        1.0
    );

    let capture = Capture::start(client.outbound.clone(), std::net::SocketAddr::new(vip, 80)).await;
    for i in 0..20u8 {
        let mut conn = capture.connect(ip(octet, 3)).await;
        assert_eq!(
            round_trip(&mut conn, &[i; 64]).await.unwrap(),
            [i; 64],
            "connection {i}"
        );
    }
    let text = client.metrics_text();
    assert_eq!(
        metric_or_zero(
            &text,
            r#"tidegate_service_endpoint_choices_total{reason="ready"}"#
        ),
        20.0,
        "{text}"
    );

    // Every endpoint terminating: the serving one still answers.
    api.modify(Kind::EndpointSlice, "demo", "echo-a1", |s| {
        s["endpoints"][0]["conditions"] =
            json!({"ready": false, "serving": true, "terminating": true});
    });
    eventually("echo no longer ready", WAIT, || {
        endpoints().is_some_and(|e| e.iter().all(|(_, _, ready)| !ready))
    })
    .await;
    for i in 0..10u8 {
        let mut conn = capture.connect(ip(octet, 3)).await;
        assert_eq!(
            round_trip(&mut conn, &[i; 64]).await.unwrap(),
            [i; 64],
            "fallback {i}"
        );
    }
    assert_eq!(
        metric_or_zero(
            &client.metrics_text(),
            r#"tidegate_service_endpoint_choices_total{reason="terminating_fallback"}"#
        ),
        10.0
    );

    // The Service goes: so does its VIP.
    api.delete(Kind::Service, "demo", "echo");
    eventually("the VIP is gone", WAIT, || endpoints().is_none()).await;
    assert_eq!(
        metric(&client.metrics_text(), "tidegate_kubernetes_services"),
        0.0
    );
    // Watched in full now (routing needs spec.clusterIPs and ports).
    assert_eq!(api.metadata_only_requests(Kind::Service), 0);
    p.client.shutdown().await;
    p.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_endpointslice_terminating_evicts_pooled_tunnels() {
    use tidegate_e2e::round_trip;
    let octet = 66;
    let api = FakeApiServer::start().await;
    // The client pod overrides its peers' policy (the echo pod names none)
    // with one that evicts tunnels to terminating peers.
    let Peers {
        dir: _dir,
        server,
        client,
        capture,
        ..
    } = peers(
        &api,
        octet,
        json!({"tidegate.io/peer-drain-policy": "evict"}),
        "echo-uid",
    )
    .await;
    let mut conn = capture.connect(ip(octet, 3)).await;
    assert_eq!(round_trip(&mut conn, b"ping").await.unwrap(), b"ping");
    drop(conn);
    eventually("one idle pooled tunnel", WAIT, || {
        let t = client.pool.tunnels();
        t.len() == 1 && t[0].streams() == 0
    })
    .await;

    // The peer's EndpointSlice says terminating before its pod object does.
    api.apply(
        Kind::EndpointSlice,
        slice(
            "echo-x1",
            "echo",
            json!([{"addresses": [ip(octet, 2).to_string()],
                "conditions": {"ready": false, "serving": true, "terminating": true},
                "targetRef": {"kind": "Pod", "namespace": "demo", "name": "echo", "uid": "echo-uid"}}]),
        ),
    );
    eventually(
        "pooled tunnel to the terminating peer evicted",
        WAIT,
        || client.pool.tunnels().is_empty(),
    )
    .await;
    assert_eq!(
        client
            .workloads
            .snapshot()
            .by_uid("echo-uid")
            .unwrap()
            .spec
            .state,
        LifecycleState::Terminating
    );
    assert_eq!(
        metric(
            &client.metrics_text(),
            r#"tidegate_drain_actions_total{action="evict",result="executed"}"#
        ),
        1.0
    );
    let peers = client.drains.peer_drains();
    assert_eq!(peers.len(), 1, "{peers:?}");
    let d = &peers[0].decisions[0];
    assert_eq!(
        (d.event, d.policy.as_str(), d.selected_by, d.tunnels_evicted),
        ("peer-terminating", "evict", "client-override", 1),
        "{peers:?}"
    );
    client.shutdown().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn informer_skew_is_counted_then_resolved_and_oci_service_marks_pods() {
    let (api, dir) = demo_cluster(json!({})).await;
    api.apply(
        Kind::Service,
        json!({"metadata": {"name": "web", "namespace": "demo",
            "annotations": {"tidegate.io/oci-backend-draining": "true"}},
            "spec": {"selector": {"app": "web"}}}),
    );
    // The slice names a pod the pod watch has not delivered yet.
    api.apply(
        Kind::EndpointSlice,
        slice(
            "web-x1",
            "web",
            json!([{"addresses": [ip(64, 2).to_string()], "conditions": {"ready": true},
                "targetRef": {"kind": "Pod", "namespace": "demo", "name": "web", "uid": "uid-web"}}]),
        ),
    );
    let app = discovering(&api, dir.path(), "").await;
    eventually("skew counted", WAIT, || {
        metric(&app.metrics_text(), "tidegate_kubernetes_unknown_endpoints") == 1.0
    })
    .await;
    api.apply(Kind::Pod, pod("web", "uid-web", "node-a", ip(64, 2)));
    eventually("skew resolved", WAIT, || {
        metric(&app.metrics_text(), "tidegate_kubernetes_unknown_endpoints") == 0.0
    })
    .await;
    let snap = app.workloads.snapshot();
    assert!(snap.by_uid("uid-web").unwrap().spec.oci_backend_draining);
    // Namespaces are watched metadata-only; pods, Services and slices in full.
    assert_eq!(api.requests(Kind::Service, "list"), 1);
    let all = api.requests(Kind::Namespace, "list") + api.requests(Kind::Namespace, "watch");
    assert_eq!(api.metadata_only_requests(Kind::Namespace), all);
    for kind in [Kind::Pod, Kind::Service, Kind::EndpointSlice] {
        assert_eq!(api.metadata_only_requests(kind), 0, "{kind:?}");
    }
    assert_eq!(
        metric(
            &app.metrics_text(),
            r#"tidegate_kubernetes_objects{resource="services"}"#
        ),
        1.0
    );
    app.shutdown().await;
}
