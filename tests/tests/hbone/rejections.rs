//! Every refusal has its specific status or TLS failure, a metric increment,
//! and the gateway keeps serving everybody else.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use http::{Method, Request, StatusCode};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, SignatureScheme};
use tidegate::config::HboneConfig;
use tidegate_e2e::{eventually, ip, metric, metric_or_zero, round_trip, Options, TwoNodes};
use tidegate_protocol::hbone::client::{connect_stream, dial};
use tidegate_protocol::hbone::Settings;
use tidegate_protocol::hbone::REASON_HEADER;
use tidegate_protocol::identity::SpiffeId;
use tidegate_protocol::tls::{CertError, CertSource, DevCa, Roots, TlsContext, TlsMetrics};
use tokio::io::AsyncReadExt;

pub(crate) fn id(td: &str, sa: &str) -> SpiffeId {
    SpiffeId::new(td, "demo", sa)
}

/// Presents certificates from one CA while trusting another's roots.
struct Mixed {
    keys: DevCa,
    roots: Arc<dyn CertSource>,
}

impl CertSource for Mixed {
    fn certified_key(&self, id: &SpiffeId) -> Result<Arc<CertifiedKey>, CertError> {
        self.keys.certified_key(id)
    }
    fn roots(&self) -> Arc<Roots> {
        self.roots.roots()
    }
}

pub(crate) fn real_ca(nodes: &TwoNodes) -> Arc<DevCa> {
    Arc::new(DevCa::open(&nodes.ca_dir(), Duration::from_secs(600)).unwrap())
}

pub(crate) fn hbone_addr(nodes: &TwoNodes, host: u8) -> SocketAddr {
    SocketAddr::new(
        ip(nodes.octet, host),
        nodes.server.addrs.inbound.expect("node listeners").port(),
    )
}

/// Polled until it reaches 1, so an absent series (before the first
/// failure) reads 0; a renamed series times the poll out.
pub(crate) fn inbound_failed(nodes: &TwoNodes, reason: &str) -> f64 {
    metric_or_zero(
        &nodes.server.metrics_text(),
        &format!(r#"tidegate_connections_failed_total{{direction="inbound",reason="{reason}"}}"#),
    )
}

pub(crate) fn stream_ended(nodes: &TwoNodes, reason: &str) -> f64 {
    metric(
        &nodes.server.metrics_text(),
        &format!(r#"tidegate_streams_ended_total{{direction="inbound",reason="{reason}"}}"#),
    )
}

/// The gateway still serves a normal application connection.
pub(crate) async fn still_serving(nodes: &TwoNodes) {
    let mut tcp = nodes.app_conn().await;
    assert_eq!(
        round_trip(&mut tcp, b"still here").await.unwrap(),
        b"still here"
    );
}

/// Dials the echo workload as `client` with certificates from `source`;
/// the server must refuse the client (no stream ever works) and count `reason`.
pub(crate) async fn refused_by_server(
    nodes: &TwoNodes,
    source: Arc<dyn CertSource>,
    client: &SpiffeId,
    reason: &str,
) {
    let tls = TlsContext::new(source, "cluster.local", TlsMetrics::default());
    let echo = id("cluster.local", "echo");
    let r = dial(
        &tls,
        &Settings::default(),
        client,
        &echo,
        hbone_addr(nodes, 2),
    )
    .await;
    // TLS 1.3: the client may finish its handshake before the server judges
    // its certificate; then the first stream fails.
    if let Ok((send, conn)) = r {
        tokio::spawn(conn);
        assert!(connect_stream(send, nodes.echo, Duration::from_secs(2))
            .await
            .is_err());
    }
    eventually(&format!("{reason} counted"), Duration::from_secs(5), || {
        inbound_failed(nodes, reason) == 1.0
    })
    .await;
}

#[derive(Debug)]
pub(crate) struct AcceptAnyServer;

impl ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        tidegate_protocol::tls::provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_refusals_are_specific() {
    let nodes = TwoNodes::start(31).await;
    let hbone = HboneConfig::default();
    let addr = hbone_addr(&nodes, 2);

    // 1. No client certificate.
    let cfg = rustls::ClientConfig::builder_with_provider(tidegate_protocol::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyServer))
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let conn = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await;
    if let Ok(mut tls) = conn {
        // TLS 1.3: the server judges the client's (absent) certificate after
        // the client finished; the refusal arrives as an alert on first read.
        let mut buf = [0u8; 1];
        assert!(matches!(tls.read(&mut buf).await, Err(_) | Ok(0)));
    }
    eventually("no_client_cert counted", Duration::from_secs(5), || {
        inbound_failed(&nodes, "no_client_cert") == 1.0
    })
    .await;

    // 2. A client certificate from a CA the server does not trust.
    let rogue = Mixed {
        keys: DevCa::new(Duration::from_secs(600)).unwrap(),
        roots: real_ca(&nodes),
    };
    refused_by_server(
        &nodes,
        Arc::new(rogue),
        &id("cluster.local", "client"),
        "untrusted_ca",
    )
    .await;

    // 3. The right CA, another trust domain.
    refused_by_server(
        &nodes,
        real_ca(&nodes),
        &id("evil.local", "client"),
        "wrong_trust_domain",
    )
    .await;

    // 4. The server presents an identity other than the expected one: the
    // client refuses before sending anything.
    let tls = TlsContext::new(real_ca(&nodes), "cluster.local", TlsMetrics::default());
    let refused = dial(
        &tls,
        &hbone.settings(),
        &id("cluster.local", "client"),
        &id("cluster.local", "impostor"),
        addr,
    )
    .await;
    let Err(err) = refused else {
        panic!("a server with the wrong SAN must be refused");
    };
    assert_eq!(err.reason(), "unexpected_identity", "{err}");
    eventually(
        "server saw the client's rejection",
        Duration::from_secs(5),
        || inbound_failed(&nodes, "peer_rejected_certificate") == 1.0,
    )
    .await;

    still_serving(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_refuses_a_server_with_the_wrong_identity() {
    // The client gateway believes the echo workload runs as `impostor`.
    let nodes = TwoNodes::with(
        32,
        Options {
            client_view_of_echo_sa: "impostor".into(),
            ..Default::default()
        },
    )
    .await;
    // The gateway resets the application connection, possibly before the
    // connect even completes; no byte may flow either way.
    if let Ok(mut tcp) = nodes.capture.try_connect(nodes.client_ip).await {
        let mut buf = Vec::new();
        let r = tcp.read_to_end(&mut buf).await;
        assert!(
            r.is_err() || buf.is_empty(),
            "no byte may flow to an unverified server"
        );
    }
    eventually("handshake failure counted", Duration::from_secs(5), || {
        metric_or_zero(
            &nodes.client.metrics_text(),
            r#"tidegate_tls_handshake_failures_total{direction="outbound",reason="unexpected_identity"}"#,
        ) == 1.0
    })
    .await;
    // Counted by the outbound proxy a moment after the handshake failure.
    eventually("connection failure counted", Duration::from_secs(5), || {
        metric_or_zero(
            &nodes.client.metrics_text(),
            r#"tidegate_connections_failed_total{direction="outbound",reason="unexpected_identity"}"#,
        ) == 1.0
    })
    .await;
    assert_eq!(
        metric(&nodes.client.metrics_text(), "tidegate_pool_tunnels"),
        0.0
    );
}

/// Sends one request on an authenticated tunnel and returns status + reason header.
pub(crate) async fn request(
    nodes: &TwoNodes,
    host: u8,
    server_sa: &str,
    req: Request<()>,
) -> (StatusCode, String) {
    let tls = TlsContext::new(real_ca(nodes), "cluster.local", TlsMetrics::default());
    let (send, conn) = dial(
        &tls,
        &Settings::default(),
        &id("cluster.local", "client"),
        &id("cluster.local", server_sa),
        hbone_addr(nodes, host),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    answer(send, req).await
}

/// Sends `req` on the tunnel; the status and the `tidegate-reason` header.
pub(crate) async fn answer(send: SendRequest<Bytes>, req: Request<()>) -> (StatusCode, String) {
    let mut send = send.ready().await.unwrap();
    let (resp, _body) = send.send_request(req, true).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), resp)
        .await
        .unwrap()
        .unwrap();
    let reason = resp
        .headers()
        .get(REASON_HEADER)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (resp.status(), reason)
}

pub(crate) fn connect(authority: &str) -> Request<()> {
    Request::builder()
        .method(Method::CONNECT)
        .uri(authority)
        .body(())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_refusals_have_specific_statuses() {
    let nodes = TwoNodes::start(33).await;
    let o = nodes.octet;
    let echo = nodes.echo;

    let get = Request::builder()
        .method(Method::GET)
        .uri(format!("http://{echo}/"))
        .body(())
        .unwrap();
    let (status, reason) = request(&nodes, 2, "echo", get).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(reason.contains("not CONNECT"), "{reason}");
    assert_eq!(stream_ended(&nodes, "not_connect"), 1.0);

    let (status, reason) = request(&nodes, 2, "echo", connect("example.com:80")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(reason.contains("not ip:port"), "{reason}");
    assert_eq!(stream_ended(&nodes, "bad_authority"), 1.0);

    // Dialed the echo workload, asked for another local workload.
    let (status, reason) = request(&nodes, 2, "echo", connect(&format!("{}:80", ip(o, 4)))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(reason.contains("differs from the dialed"), "{reason}");
    assert_eq!(stream_ended(&nodes, "authority_mismatch"), 1.0);

    // A workload of another node: never an open proxy.
    let (status, reason) = request(&nodes, 2, "echo", connect(&format!("{}:80", ip(o, 3)))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(reason.contains("not a workload on this node"), "{reason}");
    assert_eq!(stream_ended(&nodes, "target_not_local"), 1.0);

    // The echo workload, on a port nothing listens on.
    let closed = {
        let l = std::net::TcpListener::bind(SocketAddr::new(ip(o, 2), 0)).unwrap();
        l.local_addr().unwrap()
    };
    let (status, reason) = request(&nodes, 2, "echo", connect(&closed.to_string())).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(reason.contains("unreachable"), "{reason}");
    assert_eq!(stream_ended(&nodes, "upstream_unreachable"), 1.0);

    // A workload whose allow list does not name the client.
    let (status, reason) = request(&nodes, 5, "locked", connect(&format!("{}:80", ip(o, 5)))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(reason.contains("may not connect"), "{reason}");
    assert_eq!(stream_ended(&nodes, "denied"), 1.0);

    // The refused streams' tunnels are fine, and so is everybody else.
    let tls = TlsContext::new(real_ca(&nodes), "cluster.local", TlsMetrics::default());
    let (send, conn) = dial(
        &tls,
        &Settings::default(),
        &id("cluster.local", "client"),
        &id("cluster.local", "echo"),
        hbone_addr(&nodes, 2),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let (mut tx, mut rx) = connect_stream(send, echo, Duration::from_secs(5))
        .await
        .unwrap();
    tx.send_data(Bytes::from_static(b"hi"), true).unwrap();
    let got = rx.data().await.unwrap().unwrap();
    assert_eq!(&got[..], b"hi");
    still_serving(&nodes).await;
}
