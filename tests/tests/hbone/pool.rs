//! Pool behaviour: reuse, stream limit and reuse after it frees, single-flight
//! dialing, GOAWAY received, idle eviction.

use std::time::Duration;

use tidegate_e2e::{eventually, metric, metric_or_zero, round_trip, Options, TwoNodes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const OPENED: &str = "tidegate_pool_tunnels_opened_total";

async fn ping(tcp: &mut TcpStream, tag: u8) {
    let msg = vec![tag; 100];
    assert_eq!(round_trip(tcp, &msg).await.unwrap(), msg);
}

async fn close(mut tcp: TcpStream) {
    tcp.shutdown().await.unwrap();
    let mut rest = Vec::new();
    tcp.read_to_end(&mut rest).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_connections_reuse_one_tunnel() {
    let nodes = TwoNodes::start(21).await;
    for i in 0..5 {
        let mut tcp = nodes.app_conn().await;
        ping(&mut tcp, i).await;
        close(tcp).await;
    }
    let m = nodes.client.metrics_text();
    assert_eq!(metric(&m, OPENED), 1.0);
    let dump = nodes.client.pool.dump();
    assert_eq!(dump.len(), 1);
    assert_eq!(dump[0].streams_total, 5);
    assert_eq!(dump[0].dst, "spiffe://cluster.local/ns/demo/sa/echo");
    assert_eq!(dump[0].src, "spiffe://cluster.local/ns/demo/sa/client");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_limit_opens_a_second_tunnel_and_freed_slots_are_reused() {
    let nodes = TwoNodes::with(
        22,
        Options {
            client_yaml: "pool:\n  max_streams_per_tunnel: 2\n".into(),
            ..Default::default()
        },
    )
    .await;
    let mut a = nodes.app_conn().await;
    ping(&mut a, 1).await;
    let mut b = nodes.app_conn().await;
    ping(&mut b, 2).await;
    assert_eq!(metric(&nodes.client.metrics_text(), OPENED), 1.0);
    // The first tunnel is full: a third stream needs a second tunnel.
    let mut c = nodes.app_conn().await;
    ping(&mut c, 3).await;
    assert_eq!(metric(&nodes.client.metrics_text(), OPENED), 2.0);
    // Free a slot on the first tunnel; the next stream takes it, no new dial.
    close(a).await;
    let first = nodes
        .client
        .pool
        .dump()
        .into_iter()
        .min_by_key(|t| t.id)
        .unwrap();
    eventually("slot freed", Duration::from_secs(5), || {
        nodes
            .client
            .pool
            .dump()
            .iter()
            .any(|t| t.id == first.id && t.streams == 1)
    })
    .await;
    let mut d = nodes.app_conn().await;
    ping(&mut d, 4).await;
    assert_eq!(metric(&nodes.client.metrics_text(), OPENED), 2.0);
    let dump = nodes.client.pool.dump();
    assert!(dump.iter().all(|t| t.streams <= 2), "{dump:?}");
    for tcp in [b, c, d] {
        close(tcp).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_streams_dial_once() {
    let nodes = std::sync::Arc::new(TwoNodes::start(23).await);
    let tasks: Vec<_> = (0..50u8)
        .map(|i| {
            let nodes = nodes.clone();
            tokio::spawn(async move {
                let mut tcp = nodes.app_conn().await;
                ping(&mut tcp, i).await;
                tcp
            })
        })
        .collect();
    let mut conns = Vec::new();
    for t in tasks {
        conns.push(t.await.unwrap());
    }
    let m = nodes.client.metrics_text();
    assert_eq!(
        metric(&m, OPENED),
        1.0,
        "50 concurrent first streams must share one dial"
    );
    assert_eq!(
        metric(
            &nodes.server.metrics_text(),
            r#"tidegate_tls_handshakes_total{direction="inbound"}"#
        ),
        1.0
    );
    for c in conns {
        close(c).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_received_moves_new_streams_while_old_ones_finish() {
    let nodes = TwoNodes::start(24).await;
    let mut old = nodes.app_conn().await;
    ping(&mut old, 1).await;
    // Which tunnel carries the stream, known before the GOAWAY can retire it.
    let first = nodes.client.pool.dump()[0].id;
    // The server side asks the echo workload's tunnels to go away.
    assert_eq!(nodes.server.tunnels.goaway_workload("echo-uid"), 1);
    eventually("client sees GOAWAY", Duration::from_secs(5), || {
        nodes
            .client
            .pool
            .dump()
            .iter()
            .any(|t| t.id == first && t.goaway_received)
            || nodes.client.pool.tunnels().iter().all(|t| t.id != first)
    })
    .await;
    // New streams ride a new tunnel...
    let mut new = nodes.app_conn().await;
    ping(&mut new, 2).await;
    assert_eq!(metric(&nodes.client.metrics_text(), OPENED), 2.0);
    // ...while the old stream keeps working on the old one.
    ping(&mut old, 3).await;
    close(old).await;
    eventually(
        "old tunnel closed after its last stream",
        Duration::from_secs(5),
        || nodes.client.pool.dump().iter().all(|t| t.id != first),
    )
    .await;
    eventually("goaway counted", Duration::from_secs(5), || {
        metric(
            &nodes.client.metrics_text(),
            "tidegate_pool_goaways_received_total",
        ) == 1.0
    })
    .await;
    ping(&mut new, 4).await;
    close(new).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tunnels_are_evicted() {
    let nodes = TwoNodes::with(
        25,
        Options {
            client_yaml: "pool:\n  idle_timeout: 200ms\n".into(),
            ..Default::default()
        },
    )
    .await;
    let mut tcp = nodes.app_conn().await;
    ping(&mut tcp, 1).await;
    assert_eq!(nodes.client.pool.dump().len(), 1);
    close(tcp).await;
    eventually("idle tunnel evicted", Duration::from_secs(5), || {
        nodes.client.pool.dump().is_empty()
    })
    .await;
    // The server side sees the tunnel close too (client GOAWAY + close_notify).
    eventually("server tunnel gone", Duration::from_secs(5), || {
        nodes.server.tunnels.is_empty()
    })
    .await;
    // The client's driver counts the close once its connection ended, which
    // may come just after the server saw it.
    eventually(
        "the close counted as evicted",
        Duration::from_secs(5),
        || {
            metric_or_zero(
                &nodes.client.metrics_text(),
                r#"tidegate_pool_tunnels_closed_total{reason="evicted"}"#,
            ) == 1.0
        },
    )
    .await;
    let m = nodes.client.metrics_text();
    assert_eq!(metric(&m, "tidegate_pool_tunnels"), 0.0);
    // And a new connection dials again.
    let mut tcp = nodes.app_conn().await;
    ping(&mut tcp, 2).await;
    assert_eq!(metric(&nodes.client.metrics_text(), OPENED), 2.0);
}
