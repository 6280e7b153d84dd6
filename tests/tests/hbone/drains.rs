//! The drain engine end to end: lifecycle events through the admin API and
//! the workload file, decided by real policy components, executed on real
//! tunnels and observed from the client gateway.

use std::net::SocketAddr;
use std::time::Duration;

use tidegate_e2e::{
    eventually, http_get, metric, metric_or_zero, plugin, round_trip, write_atomically, Options,
    TwoNodes,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn with_policy(octet: u8, name: &str, config: &str) -> TwoNodes {
    TwoNodes::with(
        octet,
        Options {
            server_yaml: format!(
                "policies:\n  default: p\n  plugins:\n    p:\n      file: {}\n      config: '{config}'\n",
                plugin(name).display()
            ),
            ..Default::default()
        },
    )
    .await
}

async fn post(addr: SocketAddr, method: &str, path: &str) -> serde_json::Value {
    let out = request(addr, method, path).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    serde_json::from_str(out.split_once("\r\n\r\n").unwrap().1).unwrap()
}

/// The whole HTTP/1.1 response, status line first.
async fn request(addr: SocketAddr, method: &str, path: &str) -> String {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(
        format!(
            "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.unwrap();
    out
}

fn client_saw_goaway(nodes: &TwoNodes) -> bool {
    nodes.client.pool.dump().iter().any(|t| t.goaway_received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_on_term_start_drains_at_shutdown_start() {
    let nodes = with_policy(61, "goaway-on-term-start", "").await;
    let admin = nodes.server.addrs.admin;
    let mut held = nodes.app_conn().await;
    assert_eq!(round_trip(&mut held, b"one").await.unwrap(), b"one");

    let out = post(
        admin,
        "POST",
        "/workloads/echo-uid/shutdown-starting?grace=30s",
    )
    .await;
    assert_eq!(out["duplicate"], false);
    assert_eq!(out["policy"], "p");
    let actions = out["actions"].as_array().unwrap();
    assert_eq!(actions.len(), 1, "{out}");
    assert!(
        actions[0].as_str().unwrap().contains("graceful goaway"),
        "{out}"
    );
    eventually(
        "the client gateway sees GOAWAY",
        Duration::from_secs(5),
        || client_saw_goaway(&nodes),
    )
    .await;

    // Later application connections ride a new tunnel; the old stream goes on.
    let mut fresh = nodes.app_conn().await;
    assert_eq!(round_trip(&mut fresh, b"new").await.unwrap(), b"new");
    assert_eq!(
        metric(
            &nodes.client.metrics_text(),
            "tidegate_pool_tunnels_opened_total"
        ),
        2.0
    );
    assert_eq!(round_trip(&mut held, b"two").await.unwrap(), b"two");
    // The drain applies to the workload: the tunnel accepted after the
    // GOAWAY gets one too, once the stream it was dialed for is through.
    eventually(
        "the client sees GOAWAY on the new tunnel too",
        Duration::from_secs(5),
        || {
            let d = nodes.client.pool.dump();
            d.len() == 2 && d.iter().all(|t| t.goaway_received)
        },
    )
    .await;
    assert!(nodes
        .server
        .tunnels
        .dump()
        .iter()
        .all(|t| t.draining.is_some()));
    assert_eq!(round_trip(&mut fresh, b"on").await.unwrap(), b"on");

    // The same transition again (another source) drains once.
    let again = post(admin, "POST", "/workloads/echo-uid/shutdown-starting").await;
    assert_eq!(again["duplicate"], true);
    let m = nodes.server.metrics_text();
    assert_eq!(
        metric(
            &m,
            r#"tidegate_drain_started_total{policy="p",trigger="admin"}"#
        ),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            r#"tidegate_drain_duplicate_events_total{event="shutdown-started"}"#
        ),
        1.0
    );
    // One per tunnel: the first, and the one accepted after it.
    assert_eq!(metric(&m, "tidegate_drain_goaways_sent_total"), 2.0);
    assert_eq!(
        metric(&m, "tidegate_drain_event_to_goaway_seconds_count"),
        2.0
    );

    let drains = post(admin, "GET", "/drains").await;
    let d = &drains["drains"][0];
    assert_eq!(d["uid"], "echo-uid");
    assert_eq!(d["trigger"], "admin");
    assert_eq!(d["policy"], "p");
    assert_eq!(
        d["version"],
        nodes.server.policies.version("p").unwrap().hash.as_str()
    );
    // The held stream and the fresh one (on the new tunnel) are still open.
    assert_eq!(d["streams_remaining"], 2, "{drains}");
    assert_eq!(d["tunnels_remaining"], 2, "{drains}");
    drop(fresh);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_at_teardown_waits_for_the_last_moment_and_holds_the_ack() {
    let nodes =
        std::sync::Arc::new(with_policy(62, "drain-at-teardown", r#"{"hold-ms": 20000}"#).await);
    let admin = nodes.server.addrs.admin;
    let mut held = nodes.app_conn().await;
    assert_eq!(round_trip(&mut held, b"one").await.unwrap(), b"one");

    let out = post(admin, "POST", "/workloads/echo-uid/shutdown-starting").await;
    assert_eq!(out["actions"].as_array().unwrap().len(), 0, "{out}");
    // Nothing was asked of the tunnel: pooled tunnels keep being reused.
    assert!(nodes
        .server
        .tunnels
        .dump()
        .iter()
        .all(|t| t.draining.is_none()));
    let mut second = nodes.app_conn().await;
    assert_eq!(round_trip(&mut second, b"reuse").await.unwrap(), b"reuse");
    second.shutdown().await.unwrap();
    assert_eq!(
        metric(
            &nodes.client.metrics_text(),
            "tidegate_pool_tunnels_opened_total"
        ),
        1.0
    );

    // Teardown: GOAWAY now, acknowledgement once the last stream ended.
    let teardown =
        tokio::spawn(async move { post(admin, "POST", "/workloads/echo-uid/teardown").await });
    eventually(
        "the client gateway sees GOAWAY at teardown",
        Duration::from_secs(5),
        || client_saw_goaway(&nodes),
    )
    .await;
    assert!(
        !teardown.is_finished(),
        "the acknowledgement waits for open streams"
    );
    assert_eq!(round_trip(&mut held, b"still").await.unwrap(), b"still");
    held.shutdown().await.unwrap();
    let mut rest = Vec::new();
    held.read_to_end(&mut rest).await.unwrap();
    let ack = tokio::time::timeout(Duration::from_secs(10), teardown)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ack["teardown"]["result"], "idle", "{ack}");
    // The tunnel closes (GOAWAY + close_notify) once idle.
    eventually("server tunnel closed", Duration::from_secs(5), || {
        nodes.server.tunnels.is_empty()
    })
    .await;
    let m = nodes.server.metrics_text();
    assert_eq!(
        metric(
            &m,
            r#"tidegate_drain_ended_total{policy="p",result="completed"}"#
        ),
        1.0,
        "{m}"
    );
    assert_eq!(metric(&m, "tidegate_drain_teardown_ack_seconds_count"), 1.0);
    assert_eq!(metric(&m, "tidegate_drain_streams_at_end_count"), 1.0);
    assert_eq!(
        metric(&m, "tidegate_drain_streams_at_end_sum"),
        0.0,
        "ended idle"
    );
    // A retried DEL is acknowledged at once.
    let again = post(admin, "POST", "/workloads/echo-uid/teardown").await;
    assert_eq!(again["teardown"]["result"], "already");
}

/// Every "N ms" in a decision's action descriptions.
fn millis_in(actions: &serde_json::Value) -> Vec<u64> {
    let text = actions.to_string();
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c == '"')
        .collect();
    words
        .windows(2)
        .filter(|w| w[1].starts_with("ms"))
        .filter_map(|w| w[0].parse().ok())
        .collect()
}

/// The actions `GET /drains` shows taken for the echo workload.
async fn actions_taken(admin: SocketAddr) -> serde_json::Value {
    let drains = post(admin, "GET", "/drains").await;
    let d = &drains["drains"][0];
    assert_eq!(d["uid"], "echo-uid", "{drains}");
    d["actions_taken"].clone()
}

const CUT: &str = "(cut to the pod's termination grace)";

/// The server's count of deadlines cut to a pod's grace.
fn cut_to_grace(nodes: &TwoNodes, deadline: &str) -> f64 {
    metric_or_zero(
        &nodes.server.metrics_text(),
        &format!(r#"tidegate_drain_deadlines_cut_to_grace_total{{deadline="{deadline}"}}"#),
    )
}

/// With a 5 s grace the reference policies' teardown decisions (a 10 s hold
/// and GOAWAY deadline by default) stay within it: the teardown's
/// `max-hold-ms` is the grace left, and they compute from it (nothing had
/// to be cut).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_5s_grace_the_reference_policies_hold_and_cut_within_it() {
    for (octet, policy) in [(73, "recommended"), (74, "drain-at-teardown")] {
        let nodes = with_policy(octet, policy, "").await;
        let admin = nodes.server.addrs.admin;
        let mut held = nodes.app_conn().await;
        assert_eq!(round_trip(&mut held, b"one").await.unwrap(), b"one");
        // The stream ends; its tunnel stays pooled (the policy acts on it).
        held.shutdown().await.unwrap();
        let mut rest = Vec::new();
        held.read_to_end(&mut rest).await.unwrap();
        post(
            admin,
            "POST",
            "/workloads/echo-uid/shutdown-starting?grace=5s",
        )
        .await;
        let out = post(admin, "POST", "/workloads/echo-uid/teardown").await;
        let taken = actions_taken(admin).await;
        for actions in [&out["actions"], &taken] {
            let text = actions.to_string();
            assert!(
                text.contains("hold teardown up to") && text.contains("hard deadline"),
                "{policy}: {actions}"
            );
            let millis = millis_in(actions);
            assert!(millis.len() >= 3, "{policy}: {millis:?} in {actions}");
            assert!(
                millis.iter().all(|ms| *ms <= 5_000),
                "{policy}: {millis:?} in {actions}"
            );
            assert!(!text.contains(CUT), "{policy}: {actions}");
        }
        for deadline in ["goaway_hard_deadline", "teardown_hold"] {
            assert_eq!(cut_to_grace(&nodes, deadline), 0.0, "{policy}");
        }
    }
}

/// A policy asking for a GOAWAY past the pod's grace (a 10 s delay with a
/// 5 s grace) gets it cut to the grace: sent as the grace ends with no time
/// after it, said in the decision and in `GET /drains`, and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_goaway_asked_past_the_grace_is_cut_to_it() {
    let nodes = with_policy(75, "goaway-on-term-start", r#"{"delay-ms": 10000}"#).await;
    let admin = nodes.server.addrs.admin;
    let out = post(
        admin,
        "POST",
        "/workloads/echo-uid/shutdown-starting?grace=5s",
    )
    .await;
    let taken = actions_taken(admin).await;
    for actions in [&out["actions"], &taken] {
        let text = actions[0].as_str().unwrap();
        assert!(
            text.ends_with(&format!("delay 5000 ms, hard deadline 0 ms {CUT}")),
            "{actions}"
        );
    }
    assert_eq!(cut_to_grace(&nodes, "goaway_delay"), 1.0);
    assert_eq!(cut_to_grace(&nodes, "goaway_hard_deadline"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teardown_hold_is_bounded() {
    let nodes = with_policy(63, "drain-at-teardown", r#"{"hold-ms": 200}"#).await;
    let mut held = nodes.app_conn().await;
    assert_eq!(round_trip(&mut held, b"one").await.unwrap(), b"one");
    let ack = post(
        nodes.server.addrs.admin,
        "POST",
        "/workloads/echo-uid/teardown",
    )
    .await;
    assert_eq!(ack["teardown"]["result"], "bound", "{ack}");
    assert!(ack["teardown"]["held_ms"].as_u64().unwrap() >= 200, "{ack}");
    let m = nodes.server.metrics_text();
    assert_eq!(metric(&m, "tidegate_drain_teardown_timeouts_total"), 1.0);
    assert_eq!(
        metric(
            &m,
            r#"tidegate_drain_ended_total{policy="p",result="forced"}"#
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workload_file_raises_shutdown_and_delete() {
    let nodes = with_policy(64, "goaway-on-term-start", "").await;
    let mut held = nodes.app_conn().await;
    assert_eq!(round_trip(&mut held, b"one").await.unwrap(), b"one");
    let file = nodes.dir.path().join("server-workloads.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let terminating = text.replacen("node: node-b}", "node: node-b, state: terminating}", 1);
    assert_ne!(text, terminating);
    write_atomically(&file, &terminating);
    eventually(
        "GOAWAY from the file's transition",
        Duration::from_secs(10),
        || client_saw_goaway(&nodes),
    )
    .await;
    let drains = nodes.server.drains.list();
    assert_eq!(drains.len(), 1);
    assert_eq!(drains[0].uid, "echo-uid");
    assert_eq!(format!("{:?}", drains[0].trigger), "WorkloadFile");
    assert_eq!(drains[0].ended, None);
    // The workload disappears from the file: deleted, and the drain ends.
    let text = std::fs::read_to_string(&file).unwrap();
    let without: String = text
        .lines()
        .filter(|l| !l.contains("uid: echo-uid"))
        .map(|l| format!("{l}\n"))
        .collect();
    write_atomically(&file, &without);
    // The phase moves to deleted as the event is taken; the drain ends once
    // its decision was executed: wait for the end, not for the phase.
    eventually(
        "the drain ended by the deletion",
        Duration::from_secs(10),
        || nodes.server.drains.list()[0].ended.is_some(),
    )
    .await;
    let drain = &nodes.server.drains.list()[0];
    assert_eq!(drain.phase, tidegate::drains::Phase::Deleted);
    assert_eq!(drain.ended, Some("completed"));
}

/// A workload removed from the workload file and put back with the same uid
/// is served again: the deletion's GOAWAY does not outlive the deletion,
/// and `/drains` shows no drain for the workload put back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_put_back_with_the_same_uid_is_served() {
    let nodes = with_policy(68, "recommended", "").await;
    let mut held = nodes.app_conn().await;
    assert_eq!(round_trip(&mut held, b"one").await.unwrap(), b"one");
    let file = nodes.dir.path().join("server-workloads.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let without: String = text
        .lines()
        .filter(|l| !l.contains("uid: echo-uid"))
        .map(|l| format!("{l}\n"))
        .collect();
    write_atomically(&file, &without);
    eventually(
        "the drain ended by the deletion",
        Duration::from_secs(10),
        || {
            nodes
                .server
                .drains
                .list()
                .first()
                .is_some_and(|d| d.ended.is_some())
        },
    )
    .await;
    assert_eq!(
        nodes.server.drains.list()[0].phase,
        tidegate::drains::Phase::Deleted
    );

    write_atomically(&file, &text);
    eventually(
        "the earlier drain forgotten once the workload is back",
        Duration::from_secs(10),
        || nodes.server.drains.list().is_empty(),
    )
    .await;
    let mut fresh = nodes.app_conn().await;
    assert_eq!(round_trip(&mut fresh, b"two").await.unwrap(), b"two");
    let (status, body) = http_get(nodes.server.addrs.admin, "/drains").await;
    assert_eq!(status, 200, "{body}");
    let drains: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(drains["drains"], serde_json::json!([]), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evict_on_delete_closes_pooled_tunnels_to_a_deleted_peer() {
    let nodes = TwoNodes::with(
        65,
        Options {
            client_yaml: format!(
                "policies:\n  default: p\n  plugins:\n    p: {{file: {}}}\n",
                plugin("evict-on-delete").display()
            ),
            ..Default::default()
        },
    )
    .await;
    let mut held = nodes.app_conn().await;
    assert_eq!(round_trip(&mut held, b"one").await.unwrap(), b"one");
    assert_eq!(nodes.client.pool.dump().len(), 1);
    // The client node learns that the echo workload (a peer) is gone.
    let file = nodes.dir.path().join("client-workloads.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let without_echo: String = text
        .lines()
        .filter(|l| !l.contains("uid: echo-uid"))
        .map(|l| format!("{l}\n"))
        .collect();
    write_atomically(&file, &without_echo);
    // Evicted at once (keepalive would take 10 s + 20 s to notice anything).
    eventually("pooled tunnel evicted", Duration::from_secs(5), || {
        nodes.client.pool.dump().is_empty()
    })
    .await;
    let mut rest = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(5), held.read_to_end(&mut rest))
        .await
        .expect("the evicted stream ends");
    assert!(r.is_err() || rest.is_empty());
    eventually("closed as evicted_now", Duration::from_secs(5), || {
        metric_or_zero(
            &nodes.client.metrics_text(),
            r#"tidegate_pool_tunnels_closed_total{reason="evicted_now"}"#,
        ) == 1.0
    })
    .await;
    assert_eq!(
        metric(
            &nodes.client.metrics_text(),
            r#"tidegate_drain_actions_total{action="evict",result="executed"}"#
        ),
        1.0
    );
}

/// One connection through the capture: `Ok` when its round trip came
/// back, `Err` when it was refused or reset.
async fn exchange(capture: &tidegate_e2e::Capture, src: std::net::IpAddr) -> std::io::Result<()> {
    let mut tcp = capture.try_connect(src).await?;
    round_trip(&mut tcp, b"x").await.map(|_| ())
}

/// Node B's gateway goes away, and the policy backs off its HBONE address
/// after two refused dials. A pod address has no other endpoint, so the
/// backoff is probed, one connection at a time: while B is down each
/// probe fails (the connections waiting on it with it) and no dial goes
/// out but the probes; once B serves again, the first probe connects, the
/// backoff ends, and every connection waiting on it goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backoff_to_a_pod_is_probed_and_ends_when_the_peer_serves_again() {
    let TwoNodes {
        dir,
        server,
        client,
        capture,
        client_ip,
        ..
    } = TwoNodes::with(
        66,
        Options {
            client_yaml: format!(
                "policies:\n  default: p\n  plugins:\n    p:\n      file: {}\n      config: '{{\"failure-threshold\": 2, \"backoff-initial-ms\": 200, \"backoff-max-ms\": 60000, \"backoff-jitter\": 0.0}}'\n",
                plugin("evict-on-delete").display()
            ),
            ..Default::default()
        },
    )
    .await;
    let port = server.addrs.inbound.expect("node listeners").port();
    // The destination's gateway goes away: dials are refused.
    server.shutdown().await;
    let m = || client.metrics_text();
    let dials_failed = |m: &str| {
        metric(
            m,
            r#"tidegate_pool_dial_failures_total{reason="connect_refused"}"#,
        )
    };
    let probes = |m: &str, outcome: &str| {
        metric_or_zero(
            m,
            &format!(r#"tidegate_pool_backoff_probes_total{{outcome="{outcome}"}}"#),
        )
    };
    let fast_failed = |m: &str| metric(m, "tidegate_pool_backoff_fast_failures_total");
    for i in 1..=2 {
        assert!(exchange(&capture, client_ip).await.is_err());
        eventually("dial failure counted", Duration::from_secs(5), || {
            dials_failed(&m()) == i as f64
        })
        .await;
    }
    eventually("the policy set a backoff", Duration::from_secs(5), || {
        metric(&m(), "tidegate_pool_backoff_activations_total") >= 1.0
    })
    .await;
    // Still down: connections fail as before; each round of them costs
    // one dial, its probe's, whoever waited on it.
    for round in 1..=2 {
        let tries: Vec<_> = (0..5).map(|_| exchange(&capture, client_ip)).collect();
        let results = futures::future::join_all(tries).await;
        assert!(results.iter().all(Result::is_err), "round {round}");
        let m = m();
        assert_eq!(
            dials_failed(&m),
            2.0 + probes(&m, "failed"),
            "round {round}: a dial that was no probe"
        );
        assert!(probes(&m, "failed") >= f64::from(round), "{m}");
        assert_eq!(
            probes(&m, "failed") + fast_failed(&m),
            5.0 * f64::from(round),
            "round {round}: each connection probed or waited on a probe"
        );
    }
    let failed_probes = probes(&m(), "failed");
    // The backoff shows in GET /drains, under the peer it was decided about.
    let peers = client.drains.peer_drains();
    let failing: Vec<_> = peers
        .iter()
        .flat_map(|p| p.decisions.iter().map(move |d| (p.peer.as_str(), d)))
        .filter(|(_, d)| d.event == "connect-failing")
        .collect();
    assert!(!failing.is_empty(), "{peers:?}");
    assert!(
        failing.iter().all(|(peer, _)| *peer == "echo-uid"),
        "{peers:?}"
    );
    assert!(
        failing[0].1.actions[0].starts_with("backoff for "),
        "{peers:?}"
    );

    // B serves again (a new gateway on its port); the backoff still runs.
    let mut cfg = tidegate_e2e::gateway_config(
        "node-b",
        &dir.path().join("ca"),
        &dir.path().join("server-workloads.yaml"),
        15008,
        "",
    );
    cfg.listeners.inbound = SocketAddr::from(([0, 0, 0, 0], port));
    let _back = tidegate::app::build(cfg).await.unwrap();
    let tries: Vec<_> = (0..10).map(|_| exchange(&capture, client_ip)).collect();
    let results = futures::future::join_all(tries).await;
    let failed = results.iter().filter(|r| r.is_err()).count();
    assert_eq!(failed, 0, "{results:?}");
    let m = m();
    assert_eq!(probes(&m, "succeeded"), 1.0, "{m}");
    assert_eq!(
        probes(&m, "failed"),
        failed_probes,
        "no probe failed once B was back"
    );
    assert_eq!(
        metric(
            &m,
            r#"tidegate_connections_failed_total{direction="outbound",reason="backing_off"}"#
        ),
        fast_failed(&m)
    );
}

/// Forwards TCP to `to` until frozen; frozen, it keeps every socket open but
/// moves no byte — a peer that vanished without closing anything.
async fn blackhole_proxy(to: SocketAddr) -> (SocketAddr, std::sync::Arc<tokio::sync::Notify>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let freeze = std::sync::Arc::new(tokio::sync::Notify::new());
    let f = freeze.clone();
    tokio::spawn(async move {
        loop {
            let Ok((a, _)) = l.accept().await else { return };
            let b = tokio::net::TcpStream::connect(to).await.unwrap();
            let f = f.clone();
            tokio::spawn(async move {
                let (mut ar, mut aw) = a.into_split();
                let (mut br, mut bw) = b.into_split();
                tokio::select! {
                    _ = async { tokio::join!(tokio::io::copy(&mut ar, &mut bw), tokio::io::copy(&mut br, &mut aw)) } => {}
                    _ = f.notified() => {
                        // Hold the sockets, forward nothing.
                        std::future::pending::<()>().await;
                    }
                }
            });
        }
    });
    (addr, freeze)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_only_leaves_a_vanished_peer_to_the_ping_timeout() {
    let nodes = TwoNodes::start(67).await;
    // A third gateway on node A dials node B through a proxy that can freeze.
    let (proxy, freeze) = blackhole_proxy(SocketAddr::new(
        tidegate_e2e::ip(67, 2),
        nodes.server.addrs.inbound.expect("node listeners").port(),
    ))
    .await;
    let cfg = tidegate_e2e::gateway_config(
        "node-a",
        &nodes.ca_dir(),
        &nodes.dir.path().join("client-workloads.yaml"),
        proxy.port(),
        "  keepalive_interval: 100ms\n  keepalive_timeout: 200ms\npolicies:\n  fallback: keepalive-only\n",
    );
    let client = tidegate::app::build(cfg).await.unwrap();
    // One stream on a pooled tunnel through the proxy (keepalive-only: no
    // policy acts; only the PING timeout can notice the peer is gone).
    let key = tidegate::proxy::pool::PoolKey {
        src: tidegate_protocol::identity::SpiffeId::new("cluster.local", "demo", "client"),
        dst_uid: "echo-uid".into(),
        dst: tidegate_protocol::identity::SpiffeId::new("cluster.local", "demo", "echo"),
        dst_also: Vec::new(),
        dst_addr: proxy,
        src_netns: None,
    };
    let stream = client.pool.connect(&key, nodes.echo).await.unwrap();
    assert_eq!(client.pool.dump().len(), 1);
    freeze.notify_waiters();
    eventually(
        "the PING timeout closes the stale tunnel",
        Duration::from_secs(10),
        || client.pool.dump().is_empty(),
    )
    .await;
    assert_eq!(
        metric(
            &client.metrics_text(),
            r#"tidegate_pool_tunnels_closed_total{reason="keepalive_timeout"}"#
        ),
        1.0
    );
    drop(stream);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_refuse_an_absurd_grace_and_keep_working() {
    let nodes = with_policy(69, "goaway-on-term-start", "").await;
    let admin = nodes.server.addrs.admin;
    // `now + grace` overflowed under the drains lock: the panic poisoned it.
    let out = request(
        admin,
        "POST",
        "/workloads/echo-uid/shutdown-starting?grace=18446744073709551615s",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert!(out.contains("0s to 24h"), "{out}");
    let too_long = request(
        admin,
        "POST",
        "/workloads/echo-uid/shutdown-starting?grace=25h",
    )
    .await;
    assert!(too_long.starts_with("HTTP/1.1 400"), "{too_long}");

    let ok = post(
        admin,
        "POST",
        "/workloads/echo-uid/shutdown-starting?grace=24h",
    )
    .await;
    assert_eq!(ok["duplicate"], false, "{ok}");
    let drains = post(admin, "GET", "/drains").await;
    assert_eq!(drains["drains"][0]["uid"], "echo-uid", "{drains}");
    let deleted = post(admin, "DELETE", "/workloads/echo-uid").await;
    assert_eq!(deleted["duplicate"], false, "{deleted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_sees_workload_added() {
    let nodes = with_policy(70, "goaway-on-term-start", "").await;
    // The workload file's first set: every local workload appears.
    eventually(
        "the server's policy decided workload-added",
        Duration::from_secs(5),
        || {
            nodes.server.metrics_text().lines().any(|l| {
                l.starts_with("tidegate_policy_decisions_total{")
                    && l.contains(r#"event="workload-added""#)
                    && l.contains(r#"policy="p""#)
            })
        },
    )
    .await;
}

/// How the TLS stream under a client ended: `Ok(())` for a clean EOF (TLS
/// close_notify received), else the read error's kind.
type TlsEnd = Result<(), std::io::ErrorKind>;

/// A client TLS stream that records how its first read ended.
struct EndRecorder {
    inner: tidegate_protocol::tls::ClientTls,
    end: std::sync::Arc<std::sync::OnceLock<TlsEnd>>,
}

impl tokio::io::AsyncRead for EndRecorder {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        match &r {
            std::task::Poll::Ready(Ok(())) if buf.filled().len() == before => {
                let _ = self.end.set(Ok(()));
            }
            std::task::Poll::Ready(Err(e)) => {
                let _ = self.end.set(Err(e.kind()));
            }
            _ => {}
        }
        r
    }
}

impl tokio::io::AsyncWrite for EndRecorder {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A raw rustls + h2 client holds a tunnel with one open stream to the echo
/// workload whose shutdown starts (grace 1 s) under `goaway-on-term-start`
/// with `close-notify` as given: the gateway closes the tunnel at the hard
/// deadline (half the grace) while the client still reads. Returns how the
/// client's TLS stream ended.
async fn tunnel_end_with_close_notify(octet: u8, close_notify: bool) -> TlsEnd {
    let config = format!(r#"{{"close-notify": {close_notify}}}"#);
    let nodes = with_policy(octet, "goaway-on-term-start", &config).await;
    let stream = crate::raw_h2::tls_to_echo(&nodes).await;
    let end = std::sync::Arc::new(std::sync::OnceLock::new());
    let recorder = EndRecorder {
        inner: stream,
        end: end.clone(),
    };
    let (send, conn) = h2::client::handshake(recorder).await.unwrap();
    tokio::spawn(conn);
    // An open stream keeps the client from closing first after the GOAWAY.
    let (tx, rx) = tidegate_protocol::hbone::client::connect_stream(
        send.clone(),
        nodes.echo,
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    post(
        nodes.server.addrs.admin,
        "POST",
        "/workloads/echo-uid/shutdown-starting?grace=1s",
    )
    .await;
    let got = tidegate_e2e::wait_for("the tunnel's TLS end", Duration::from_secs(5), || {
        std::future::ready(end.get().copied())
    })
    .await;
    drop((send, tx, rx));
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_goaway_closes_with_tls_close_notify_only_when_the_policy_asks() {
    assert_eq!(
        tunnel_end_with_close_notify(86, true).await,
        Ok(()),
        "asked: a clean TLS close (close_notify, then EOF)"
    );
    assert_eq!(
        tunnel_end_with_close_notify(87, false).await,
        Err(std::io::ErrorKind::UnexpectedEof),
        "not asked: the TCP connection ends without close_notify"
    );
}

/// After a tunnel's orderly close (GOAWAY, close_notify, FIN) the gateway's
/// socket lingers: bytes the peer still writes are read and dropped until
/// the peer closes too, so the peer sees a clean end instead of a TCP reset
/// (which a client pool, still writing, would count as a broken pipe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_tunnel_lingers_so_the_peers_late_bytes_cause_no_reset() {
    let nodes = TwoNodes::start(91).await;
    let mut tls = crate::raw_h2::tls_to_echo(&nodes).await;
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    tls.flush().await.unwrap();
    let tunnels = tidegate_e2e::wait_for("the tunnel registers", Duration::from_secs(5), || {
        let t = nodes.server.tunnels.for_workload("echo-uid");
        std::future::ready((!t.is_empty()).then_some(t))
    })
    .await;
    let now = tokio::time::Instant::now();
    tunnels[0].request_goaway(
        tidegate_protocol::hbone::GoawayCommand {
            graceful: false,
            deadline: None,
            issued: now,
            close_notify: true,
        },
        "test",
    );
    // The server's frames, then its close_notify (a clean TLS end of file).
    let mut sink = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut sink))
        .await
        .expect("the tunnel closes")
        .expect("a clean TLS close");
    // Late bytes on the TCP connection, then our FIN. The gateway reads
    // them and closes after us; a socket closed with unread bytes (or that
    // receives bytes once closed) answers with a reset instead.
    let tcp = &mut tls.get_mut().0;
    tcp.write_all(&[0u8; 1024]).await.unwrap();
    tcp.shutdown().await.unwrap();
    // Our side is closed once the gateway acknowledged our FIN or reset us.
    let fd = std::os::fd::AsRawFd::as_raw_fd(&**tcp);
    eventually("our socket closes", Duration::from_secs(5), || {
        tcp_state(fd) == TCP_CLOSE
    })
    .await;
    assert!(tcp.take_error().unwrap().is_none(), "a clean end, no reset");
}

/// `TCP_CLOSE` in `tcp_info.tcpi_state` (linux/tcp_states.h).
const TCP_CLOSE: u8 = 7;

/// The kernel's TCP state of socket `fd`.
fn tcp_state(fd: std::os::fd::RawFd) -> u8 {
    // SAFETY: `info` is a plain C struct the kernel fills up to `len`.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let r = libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            std::ptr::addr_of_mut!(info).cast(),
            &mut len,
        );
        assert_eq!(r, 0, "getsockopt(TCP_INFO)");
        info.tcpi_state
    }
}
