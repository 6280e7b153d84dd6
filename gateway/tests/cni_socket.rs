//! The gateway's side of the CNI socket (`drains.cni_socket`), spoken to
//! with a raw Unix stream as a misbehaving peer would: bad lines are
//! answered and closed, connections are capped. The plugin's side, the real
//! `tidegate-cni`, is tested in `cni/tests/cni.rs`.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// A gateway with a CNI socket and `control_plane` settings `extra`, no workloads of note.
async fn gateway_with_cni_socket(dir: &Path, control_plane: &str) -> (tidegate::app::App, PathBuf) {
    let wl = dir.join("w.yaml");
    std::fs::write(&wl, "workloads: []\n").unwrap();
    let socket = dir.join("cni.sock");
    let cfg = tidegate::config::Config::from_yaml(&format!(
        "node_name: n\nlisteners: {{outbound: 127.0.0.1:0, inbound: 127.0.0.1:0, admin: 127.0.0.1:0, metrics: 127.0.0.1:0, readiness: 127.0.0.1:0}}\n\
         certificates: {{source: dev-ca, state_dir: {ca}}}\nworkloads: {{file: {wl}}}\n\
         drains: {{cni_socket: {sock}}}\ncontrol_plane: {control_plane}\n",
        ca = dir.join("ca").display(),
        wl = wl.display(),
        sock = socket.display(),
    ))
    .unwrap();
    (tidegate::app::build(cfg).await.unwrap(), socket)
}

/// Sends `request` (as is) and returns the answer line, then whether the
/// gateway closed the connection after it.
async fn exchange(socket: &Path, request: &[u8]) -> (serde_json::Value, bool) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::UnixStream::connect(socket).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut r = tokio::io::BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).await.unwrap();
    let answer = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    let mut rest = [0u8; 1];
    // EOF, or a reset when the gateway closed with our bytes unread.
    let closed = !matches!(r.read(&mut rest).await, Ok(n) if n > 0);
    (answer, closed)
}

fn bounded<F: std::future::Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), f)
            .await
            .expect("test took over 60 s")
    })
}

fn series(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no series {series}:\n{text}"))
        .parse()
        .unwrap()
}

/// A line too long, not UTF-8 or not a request gets an error line and the
/// connection closed; a silent peer is closed after the read timeout; a
/// good request is answered afterwards.
#[test]
fn the_cni_socket_bounds_lines_and_answers_bad_ones() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let (app, socket) = gateway_with_cni_socket(dir.path(), "{cni_read_timeout: 300ms}").await;

        let mut long = vec![b'x'; 64 * 1024 + 1];
        long.push(b'\n');
        for (request, error) in [
            (long, "longer than 65536 bytes"),
            (b"\xff\xfe{}\n".to_vec(), "not UTF-8"),
            (b"{\"command\": \"teardown\"\n".to_vec(), "EOF"),
            (
                b"{\"command\": \"reboot\", \"uid\": \"u\"}\n".to_vec(),
                "unknown command",
            ),
        ] {
            let (answer, closed) = exchange(&socket, &request).await;
            assert_eq!(answer["result"], "bad-request", "{answer}");
            assert!(
                answer["error"].as_str().unwrap().contains(error),
                "{answer}"
            );
            assert!(closed);
        }
        // Silent: answered with the reason once the read timeout passes, then closed.
        let (answer, closed) = exchange(&socket, b"").await;
        assert!(
            answer["error"].as_str().unwrap().contains("within 300 ms"),
            "{answer}"
        );
        assert!(closed);

        let m = app.metrics_text();
        let refusals = |reason: &str| {
            series(
                &m,
                &format!(r#"tidegate_control_refusals_total{{listener="cni",reason="{reason}"}}"#),
            )
        };
        assert_eq!(refusals("line_too_long"), 1.0);
        assert_eq!(refusals("bad_request"), 3.0);
        assert_eq!(refusals("read_timeout"), 1.0);

        let (answer, _) = exchange(
            &socket,
            b"{\"command\": \"teardown\", \"uid\": \"nobody\"}\n",
        )
        .await;
        assert_eq!(answer["result"], "unknown-workload", "{answer}");
        // A pod handed to a gateway in node capture mode is refused, saying why.
        let (answer, _) = exchange(
            &socket,
            b"{\"command\": \"add\", \"uid\": \"u\", \"netns\": \"/var/run/netns/x\"}\n",
        )
        .await;
        assert_eq!(answer["result"], "error", "{answer}");
        assert!(
            answer["error"]
                .as_str()
                .unwrap()
                .contains("capture.mode: node"),
            "{answer}"
        );
        app.shutdown().await;
    });
}

/// Beyond `control_plane.cni_max_connections` a connection is closed at
/// once, unanswered, and counted; a slot freed serves a good request.
#[test]
fn the_cni_socket_caps_connections() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let (app, socket) = gateway_with_cni_socket(
            dir.path(),
            "{cni_read_timeout: 60s, cni_max_connections: 2}",
        )
        .await;
        let c1 = tokio::net::UnixStream::connect(&socket).await.unwrap();
        let _c2 = tokio::net::UnixStream::connect(&socket).await.unwrap();
        let mut c3 = tokio::net::UnixStream::connect(&socket).await.unwrap();
        let good = b"{\"command\": \"teardown\", \"uid\": \"nobody\"}\n";
        let _ = c3.write_all(good).await;
        let mut answer = Vec::new();
        let _ = c3.read_to_end(&mut answer).await;
        assert!(
            answer.is_empty(),
            "over the cap: {}",
            String::from_utf8_lossy(&answer)
        );
        assert!(
            series(
                &app.metrics_text(),
                r#"tidegate_control_refusals_total{listener="cni",reason="over_capacity"}"#
            ) >= 1.0
        );

        drop(c1);
        // The slot comes back once the gateway sees c1 close.
        loop {
            let mut s = tokio::net::UnixStream::connect(&socket).await.unwrap();
            let _ = s.write_all(good).await;
            let mut answer = String::new();
            let _ = s.read_to_string(&mut answer).await;
            if answer.contains("unknown-workload") {
                break;
            }
            assert!(answer.is_empty(), "{answer}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        app.shutdown().await;
    });
}
