//! Istio's L4 authorization on the inbound side: policies from the workload
//! file allow and refuse CONNECTs with ztunnel's reasons (401), and a
//! policy change closes the live streams it now refuses.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use http::StatusCode;
use tidegate_e2e::{
    eventually, ip, metric, metric_or_zero, workloads_yaml, write_atomically, Options, TwoNodes,
};
use tidegate_protocol::hbone::client::{connect_stream, dial};
use tidegate_protocol::hbone::Settings;
use tidegate_protocol::tls::{TlsContext, TlsMetrics};

use crate::rejections::{answer, connect, hbone_addr, id, real_ca, stream_ended};

const WAIT: Duration = Duration::from_secs(10);

/// Policies for the echo workload (ip .2) and the namespace `demo`.
fn with_policies(octet: u8, echo_names: &str, authorization: &str) -> String {
    let echo = format!("- {{uid: echo-uid, name: echo, namespace: demo, service_account: echo, ips: [{}], node: node-b}}", ip(octet, 2));
    let named = format!(
        "- {{uid: echo-uid, name: echo, namespace: demo, service_account: echo, ips: [{}], node: node-b, authorization_policies: [{echo_names}]}}",
        ip(octet, 2)
    );
    let base = workloads_yaml(octet, "echo");
    assert!(base.contains(&echo), "the echo line of workloads_yaml");
    format!(
        "{}authorization:\n{authorization}",
        base.replace(&echo, &named)
    )
}

const ONLY_CLIENT: &str = "- name: only-client\n  namespace: demo\n  scope: workload_selector\n  action: allow\n  rules:\n  - clauses:\n    - matches:\n      - principals: [{exact: cluster.local/ns/demo/sa/client}]\n";
const NO_9999: &str = "- name: no-9999\n  namespace: demo\n  scope: namespace\n  action: deny\n  rules:\n  - clauses:\n    - matches:\n      - destination_ports: [9999]\n";

/// A tunnel to the server's workload at `.host` presenting `client_sa`.
async fn tunnel(
    nodes: &TwoNodes,
    client_sa: &str,
    server_sa: &str,
    host: u8,
) -> SendRequest<Bytes> {
    let tls = TlsContext::new(real_ca(nodes), "cluster.local", TlsMetrics::default());
    let (send, conn) = dial(
        &tls,
        &Settings::default(),
        &id("cluster.local", client_sa),
        &id("cluster.local", server_sa),
        hbone_addr(nodes, host),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    send
}

async fn status_and_reason(send: SendRequest<Bytes>, authority: &str) -> (StatusCode, String) {
    answer(send, connect(authority)).await
}

fn authz_metric(nodes: &TwoNodes, name: &str, reason: &str) -> f64 {
    metric_or_zero(
        &nodes.server.metrics_text(),
        &format!(r#"tidegate_authorization_{name}_total{{transport="hbone",reason="{reason}"}}"#),
    )
}

async fn echoes(send: SendRequest<Bytes>, echo: SocketAddr) {
    let (mut tx, mut rx) = connect_stream(send, echo, WAIT).await.expect("200");
    tx.send_data(Bytes::from_static(b"hi"), false).unwrap();
    let got = rx.data().await.unwrap().unwrap();
    assert_eq!(&got[..], b"hi");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_allow_and_refuse_connects_with_ztunnels_reasons() {
    let o = 64;
    let opts = Options {
        workloads: Some(with_policies(
            o,
            "demo/only-client",
            &format!("{ONLY_CLIENT}{NO_9999}"),
        )),
        ..Options::default()
    };
    let nodes = TwoNodes::with(o, opts).await;

    // The identity the ALLOW names is served.
    echoes(tunnel(&nodes, "client", "echo", 2).await, nodes.echo).await;

    // Another identity: ALLOW policies exist, none matches.
    let (status, reason) = status_and_reason(
        tunnel(&nodes, "intruder", "echo", 2).await,
        &nodes.echo.to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        reason,
        "connection closed due to policy rejection: allow policies exist, but none allowed"
    );
    assert_eq!(authz_metric(&nodes, "denied", "not_allowed"), 1.0);
    assert_eq!(stream_ended(&nodes, "policy_denied"), 1.0);

    // The namespace's DENY, on a workload without ALLOW policies.
    let other = SocketAddr::new(ip(o, 4), 9999);
    let (status, reason) = status_and_reason(
        tunnel(&nodes, "client", "other", 4).await,
        &other.to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        reason,
        "connection closed due to policy rejection: explicitly denied by: demo/no-9999"
    );
    assert_eq!(authz_metric(&nodes, "denied", "explicitly_denied"), 1.0);
    eventually("the policies held counted", WAIT, || {
        metric(
            &nodes.server.metrics_text(),
            "tidegate_authorization_policies",
        ) == 2.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_change_closes_the_live_streams_it_refuses_and_only_those() {
    let o = 65;
    let nodes = TwoNodes::start(o).await;
    // Two live streams to echo: one from `client`, one from `friend`.
    let (mut doomed_tx, mut doomed_rx) =
        connect_stream(tunnel(&nodes, "client", "echo", 2).await, nodes.echo, WAIT)
            .await
            .unwrap();
    let (mut kept_tx, mut kept_rx) =
        connect_stream(tunnel(&nodes, "friend", "echo", 2).await, nodes.echo, WAIT)
            .await
            .unwrap();
    for (tx, rx) in [
        (&mut doomed_tx, &mut doomed_rx),
        (&mut kept_tx, &mut kept_rx),
    ] {
        tx.send_data(Bytes::from_static(b"one"), false).unwrap();
        assert_eq!(&rx.data().await.unwrap().unwrap()[..], b"one");
    }

    // A DENY for `client` arrives with the workload file.
    let deny = "- name: no-client\n  namespace: demo\n  scope: namespace\n  action: deny\n  rules:\n  - clauses:\n    - matches:\n      - principals: [{exact: cluster.local/ns/demo/sa/client}]\n";
    let text = format!("{}authorization:\n{deny}", workloads_yaml(o, "echo"));
    write_atomically(&nodes.dir.path().join("server-workloads.yaml"), &text);

    // The refused stream is reset; the other carries on.
    let ended = tokio::time::timeout(WAIT, doomed_rx.data())
        .await
        .expect("the refused stream ends");
    assert!(
        !matches!(ended, Some(Ok(_))),
        "no more data on it: {ended:?}"
    );
    eventually("the closure counted", WAIT, || {
        authz_metric(&nodes, "closed", "explicitly_denied") == 1.0
    })
    .await;
    kept_tx
        .send_data(Bytes::from_static(b"two"), false)
        .unwrap();
    assert_eq!(&kept_rx.data().await.unwrap().unwrap()[..], b"two");
    assert_eq!(
        stream_ended(&nodes, "policy_closed"),
        1.0,
        "the closed stream's end is counted"
    );

    // And a new CONNECT from `client` is refused.
    let (status, reason) = status_and_reason(
        tunnel(&nodes, "client", "echo", 2).await,
        &nodes.echo.to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        reason.ends_with("explicitly denied by: demo/no-client"),
        "{reason}"
    );
}
