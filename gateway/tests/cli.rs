//! The real `tidegate` binary: `run` with a config file, `connect` through
//! it, SIGTERM, bad configuration, and a plugin from `tidegate-plugin new`
//! through `tidegate-plugin build`, `tidegate policy check|test` and a hot swap.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_tidegate");

#[path = "cli/operator.rs"]
mod operator;

struct Gateway {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Gateway {
    /// Waits for a log line containing `needle`, bounded. Logs go to a
    /// pipe here, so no line may carry ANSI colour codes.
    fn wait_for(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains('\u{1b}') => panic!("ANSI codes in a piped log: {l:?}"),
                Ok(l) if l.contains(needle) => return l,
                Ok(_) => {}
                Err(e) => panic!("no log line with {needle:?}: {e}"),
            }
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

fn field(line: &str, key: &str) -> String {
    let at = line
        .find(&format!("{key}="))
        .unwrap_or_else(|| panic!("{key} in {line}"));
    line[at + key.len() + 1..]
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

fn start(config: &std::path::Path) -> Gateway {
    spawn(&["run", "--config", config.to_str().expect("a UTF-8 path")])
}

/// `tidegate ARGS` with its log lines piped back.
fn spawn(args: &[&str]) -> Gateway {
    let mut child = Command::new(BIN)
        .args(args)
        .env("TIDEGATE_LOG", "info")
        .env_remove("NO_COLOR")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    Gateway { child, lines }
}

fn write_config(dir: &std::path::Path) -> std::path::PathBuf {
    write_config_with(dir, "")
}

/// The test config plus `extra` YAML lines.
fn write_config_with(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let workloads = dir.join("workloads.yaml");
    std::fs::write(
        &workloads,
        "workloads:\n- {uid: echo-uid, name: echo, namespace: demo, service_account: echo, ips: [127.51.0.2], node: node-a}\n",
    )
    .unwrap();
    let config = dir.join("tidegate.yaml");
    std::fs::write(
        &config,
        format!(
            "node_name: node-a\nlisteners: {{outbound: 127.0.0.1:0, inbound: 0.0.0.0:0, admin: 127.0.0.1:0, metrics: 127.0.0.1:0, readiness: 127.0.0.1:0}}\n\
             certificates: {{source: dev-ca, state_dir: {ca}}}\nworkloads: {{file: {wl}}}\ndemo: {{echo: 127.51.0.2:0}}\n{extra}",
            ca = dir.join("ca").display(),
            wl = workloads.display()
        ),
    )
    .unwrap();
    config
}

#[test]
fn run_connect_and_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let gw = start(&config);
    let echo = gw.wait_for("demo echo backend listening");
    let echo = field(&echo, "addr");
    let ready = gw.wait_for("tidegate ready");
    let inbound_port = field(&ready, "inbound")
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    let admin = field(&ready, "admin");
    let dump = http_get(&admin, "/config_dump");
    assert!(dump.contains("echo-uid"), "{dump}");

    // `tidegate workloads`: the workload, its policy and why (no policy
    // is configured here: the built-in fallback).
    let out = Command::new(BIN)
        .args(["workloads", "echo", "--admin", &admin])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = table.lines().nth(1).unwrap_or_default();
    assert!(
        row.contains("demo/echo")
            && row.contains("running")
            && row.contains("keepalive-only")
            && row.contains("built-in fallback"),
        "{table}"
    );

    echo_through_connect(&config, &echo, &inbound_port, b"hello over hbone\n");
    gw.wait_for("stream ended");

    // SIGTERM: drains (no streams left) and exits 0.
    let pid = gw.child.id() as i32;
    // SAFETY: kill(2) on the pid of a child this test spawned and still owns.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    gw.wait_for("drained");
    let mut gw = gw;
    let status = wait_bounded(&mut gw.child);
    assert!(status.success(), "{status:?}");
}

/// `tidegate connect` with stdin still open exits non-zero with a message
/// when the gateway ends its stream (here: shutdown resets it at the
/// deadline), instead of waiting for stdin to close.
#[test]
fn connect_exits_when_the_gateway_ends_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config_with(dir.path(), "shutdown: {deadline: 300ms}\n");
    let gw = start(&config);
    let echo = field(&gw.wait_for("demo echo backend listening"), "addr");
    let ready = gw.wait_for("tidegate ready");
    let inbound_port = field(&ready, "inbound")
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    let mut connect = spawn_connect(&config, &echo, &inbound_port);
    // The stream is up once the echo comes back; stdin stays open.
    let mut stdin = connect.stdin.take().unwrap();
    stdin.write_all(b"ping\n").unwrap();
    let mut stdout = BufReader::new(connect.stdout.take().unwrap());
    let mut echoed = String::new();
    stdout.read_line(&mut echoed).unwrap();
    assert_eq!(echoed, "ping\n");

    let pid = gw.child.id() as i32;
    // SAFETY: kill(2) on the pid of a child this test spawned and still owns.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = wait_bounded(&mut connect);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut connect.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        !status.success(),
        "connect exited 0 after its stream was ended: {err}"
    );
    assert!(err.contains("ended") || err.contains("closed"), "{err}");
    drop(stdin);
    // The gateway says what happened to the one stream open: reset, or
    // closed cleanly, as it ended.
    let line = gw.wait_for("drain deadline reached");
    assert_eq!(field(&line, "open_at_start"), "1", "{line}");
    let count = |key: &str| field(&line, key).parse::<u64>().unwrap();
    let (reset, clean) = (count("reset"), count("closed_cleanly"));
    assert_eq!(reset + clean + count("still_open"), 1, "{line}");
    assert_eq!(line.contains("1 reset"), reset == 1, "{line}");
    assert_eq!(line.contains("1 closed cleanly"), clean == 1, "{line}");
}

#[test]
fn bad_config_names_the_key_and_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.yaml");
    std::fs::write(&config, "hbone:\n  keepalive_interval: often\n").unwrap();
    let out = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`hbone.keepalive_interval`") && err.contains("10s"),
        "{err}"
    );

    let out = Command::new(BIN)
        .args(["run", "--set", "listeners.admin=not-an-address"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`listeners.admin`"), "{err}");

    // A missing file: named, and its cause said once.
    let missing = dir.path().join("missing.yaml");
    let out = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&missing)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&*missing.to_string_lossy()), "{err}");
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
}

/// `proxy ztunnel`, the arguments Cilium's DaemonSet passes: the gateway
/// with `control_plane: cilium`, ztunnel's variables read (a bad one named
/// with its variable); another component is a usage error.
#[test]
fn proxy_ztunnel_runs_as_ciliums_ztunnel() {
    let out = Command::new(BIN)
        .args(["proxy", "ztunnel"])
        .env("XDS_ADDRESS", "unix://cilium/xds.sock")
        .env("NODE_NAME", "10.0.0.7")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`workloads.istio.address`") && err.contains("XDS_ADDRESS"),
        "{err}"
    );
    let out = Command::new(BIN).args(["proxy", "envoy"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error");
}

/// A port another process holds: `run` fails naming the port, the key and
/// the holder (here, this test), for a listener and for the demo echo backend.
#[test]
fn a_taken_port_names_its_holder() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let holder = format!(
        "in use by pid {} ({})",
        std::process::id(),
        std::fs::read_to_string("/proc/self/comm").unwrap().trim()
    );
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&config)
        .args(["--set", &format!("listeners.admin=127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "cannot listen on 127.0.0.1:{port} for admin: Address already in use"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "port {port} is {holder}: stop it or change `listeners.admin`"
        )),
        "{err}"
    );

    let echo = std::net::TcpListener::bind("127.51.0.2:0").unwrap();
    let echo = echo.local_addr().unwrap();
    let out = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&config)
        .args(["--set", &format!("demo.echo={echo}")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot listen on {echo} for demo.echo: "))
            && err.contains(&format!(
                "port {} is {holder}: stop it or change `demo.echo`",
                echo.port()
            )),
        "{err}"
    );
}

/// The metrics port never holds a half-sent request: it is closed after
/// `control_plane.header_read_timeout` and counted; a good request is
/// served afterwards. The open-file limit is raised and logged at start.
#[test]
fn a_half_sent_request_is_closed_after_the_header_read_timeout() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config_with(dir.path(), "control_plane: {header_read_timeout: 300ms}\n");
    let gw = start(&config);
    let limits = gw.wait_for("open-file limit");
    for key in [
        "soft_before",
        "soft",
        "hard",
        "control_plane_budget",
        "data_path_reserve",
    ] {
        field(&limits, key);
    }
    let metrics = field(&gw.wait_for("tidegate ready"), "metrics");

    let mut half = std::net::TcpStream::connect(&metrics).unwrap();
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n")
        .unwrap();
    // Bounds the test only: the gateway's timeout is 300 ms.
    half.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut rest = Vec::new();
    let read = half.read_to_end(&mut rest);
    assert!(
        matches!(read, Ok(0))
            || matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "the half-sent request must be closed, got {read:?} {rest:?}"
    );

    // Not HTTP: hyper's 400, closed, counted.
    let mut bad = std::net::TcpStream::connect(&metrics).unwrap();
    bad.write_all(b"\x00\x01 NOT HTTP\r\n\r\n").unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut answer = String::new();
    let read = bad.read_to_string(&mut answer);
    assert!(
        read.is_ok() && (answer.is_empty() || answer.starts_with("HTTP/1.1 400")),
        "{read:?} {answer:?}"
    );

    let text = http_get(&metrics, "/metrics");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    for reason in ["header_timeout", "bad_request"] {
        let series =
            format!(r#"tidegate_control_refusals_total{{listener="metrics",reason="{reason}"}} 1"#);
        assert!(text.contains(&series), "{series}:\n{text}");
    }
}

/// Reads a connection to its end: `true` when it was closed without an
/// answer (EOF, or a reset), bounded by a read timeout for the test's sake.
fn closed_unanswered(mut tcp: std::net::TcpStream) -> Result<(), String> {
    use std::io::Read;
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut answer = Vec::new();
    match tcp.read_to_end(&mut answer) {
        Ok(0) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(()),
        other => Err(format!("{other:?} {:?}", String::from_utf8_lossy(&answer))),
    }
}

/// A GET that may be refused: the status line, or `None` when the
/// connection was closed (or reset) unanswered.
fn probe(addr: &str, path: &str) -> Option<String> {
    use std::io::Read;
    let mut tcp = std::net::TcpStream::connect(addr).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        tcp,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    tcp.read_to_string(&mut out).ok()?;
    out.lines().next().map(str::to_owned)
}

/// Sends an upload whose body never comes, with `Expect: 100-continue`, and
/// returns once hyper answered `100 Continue`: it does so when the handler
/// starts reading the body, so the connection is then inside its request.
fn upload_inside_its_request(admin: &str) -> std::net::TcpStream {
    use std::io::Read;
    let mut tcp = std::net::TcpStream::connect(admin).unwrap();
    write!(
        tcp,
        "PUT /policies/slow HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n"
    )
    .unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !seen.ends_with(b"\r\n\r\n") {
        let n = tcp.read(&mut byte).expect("100 Continue within 20 s");
        assert_eq!(
            n,
            1,
            "closed before 100 Continue: {:?}",
            String::from_utf8_lossy(&seen)
        );
        seen.push(byte[0]);
    }
    assert!(
        seen.starts_with(b"HTTP/1.1 100"),
        "{:?}",
        String::from_utf8_lossy(&seen)
    );
    tcp
}

/// A listener at its cap makes room for a new connection by closing the
/// one idle the longest (here, two connections that never sent a byte);
/// only when every connection is inside a request (two uploads whose body
/// never comes) is the new one closed at once. Both are counted.
#[test]
fn a_full_listener_evicts_the_longest_idle_connection_or_refuses_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config_with(
        dir.path(),
        "control_plane: {header_read_timeout: 60s, max_connections: 2}\n",
    );
    let gw = start(&config);
    let ready = gw.wait_for("tidegate ready");
    let (metrics, admin) = (field(&ready, "metrics"), field(&ready, "admin"));

    // Two idle connections take both slots (the kernel hands them to the
    // accept loop first, in order); a request on a third is answered, and
    // the older idle one is closed for it.
    let oldest = std::net::TcpStream::connect(&metrics).unwrap();
    let _newer = std::net::TcpStream::connect(&metrics).unwrap();
    let answer = probe(&metrics, "/metrics");
    assert_eq!(answer.as_deref(), Some("HTTP/1.1 200 OK"));
    closed_unanswered(oldest).expect("the oldest idle connection is closed");

    // Two uploads inside their request fill the admin port: a third
    // connection is closed unanswered.
    let busy = [
        upload_inside_its_request(&admin),
        upload_inside_its_request(&admin),
    ];
    let mut third = std::net::TcpStream::connect(&admin).unwrap();
    let _ = write!(
        third,
        "GET /policies HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    );
    closed_unanswered(third).expect("a third connection is closed unanswered");
    let text = http_get(&metrics, "/metrics");
    // The metrics scrape itself may evict the other idle connection (the
    // probe's may not have been released yet): at least one of each.
    for series in [
        r#"tidegate_control_refusals_total{listener="metrics",reason="evicted"} "#,
        r#"tidegate_control_refusals_total{listener="admin",reason="over_capacity"} "#,
    ] {
        let v = text
            .lines()
            .find_map(|l| l.strip_prefix(series))
            .unwrap_or_else(|| panic!("no {series}:\n{text}"));
        assert!(v.parse::<f64>().unwrap() >= 1.0, "{series}{v}");
    }
    drop(busy);
}

/// Half-sent requests, reopened as soon as they are closed, hold every
/// slot of the readiness port: every probe is answered anyway (each takes
/// the slot of the connection idle the longest). Without that, a kubelet
/// would have restarted a healthy gateway: 0 of 25 probes were answered.
#[test]
fn probes_are_answered_while_half_sent_requests_hold_every_slot() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const CAP: usize = 4;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config_with(
        dir.path(),
        &format!("control_plane: {{header_read_timeout: 60s, max_connections: {CAP}}}\n"),
    );
    let gw = start(&config);
    let ready = gw.wait_for("tidegate ready");
    let (metrics, readiness) = (field(&ready, "metrics"), field(&ready, "readiness"));
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let attackers: Vec<_> = (0..CAP)
        .map(|_| {
            let (addr, stop) = (readiness.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut tcp) = std::net::TcpStream::connect(&addr) else {
                        return;
                    };
                    let _ = tcp.write_all(b"GET /healthz/ready HTTP/1.1\r\nHost: t\r\n");
                    // Holds until the gateway closes it; then again.
                    let _ = closed_unanswered(tcp);
                }
            })
        })
        .collect();
    let held = format!(r#"tidegate_control_connections_open{{listener="readiness"}} {CAP}"#);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !http_get(&metrics, "/metrics").contains(&held) {
        assert!(
            Instant::now() < deadline,
            "the attackers never held every slot"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let answered = (0..25)
        .filter(|_| probe(&readiness, "/healthz/ready").as_deref() == Some("HTTP/1.1 200 OK"))
        .count();
    stop.store(true, Ordering::Relaxed);
    drop(gw);
    for a in attackers {
        a.join().unwrap();
    }
    assert_eq!(
        answered, 25,
        "probes answered while half-sent requests held the port"
    );
}

/// The control plane may take at most half of the open-file limit: under a
/// limit of 200, the default caps (budget 160) are refused at start, naming
/// the keys; smaller caps start, and the limit is logged.
#[test]
fn a_control_plane_budget_over_half_the_descriptor_limit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let under_limit = |config: &std::path::Path| {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "ulimit -n 200 && exec \"$0\" run --config \"$1\"",
            BIN,
        ])
        .arg(config)
        .env("TIDEGATE_LOG", "info");
        cmd
    };
    let config = write_config(dir.path());
    let out = under_limit(&config).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("160 descriptors") && err.contains("control_plane.max_connections"),
        "{err}"
    );

    let config = write_config_with(dir.path(), "control_plane: {max_connections: 8}\n");
    let mut child = under_limit(&config)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    let gw = Gateway { child, lines };
    let limits = gw.wait_for("open-file limit");
    assert_eq!(field(&limits, "soft"), "200", "{limits}");
    assert_eq!(field(&limits, "control_plane_budget"), "88", "{limits}");
    let metrics = field(&gw.wait_for("tidegate ready"), "metrics");
    assert!(http_get(&metrics, "/metrics").starts_with("HTTP/1.1 200"));
}

/// A workload file truncated in place (what a non-atomic rewrite leaves for
/// a moment) is refused: the workloads stay and clients are still served.
/// `workloads: []` is the way to say "none".
#[test]
fn a_truncated_workload_file_keeps_the_workloads() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let gw = start(&config);
    let echo = field(&gw.wait_for("demo echo backend listening"), "addr");
    let ready = gw.wait_for("tidegate ready");
    let inbound_port = field(&ready, "inbound")
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    let (admin, metrics) = (field(&ready, "admin"), field(&ready, "metrics"));

    // `tidegate connect` reads the workload file too: it gets its own copy.
    let workloads = dir.path().join("workloads.yaml");
    let client_workloads = dir.path().join("client-workloads.yaml");
    std::fs::copy(&workloads, &client_workloads).unwrap();
    let client_config = dir.path().join("client.yaml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &client_config,
        text.replace(
            &workloads.display().to_string(),
            &client_workloads.display().to_string(),
        ),
    )
    .unwrap();

    std::fs::File::create(&workloads).unwrap();
    let rejected = gw.wait_for("workload file rejected");
    assert!(
        rejected.contains(&workloads.display().to_string()) && rejected.contains("empty"),
        "{rejected}"
    );
    assert!(http_get(&admin, "/config_dump").contains("echo-uid"));
    assert!(http_get(&metrics, "/metrics")
        .contains(r#"tidegate_workload_file_rejected_total{reason="empty"} 1"#));
    echo_through_connect(&client_config, &echo, &inbound_port, b"still served\n");

    std::fs::write(&workloads, "workloads: []\n").unwrap();
    let reloaded = gw.wait_for("workload file reloaded");
    assert_eq!(field(&reloaded, "workloads"), "0", "{reloaded}");
    assert!(!http_get(&admin, "/config_dump").contains("echo-uid"));
}

/// `tidegate connect` to the echo backend through the gateway's inbound
/// port, all three stdio streams piped.
fn spawn_connect(config: &std::path::Path, echo: &str, inbound_port: &str) -> Child {
    Command::new(BIN)
        .args(["connect", "--config"])
        .arg(config)
        .args(["--to", echo, "--via", &format!("127.51.0.2:{inbound_port}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `tidegate connect` sends `line` and must exit 0 having echoed exactly it.
fn echo_through_connect(config: &std::path::Path, echo: &str, inbound_port: &str, line: &[u8]) {
    let mut connect = spawn_connect(config, echo, inbound_port);
    connect.stdin.take().unwrap().write_all(line).unwrap();
    let out = connect.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, line);
}

fn wait_bounded(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "process {} did not exit within 20 s",
            child.id()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn http_get(addr: &str, path: &str) -> String {
    use std::io::Read;
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    write!(
        tcp,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).unwrap();
    out
}

/// Where the crates `plugin new` creates in tests are built: one shared,
/// incremental target dir under the workspace's, so the SDK is compiled
/// for wasm32 once, not on every run.
const PLUGIN_TARGET_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/plugin-new-test");

/// Runs `program args` in `dir` with output captured, killed after `limit`.
fn run_bounded(program: &str, args: &[&str], dir: &std::path::Path, limit: Duration) -> Output {
    let mut child = Command::new(program)
        .args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", PLUGIN_TARGET_DIR)
        // No network in CI: resolve the new crate's dependencies from
        // cargo's cache (the workspace and plugins/ use the same crates).
        .env("CARGO_NET_OFFLINE", "true")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {program}: {e}"));
    let read = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            let _ = pipe.read_to_end(&mut out);
            out
        })
    };
    let stdout = read(Box::new(child.stdout.take().unwrap()));
    let stderr = read(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{program} {args:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// `tidegate args` in `dir`; cargo builds get ten minutes (the first one
/// compiles the SDK for wasm32).
fn tidegate_in(dir: &std::path::Path, args: &[&str]) -> Output {
    run_bounded(BIN, args, dir, Duration::from_secs(600))
}

/// `tidegate-plugin args` in `dir`: the plugin toolchain's own binary,
/// beside the gateway's in the target directory (the test command builds
/// every binary of the workspace before it runs a test).
fn plugin_in(dir: &std::path::Path, args: &[&str]) -> Output {
    let bin = std::path::Path::new(BIN).with_file_name("tidegate-plugin");
    assert!(
        bin.is_file(),
        "{} is not built: cargo build -p tidegate-plugin-build (cargo xtask test builds it)",
        bin.display()
    );
    run_bounded(bin.to_str().unwrap(), args, dir, Duration::from_secs(600))
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn refused(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "expected a failure, got:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The sdk/README.md path: `tidegate-plugin new`, native `cargo test`,
/// `tidegate-plugin build`, `tidegate policy check|test`, and the printed
/// `curl -X PUT` hot swap on a running gateway.
#[test]
fn plugin_new_builds_checks_passes_its_trace_and_hot_swaps() {
    let tmp = tempfile::tempdir().unwrap();
    let out = ok(&plugin_in(tmp.path(), &["new", "my-policy"]));
    assert!(out.starts_with("created policy crate my-policy"), "{out}");
    let krate = tmp.path().join("my-policy");

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let tests = ok(&run_bounded(
        &cargo,
        &["test"],
        &krate,
        Duration::from_secs(600),
    ));
    assert!(tests.contains("test tests::trace_passes ... ok"), "{tests}");
    assert!(tests.contains("test result: ok. 3 passed"), "{tests}");

    let out = ok(&plugin_in(&krate, &["build"]));
    assert!(out.starts_with("wrote target/my-policy.wasm ("), "{out}");
    // Release by default: small enough for the tidegate-plugins ConfigMap.
    assert!(
        out.lines().next().unwrap().ends_with(" bytes, release)"),
        "{out}"
    );
    assert!(!out.contains("not for a ConfigMap"), "{out}");
    let size = std::fs::metadata(krate.join("target/my-policy.wasm"))
        .unwrap()
        .len();
    assert!(size < 1 << 20, "{size} bytes");
    assert!(
        out.contains(&format!(
            "exports: tidegate:policy/policy@{}",
            tidegate_sdk::CONTRACT_VERSION
        )),
        "{out}"
    );
    assert!(
        out.contains("\n  tidegate policy test target/my-policy.wasm trace.yaml\n"),
        "{out}"
    );
    let wasm = krate.join("target/my-policy.wasm");
    assert!(wasm.is_file());

    let out = ok(&tidegate_in(
        &krate,
        &["policy", "check", "target/my-policy.wasm"],
    ));
    assert!(out.starts_with("ok: target/my-policy.wasm"), "{out}");
    let out = ok(&tidegate_in(
        &krate,
        &["policy", "test", "target/my-policy.wasm", "trace.yaml"],
    ));
    assert!(out.ends_with("ok: 3 steps passed\n"), "{out}");

    // --out and --path from elsewhere.
    let elsewhere = tmp.path().join("out/p.wasm");
    let out = ok(&plugin_in(
        tmp.path(),
        &["build", "--path", "my-policy", "--out", "out/p.wasm"],
    ));
    assert!(out.starts_with("wrote out/p.wasm ("), "{out}");
    assert_eq!(
        std::fs::read(&elsewhere).unwrap(),
        std::fs::read(&wasm).unwrap()
    );

    // The hot swap the build prints, on a running gateway.
    let config = write_config(tmp.path());
    let gw = start(&config);
    let admin = field(&gw.wait_for("tidegate ready"), "admin");
    let reply = http_put(
        &admin,
        "/policies/my-policy",
        &std::fs::read(&wasm).unwrap(),
    );
    // A name the gateway has not loaded yet is created (201), not swapped.
    assert!(reply.starts_with("HTTP/1.1 201"), "{reply}");
    assert!(reply.contains("\"created\""), "{reply}");
    assert!(http_get(&admin, "/policies").contains("my-policy"));
}

#[test]
fn plugin_new_refuses_bad_names_non_empty_directories_and_non_sdks() {
    let tmp = tempfile::tempdir().unwrap();
    let err = refused(&plugin_in(tmp.path(), &["new", "My Policy"]));
    assert!(
        err.contains("invalid plugin name \"My Policy\": start with a lowercase letter"),
        "{err}"
    );
    let err = refused(&plugin_in(tmp.path(), &["new", "self"]));
    assert!(err.contains("a Rust keyword"), "{err}");

    std::fs::create_dir(tmp.path().join("taken")).unwrap();
    std::fs::write(tmp.path().join("taken/notes.txt"), "mine").unwrap();
    let err = refused(&plugin_in(tmp.path(), &["new", "p", "--path", "taken"]));
    assert!(
        err.contains("taken exists and is not empty; choose another name or --path"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(tmp.path().join("taken")).unwrap().count(),
        1,
        "nothing written"
    );

    let err = refused(&plugin_in(tmp.path(), &["new", "p", "--sdk", "taken"]));
    assert!(
        err.contains("--sdk ") && err.contains("not the tidegate SDK"),
        "{err}"
    );
    assert!(!tmp.path().join("p").exists());

    let err = refused(&plugin_in(tmp.path(), &["build"]));
    assert!(err.contains("no Cargo.toml in ."), "{err}");
}

/// A crate whose code imports a WASI function builds for wasm32, but is
/// refused with the import named.
#[test]
fn plugin_build_refuses_a_crate_importing_wasi() {
    let tmp = tempfile::tempdir().unwrap();
    ok(&plugin_in(tmp.path(), &["new", "wasi-user"]));
    let lib = tmp.path().join("wasi-user/src/lib.rs");
    let code = std::fs::read_to_string(&lib).unwrap();
    let decide = "fn decide(&mut self, event: &Event) -> Vec<Action> {\n";
    assert!(code.contains(decide));
    let code = code.replace(
        decide,
        &format!("{decide}        #[cfg(target_arch = \"wasm32\")]\n        unsafe {{ sched_yield(); }}\n"),
    ) + "\n#[cfg(target_arch = \"wasm32\")]\n#[link(wasm_import_module = \"wasi_snapshot_preview1\")]\n\
         extern \"C\" {\n    fn sched_yield() -> i32;\n}\n";
    std::fs::write(&lib, code).unwrap();

    let err = refused(&plugin_in(&tmp.path().join("wasi-user"), &["build"]));
    assert!(
        err.contains(
            "plugin wasi-user is not a drain policy: imports outside tidegate:policy/: \
             wasi_snapshot_preview1::sched_yield"
        ),
        "{err}"
    );
    assert!(!tmp.path().join("wasi-user/target/wasi-user.wasm").exists());
}

fn http_put(addr: &str, path: &str, body: &[u8]) -> String {
    use std::io::Read;
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    write!(
        tcp,
        "PUT {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    tcp.write_all(body).unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).unwrap();
    out
}

/// `policy check`/`policy test` load the config as `run` does and run the
/// plugin under its `policies:` limits (they used to have built-in limits of
/// their own, with a different init deadline than the gateway's).
#[test]
fn policy_check_runs_under_the_configs_plugin_limits() {
    let tmp = tempfile::tempdir().unwrap();
    let wasm = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/plugins/recommended.wasm"
    );
    let out = ok(&tidegate_in(tmp.path(), &["policy", "check", wasm]));
    assert!(out.starts_with("ok: "), "{out}");
    let err = refused(&tidegate_in(
        tmp.path(),
        &[
            "--set",
            "policies.memory_limit=64KiB",
            "policy",
            "check",
            wasm,
        ],
    ));
    assert!(err.contains("refused") && err.contains("memory"), "{err}");
    let err = refused(&tidegate_in(
        tmp.path(),
        &[
            "--set",
            "policies.init_deadline=9999999999h",
            "policy",
            "check",
            wasm,
        ],
    ));
    assert!(
        err.contains("`policies.init_deadline`") && err.contains("8784h"),
        "{err}"
    );
}

/// `tidegate args` against a running gateway: (success, stdout, stderr).
fn tidegate_ops(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The status line and body of `method path` on the admin API.
fn admin_request(addr: &str, method: &str, path: &str, body: &[u8]) -> (String, String) {
    use std::io::Read;
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    write!(
        tcp,
        "{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    tcp.write_all(body).unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

/// The admin API's `/workloads/<uid|ns/name>/…`: `ns/name` as `%2F` or two
/// segments resolves to the one local workload of that name; none is a 404
/// naming it, two (a re-created pod) a 409 listing the uids, a malformed
/// one a 400 saying what is wrong.
#[test]
fn admin_routes_resolve_namespace_name_to_one_local_workload() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    std::fs::write(
        dir.path().join("workloads.yaml"),
        "workloads:\n\
         - {uid: echo-uid, name: echo, namespace: demo, service_account: echo, ips: [127.51.0.2], node: node-a}\n\
         - {uid: web-1, name: web, namespace: shop, ips: [127.51.0.3], node: node-a}\n\
         - {uid: web-2, name: web, namespace: shop, ips: [127.51.0.4], node: node-a}\n\
         - {uid: db-1, name: db, namespace: shop, ips: [10.9.0.5], node: node-b}\n",
    )
    .unwrap();
    let gw = start(&config);
    let admin = field(&gw.wait_for("tidegate ready"), "admin");
    let wasm = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/plugins/keepalive-only.wasm"
    ))
    .unwrap();
    let (status, body) = admin_request(&admin, "PUT", "/policies/trial", &wasm);
    assert!(status.contains(" 201 "), "{status} {body}");

    for path in [
        "/workloads/demo%2Fecho/policy",
        "/workloads/demo/echo/policy",
    ] {
        let (status, body) = admin_request(&admin, "PUT", path, b"trial");
        assert!(status.contains(" 200 "), "{path}: {status} {body}");
        let report: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(report["uid"], "echo-uid", "{body}");
        assert_eq!(report["policy"]["name"], "trial", "{body}");
    }
    let (status, body) = admin_request(&admin, "DELETE", "/workloads/demo%2Fecho/policy", b"");
    assert!(status.contains(" 200 "), "{status} {body}");
    assert!(body.contains("\"previous_binding\": \"trial\""), "{body}");

    let cases: [(&str, &str, &str, &[&str]); 6] = [
        (
            "POST",
            "/workloads/demo%2Fnope/shutdown-starting",
            " 404 ",
            &["no workload named demo/nope", "node-a"],
        ),
        (
            "PUT",
            "/workloads/shop%2Fdb/policy",
            " 404 ",
            &["shop/db runs on node node-b"],
        ),
        (
            "POST",
            "/workloads/shop/web/teardown",
            " 409 ",
            &["shop/web names 2 workloads", "uids web-1, web-2"],
        ),
        (
            "POST",
            "/workloads/%2Fecho/shutdown-starting",
            " 400 ",
            &["the namespace before '/' is empty"],
        ),
        (
            "DELETE",
            "/workloads/demo/echo/x%2Fy",
            " 400 ",
            &["more than one '/'"],
        ),
        (
            "DELETE",
            "/workloads/demo%zz",
            " 400 ",
            &["invalid percent-encoding"],
        ),
    ];
    for (method, path, want, says) in cases {
        let (status, body) = admin_request(&admin, method, path, b"trial");
        assert!(status.contains(want), "{method} {path}: {status} {body}");
        for s in says {
            assert!(body.contains(s), "{method} {path}: {body}");
        }
    }
    // The ambiguous name changed nothing: both pods still run.
    let dump = http_get(&admin, "/config_dump");
    assert!(
        !dump.contains("shutting-down") && !dump.contains("torn-down"),
        "{dump}"
    );
    // A uid is looked up as before.
    let (status, body) = admin_request(&admin, "POST", "/workloads/web-1/shutdown-starting", b"");
    assert!(status.contains(" 200 "), "{status} {body}");
}

/// `tidegate drain|bind|unbind <uid|ns/name>`: one line on success, exit 1
/// with the gateway's status and reason on a refusal.
#[test]
fn drain_bind_and_unbind_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let gw = start(&config);
    let admin = field(&gw.wait_for("tidegate ready"), "admin");
    let wasm = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/plugins/keepalive-only.wasm"
    ))
    .unwrap();
    let (status, body) = admin_request(&admin, "PUT", "/policies/trial", &wasm);
    assert!(status.contains(" 201 "), "{status} {body}");

    let (ok, out, err) = tidegate_ops(&["bind", "demo/echo", "trial", "--admin", &admin]);
    assert!(ok, "{out}{err}");
    assert!(
        out.starts_with("demo/echo (uid echo-uid): bound to trial; policy trial (")
            && out.ends_with("; no run-time binding before\n")
            && out.lines().count() == 1,
        "{out}"
    );
    let (ok, out, err) = tidegate_ops(&["bind", "demo/echo", "nope", "--admin", &admin]);
    assert!(!ok, "{out}");
    assert!(
        err.starts_with(&format!(
            "tidegate: admin API at {admin} answered 422 Unprocessable Entity: "
        )) && err.contains("no policy named \"nope\""),
        "{err}"
    );
    let (ok, out, err) = tidegate_ops(&["unbind", "echo-uid", "--admin", &admin]);
    assert!(ok, "{out}{err}");
    assert!(
        out.starts_with(
            "demo/echo (uid echo-uid): run-time binding removed; policy builtin:keepalive-only ("
        ) && out.ends_with("; run-time binding before: trial\n"),
        "{out}"
    );

    let (ok, out, err) = tidegate_ops(&["drain", "demo/nope", "--admin", &admin]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("answered 404 Not Found: no workload named demo/nope"),
        "{err}"
    );
    let (ok, _, err) = tidegate_ops(&["drain", "demo/echo", "--grace", "25h", "--admin", &admin]);
    assert!(!ok);
    assert!(
        err.contains("answered 400 Bad Request: query `grace`"),
        "{err}"
    );
    let (ok, out, err) = tidegate_ops(&["drain", "demo/echo", "--grace", "30s", "--admin", &admin]);
    assert!(ok, "{out}{err}");
    assert!(
        out.starts_with("demo/echo (uid echo-uid): draining, policy builtin:keepalive-only (")
            && out.lines().count() == 1,
        "{out}"
    );
    let (ok, out, _) = tidegate_ops(&["drain", "echo-uid", "--admin", &admin]);
    assert!(ok, "{out}");
    assert!(out.starts_with("echo-uid: already shutting down;"), "{out}");
    assert!(http_get(&admin, "/config_dump").contains("shutting-down"));

    for cmd in ["drain", "bind", "unbind"] {
        let (ok, out, _) = tidegate_ops(&[cmd, "--help"]);
        assert!(
            ok && out.contains("uid, namespace/name, IP, or name") && out.contains("--admin"),
            "{out}"
        );
    }
}
