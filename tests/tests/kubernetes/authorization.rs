//! Istio's AuthorizationPolicy and PeerAuthentication straight from the
//! API server: converted, named by the pods they select, enforced on the
//! serving node's inbound side (live streams closed on a change), bad
//! resources refused and counted; a cluster without Istio's CRDs serves.

use serde_json::{json, Value};
use tidegate::app::App;
use tidegate_e2e::kube_api::{FakeApiServer, Kind};
use tidegate_e2e::{
    echo_server, eventually, init_tracing, ip, metric, metric_or_zero, round_trip, Capture,
};

use super::{config, namespace, pod, two_nodes, until_ready, TwoNodes, WAIT};

fn policy(name: &str, spec: Value) -> Value {
    json!({"metadata": {"name": name, "namespace": "demo"}, "spec": spec})
}

fn resources(app: &App, outcome: &str) -> f64 {
    metric_or_zero(
        &app.metrics_text(),
        &format!(r#"tidegate_kubernetes_authorization_resources{{outcome="{outcome}"}}"#),
    )
}

fn denied(app: &App, reason: &str) -> f64 {
    metric_or_zero(
        &app.metrics_text(),
        &format!(r#"tidegate_authorization_denied_total{{transport="hbone",reason="{reason}"}}"#),
    )
}

/// Whether a new connection from the client pod reaches the echo server.
async fn passes(capture: &Capture, octet: u8) -> bool {
    let Ok(mut conn) = capture.try_connect(ip(octet, 3)).await else {
        return false;
    };
    round_trip(&mut conn, b"ping")
        .await
        .is_ok_and(|b| b == b"ping")
}

/// The policies the echo workload names on the serving node.
fn echo_names(server: &App) -> Vec<String> {
    server
        .workloads
        .snapshot()
        .by_uid("echo-uid")
        .map(|w| w.spec.authorization_policies.clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_policies_are_converted_named_and_enforced_with_live_recheck() {
    let octet = 130;
    let api = FakeApiServer::start().await;
    api.apply(
        Kind::Namespace,
        namespace("demo", json!({"tidegate.io/mesh": "enabled"})),
    );
    api.apply(
        Kind::Pod,
        pod("client", "client-uid", "node-a", ip(octet, 3)),
    );
    api.apply(Kind::Pod, pod("echo", "echo-uid", "node-b", ip(octet, 2)));
    let echo = echo_server(ip(octet, 2)).await;
    let dir = tempfile::tempdir().unwrap();
    let TwoNodes {
        server,
        client,
        capture,
    } = two_nodes(
        |node, extra| config(dir.path(), node, &api.url(), extra),
        echo,
    )
    .await;
    assert!(passes(&capture, octet).await, "no policy: allowed");

    // A live stream, then a DENY selecting the echo pod for the client's
    // identity: the live stream is closed, new ones refused.
    let mut live = capture.connect(ip(octet, 3)).await;
    assert_eq!(round_trip(&mut live, b"live").await.unwrap(), b"live");
    let deny = |principal: &str| {
        policy(
            "deny-client",
            json!({"selector": {"matchLabels": {"app": "echo"}}, "action": "DENY",
                "rules": [{"from": [{"source": {"principals": [principal]}}]}]}),
        )
    };
    api.apply(
        Kind::AuthorizationPolicy,
        deny("cluster.local/ns/demo/sa/client"),
    );
    eventually("the echo pod names the DENY", WAIT, || {
        echo_names(&server) == ["demo/deny-client"]
    })
    .await;
    assert_eq!(resources(&server, "enforced"), 1.0);
    eventually("the live stream closed", WAIT, || {
        metric_or_zero(
            &server.metrics_text(),
            r#"tidegate_authorization_closed_total{transport="hbone",reason="explicitly_denied"}"#,
        ) == 1.0
    })
    .await;
    assert!(round_trip(&mut live, b"more").await.is_err(), "closed");
    let before = denied(&server, "explicitly_denied");
    assert!(!passes(&capture, octet).await, "refused by the DENY");
    assert_eq!(denied(&server, "explicitly_denied"), before + 1.0);

    // The DENY now names someone else: allowed again.
    api.apply(
        Kind::AuthorizationPolicy,
        deny("cluster.local/ns/demo/sa/other"),
    );
    eventually("the changed DENY held", WAIT, || {
        let snap = server.workloads.snapshot();
        let p = snap.policies.get("demo/deny-client").cloned();
        p.is_some_and(|p| format!("{p:?}").contains("sa/other"))
    })
    .await;
    assert!(passes(&capture, octet).await, "the DENY names someone else");

    // A malformed DENY (a port that is not a number) is refused, counted
    // and held closed: everything to the pods it selects is refused.
    api.apply(
        Kind::AuthorizationPolicy,
        policy(
            "bad-port",
            json!({"selector": {"matchLabels": {"app": "echo"}}, "action": "DENY",
                "rules": [{"to": [{"operation": {"ports": ["http"]}}]}]}),
        ),
    );
    eventually("the malformed policy refused", WAIT, || {
        resources(&server, "refused") == 1.0
    })
    .await;
    assert!(!passes(&capture, octet).await, "held closed: denies all");
    api.delete(Kind::AuthorizationPolicy, "demo", "bad-port");
    eventually("the malformed policy gone", WAIT, || {
        resources(&server, "refused") == 0.0 && echo_names(&server) == ["demo/deny-client"]
    })
    .await;
    assert!(passes(&capture, octet).await);

    // An ALLOW whose only rule needs HTTP: dropped rule, an ALLOW that
    // allows nothing, reported as enforced at L4 only.
    api.apply(
        Kind::AuthorizationPolicy,
        policy(
            "get-only",
            json!({"selector": {"matchLabels": {"app": "echo"}},
                "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]}),
        ),
    );
    eventually("the HTTP-only ALLOW held", WAIT, || {
        resources(&server, "http_attributes_ignored") == 1.0
    })
    .await;
    let before = denied(&server, "not_allowed");
    assert!(!passes(&capture, octet).await);
    assert_eq!(denied(&server, "not_allowed"), before + 1.0);

    // A waypoint-bound policy is not this node's.
    api.apply(
        Kind::AuthorizationPolicy,
        policy(
            "for-waypoint",
            json!({"targetRefs": [{"kind": "Service", "group": "", "name": "echo"}], "action": "DENY", "rules": [{}]}),
        ),
    );
    eventually("the waypoint policy skipped", WAIT, || {
        resources(&server, "skipped") == 1.0
    })
    .await;
    assert!(server
        .workloads
        .snapshot()
        .policies
        .get("demo/for-waypoint")
        .is_none());
    assert_eq!(
        metric(
            &server.metrics_text(),
            r#"tidegate_kubernetes_objects{resource="authorizationpolicies"}"#
        ),
        3.0
    );
    client.shutdown().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_istios_crds_the_gateway_serves_and_picks_them_up_once_installed() {
    let api = FakeApiServer::start().await;
    api.set_installed(Kind::AuthorizationPolicy, false);
    api.set_installed(Kind::PeerAuthentication, false);
    api.apply(Kind::Namespace, namespace("demo", json!({})));
    let dir = tempfile::tempdir().unwrap();
    init_tracing();
    let app = tidegate::app::build(config(dir.path(), "node-a", &api.url(), ""))
        .await
        .unwrap();
    until_ready(&app).await;
    assert!(app.workloads.snapshot().policies.is_empty());
    api.set_installed(Kind::AuthorizationPolicy, true);
    api.set_installed(Kind::PeerAuthentication, true);
    api.apply(
        Kind::PeerAuthentication,
        json!({"metadata": {"name": "default", "namespace": "istio-system"},
            "spec": {"mtls": {"mode": "STRICT"}}}),
    );
    eventually("the mesh-wide STRICT held", WAIT, || {
        app.workloads
            .snapshot()
            .policies
            .get("istio-system/istio_converted_static_strict")
            .is_some()
    })
    .await;
    app.shutdown().await;
}
