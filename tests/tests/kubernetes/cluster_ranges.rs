//! The cluster's ranges learned from Nodes and ServiceCIDRs, both families:
//! an address inside them that discovery does not know (IPv4, IPv6, or
//! IPv4 written IPv4-mapped) waits for discovery, then is refused, never
//! sent in plaintext; one learned in time is routed.

use serde_json::json;
use tidegate_e2e::kube_api::{FakeApiServer, Kind};
use tidegate_e2e::{echo_server, eventually, ip, metric_or_zero, round_trip, Capture};

use super::{config, namespace, pod, until_ready, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_addresses_inside_learned_ranges_wait_then_are_refused() {
    let octet = 133;
    let api = FakeApiServer::start().await;
    api.apply(
        Kind::Namespace,
        namespace("demo", json!({"tidegate.io/mesh": "enabled"})),
    );
    api.apply(Kind::Namespace, namespace("plain", json!({})));
    api.apply(
        Kind::Pod,
        pod("client", "client-uid", "node-a", ip(octet, 3)),
    );
    api.apply(
        Kind::Node,
        json!({"metadata": {"name": "node-b"}, "spec": {"podCIDR": "127.133.0.0/16", "podCIDRs": ["127.133.0.0/16", "fd00:10:244:1::/64"]}}),
    );
    // A dual-stack cluster: the Service range of each family.
    api.apply(
        Kind::ServiceCidr,
        json!({"metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["10.96.0.0/16", "fd00:10:96::/112", "not-a-range"]}}),
    );
    let dir = tempfile::tempdir().unwrap();
    let extra = "outbound:\n  unknown_in_cluster_wait: 2s\n";
    let app = tidegate::app::build(config(dir.path(), "node-a", &api.url(), extra))
        .await
        .unwrap();
    until_ready(&app).await;
    let ranges = || {
        let snap = app.workloads.snapshot();
        snap.cluster_ranges
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    };
    eventually("the ranges learned", WAIT, || {
        ranges()
            == [
                "10.96.0.0/16",
                "127.133.0.0/16",
                "fd00:10:244:1::/64",
                "fd00:10:96::/112",
            ]
    })
    .await;
    let waits = |result: &str| {
        metric_or_zero(
            &app.metrics_text(),
            &format!(r#"tidegate_outbound_unknown_in_cluster_waits_total{{result="{result}"}}"#),
        )
    };

    // Nobody at .9: after the wait, refused (never plaintext).
    let nobody = std::net::SocketAddr::new(ip(octet, 9), 8080);
    let capture = Capture::start(app.outbound.clone(), nobody).await;
    if let Ok(mut c) = capture.try_connect(ip(octet, 3)).await {
        assert!(round_trip(&mut c, b"x").await.is_err(), "refused");
    }
    eventually("the refusal counted", WAIT, || waits("refused") == 1.0).await;
    assert_eq!(
        metric_or_zero(
            &app.metrics_text(),
            r#"tidegate_connections_failed_total{direction="outbound",reason="unknown_in_cluster"}"#
        ),
        1.0
    );
    // Likewise nobody at an IPv6 address of the learned pod range, nor at
    // an IPv4 one written IPv4-mapped: refused, never plaintext.
    for (n, nobody) in [
        "[fd00:10:244:1::9]:8080".parse().unwrap(),
        "[::ffff:127.133.0.9]:8080".parse().unwrap(),
    ]
    .into_iter()
    .enumerate()
    {
        let capture = Capture::start(app.outbound.clone(), nobody).await;
        if let Ok(mut c) = capture.try_connect(ip(octet, 3)).await {
            assert!(round_trip(&mut c, b"x").await.is_err(), "{nobody} refused");
        }
        let refused = 2.0 + n as f64;
        eventually("the refusal counted", WAIT, || waits("refused") == refused).await;
        assert_eq!(
            metric_or_zero(
                &app.metrics_text(),
                r#"tidegate_connections_failed_total{direction="outbound",reason="unknown_in_cluster"}"#
            ),
            refused,
            "{nobody}"
        );
    }

    // A pod (outside the mesh) that appears while its first connection
    // waits: routed to it once discovery knows it.
    let backend = echo_server(ip(octet, 4)).await;
    let capture = Capture::start(app.outbound.clone(), backend).await;
    let connecting = tokio::spawn(async move {
        let mut c = capture.try_connect(ip(octet, 3)).await?;
        round_trip(&mut c, b"late").await
    });
    eventually("the connection waiting for discovery", WAIT, || {
        tidegate_e2e::metric(
            &app.metrics_text(),
            "tidegate_outbound_unknown_in_cluster_waiting",
        ) == 1.0
    })
    .await;
    let mut late = pod("late", "late-uid", "node-b", ip(octet, 4));
    late["metadata"]["namespace"] = json!("plain");
    api.apply(Kind::Pod, late);
    assert_eq!(connecting.await.unwrap().unwrap(), b"late");
    assert_eq!(waits("learned"), 1.0);
    app.shutdown().await;
}
