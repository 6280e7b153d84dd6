use std::io::Write;

use prometheus_client::registry::Registry;
use tokio::io::AsyncReadExt;

use super::*;
use crate::limits::ControlMetrics;

/// A probe whose slot is taken before its task first runs — a half-sent
/// request queued right behind it while the accept loop ran ahead — is
/// answered all the same, with `Connection: close`; the half-sent one keeps
/// the slot.
#[tokio::test]
async fn a_probe_evicted_before_it_was_read_is_answered_and_closed() {
    let mut registry = Registry::default();
    let metrics = ControlMetrics::register(&mut registry);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_trigger, drain) = tidegate_base::shutdown::channel();
    let limits = HttpLimits {
        connections: ConnLimit::new("readiness", 1, &metrics),
        header_read_timeout: Duration::from_secs(60),
    };
    tokio::spawn(serve(
        listener,
        Arc::new(()),
        |_, _| async { text(StatusCode::OK, "ready\n") },
        limits,
        drain,
    ));
    // Both wait in the backlog before the server runs at all (one thread):
    // it accepts the probe, then the half-sent request, which takes the
    // probe's slot before the probe's task is first polled.
    let mut probe = std::net::TcpStream::connect(addr).unwrap();
    write!(probe, "GET /healthz/ready HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let mut slow = std::net::TcpStream::connect(addr).unwrap();
    write!(slow, "GET /healthz/ready HTTP/1.1\r\nHost").unwrap();

    probe.set_nonblocking(true).unwrap();
    let mut probe = tokio::net::TcpStream::from_std(probe).unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(20), probe.read_to_string(&mut answer))
        .await
        .expect("the probe's connection is closed after its answer")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "an evicted connection closes after its answer: {answer}"
    );
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(r#"control_refusals_total{listener="readiness",reason="evicted"} 1"#),
        "{text}"
    );
    drop(slow);
}
