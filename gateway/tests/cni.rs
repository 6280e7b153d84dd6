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
        while !app.tunnels.dump().iter().any(|t| t.draining.is_some()) {
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

// ---- `tidegate-cni install` / `uninstall` against real directories ----

const FLANNEL: &str = r#"{
  "name": "cbr0",
  "cniVersion": "1.0.0",
  "plugins": [
    {"type": "flannel", "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}"#;

fn admin(command: &str, bin: &Path, conf: &Path, extra: &[&str]) -> Output {
    Command::new(CNI)
        .env_remove("CNI_COMMAND")
        .arg(command)
        .arg("--cni-bin-dir")
        .arg(bin)
        .arg("--cni-conf-dir")
        .arg(conf)
        .args(extra)
        .output()
        .unwrap()
}

fn json_file(p: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

#[test]
fn install_chains_after_the_primary_plugin_and_uninstall_restores_it() {
    let dir = tempfile::tempdir().unwrap();
    let (bin, conf) = (dir.path().join("bin"), dir.path().join("net.d"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::write(conf.join("10-flannel.conflist"), FLANNEL).unwrap();
    // Not the primary (lexically later): must stay untouched.
    std::fs::write(
        conf.join("99-loopback.conf"),
        r#"{"cniVersion":"1.0.0","name":"lo","type":"loopback"}"#,
    )
    .unwrap();

    let out = admin(
        "install",
        &bin,
        &conf,
        &["--socket", "/run/tg.sock", "--timeout-ms", "5000"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list = json_file(&conf.join("10-flannel.conflist"));
    let plugins = list["plugins"].as_array().unwrap();
    assert_eq!(plugins.len(), 3);
    assert_eq!(
        plugins[0]["type"], "flannel",
        "the primary plugin stays first"
    );
    assert_eq!(
        plugins[0]["delegate"]["hairpinMode"], true,
        "its settings are kept"
    );
    assert_eq!(
        plugins[2],
        serde_json::json!({"type": "tidegate-cni", "socket": "/run/tg.sock", "timeout_ms": 5000})
    );
    assert_eq!(
        json_file(&conf.join("99-loopback.conf"))["type"],
        "loopback"
    );

    // The installed binary is executable and is the plugin.
    let installed = bin.join("tidegate-cni");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&installed).unwrap().permissions().mode() & 0o777,
        0o755
    );
    let v = Command::new(&installed)
        .env("CNI_COMMAND", "VERSION")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&v.stdout).contains("supportedVersions"));

    // Idempotent: a second run changes nothing and says nothing.
    let before = std::fs::read(conf.join("10-flannel.conflist")).unwrap();
    let out = admin(
        "install",
        &bin,
        &conf,
        &["--socket", "/run/tg.sock", "--timeout-ms", "5000"],
    );
    assert!(out.status.success());
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(
        std::fs::read(conf.join("10-flannel.conflist")).unwrap(),
        before
    );

    // The primary plugin rewrites its file (dropping us): install re-chains once.
    std::fs::write(conf.join("10-flannel.conflist"), FLANNEL).unwrap();
    let out = admin("install", &bin, &conf, &[]);
    assert!(out.status.success());
    let plugins = json_file(&conf.join("10-flannel.conflist"))["plugins"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(
        plugins
            .iter()
            .filter(|p| p["type"] == "tidegate-cni")
            .count(),
        1
    );

    let out = admin("uninstall", &bin, &conf, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want: serde_json::Value = serde_json::from_str(FLANNEL).unwrap();
    assert_eq!(json_file(&conf.join("10-flannel.conflist")), want);
    assert!(!installed.exists(), "uninstall removes the binary");
    // No temporary files left behind.
    let names: Vec<_> = std::fs::read_dir(&conf)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn a_single_plugin_conf_becomes_a_list_and_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let (bin, conf) = (dir.path().join("bin"), dir.path().join("net.d"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&conf).unwrap();
    let single = r#"{"cniVersion": "0.4.0", "name": "mynet", "type": "bridge", "bridge": "cni0"}"#;
    std::fs::write(conf.join("10-bridge.conf"), single).unwrap();

    let out = admin("install", &bin, &conf, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!conf.join("10-bridge.conf").exists());
    let list = json_file(&conf.join("10-bridge.conflist"));
    assert_eq!(list["cniVersion"], "0.4.0");
    assert_eq!(list["name"], "mynet");
    assert_eq!(list["plugins"][0]["bridge"], "cni0");
    assert_eq!(list["plugins"][1]["type"], "tidegate-cni");

    let out = admin("uninstall", &bin, &conf, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(conf.join("10-bridge.conf")).unwrap(),
        single
    );
    assert!(!conf.join("10-bridge.conflist").exists());
}

#[test]
fn install_refuses_clearly_without_a_primary_configuration_or_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let (bin, conf) = (dir.path().join("bin"), dir.path().join("net.d"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&conf).unwrap();
    let out = admin("install", &bin, &conf, &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no CNI network configuration") && err.contains("net.d"),
        "{err}"
    );

    std::fs::write(conf.join("10-broken.conflist"), "{not json").unwrap();
    let out = admin("install", &bin, &conf, &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("10-broken.conflist"));

    let out = Command::new(CNI)
        .env_remove("CNI_COMMAND")
        .args(["install", "--watch", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--watch"));
}
