//! Services (issue 15): a VIP in front of three endpoints on node B; the
//! client gateway picks one per new connection and never a draining one
//! when another will do. Each endpoint's backend counts its connections, so
//! "no new connection reaches it" is counted where it matters.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tidegate_e2e::{
    counting_echo, eventually, ip, metric_or_zero, plugin, round_trip, write_atomically, Capture,
    Options, TwoNodes,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const VIP_HOST: u8 = 100;
const EMPTY_VIP_HOST: u8 = 101;
const LONE_VIP_HOST: u8 = 103;

/// Endpoint workloads `e{i}` at 127.octet.0.(10+i), all on node B, members
/// of Service `echo` (named port `http`) whose state is given; `e0` is also
/// in Service `second` (numeric target port), a fourth and later ones in
/// Service `lone` too. The client at .3 on node A.
fn services_yaml(octet: u8, port: u16, states: &[&str]) -> String {
    let mut y = format!(
        "workloads:\n- {{uid: client-uid, name: client, namespace: demo, service_account: client, ips: [{}], node: node-a}}\n",
        ip(octet, 3)
    );
    for (i, state) in states.iter().enumerate() {
        let services = match i {
            0 => "[echo, second]",
            1 | 2 => "[echo]",
            _ => "[echo, lone]",
        };
        y += &format!(
            "- {{uid: e{i}, name: e{i}, namespace: demo, service_account: echo, ips: [{}], node: node-b, state: {state}, services: {services}, ports: {{http: {port}}}}}\n",
            ip(octet, 10 + i as u8)
        );
    }
    y += &format!(
        "services:\n\
         - {{name: echo, namespace: demo, vips: [{vip}], ports: [{{port: 80, target_port: http}}]}}\n\
         - {{name: second, namespace: demo, vips: [{vip2}], ports: [{{port: 81, target_port: {port}}}]}}\n\
         - {{name: empty, namespace: demo, vips: [{empty}], ports: [{{port: 80}}]}}\n",
        vip = ip(octet, VIP_HOST),
        vip2 = ip(octet, VIP_HOST + 2),
        empty = ip(octet, EMPTY_VIP_HOST),
    );
    if states.len() > 3 {
        y += &format!(
            "- {{name: lone, namespace: demo, vips: [{}], ports: [{{port: 80, target_port: {port}}}]}}\n",
            ip(octet, LONE_VIP_HOST)
        );
    }
    y
}

/// One byte round trip through `cap` from `client`: `Err` when the
/// connection is refused or reset before the answer.
async fn exchange(cap: &Capture, client: IpAddr) -> std::io::Result<()> {
    let mut tcp = cap.try_connect(client).await?;
    round_trip(&mut tcp, b"x").await.map(|_| ())
}

pub(super) struct Svc {
    pub(super) nodes: TwoNodes,
    pub(super) port: u16,
    counts: Vec<Arc<AtomicUsize>>,
    vip: Capture,
}

impl Svc {
    async fn start(octet: u8, opts: Options) -> Svc {
        Self::start_with(octet, opts, 3).await
    }

    /// `endpoints` endpoints, of which the first three have an application
    /// (an echo server): the others accept nothing.
    pub(super) async fn start_with(octet: u8, opts: Options, endpoints: usize) -> Svc {
        let (first, c0) = counting_echo(SocketAddr::new(ip(octet, 10), 0), Duration::ZERO).await;
        let port = first.port();
        let mut counts = vec![c0];
        for i in 1..3 {
            counts.push(
                counting_echo(SocketAddr::new(ip(octet, 10 + i), port), Duration::ZERO)
                    .await
                    .1,
            );
        }
        let yaml = services_yaml(octet, port, &vec!["running"; endpoints]);
        let nodes = TwoNodes::with(
            octet,
            Options {
                workloads: Some(yaml),
                ..opts
            },
        )
        .await;
        let vip = Capture::start(
            nodes.client.outbound.clone(),
            SocketAddr::new(ip(octet, VIP_HOST), 80),
        )
        .await;
        Svc {
            nodes,
            port,
            counts,
            vip,
        }
    }

    fn count(&self, i: usize) -> usize {
        self.counts[i].load(Ordering::SeqCst)
    }

    /// One short connection through the VIP: a round trip, then close.
    pub(super) async fn call(&self) -> std::io::Result<()> {
        let mut tcp = self.vip.try_connect(self.nodes.client_ip).await?;
        let back = round_trip(&mut tcp, b"ping").await?;
        assert_eq!(back, b"ping");
        tcp.shutdown().await?;
        let mut rest = Vec::new();
        tcp.read_to_end(&mut rest).await?;
        Ok(())
    }

    /// Rewrites `which` gateway's workload file with these endpoint states
    /// and waits until that gateway's store has them.
    async fn set_states(&self, which: &str, states: &[&str]) {
        let file = self
            .nodes
            .dir
            .path()
            .join(format!("{which}-workloads.yaml"));
        write_atomically(&file, &services_yaml(self.nodes.octet, self.port, states));
        let app = if which == "client" {
            &self.nodes.client
        } else {
            &self.nodes.server
        };
        let want: Vec<bool> = states.iter().map(|s| *s == "terminating").collect();
        eventually(
            "the workload file reloaded",
            Duration::from_secs(10),
            || {
                let snap = app.workloads.snapshot();
                (0..states.len()).all(|i| {
                    snap.by_uid(&format!("e{i}")).is_some_and(|w| {
                        (w.spec.state == tidegate::workloads::LifecycleState::Terminating)
                            == want[i]
                    })
                })
            },
        )
        .await;
    }

    /// Waits until the client has seen a GOAWAY from a tunnel to endpoint `uid`.
    async fn client_saw_goaway(&self, uid: &str) {
        eventually(
            &format!("the client saw GOAWAY from {uid}'s tunnel"),
            Duration::from_secs(10),
            || {
                self.nodes
                    .client
                    .pool
                    .goaway_within(uid, Duration::from_secs(60))
                    .is_some()
            },
        )
        .await;
    }

    /// Service `echo` as the client's `/config_dump` shows it.
    async fn dumped_echo(&self) -> serde_json::Value {
        let (status, body) =
            tidegate_e2e::http_get(self.nodes.client.addrs.admin, "/config_dump").await;
        assert_eq!(status, 200);
        let dump: serde_json::Value = serde_json::from_str(&body).unwrap();
        dump["services"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "echo")
            .expect("Service echo in /config_dump")
            .clone()
    }

    fn client_metric(&self, series: &str) -> f64 {
        metric_or_zero(&self.nodes.client.metrics_text(), series)
    }
}

/// Options binding every local workload of one gateway (`server_yaml` or
/// `client_yaml`) to the reference policy `name`.
fn policy(name: &str) -> String {
    format!(
        "policies:\n  default: p\n  plugins:\n    p: {{file: {}}}\n",
        plugin(name).display()
    )
}

fn retries(result: &str) -> String {
    format!(r#"tidegate_outbound_connect_retries_total{{result="{result}"}}"#)
}

fn choices(reason: &str) -> String {
    format!(r#"tidegate_service_endpoint_choices_total{{reason="{reason}"}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vip_spreads_over_ready_endpoints_and_never_picks_a_terminating_one() {
    let s = Svc::start(121, Options::default()).await;
    for _ in 0..60 {
        s.call().await.unwrap();
    }
    for i in 0..3 {
        assert!(s.count(i) > 0, "endpoint e{i} got none of 60 connections");
    }
    // Discovery says e1 is terminating: it is not chosen any more.
    s.set_states("client", &["running", "terminating", "running"])
        .await;
    let e1 = s.count(1);
    for _ in 0..60 {
        s.call().await.unwrap();
    }
    assert_eq!(s.count(1), e1, "a terminating endpoint got new connections");
    assert!(s.client_metric(r#"tidegate_service_endpoint_skips_total{reason="not_ready"}"#) > 0.0);
    // Every endpoint terminating: served by the terminating ones
    // (Kubernetes' terminating-endpoint fallback), nobody fails.
    s.set_states("client", &["terminating"; 3]).await;
    let before: usize = (0..3).map(|i| s.count(i)).sum();
    for _ in 0..30 {
        s.call().await.unwrap();
    }
    assert_eq!((0..3).map(|i| s.count(i)).sum::<usize>(), before + 30);
    assert!(s.client_metric(&choices("terminating_fallback")) >= 30.0);
    // /config_dump shows each endpoint and why it is skipped.
    let echo = s.dumped_echo().await;
    let endpoints = echo["endpoint_choice"].as_array().unwrap();
    assert_eq!(endpoints.len(), 3, "{echo}");
    assert!(
        endpoints.iter().all(|e| e["skipped"] == "not_ready"),
        "{echo}"
    );
    assert_eq!(
        endpoints[0]["addr"],
        format!("{}:{}", ip(121, 10), s.port),
        "named target port resolved per endpoint: {echo}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_goaway_from_an_endpoint_takes_it_out_of_the_choice_before_discovery_knows() {
    let s = Svc::start(
        122,
        Options {
            server_yaml: policy("goaway-on-term-start"),
            ..Default::default()
        },
    )
    .await;
    // Warm: a tunnel to every endpoint.
    for _ in 0..60 {
        s.call().await.unwrap();
    }
    assert!((0..3).all(|i| s.count(i) > 0));
    // Only node B learns that e2 terminates: its policy sends GOAWAY; the
    // client's discovery still says running.
    s.set_states("server", &["running", "running", "terminating"])
        .await;
    s.client_saw_goaway("e2").await;
    let e2 = s.count(2);
    for _ in 0..60 {
        s.call().await.unwrap();
    }
    assert_eq!(
        s.count(2),
        e2,
        "an endpoint that sent GOAWAY got new connections"
    );
    assert!(
        s.client_metric(r#"tidegate_service_endpoint_skips_total{reason="goaway_received"}"#) > 0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_services_share_a_pod_an_empty_vip_resets_and_unknown_addresses_follow_the_ranges() {
    let octet = 123;
    let s = Svc::start(
        octet,
        Options {
            client_yaml: format!("outbound:\n  cluster_cidrs: [127.{octet}.0.0/24]\n"),
            ..Default::default()
        },
    )
    .await;
    // Service `second` (numeric target port) reaches e0 only, the pod it shares with `echo`.
    let second = Capture::start(
        s.nodes.client.outbound.clone(),
        SocketAddr::new(ip(octet, VIP_HOST + 2), 81),
    )
    .await;
    let mut tcp = second.connect(s.nodes.client_ip).await;
    assert_eq!(round_trip(&mut tcp, b"two").await.unwrap(), b"two");
    assert_eq!(s.count(0), 1);
    // A VIP without endpoints: reset at once, counted.
    let empty = Capture::start(
        s.nodes.client.outbound.clone(),
        SocketAddr::new(ip(octet, EMPTY_VIP_HOST), 80),
    )
    .await;
    let r = exchange(&empty, s.nodes.client_ip).await;
    assert!(r.is_err(), "a VIP without endpoints answered");
    let failed = |reason: &str| {
        s.client_metric(&format!(
            r#"tidegate_connections_failed_total{{direction="outbound",reason="{reason}"}}"#
        ))
    };
    eventually(
        "no_healthy_endpoint counted",
        Duration::from_secs(5),
        || failed("no_healthy_endpoint") == 1.0,
    )
    .await;
    // An unknown address inside the cluster's range: refused, never plaintext.
    let inside = tidegate_e2e::echo_server(ip(octet, 200)).await;
    let cap = Capture::start(s.nodes.client.outbound.clone(), inside).await;
    let r = exchange(&cap, s.nodes.client_ip).await;
    assert!(
        r.is_err(),
        "an unknown in-cluster address was passed through"
    );
    eventually("unknown_in_cluster counted", Duration::from_secs(5), || {
        failed("unknown_in_cluster") == 1.0
    })
    .await;
    // Outside the ranges: passed through, and counted as such.
    let outside = tidegate_e2e::echo_server(IpAddr::from([127, octet + 1, 0, 200])).await;
    let cap = Capture::start(s.nodes.client.outbound.clone(), outside).await;
    let mut tcp = cap.connect(s.nodes.client_ip).await;
    assert_eq!(round_trip(&mut tcp, b"out").await.unwrap(), b"out");
    assert_eq!(
        tidegate_e2e::metric(
            &s.nodes.client.metrics_text(),
            "tidegate_outbound_passthrough_total"
        ),
        1.0
    );
}

/// With the defaults (no `cluster_cidrs`: unknown addresses pass through),
/// the address of a workload that left discovery is still the mesh's: a
/// connection to it waits for discovery, is refused and counted, and never
/// leaves in plaintext — though something answers there in plaintext.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_departed_workloads_address_never_leaves_in_plaintext() {
    let octet = 147;
    let s = Svc::start_with(octet, Options::default(), 4).await;
    let listening = tidegate_e2e::echo_server(ip(octet, 13)).await;
    // e3 leaves the client's discovery; something plaintext answers at its address.
    s.set_states("client", &["running", "running", "running"])
        .await;
    eventually(
        "e3 left the client's discovery",
        Duration::from_secs(10),
        || s.nodes.client.workloads.snapshot().by_uid("e3").is_none(),
    )
    .await;
    let cap = Capture::start(s.nodes.client.outbound.clone(), listening).await;
    let r = exchange(&cap, s.nodes.client_ip).await;
    assert!(
        r.is_err(),
        "a departed workload's address was passed through"
    );
    let failed = || {
        s.client_metric(
            r#"tidegate_connections_failed_total{direction="outbound",reason="departed_address"}"#,
        )
    };
    eventually("departed_address counted", Duration::from_secs(5), || {
        failed() == 1.0
    })
    .await;
    assert_eq!(
        tidegate_e2e::metric(
            &s.nodes.client.metrics_text(),
            "tidegate_outbound_passthrough_total"
        ),
        0.0
    );
    // The dump says so: unknown addresses can pass, this one is held.
    let (status, body) = tidegate_e2e::http_get(s.nodes.client.addrs.admin, "/config_dump").await;
    assert_eq!(status, 200, "{body}");
    let dump: serde_json::Value = serde_json::from_str(&body).unwrap();
    let outbound = &dump["outbound"];
    assert_eq!(outbound["plaintext_to_unknown"], true, "{outbound}");
    assert_eq!(outbound["formerly_known"]["departed"], 1, "{outbound}");
    // An address the mesh never knew still passes through (the default).
    let never = tidegate_e2e::echo_server(ip(octet, 200)).await;
    let cap = Capture::start(s.nodes.client.outbound.clone(), never).await;
    let mut tcp = cap.connect(s.nodes.client_ip).await;
    assert_eq!(round_trip(&mut tcp, b"out").await.unwrap(), b"out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_churn_drops_none_of_a_thousand_open_connections() {
    let s = Svc::start(124, Options::default()).await;
    let mut held = Vec::new();
    for i in 0..1000u32 {
        let mut tcp = s.vip.connect(s.nodes.client_ip).await;
        let msg = i.to_be_bytes();
        assert_eq!(round_trip(&mut tcp, &msg).await.unwrap(), msg);
        held.push(tcp);
    }
    // Churn: endpoints go terminating and back, on both sides, twice.
    for states in [
        ["terminating", "running", "running"],
        ["running", "terminating", "terminating"],
        ["running", "running", "running"],
    ] {
        s.set_states("client", &states).await;
        s.set_states("server", &states).await;
    }
    for (i, tcp) in held.iter_mut().enumerate() {
        let msg = (i as u32 ^ 0xa5a5).to_be_bytes();
        assert_eq!(
            round_trip(tcp, &msg)
                .await
                .unwrap_or_else(|e| panic!("held connection {i}: {e}")),
            msg
        );
    }
}

/// New connections through the VIP at ~200/s (one every 5 ms, each on its
/// own task) until stopped; counts successes and keeps failures.
struct Load {
    ok: Arc<AtomicUsize>,
    failed: Arc<std::sync::Mutex<Vec<String>>>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    fn start(s: &Arc<Svc>) -> Load {
        let ok = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let (s, ok2, failed2) = (s.clone(), ok.clone(), failed.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            let mut calls = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        let (s, ok, failed) = (s.clone(), ok2.clone(), failed2.clone());
                        calls.spawn(async move {
                            match s.call().await {
                                Ok(()) => { ok.fetch_add(1, Ordering::SeqCst); }
                                Err(e) => failed.lock().unwrap().push(e.to_string()),
                            }
                        });
                    }
                    _ = stopped.changed() => break,
                }
                while calls.try_join_next().is_some() {}
            }
            while calls.join_next().await.is_some() {}
        });
        Load {
            ok,
            failed,
            stop,
            task,
        }
    }

    /// Waits until `n` more connections succeeded (or fails after 30 s).
    async fn more(&self, n: usize, what: &str) {
        let target = self.ok.load(Ordering::SeqCst) + n;
        eventually(what, Duration::from_secs(30), || {
            self.ok.load(Ordering::SeqCst) >= target
        })
        .await;
    }

    async fn stop(self) -> (usize, Vec<String>) {
        let _ = self.stop.send(true);
        self.task.await.unwrap();
        let failed = self.failed.lock().unwrap().clone();
        (self.ok.load(Ordering::SeqCst), failed)
    }
}

/// One endpoint's pod terminates under 200 new connections/s: with
/// `goaway-on-term-start` on its node (the GOAWAY reaches the client first),
/// then with `evict-on-delete` on the client (terminating, then deleted). No
/// connection fails, and once the client knows, none reaches that endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_terminates_under_load_gets_no_new_connection_and_none_fails() {
    // goaway-on-term-start on node B.
    let s = Arc::new(
        Svc::start(
            125,
            Options {
                server_yaml: policy("goaway-on-term-start"),
                ..Default::default()
            },
        )
        .await,
    );
    let load = Load::start(&s);
    load.more(200, "load flowing").await;
    assert!((0..3).all(|i| s.count(i) > 0));
    s.set_states("server", &["running", "terminating", "running"])
        .await;
    s.client_saw_goaway("e1").await;
    // Streams already on e1 finish; then nothing new goes there.
    eventually("e1's streams ended", Duration::from_secs(10), || {
        s.nodes.client.pool.open_streams_to("e1") == 0
    })
    .await;
    // A connection that picked e1 just before may still be on its way.
    load.more(20, "settled").await;
    let e1 = s.count(1);
    load.more(200, "load after the GOAWAY").await;
    assert_eq!(s.count(1), e1, "e1 got connections after its GOAWAY");
    let (ok, failed) = load.stop().await;
    assert!(
        failed.is_empty(),
        "{} of {} failed: {:?}",
        failed.len(),
        ok + failed.len(),
        &failed[..failed.len().min(3)]
    );

    // evict-on-delete on the client.
    let s = Arc::new(
        Svc::start(
            126,
            Options {
                client_yaml: policy("evict-on-delete"),
                ..Default::default()
            },
        )
        .await,
    );
    let load = Load::start(&s);
    load.more(200, "load flowing").await;
    s.set_states("client", &["running", "terminating", "running"])
        .await;
    eventually("e1's streams ended", Duration::from_secs(10), || {
        s.nodes.client.pool.open_streams_to("e1") == 0
    })
    .await;
    load.more(20, "settled").await;
    let e1 = s.count(1);
    load.more(200, "load after e1 terminates").await;
    assert_eq!(s.count(1), e1, "a terminating endpoint got connections");
    // Deleted: gone from both nodes; the client evicts its tunnels to it.
    for which in ["client", "server"] {
        let file = s.nodes.dir.path().join(format!("{which}-workloads.yaml"));
        let text = services_yaml(s.nodes.octet, s.port, &["running"; 3]);
        let without: String = text
            .lines()
            .filter(|l| !l.contains("uid: e1,"))
            .map(|l| format!("{l}\n"))
            .collect();
        write_atomically(&file, &without);
    }
    eventually(
        "the client evicted its tunnels to e1",
        Duration::from_secs(10),
        || {
            !s.nodes
                .client
                .pool
                .dump()
                .iter()
                .any(|t| t.dst.ends_with("/sa/echo") && t.dst_addr.ip() == ip(126, 11))
        },
    )
    .await;
    load.more(200, "load after e1 is deleted").await;
    assert_eq!(s.count(1), e1);
    let (ok, failed) = load.stop().await;
    assert!(
        failed.is_empty(),
        "{} of {} failed: {:?}",
        failed.len(),
        ok + failed.len(),
        &failed[..failed.len().min(3)]
    );
}

/// One short connection through `cap` from `src`: a round trip, then close.
async fn call_through(cap: &Capture, src: IpAddr) -> std::io::Result<()> {
    let mut tcp = cap.try_connect(src).await?;
    let back = round_trip(&mut tcp, b"ping").await?;
    assert_eq!(back, b"ping");
    tcp.shutdown().await?;
    Ok(())
}

/// A crashed endpoint (issue 42): e3's application is gone, so node B's
/// gateway answers every CONNECT to it 503 — the tunnel is fine, only the
/// CONNECT fails. The first refusal takes it out of the choice at once;
/// a Service with no other endpoint still tries it (never emptied); a
/// connect that succeeds brings it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_whose_connects_are_refused_is_passed_over_from_the_first_refusal() {
    let octet = 128;
    let opts = Options {
        // Longer than the test: only a success can end the skip here.
        client_yaml: "outbound:\n  failing_skip: 10m\n".into(),
        ..Default::default()
    };
    let s = Svc::start_with(octet, opts, 4).await;
    let client = s.nodes.client_ip;
    let e3 = SocketAddr::new(ip(octet, 13), s.port);
    let direct = Capture::start(s.nodes.client.outbound.clone(), e3).await;
    let lone_vip = SocketAddr::new(ip(octet, LONE_VIP_HOST), 80);
    let lone = Capture::start(s.nodes.client.outbound.clone(), lone_vip).await;
    let refusals = r#"tidegate_pool_connect_refusals_total{reason="status_503"}"#;

    // A connection straight to e3 is refused by its gateway.
    assert!(call_through(&direct, client).await.is_err());
    assert_eq!(s.client_metric(refusals), 1.0);
    // From then on the VIP passes it over: none of 60 connections fails,
    // no CONNECT reaches e3's gateway again.
    for i in 0..60 {
        s.call()
            .await
            .unwrap_or_else(|e| panic!("connection {i}: {e}"));
    }
    assert_eq!(s.client_metric(refusals), 1.0, "a CONNECT went to e3 again");
    assert!(s.client_metric(r#"tidegate_service_endpoint_skips_total{reason="failing"}"#) > 0.0);
    let echo = s.dumped_echo().await;
    let skipped: Vec<(&str, &serde_json::Value)> = echo["endpoint_choice"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["workload_uid"].as_str().unwrap(), &e["skipped"]))
        .collect();
    assert_eq!(
        skipped,
        [
            ("e0", &serde_json::Value::Null),
            ("e1", &serde_json::Value::Null),
            ("e2", &serde_json::Value::Null),
            ("e3", &serde_json::json!("failing")),
        ]
    );

    // `lone` has no endpoint but e3: tried anyway (the last resort), twice
    // (`outbound.connect_attempts`), and refused.
    assert!(call_through(&lone, client).await.is_err());
    assert_eq!(s.client_metric(&choices("last_resort")), 2.0);
    assert_eq!(s.client_metric(refusals), 3.0);
    assert_eq!(s.client_metric(&retries("failed")), 1.0);

    // The application is back: the next try succeeds, which ends the skip
    // at once — `echo` chooses e3 again (a quarter of its choices).
    let (_, e3_count) = counting_echo(e3, Duration::ZERO).await;
    call_through(&lone, client).await.unwrap();
    for _ in 0..60 {
        s.call().await.unwrap();
    }
    assert!(
        e3_count.load(Ordering::SeqCst) > 1,
        "e3 chosen again after a connect to it succeeded"
    );
}

/// A crashed endpoint costs no connection through its Service: the CONNECT
/// its gateway refuses is tried on another endpoint, before anything of
/// the application's was sent. With failures never skipping
/// (`failing_skip: 0`) and a random choice, e3 keeps being chosen, and
/// every one of those connections goes through on the second try; with
/// `connect_attempts: 1` the same choices fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connect_to_a_services_endpoint_is_tried_on_another() {
    for (octet, attempts) in [(136, 2), (137, 1)] {
        let opts = Options {
            client_yaml: format!(
                "outbound:\n  failing_skip: 0s\n  endpoint_choice: random\n  connect_attempts: {attempts}\n"
            ),
            ..Default::default()
        };
        // e3 has no application: its gateway answers every CONNECT 503.
        let s = Svc::start_with(octet, opts, 4).await;
        let refusals = r#"tidegate_pool_connect_refusals_total{reason="status_503"}"#;
        let mut failed = 0;
        for _ in 0..80 {
            failed += usize::from(s.call().await.is_err());
        }
        let refused = s.client_metric(refusals);
        assert!(refused >= 1.0, "e3 was never chosen in 80 connections");
        if attempts == 2 {
            assert_eq!(
                failed, 0,
                "a connection failed although another endpoint was up"
            );
            assert_eq!(s.client_metric(&retries("connected")), refused);
        } else {
            assert_eq!(failed as f64, refused, "each refusal failed its connection");
            assert_eq!(s.client_metric(&retries("connected")), 0.0);
        }
    }
}
