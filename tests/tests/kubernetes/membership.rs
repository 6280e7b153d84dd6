//! Which pods `tidegate-cni` captures is what discovery decides is in the
//! mesh, by the same rule that makes them HBONE
//! (`tidegate::workloads::membership`): the real plugin asks a gateway
//! that discovers the pod and its namespace from the API server.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::json;
use tidegate_e2e::kube_api::{FakeApiServer, Kind};
use tidegate_e2e::{eventually, init_tracing, metric_or_zero};

use super::{config_head, namespace, until_ready, WAIT};

/// A pod as the kubelet holds it when it runs CNI ADD: scheduled to
/// node-a, no address yet.
fn pending(name: &str, uid: &str, ns: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "spec": {"nodeName": "node-a", "serviceAccountName": name,
                 "containers": [{"name": "app", "image": "app:1"}]},
        "status": {"phase": "Pending"},
    })
}

/// `tidegate-cni ADD` of `ns/name` (`uid`) in the test's own network
/// namespace, with an empty `PATH`: a capture tool run by mistake fails
/// the ADD instead of touching the host.
fn add(dir: &Path, socket: &Path, ns: &str, name: &str, uid: &str) -> Output {
    let empty = dir.join("no-tools");
    std::fs::create_dir_all(&empty).unwrap();
    let conf = tidegate_e2e::cni::inpod_conf(socket, &dir.join("pods"), tidegate_e2e::ip(62, 9));
    let mut child = Command::new(tidegate_e2e::cni::binary())
        .env_clear()
        .env("PATH", &empty)
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", "c0ffee")
        .env("CNI_NETNS", "/proc/self/ns/net")
        .env("CNI_IFNAME", "eth0")
        .env(
            "CNI_ARGS",
            format!("K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_UID={uid}"),
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
    child.wait_with_output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cni_plugin_captures_only_what_discovery_puts_in_the_mesh() {
    let api = FakeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    api.apply(
        Kind::Namespace,
        namespace("shop", json!({"tidegate.io/mesh": "enabled"})),
    );
    api.apply(Kind::Namespace, namespace("plain", json!({})));
    api.apply(Kind::Pod, pending("web", "uid-web", "shop"));
    api.apply(Kind::Pod, pending("batch", "uid-batch", "plain"));
    let socket = dir.path().join("cni.sock");
    let yaml = format!(
        r#"{head}workloads:
  source: kubernetes
  kubernetes: {{api_server: {api}, debounce: 10ms}}
capture: {{mode: inpod, membership_wait: 300ms}}
drains: {{cni_socket: {socket}}}
"#,
        head = config_head(dir.path(), "node-a"),
        api = api.url(),
        socket = socket.display(),
    );
    let config = tidegate::config::Config::from_yaml(&yaml).unwrap();
    init_tracing();
    let app = tidegate::app::build(config).await.unwrap();
    until_ready(&app).await;
    let member = |uid: &str| app.workloads.snapshot().membership(uid).map(|m| m.member);
    // Known before they have an address (their ADD comes first).
    assert_eq!(member("uid-web"), Some(true));
    assert_eq!(member("uid-batch"), Some(false));

    // Not a member: ADD succeeds, nothing is captured or recorded.
    let stderr = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();
    let out = add(dir.path(), &socket, "plain", "batch", "uid-batch");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is not a mesh member (neither the pod nor its namespace"),
        "{}",
        stderr(&out)
    );
    assert!(tidegate_netns::pod_records::PodRecord::read_all(&dir.path().join("pods")).is_empty());
    // A pod discovery does not know (yet): try again later, never a guess.
    let out = add(dir.path(), &socket, "shop", "ghost", "uid-ghost");
    assert!(!out.status.success());
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["code"], 11, "{e}");
    assert!(
        e["details"]
            .as_str()
            .unwrap()
            .contains("uid-ghost) is unknown to the gateway's workload source"),
        "{e}"
    );
    let text = app.metrics_text();
    for (result, n) in [
        ("not_member", 1.0),
        ("membership_unknown", 1.0),
        ("added", 0.0),
    ] {
        let series = format!(r#"tidegate_inpod_adds_total{{result="{result}"}}"#);
        assert_eq!(metric_or_zero(&text, &series), n, "{series}");
    }

    // Istio's label on the namespace opts its pods in, as istio-cni reads it.
    api.apply(
        Kind::Namespace,
        namespace("plain", json!({"istio.io/dataplane-mode": "ambient"})),
    );
    eventually("the pod of the relabelled namespace a member", WAIT, || {
        member("uid-batch") == Some(true)
    })
    .await;
    app.shutdown().await;
}
