//! CNI DEL through the real `tidegate-cni` against a gateway in-process:
//! the plugin's DEL is held while the pod's tunnel drains and returns with
//! the gateway's acknowledgement. (The plugin against fake gateways is
//! `cni/tests/cni.rs`; in network namespaces, `tests/tests/netns_drains.rs`.)

use std::net::SocketAddr;
use std::time::Duration;

use tidegate_e2e::{eventually, ip, plugin};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn del_waits_for_the_gateway_to_drain_the_pod() {
    let dir = tempfile::tempdir().unwrap();
    let pod_ip = ip(52, 2);
    let echo = tokio::net::TcpListener::bind(SocketAddr::new(pod_ip, 0))
        .await
        .unwrap();
    let echo_addr = echo.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let wl = dir.path().join("w.yaml");
    std::fs::write(
        &wl,
        format!("workloads:\n- {{uid: pod-uid, name: web-0, namespace: demo, service_account: web, ips: [{pod_ip}], node: n}}\n"),
    )
    .unwrap();
    let socket = dir.path().join("cni.sock");
    let cfg = tidegate::config::Config::from_yaml(&format!(
        "node_name: n\nlisteners: {{outbound: 127.0.0.1:0, inbound: 0.0.0.0:0, admin: 127.0.0.1:0, metrics: 127.0.0.1:0, readiness: 127.0.0.1:0}}\n\
         certificates: {{source: dev-ca, state_dir: {ca}}}\nworkloads: {{file: {wl}}}\n\
         drains: {{cni_socket: {sock}}}\n\
         policies:\n  default: p\n  plugins:\n    p: {{file: {p}, config: '{{\"hold-ms\": 20000}}'}}\n",
        ca = dir.path().join("ca").display(),
        wl = wl.display(),
        sock = socket.display(),
        p = plugin("drain-at-teardown").display(),
    ))
    .unwrap();
    let app = tidegate::app::build(cfg).await.unwrap();

    // A client holds one stream to the pod over HBONE.
    let ca = std::sync::Arc::new(
        tidegate_protocol::tls::DevCa::open(&dir.path().join("ca"), Duration::from_secs(600))
            .unwrap(),
    );
    let tls = tidegate_protocol::tls::TlsContext::new(ca, "cluster.local", Default::default());
    let via = SocketAddr::new(pod_ip, app.addrs.inbound.expect("node listeners").port());
    let id = |sa: &str| tidegate_protocol::identity::SpiffeId::new("cluster.local", "demo", sa);
    let (send, conn) = tidegate_protocol::hbone::client::dial(
        &tls,
        &Default::default(),
        &id("client"),
        &id("web"),
        via,
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let (mut tx, mut rx) =
        tidegate_protocol::hbone::client::connect_stream(send, echo_addr, Duration::from_secs(5))
            .await
            .unwrap();
    tx.send_data(bytes::Bytes::from_static(b"ping"), false)
        .unwrap();
    assert_eq!(&rx.data().await.unwrap().unwrap()[..], b"ping");

    // DEL: the plugin must wait while the stream is open.
    let bin = tidegate_e2e::cni::binary();
    let conf = tidegate_e2e::cni::del_conf(&socket, 15_000);
    let child = tokio::task::spawn_blocking(move || {
        tidegate_e2e::cni::spawn_del(&bin, "demo", "web-0", "pod-uid", &conf)
            .unwrap()
            .wait_with_output()
            .unwrap()
    });
    eventually(
        "the DEL reaches the gateway",
        Duration::from_secs(10),
        || app.tunnels.dump().iter().any(|t| t.draining.is_some()),
    )
    .await;
    assert!(!child.is_finished(), "DEL must wait for the drain");
    // The stream ends: the teardown is acknowledged and DEL returns.
    tx.send_data(bytes::Bytes::new(), true).unwrap();
    while let Some(chunk) = rx.data().await {
        let _ = chunk;
    }
    let out = tokio::time::timeout(Duration::from_secs(10), child)
        .await
        .unwrap()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("drained") && err.contains("\"result\":\"idle\""),
        "{err}"
    );
    let m = app.metrics_text();
    assert!(
        m.contains(r#"tidegate_drain_started_total{policy="p",trigger="cni"} 1"#),
        "{m}"
    );
}
