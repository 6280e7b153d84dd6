//! `tidegate-ca` out of descriptors: its accept loop pauses instead of
//! spinning. The open-file limit is process-wide, so this is the only test
//! of its binary.
//!
//! Connections wait in the listen backlog while accept() fails with EMFILE;
//! the ones it does accept never handshake and are closed at the handshake
//! timeout, which frees a descriptor for the next. The loop used to retry
//! at once: a core at 100 % and a log line per retry.

use std::time::Duration;

use tidegate_e2e::ca::{agent, ca_config, closed_by_server, gateway_pod, own_identity};
use tidegate_e2e::kube_api::FakeApiServer;
use tidegate_e2e::{init_tracing, metric_or_zero, open_fds, set_fd_soft_limit};
use tokio::net::TcpSocket;

/// Clients queued behind the exhausted descriptor table.
const CLIENTS: usize = 12;
/// Descriptors left to the CA once the clients' sockets are open (about).
const HEADROOM: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_descriptor_limit_the_accept_loop_pauses_and_counts_instead_of_spinning() {
    init_tracing();
    let api = FakeApiServer::start().await;
    gateway_pod(&api, "tidegate-a", "node-a", "tok-a");
    let mut cfg = ca_config(
        &api,
        "127.0.0.1:0".parse().unwrap(),
        Duration::from_secs(3600),
    );
    cfg.handshake_timeout = Duration::from_millis(500);
    let (_trigger, drain) = tidegate_base::shutdown::channel();
    let ca = tidegate_ca::server::start(cfg, drain).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let good = agent(dir.path(), ca.addr, &ca.root_pem, "tok-a");
    own_identity(&good).await.expect("served before");

    // The clients' sockets first, then a limit that leaves the CA two
    // descriptors; then they connect and wait in the backlog.
    let sockets: Vec<TcpSocket> = (0..CLIENTS).map(|_| TcpSocket::new_v4().unwrap()).collect();
    let before = set_fd_soft_limit((open_fds() + HEADROOM) as u64);
    let mut clients = Vec::new();
    for s in sockets {
        clients.push(s.connect(ca.addr).await.unwrap());
    }
    // The awaited event: every client closed by the CA (each accepted once
    // a descriptor is free, closed at the handshake timeout), several
    // handshake timeouts in a row.
    let within = Duration::from_secs(60);
    futures::future::join_all(
        clients
            .into_iter()
            .map(|c| closed_by_server("a client queued at the limit", c, within)),
    )
    .await;
    set_fd_soft_limit(before);

    let text = ca.metrics_text();
    let errors = metric_or_zero(
        &text,
        r#"tidegate_control_accept_errors_total{listener="ca"}"#,
    );
    let timeouts = metric_or_zero(
        &text,
        r#"tidegate_control_refusals_total{listener="ca",reason="handshake_timeout"}"#,
    );
    assert!(errors >= 1.0, "the limit was reached: {text}");
    assert_eq!(timeouts, CLIENTS as f64, "{text}");
    // Each stretch of failures ends when a handshake timeout (500 ms)
    // frees a descriptor; pausing 10 ms doubling to 100 ms the loop fails
    // about ten times per stretch. Spinning, it failed hundreds of
    // thousands of times a second.
    assert!(
        errors <= 100.0 * timeouts,
        "{errors} failed accepts for {timeouts} handshake timeouts: {text}"
    );

    // With descriptors back, a well-behaved agent is served.
    own_identity(&good).await.expect("served after");
}
