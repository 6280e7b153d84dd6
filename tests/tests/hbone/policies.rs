//! Policies in a running gateway: a drain keeps the policy version it
//! started with, hot swap under 1,000 open streams, and misbehaving plugins
//! never disturbing traffic.

use std::sync::Arc;

use tidegate_e2e::{http, plugin, round_trip, Options, TwoNodes};
use tidegate_sdk as sdk;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn shutdown_of(w: &tidegate::workloads::Workload) -> sdk::Event {
    sdk::Event::ShutdownStarted(sdk::ShutdownStarted {
        workload: sdk::WorkloadState::new(
            sdk::WorkloadInfo::new(w.uid()).named(&w.spec.namespace, &w.spec.name),
        ),
        grace_deadline_ms: 10_000_000,
        grace_remaining_ms: 30_000,
    })
}

fn hard_deadline(d: &tidegate_policy_host::Decision) -> u64 {
    match &d.actions[..] {
        [sdk::Action::Goaway(g)] => g.hard_deadline_ms.unwrap(),
        other => panic!("expected one goaway, got {other:?}"),
    }
}

/// Two gateways whose server side runs `goaway-on-term-start` as the
/// policy `drain`, with a deadline margin of 1 s.
async fn with_drain_policy(octet: u8) -> TwoNodes {
    let policy_yaml = format!(
        "policies:\n  default: drain\n  plugins:\n    drain:\n      file: {}\n      config: {{deadline-margin-ms: 1000}}\n",
        plugin("goaway-on-term-start").display()
    );
    TwoNodes::with(
        octet,
        Options {
            server_yaml: policy_yaml,
            ..Default::default()
        },
    )
    .await
}

/// `PUT /policies/drain`: the same component with a 5 s margin. Returns
/// the new version's hash.
async fn swap_in_a_5s_margin(nodes: &TwoNodes) -> String {
    let wasm = std::fs::read(plugin("goaway-on-term-start")).unwrap();
    let (status, body) = http(
        nodes.server.addrs.admin,
        "PUT",
        "/policies/drain",
        "tidegate-policy-config: {\"deadline-margin-ms\": 5000}\r\n",
        &wasm,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let v2 = nodes.server.policies.version("drain").unwrap();
    assert!(body.contains(&v2.hash), "{body}");
    v2.hash.clone()
}

fn echo(nodes: &TwoNodes) -> Arc<tidegate::workloads::Workload> {
    nodes
        .server
        .workloads
        .snapshot()
        .by_uid("echo-uid")
        .unwrap()
        .clone()
}

/// A drain pins the policy version that decided its first event: a new
/// version swapped in meanwhile decides new drains, and the drain in
/// progress goes on deciding with the old one (its deadline margin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_keeps_its_pinned_policy_version_through_a_swap() {
    let nodes = with_drain_policy(53).await;
    let engine = nodes.server.policies.clone();
    let echo = echo(&nodes);

    let in_progress = engine.select(&echo);
    let v1 = in_progress.version.clone().expect("v1 loaded");
    let d1 = engine.decide(&in_progress, &shutdown_of(&echo));
    assert_eq!(d1.version.as_deref(), Some(v1.hash.as_str()));
    assert_eq!(hard_deadline(&d1), 29_000);

    let v2 = swap_in_a_5s_margin(&nodes).await;
    assert_ne!(v2, v1.hash);

    let d2 = engine.decide(&engine.select(&echo), &shutdown_of(&echo));
    assert_eq!(d2.version.as_deref(), Some(v2.as_str()));
    assert_eq!(hard_deadline(&d2), 25_000);
    let d1_again = engine.decide(&in_progress, &shutdown_of(&echo));
    assert_eq!(d1_again.version.as_deref(), Some(v1.hash.as_str()));
    assert_eq!(hard_deadline(&d1_again), 29_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_swap_under_a_thousand_streams() {
    let nodes = Arc::new(with_drain_policy(51).await);
    // 1,000 streams open through both gateways.
    let mut conns = Vec::new();
    for chunk in 0..10 {
        let mut batch = Vec::new();
        for i in 0..100u32 {
            let nodes = nodes.clone();
            batch.push(tokio::spawn(async move {
                let mut tcp = nodes.app_conn().await;
                let msg = format!("before {chunk}/{i}");
                assert_eq!(
                    round_trip(&mut tcp, msg.as_bytes()).await.unwrap(),
                    msg.as_bytes()
                );
                tcp
            }));
        }
        for t in batch {
            conns.push(t.await.unwrap());
        }
    }
    let engine = nodes.server.policies.clone();
    let echo = echo(&nodes);

    // v2 through the admin API while the streams are open; new events go to it.
    let v2 = swap_in_a_5s_margin(&nodes).await;
    let d2 = engine.decide(&engine.select(&echo), &shutdown_of(&echo));
    assert_eq!(d2.version.as_deref(), Some(v2.as_str()));
    assert_eq!(hard_deadline(&d2), 25_000);

    // A broken v3 is refused and v2 stays.
    let (status, body) = http(
        nodes.server.addrs.admin,
        "PUT",
        "/policies/drain",
        "",
        b"not wasm",
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("not a WebAssembly component"), "{body}");
    assert_eq!(engine.version("drain").unwrap().hash, v2);
    let (_, listing) = http(nodes.server.addrs.admin, "GET", "/policies", "", b"").await;
    let listing: serde_json::Value = serde_json::from_str(&listing).unwrap();
    let drain = listing["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "drain")
        .unwrap();
    assert_eq!(drain["version"], v2.as_str());
    assert!(drain["last_error"]
        .as_str()
        .unwrap()
        .contains("not a WebAssembly component"));

    // No stream was dropped: every one still round-trips, then closes cleanly.
    let mut tasks = Vec::new();
    for (i, mut tcp) in conns.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let msg = format!("after {i}");
            assert_eq!(
                round_trip(&mut tcp, msg.as_bytes()).await.unwrap(),
                msg.as_bytes()
            );
            tcp.shutdown().await.unwrap();
            let mut rest = Vec::new();
            tcp.read_to_end(&mut rest).await.unwrap();
            assert!(rest.is_empty());
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        nodes.server.tunnels.len(),
        10,
        "the 10 tunnels were never disturbed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_plugins_never_disturb_traffic() {
    // A roomy deadline so the unbounded allocation reaches the memory cap
    // before the clock stops it (each fixture must fail its own way).
    let nodes = TwoNodes::with(
        52,
        Options {
            server_yaml: "policies:\n  call_deadline: 200ms\n".into(),
            ..Default::default()
        },
    )
    .await;
    let mut held = nodes.app_conn().await;
    assert_eq!(round_trip(&mut held, b"first").await.unwrap(), b"first");
    let engine = nodes.server.policies.clone();
    let echo = nodes
        .server
        .workloads
        .snapshot()
        .by_uid("echo-uid")
        .unwrap()
        .clone();
    for fixture in ["loop-forever", "alloc-unbounded", "trap"] {
        let bytes = std::fs::read(plugin(&format!("fixtures/{fixture}"))).unwrap();
        let e = engine.clone();
        let v = tokio::task::spawn_blocking(move || {
            e.install("bad", &bytes, Some(r#"{"only-on": "shutdown-started"}"#))
        })
        .await
        .unwrap();
        // It misbehaves on the self-test event (a shutdown-started): refused.
        assert!(v.is_err(), "{fixture} must fail its self-test");
        let bytes = std::fs::read(plugin(&format!("fixtures/{fixture}"))).unwrap();
        let e = engine.clone();
        tokio::task::spawn_blocking(move || {
            e.install("bad", &bytes, Some(r#"{"only-on": "workload-deleted"}"#))
        })
        .await
        .unwrap()
        .unwrap();
        let sel = tidegate_policy_host::Selection {
            name: "bad".into(),
            by: tidegate_policy_host::SelectedBy::Default,
            version: engine.version("bad"),
            why: "".into(),
            skipped: Vec::new(),
        };
        let deleted = sdk::Event::WorkloadDeleted(sdk::WorkloadState::new(sdk::WorkloadInfo::new(
            echo.uid(),
        )));
        // Traffic flows while the plugin misbehaves, on other tasks.
        let decide = {
            let e = engine.clone();
            tokio::task::spawn_blocking(move || e.decide(&sel, &deleted))
        };
        let mut fresh = nodes.app_conn().await;
        assert_eq!(
            round_trip(&mut fresh, fixture.as_bytes()).await.unwrap(),
            fixture.as_bytes()
        );
        let d = decide.await.unwrap();
        assert!(d.fallback.is_some(), "{fixture}: the fallback decided");
        assert_eq!(
            round_trip(&mut held, fixture.as_bytes()).await.unwrap(),
            fixture.as_bytes()
        );
    }
    let text = nodes.server.metrics_text();
    for kind in ["timeout", "memory", "trap"] {
        assert_eq!(
            tidegate_e2e::metric(
                &text,
                &format!(r#"tidegate_policy_failures_total{{policy="bad",kind="{kind}"}}"#)
            ),
            1.0,
            "{kind}"
        );
    }
}
