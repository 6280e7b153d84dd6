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
    /// Waits for a log line containing `needle`, bounded.
    fn wait_for(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
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
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            // Strip ANSI colours if any.
            let plain: String = strip_ansi(&l);
            if tx.send(plain).is_err() {
                return;
            }
        }
    });
    Gateway { child, lines }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut esc = false;
    for c in s.chars() {
        match (esc, c) {
            (false, '\u{1b}') => esc = true,
            (true, 'm') => esc = false,
            (true, _) => {}
            (false, c) => out.push(c),
        }
    }
    out
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
