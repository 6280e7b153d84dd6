//! `tidegate-cni`, the real binary, with real CNI environment variables and
//! stdin configuration, against a gateway started in-process.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const CNI: &str = env!("CARGO_BIN_EXE_tidegate-cni");

fn cni(command: &str, conf: &str, uid: &str) -> std::process::Child {
    let mut child = Command::new(CNI)
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", "c0ffee")
        .env("CNI_NETNS", "/var/run/netns/test")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/opt/cni/bin")
        .env(
            "CNI_ARGS",
            format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME=web-0;K8S_POD_UID={uid}"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.as_bytes())
        .unwrap();
    child
}

fn run(command: &str, conf: &str, uid: &str) -> Output {
    cni(command, conf, uid).wait_with_output().unwrap()
}

fn conf(socket: &Path, timeout_ms: u64) -> String {
    format!(
        r#"{{"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "tidegate-cni",
            "socket": "{}", "timeout_ms": {timeout_ms},
            "prevResult": {{"cniVersion": "1.0.0", "interfaces": [{{"name": "eth0"}}],
                            "ips": [{{"address": "10.1.2.3/24", "interface": 0}}]}}}}"#,
        socket.display()
    )
}

#[test]
fn version_add_check_follow_the_spec() {
    let out = run("VERSION", "", "");
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["supportedVersions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x == "1.0.0"));

    let dir = tempfile::tempdir().unwrap();
    let c = conf(&dir.path().join("none.sock"), 100);
    let out = run("ADD", &c, "u1");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let want: serde_json::Value = serde_json::from_str(&c).unwrap();
    assert_eq!(
        got, want["prevResult"],
        "ADD passes the previous result through untouched"
    );

    let out = run("CHECK", &c, "u1");
    assert!(out.status.success() && out.stdout.is_empty());

    let out = run(
        "ADD",
        r#"{"cniVersion": "1.0.0", "name": "n", "type": "tidegate-cni"}"#,
        "u1",
    );
    assert!(!out.status.success());
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["code"], 7);
    assert!(e["msg"].as_str().unwrap().contains("chained"));

    let out = run(
        "ADD",
        r#"{"cniVersion": "0.1.0", "name": "n", "prevResult": {}}"#,
        "u1",
    );
    assert!(!out.status.success());
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["code"], 1);
}

#[test]
fn del_never_blocks_on_a_missing_or_silent_gateway() {
    let dir = tempfile::tempdir().unwrap();
    // Nobody listens.
    let out = run("DEL", &conf(&dir.path().join("absent.sock"), 200), "u1");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not drained, deletion goes on"));
    // Someone listens but never answers: bounded by timeout_ms.
    let path = dir.path().join("silent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let holder = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_secs(3));
        drop(s);
    });
    let out = run("DEL", &conf(&path, 200), "u1");
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not drained, deletion goes on"), "{err}");
    holder.join().unwrap();
}

fn plugin(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/plugins")
        .join(format!("{name}.wasm"));
    assert!(
        p.exists(),
        "{} missing: run `cargo xtask plugins`",
        p.display()
    );
    p
}

#[test]
fn del_waits_for_the_gateway_to_drain_the_pod() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let echo = tokio::net::TcpListener::bind("127.52.0.2:0").await.unwrap();
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
        std::fs::write(&wl, "workloads:\n- {uid: pod-uid, name: web-0, namespace: demo, service_account: web, ips: [127.52.0.2], node: n}\n").unwrap();
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
            tidegate::tls::DevCa::open(&dir.path().join("ca"), Duration::from_secs(600)).unwrap(),
        );
        let tls = tidegate::tls::TlsContext::new(ca, "cluster.local", Default::default());
        let via = SocketAddr::new(echo_addr.ip(), app.addrs.inbound.port());
        let id = |sa: &str| tidegate::identity::SpiffeId::new("cluster.local", "demo", sa);
        let (send, conn) = tidegate::hbone::client::dial(&tls, &Default::default(), &id("client"), &id("web"), via)
            .await
            .unwrap();
        tokio::spawn(conn);
        let (mut tx, mut rx) = tidegate::hbone::client::connect_stream(send, echo_addr, Duration::from_secs(5))
            .await
            .unwrap();
        tx.send_data(bytes::Bytes::from_static(b"ping"), false).unwrap();
        assert_eq!(&rx.data().await.unwrap().unwrap()[..], b"ping");

        // DEL: the plugin must wait while the stream is open.
        let c = conf(&socket, 15_000);
        let child = tokio::task::spawn_blocking(move || run("DEL", &c, "pod-uid"));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !app.registry.dump().iter().any(|t| t.draining.is_some()) {
            assert!(tokio::time::Instant::now() < deadline, "the DEL never reached the gateway");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(!child.is_finished(), "DEL must wait for the drain");
        // The stream ends: the teardown is acknowledged and DEL returns.
        tx.send_data(bytes::Bytes::new(), true).unwrap();
        while let Some(chunk) = rx.data().await {
            let _ = chunk;
        }
        let out = tokio::time::timeout(Duration::from_secs(10), child).await.unwrap().unwrap();
        assert!(out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("drained") && err.contains("\"result\":\"idle\""), "{err}");
        let m = app.metrics_text();
        assert!(m.contains(r#"tidegate_drain_started_total{policy="p",trigger="cni"} 1"#), "{m}");
    });
}
