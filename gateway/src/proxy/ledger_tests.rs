//! A ledger records its connection's end once, however it ends: refused,
//! finished, or dropped by a cancelled task.

use std::sync::{Arc, Mutex};
use tidegate_base::sync::Locked;

use prometheus_client::registry::Registry;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::proxy::istio_tcp::{IstioTcpMetrics, Reporter};
use crate::proxy::metrics::ProxyFamilies;
use crate::workloads::WorkloadSpec;
use tidegate_base::shutdown::ActiveStreams;

/// The registry's text, and the access lines logged on this thread.
struct Recorded {
    registry: Registry,
    lines: Arc<Mutex<Vec<u8>>>,
    _logging: tracing::subscriber::DefaultGuard,
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.locked().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Recorded {
    fn new(direction: &'static str) -> (Self, ProxyMetrics) {
        let mut registry = Registry::default();
        let istio = IstioTcpMetrics::register(&mut registry, "Kubernetes");
        let metrics = ProxyFamilies::register(&mut registry, istio).direction(direction);
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        let _logging = tracing::subscriber::set_default(subscriber);
        let recorded = Recorded {
            registry,
            lines,
            _logging,
        };
        (recorded, metrics)
    }

    /// The value of the series whose line starts with `name{` and holds
    /// every one of `labels`; 0 when there is none.
    fn value(&self, name: &str, labels: &[&str]) -> u64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        let found: Vec<u64> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .filter(|l| labels.iter().all(|n| l.contains(n)))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(
            found.len() <= 1,
            "{name} {labels:?} names one series: {found:?}"
        );
        found.first().copied().unwrap_or(0)
    }

    fn access_lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.lines.locked())
            .lines()
            .filter(|l| l.contains("tidegate::access"))
            .map(str::to_owned)
            .collect()
    }
}

/// A connected pair: the client's end as the gateway holds it, and the
/// client itself.
async fn accepted() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (held, _) = listener.accept().await.unwrap();
    (held, client)
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn workload(uid: &str, ip: &str) -> Arc<Workload> {
    let spec: WorkloadSpec = serde_yaml::from_str(&format!(
        "{{uid: {uid}, name: {uid}, namespace: ns, ips: [{ip}], node: n}}"
    ))
    .unwrap();
    Arc::new(Workload {
        identity: SpiffeId::new("cluster.local", "ns", uid),
        spec,
        local: false,
    })
}

fn unnamed(reporter: Reporter) -> Connection<'static> {
    Connection {
        reporter,
        source: None,
        source_identity: None,
        source_baggage: None,
        destination: None,
        service: None,
        mutual_tls: true,
    }
}

#[tokio::test]
async fn a_refused_connection_is_counted_failed_once_logged_once_and_reset() {
    let (rec, metrics) = Recorded::new("outbound");
    let (held, mut client) = accepted().await;
    let streams = ActiveStreams::default();
    let (src, dst) = (addr("10.0.0.1:40000"), addr("10.0.0.2:80"));
    let mut ledger = ConnectionLedger::connection(&metrics, &held, streams.track(), src, dst);
    ledger.source(SpiffeId::new("cluster.local", "ns", "client"));
    ledger.report(unnamed(Reporter::Source));
    ledger.refuse("endpoint_connect", Flags::Connect, None);

    let outbound = r#"direction="outbound""#;
    let reason = r#"reason="endpoint_connect""#;
    assert_eq!(rec.value("connections_opened_total", &[outbound]), 1);
    assert_eq!(rec.value("connections_closed_total", &[outbound]), 1);
    assert_eq!(rec.value("connections_failed_total", &[reason]), 1);
    assert_eq!(rec.value("streams_ended_total", &[reason]), 1);
    let connect = r#"response_flags="CONNECT""#;
    assert_eq!(
        rec.value("istio_tcp_connections_closed_total", &[connect]),
        1
    );
    assert_eq!(
        rec.value("istio_tcp_connections_failed_total", &[connect]),
        1
    );
    let lines = rec.access_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains(r#"result="endpoint_connect""#),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("src.identity=\"spiffe://cluster.local/ns/ns/sa/client\""));
    assert!(lines[0].contains("dst.addr=10.0.0.2:80"), "{}", lines[0]);
    assert_eq!(
        streams.count(),
        0,
        "its place among the streams ends with it"
    );
    drop(held);
    let mut buf = [0u8; 1];
    let read = client.read(&mut buf).await;
    assert_eq!(
        read.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionReset),
        "a refused connection is reset, not closed"
    );
}

#[tokio::test]
async fn a_finished_stream_is_recorded_once_with_its_result_and_drain() {
    let (rec, metrics) = Recorded::new("inbound");
    let streams = ActiveStreams::default();
    let ledger = carrying_stream(&metrics, &streams);
    let inbound = r#"direction="inbound""#;
    assert_eq!(rec.value("streams_open", &[inbound]), 1);
    let moved = Transferred {
        tcp_to_h2: 3,
        h2_to_tcp: 4,
    };
    ledger.finish(Ended::new(OK, moved).drained_by(Some("ns/drain-a")));

    assert_eq!(rec.value("streams_open", &[inbound]), 0);
    assert_eq!(rec.value("streams_ended_total", &[r#"reason="ok""#]), 1);
    // A stream is no connection: its tunnel is counted where it is accepted.
    assert_eq!(rec.value("connections_opened_total", &[inbound]), 0);
    assert_eq!(rec.value("connections_closed_total", &[inbound]), 0);
    let none = r#"response_flags="-""#;
    assert_eq!(rec.value("istio_tcp_connections_closed_total", &[none]), 1);
    assert_eq!(rec.value("istio_tcp_connections_failed_total", &[]), 0);
    assert_eq!(streams.ends().clean, 1);
    assert_eq!(streams.ends().reset, 0);
    let lines = rec.access_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    for field in [
        r#"result="ok""#,
        "bytes_to_tunnel=3",
        "bytes_from_tunnel=4",
        r#"drained_by="ns/drain-a""#,
    ] {
        assert!(lines[0].contains(field), "{field} in {}", lines[0]);
    }
}

#[tokio::test]
async fn a_stream_cut_by_a_policy_is_flagged_denied_and_counted_reset() {
    let (rec, metrics) = Recorded::new("inbound");
    let streams = ActiveStreams::default();
    let ledger = carrying_stream(&metrics, &streams);
    let ended = Ended::new("policy_closed", Transferred::default()).denied("no policy allows it");
    ledger.finish(ended);

    let deny = r#"response_flags="DENY""#;
    assert_eq!(rec.value("istio_tcp_connections_closed_total", &[deny]), 1);
    assert_eq!(rec.value("istio_tcp_connections_failed_total", &[deny]), 1);
    assert_eq!(streams.ends().reset, 1);
    let lines = rec.access_lines();
    assert!(
        lines[0].contains(r#"error="no policy allows it""#),
        "{}",
        lines[0]
    );
}

#[tokio::test]
async fn a_dropped_ledger_records_one_cancellation() {
    let (rec, metrics) = Recorded::new("outbound");
    let (held, _client) = accepted().await;
    let streams = ActiveStreams::default();
    let (src, dst) = (addr("10.0.0.1:40000"), addr("10.0.0.2:80"));
    let mut ledger = ConnectionLedger::connection(&metrics, &held, streams.track(), src, dst);
    ledger.report(unnamed(Reporter::Source));
    ledger.carrying();
    drop(ledger);

    let outbound = r#"direction="outbound""#;
    assert_eq!(
        rec.value("streams_ended_total", &[r#"reason="cancelled""#]),
        1
    );
    assert_eq!(rec.value("streams_ended_total", &[r#"reason="ok""#]), 0);
    assert_eq!(rec.value("streams_open", &[outbound]), 0);
    assert_eq!(rec.value("connections_closed_total", &[outbound]), 1);
    assert_eq!(rec.value("connections_failed_total", &[]), 0);
    let none = r#"response_flags="-""#;
    assert_eq!(rec.value("istio_tcp_connections_closed_total", &[none]), 1);
    assert_eq!(rec.value("istio_tcp_connections_closed_total", &[]), 1);
    assert_eq!(streams.ends().reset, 1, "a cut stream, not a clean one");
    let lines = rec.access_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains(r#"result="cancelled""#), "{}", lines[0]);
}

#[tokio::test]
async fn a_refused_endpoint_closes_its_attempt_and_is_named_on_the_line() {
    let (rec, metrics) = Recorded::new("outbound");
    let (held, _client) = accepted().await;
    let streams = ActiveStreams::default();
    let (src, dst) = (addr("10.0.0.1:40000"), addr("10.96.0.1:80"));
    let mut ledger = ConnectionLedger::connection(&metrics, &held, streams.track(), src, dst);
    let (a, b) = (workload("web-a", "10.0.1.1"), workload("web-b", "10.0.1.2"));
    ledger.destination(Some(a.identity.clone()));
    ledger.trying(&a, addr("10.0.1.1:8080"));
    ledger.report(unnamed(Reporter::Source));
    ledger.endpoint_refused(Flags::TlsFailure, "tls_handshake");
    ledger.destination(Some(b.identity.clone()));
    ledger.trying(&b, addr("10.0.1.2:8080"));
    ledger.report(unnamed(Reporter::Source));
    ledger.finish(Ended::new(OK, Transferred::default()));

    let tls = r#"response_flags="TLS_FAILURE""#;
    assert_eq!(rec.value("istio_tcp_connections_closed_total", &[tls]), 1);
    let none = r#"response_flags="-""#;
    assert_eq!(rec.value("istio_tcp_connections_closed_total", &[none]), 1);
    assert_eq!(rec.value("istio_tcp_connections_opened_total", &[]), 2);
    let lines = rec.access_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    for field in [
        r#"endpoint="web-b at 10.0.1.2:8080""#,
        r#"refused_tries="web-a at 10.0.1.1:8080: tls_handshake""#,
        "dst.identity=\"spiffe://cluster.local/ns/ns/sa/web-b\"",
    ] {
        assert!(lines[0].contains(field), "{field} in {}", lines[0]);
    }
}

/// An inbound stream routed and carrying bytes, as the CONNECT path holds
/// it before it ends.
fn carrying_stream<'a>(metrics: &'a ProxyMetrics, streams: &ActiveStreams) -> ConnectionLedger<'a> {
    let (src, dst) = (addr("10.0.0.1:40000"), addr("10.0.0.2:80"));
    let mut ledger = ConnectionLedger::stream(metrics, streams.track(), src, dst);
    ledger.report(unnamed(Reporter::Destination));
    ledger.carrying();
    ledger
}

#[tokio::test]
async fn a_routed_connection_is_listed_under_its_local_workload_until_it_ends() {
    let (_rec, metrics) = Recorded::new("outbound");
    let (held, _client) = accepted().await;
    let streams = ActiveStreams::default();
    let (src, dst) = (addr("10.0.0.1:40000"), addr("10.96.0.1:80"));
    let client = workload("client", "10.0.0.1");
    let (a, b) = (workload("web-a", "10.0.1.1"), workload("web-b", "10.0.1.2"));
    let from_client = |mutual_tls| Connection {
        source: Some(&client),
        mutual_tls,
        ..unnamed(Reporter::Source)
    };
    let mut ledger = ConnectionLedger::connection(&metrics, &held, streams.track(), src, dst);
    assert!(metrics.live.is_empty(), "not routed yet: not listed");
    ledger.trying(&a, addr("10.0.1.1:8080"));
    ledger.report(from_client(true));
    let listed = metrics.live.list();
    assert_eq!(
        listed,
        [LiveConnection {
            workload_uid: "client".into(),
            direction: Direction::Outbound,
            src,
            original_dst: Some(dst),
            actual_dst: addr("10.0.1.1:8080"),
            hbone: true,
        }]
    );
    ledger.endpoint_refused(Flags::TlsFailure, "tls_handshake");
    ledger.trying(&b, addr("10.0.1.2:8080"));
    ledger.report(from_client(true));
    let listed = metrics.live.list();
    assert_eq!(listed.len(), 1, "one connection, one entry: {listed:?}");
    assert_eq!(listed[0].actual_dst, addr("10.0.1.2:8080"), "the retry's");
    ledger.finish(Ended::new(OK, Transferred::default()));
    assert!(metrics.live.is_empty(), "finished: gone");

    // Dropped unended (a cancelled task): gone too.
    let mut ledger = ConnectionLedger::connection(&metrics, &held, streams.track(), src, dst);
    ledger.report(from_client(false));
    assert_eq!(metrics.live.list()[0].protocol(), "TCP");
    drop(ledger);
    assert!(metrics.live.is_empty(), "dropped: gone");

    // No local workload known: nothing to list it under.
    let mut ledger = ConnectionLedger::connection(&metrics, &held, streams.track(), src, dst);
    ledger.report(unnamed(Reporter::Source));
    assert!(metrics.live.is_empty());
    ledger.refuse("no_route", Flags::None, None);
}

#[tokio::test]
async fn an_inbound_stream_is_listed_under_its_destination_without_an_original_destination() {
    let (_rec, metrics) = Recorded::new("inbound");
    let streams = ActiveStreams::default();
    let (peer, asked) = (addr("10.0.9.9:51000"), addr("10.0.0.2:8080"));
    let echo = workload("echo", "10.0.0.2");
    let mut ledger = ConnectionLedger::stream(&metrics, streams.track(), peer, asked);
    ledger.report(Connection {
        destination: Some(&echo),
        ..unnamed(Reporter::Destination)
    });
    assert_eq!(
        metrics.live.list(),
        [LiveConnection {
            workload_uid: "echo".into(),
            direction: Direction::Inbound,
            src: peer,
            original_dst: None,
            actual_dst: asked,
            hbone: true,
        }]
    );
    ledger.refuse("denied", Flags::Deny, None);
    assert!(metrics.live.is_empty());
}
