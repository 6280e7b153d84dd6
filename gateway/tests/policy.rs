//! The policy host against real components: the reference plugins' traces
//! through `tidegate policy test`, and every misbehaving fixture through the
//! engine the gateway uses. Plugins come from `cargo xtask plugins`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidegate::config::Config;
use tidegate_policy_host::{FailureKind, PolicyEngine, PolicyMetrics, SelectedBy, Selection};
use tidegate_sdk as sdk;

const BIN: &str = env!("CARGO_BIN_EXE_tidegate");
const REFERENCE: [&str; 6] = [
    "goaway-on-term-start",
    "drain-at-teardown",
    "evict-on-delete",
    "keepalive-only",
    "oci-drain",
    "recommended",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn plugin(rel: &str) -> PathBuf {
    let p = root().join("target/plugins").join(format!("{rel}.wasm"));
    assert!(
        p.exists(),
        "{} is missing: build the plugins first with `cargo xtask plugins` (the README's test command does)",
        p.display()
    );
    p
}

fn engine(extra: &str) -> (Arc<PolicyEngine>, prometheus_client::registry::Registry) {
    let cfg = Config::from_yaml(&format!(
        "policies:\n  call_deadline: 200ms\n  quarantine_failures: 3\n{extra}"
    ))
    .unwrap();
    let mut registry = prometheus_client::registry::Registry::with_prefix("tidegate");
    let metrics = PolicyMetrics::register(&mut registry);
    (PolicyEngine::new(&cfg.policies, metrics).unwrap(), registry)
}

fn metrics_text(r: &prometheus_client::registry::Registry) -> String {
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, r).unwrap();
    s
}

/// The sample `series`; a missing series fails the test (a renamed metric
/// must not read as 0).
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            let (n, v) = l.rsplit_once(' ')?;
            (n == series).then(|| v.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no metric series `{series}` in:\n{text}"))
}

fn workload(uid: &str) -> sdk::WorkloadState {
    sdk::WorkloadState::new(sdk::WorkloadInfo::new(uid).named("demo", uid)).with_inbound(2, 3)
}

fn shutdown(uid: &str) -> sdk::Event {
    sdk::Event::ShutdownStarted(sdk::ShutdownStarted {
        workload: workload(uid),
        grace_deadline_ms: 1_000_000,
        grace_remaining_ms: 30_000,
    })
}

fn teardown(uid: &str) -> sdk::Event {
    sdk::Event::NetworkTeardown(sdk::NetworkTeardown {
        workload: workload(uid),
        since_shutdown_ms: Some(5_000),
        max_hold_ms: 30_000,
    })
}

fn install(e: &PolicyEngine, name: &str, file: &str, config: &str) -> Selection {
    let bytes = std::fs::read(plugin(file)).unwrap();
    e.install(name, &bytes, Some(config)).unwrap();
    Selection {
        name: name.into(),
        by: SelectedBy::Default,
        version: e.version(name),
        why: "".into(),
        skipped: Vec::new(),
    }
}

#[test]
fn reference_policies_pass_their_traces_in_the_real_host() {
    for name in REFERENCE {
        let out = Command::new(BIN)
            .args(["policy", "test"])
            .arg(plugin(name))
            .arg(root().join("plugins").join(name).join("trace.yaml"))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("steps passed"), "{name}: {stdout}");
    }
}

#[test]
fn a_wrong_expectation_fails_with_a_diff() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("wrong.yaml");
    std::fs::write(
        &trace,
        "steps:\n- name: expects nothing\n  event: {shutdown-started: {workload: {info: {uid: w}}, grace-deadline-ms: 30000, grace-remaining-ms: 30000}}\n  expect: []\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["policy", "test"])
        .arg(plugin("goaway-on-term-start"))
        .arg(&trace)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("expects nothing") && err.contains("+ [0]"),
        "{err}"
    );
    assert_eq!(
        err.matches("- expected, + actual").count(),
        1,
        "the diff header once: {err}"
    );
}

#[test]
fn check_refuses_wrong_versions_and_garbage_by_name() {
    let out = Command::new(BIN)
        .args(["policy", "check"])
        .arg(plugin("fixtures/wrong-version"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("9.0.0") && err.contains("0.1.0"),
        "both versions named: {err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, b"\x00asm but not really, just bytes").unwrap();
    let out = Command::new(BIN)
        .args(["policy", "check"])
        .arg(&garbage)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a WebAssembly component"));

    let out = Command::new(BIN)
        .args(["policy", "check"])
        .arg(plugin("recommended"))
        .args(["--policy-config", r#"{"hold-ms": "soon"}"#])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("hold-ms"));

    let out = Command::new(BIN)
        .args(["policy", "check"])
        .arg(plugin("recommended"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains("imports: tidegate:policy/types@0.3.0"),
        "no WASI: {report}"
    );
}

#[test]
fn runaway_plugins_are_interrupted_and_the_fallback_decides() {
    for (fixture, kind) in [
        ("fixtures/loop-forever", FailureKind::Timeout),
        ("fixtures/alloc-unbounded", FailureKind::Memory),
        ("fixtures/trap", FailureKind::Trap),
    ] {
        let (e, reg) = engine("  fallback: goaway-on-term-start\n");
        let sel = install(&e, "bad", fixture, r#"{"only-on": "network-teardown"}"#);
        let started = Instant::now();
        let d = e.decide(&sel, &teardown("w1"));
        // A hang guard, not a performance assertion: the call was interrupted.
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{fixture} was not bounded"
        );
        let fb = d.fallback.expect("the fallback decided");
        assert_eq!(fb.kind, kind.label(), "{fixture}: {}", fb.detail);
        let text = metrics_text(&reg);
        assert_eq!(
            metric(
                &text,
                &format!(
                    r#"tidegate_policy_failures_total{{policy="bad",kind="{}"}}"#,
                    kind.label()
                )
            ),
            1.0,
            "{fixture}\n{text}"
        );
        // The fallback (goaway-on-term-start) answers what it knows; other
        // events keep going to the plugin, on a fresh instance.
        let d = e.decide(&sel, &shutdown("w1"));
        assert!(
            d.fallback.is_none(),
            "{fixture} recovers for events it handles"
        );
        let v = sel.version.as_ref().unwrap();
        assert_eq!(
            v.instantiations(),
            2,
            "{fixture}: re-instantiated after the failure"
        );
    }
}

#[test]
fn repeated_failures_quarantine_the_version_until_replaced() {
    let (e, reg) = engine("");
    let sel = install(
        &e,
        "bad",
        "fixtures/trap",
        r#"{"only-on": "network-teardown"}"#,
    );
    for _ in 0..3 {
        assert_eq!(
            e.decide(&sel, &teardown("w")).fallback.unwrap().kind,
            "trap"
        );
    }
    let v = sel.version.clone().unwrap();
    assert!(v.is_quarantined());
    let calls = v.calls();
    let d = e.decide(&sel, &shutdown("w"));
    assert_eq!(d.fallback.unwrap().kind, "quarantined");
    assert_eq!(v.calls(), calls, "a quarantined version is not called");
    let text = metrics_text(&reg);
    assert_eq!(
        metric(&text, r#"tidegate_policy_quarantines_total{policy="bad"}"#),
        1.0,
        "{text}"
    );
    assert!(e.list().iter().any(|p| p.name == "bad" && p.quarantined));
    // Replacing it ends the quarantine.
    let sel = install(&e, "bad", "keepalive-only", "");
    let d = e.decide(&sel, &teardown("w"));
    assert!(d.fallback.is_none());
    assert!(!e.list().iter().any(|p| p.name == "bad" && p.quarantined));
}

#[test]
fn validation_ignores_other_workloads_clamps_and_bounds() {
    let (e, reg) = engine("");
    let sel = install(&e, "other", "fixtures/other-workload", "");
    let d = e.decide(&sel, &shutdown("mine"));
    assert!(d.fallback.is_none());
    assert!(d.ignored >= 1, "{d:?}");
    assert!(
        d.actions
            .iter()
            .all(|a| a.subject().is_none_or(|s| s == "mine")),
        "{d:?}"
    );
    let text = metrics_text(&reg);
    assert!(
        metric(
            &text,
            r#"tidegate_policy_actions_ignored_total{policy="other",kind="other_subject"}"#
        ) >= 1.0,
        "{text}"
    );

    let sel = install(&e, "absurd", "fixtures/absurd-delay", "");
    for event in [shutdown("w"), teardown("w")] {
        let d = e.decide(&sel, &event);
        for a in &d.actions {
            match a {
                sdk::Action::Goaway(g) => {
                    assert!(g.delay_ms <= 60_000 && g.hard_deadline_ms.unwrap_or(0) <= 600_000)
                }
                sdk::Action::HoldTeardown(h) => assert!(h.bound_ms <= 30_000),
                sdk::Action::SetTimer(t) => assert!(t.after_ms <= 3_600_000),
                sdk::Action::Backoff(b) => {
                    assert!(b.multiplier.is_finite() && b.jitter.is_finite() && b.max_ms <= 300_000)
                }
                _ => {}
            }
        }
    }
    assert!(
        metric(
            &metrics_text(&reg),
            r#"tidegate_policy_actions_clamped_total{policy="absurd"}"#
        ) >= 1.0
    );

    let sel = install(&e, "flood", "fixtures/action-flood", "");
    let d = e.decide(&sel, &teardown("w"));
    assert_eq!(d.actions.len(), 32, "the list is bounded");
    assert!(d.ignored > 0);
}

#[test]
fn refused_plugins_leave_the_previous_version() {
    let (e, reg) = engine("");
    install(&e, "p", "goaway-on-term-start", "");
    let good = e.version("p").unwrap().hash.clone();
    let wrong = std::fs::read(plugin("fixtures/wrong-version")).unwrap();
    let err = e.install("p", &wrong, None).unwrap_err().to_string();
    assert!(err.contains("9.0.0") && err.contains("0.1.0"), "{err}");
    let err = e.install("p", b"garbage", None).unwrap_err().to_string();
    assert!(err.contains("not a WebAssembly component"), "{err}");
    assert!(!err.contains('\n'), "one line: {err:?}");
    // A plugin that misbehaves on the self-test event is refused too.
    let looping = std::fs::read(plugin("fixtures/loop-forever")).unwrap();
    let err = e.install("p", &looping, Some("")).unwrap_err().to_string();
    assert!(
        err.contains("self-test") && err.contains("timeout"),
        "{err}"
    );
    assert_eq!(e.version("p").unwrap().hash, good);
    let listed = e.list().into_iter().find(|p| p.name == "p").unwrap();
    assert!(listed.loaded && listed.last_error.is_some());
    let text = metrics_text(&reg);
    for kind in ["incompatible_version", "not_a_component", "self_test"] {
        assert_eq!(
            metric(
                &text,
                &format!(r#"tidegate_policy_swaps_total{{policy="p",kind="{kind}"}}"#)
            ),
            1.0,
            "{kind}\n{text}"
        );
    }
}

#[test]
fn selection_follows_annotation_bindings_default() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = format!(
        "  default: a\n  plugins:\n    a: {{file: {a}}}\n    b: {{file: {b}}}\n  bindings:\n    - {{namespace: pay, selector: {{app: web}}, policy: b}}\n",
        a = plugin("keepalive-only").display(),
        b = plugin("goaway-on-term-start").display(),
    );
    let (e, _) = engine(&cfg);
    for (name, r) in e.load_configured() {
        r.unwrap_or_else(|err| panic!("{name}: {err}"));
    }
    let store = tidegate::workloads::WorkloadStore::new("td", "n");
    store.publish(
        tidegate::workloads::parse_workload_file(
            "workloads:\n\
             - {uid: plain, name: p, ips: [10.0.0.1], node: n}\n\
             - {uid: web, name: w, namespace: pay, labels: {app: web}, ips: [10.0.0.2], node: n}\n\
             - {uid: pinned, name: x, namespace: pay, labels: {app: web}, annotations: {tidegate.io/drain-policy: a}, ips: [10.0.0.3], node: n}\n\
             - {uid: typo, name: t, annotations: {tidegate.io/drain-policy: nope}, ips: [10.0.0.4], node: n}\n",
        )
        .unwrap(),
    );
    let snap = store.snapshot();
    let sel = |uid: &str| e.select(snap.by_uid(uid).unwrap());
    assert_eq!(
        (sel("plain").name, sel("plain").by),
        ("a".into(), SelectedBy::Default)
    );
    assert_eq!(
        (sel("web").name, sel("web").by),
        ("b".into(), SelectedBy::Binding(0))
    );
    assert_eq!(
        (sel("pinned").name, sel("pinned").by),
        ("a".into(), SelectedBy::Annotation)
    );
    assert_eq!(
        sel("typo").by,
        SelectedBy::Default,
        "an unknown name is ignored"
    );
    // The report is the selection, with the name passed over and why.
    let r = e.report(snap.by_uid("typo").unwrap(), None);
    assert_eq!(
        (r.name.as_str(), r.source, r.loaded),
        ("a", "default", true)
    );
    assert_eq!(
        (r.skipped[0].policy.as_str(), r.skipped[0].source),
        ("nope", "annotation")
    );
    let r = e.report(snap.by_uid("web").unwrap(), None);
    assert_eq!((r.source, r.binding), ("binding", Some(0)));
    assert_eq!(r.why, "policies.bindings[0] (namespace pay, app=web)");
    // A run-time binding wins over the annotation, until removed; it must
    // name a policy.
    assert!(e.bind("pinned", "missing").is_err());
    assert_eq!(e.bind("pinned", "b").unwrap(), None);
    assert_eq!(
        (sel("pinned").name, sel("pinned").by),
        ("b".into(), SelectedBy::Admin)
    );
    assert_eq!(
        e.report(snap.by_uid("pinned").unwrap(), None).source,
        "admin"
    );
    assert_eq!(e.unbind("pinned").as_deref(), Some("b"));
    assert_eq!(sel("pinned").by, SelectedBy::Annotation);
    drop(dir);
}

#[test]
fn plugin_files_are_watched_and_swapped() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.wasm");
    std::fs::copy(plugin("keepalive-only"), &file).unwrap();
    let (e, _) = engine(&format!(
        "  reload_interval: 20ms\n  plugins:\n    p: {{file: {}}}\n",
        file.display()
    ));
    for (_, r) in e.load_configured() {
        r.unwrap();
    }
    let v1 = e.version("p").unwrap().hash.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (trigger, watch) = tidegate_base::shutdown::channel();
        let task = tokio::spawn(e.clone().watch_files(Duration::from_millis(20), watch));
        // Replace atomically, as an operator (or a ConfigMap update) would.
        let tmp = dir.path().join("p.wasm.tmp");
        std::fs::copy(plugin("goaway-on-term-start"), &tmp).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while e.version("p").unwrap().hash == v1 {
            assert!(
                Instant::now() < deadline,
                "the new file was never swapped in"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A broken file is refused; the new version stays.
        let v2 = e.version("p").unwrap().hash.clone();
        std::fs::write(&tmp, b"broken").unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while e.list()[0].last_error.is_none() {
            assert!(
                Instant::now() < deadline,
                "the broken file was never looked at"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(e.version("p").unwrap().hash, v2);
        trigger.start(Duration::ZERO);
        task.await.unwrap();
    });
}

/// A pod with 6 labels and 5 annotations, as the bench's typical pod.
fn labelled_shutdown(uid: &str) -> sdk::Event {
    let mut info = sdk::WorkloadInfo::new(uid).named("demo", uid);
    for (k, v) in [
        ("app", "web"),
        ("tier", "frontend"),
        ("version", "v2"),
        ("pod-template-hash", "7d9f8b6c5"),
        ("app.kubernetes.io/part-of", "shop"),
        ("team", "checkout"),
    ] {
        info = info.with_label(k, v);
    }
    for (k, v) in [
        ("tidegate.io/oci-drain", "true"),
        ("kubectl.kubernetes.io/restartedAt", "2026-12-01T10:00:00Z"),
        ("prometheus.io/scrape", "true"),
        ("prometheus.io/port", "9090"),
        ("cluster-autoscaler.kubernetes.io/safe-to-evict", "true"),
    ] {
        info = info.with_annotation(k, v);
    }
    sdk::Event::ShutdownStarted(sdk::ShutdownStarted {
        workload: sdk::WorkloadState::new(info).with_inbound(2, 3),
        grace_deadline_ms: 1_000_000,
        grace_remaining_ms: 30_000,
    })
}

fn logged(actions: &[sdk::Action]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            sdk::Action::Log(l) => Some(l.message.clone()),
            _ => None,
        })
        .collect()
}

/// A plugin built for 0.1.0 (`init` returns nothing) still loads, runs
/// under the 0.1.0 bindings, is handed every label and annotation, and its
/// actions are executed as before.
#[test]
fn a_plugin_built_for_contract_0_1_0_still_loads_and_sees_all_metadata() {
    let (e, _) = engine("");
    let sel = install(&e, "old", "fixtures/contract-0-1", "");
    let v = e.version("old").unwrap();
    assert_eq!(v.contract.to_string(), "0.1.0");
    assert_eq!(v.reads(), Some(sdk::MetadataReads::everything()));
    let d = e.decide(&sel, &labelled_shutdown("w"));
    assert_eq!(logged(&d.actions), ["labels=6 annotations=5"], "{d:?}");
    assert!(
        matches!(&d.actions[0], sdk::Action::Goaway(g) if g.workload == "w"),
        "{d:?}"
    );
    let (exports, _) = v.interface();
    assert!(
        exports.iter().any(|x| x == "tidegate:policy/policy@0.1.0"),
        "{exports:?}"
    );
}

/// A plugin built for 0.2.0 (`decide` takes the typed event) still loads,
/// runs under the 0.2.0 bindings, is handed only the keys its `init`
/// declared, and its actions are executed as before.
#[test]
fn a_plugin_built_for_contract_0_2_0_still_loads_and_sees_what_it_declared() {
    let (e, _) = engine("");
    let sel = install(&e, "typed", "fixtures/contract-0-2", "");
    let v = e.version("typed").unwrap();
    assert_eq!(v.contract.to_string(), "0.2.0");
    assert_eq!(
        v.reads(),
        Some(
            sdk::MetadataReads::none()
                .label("app")
                .annotation("tidegate.io/oci-drain")
        )
    );
    let d = e.decide(&sel, &labelled_shutdown("w"));
    assert_eq!(
        logged(&d.actions),
        ["labels=app annotations=tidegate.io/oci-drain"],
        "{d:?}"
    );
    assert!(
        matches!(&d.actions[0], sdk::Action::Goaway(g) if g.workload == "w"),
        "{d:?}"
    );
    let (exports, _) = v.interface();
    assert!(
        exports.iter().any(|x| x == "tidegate:policy/policy@0.2.0"),
        "{exports:?}"
    );
}

/// A 0.3.0 plugin (the SDK's: the event arrives encoded) is handed exactly
/// the label and annotation keys its `init` declared (`*`: every key;
/// none: none), and a declaration beyond the bounds is refused at install
/// with the reason.
#[test]
fn a_contract_0_3_0_plugin_is_handed_only_the_metadata_it_declared() {
    let (e, _) = engine("");
    let cases = [
        (
            r#"{"labels": "app,missing", "annotations": "tidegate.io/oci-drain"}"#,
            "labels=app annotations=tidegate.io/oci-drain",
        ),
        (
            r#"{"labels": "*"}"#,
            "labels=app,app.kubernetes.io/part-of,pod-template-hash,team,tier,version annotations=",
        ),
        (r#"{}"#, "labels= annotations="),
    ];
    for (config, want) in cases {
        let sel = install(&e, "probe", "fixtures/reads-probe", config);
        assert_eq!(e.version("probe").unwrap().contract.to_string(), "0.3.0");
        let d = e.decide(&sel, &labelled_shutdown("w"));
        assert_eq!(logged(&d.actions), [want], "{config}");
    }
    let too_many: Vec<String> = (0..=tidegate_policy_host::MAX_READ_KEYS)
        .map(|i| format!("k{i}"))
        .collect();
    let bytes = std::fs::read(plugin("fixtures/reads-probe")).unwrap();
    let config = format!(r#"{{"labels": "{}"}}"#, too_many.join(","));
    let err = e
        .install("probe2", &bytes, Some(&config))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("metadata-reads.labels") && err.contains("at most 64"),
        "{err}"
    );
    assert!(e.version("probe2").is_none());
}

/// The reference plugins declare what they read: `oci-drain` and
/// `recommended` the opt-in annotation (and so still drain an opted-in
/// pod), the others nothing.
#[test]
fn reference_plugins_declare_only_what_they_read() {
    let (e, _) = engine("");
    for name in REFERENCE {
        install(&e, name, name, "");
        let reads = e.version(name).unwrap().reads().unwrap();
        let expect = match name {
            "oci-drain" | "recommended" => {
                sdk::MetadataReads::none().annotation("tidegate.io/oci-drain")
            }
            _ => sdk::MetadataReads::none(),
        };
        assert_eq!(reads, expect, "{name}");
    }
    let sel = install(&e, "oci-drain", "oci-drain", "");
    let d = e.decide(&sel, &labelled_shutdown("w"));
    assert!(
        d.actions
            .iter()
            .any(|a| matches!(a, sdk::Action::OciDrain(o) if o.workload == "w")),
        "the opt-in annotation still reaches it: {d:?}"
    );
}

/// A refused configuration is not kept: an upload with a bad
/// `tidegate-policy-config` is refused, and the next load without a
/// configuration of its own (the file watcher's reload, an upload without the
/// header) gets the last accepted one and is accepted.
#[test]
fn a_refused_config_does_not_refuse_the_next_loads() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.wasm");
    std::fs::copy(plugin("recommended"), &file).unwrap();
    let (e, reg) = engine(&format!(
        "  plugins:\n    p: {{file: {}, config: {{hold-ms: 5000}}}}\n",
        file.display()
    ));
    for (_, r) in e.load_configured() {
        r.unwrap();
    }
    let status = |e: &PolicyEngine| e.list().into_iter().find(|p| p.name == "p").unwrap();
    let swaps = |kind: &str| {
        let series = format!(r#"tidegate_policy_swaps_total{{policy="p",kind="{kind}"}}"#);
        let text = metrics_text(&reg);
        if text.contains(&series) {
            metric(&text, &series)
        } else {
            0.0
        }
    };
    let teardown_bytes = std::fs::read(plugin("drain-at-teardown")).unwrap();
    let bad = r#"{"hold-ms": "soon"}"#;
    let err = e
        .upload("p", &teardown_bytes, Some(bad))
        .err()
        .expect("a bad config is refused")
        .to_string();
    assert!(err.contains("hold-ms"), "{err}");
    assert_eq!((swaps("ok"), swaps("init")), (1.0, 1.0));

    // The file changes: reloaded with the configured config, not the refused one.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (trigger, watch) = tidegate_base::shutdown::channel();
        let task = tokio::spawn(e.clone().watch_files(Duration::from_millis(20), watch));
        let tmp = dir.path().join("p.wasm.tmp");
        std::fs::write(&tmp, &teardown_bytes).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while swaps("ok") + swaps("init") < 3.0 {
            assert!(
                Instant::now() < deadline,
                "the new file was never looked at"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        trigger.start(Duration::ZERO);
        task.await.unwrap();
    });
    let s = status(&e);
    assert_eq!(s.last_error, None, "the reload was refused");
    assert_eq!(s.source, Some(tidegate_policy_host::LoadedFrom::File));
    assert_eq!((swaps("ok"), swaps("init")), (2.0, 1.0));

    // An upload without the header after a refused one: accepted too.
    assert!(e.upload("p", &teardown_bytes, Some(bad)).is_err());
    let bytes = std::fs::read(plugin("recommended")).unwrap();
    let up = e.upload("p", &bytes, None).unwrap();
    assert_eq!(up.result, tidegate_policy_host::UploadResult::Swapped);
    assert_eq!(status(&e).last_error, None);
}
