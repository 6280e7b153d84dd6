//! Istio's TCP metrics, scraped after traffic: both reporters, ztunnel's
//! label set and order, canonical names from the workloads' labels, the
//! source named by its CONNECT's baggage, bytes counted both ways, and an
//! authorization refusal flagged `DENY`.

use std::time::Duration;

use tidegate_e2e::{eventually, ip, metric_or_zero, round_trip, Options, TwoNodes};

const WAIT: Duration = Duration::from_secs(10);

/// The echo workload carries Istio's canonical labels and a workload name;
/// the client none (its canonical service falls back to its name).
fn workloads(octet: u8, authorization: &str) -> String {
    format!(
        "workloads:\n\
         - {{uid: echo-uid, name: echo-5f7b9-x2x, workload_name: echo, namespace: demo, service_account: echo, ips: [{echo}], node: node-b, \
            labels: {{service.istio.io/canonical-name: echo-svc, version: v2}}}}\n\
         - {{uid: client-uid, name: client, namespace: demo, service_account: client, ips: [{client}], node: node-a}}\n\
         {authorization}",
        echo = ip(octet, 2),
        client = ip(octet, 3),
    )
}

/// One series' labels, in ztunnel's order. The destination side names the
/// source from the `baggage` its CONNECT carries (the tunnel comes from the
/// client's node, not from the client's address): the same labels.
fn series(name: &str, reporter: &str, flags: &str) -> String {
    let (workload, canonical, revision, namespace, cluster) =
        ("client", "client", "latest", "demo", "Kubernetes");
    format!(
        "istio_{name}{{reporter=\"{reporter}\",\
         source_workload=\"{workload}\",source_canonical_service=\"{canonical}\",source_canonical_revision=\"{revision}\",\
         source_workload_namespace=\"{namespace}\",source_principal=\"spiffe://cluster.local/ns/demo/sa/client\",\
         source_app=\"{canonical}\",source_version=\"{revision}\",source_cluster=\"{cluster}\",\
         destination_service=\"unknown\",destination_service_namespace=\"unknown\",destination_service_name=\"unknown\",\
         destination_workload=\"echo\",destination_canonical_service=\"echo-svc\",destination_canonical_revision=\"v2\",\
         destination_workload_namespace=\"demo\",destination_principal=\"spiffe://cluster.local/ns/demo/sa/echo\",\
         destination_app=\"echo-svc\",destination_version=\"v2\",destination_cluster=\"Kubernetes\",\
         request_protocol=\"tcp\",response_flags=\"{flags}\",connection_security_policy=\"mutual_tls\",\
         source_region=\"unknown\",source_zone=\"unknown\",destination_region=\"unknown\",destination_zone=\"unknown\"}}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istio_tcp_metrics_carry_ztunnels_labels_bytes_and_deny() {
    let octet = 131;
    let deny = "authorization:\n- {name: no-client, namespace: demo, scope: namespace, action: deny, rules: [{clauses: [{matches: [{destination_ports: [9]}]}]}]}\n";
    let nodes = TwoNodes::with(
        octet,
        Options {
            workloads: Some(workloads(octet, deny)),
            ..Options::default()
        },
    )
    .await;
    let mut conn = nodes.capture.connect(nodes.client_ip).await;
    assert_eq!(round_trip(&mut conn, &[7; 100]).await.unwrap(), [7; 100]);
    drop(conn);

    // Both sides: one opened and one closed with no flag; 100 bytes each way.
    for (app, reporter) in [(&nodes.client, "source"), (&nodes.server, "destination")] {
        eventually("the close counted", WAIT, || {
            metric_or_zero(
                &app.metrics_text(),
                &series("tcp_connections_closed_total", reporter, "-"),
            ) == 1.0
        })
        .await;
        let text = app.metrics_text();
        let m = |name: &str| metric_or_zero(&text, &series(name, reporter, "-"));
        assert_eq!(
            m("tcp_connections_opened_total"),
            1.0,
            "{reporter}:\n{text}"
        );
        assert_eq!(
            m("tcp_received_bytes_total"),
            100.0,
            "{reporter}: client → echo"
        );
        assert_eq!(
            m("tcp_sent_bytes_total"),
            100.0,
            "{reporter}: echo → client"
        );
        assert_eq!(m("tcp_connections_failed_total"), 0.0);
    }

    // A CONNECT the server's DENY refuses: flagged DENY and failed there.
    let refused = std::net::SocketAddr::new(ip(octet, 2), 9);
    let capture = tidegate_e2e::Capture::start(nodes.client.outbound.clone(), refused).await;
    if let Ok(mut c) = capture.try_connect(nodes.client_ip).await {
        assert!(round_trip(&mut c, b"x").await.is_err(), "refused");
    }
    eventually("the refusal counted", WAIT, || {
        metric_or_zero(
            &nodes.server.metrics_text(),
            &series("tcp_connections_failed_total", "destination", "DENY"),
        ) == 1.0
    })
    .await;
    let text = nodes.server.metrics_text();
    assert_eq!(
        metric_or_zero(
            &text,
            &series("tcp_connections_closed_total", "destination", "DENY")
        ),
        1.0
    );
    assert_eq!(
        metric_or_zero(
            &text,
            &series("tcp_connections_opened_total", "destination", "-")
        ),
        2.0,
        "opened before the check, as ztunnel counts it"
    );
    nodes.client.shutdown().await;
    nodes.server.shutdown().await;
}
