//! `decide_at` when no plugin decides: which fallback, whether it is
//! reported as one, and that its actions are validated like a plugin's.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tidegate_sdk as sdk;

use super::{PolicyEngine, SelectedBy, Selection};
use crate::config::{Fallback, PoliciesConfig};
use crate::{Clock, PolicyMetrics};

fn engine(fallback: Fallback) -> (Arc<PolicyEngine>, Registry) {
    let mut reg = Registry::default();
    let cfg = PoliciesConfig {
        fallback,
        max_deadline: Duration::from_secs(60),
        ..Default::default()
    };
    let engine = PolicyEngine::new(&cfg, PolicyMetrics::register(&mut reg)).unwrap();
    (engine, reg)
}

fn selection(name: &str, by: SelectedBy) -> Selection {
    Selection {
        name: name.to_owned(),
        by,
        version: None,
        why: "".into(),
        skipped: vec![],
    }
}

fn shutdown_started(grace_ms: u64) -> sdk::Event {
    sdk::Event::ShutdownStarted(sdk::ShutdownStarted {
        workload: sdk::WorkloadState {
            info: sdk::WorkloadInfo {
                uid: "w-uid".into(),
                name: "w".into(),
                namespace: "default".into(),
                identity: "spiffe://td/ns/default/sa/w".into(),
                labels: Default::default(),
                annotations: Default::default(),
            },
            inbound_tunnels: 1,
            inbound_streams: 1,
            outbound_pooled_tunnels: 0,
            age_ms: 1_000,
        },
        grace_deadline_ms: 1_000_000 + grace_ms,
        grace_remaining_ms: grace_ms,
    })
}

fn encoded(reg: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, reg).unwrap();
    text
}

#[test]
fn a_selected_policy_that_is_not_loaded_is_decided_by_the_fallback_and_says_so() {
    let (engine, reg) = engine(Fallback::GoawayOnTermStart);
    let sel = selection("recommended", SelectedBy::Default);
    let d = engine.decide_at(&sel, &shutdown_started(30_000), Clock::Fixed(1_000_000));
    assert_eq!(d.policy, "recommended");
    assert_eq!(d.version, None);
    let reason = d.fallback.expect("a fallback decision is reported as one");
    assert_eq!(reason.kind, "not_loaded");
    assert!(reason.detail.contains("recommended"), "{}", reason.detail);
    // The configured fallback's decision: a graceful GOAWAY cut 1 s before the grace ends.
    let [sdk::Action::Goaway(g)] = d.actions.as_slice() else {
        panic!("{:?}", d.actions)
    };
    assert_eq!(g.workload, "w-uid");
    assert_eq!(g.mode, sdk::GoawayMode::Graceful);
    assert_eq!(g.hard_deadline_ms, Some(29_000));
    assert!(encoded(&reg).contains(
        r#"policy_decisions_total{policy="recommended",event="shutdown-started",decided_by="builtin:goaway-on-term-start"} 1"#
    ));
}

#[test]
fn no_policy_selected_is_the_fallback_deciding_not_a_failure() {
    let (engine, _reg) = engine(Fallback::GoawayOnTermStart);
    let sel = selection("builtin:goaway-on-term-start", SelectedBy::Fallback);
    let d = engine.decide_at(&sel, &shutdown_started(30_000), Clock::Fixed(1_000_000));
    assert_eq!(d.fallback, None);
    assert_eq!(d.actions.len(), 1);
}

#[test]
fn the_fallbacks_actions_are_clamped_like_a_plugins() {
    let (engine, reg) = engine(Fallback::GoawayOnTermStart);
    let sel = selection("recommended", SelectedBy::Default);
    // A 24 h grace: the fallback asks for a deadline past `policies.max_deadline` (60 s).
    let d = engine.decide_at(&sel, &shutdown_started(86_400_000), Clock::Fixed(1_000_000));
    assert_eq!(d.clamped, 1);
    let [sdk::Action::Goaway(g)] = d.actions.as_slice() else {
        panic!("{:?}", d.actions)
    };
    assert_eq!(g.hard_deadline_ms, Some(60_000));
    assert!(encoded(&reg).contains(r#"policy_actions_clamped_total{policy="recommended"} 1"#));
}

#[test]
fn keepalive_only_decides_nothing() {
    let (engine, reg) = engine(Fallback::KeepaliveOnly);
    let sel = selection("recommended", SelectedBy::Default);
    let d = engine.decide_at(&sel, &shutdown_started(30_000), Clock::Fixed(1_000_000));
    assert!(d.actions.is_empty());
    assert_eq!(d.fallback.unwrap().kind, "not_loaded");
    assert!(encoded(&reg).contains(r#"decided_by="builtin:keepalive-only"} 1"#));
}
