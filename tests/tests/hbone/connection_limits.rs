//! The inbound connection caps (`proxy/inbound/limits.rs`): one identity
//! cannot take every descriptor, and nobody can take them all; each refusal
//! is specific and counted, and everybody else is served.

use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use http::StatusCode;
use tidegate_e2e::{eventually, metric_or_zero, Options, TwoNodes};
use tidegate_protocol::hbone::client::{connect_stream, dial, DialError, StreamError};
use tidegate_protocol::hbone::Settings;
use tidegate_protocol::tls::{TlsContext, TlsMetrics};

use super::rejections::{hbone_addr, id, real_ca};

/// A tunnel to the echo workload as `demo/<sa>`, its connection task spawned.
async fn tunnel_as(
    nodes: &TwoNodes,
    sa: &str,
) -> Result<
    (
        SendRequest<Bytes>,
        tokio::task::JoinHandle<Result<(), h2::Error>>,
    ),
    DialError,
> {
    let tls = TlsContext::new(real_ca(nodes), "cluster.local", TlsMetrics::default());
    let (client, echo) = (id("cluster.local", sa), id("cluster.local", "echo"));
    let (send, conn) = dial(
        &tls,
        &Settings::default(),
        &client,
        &echo,
        hbone_addr(nodes, 2),
    )
    .await?;
    Ok((send, tokio::spawn(conn)))
}

/// A CONNECT to the echo backend that must be served: one round trip.
async fn served(send: SendRequest<Bytes>, nodes: &TwoNodes) {
    let (mut tx, mut rx) = connect_stream(send, nodes.echo, Duration::from_secs(5))
        .await
        .unwrap();
    tx.send_data(Bytes::from_static(b"hi"), true).unwrap();
    assert_eq!(&rx.data().await.unwrap().unwrap()[..], b"hi");
}

/// A CONNECT the server answers 503 with `reason` in `tidegate-reason`.
async fn refused_503(send: SendRequest<Bytes>, nodes: &TwoNodes, reason: &str) {
    match connect_stream(send, nodes.echo, Duration::from_secs(5)).await {
        Err(StreamError::Status { status, reason: r }) => {
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
            let r = r.unwrap_or_default();
            assert!(r.contains(reason), "{r}");
        }
        Err(e) => panic!("expected a 503 naming {reason:?}, got {e}"),
        Ok(_) => panic!("expected a 503 naming {reason:?}, the stream was served"),
    }
}

fn server_metric(nodes: &TwoNodes, series: &str) -> f64 {
    metric_or_zero(&nodes.server.metrics_text(), series)
}

/// Three tunnels of `demo/client` fill its cap: a fourth is answered with
/// GOAWAY(ENHANCE_YOUR_CALM) right after its handshake, and so is a dial on
/// one of the three (the cap counts upstream connections too); another
/// identity connects and is served meanwhile; once one of the three closes,
/// `demo/client` is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_identity_is_refused_past_its_cap_while_another_is_served() {
    let nodes = TwoNodes::with(
        87,
        Options {
            server_yaml: "  max_connections: 40\n  max_connections_per_identity: 3\n".into(),
            ..Default::default()
        },
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(tunnel_as(&nodes, "client").await.unwrap());
    }
    // The client's handshake ends before the server has counted the
    // tunnel under its identity: all three counted, the fourth is the one
    // over the cap.
    let accepted = r#"tidegate_connections_opened_total{direction="inbound"}"#;
    eventually("the three tunnels counted", Duration::from_secs(10), || {
        server_metric(&nodes, accepted) == 3.0
    })
    .await;
    let (_send, conn) = tunnel_as(&nodes, "client")
        .await
        .expect("TLS completes: the identity is known only after it");
    let ended = tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .expect("the refused tunnel is closed")
        .unwrap();
    let e = ended.expect_err("refused with an error GOAWAY");
    assert!(e.is_go_away(), "{e}");
    assert_eq!(e.reason(), Some(h2::Reason::ENHANCE_YOUR_CALM), "{e}");
    let refusals = r#"tidegate_inbound_limit_refusals_total{limit="per_identity",kind="tunnel"}"#;
    assert_eq!(server_metric(&nodes, refusals), 1.0);
    let failed = r#"tidegate_connections_failed_total{direction="inbound",reason="identity_connections_limit"}"#;
    assert_eq!(server_metric(&nodes, failed), 1.0);

    // Each of the three tunnels holds a place: a dial would take a fourth.
    refused_503(
        held[0].0.clone(),
        &nodes,
        "hbone.max_connections_per_identity",
    )
    .await;
    let dials = r#"tidegate_inbound_limit_refusals_total{limit="per_identity",kind="dial"}"#;
    assert_eq!(server_metric(&nodes, dials), 1.0);

    // Another identity is not affected.
    // (Held to the end: a client tunnel closes once its last handle goes.)
    let (other, _conn) = tunnel_as(&nodes, "other").await.unwrap();
    served(other.clone(), &nodes).await;

    // One of the three goes: its place comes back.
    let (send, conn) = held.pop().unwrap();
    drop(send);
    conn.abort();
    let open = r#"tidegate_inbound_connections_open{kind="tunnel"}"#;
    eventually(
        "the closed tunnel's place given back",
        Duration::from_secs(10),
        || server_metric(&nodes, open) == 3.0,
    )
    .await;
    served(held[0].0.clone(), &nodes).await;
    drop(other);
}

/// With `max_connections: 4` tunnels may take two places: a third tunnel is
/// closed at accept, before TLS; the two serve streams up to the cap of
/// four connections, and a stream beyond it is refused with 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_caps_refuse_tunnels_at_accept_and_dials_with_503() {
    let nodes = TwoNodes::with(
        88,
        Options {
            server_yaml: "  max_connections: 4\n  max_connections_per_identity: 4\n".into(),
            ..Default::default()
        },
    )
    .await;
    let caps = nodes.server.metrics_text();
    assert!(
        caps.contains(r#"tidegate_inbound_connection_caps{limit="tunnels"} 2"#),
        "{caps}"
    );
    let (a, _a) = tunnel_as(&nodes, "client").await.unwrap();
    let (b, _b) = tunnel_as(&nodes, "other").await.unwrap();
    let third = tunnel_as(&nodes, "third").await;
    assert!(third.is_err(), "closed at accept: no handshake completes");
    let refusals = r#"tidegate_inbound_limit_refusals_total{limit="tunnels",kind="tunnel"}"#;
    assert_eq!(server_metric(&nodes, refusals), 1.0);
    let failed = r#"tidegate_connections_failed_total{direction="inbound",reason="tunnels_limit"}"#;
    assert_eq!(server_metric(&nodes, failed), 1.0);

    // Two tunnels and two open streams make four connections.
    let (_tx1, _rx1) = connect_stream(a.clone(), nodes.echo, Duration::from_secs(5))
        .await
        .unwrap();
    let (_tx2, _rx2) = connect_stream(b.clone(), nodes.echo, Duration::from_secs(5))
        .await
        .unwrap();
    refused_503(a.clone(), &nodes, "hbone.max_connections").await;
    let dials = r#"tidegate_inbound_limit_refusals_total{limit="connections",kind="dial"}"#;
    assert_eq!(server_metric(&nodes, dials), 1.0);
    let text = nodes.server.metrics_text();
    assert!(
        text.contains(r#"tidegate_inbound_connections_open{kind="upstream"} 2"#),
        "{text}"
    );
    drop((_tx1, _rx1));
    // The ended stream's upstream connection gives its place back.
    let open = r#"tidegate_inbound_connections_open{kind="upstream"}"#;
    eventually(
        "an upstream place given back",
        Duration::from_secs(10),
        || server_metric(&nodes, open) == 1.0,
    )
    .await;
    served(a, &nodes).await;
}
