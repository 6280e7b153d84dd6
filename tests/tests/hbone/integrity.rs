//! Byte-exact integrity through outbound → HBONE → inbound → echo, and many
//! concurrent streams on pooled tunnels.

use std::time::Duration;

use tidegate_e2e::{metric, metric_or_zero, round_trip, TwoNodes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A reproducible byte stream (xorshift) so 256 MiB need not be kept in memory.
struct Pattern(u64);

impl Pattern {
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            let b = self.0.to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
    }
}

/// Sends `len` patterned bytes, half-closes, and checks every echoed byte.
async fn echo_exact(nodes: &TwoNodes, len: usize) {
    let tcp = nodes.app_conn().await;
    let (mut r, mut w) = tcp.into_split();
    let writer = tokio::spawn(async move {
        let mut p = Pattern(0x9e3779b97f4a7c15 ^ len as u64);
        let mut buf = vec![0u8; 256 * 1024];
        let mut left = len;
        while left > 0 {
            let n = left.min(buf.len());
            p.fill(&mut buf[..n]);
            w.write_all(&buf[..n]).await.unwrap();
            left -= n;
        }
        w.shutdown().await.unwrap();
    });
    let mut expect = Pattern(0x9e3779b97f4a7c15 ^ len as u64);
    let mut got = vec![0u8; 256 * 1024];
    let mut want = vec![0u8; 256 * 1024];
    let mut seen = 0usize;
    // Compare in the writer's chunking so the pattern lines up.
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = match r.read(&mut got).await {
            Ok(n) => n,
            Err(e) => panic!(
                "reading the echo of {len} bytes failed after {seen}: {e}\n{}",
                why_streams_ended(nodes)
            ),
        };
        if n == 0 {
            break;
        }
        pending.extend_from_slice(&got[..n]);
        while pending.len() >= (len - seen).min(want.len()) && seen < len {
            let m = (len - seen).min(want.len());
            expect.fill(&mut want[..m]);
            assert!(
                pending[..m] == want[..m],
                "mismatch in bytes {seen}..{}",
                seen + m
            );
            pending.drain(..m);
            seen += m;
        }
    }
    assert!(pending.is_empty(), "{} extra bytes echoed", pending.len());
    assert_eq!(
        seen, len,
        "echo ended early (half-close propagated too soon?)"
    );
    writer.await.unwrap();
}

/// What both gateways counted about failed connections, ended streams and
/// closed tunnels (by reason): the cause of a reset the application saw.
fn why_streams_ended(nodes: &TwoNodes) -> String {
    let mut out = String::new();
    for (who, text) in [
        ("client", nodes.client.metrics_text()),
        ("server", nodes.server.metrics_text()),
    ] {
        for line in text.lines().filter(|l| {
            l.starts_with("tidegate_")
                && ["connections_failed", "streams_ended", "tunnels_closed"]
                    .iter()
                    .any(|m| l.contains(m))
        }) {
            out.push_str(&format!("{who}: {line}\n"));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_arrive_exactly_for_1b_64kib_256mib() {
    let nodes = TwoNodes::start(11).await;
    for len in [1, 64 * 1024, 256 * 1024 * 1024] {
        tokio::time::timeout(Duration::from_secs(120), echo_exact(&nodes, len))
            .await
            .unwrap_or_else(|_| panic!("{len} bytes timed out"));
    }
    let client = nodes.client.metrics_text();
    let server = nodes.server.metrics_text();
    let total = (1 + 64 * 1024 + 256 * 1024 * 1024) as f64;
    assert_eq!(
        metric(
            &client,
            r#"tidegate_bytes_total{direction="outbound",flow="tcp_to_tunnel"}"#
        ),
        total
    );
    assert_eq!(
        metric(
            &server,
            r#"tidegate_bytes_total{direction="inbound",flow="tunnel_to_tcp"}"#
        ),
        total
    );
    assert_eq!(metric(&client, "tidegate_pool_tunnels_opened_total"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_connection_half_closes_cleanly() {
    let nodes = TwoNodes::start(12).await;
    let mut tcp = nodes.app_conn().await;
    tcp.shutdown().await.unwrap();
    let mut buf = Vec::new();
    tcp.read_to_end(&mut buf).await.unwrap();
    assert!(buf.is_empty());
    tidegate_e2e::eventually("stream recorded as ok", Duration::from_secs(5), || {
        metric_or_zero(
            &nodes.server.metrics_text(),
            r#"tidegate_streams_ended_total{direction="inbound",reason="ok"}"#,
        ) == 1.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_streams_share_ten_tunnels() {
    let nodes = std::sync::Arc::new(TwoNodes::start(13).await);
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(1000));
    let mut tasks = Vec::new();
    for i in 0..1000u32 {
        let nodes = nodes.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let mut tcp = nodes.app_conn().await;
            let msg: Vec<u8> = (0..1024u32).map(|b| (b ^ i) as u8).collect();
            let back = round_trip(&mut tcp, &msg).await.unwrap();
            assert_eq!(back, msg, "stream {i} corrupted");
            // Hold every stream open until all 1,000 are established.
            barrier.wait().await;
            tcp.shutdown().await.unwrap();
            let mut rest = Vec::new();
            tcp.read_to_end(&mut rest).await.unwrap();
            assert!(rest.is_empty());
        }));
    }
    let all = async {
        for t in tasks {
            t.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("1,000 streams timed out");
    // The application saw its end of each stream; the gateway records it a moment later.
    tidegate_e2e::eventually("1,000 streams recorded ok", Duration::from_secs(10), || {
        metric_or_zero(
            &nodes.client.metrics_text(),
            r#"tidegate_streams_ended_total{direction="outbound",reason="ok"}"#,
        ) == 1000.0
    })
    .await;
    let client = nodes.client.metrics_text();
    // 1,000 simultaneous streams at 100 per tunnel: exactly ten tunnels.
    assert_eq!(metric(&client, "tidegate_pool_tunnels_opened_total"), 10.0);
}
