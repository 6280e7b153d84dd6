//! Certificates reloaded under live tunnels, keepalive, admin endpoints and
//! shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::raw_h2::{self, DATA, GOAWAY, HEADERS, PING, RST_STREAM};
use tidegate_e2e::{eventually, http_get, ip, metric, round_trip, Options, TwoNodes};
use tidegate_protocol::hbone::client::{connect_stream, dial};
use tidegate_protocol::hbone::Settings;
use tidegate_protocol::identity::SpiffeId;
use tidegate_protocol::tls::{CertDir, DevCa, TlsContext, TlsMetrics};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn sa(name: &str) -> SpiffeId {
    SpiffeId::new("cluster.local", "demo", name)
}

fn write_pair(ca: &DevCa, dir: &std::path::Path, name: &str) {
    let (cert, key) = ca.mint_pem(&sa(name)).unwrap();
    // Key first, then certificate: a poll between the two sees a mismatched
    // pair at worst for one interval, never a certificate without its key.
    std::fs::write(dir.join(format!("{name}.key.tmp")), key).unwrap();
    std::fs::write(dir.join(format!("{name}.crt.tmp")), cert).unwrap();
    std::fs::rename(
        dir.join(format!("{name}.key.tmp")),
        dir.join(format!("{name}.key")),
    )
    .unwrap();
    std::fs::rename(
        dir.join(format!("{name}.crt.tmp")),
        dir.join(format!("{name}.crt")),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_directory_reloads_without_dropping_tunnels() {
    let certs = tempfile::tempdir().unwrap();
    let ca = DevCa::new(Duration::from_secs(600)).unwrap();
    std::fs::write(certs.path().join("bundle.pem"), ca.root_pem()).unwrap();
    let dir = certs.path().join("certs");
    std::fs::create_dir(&dir).unwrap();
    write_pair(&ca, &dir, "echo");
    write_pair(&ca, &dir, "client");
    let nodes = TwoNodes::with(
        41,
        Options {
            certificates: Some(format!(
                "{{source: dir, dir: {}, trust_bundle: {}, reload_interval: 20ms}}",
                dir.display(),
                certs.path().join("bundle.pem").display()
            )),
            ..Default::default()
        },
    )
    .await;
    let mut held = nodes.app_conn().await;
    assert_eq!(round_trip(&mut held, b"before").await.unwrap(), b"before");

    // What the server presents to a new tunnel, seen by a verifying client.
    let verifier_source = CertDir::load(&dir, &certs.path().join("bundle.pem")).unwrap();
    let tls = TlsContext::new(
        verifier_source.clone(),
        "cluster.local",
        TlsMetrics::default(),
    );
    let hbone_addr = SocketAddr::new(
        ip(41, 2),
        nodes.server.addrs.inbound.expect("node listeners").port(),
    );
    let presented = || async {
        let tcp = TcpStream::connect(hbone_addr).await.unwrap();
        let s = tls
            .connect(&sa("client"), &sa("echo"), hbone_addr.ip(), tcp)
            .await
            .unwrap();
        s.get_ref().1.peer_certificates().unwrap()[0].clone()
    };
    let before = presented().await;

    write_pair(&ca, &dir, "echo");
    let (presented, before) = (&presented, &before);
    tidegate_e2e::wait_for(
        "the new certificate to be presented",
        Duration::from_secs(10),
        move || async move { (presented().await != *before).then_some(()) },
    )
    .await;
    // The tunnel established with the old certificate still carries its stream.
    assert_eq!(round_trip(&mut held, b"after").await.unwrap(), b"after");
    assert_eq!(
        metric(
            &nodes.client.metrics_text(),
            "tidegate_pool_tunnels_opened_total"
        ),
        1.0
    );

    // A broken file set is refused and the previous certificates stay.
    std::fs::write(dir.join("echo.crt"), "not a certificate").unwrap();
    let err = verifier_source.reload().unwrap_err().to_string();
    assert!(err.contains("echo.crt"), "the error names the file: {err}");
    assert_eq!(verifier_source.identities(), vec![sa("client"), sa("echo")]);
    let mut fresh = nodes.app_conn().await;
    assert_eq!(round_trip(&mut fresh, b"x").await.unwrap(), b"x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_closes_a_peer_that_stops_answering() {
    let nodes = TwoNodes::with(
        42,
        Options {
            server_yaml: "  keepalive_interval: 100ms\n  keepalive_timeout: 200ms\n".into(),
            ..Default::default()
        },
    )
    .await;
    let ca = Arc::new(DevCa::open(&nodes.ca_dir(), Duration::from_secs(600)).unwrap());
    let tls = TlsContext::new(ca, "cluster.local", TlsMetrics::default());
    let addr = SocketAddr::new(
        ip(42, 2),
        nodes.server.addrs.inbound.expect("node listeners").port(),
    );
    let (send, mut conn) = dial(&tls, &Settings::default(), &sa("client"), &sa("echo"), addr)
        .await
        .unwrap();
    // Drive the connection only until one stream is up, then go silent:
    // the server's PINGs are never answered.
    let stream = tokio::select! {
        s = connect_stream(send, nodes.echo, Duration::from_secs(5)) => s.unwrap(),
        r = &mut conn => panic!("connection ended early: {r:?}"),
    };
    assert_eq!(nodes.server.tunnels.len(), 1);
    eventually(
        "server closed the silent tunnel",
        Duration::from_secs(10),
        || nodes.server.tunnels.is_empty(),
    )
    .await;
    assert_eq!(
        metric(
            &nodes.server.metrics_text(),
            r#"tidegate_connections_failed_total{direction="inbound",reason="keepalive_timeout"}"#
        ),
        1.0
    );
    drop((stream, conn));
    // Everybody else is still served.
    let mut tcp = nodes.app_conn().await;
    assert_eq!(round_trip(&mut tcp, b"ok").await.unwrap(), b"ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_show_tunnels_streams_and_readiness() {
    let nodes = TwoNodes::start(43).await;
    let mut held = nodes.app_conn().await;
    assert_eq!(round_trip(&mut held, b"hello").await.unwrap(), b"hello");

    let (status, body) = http_get(nodes.server.addrs.admin, "/config_dump").await;
    assert_eq!(status, 200);
    let dump: serde_json::Value = serde_json::from_str(&body).unwrap();
    let tunnels = dump["inbound_tunnels"].as_array().unwrap();
    assert_eq!(tunnels.len(), 1, "{body}");
    assert_eq!(tunnels[0]["workload_uid"], "echo-uid");
    assert_eq!(tunnels[0]["streams"], 1);
    assert_eq!(
        tunnels[0]["peer_identity"],
        "spiffe://cluster.local/ns/demo/sa/client"
    );
    assert!(dump["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .any(|w| w["uid"] == "echo-uid"));

    let (_, body) = http_get(nodes.client.addrs.admin, "/config_dump").await;
    let dump: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(dump["pool"][0]["streams"], 1, "{body}");

    let (status, body) = http_get(nodes.server.addrs.readiness, "/healthz/ready").await;
    assert_eq!((status, body.as_str()), (200, "ready\n"));
    let (status, body) = http_get(nodes.server.addrs.metrics, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(
        metric(&body, r#"tidegate_streams_open{direction="inbound"}"#),
        1.0
    );
    let (status, body) = http_get(nodes.server.addrs.admin, "/nope").await;
    assert_eq!(status, 404);
    assert!(body.contains("/config_dump"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_refuses_new_connections_and_waits_for_open_streams() {
    let TwoNodes {
        dir: _dir,
        server,
        client,
        capture,
        client_ip,
        ..
    } = TwoNodes::start(44).await;
    let mut held = capture.connect(client_ip).await;
    assert_eq!(round_trip(&mut held, b"one").await.unwrap(), b"one");
    let inbound = SocketAddr::new(
        ip(44, 2),
        server.addrs.inbound.expect("node listeners").port(),
    );
    let readiness = server.addrs.readiness;
    let (status, _) = http_get(readiness, "/healthz/ready").await;
    assert_eq!(status, 200);

    let shutdown = tokio::spawn(server.shutdown());
    eventually("inbound listener closed", Duration::from_secs(5), || {
        std::net::TcpStream::connect(inbound).is_err()
    })
    .await;
    // The open stream still works while the gateway drains...
    assert_eq!(round_trip(&mut held, b"two").await.unwrap(), b"two");
    assert!(
        !shutdown.is_finished(),
        "shutdown must wait for the open stream"
    );
    // Draining: not ready for new traffic, but alive (a liveness probe must
    // not kill a gateway that is draining).
    let (status, _) = http_get(readiness, "/healthz/ready").await;
    assert_eq!(status, 503);
    let (status, body) = http_get(readiness, "/healthz/live").await;
    assert_eq!((status, body.as_str()), (200, "live\n"));
    // ...and shutdown completes once it ends.
    held.shutdown().await.unwrap();
    let mut rest = Vec::new();
    held.read_to_end(&mut rest).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), shutdown)
        .await
        .expect("shutdown returns when the last stream ends")
        .unwrap();
    drop(client);
}

/// A stream a peer sends on a tunnel after the gateway began to stop, but
/// before the peer read its GOAWAY, is served; and shutdown returns only
/// once that tunnel's GOAWAY exchange is done (RFC 9113 §6.8: the GOAWAY,
/// its PING answered, the last stream id, the streams up to it ended), not
/// as soon as no stream is open. A gateway that returned earlier exits
/// under the tunnel and resets the stream, which the peer cannot retry
/// (re-adopting 1,000 pods, the old gateway's GOAWAY left 128 ms late and
/// 12 of the peer's connections failed so; docs/performance.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_serves_a_stream_sent_before_the_peer_read_the_goaway() {
    let nodes = TwoNodes::start(47).await;
    let echo = nodes.echo.to_string();
    let mut raw = raw_h2::connect(&nodes).await;
    let tunnels = nodes.server.tunnels.clone();
    eventually("the tunnel registered", Duration::from_secs(5), || {
        tunnels.len() == 1
    })
    .await;
    let TwoNodes {
        dir: _dir,
        server,
        client: _client,
        ..
    } = nodes;
    let left_at_return = {
        let tunnels = tunnels.clone();
        tokio::spawn(async move {
            server.shutdown().await;
            tunnels.len()
        })
    };
    let goaway = raw.until("the graceful GOAWAY", |f| f.kind == GOAWAY).await;
    assert_eq!(goaway.error_code(), Some(0), "{goaway:?}");
    let ping = raw.until("the GOAWAY's PING", |f| f.kind == PING).await;
    // As if sent before the GOAWAY arrived: within its last stream id.
    let id = raw
        .open(&[(":method", "CONNECT"), (":authority", &echo)])
        .await;
    raw.ping_ack(&ping.payload).await;
    let answer = raw
        .until("the stream's answer", |f| {
            f.stream == id && (f.kind == HEADERS || f.kind == RST_STREAM)
        })
        .await;
    // 0x88: `:status: 200`, HPACK static table entry 8.
    assert_eq!(
        (answer.kind, answer.payload.first()),
        (HEADERS, Some(&0x88)),
        "the stream is answered 200, not reset: {answer:?}"
    );
    raw.data(id, b"x", true).await;
    raw.until("the echo", |f| {
        f.stream == id && f.kind == DATA && f.payload == b"x"
    })
    .await;
    let left = tokio::time::timeout(Duration::from_secs(10), left_at_return)
        .await
        .expect("shutdown returns once the tunnel has closed")
        .unwrap();
    assert_eq!(left, 0, "shutdown returned with the tunnel still open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cuts_streams_at_the_deadline() {
    let TwoNodes {
        dir: _dir,
        server,
        client,
        capture,
        client_ip,
        ..
    } = TwoNodes::with(
        45,
        Options {
            server_yaml: "shutdown:\n  deadline: 300ms\n".into(),
            ..Default::default()
        },
    )
    .await;
    let mut held = capture.connect(client_ip).await;
    assert_eq!(round_trip(&mut held, b"one").await.unwrap(), b"one");
    tokio::time::timeout(Duration::from_secs(10), server.shutdown())
        .await
        .expect("shutdown is bounded by its deadline");
    // The stream was cut: the application sees the end of it.
    let mut rest = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(10), held.read_to_end(&mut rest))
        .await
        .expect("the cut reaches the application");
    assert!(r.is_err() || rest.is_empty());
    drop(client);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_takes_new_connections_while_the_first_drains() {
    let TwoNodes {
        dir,
        server: old,
        client,
        capture,
        client_ip,
        ..
    } = TwoNodes::start(46).await;
    let mut held = capture.connect(client_ip).await;
    assert_eq!(round_trip(&mut held, b"old").await.unwrap(), b"old");
    // The upgrade: a new gateway binds the same HBONE port (SO_REUSEPORT).
    let port = old.addrs.inbound.expect("node listeners").port();
    let mut cfg = tidegate_e2e::gateway_config(
        "node-b",
        &dir.path().join("ca"),
        &dir.path().join("server-workloads.yaml"),
        15008,
        "",
    );
    cfg.listeners.inbound = SocketAddr::from(([0, 0, 0, 0], port));
    let new = tidegate::app::build(cfg).await.unwrap();
    assert_eq!(new.addrs.inbound.expect("node listeners").port(), port);
    let draining = tokio::spawn(old.shutdown());
    // The client's pooled tunnel gets GOAWAY from the old gateway; new
    // application connections ride a new tunnel, accepted by the new one.
    eventually("client sees GOAWAY", Duration::from_secs(5), || {
        client.pool.dump().iter().any(|t| t.goaway_received)
    })
    .await;
    let mut fresh = capture.connect(client_ip).await;
    assert_eq!(round_trip(&mut fresh, b"new").await.unwrap(), b"new");
    assert_eq!(new.tunnels.len(), 1, "the new gateway took the new tunnel");
    // The old gateway keeps serving its open stream until it ends.
    assert_eq!(round_trip(&mut held, b"still").await.unwrap(), b"still");
    assert!(!draining.is_finished());
    held.shutdown().await.unwrap();
    let mut rest = Vec::new();
    held.read_to_end(&mut rest).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), draining)
        .await
        .expect("the old gateway exits once its last stream ended")
        .unwrap();
    assert_eq!(round_trip(&mut fresh, b"after").await.unwrap(), b"after");
}

/// How a read on a stream that was cut ended: `eof` (a clean-looking
/// end), `reset`, or the error.
async fn end_of(tcp: &mut TcpStream) -> String {
    let mut rest = Vec::new();
    match tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut rest)).await {
        Err(_) => "still open".into(),
        Ok(Ok(_)) => "eof".into(),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => "reset".into(),
        Ok(Err(e)) => format!("{e}"),
    }
}

/// A long stream the shutdown deadline cuts ends the same way at both
/// ends — the client application's and the server application's — when
/// either gateway shuts down: reset (a TCP RST, carried between the
/// gateways as RST_STREAM(CANCEL)), never an end of stream that looks
/// clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_at_the_shutdown_deadline_is_reset_at_both_ends() {
    for (octet, which) in [(172, "server"), (173, "client")] {
        let deadline = "shutdown:\n  deadline: 300ms\n".to_string();
        let opts = if which == "server" {
            Options {
                server_yaml: deadline,
                ..Default::default()
            }
        } else {
            Options {
                client_yaml: deadline,
                ..Default::default()
            }
        };
        let nodes = TwoNodes::with(octet, opts).await;
        // The server application: answers once, then reports how its
        // connection ended.
        let app = tokio::net::TcpListener::bind(SocketAddr::new(ip(octet, 2), 0))
            .await
            .unwrap();
        let app_addr = app.local_addr().unwrap();
        let server_end = tokio::spawn(async move {
            let (mut tcp, _) = app.accept().await.unwrap();
            let mut buf = [0u8; 3];
            tcp.read_exact(&mut buf).await.unwrap();
            tcp.write_all(&buf).await.unwrap();
            end_of(&mut tcp).await
        });
        let capture = tidegate_e2e::Capture::start(nodes.client.outbound.clone(), app_addr).await;
        let mut client = capture.connect(nodes.client_ip).await;
        assert_eq!(round_trip(&mut client, b"one").await.unwrap(), b"one");
        let TwoNodes {
            dir: _dir,
            server,
            client: client_gw,
            ..
        } = nodes;
        let (stopping, _other) = if which == "server" {
            (server, client_gw)
        } else {
            (client_gw, server)
        };
        tokio::time::timeout(Duration::from_secs(10), stopping.shutdown())
            .await
            .expect("shutdown is bounded by its deadline");
        let client_end = end_of(&mut client).await;
        let server_end = server_end.await.unwrap();
        assert_eq!(
            (client_end.as_str(), server_end.as_str()),
            ("reset", "reset"),
            "{which} gateway shut down: client and server applications"
        );
    }
}
