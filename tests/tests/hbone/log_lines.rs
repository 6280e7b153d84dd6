//! What the logs say about refusals and failures: who and why. Each test
//! runs on a current-thread runtime, so every task of both gateways logs
//! on the test's thread, where a capturing subscriber is the default (set
//! before the runtime is built, and kept until it is gone with its tasks).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tidegate_e2e::{eventually, ip, Options, TwoNodes};
use tokio::io::AsyncReadExt;

use super::rejections::{connect, request};

/// The lines logged on the test's thread at `info` and above.
#[derive(Clone)]
struct Logs(Arc<Mutex<Vec<u8>>>);

struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Runs `test` on a current-thread runtime with a capturing subscriber
    /// as the thread's default; the runtime, with every task of both
    /// gateways and their spans, is gone before the subscriber is.
    fn run<F: std::future::Future<Output = ()>>(test: impl FnOnce(Logs) -> F) {
        let logs = Logs(Arc::new(Mutex::new(Vec::new())));
        let sink = logs.0.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        let _default = tracing::subscriber::set_default(subscriber);
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(test(logs));
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// The first line containing every one of `needles`.
    fn line_with(&self, needles: &[&str]) -> Option<String> {
        self.text()
            .lines()
            .find(|l| needles.iter().all(|n| l.contains(n)))
            .map(str::to_owned)
    }

    async fn wait_line(&self, needles: &[&str]) -> String {
        let mut found = None;
        eventually(
            &format!("a log line with {needles:?}"),
            Duration::from_secs(10),
            || {
                found = self.line_with(needles);
                found.is_some()
            },
        )
        .await;
        found.unwrap()
    }
}

/// A client without a certificate is refused: a line at `info` says so,
/// with its address and the reason.
#[test]
fn a_refused_handshake_is_logged_with_the_peer_and_why() {
    Logs::run(|logs| async move {
        let nodes = TwoNodes::start(89).await;
        let addr = SocketAddr::new(
            nodes.echo.ip(),
            nodes.server.addrs.inbound.expect("node listeners").port(),
        );
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let me = tcp.local_addr().unwrap();
        let cfg = rustls::ClientConfig::builder_with_provider(tidegate_protocol::tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(super::rejections::AcceptAnyServer))
            .with_no_client_auth();
        let server_name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
        if let Ok(mut tls) = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(server_name, tcp)
            .await
        {
            let mut buf = [0u8; 1];
            let _ = tls.read(&mut buf).await;
        }
        let line = logs
            .wait_line(&["inbound tls handshake refused", "no_client_cert"])
            .await;
        assert!(line.contains(" INFO "), "{line}");
        assert!(line.contains(&format!("peer.addr={me}")), "{line}");
    })
}

/// The client gateway expects another identity than the server presents:
/// the failed dial's access line names both identities it knew.
#[test]
fn a_failed_outbound_dial_names_both_identities() {
    Logs::run(|logs| async move {
        let nodes = TwoNodes::with(
            90,
            Options {
                client_view_of_echo_sa: "impostor".into(),
                ..Default::default()
            },
        )
        .await;
        if let Ok(mut tcp) = nodes.capture.try_connect(nodes.client_ip).await {
            let mut buf = Vec::new();
            let _ = tcp.read_to_end(&mut buf).await;
        }
        let line = logs
            .wait_line(&[
                "tidegate::access",
                "direction=\"outbound\"",
                "unexpected_identity",
            ])
            .await;
        assert!(
            line.contains("src.identity=\"spiffe://cluster.local/ns/demo/sa/client\""),
            "{line}"
        );
        assert!(
            line.contains("dst.identity=\"spiffe://cluster.local/ns/demo/sa/impostor\""),
            "{line}"
        );
    })
}

/// Refused or served, an inbound access line names the port the CONNECT
/// asked for, never the tunnel's.
#[test]
fn the_inbound_access_line_names_the_app_port_refused_or_not() {
    Logs::run(|logs| async move {
        let nodes = TwoNodes::start(91).await;
        let o = nodes.octet;
        let tunnel_port = format!(
            ":{}",
            nodes.server.addrs.inbound.expect("node listeners").port()
        );
        // Unreachable: nothing listens on this port of the echo workload.
        let closed = {
            let l = std::net::TcpListener::bind(SocketAddr::new(ip(o, 2), 0)).unwrap();
            l.local_addr().unwrap()
        };
        request(&nodes, 2, "echo", connect(&closed.to_string())).await;
        let line = logs
            .wait_line(&["direction=\"inbound\"", "upstream_unreachable"])
            .await;
        assert!(line.contains(&format!("dst.addr={closed} ")), "{line}");
        // Denied by the workload's allow list, before any dial.
        let locked = SocketAddr::new(ip(o, 5), 8080);
        request(&nodes, 5, "locked", connect(&locked.to_string())).await;
        let line = logs
            .wait_line(&["direction=\"inbound\"", "result=\"denied\""])
            .await;
        assert!(line.contains(&format!("dst.addr={locked} ")), "{line}");
        // Served.
        let mut tcp = nodes.app_conn().await;
        tidegate_e2e::round_trip(&mut tcp, b"x").await.unwrap();
        drop(tcp);
        let line = logs
            .wait_line(&["direction=\"inbound\"", "result=\"ok\""])
            .await;
        assert!(
            line.contains(&format!("dst.addr={} ", nodes.echo)),
            "{line}"
        );
        let text = logs.text();
        for l in text.lines().filter(|l| l.contains("tidegate::access")) {
            // The event's field, after the span's (the address the tunnel dialed).
            let dst = l
                .rsplit("dst.addr=")
                .next()
                .and_then(|r| r.split(' ').next());
            assert!(
                dst.is_some_and(|d| !d.ends_with(&tunnel_port)),
                "the tunnel's port logged as the destination: {l}"
            );
        }
    })
}

/// A connection to a Service whose first endpoint refused the CONNECT
/// (no application behind it: 503) and went to another: its access line
/// names the VIP, the refused try with its reason, and the endpoint that
/// took it.
#[test]
fn a_connection_retried_on_another_endpoint_names_both_in_its_access_line() {
    Logs::run(|logs| async move {
        let octet = 171;
        let opts = Options {
            client_yaml:
                "outbound:\n  failing_skip: 0s\n  endpoint_choice: random\n  connect_attempts: 2\n"
                    .into(),
            ..Default::default()
        };
        // e3 has no application: its gateway answers every CONNECT 503.
        let s = super::services::Svc::start_with(octet, opts, 4).await;
        let refused = format!(
            "refused_tries=\"e3 at {}: status_503\"",
            SocketAddr::new(ip(octet, 13), s.port)
        );
        // A random choice: e3 comes first in one connection of four.
        for _ in 0..80 {
            s.call().await.expect("retried on another endpoint");
            if logs.line_with(&[&refused]).is_some() {
                break;
            }
        }
        let line = logs
            .wait_line(&["tidegate::access", "direction=\"outbound\"", &refused])
            .await;
        assert!(
            line.contains(&format!("dst.addr={}:80 ", ip(octet, 100))),
            "{line}"
        );
        assert!(line.contains("result=\"ok\""), "{line}");
        let took = (0..3).any(|i| {
            let addr = SocketAddr::new(ip(octet, 10 + i), s.port);
            line.contains(&format!("endpoint=\"e{i} at {addr}\""))
        });
        assert!(took, "the endpoint that took it: {line}");
        // Every connection through the VIP names the endpoint it went to.
        let text = logs.text();
        let outbound: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("tidegate::access") && l.contains("direction=\"outbound\""))
            .collect();
        assert!(!outbound.is_empty());
        for l in outbound {
            assert!(l.contains("endpoint=\"e"), "{l}");
        }
    })
}
