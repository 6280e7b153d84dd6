//! The executor without the drain engine: its handles built by hand.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::registry::Registry;
use tidegate_sdk as sdk;
use tokio::time::Instant;

use super::{execute, Executed, Handles, TimerSink};
use crate::drains::tasks::DrainTasks;
use crate::drains::tests::{pool, spec};
use crate::drains::DrainMetrics;
use crate::proxy::pool::Pool;
use crate::proxy::tunnels::{InboundTunnels, Registration};
use crate::workloads::{Workload, WorkloadStore};
use tidegate_base::sync::Locked;
use tidegate_protocol::hbone::GoawayCommand;

/// The timers that fired: (subject, tag, source uid).
#[derive(Default)]
struct Fired {
    seen: Mutex<Vec<(String, String, String)>>,
    notify: tokio::sync::Notify,
}

impl TimerSink for Fired {
    fn timer_fired(self: Arc<Self>, subject: String, tag: String, source: Arc<Workload>) {
        let source = source.uid().to_owned();
        self.seen.locked().push((subject, tag, source));
        self.notify.notify_one();
    }
}

struct Rig {
    registry: Registry,
    store: Arc<WorkloadStore>,
    pool: Arc<Pool>,
    inbound: Arc<InboundTunnels>,
    metrics: DrainMetrics,
    tasks: DrainTasks,
    fired: Arc<Fired>,
}

impl Rig {
    fn new() -> Rig {
        let mut reg = Registry::default();
        let store = WorkloadStore::new("td", "n1");
        store.publish(vec![
            spec("local-uid", "n1", [10, 0, 0, 1]),
            spec("peer-uid", "n2", [10, 0, 0, 2]),
        ]);
        let (pool, metrics) = (pool(&mut reg), DrainMetrics::register(&mut reg));
        Rig {
            registry: reg,
            store,
            pool,
            inbound: Arc::new(InboundTunnels::default()),
            metrics,
            tasks: DrainTasks::default(),
            fired: Arc::default(),
        }
    }

    fn local(&self) -> Arc<Workload> {
        self.store.snapshot().by_uid("local-uid").unwrap().clone()
    }

    /// An inbound tunnel to the local workload.
    fn tunnel(&self) -> Registration {
        let peer = "spiffe://td/ns/default/sa/peer".parse().unwrap();
        self.inbound
            .register("local-uid", peer, "10.0.0.2:40000".parse().unwrap())
    }

    fn run(&self, actions: &[sdk::Action], decided_at: Instant) -> Executed {
        self.run_in_grace(actions, decided_at, None)
    }

    /// [`Rig::run`] for a local workload whose termination grace ends at
    /// `grace_end`.
    fn run_in_grace(
        &self,
        actions: &[sdk::Action],
        decided_at: Instant,
        grace_end: Option<Instant>,
    ) -> Executed {
        let store = &self.store;
        let lookup = |uid: &str| store.snapshot().by_uid(uid).cloned();
        let grace = |uid: &str| grace_end.filter(|_| uid == "local-uid");
        let handles = Handles {
            pool: &self.pool,
            inbound: &self.inbound,
            oci: None,
            metrics: &self.metrics,
            tasks: &self.tasks,
            workload: &lookup,
            timers: self.fired.clone(),
            default_goaway_deadline: Duration::from_secs(30),
            grace_end: &grace,
            sources: None,
        };
        execute(&handles, &self.local(), actions, decided_at)
    }

    fn metrics(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        text
    }
}

fn goaway(mode: sdk::GoawayMode, hard_deadline_ms: Option<u64>) -> sdk::Action {
    sdk::Action::Goaway(sdk::Goaway {
        workload: "local-uid".into(),
        target: sdk::GoawayTarget::Inbound,
        delay_ms: 0,
        mode,
        hard_deadline_ms,
        close_notify: false,
    })
}

const S: Duration = Duration::from_secs(1);

#[tokio::test]
async fn a_second_goaway_for_a_tunnel_can_only_make_it_stricter() {
    let rig = Rig::new();
    let reg = rig.tunnel();
    let commands = reg.tunnel.goaway_commands();
    let t0 = Instant::now();
    // Graceful, cut at t0 + 60 s.
    rig.run(&[goaway(sdk::GoawayMode::Graceful, Some(60_000))], t0);
    assert_eq!(
        *commands.borrow(),
        Some(GoawayCommand {
            graceful: true,
            deadline: Some(t0 + 60 * S),
            issued: t0,
            close_notify: false,
        })
    );
    // A later decision asks for immediate, cut at t1 + 5 s: immediate and
    // the earlier deadline win; the first decision's instant is kept.
    let t1 = t0 + S;
    rig.run(&[goaway(sdk::GoawayMode::Immediate, Some(5_000))], t1);
    let strict = GoawayCommand {
        graceful: false,
        deadline: Some(t1 + 5 * S),
        issued: t0,
        close_notify: false,
    };
    assert_eq!(*commands.borrow(), Some(strict));
    // A laxer one (graceful, no explicit deadline: the default 30 s) changes nothing.
    rig.run(&[goaway(sdk::GoawayMode::Graceful, None)], t1 + S);
    assert_eq!(*commands.borrow(), Some(strict));
    // One that asks for a TLS close_notify adds it and nothing else.
    let mut notify = goaway(sdk::GoawayMode::Graceful, None);
    if let sdk::Action::Goaway(g) = &mut notify {
        g.close_notify = true;
    }
    rig.run(&[notify], t1 + 2 * S);
    assert_eq!(
        *commands.borrow(),
        Some(GoawayCommand {
            close_notify: true,
            ..strict
        })
    );
    assert_eq!(reg.tunnel.drained_by(), Some("graceful goaway (local-uid)"));
}

#[tokio::test]
async fn an_admin_goaway_without_deadline_and_a_policys_merge_to_the_deadline() {
    let rig = Rig::new();
    let reg = rig.tunnel();
    let commands = reg.tunnel.goaway_commands();
    // `POST /workloads/<uid>/...` GOAWAY: graceful, no deadline.
    assert_eq!(rig.inbound.goaway_workload("local-uid"), 1);
    assert_eq!(commands.borrow().unwrap().deadline, None);
    let t0 = Instant::now();
    rig.run(&[goaway(sdk::GoawayMode::Graceful, Some(2_000))], t0);
    assert_eq!(commands.borrow().unwrap().deadline, Some(t0 + 2 * S));
    // And the other way round: the admin's adds no deadline and keeps the policy's.
    let rig = Rig::new();
    let reg = rig.tunnel();
    let commands = reg.tunnel.goaway_commands();
    rig.run(&[goaway(sdk::GoawayMode::Immediate, Some(2_000))], t0);
    rig.inbound.goaway_workload("local-uid");
    assert_eq!(
        *commands.borrow(),
        Some(GoawayCommand {
            graceful: false,
            deadline: Some(t0 + 2 * S),
            issued: t0,
            // The admin API's GOAWAY closes with close_notify, as before.
            close_notify: true,
        })
    );
}

#[tokio::test]
async fn two_holds_in_one_decision_hold_for_the_longer() {
    let rig = Rig::new();
    let hold = |bound_ms| {
        sdk::Action::HoldTeardown(sdk::HoldTeardown {
            workload: "local-uid".into(),
            bound_ms,
        })
    };
    let done = rig.run(&[hold(500), hold(2_000), hold(1_000)], Instant::now());
    assert_eq!(done.hold, Some(Duration::from_millis(2_000)));
    assert_eq!(done.descriptions.len(), 3);
    assert_eq!(rig.run(&[], Instant::now()).hold, None);
}

#[tokio::test]
async fn a_fired_timer_reaches_the_sink_with_its_subject_tag_and_source() {
    let rig = Rig::new();
    let timer = sdk::Action::SetTimer(sdk::SetTimer {
        subject: "peer-uid".into(),
        tag: "recheck".into(),
        after_ms: 10,
    });
    let notified = rig.fired.notify.notified();
    let done = rig.run(&[timer], Instant::now());
    assert_eq!(done.descriptions, ["timer \"recheck\" in 10 ms"]);
    assert_eq!(rig.tasks.len(), 1);
    tokio::time::timeout(Duration::from_secs(10), notified)
        .await
        .expect("the timer fires");
    assert_eq!(
        *rig.fired.seen.locked(),
        [("peer-uid".into(), "recheck".into(), "local-uid".into())]
    );
}

#[tokio::test]
async fn evict_names_a_workload_by_uid_and_refuses_an_unknown_one() {
    let rig = Rig::new();
    let evict = |peer: &str| {
        sdk::Action::Evict(sdk::Evict {
            peer: peer.into(),
            when: sdk::EvictWhen::WhenIdle,
        })
    };
    let done = rig.run(&[evict("peer-uid"), evict("nobody")], Instant::now());
    assert_eq!(
        done.descriptions,
        [
            "evict 0 pooled tunnels to peer-uid (when idle)",
            "evict: peer nobody is not a known workload"
        ]
    );
}

#[tokio::test]
async fn a_delayed_goaway_reaches_the_tunnels_later_on_a_tracked_task() {
    let rig = Rig::new();
    let reg = rig.tunnel();
    let mut commands = reg.tunnel.goaway_commands();
    let delayed = sdk::Action::Goaway(sdk::Goaway {
        delay_ms: 20,
        ..match goaway(sdk::GoawayMode::Graceful, Some(1_000)) {
            sdk::Action::Goaway(g) => g,
            _ => unreachable!(),
        }
    });
    let t0 = Instant::now();
    let done = rig.run(&[delayed], t0);
    assert!(
        done.descriptions[0].contains("1 inbound tunnels"),
        "{done:?}"
    );
    assert_eq!(*commands.borrow(), None, "not before the delay");
    assert_eq!(rig.tasks.len(), 1);
    tokio::time::timeout(Duration::from_secs(10), commands.changed())
        .await
        .expect("the delayed GOAWAY arrives")
        .unwrap();
    assert!(Instant::now() >= t0 + Duration::from_millis(20));
    // The hard deadline counts from the end of the delay.
    assert_eq!(
        commands.borrow().unwrap().deadline,
        Some(t0 + Duration::from_millis(1_020))
    );
}

fn hold(bound_ms: u64) -> sdk::Action {
    sdk::Action::HoldTeardown(sdk::HoldTeardown {
        workload: "local-uid".into(),
        bound_ms,
    })
}

/// With 5 s of its termination grace left, a policy asking for a 10 s GOAWAY
/// deadline and teardown hold gets 5 s: on the tunnel's GOAWAY, in the hold
/// the engine waits for, in the descriptions `GET /drains` shows, and
/// counted. A delay past the grace is cut too, leaving no time after it.
#[tokio::test]
async fn with_5s_of_grace_left_a_10s_goaway_deadline_and_hold_get_5s() {
    let rig = Rig::new();
    let reg = rig.tunnel();
    let commands = reg.tunnel.goaway_commands();
    let t0 = Instant::now();
    let grace_end = Some(t0 + 5 * S);
    let asked = [
        goaway(sdk::GoawayMode::Graceful, Some(10_000)),
        hold(10_000),
    ];
    let done = rig.run_in_grace(&asked, t0, grace_end);
    assert_eq!(commands.borrow().and_then(|c| c.deadline), Some(t0 + 5 * S));
    assert_eq!(done.hold, Some(5 * S));
    let cut = "(cut to the pod's termination grace)";
    assert!(
        done.descriptions[0].ends_with(&format!("delay 0 ms, hard deadline 5000 ms {cut}")),
        "{:?}",
        done.descriptions
    );
    assert_eq!(
        done.descriptions[1],
        format!("hold teardown up to 5000 ms {cut}")
    );
    let late = sdk::Action::Goaway(sdk::Goaway {
        delay_ms: 8_000,
        ..match goaway(sdk::GoawayMode::Graceful, Some(1_000)) {
            sdk::Action::Goaway(g) => g,
            _ => unreachable!(),
        }
    });
    let done = rig.run_in_grace(&[late], t0, grace_end);
    assert!(
        done.descriptions[0].ends_with(&format!("delay 5000 ms, hard deadline 0 ms {cut}")),
        "{:?}",
        done.descriptions
    );
    let text = rig.metrics();
    for (deadline, n) in [
        ("goaway_delay", 1),
        ("goaway_hard_deadline", 2),
        ("teardown_hold", 1),
    ] {
        let line = format!("drain_deadlines_cut_to_grace_total{{deadline=\"{deadline}\"}} {n}");
        assert!(text.contains(&line), "{line} in\n{text}");
    }
    // Within the grace, or with no shutdown seen: as asked, nothing cut.
    let within = [goaway(sdk::GoawayMode::Graceful, Some(4_000)), hold(4_000)];
    let done = rig.run_in_grace(&within, t0, grace_end);
    assert!(
        done.descriptions.iter().all(|d| !d.contains(cut)),
        "{done:?}"
    );
    assert_eq!(done.hold, Some(4 * S));
    let done = rig.run(&asked, t0);
    assert_eq!(done.hold, Some(10 * S));
    assert!(
        done.descriptions.iter().all(|d| !d.contains(cut)),
        "{done:?}"
    );
}

/// A GOAWAY naming no hard deadline gets the default (30 s here), but not
/// past the end of the workload's grace.
#[tokio::test]
async fn the_default_goaway_deadline_ends_with_the_grace() {
    let rig = Rig::new();
    let reg = rig.tunnel();
    let commands = reg.tunnel.goaway_commands();
    let t0 = Instant::now();
    let unnamed = goaway(sdk::GoawayMode::Graceful, None);
    let done = rig.run_in_grace(std::slice::from_ref(&unnamed), t0, Some(t0 + 5 * S));
    assert_eq!(commands.borrow().and_then(|c| c.deadline), Some(t0 + 5 * S));
    assert!(
        done.descriptions[0].contains("hard deadline 5000 ms"),
        "{:?}",
        done.descriptions
    );
    // Without a grace (no shutdown seen): the default.
    let done = rig.run(&[unnamed], t0);
    assert!(
        done.descriptions[0].ends_with("hard deadline 30000 ms"),
        "{:?}",
        done.descriptions
    );
}
