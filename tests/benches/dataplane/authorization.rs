//! `-- --authorization`: how long a policy change takes to close the
//! streams it refuses among 10,000 live ones (issue 40's figure).
//!
//! In-process (the harness's two gateways, direct HBONE tunnels to the
//! serving gateway with certificates from the shared development CA, the
//! echo backend in a child process):
//! 5,000 streams from `demo/client` and 5,000 from `demo/friend`, 100 per
//! tunnel, each carrying a round trip. Then a DENY for `demo/client` is
//! published to the serving gateway's workload store, and each `client`
//! stream's end is timed at the peer, from the publish. Baseline, same
//! run: the time it took to open those 5,000 streams. Afterwards every
//! `friend` stream must still carry a round trip.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use bytes::Bytes;
use h2::{RecvStream, SendStream};
use tidegate_e2e::{ip, workloads_yaml, Options, TwoNodes, TRUST_DOMAIN};
use tidegate_protocol::hbone::client::{connect_stream, dial};
use tidegate_protocol::hbone::Settings;
use tidegate_protocol::identity::SpiffeId;
use tidegate_protocol::tls::{DevCa, TlsContext, TlsMetrics};

const OCTET: u8 = 212;
const PER_IDENTITY: usize = 5_000;
const STREAMS_PER_TUNNEL: usize = 100;
const PHASE_MAX_TIME: Duration = Duration::from_secs(120);

type Stream = (SendStream<Bytes>, RecvStream);

/// `PER_IDENTITY` streams from `sa`, each with one round trip done.
async fn open(
    nodes: &TwoNodes,
    tls: &TlsContext,
    sa: &str,
    backend: std::net::SocketAddr,
) -> anyhow::Result<Vec<Stream>> {
    let cfg = Settings::default();
    let src = SpiffeId::new(TRUST_DOMAIN, "demo", sa);
    let dst = SpiffeId::new(TRUST_DOMAIN, "demo", "echo");
    let hbone = std::net::SocketAddr::new(
        ip(OCTET, 2),
        nodes.server.addrs.inbound.expect("node listeners").port(),
    );
    let mut streams = Vec::with_capacity(PER_IDENTITY);
    for _ in 0..PER_IDENTITY / STREAMS_PER_TUNNEL {
        let (send, conn) = dial(tls, &cfg, &src, &dst, hbone)
            .await
            .map_err(|e| anyhow!("dial: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut opening = tokio::task::JoinSet::new();
        for _ in 0..STREAMS_PER_TUNNEL {
            let send = send.clone();
            opening.spawn(async move {
                let (mut tx, mut rx) = connect_stream(send, backend, Duration::from_secs(10))
                    .await
                    .map_err(|e| anyhow!("CONNECT: {e}"))?;
                tx.send_data(Bytes::from_static(b"x"), false)?;
                let got = rx.data().await.ok_or_else(|| anyhow!("no echo"))??;
                let _ = rx.flow_control().release_capacity(got.len());
                anyhow::Ok((tx, rx))
            });
        }
        while let Some(s) = opening.join_next().await {
            streams.push(s??);
        }
    }
    Ok(streams)
}

fn deny_client(nodes: &TwoNodes) -> anyhow::Result<()> {
    let text = format!(
        "{}authorization:\n- name: no-client\n  namespace: demo\n  scope: namespace\n  action: deny\n  rules:\n  - clauses:\n    - matches:\n      - principals: [{{exact: cluster.local/ns/demo/sa/client}}]\n",
        workloads_yaml(OCTET, "echo")
    );
    let parsed = tidegate::workloads::parse_file(&text)?;
    nodes.server.workloads.publish(parsed);
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn run() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(measure())
}

async fn measure() -> anyhow::Result<()> {
    // The serving gateway holds 10,000 upstream sockets; the backend, in
    // its own process, the other 10,000 (RLIMIT_NOFILE may be 20,000).
    let options = Options {
        // Indented: continues the harness's `hbone:` section.
        server_yaml: "  max_connections: 16000\n  max_connections_per_identity: 8000\n".into(),
        ..Options::default()
    };
    let nodes = TwoNodes::with(OCTET, options).await;
    let backend = std::net::SocketAddr::new(ip(OCTET, 2), 18080);
    let _child = super::spawn_echo_child(backend)?;
    let ca = Arc::new(DevCa::open(&nodes.ca_dir(), Duration::from_secs(600))?);
    let tls = TlsContext::new(ca, TRUST_DOMAIN, TlsMetrics::default());
    let t = Instant::now();
    let doomed =
        tokio::time::timeout(PHASE_MAX_TIME, open(&nodes, &tls, "client", backend)).await??;
    let open_doomed = t.elapsed();
    let kept =
        tokio::time::timeout(PHASE_MAX_TIME, open(&nodes, &tls, "friend", backend)).await??;
    println!(
        "[in-process] live streams: {} from demo/client, {} from demo/friend, {STREAMS_PER_TUNNEL} per tunnel",
        doomed.len(),
        kept.len()
    );

    let mut ends = tokio::task::JoinSet::new();
    for (tx, mut rx) in doomed {
        ends.spawn(async move {
            let _tx = tx;
            // Data never comes again: the stream ends, reset or closed.
            while let Some(Ok(_)) = rx.data().await {}
            Instant::now()
        });
    }
    let published = Instant::now();
    deny_client(&nodes)?;
    let mut closed = Vec::with_capacity(PER_IDENTITY);
    let collect = async {
        while let Some(end) = ends.join_next().await {
            closed.push(end?.saturating_duration_since(published));
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(PHASE_MAX_TIME, collect)
        .await
        .map_err(|_| anyhow!("refused streams still open after {PHASE_MAX_TIME:?}"))??;
    closed.sort();
    let last = *closed.last().ok_or_else(|| anyhow!("nothing closed"))?;
    let p50 = closed[closed.len() / 2];

    let mut survivors = 0;
    for (mut tx, mut rx) in kept {
        tx.send_data(Bytes::from_static(b"y"), false)?;
        match tokio::time::timeout(Duration::from_secs(5), rx.data()).await {
            Ok(Some(Ok(b))) if &b[..] == b"y" => survivors += 1,
            other => bail!("a demo/friend stream did not survive the change: {other:?}"),
        }
    }
    let text = nodes.server.metrics_text();
    let counted = tidegate_e2e::metric(
        &text,
        r#"tidegate_authorization_closed_total{transport="hbone",reason="explicitly_denied"}"#,
    );
    println!(
        "[in-process] a DENY closes {} of {} live streams: p50 {:.1} ms, last {:.1} ms after the publish \
         (counted {counted}); {survivors} others carry on",
        closed.len(),
        closed.len() + survivors,
        ms(p50),
        ms(last)
    );
    println!(
        "[in-process] baseline, same run: opening those {} streams took {:.1} ms → closing all is {:.3}× opening",
        closed.len(),
        ms(open_doomed),
        last.as_secs_f64() / open_doomed.as_secs_f64()
    );
    nodes.client.shutdown().await;
    nodes.server.shutdown().await;
    Ok(())
}
