//! Dial pacing on an inbound tunnel: a healthy burst of short connections
//! is never refused, whatever its rate; only wasted dials — streams the peer
//! resets before their dial completes, or that never carry a byte from it —
//! are budgeted (rapid reset), and refused once the budget is spent.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::SendRequest;
use tidegate::config::HboneConfig;
use tidegate_e2e::{eventually, ip, metric, metric_or_zero, wait_for, Options, TwoNodes};
use tidegate_protocol::hbone::client::{connect_stream, dial};
use tidegate_protocol::hbone::Settings;
use tidegate_protocol::tls::{TlsContext, TlsMetrics};

use super::rejections::{connect, hbone_addr, id, real_ca, still_serving};

/// A tunnel to the echo workload as `demo/client`.
async fn tunnel(nodes: &TwoNodes) -> SendRequest<Bytes> {
    let tls = TlsContext::new(real_ca(nodes), "cluster.local", TlsMetrics::default());
    let (client, echo) = (id("cluster.local", "client"), id("cluster.local", "echo"));
    let (send, conn) = dial(
        &tls,
        &Settings::default(),
        &client,
        &echo,
        hbone_addr(nodes, 2),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    send
}

/// One short connection: CONNECT, a few bytes each way, a clean end.
async fn short_connection(send: SendRequest<Bytes>, echo: SocketAddr) -> Result<(), String> {
    let (mut tx, mut rx) = connect_stream(send, echo, Duration::from_secs(10))
        .await
        .map_err(|e| e.to_string())?;
    tx.send_data(Bytes::from_static(b"ping"), true)
        .map_err(|e| e.to_string())?;
    let mut back = Vec::new();
    while let Some(chunk) = rx.data().await {
        let chunk = chunk.map_err(|e| e.to_string())?;
        let _ = rx.flow_control().release_capacity(chunk.len());
        back.extend_from_slice(&chunk);
    }
    if back != b"ping" {
        return Err(format!("echoed {back:?}"));
    }
    Ok(())
}

const HEALTHY: usize = 3_000;
const WORKERS: usize = 64;

/// 3,000 short connections over one tunnel, 64 at a time, as fast as the
/// client goes (ztunnel's 8 concurrent clients of one pod to one
/// destination, and more): every one is served. A default dial cap of
/// 1,000/s per tunnel refused most of such a burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_healthy_short_connections_over_one_tunnel_is_never_refused() {
    let nodes = TwoNodes::start(86).await;
    let send = tunnel(&nodes).await;
    let next = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (send, next, failures, echo) =
                (send.clone(), next.clone(), failures.clone(), nodes.echo);
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < HEALTHY {
                    if let Err(e) = short_connection(send.clone(), echo).await {
                        failures.lock().unwrap().push(e);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let elapsed = started.elapsed();
    let failures = std::mem::take(&mut *failures.lock().unwrap());
    assert!(
        failures.is_empty(),
        "{} of {HEALTHY} healthy connections refused in {elapsed:?}, e.g. {:?}",
        failures.len(),
        failures.first()
    );
    eprintln!(
        "{HEALTHY} short connections over one tunnel in {elapsed:?} ({:.0}/s)",
        HEALTHY as f64 / elapsed.as_secs_f64()
    );
    let ok = r#"tidegate_streams_ended_total{direction="inbound",reason="ok"}"#;
    eventually("every stream counted", Duration::from_secs(10), || {
        metric_or_zero(&nodes.server.metrics_text(), ok) == HEALTHY as f64
    })
    .await;
    let text = nodes.server.metrics_text();
    assert!(
        !text.contains("dial_rate_limit") && !text.contains("wasted_dials_limit"),
        "{text}"
    );
}

/// An upstream that counts the connections made to it and closes each.
async fn counting_upstream(nodes: &TwoNodes) -> (SocketAddr, Arc<AtomicUsize>) {
    let l = tokio::net::TcpListener::bind(SocketAddr::new(ip(nodes.octet, 2), 0))
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            counter.fetch_add(1, Ordering::Relaxed);
            drop(tcp);
        }
    });
    (addr, accepted)
}

const WASTED_PER_SECOND: usize = 20;
/// The budget holds this many seconds' worth (see `proxy/inbound/pace.rs`).
const WASTED_BURST_SECONDS: usize = 10;

/// Streams opened and reset in a loop (half of them reset as soon as they
/// are sent, while their dial is under way; half once their answer came,
/// without a byte sent): at most the tunnel's wasted-dial budget reaches the
/// workload, the rest is refused with `wasted_dials_limit`; the tunnel
/// serves a healthy stream again once the budget refills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_is_refused_once_the_tunnels_wasted_dial_budget_is_spent() {
    let nodes = TwoNodes::with(
        84,
        Options {
            server_yaml: format!("  max_wasted_dials_per_second_per_tunnel: {WASTED_PER_SECOND}\n"),
            ..Default::default()
        },
    )
    .await;
    let (upstream, accepted) = counting_upstream(&nodes).await;
    let mut send = tunnel(&nodes).await;
    let started = Instant::now();
    // Rounds of 10 streams opened together; the even ones are reset at
    // once, the odd ones once their answer came (h2 itself caps resets of
    // streams not yet accepted, so the server must have taken each one).
    let mut opened = 0;
    'attack: for _ in 0..100 {
        let mut round = Vec::new();
        for i in 0..10 {
            let Ok(ready) = send.clone().ready().await else {
                break 'attack;
            };
            send = ready;
            let Ok((resp, mut stream)) = send.send_request(connect(&upstream.to_string()), false)
            else {
                break 'attack;
            };
            opened += 1;
            if i % 2 == 0 {
                stream.send_reset(h2::Reason::CANCEL);
            } else {
                round.push((resp, stream));
            }
        }
        for (resp, mut stream) in round {
            let _ = tokio::time::timeout(Duration::from_secs(5), resp).await;
            stream.send_reset(h2::Reason::CANCEL);
        }
    }
    let elapsed = started.elapsed();
    eventually(
        "every stream of the attack ended",
        Duration::from_secs(10),
        || nodes.server.tunnels.streams_of("echo-uid") == 0,
    )
    .await;
    let dials = accepted.load(Ordering::Relaxed);
    // The burst (ten seconds' worth, plus a token for each stream the
    // tunnel may have open), the refill over the attack, a second of slack.
    let bound = WASTED_PER_SECOND * (WASTED_BURST_SECONDS + 1 + elapsed.as_secs() as usize)
        + HboneConfig::default().max_concurrent_streams as usize;
    assert!(
        opened > 2 * bound,
        "the attack must exceed the budget: {opened} streams, bound {bound}"
    );
    assert!(
        dials <= bound,
        "{dials} upstream connections from {opened} reset streams in {elapsed:?}; bound {bound}"
    );
    let text = nodes.server.metrics_text();
    let limited = metric(
        &text,
        r#"tidegate_streams_ended_total{direction="inbound",reason="wasted_dials_limit"}"#,
    );
    assert!(limited > 0.0, "refusals are counted");
    let wasted = |why: &str| {
        metric_or_zero(
            &text,
            &format!(r#"tidegate_inbound_wasted_dials_total{{reason="{why}"}}"#),
        )
    };
    let (during_dial, no_bytes) = (wasted("reset_during_dial"), wasted("no_bytes"));
    assert!(
        no_bytes > 0.0,
        "streams answered, then reset without a byte, are waste"
    );
    eprintln!(
        "{opened} streams reset in {elapsed:?}: {dials} reached the workload (bound {bound}), \
         {limited} refused; wasted: {during_dial} reset during their dial, {no_bytes} without a byte"
    );

    // The same tunnel serves again once its budget refills; so does everybody else.
    let (mut tx, mut rx) = wait_for(
        "a CONNECT on the attacking tunnel",
        Duration::from_secs(5),
        || {
            let send = send.clone();
            async move {
                connect_stream(send, nodes.echo, Duration::from_secs(2))
                    .await
                    .ok()
            }
        },
    )
    .await;
    tx.send_data(Bytes::from_static(b"hi"), true).unwrap();
    assert_eq!(&rx.data().await.unwrap().unwrap()[..], b"hi");
    still_serving(&nodes).await;
}
