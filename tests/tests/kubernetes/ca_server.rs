//! `tidegate-ca`'s listener under connections that do not behave: raw TCP
//! that never handshakes, TLS that never speaks HTTP/2, more connections
//! than the cap — each closed and counted, while a well-behaved node agent
//! keeps getting certificates.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tidegate_base::shutdown::ShutdownTrigger;
use tidegate_ca::server::{start as start_ca, CaServerConfig, RunningCa};
use tidegate_e2e::ca::{agent, ca_config, closed_by_server, gateway_pod, own_identity, NS};
use tidegate_e2e::kube_api::FakeApiServer;
use tidegate_e2e::{eventually, init_tracing, metric, metric_or_zero};
use tokio::net::TcpStream;

use super::WAIT;

async fn ca(
    api: &FakeApiServer,
    tune: impl FnOnce(&mut CaServerConfig),
) -> (RunningCa, ShutdownTrigger) {
    init_tracing();
    gateway_pod(api, "tidegate-a", "node-a", "tok-a");
    let mut cfg = ca_config(
        api,
        "127.0.0.1:0".parse().unwrap(),
        Duration::from_secs(3600),
    );
    tune(&mut cfg);
    let (trigger, drain) = tidegate_base::shutdown::channel();
    (start_ca(cfg, drain).await.unwrap(), trigger)
}

/// A TLS connection to the CA that completes its handshake (ALPN h2) and
/// then sends nothing.
async fn tls_silent(ca: &RunningCa) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.root_pem.as_bytes()).unwrap())
        .unwrap();
    let mut cfg = rustls::ClientConfig::builder_with_provider(tidegate_protocol::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(ca.addr).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .expect("the handshake completes")
}

fn refusals(ca: &RunningCa, reason: &str) -> f64 {
    metric_or_zero(
        &ca.metrics_text(),
        &format!(r#"tidegate_control_refusals_total{{listener="ca",reason="{reason}"}}"#),
    )
}

/// Raw TCP that never starts TLS is closed at the handshake timeout; TLS
/// that never sends a request, at the preface timeout — both counted. The
/// connections used to stay open for good (the handshake timeout was the
/// only one, and HTTP/2 had none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_handshake_or_never_speak_http2_are_closed_and_counted() {
    let api = FakeApiServer::start().await;
    let (ca, _stop) = ca(&api, |c| {
        c.handshake_timeout = Duration::from_millis(300);
        c.preface_timeout = Duration::from_millis(300);
    })
    .await;
    let raw = TcpStream::connect(ca.addr).await.unwrap();
    let tls = tls_silent(&ca).await;
    closed_by_server("raw TCP without a handshake", raw, WAIT).await;
    closed_by_server("TLS without a request", tls, WAIT).await;
    eventually("both closures counted", WAIT, || {
        refusals(&ca, "handshake_timeout") >= 1.0 && refusals(&ca, "preface_timeout") >= 1.0
    })
    .await;
    // A well-behaved agent is served, and its connection is not counted.
    let dir = tempfile::tempdir().unwrap();
    let good = agent(dir.path(), ca.addr, &ca.root_pem, "tok-a");
    let id = own_identity(&good).await.expect("a certificate");
    assert_eq!(
        id.to_string(),
        format!("spiffe://cluster.local/ns/{NS}/sa/tidegate")
    );
    let text = ca.metrics_text();
    assert_eq!(
        metric(
            &text,
            r#"tidegate_control_refusals_total{listener="ca",reason="preface_timeout"}"#
        ),
        1.0,
        "{text}"
    );
}

/// At `--max-connections` a further connection is closed at once and
/// counted, while the agent already connected keeps being served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_cap_a_connection_is_refused_and_counted_while_a_connected_agent_is_served() {
    let api = FakeApiServer::start().await;
    let (ca, _stop) = ca(&api, |c| c.max_connections = 3).await;
    let dir = tempfile::tempdir().unwrap();
    let good = agent(dir.path(), ca.addr, &ca.root_pem, "tok-a");
    own_identity(&good).await.expect("a certificate");
    // Two silent connections fill the cap with the agent's.
    let _a = TcpStream::connect(ca.addr).await.unwrap();
    let _b = TcpStream::connect(ca.addr).await.unwrap();
    let open = r#"tidegate_control_connections_open{listener="ca"}"#;
    eventually("three connections open", WAIT, || {
        metric(&ca.metrics_text(), open) == 3.0
    })
    .await;
    let over = TcpStream::connect(ca.addr).await.unwrap();
    closed_by_server("a connection over the cap", over, WAIT).await;
    eventually("the refusal counted", WAIT, || {
        refusals(&ca, "over_capacity") == 1.0
    })
    .await;
    // The agent's open connection still carries requests.
    own_identity(&good)
        .await
        .expect("served while the cap is full");
    assert_eq!(metric(&ca.metrics_text(), open), 3.0);
}

/// The `tidegate-ca` binary as its Deployment runs it: a flag out of range
/// is refused naming the flag; from its flags and environment it publishes
/// its root, issues a node agent's certificate, and stops at SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tidegate_ca_binary_serves_from_its_flags_and_stops_at_sigterm() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    init_tracing();
    let bin = tidegate_e2e::lab::gateway::sibling_binary("tidegate-ca")
        .expect("the tidegate-ca binary (cargo build --workspace --bins)");
    let api = FakeApiServer::start().await;
    gateway_pod(&api, "tidegate-a", "node-a", "tok-a");
    let run = |args: &[&str]| {
        let mut cmd = Command::new(&bin);
        cmd.args(args)
            .env("TIDEGATE_CA_API_SERVER", api.url())
            .env("POD_NAMESPACE", NS)
            .env("TIDEGATE_LOG", "info");
        cmd
    };

    let refused = run(&["--max-connections=0"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "tidegate-ca: --max-connections: 0 is out of range: must be between 1 and 1000000"
        ),
        "{stderr}"
    );

    let mut child = run(&[
        "--listen=127.0.0.1:0",
        "--metrics-listen=127.0.0.1:0",
        "--serving-name=127.0.0.1",
    ])
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = lines_tx.send(line);
        }
    });
    let serving = loop {
        let line = tokio::time::timeout(WAIT, lines.recv())
            .await
            .expect("tidegate-ca logs that it serves")
            .expect("tidegate-ca exited before serving");
        if line.contains("tidegate-ca serving") {
            break line;
        }
    };
    let addr: std::net::SocketAddr = serving
        .split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("an address in {serving:?}"));
    let published = api
        .named("configmaps", NS, "tidegate-ca-root")
        .expect("the root is published");
    let root = published["data"]["root-cert.pem"].as_str().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let id = own_identity(&agent(dir.path(), addr, root, "tok-a"))
        .await
        .expect("the binary issues a certificate");
    assert_eq!(
        id.to_string(),
        format!("spiffe://cluster.local/ns/{NS}/sa/tidegate")
    );

    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) on our own child, which has not been waited for.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let exited =
        tokio::time::timeout(WAIT, tokio::task::spawn_blocking(move || child.wait())).await;
    let Ok(status) = exited else {
        // SAFETY: as above; the waiting thread reaps it.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        panic!("tidegate-ca still running {WAIT:?} after SIGTERM");
    };
    let status = status.unwrap().unwrap();
    assert!(status.success(), "tidegate-ca at SIGTERM: {status}");
}
