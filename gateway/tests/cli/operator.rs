//! The operator's commands: `tidegate` alone, one gateway per node (a
//! second one refuses, or takes over with `--take-over`), `-o json|yaml`
//! parsed back, `version`, `drains`, `policy upload|list`, the workload
//! reference rule and the exit codes.

use super::*;

/// (exit code, stdout, stderr) of `tidegate ARGS`.
fn tidegate(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code().expect("exited, not killed"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn tidegate_alone_prints_help_and_starts_nothing() {
    // A gateway would bind the default admin port; the help must not.
    let (code, out, err) = tidegate(&[]);
    assert_eq!(code, 2, "{out}{err}");
    let help = format!("{out}{err}");
    assert!(
        help.contains("Usage:") && help.contains("run") && help.contains("Exit codes"),
        "{help}"
    );
    // Options without a command are a usage error too, not a gateway.
    let (code, _, err) = tidegate(&["--set", "listeners.admin=127.0.0.1:0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("Usage:"), "{err}");
}

#[test]
fn a_second_gateway_refuses_naming_the_port_and_the_first_keeps_answering() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let first = start(&config);
    let ready = first.wait_for("tidegate ready");
    let (admin, metrics, readiness) = (
        field(&ready, "admin"),
        field(&ready, "metrics"),
        field(&ready, "readiness"),
    );
    let first_pid = first.child.id();
    let config_arg = config.to_str().unwrap();
    let ports = [
        format!("listeners.admin={admin}"),
        format!("listeners.metrics={metrics}"),
        format!("listeners.readiness={readiness}"),
    ];
    let mut args = vec!["run", "--config", config_arg];
    for p in &ports {
        args.extend(["--set", p.as_str()]);
    }
    let (code, _, err) = tidegate(&args);
    assert_eq!(code, 1, "{err}");
    let port = admin.rsplit(':').next().unwrap();
    for says in [
        format!("cannot listen on {admin} for admin"),
        format!("port {port} is in use by pid {first_pid} (tidegate)"),
        format!("answers as tidegate {}", env!("CARGO_PKG_VERSION")),
        format!("pid {first_pid}, node node-a"),
        "One gateway per node".to_owned(),
        "--take-over".to_owned(),
    ] {
        assert!(err.contains(&says), "{says:?} in {err}");
    }
    // Every admin request still reaches the first one.
    for _ in 0..20 {
        let v = json(&admin_request(&admin, "GET", "/version", b"").1);
        assert_eq!(v["pid"], first_pid, "{v}");
    }
    assert!(probe(&readiness, "/healthz/ready").is_some_and(|r| r.contains(" 200 ")));
    // Only the metrics port taken: refused all the same, naming it.
    let (code, _, err) = tidegate(&["run", "--config", config_arg, "--set", &ports[1]]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("cannot listen on {metrics} for metrics")),
        "{err}"
    );
}

#[test]
fn take_over_moves_the_control_ports_to_the_new_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let first = start(&config);
    let ready = first.wait_for("tidegate ready");
    let (admin, metrics, readiness) = (
        field(&ready, "admin"),
        field(&ready, "metrics"),
        field(&ready, "readiness"),
    );
    let inbound = field(&ready, "inbound");
    let sets = [
        format!("listeners.admin={admin}"),
        format!("listeners.metrics={metrics}"),
        format!("listeners.readiness={readiness}"),
        format!("listeners.inbound={inbound}"),
    ];
    let config_arg = config.to_str().unwrap();
    let mut args = vec!["run", "--take-over", "--config", config_arg];
    for s in &sets {
        args.extend(["--set", s.as_str()]);
    }
    let mut second = spawn(&args);
    let took = second.wait_for("took the admin, metrics and readiness ports over");
    assert!(
        took.contains(&format!("from_pid={}", first.child.id())),
        "{took}"
    );
    first.wait_for("handing the admin, metrics and readiness ports over");
    let ready = second.wait_for("tidegate ready");
    assert_eq!(field(&ready, "admin"), admin);
    assert_eq!(
        field(&ready, "inbound"),
        inbound,
        "the HBONE port is shared"
    );
    let v = json(&admin_request(&admin, "GET", "/version", b"").1);
    assert_eq!(v["pid"], second.child.id(), "{v}");
    // The first one closed its metrics listener: the answer is the second's.
    assert!(probe(&metrics, "/metrics").is_some_and(|m| m.contains(" 200 ")));
    // The first one serves on (its data path) until it is stopped.
    let mut first = first;
    assert!(
        first.child.try_wait().unwrap().is_none(),
        "the first one still runs"
    );
    let _ = second.child.kill();
}

#[test]
fn read_commands_print_json_and_yaml_that_parse_back() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let gw = start(&config);
    let admin = field(&gw.wait_for("tidegate ready"), "admin");

    let (code, out, err) = tidegate(&["workloads", "-o", "json", "--admin", &admin]);
    assert_eq!(code, 0, "{err}");
    let w = &json(&out)["workloads"][0];
    assert_eq!(w["workload"], "demo/echo", "{out}");
    assert_eq!(w["uid"], "echo-uid");
    assert_eq!(w["local"], true);
    assert_eq!(w["ips"][0], "127.51.0.2");
    assert_eq!(w["state"], "running");
    assert!(
        w["policy"].as_str().unwrap().contains("keepalive-only"),
        "{out}"
    );
    let (code, out, _) = tidegate(&["workloads", "echo", "-o", "yaml", "--admin", &admin]);
    assert_eq!(code, 0);
    let y: serde_json::Value = serde_yaml::from_str(&out).unwrap();
    assert_eq!(y["workloads"][0]["uid"], "echo-uid", "{out}");

    let (code, out, err) = tidegate(&["drains", "--admin", &admin]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "no drain on this gateway\n");
    let (code, out, _) = tidegate(&["drain", "echo", "--admin", &admin]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("echo (uid echo-uid): draining"), "{out}");
    let (code, out, _) = tidegate(&["drains", "-o", "json", "--admin", &admin]);
    assert_eq!(code, 0);
    let d = &json(&out)["drains"][0];
    assert_eq!(d["uid"], "echo-uid", "{out}");
    assert_eq!(d["phase"], "shutting-down");
    let (_, table, _) = tidegate(&["drains", "--admin", &admin]);
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("demo/echo") && l.contains("shutting-down")),
        "{table}"
    );

    let (code, out, _) = tidegate(&["policy", "list", "-o", "json", "--admin", &admin]);
    assert_eq!(code, 0);
    assert!(json(&out)["policies"].is_array(), "{out}");

    let (code, out, _) = tidegate(&["version", "-o", "json"]);
    assert_eq!(code, 0);
    let v = json(&out);
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert!(v["commit"].as_str().is_some_and(|c| !c.is_empty()), "{v}");
    assert_eq!(v["policy_contracts"][0], "tidegate:policy@0.3.0");
    let (code, out, _) = tidegate(&["version"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with(&format!("tidegate {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{out}"
    );
    assert!(
        out.contains("type.googleapis.com/istio.workload.Address"),
        "{out}"
    );
    // The admin API says the same of the running gateway.
    let served = json(&admin_request(&admin, "GET", "/version", b"").1);
    assert_eq!(served["commit"], v["commit"]);

    let (code, _, err) = tidegate(&["workloads", "-o", "xml", "--admin", &admin]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("'xml'") && err.contains("table, json, yaml"),
        "{err}"
    );
}

#[test]
fn policy_upload_reports_the_version_or_the_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let gw = start(&config);
    let admin = field(&gw.wait_for("tidegate ready"), "admin");
    let wasm = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/plugins/keepalive-only.wasm"
    );

    // A configuration the plugin refuses: the gateway's reason, exit 1.
    let (code, _, err) = tidegate(&[
        "policy",
        "upload",
        "trial",
        wasm,
        "--policy-config",
        r#"{"x": 1}"#,
        "--admin",
        &admin,
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("answered 422 Unprocessable Entity: plugin refused its configuration: unknown config key `x`"),
        "{err}"
    );
    let goaway = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/plugins/goaway-on-term-start.wasm"
    );
    let (code, out, err) = tidegate(&[
        "policy",
        "upload",
        "trial",
        goaway,
        "--policy-config",
        r#"{"deadline-margin-ms": 3000}"#,
        "--admin",
        &admin,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("policy trial: created, version "), "{out}");
    let (code, out, _) = tidegate(&["policy", "list", "--admin", &admin]);
    assert_eq!(code, 0);
    let row = out
        .lines()
        .find(|l| l.starts_with("trial"))
        .unwrap_or_default();
    assert!(
        row.contains("admin-upload") && row.ends_with("loaded"),
        "{out}"
    );

    // Not a component: refused with the gateway's reason, exit 1; the
    // loaded version stays.
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"not wasm").unwrap();
    let (code, _, err) = tidegate(&[
        "policy",
        "upload",
        "trial",
        junk.to_str().unwrap(),
        "--admin",
        &admin,
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("answered 422 Unprocessable Entity")
            && err.contains("not a WebAssembly component"),
        "{err}"
    );
    let (_, out, _) = tidegate(&["policy", "list", "-o", "json", "--admin", &admin]);
    let listed = json(&out);
    let trial = listed["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "trial")
        .unwrap();
    assert_eq!(trial["loaded"], true, "{out}");
    // Bad input refused before anything is sent.
    let (code, _, err) = tidegate(&[
        "policy",
        "upload",
        "trial",
        wasm,
        "--policy-config",
        "a\nb",
        "--admin",
        &admin,
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains("--policy-config must be visible ASCII"),
        "{err}"
    );
    let (code, _, err) = tidegate(&[
        "policy",
        "upload",
        "trial",
        "/nonexistent.wasm",
        "--admin",
        &admin,
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot read the plugin /nonexistent.wasm"),
        "{err}"
    );
    let (code, _, err) = tidegate(&["policy", "upload", "bad name", wasm, "--admin", &admin]);
    assert_eq!(code, 1);
    assert!(
        err.contains("answered 400 Bad Request") && err.contains("must be 1-64 letters"),
        "{err}"
    );
}

#[test]
fn every_command_takes_the_same_workload_references() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    std::fs::write(
        dir.path().join("workloads.yaml"),
        "workloads:\n\
         - {uid: echo-uid, name: echo, namespace: demo, service_account: echo, ips: [127.51.0.2], node: node-a}\n\
         - {uid: web-1, name: web, namespace: shop, ips: [127.51.0.3], node: node-a}\n\
         - {uid: web-2, name: web, namespace: lab, ips: [127.51.0.4], node: node-a}\n",
    )
    .unwrap();
    let gw = start(&config);
    let admin = field(&gw.wait_for("tidegate ready"), "admin");
    let wasm = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/plugins/keepalive-only.wasm"
    );
    let (code, _, err) = tidegate(&["policy", "upload", "trial", wasm, "--admin", &admin]);
    assert_eq!(code, 0, "{err}");

    // A bare name, an IP, a uid, namespace/name: the same workload.
    for reference in ["echo", "127.51.0.2", "echo-uid", "demo/echo"] {
        let (code, out, err) = tidegate(&["bind", reference, "trial", "--admin", &admin]);
        assert_eq!(code, 0, "{reference}: {err}");
        assert!(
            out.starts_with("demo/echo (uid echo-uid): bound to trial"),
            "{reference}: {out}"
        );
        let (code, out, _) = tidegate(&["workloads", reference, "-o", "json", "--admin", &admin]);
        assert_eq!(code, 0);
        assert_eq!(
            json(&out)["workloads"].as_array().unwrap().len(),
            1,
            "{reference}: {out}"
        );
    }
    // A name two namespaces share: an error listing both, for every command.
    let candidates = "lab/web (uid web-2), shop/web (uid web-1)";
    for args in [
        vec!["drain", "web"],
        vec!["bind", "web", "trial"],
        vec!["unbind", "web"],
        vec!["workloads", "web"],
    ] {
        let mut args = args;
        args.extend(["--admin", admin.as_str()]);
        let (code, _, err) = tidegate(&args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.contains("the name \"web\" is ambiguous") && err.contains(candidates),
            "{args:?}: {err}"
        );
    }
    let dump = http_get(&admin, "/config_dump");
    assert!(
        !dump.contains("shutting-down"),
        "the ambiguous drain drained nothing"
    );
    let (code, _, err) = tidegate(&["drain", "127.51.9.9", "--admin", &admin]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no workload of node node-a has the IP 127.51.9.9"),
        "{err}"
    );
}

#[test]
fn exit_codes_tell_usage_unreachable_and_refused_apart() {
    // 2: usage (an unknown command, a missing argument).
    assert_eq!(tidegate(&["frobnicate"]).0, 2);
    assert_eq!(tidegate(&["bind", "echo"]).0, 2);
    // 3: no gateway at the admin address.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = free.local_addr().unwrap().to_string();
    drop(free);
    for args in [
        vec!["workloads"],
        vec!["drains"],
        vec!["config", "services"],
        vec!["drain", "echo"],
        vec!["policy", "list"],
    ] {
        let mut args = args;
        args.extend(["--admin", addr.as_str()]);
        let (code, _, err) = tidegate(&args);
        assert_eq!(code, 3, "{args:?}: {err}");
        assert!(
            err.contains(&format!("cannot reach the admin API at {addr}")),
            "{err}"
        );
    }
    // 1: the gateway refused (no policy of that name).
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let gw = start(&config);
    let admin = field(&gw.wait_for("tidegate ready"), "admin");
    let (code, _, err) = tidegate(&["bind", "echo", "nope", "--admin", &admin]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no policy named \"nope\""), "{err}");
}

/// The DaemonSet's rolling update starts the new pod beside the old one
/// (`maxSurge: 1`, host network): without `--take-over` the new gateway
/// would refuse the node's control ports and the rollout would never end.
#[test]
fn the_daemonset_s_surge_upgrade_takes_the_control_ports_over() {
    let ds = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/base/daemonset.yaml"
    ))
    .unwrap();
    assert!(ds.contains("maxSurge: 1"), "the premise changed: {ds}");
    assert!(
        ds.contains("command: [/usr/local/bin/tidegate, run, --take-over]"),
        "{ds}"
    );
}

/// The hand-over comes last: a new gateway that fails to start on
/// anything else (here the demo echo port, never shared) leaves the running
/// one its control ports.
#[test]
fn a_take_over_that_fails_to_start_leaves_the_running_gateway_its_ports() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let first = start(&config);
    let echo = field(&first.wait_for("demo echo backend listening"), "addr");
    let admin = field(&first.wait_for("tidegate ready"), "admin");
    let sets = [
        format!("listeners.admin={admin}"),
        format!("demo.echo={echo}"),
    ];
    let (code, _, err) = tidegate(&[
        "run",
        "--take-over",
        "--config",
        config.to_str().unwrap(),
        "--set",
        &sets[0],
        "--set",
        &sets[1],
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("cannot listen on {echo} for demo.echo")),
        "{err}"
    );
    let v = json(&admin_request(&admin, "GET", "/version", b"").1);
    assert_eq!(v["pid"], first.child.id(), "{v}");
    assert_eq!(v["handed_over"], false, "{v}");
}

#[test]
fn config_shows_the_sections_istioctl_reads() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let gw = start(&config);
    let admin = field(&gw.wait_for("tidegate ready"), "admin");

    let (code, out, err) = tidegate(&["config", "workloads", "-o", "json", "--admin", &admin]);
    assert_eq!(code, 0, "{err}");
    let all = json(&out);
    let echo = all
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "echo")
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(echo["workloadIps"][0], "127.51.0.2", "{out}");
    assert_eq!(echo["protocol"], "HBONE");
    let (code, table, _) = tidegate(&["config", "workloads", "--admin", &admin]);
    assert_eq!(code, 0);
    assert!(table.starts_with("NAMESPACE"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.contains("echo") && l.contains("127.51.0.2") && l.contains("HBONE")),
        "{table}"
    );

    let (code, out, _) = tidegate(&["config", "certificates", "-o", "yaml", "--admin", &admin]);
    assert_eq!(code, 0);
    let certs: serde_json::Value = serde_yaml::from_str(&out).unwrap();
    let certs = certs.as_array().unwrap_or_else(|| panic!("{out}"));
    assert!(
        certs.iter().any(|c| c["identity"]
            .as_str()
            .is_some_and(|i| i.starts_with("spiffe://"))
            && c["certChain"].is_array()),
        "{out}"
    );
    for section in ["services", "policies"] {
        let (code, out, err) = tidegate(&["config", section, "-o", "json", "--admin", &admin]);
        assert_eq!(code, 0, "{section}: {err}");
        assert!(json(&out).is_array(), "{section}: {out}");
    }

    let (code, _, err) = tidegate(&["config", "routes", "--admin", &admin]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("workloads, services, policies, certificates"),
        "{err}"
    );
}
