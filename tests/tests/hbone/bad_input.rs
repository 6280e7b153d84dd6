//! Hostile input (issue 12): tunnels into the gateway itself, refusals h2
//! makes on its own, certificates with two identities, the outbound capture
//! looping into itself (rapid reset: `dial_pacing.rs`). Each is refused with
//! its own reason and metric, and the gateway serves a good client afterwards.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use rcgen::{
    CertificateParams, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose, SanType,
    PKCS_ECDSA_P256_SHA256,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;
use tidegate_e2e::{
    eventually, gateway_config, ip, metric_or_zero, round_trip, workloads_yaml, Capture, Options,
    TwoNodes,
};
use tidegate_protocol::identity::SpiffeId;
use tidegate_protocol::tls::{CertError, CertSource, Roots};
use tokio::io::AsyncReadExt;

use super::raw_h2::{self, ENHANCE_YOUR_CALM, GOAWAY, PROTOCOL_ERROR, REFUSED_STREAM, RST_STREAM};
use super::rejections::{
    connect, id, real_ca, refused_by_server, request, still_serving, stream_ended,
};

fn h2_refusals(nodes: &TwoNodes, frame: &str, reason: &str) -> f64 {
    metric_or_zero(
        &nodes.server.metrics_text(),
        &format!(r#"tidegate_h2_refusals_total{{frame="{frame}",reason="{reason}"}}"#),
    )
}

/// A CONNECT to the gateway's own ports on a local workload's address would
/// tunnel into the gateway (three nested tunnels echoed at the innermost, in
/// the issue); port 0 is no port. Both are 400 `illegal_port`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_to_the_gateways_own_ports_and_port_0_are_refused() {
    let nodes = TwoNodes::start(81).await;
    let echo_ip = ip(nodes.octet, 2);
    let a = &nodes.server.addrs;
    // The bound HBONE and metrics ports, the configured hbone.port, port 0.
    for port in [
        a.inbound.expect("node listeners").port(),
        a.metrics.port(),
        15008,
        0,
    ] {
        let target = format!("{echo_ip}:{port}");
        let (status, reason) = request(&nodes, 2, "echo", connect(&target)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{target}");
        assert!(reason.contains("gateway's own port"), "{target}: {reason}");
    }
    assert_eq!(stream_ended(&nodes, "illegal_port"), 4.0);
    // The workload's own ports are still reachable.
    let (status, _) = request(&nodes, 2, "echo", connect(&nodes.echo.to_string())).await;
    assert_eq!(status, StatusCode::OK);
    still_serving(&nodes).await;
}

/// RST_STREAM(PROTOCOL_ERROR) for `:protocol` and for an empty authority,
/// RST_STREAM(REFUSED_STREAM) beyond the stream limit, and
/// GOAWAY(ENHANCE_YOUR_CALM) for a flood of malformed requests: h2 decides
/// all of them without handing us the stream; each is counted by frame and
/// code, and the flood's connection as a failed one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_made_by_the_http2_layer_are_counted() {
    let nodes = TwoNodes::with(
        82,
        Options {
            // Continues the `hbone:` section of the test config.
            server_yaml: "  max_concurrent_streams: 2\n".into(),
            ..Default::default()
        },
    )
    .await;
    let echo = nodes.echo.to_string();
    let mut raw = raw_h2::connect(&nodes).await;
    let is_reset = |id: u32, code: u32| {
        move |f: &raw_h2::Frame| {
            f.kind == RST_STREAM && f.stream == id && f.error_code() == Some(code)
        }
    };

    let s = raw
        .open(&[
            (":method", "CONNECT"),
            (":authority", &echo),
            (":protocol", "websocket"),
        ])
        .await;
    raw.until("reset of the :protocol stream", is_reset(s, PROTOCOL_ERROR))
        .await;
    let s = raw
        .open(&[(":method", "CONNECT"), (":authority", "")])
        .await;
    raw.until("reset of the empty authority", is_reset(s, PROTOCOL_ERROR))
        .await;
    eventually(
        "two protocol_error resets counted",
        Duration::from_secs(5),
        || h2_refusals(&nodes, "rst_stream", "protocol_error") == 2.0,
    )
    .await;

    // Two streams open (echo answers 200 and waits), the third is refused.
    let fields = [(":method", "CONNECT"), (":authority", echo.as_str())];
    raw.open(&fields).await;
    raw.open(&fields).await;
    let s = raw.open(&fields).await;
    raw.until("REFUSED_STREAM", is_reset(s, REFUSED_STREAM))
        .await;
    eventually("refused_stream counted", Duration::from_secs(5), || {
        h2_refusals(&nodes, "rst_stream", "refused_stream") == 1.0
    })
    .await;

    // h2 allows 1024 locally reset streams per connection, then goes away.
    let mut flood = raw_h2::connect(&nodes).await;
    let protocol = [
        (":method", "CONNECT"),
        (":authority", &echo),
        (":protocol", "x"),
    ];
    flood.open_many(&protocol, 1100).await;
    flood
        .until("GOAWAY(ENHANCE_YOUR_CALM)", |f| {
            f.kind == GOAWAY && f.error_code() == Some(ENHANCE_YOUR_CALM)
        })
        .await;
    eventually("the flood's GOAWAY counted", Duration::from_secs(5), || {
        h2_refusals(&nodes, "goaway", "enhance_your_calm") == 1.0
            && metric_or_zero(
                &nodes.server.metrics_text(),
                r#"tidegate_connections_failed_total{direction="inbound",reason="h2_enhance_your_calm"}"#,
            ) == 1.0
    })
    .await;
    // The flood's own RST_STREAMs are not asserted: h2 drops those still
    // queued when it goes away, so anywhere from none to 1024 reach the wire.
    still_serving(&nodes).await;
}

/// Presents a leaf with two URI SANs, signed by the real development CA.
struct TwoIdentities {
    key: Arc<CertifiedKey>,
    roots: Arc<dyn CertSource>,
}

impl CertSource for TwoIdentities {
    fn certified_key(&self, _: &SpiffeId) -> Result<Arc<CertifiedKey>, CertError> {
        Ok(self.key.clone())
    }
    fn roots(&self) -> Arc<Roots> {
        self.roots.roots()
    }
}

fn two_identity_leaf(nodes: &TwoNodes) -> Arc<CertifiedKey> {
    let both = std::fs::read_to_string(nodes.ca_dir().join("ca.pem")).unwrap();
    let (ca_cert, ca_key) = both.split_at(both.find("-----BEGIN PRIVATE KEY-----").unwrap());
    let issuer = Issuer::from_ca_cert_pem(ca_cert, KeyPair::from_pem(ca_key).unwrap()).unwrap();
    let mut p = CertificateParams::default();
    p.subject_alt_names = ["client", "other"]
        .map(|sa| {
            SanType::URI(
                format!("spiffe://cluster.local/ns/demo/sa/{sa}")
                    .try_into()
                    .unwrap(),
            )
        })
        .to_vec();
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = p.signed_by(&key, &issuer).unwrap();
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let signer = tidegate_protocol::tls::provider()
        .key_provider
        .load_private_key(der)
        .unwrap();
    Arc::new(CertifiedKey::new(vec![cert.der().clone()], signer))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_with_two_uri_sans_is_refused_as_such() {
    let nodes = TwoNodes::start(83).await;
    let source = TwoIdentities {
        key: two_identity_leaf(&nodes),
        roots: real_ca(&nodes),
    };
    let client = id("cluster.local", "client");
    refused_by_server(&nodes, Arc::new(source), &client, "multiple_uri_sans").await;
    assert_eq!(
        metric_or_zero(
            &nodes.server.metrics_text(),
            r#"tidegate_tls_handshake_failures_total{direction="inbound",reason="no_spiffe_id"}"#,
        ),
        0.0
    );
    still_serving(&nodes).await;
}

/// A captured connection to the outbound listener's own port, on any local
/// address of a wildcard listener, is a loop — from the moment
/// `app::build` returns. On a current-thread runtime the spawned accept
/// loop has not run yet when the connection below is proxied, so a listener
/// address recorded only by that task would let this loop pass through.
#[tokio::test(flavor = "current_thread")]
async fn a_capture_of_the_wildcard_outbound_listener_itself_is_a_loop() {
    tidegate_e2e::init_tracing();
    let octet = 85;
    let dir = tempfile::tempdir().unwrap();
    let workloads = dir.path().join("workloads.yaml");
    std::fs::write(&workloads, workloads_yaml(octet, "echo")).unwrap();
    let mut cfg = gateway_config("node-a", &dir.path().join("ca"), &workloads, 15008, "");
    cfg.listeners.outbound = "0.0.0.0:0".parse().unwrap();
    // The application's connection exists before the gateway does, so
    // nothing between `build` and `proxy` below yields to the runtime.
    let app_side = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut client = tokio::net::TcpStream::connect(app_side.local_addr().unwrap())
        .await
        .unwrap();
    let (captured, src) = app_side.accept().await.unwrap();
    let app = tidegate::app::build(cfg).await.unwrap();
    let own = SocketAddr::new(
        ip(octet, 9),
        app.addrs.outbound.expect("node listeners").port(),
    );
    app.outbound.proxy(captured, src, own).await;
    let loops = r#"tidegate_connections_failed_total{direction="outbound",reason="loop"}"#;
    assert_eq!(metric_or_zero(&app.metrics_text(), loops), 1.0);
    let mut buf = Vec::new();
    let r = client.read_to_end(&mut buf).await;
    assert!(r.is_err() || buf.is_empty(), "a loop carries no byte");

    // A plain destination is still passed through.
    let echo = tidegate_e2e::echo_server(ip(octet, 9)).await;
    let good = Capture::start(app.outbound.clone(), echo).await;
    let mut tcp = good.connect(ip(octet, 3)).await;
    assert_eq!(round_trip(&mut tcp, b"fine").await.unwrap(), b"fine");
}

/// IPv6 spellings of a CONNECT target over a real tunnel: a zone id, an
/// IPv4-mapped form of the dialed workload (its app port, and its HBONE
/// port: a way around the own-port guard if it were read as another
/// address), IPv6 loopback on the HBONE port. Each is 400 with its own
/// reason; the gateway serves a good client afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_authority_spellings_are_refused_with_their_reasons() {
    let nodes = TwoNodes::start(97).await;
    let echo_ip = ip(nodes.octet, 2);
    let port = nodes.echo.port();
    for (target, reason, says) in [
        (
            format!("[fe80::1%25eth0]:{port}"),
            "authority_zone_id",
            "zone id",
        ),
        (
            format!("[::ffff:{echo_ip}]:{port}"),
            "authority_v4_mapped",
            "IPv4-mapped",
        ),
        (
            format!("[::ffff:{echo_ip}]:15008"),
            "authority_v4_mapped",
            "IPv4-mapped",
        ),
        (
            "[::1]:15008".to_owned(),
            "target_not_local",
            "not a workload on this node",
        ),
    ] {
        let (status, why) = request(&nodes, 2, "echo", connect(&target)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{target}");
        assert!(why.contains(says), "{target}: {why}");
        assert!(stream_ended(&nodes, reason) >= 1.0, "{target}: {reason}");
    }
    assert_eq!(stream_ended(&nodes, "authority_v4_mapped"), 2.0);
    still_serving(&nodes).await;
}
