//! The admin API as an operator uses it: which policy each workload gets
//! and why, uploads under a new name, run-time bindings, and a draining
//! workload's real phase.

use serde_json::Value;
use tidegate_e2e::{http, http_get, plugin, Options, TwoNodes};

const ECHO: &str = "echo-uid";

async fn json_get(nodes: &TwoNodes, path: &str) -> Value {
    let (status, body) = http_get(nodes.server.addrs.admin, path).await;
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

fn workload<'a>(dump: &'a Value, uid: &str) -> &'a Value {
    dump["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["uid"] == uid)
        .unwrap_or_else(|| panic!("{uid} in {dump}"))
}

fn policy<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {list}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_dump_says_which_policy_and_why_and_a_new_name_can_be_bound() {
    let server_yaml = format!(
        "policies:\n  default: keep\n  plugins:\n    keep: {{file: {}}}\n",
        plugin("keepalive-only").display()
    );
    let nodes = TwoNodes::with(
        71,
        Options {
            server_yaml,
            ..Default::default()
        },
    )
    .await;
    let admin = nodes.server.addrs.admin;

    // Before: the default, and why; a peer has no policy here.
    let dump = json_get(&nodes, "/config_dump").await;
    let echo = workload(&dump, ECHO);
    assert_eq!(echo["state"], "running", "{echo}");
    assert_eq!(echo["policy"]["name"], "keep", "{echo}");
    assert_eq!(echo["policy"]["source"], "default", "{echo}");
    assert_eq!(echo["policy"]["loaded"], true, "{echo}");
    assert!(workload(&dump, "client-uid").get("policy").is_none());

    // A new name is created (201); the same name again is swapped (200).
    let wasm = std::fs::read(plugin("goaway-on-term-start")).unwrap();
    let (status, body) = http(admin, "PUT", "/policies/trial", "", &wasm).await;
    assert_eq!(status, 201, "{body}");
    let created: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(created["result"], "created", "{body}");
    assert!(created["previous"].is_null(), "{body}");
    let header = "tidegate-policy-config: {\"deadline-margin-ms\": 3000}\r\n";
    let (status, body) = http(admin, "PUT", "/policies/trial", header, &wasm).await;
    assert_eq!(status, 200, "{body}");
    let swapped: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(swapped["result"], "swapped", "{body}");
    assert_eq!(swapped["previous"], created["version"], "{body}");

    // GET /policies says where each loaded version came from.
    let list = json_get(&nodes, "/policies").await;
    let trial = policy(&list, "trial");
    assert_eq!(trial["source"], "admin-upload", "{trial}");
    assert!(trial["file"].is_null(), "{trial}");
    assert_eq!(trial["size"], wasm.len(), "{trial}");
    let keep = policy(&list, "keep");
    assert_eq!(keep["source"], "file", "{keep}");
    assert_eq!(keep["file"], keep["watched_file"], "{keep}");

    // Binding to no policy is refused and changes nothing.
    let bind = format!("/workloads/{ECHO}/policy");
    let (status, body) = http(admin, "PUT", &bind, "", b"nope").await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("no policy named"), "{body}");
    let (status, body) = http(admin, "PUT", "/workloads/client-uid/policy", "", b"trial").await;
    assert_eq!(status, 404, "a peer's policy is its own gateway's: {body}");

    // echo bound at run time: reported, and what the drain really uses.
    let (status, body) = http(admin, "PUT", &bind, "", b"trial\n").await;
    assert_eq!(status, 200, "{body}");
    let dump = json_get(&nodes, "/config_dump").await;
    let p = &workload(&dump, ECHO)["policy"];
    assert_eq!(p["name"], "trial", "{p}");
    assert_eq!(p["source"], "admin", "{p}");
    assert_eq!(p["version"], swapped["version"], "{p}");
    let (status, body) = http(
        admin,
        "POST",
        &format!("/workloads/{ECHO}/shutdown-starting?grace=30s"),
        "",
        b"",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let outcome: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(outcome["policy"], "trial", "{body}");

    // Draining: the real phase, kebab-case, here and in /drains; the
    // policy is the one the drain pinned, even after the binding goes.
    let (status, body) = http(admin, "DELETE", &bind, "", b"").await;
    assert_eq!(status, 200, "{body}");
    let dump = json_get(&nodes, "/config_dump").await;
    let echo = workload(&dump, ECHO);
    assert_eq!(echo["state"], "shutting-down", "{echo}");
    assert_eq!(echo["source_state"], "running", "{echo}");
    assert_eq!(echo["policy"]["name"], "trial", "{echo}");
    assert_eq!(echo["policy"]["pinned_by_drain"], true, "{echo}");
    let drains = json_get(&nodes, "/drains").await;
    assert_eq!(drains["drains"][0]["phase"], "shutting-down", "{drains}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_upload_says_why_on_one_line() {
    let nodes = TwoNodes::start(72).await;
    let admin = nodes.server.addrs.admin;
    let core_module = b"\0asm\x01\0\0\0";
    for (what, bytes) in [
        ("text", &b"not wasm"[..]),
        ("core module", &core_module[..]),
    ] {
        let (status, body) = http(admin, "PUT", "/policies/broken", "", bytes).await;
        assert_eq!(status, 422, "{what}: {body}");
        let refused: Value = serde_json::from_str(&body).unwrap();
        let error = refused["error"].as_str().unwrap();
        assert!(
            error.starts_with("not a WebAssembly component"),
            "{what}: {error}"
        );
        assert!(!error.contains('\n'), "{what}: one line, got {error:?}");
    }
    let list = json_get(&nodes, "/policies").await;
    let broken = policy(&list, "broken");
    assert_eq!(broken["loaded"], false, "{broken}");
    assert!(!broken["last_error"].as_str().unwrap().contains('\n'));
}

/// `/config_dump` narrowed by its query: a section, one workload, one
/// Service; a bad query is a 400 naming the key, and the dump still serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_dump_narrowed_to_sections_a_workload_and_a_service() {
    let svc = super::services::Svc::start_with(237, Options::default(), 3).await;
    let admin = svc.nodes.client.addrs.admin;
    let get = |path: &'static str| async move {
        let (status, body) = http_get(admin, path).await;
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str::<Value>(&body).unwrap()
    };
    let keys = |v: &Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };

    let whole = get("/config_dump").await;
    assert!(whole["workloads"].as_array().unwrap().len() > 1, "{whole}");
    let one = get("/config_dump?only=workloads,pool&workload=e1").await;
    assert_eq!(keys(&one), ["node", "pool", "workloads"], "{one}");
    let listed = one["workloads"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{one}");
    assert_eq!(listed[0]["uid"], "e1");
    let none = get("/config_dump?only=workloads&workload=no-such-uid").await;
    assert_eq!(none["workloads"], serde_json::json!([]), "{none}");

    let echo = get("/config_dump?only=services&service=demo%2Fecho").await;
    assert_eq!(keys(&echo), ["node", "services"], "{echo}");
    let services = echo["services"].as_array().unwrap();
    assert_eq!(services.len(), 1, "{echo}");
    assert_eq!(services[0]["name"], "echo");
    assert_eq!(services[0]["endpoint_choice"].as_array().unwrap().len(), 3);
    assert_eq!(services[0]["endpoints"].as_object().unwrap().len(), 3);
    assert!(whole["services"].as_array().unwrap().len() > 1, "{whole}");

    for (query, names) in [
        ("only=pool,tunnels", "section \"tunnels\""),
        ("section=pool", "query key \"section\""),
        ("service=echo", "query `service`"),
        (
            "workload=a&workload=b",
            "query key `workload` is given twice",
        ),
    ] {
        let (status, body) = http_get(admin, &format!("/config_dump?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body.contains(names), "{query}: {body}");
    }
    let after = get("/config_dump?only=workloads").await;
    assert_eq!(after["workloads"], whole["workloads"]);
}
