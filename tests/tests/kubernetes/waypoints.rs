//! Waypoints from istiod: traffic to a Service or a workload with a
//! waypoint goes over HBONE to the waypoint with the original destination
//! as the CONNECT authority; the waypoint's own traffic goes straight on;
//! a waypoint on another network refuses the connection — never around it.
//! The waypoint here is a minimal HBONE server holding the waypoint's
//! identity, which records each CONNECT's authority and echoes its bytes.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tidegate_e2e::xds_double::XdsDouble;
use tidegate_e2e::{ip, metric_or_zero, round_trip, Capture};
use tidegate_protocol::identity::SpiffeId;
use tidegate_protocol::tls::DevCa;
use tidegate_xds::client::ADDRESS;

use super::istio_source::{
    config, encode_workload, gateway_at, serves, service_resource, uid, workload,
};
use super::{hbone_port, ready_gateway, WAIT};

/// An HBONE server as a waypoint: the CONNECT authorities it was asked for.
async fn waypoint(at: IpAddr, ca_dir: &std::path::Path) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let ca = DevCa::open(ca_dir, Duration::from_secs(3600)).unwrap();
    let id = SpiffeId::new("cluster.local", "demo", "waypoint");
    let (cert, key) = ca.mint_pem(&id).unwrap();
    let chain = vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let mut cfg = rustls::ServerConfig::builder_with_provider(tidegate_protocol::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let tls = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind((at, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (tls, record) = (tls.clone(), record.clone());
            tokio::spawn(async move {
                let Ok(stream) = tls.accept(tcp).await else {
                    return;
                };
                let Ok(mut conn) = h2::server::handshake(stream).await else {
                    return;
                };
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    let authority = req
                        .uri()
                        .authority()
                        .map(|a| a.to_string())
                        .unwrap_or_default();
                    record.lock().unwrap().push(authority);
                    tokio::spawn(async move {
                        let ok = http::Response::builder().status(200).body(()).unwrap();
                        let Ok(mut send) = respond.send_response(ok, false) else {
                            return;
                        };
                        let mut body = req.into_body();
                        while let Some(Ok(chunk)) = body.data().await {
                            let _ = body.flow_control().release_capacity(chunk.len());
                            if send.send_data(chunk, false).is_err() {
                                return;
                            }
                        }
                        let _ = send.send_data(Bytes::new(), true);
                    });
                }
            });
        }
    });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_goes_through_the_waypoint_with_the_original_destination() {
    tidegate_e2e::init_tracing();
    let octet = 138;
    let vip: IpAddr = format!("10.96.{octet}.1").parse().unwrap();
    let remote_vip: IpAddr = format!("10.96.{octet}.2").parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (wp_addr, authorities) = waypoint(ip(octet, 5), &dir.path().join("ca")).await;
    let double = XdsDouble::start().await;
    let mut echo = workload("echo", "node-b", ip(octet, 2), serves("echo", 8080));
    echo.waypoint = Some(gateway_at(ip(octet, 5), 15008, ""));
    let mut waypoint_pod = workload("waypoint", "node-a", ip(octet, 5), BTreeMap::new());
    waypoint_pod.service_account = "waypoint".into();
    for (name, w) in [
        (
            "client",
            workload("client", "node-a", ip(octet, 3), BTreeMap::new()),
        ),
        ("echo", echo),
        ("waypoint", waypoint_pod),
    ] {
        double.set_quietly(ADDRESS, &uid(name), encode_workload(w));
    }
    let wp = Some(gateway_at(ip(octet, 5), 15008, ""));
    double.set_quietly(
        ADDRESS,
        "demo/echo.demo.svc.cluster.local",
        service_resource("echo", vip, 8080, &[], wp),
    );
    let elsewhere = Some(gateway_at(ip(octet, 6), 15008, "network-2"));
    double.set_quietly(
        ADDRESS,
        "demo/far.demo.svc.cluster.local",
        service_resource("far", remote_vip, 8080, &[], elsewhere),
    );
    let client = ready_gateway(config(
        dir.path(),
        "node-a",
        &double,
        &hbone_port(wp_addr.port()),
    ))
    .await;
    let snap = client.workloads.snapshot();
    let svc = snap.service_by_vip(vip, 80).expect("the Service");
    assert_eq!(svc.spec.waypoints.len(), 1, "its waypoint: {:?}", svc.spec);
    drop(snap);

    // Service-addressed: to the waypoint, authority the VIP:port.
    let to_vip = Capture::start(client.outbound.clone(), SocketAddr::new(vip, 80)).await;
    let mut conn = to_vip.connect(ip(octet, 3)).await;
    assert_eq!(round_trip(&mut conn, b"via").await.unwrap(), b"via");
    drop(conn);
    // Workload-addressed: to the waypoint, authority the pod's address.
    let pod = SocketAddr::new(ip(octet, 2), 8080);
    let to_pod = Capture::start(client.outbound.clone(), pod).await;
    let mut conn = to_pod.connect(ip(octet, 3)).await;
    assert_eq!(round_trip(&mut conn, b"pod").await.unwrap(), b"pod");
    drop(conn);
    assert_eq!(
        *authorities.lock().unwrap(),
        [format!("{vip}:80"), pod.to_string()]
    );

    // The waypoint's own traffic to the pod is not sent back to itself.
    if let Ok(mut conn) = to_pod.try_connect(ip(octet, 5)).await {
        let _ = tokio::time::timeout(WAIT, round_trip(&mut conn, b"own")).await;
    }
    assert_eq!(authorities.lock().unwrap().len(), 2, "not through itself");

    // A waypoint on another network: refused, not sent around it.
    let far = Capture::start(client.outbound.clone(), SocketAddr::new(remote_vip, 80)).await;
    // (The refusal resets the connection, possibly before it completes.)
    if let Ok(mut conn) = far.try_connect(ip(octet, 3)).await {
        let got = tokio::time::timeout(WAIT, round_trip(&mut conn, b"far"))
            .await
            .unwrap();
        assert!(got.map_or(true, |b| b.is_empty()), "refused");
    }
    let text = client.metrics_text();
    for (result, n) in [
        ("routed", 2.0),
        ("from_waypoint", 1.0),
        ("waypoint_other_network", 1.0),
    ] {
        assert_eq!(
            metric_or_zero(
                &text,
                &format!("tidegate_outbound_waypoint_total{{result=\"{result}\"}}")
            ),
            n,
            "{result}\n{text}"
        );
    }
    client.shutdown().await;
}
