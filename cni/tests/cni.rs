//! `tidegate-cni`, the real binary, with real CNI environment variables and
//! stdin configuration, against fake gateways (a Unix socket answering as
//! the gateway would). DEL against a real gateway is in the workspace's
//! end-to-end tests (`tests/tests/hbone/drains.rs`, and as root
//! `tests/tests/netns_drains.rs`, `tests/tests/netns/inpod.rs`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const CNI: &str = env!("CARGO_BIN_EXE_tidegate-cni");

fn cni(command: &str, conf: &str, uid: &str) -> std::process::Child {
    cni_in("/var/run/netns/test", command, conf, uid)
}

/// [`cni`] with `netns` as `CNI_NETNS`.
fn cni_in(netns: &str, command: &str, conf: &str, uid: &str) -> std::process::Child {
    let mut child = Command::new(CNI)
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", "c0ffee")
        .env("CNI_NETNS", netns)
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
    // Someone accepts but never answers: bounded by timeout_ms.
    let peer = FakeGateway::start(dir.path(), |s, stop| {
        let _ = stop.recv();
        drop(s);
    });
    let out = run("DEL", &conf(&peer.path, 200), "u1");
    peer.assert_still_holding();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not drained, deletion goes on")
            && err.contains("no acknowledgement within timeout_ms (200 ms)"),
        "{err}"
    );
    peer.stop();
    good_gateway_still_drains(dir.path());
}

/// A fake gateway socket: `serve` gets each accepted connection and a
/// receiver that yields once the test is done with it.
struct FakeGateway {
    path: PathBuf,
    stop: std::sync::mpsc::Sender<()>,
    done: std::sync::mpsc::Receiver<()>,
    thread: std::thread::JoinHandle<()>,
}

impl FakeGateway {
    fn start(
        dir: &Path,
        serve: impl FnOnce(std::os::unix::net::UnixStream, std::sync::mpsc::Receiver<()>)
            + Send
            + 'static,
    ) -> FakeGateway {
        let path = dir.join(format!("fake-{}.sock", next_name()));
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let (stop, stopped) = std::sync::mpsc::channel();
        let (finished, done) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            serve(s, stopped);
            let _ = finished.send(());
        });
        FakeGateway {
            path,
            stop,
            done,
            thread,
        }
    }

    /// DEL came back while the peer still held the connection: the deadline,
    /// not the peer, ended the exchange.
    fn assert_still_holding(&self) {
        assert!(
            self.done.try_recv().is_err(),
            "the peer let go first: DEL was not ended by its deadline"
        );
    }

    fn stop(self) {
        let _ = self.stop.send(());
        self.thread.join().unwrap();
    }
}

fn next_name() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::Relaxed).to_string()
}

fn read_request(s: &mut std::os::unix::net::UnixStream) -> String {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(s).read_line(&mut line).unwrap();
    line
}

/// The good path after each bad one: a peer that answers a well-formed
/// acknowledgement is reported as drained.
fn good_gateway_still_drains(dir: &Path) {
    let peer = FakeGateway::start(dir, |mut s, _| {
        let req = read_request(&mut s);
        assert!(req.contains("\"teardown\""), "{req}");
        s.write_all(b"{\"result\":\"idle\",\"held_ms\":3}\n")
            .unwrap();
    });
    let out = run("DEL", &conf(&peer.path, 5_000), "u1");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success()
            && err.contains("drained: {")
            && err.contains("\"result\":\"idle\"")
            && err.contains("\"held_ms\":3"),
        "{err}"
    );
    peer.stop();
}

/// The gateway's socket with a full backlog: `connect` itself blocks, and
/// `timeout_ms` still bounds the DEL.
#[test]
fn del_is_bounded_when_the_sockets_backlog_is_full() {
    use socket2::{Domain, SockAddr, Socket, Type};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("full.sock");
    let listener = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
    listener.bind(&SockAddr::unix(&path).unwrap()).unwrap();
    listener.listen(0).unwrap();
    // Fill the backlog with connections nobody accepts.
    let mut queued = Vec::new();
    loop {
        let c = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
        c.set_nonblocking(true).unwrap();
        match c.connect(&SockAddr::unix(&path).unwrap()) {
            Ok(()) => queued.push(c),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("filling the backlog: {e}"),
        }
        assert!(queued.len() < 1_000, "the backlog never filled");
    }
    let out = run("DEL", &conf(&path, 300), "u1");
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not drained") && err.contains("could not connect within timeout_ms (300 ms)"),
        "{err}"
    );
    drop(queued);
    drop(listener);
    good_gateway_still_drains(dir.path());
}

/// A peer that dribbles an acknowledgement one byte at a time, never ending
/// the line: DEL ends at its deadline and the bytes are never taken as an ack.
#[test]
fn del_is_bounded_by_a_dribbling_peer_and_never_prints_its_bytes_as_the_ack() {
    let dir = tempfile::tempdir().unwrap();
    let peer = FakeGateway::start(dir.path(), |mut s, stop| {
        read_request(&mut s);
        for b in b"{\"result\":\"idle\"".iter().cycle() {
            if stop.try_recv().is_ok() || s.write_all(&[*b]).is_err() {
                return;
            }
            // Pacing of the misbehaving peer (not a wait for an event).
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let out = run("DEL", &conf(&peer.path, 300), "u1");
    peer.assert_still_holding();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not drained")
            && err.contains("no complete acknowledgement within timeout_ms (300 ms)")
            && err.contains("bytes without a newline"),
        "{err}"
    );
    assert!(!err.contains("drained: "), "{err}");
    peer.stop();
    good_gateway_still_drains(dir.path());
}

/// Garbage, a non-object and `bad-request` lines are not acknowledgements.
#[test]
fn del_takes_only_a_well_formed_acknowledgement() {
    let dir = tempfile::tempdir().unwrap();
    for (answer, says) in [
        (
            &b"HTTP/1.1 200 OK\r\n"[..],
            "not a well-formed acknowledgement",
        ),
        (
            &b"\x00\xff\xfe garbage\n"[..],
            "not a well-formed acknowledgement",
        ),
        (&b"\"idle\"\n"[..], "not a well-formed acknowledgement"),
        (
            &b"{\"held_ms\": 3}\n"[..],
            "not a well-formed acknowledgement",
        ),
        (
            &b"{\"result\":\"bad-request\",\"error\":\"line too long\"}\n"[..],
            "the gateway refused the request: line too long",
        ),
    ] {
        let peer = FakeGateway::start(dir.path(), move |mut s, _| {
            read_request(&mut s);
            s.write_all(answer).unwrap();
        });
        let out = run("DEL", &conf(&peer.path, 5_000), "u1");
        peer.stop();
        assert!(out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("not drained") && err.contains(says) && !err.contains("drained: "),
            "{answer:?}: {err}"
        );
    }
    good_gateway_still_drains(dir.path());
}

/// An invalid `timeout_ms` or `socket` is a CNI error naming the key, for
/// every command — never a silent default.
#[test]
fn invalid_plugin_keys_are_errors_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let good = conf(&dir.path().join("none.sock"), 100);
    for (bad, key) in [
        (
            good.replace("\"timeout_ms\": 100", "\"timeout_ms\": \"abc\""),
            "timeout_ms",
        ),
        (
            good.replace("\"timeout_ms\": 100", "\"timeout_ms\": 0"),
            "timeout_ms",
        ),
        (
            good.replace("\"timeout_ms\": 100", "\"timeout_ms\": -5"),
            "timeout_ms",
        ),
        (
            good.replace("\"timeout_ms\": 100", "\"timeout_ms\": 86400000"),
            "timeout_ms",
        ),
        (
            good.replace(
                &format!("\"socket\": \"{}\"", dir.path().join("none.sock").display()),
                "\"socket\": 5",
            ),
            "socket",
        ),
    ] {
        assert_ne!(bad, good, "the replacement must apply");
        for command in ["ADD", "CHECK", "DEL"] {
            let out = run(command, &bad, "u1");
            assert!(!out.status.success(), "{command} {bad}");
            let e: serde_json::Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stdout)));
            assert_eq!(e["code"], 7, "{e}");
            let details = e["details"].as_str().unwrap();
            assert!(details.contains(&format!("`{key}`")), "{details}");
        }
    }
    let e: serde_json::Value = serde_json::from_slice(
        &run(
            "DEL",
            &good.replace("\"timeout_ms\": 100", "\"timeout_ms\": \"abc\""),
            "u1",
        )
        .stdout,
    )
    .unwrap();
    assert!(
        e["details"].as_str().unwrap().contains("from 1 to 120000"),
        "{e}"
    );
    // The good configuration still works.
    let out = run("ADD", &good, "u1");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The plugin's output once it exits; it is killed and the test fails if
/// it has not exited within `within`.
fn exited_within(child: std::process::Child, within: Duration, what: &str) -> Output {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(within) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("{what}: tidegate-cni had not exited after {within:?}");
        }
    }
}

fn inpod_conf(socket: &Path, state_dir: &Path, timeout_ms: u64) -> String {
    conf(socket, timeout_ms).replacen(
        "\"timeout_ms\"",
        &format!(
            "\"capture\": \"inpod\", \"state_dir\": \"{}\", \"timeout_ms\"",
            state_dir.display()
        ),
        1,
    )
}

fn cni_error(out: &Output) -> serde_json::Value {
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// A FIFO where the pod's namespace should be: a plain open would wait for
/// a writer forever. ADD fails at once, saying what the file is.
#[test]
fn inpod_add_with_a_fifo_for_its_namespace_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("netns-fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let state = dir.path().join("pods");
    // A minute: only the open's own failure can end ADD within the wait.
    let c = inpod_conf(&dir.path().join("none.sock"), &state, 60_000);
    let child = cni_in(fifo.to_str().unwrap(), "ADD", &c, "u1");
    let out = exited_within(child, Duration::from_secs(30), "ADD on a FIFO");
    let e = cni_error(&out);
    assert_eq!(e["code"], 4, "{e}");
    let details = e["details"].as_str().unwrap();
    assert_eq!(
        details,
        format!(
            "CNI_NETNS {}: it is a FIFO, not a network namespace",
            fifo.display()
        )
    );
    assert!(tidegate_netns::pod_records::PodRecord::read_all(&state).is_empty());
}

/// Whatever step of ADD blocks — here writing the pod's record, whose
/// temporary file is a FIFO nobody reads — `timeout_ms` ends it, naming
/// the step.
#[test]
fn inpod_add_is_bounded_by_timeout_ms_whatever_step_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("pods");
    std::fs::create_dir_all(&state).unwrap();
    nix::unistd::mkfifo(&state.join(".u2.tmp"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let c = inpod_conf(&dir.path().join("none.sock"), &state, 300);
    // The plugin's own namespace: a real one, openable without privileges.
    let child = cni_in("/proc/self/ns/net", "ADD", &c, "u2");
    let out = exited_within(child, Duration::from_secs(30), "ADD blocked on its record");
    let e = cni_error(&out);
    assert_eq!(e["code"], 11, "{e}");
    assert!(
        e["msg"].as_str().unwrap().contains("within timeout_ms"),
        "{e}"
    );
    assert_eq!(
        e["details"],
        "still recording the pod in the state directory after 300 ms (timeout_ms)"
    );
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

/// Stand-ins for the tools capture runs (`iptables`, `ip6tables`, their
/// `-restore` and `-save`, `ip`, `sysctl`), in a directory that is the
/// plugin's whole `PATH`: each appends its command line (a `-restore` also
/// its input) to the returned file, and a query (`-S`, `-C`, `-save`)
/// finds nothing. Nothing of the host's is touched, whatever the plugin does.
fn capture_tools(dir: &Path) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let tools = dir.join("tools");
    let calls = dir.join("calls");
    std::fs::create_dir_all(&tools).unwrap();
    for tool in [
        "iptables",
        "iptables-restore",
        "iptables-save",
        "ip6tables",
        "ip6tables-restore",
        "ip6tables-save",
        "ip",
        "sysctl",
    ] {
        let input = if tool.ends_with("-restore") {
            // Shell built-ins only: PATH holds nothing else.
            format!(
                "while IFS= read -r line; do echo \"$line\" >> {}; done\n",
                calls.display()
            )
        } else {
            String::new()
        };
        let script = format!(
            "#!/bin/sh\necho \"{tool} $*\" >> {calls}\n{input}\
             case \" $* \" in *\" -S \"*|*\" -C \"*) exit 1;; esac\nexit 0\n",
            calls = calls.display()
        );
        let path = tools.join(tool);
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    (tools, calls)
}

/// In-pod ADD of pod `namespace/web-0` (`uid`) in the plugin's own network
/// namespace, with `tools` as its whole `PATH`.
fn inpod_add(socket: &Path, state: &Path, namespace: &str, uid: &str, tools: &Path) -> Output {
    let conf = format!(
        r#"{{"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "tidegate-cni",
            "socket": "{}", "timeout_ms": 5000, "capture": "inpod", "state_dir": "{}",
            "prevResult": {{"cniVersion": "1.0.0", "interfaces": [{{"name": "eth0"}}],
                            "ips": [{{"address": "10.1.2.3/24", "interface": 0}},
                                    {{"address": "fd00:1::3/64", "interface": 0}}]}}}}"#,
        socket.display(),
        state.display()
    );
    let mut child = Command::new(CNI)
        .env_clear()
        .env("PATH", tools)
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", "c0ffee")
        .env("CNI_NETNS", "/proc/self/ns/net")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/opt/cni/bin")
        .env(
            "CNI_ARGS",
            format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME=web-0;K8S_POD_UID={uid}"),
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

fn calls_of(calls: &Path) -> String {
    std::fs::read_to_string(calls).unwrap_or_default()
}

/// A gateway that answers one `add` with `answer`.
fn answering_add(dir: &Path, uid: &'static str, answer: &'static str) -> FakeGateway {
    FakeGateway::start(dir, move |mut s, _| {
        let req = read_request(&mut s);
        assert!(
            req.contains("\"command\":\"add\"") && req.contains(&format!("\"uid\":\"{uid}\"")),
            "{req}"
        );
        s.write_all(format!("{answer}\n").as_bytes()).unwrap();
    })
}

#[test]
fn add_captures_a_mesh_member_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let (tools, calls) = capture_tools(dir.path());
    let state = dir.path().join("pods");
    let records = || tidegate_netns::pod_records::PodRecord::read_all(&state);
    let stderr = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();

    // The gateway says the pod is not a member: ADD succeeds with the
    // previous result, no capture tool runs, no record stays.
    let reason = "neither the pod nor its namespace opts in";
    let peer = answering_add(
        dir.path(),
        "u-out",
        r#"{"result":"not-member","reason":"neither the pod nor its namespace opts in"}"#,
    );
    let out = inpod_add(&peer.path, &state, "demo", "u-out", &tools);
    peer.stop();
    assert!(out.status.success(), "{}", stderr(&out));
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["ips"][0]["address"], "10.1.2.3/24");
    assert!(
        stderr(&out).contains(&format!("is not a mesh member ({reason}): not captured")),
        "{}",
        stderr(&out)
    );
    assert_eq!(calls_of(&calls), "", "nothing captured");
    assert!(records().is_empty());

    // kube-system is never meshed: no gateway needed, nothing captured.
    let nobody = dir.path().join("nobody.sock");
    let out = inpod_add(&nobody, &state, "kube-system", "u-sys", &tools);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("never meshed"), "{}", stderr(&out));
    // Any other pod without a gateway to ask: try again later (it might be
    // a member), and nothing captured meanwhile.
    let out = inpod_add(&nobody, &state, "demo", "u-wait", &tools);
    assert!(!out.status.success());
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["code"], 11, "{e}");
    assert_eq!(calls_of(&calls), "");
    assert!(records().is_empty());

    // A member is captured: its rules go in (entering a namespace — here
    // the test's own, through the stand-ins — takes root).
    let root = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) == 0;
    if !root {
        eprintln!("SKIPPED the member half: entering a network namespace needs root");
        return;
    }
    let peer = answering_add(dir.path(), "u-in", r#"{"result":"added"}"#);
    let out = inpod_add(&peer.path, &state, "demo", "u-in", &tools);
    peer.stop();
    assert!(out.status.success(), "{}", stderr(&out));
    let ran = calls_of(&calls);
    for line in [
        "iptables-restore --noflush",
        "-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001",
        "ip -4 rule add fwmark 0x111/0xfff pref 32764 lookup 100",
        "iptables -w -t nat -A TIDEGATE_PROBES -d 10.1.2.3/32",
        // The IPv6 probe exemption, for the pod's IPv6 address.
        "ip6tables -w -t nat -A TIDEGATE_PROBES -d fd00:1::3/128 -p tcp -m owner --socket-exists -j SNAT --to-source fd16:9254:7127:1337:ffff:ffff:ffff:ffff",
    ] {
        assert!(ran.contains(line), "{line:?} not in:\n{ran}");
    }
    // IPv6 is captured with IPv4 wherever the namespace (here the test's
    // own) has it.
    let ipv6 = tidegate_netns::capture::ipv6_absent(Path::new("/proc/sys/net/ipv6")).is_none();
    if ipv6 {
        for line in [
            "ip6tables-restore --noflush",
            "-A ISTIO_OUTPUT ! -d ::1/128 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001",
            "ip -6 rule add fwmark 0x111/0xfff pref 32764 lookup 100",
            "ip -6 route add local ::/0 dev lo table 100",
        ] {
            assert!(ran.contains(line), "{line:?} not in:\n{ran}");
        }
    } else {
        assert!(!ran.contains("ip6tables-restore"), "{ran}");
        assert!(stderr(&out).contains("IPv4 rules only"), "{}", stderr(&out));
    }
    assert_eq!(
        records().len(),
        1,
        "the member is recorded for a restarted gateway"
    );
    if !ipv6 {
        return;
    }

    // A node without working ip6tables (here a restore that fails as one
    // without the ip6_tables module does): the ADD is refused, naming
    // why, and the IPv4 rules just installed are taken out again.
    use std::os::unix::fs::PermissionsExt;
    let failing = tools.join("ip6tables-restore");
    std::fs::write(
        &failing,
        format!(
            "#!/bin/sh\necho \"ip6tables-restore $*\" >> {}\n\
             echo \"ip6tables-restore v1.8.9 (nf_tables): can't initialize ip6tables table \\`nat': Table does not exist\" >&2\nexit 1\n",
            calls.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&failing, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(&calls, "").unwrap();
    let peer = answering_add(dir.path(), "u-v6", r#"{"result":"added"}"#);
    let out = inpod_add(&peer.path, &state, "demo", "u-v6", &tools);
    peer.stop();
    assert!(!out.status.success(), "{}", stderr(&out));
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["code"], 5, "{e}");
    let details = e["details"].as_str().unwrap();
    for part in [
        "IPv6 is on in the pod but its IPv6 capture rules cannot be installed",
        "Table does not exist",
        "rather than let IPv6 bypass the mesh",
    ] {
        assert!(details.contains(part), "{part:?} not in {details}");
    }
    let ran = calls_of(&calls);
    // IPv4 went in first, then came out: its save was read for the removal.
    let v4 = ran
        .find("iptables-restore --noflush")
        .expect("IPv4 rules installed");
    let v6 = ran.find("ip6tables-restore --noflush").expect("IPv6 tried");
    let undo = ran.rfind("iptables-save").expect("IPv4 rules removed");
    assert!(v4 < v6 && v6 < undo, "{ran}");
    // No probe exemption for a pod that is not enrolled.
    assert!(!ran.contains("TIDEGATE_PROBES"), "{ran}");
}

/// Polls `done` until it holds, for at most `within`.
fn eventually(what: &str, within: Duration, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "not within {within:?}: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The first step of removing tidegate from a node: the plugin is unchained
/// and kept out while the gateway still runs — a previous installer that
/// re-chains it is undone — and its binary goes only in a round that found
/// nothing to unchain (the runtime has re-read its configuration by then).
#[test]
fn uninstall_with_watch_keeps_the_plugin_out_then_removes_its_binary() {
    let dir = tempfile::tempdir().unwrap();
    let (bin, conf) = (dir.path().join("bin"), dir.path().join("net.d"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&conf).unwrap();
    let list = conf.join("10-flannel.conflist");
    std::fs::write(&list, FLANNEL).unwrap();
    let installed = bin.join("tidegate-cni");
    let chained = || {
        json_file(&list)["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["type"] == "tidegate-cni")
    };
    assert!(admin("install", &bin, &conf, &[]).status.success());
    assert!(chained() && installed.exists());

    let mut child = Command::new(CNI)
        .env_remove("CNI_COMMAND")
        .arg("uninstall")
        .arg("--cni-bin-dir")
        .arg(&bin)
        .arg("--cni-conf-dir")
        .arg(&conf)
        .args(["--watch", "1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            let _ = tx.send(line.unwrap());
        }
    });
    // The next line saying `what` (a re-chain racing a round may first
    // have the binary removed alone, the configuration rewritten after).
    let next = |what: &str| loop {
        let line = lines.recv_timeout(Duration::from_secs(20)).unwrap();
        if line.contains(what) {
            return line;
        }
    };
    let want: serde_json::Value = serde_json::from_str(FLANNEL).unwrap();
    for round in ["first", "after a re-chain"] {
        // Unchained first, the binary still there for that round...
        next("unchained from");
        assert_eq!(json_file(&list), want, "{round}");
        // ...and removed in the next one, the plugin still out.
        next("removed");
        eventually("the binary removed", Duration::from_secs(20), || {
            !installed.exists()
        });
        assert!(!chained(), "{round}");
        if round == "first" {
            // The previous pod's installer, still running during a rollout.
            assert!(admin("install", &bin, &conf, &[]).status.success());
            assert!(chained());
        }
    }
    assert_eq!(
        child.try_wait().unwrap(),
        None,
        "it keeps running (a sidecar)"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}
