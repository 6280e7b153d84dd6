//! The real `tidegate` binary: `run` with a config file, `connect` through
//! it, SIGTERM, and bad configuration.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_tidegate");

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
    let mut child = Command::new(BIN)
        .args(["run", "--config"])
        .arg(config)
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
             certificates: {{source: dev-ca, state_dir: {ca}}}\nworkloads: {{file: {wl}}}\ndemo: {{echo: 127.51.0.2:0}}\n",
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

    let mut connect = Command::new(BIN)
        .args(["connect", "--config"])
        .arg(&config)
        .args([
            "--to",
            &echo,
            "--via",
            &format!("127.51.0.2:{inbound_port}"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    connect
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello over hbone\n")
        .unwrap();
    let out = connect.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"hello over hbone\n");
    gw.wait_for("stream ended");

    // SIGTERM: drains (no streams left) and exits 0.
    let pid = gw.child.id() as i32;
    unsafe { libc::kill(pid, libc::SIGTERM) };
    gw.wait_for("drained");
    let mut gw = gw;
    let status = wait_bounded(&mut gw.child);
    assert!(status.success(), "{status:?}");
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
}

fn wait_bounded(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "gateway did not exit after SIGTERM"
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
