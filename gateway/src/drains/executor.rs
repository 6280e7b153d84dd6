//! Turns validated actions into effects on real tunnels.

use std::sync::Arc;
use std::time::Duration;

use tidegate_sdk as sdk;
use tokio::time::Instant;
use tracing::info;

use super::engine::DrainEngine;
use crate::hbone::GoawayCommand;
use crate::identity::SpiffeId;
use crate::oci::drainer::AtCapacity;
use crate::workloads::Workload;

/// What was done, for `GET /drains` and the caller.
#[derive(Debug, Default)]
pub(super) struct Executed {
    pub descriptions: Vec<String>,
    /// Set by a `hold-teardown` action.
    pub hold: Option<Duration>,
}

/// Executes `actions` about `workload`, decided at `decided_at`.
pub(super) fn execute(
    engine: &Arc<DrainEngine>,
    workload: &Arc<Workload>,
    actions: &[sdk::Action],
    decided_at: Instant,
) -> Executed {
    let mut out = Executed::default();
    for action in actions {
        let text = match action {
            sdk::Action::Goaway(g) => goaway(engine, workload, g, decided_at),
            sdk::Action::Evict(e) => {
                let now = e.when == sdk::EvictWhen::Now;
                match identity_of(engine, &e.peer) {
                    Some(id) => {
                        let n = engine.pool.evict_matching(now, |k| k.dst == id);
                        engine.metrics.action("evict", "executed");
                        format!(
                            "evict {n} pooled tunnels to {} ({})",
                            e.peer,
                            if now { "now" } else { "when idle" }
                        )
                    }
                    None => {
                        engine.metrics.action("evict", "unknown_peer");
                        format!("evict: peer {} is not a known workload", e.peer)
                    }
                }
            }
            sdk::Action::Backoff(b) => match b.destination.parse::<std::net::SocketAddr>() {
                Ok(addr) => {
                    engine.pool.set_backoff(
                        addr,
                        crate::proxy::pool::BackoffParams {
                            initial: Duration::from_millis(b.initial_ms),
                            max: Duration::from_millis(b.max_ms),
                            multiplier: b.multiplier,
                            jitter: b.jitter,
                        },
                    );
                    engine.metrics.action("backoff", "executed");
                    format!(
                        "backoff for {}: {}..{} ms ×{} ±{}",
                        b.destination, b.initial_ms, b.max_ms, b.multiplier, b.jitter
                    )
                }
                Err(_) => {
                    engine.metrics.action("backoff", "bad_destination");
                    format!("backoff: {:?} is not a destination address", b.destination)
                }
            },
            sdk::Action::OciDrain(o) => match engine.oci() {
                Some(oci) => {
                    let at_capacity = match o.at_capacity {
                        sdk::AtCapacity::RemoveEarly => AtCapacity::RemoveEarly,
                        sdk::AtCapacity::Keep => AtCapacity::Keep,
                    };
                    // Off the decision path: the drainer runs its API calls in a task.
                    let r = oci.request(&o.workload, o.drain, at_capacity, decided_at);
                    engine.metrics.action("oci_drain", r.result);
                    r.description
                }
                None => {
                    engine.metrics.action("oci_drain", "not_configured");
                    format!(
                        "oci-drain {} drain={}: not configured (oci.enabled is false)",
                        o.workload, o.drain
                    )
                }
            },
            sdk::Action::HoldTeardown(h) => {
                let bound = Duration::from_millis(h.bound_ms);
                out.hold = Some(out.hold.map_or(bound, |b| b.max(bound)));
                engine.metrics.action("hold_teardown", "executed");
                format!("hold teardown up to {} ms", h.bound_ms)
            }
            sdk::Action::SetTimer(t) => {
                let after = Duration::from_millis(t.after_ms);
                match decided_at.checked_add(after) {
                    Some(at) => {
                        let engine = engine.clone();
                        let (subject, tag) = (t.subject.clone(), t.tag.clone());
                        let source = workload.clone();
                        let task = engine.clone();
                        task.spawn("timer", async move {
                            tokio::time::sleep_until(at).await;
                            engine.timer_fired(subject, tag, source);
                        });
                        format!("timer {:?} in {} ms", t.tag, t.after_ms)
                    }
                    None => format!(
                        "timer {:?} in {} ms: beyond the clock, not set",
                        t.tag, t.after_ms
                    ),
                }
            }
            sdk::Action::Log(l) => {
                info!(workload = %workload.uid(), level = ?l.level, "policy: {}", l.message);
                format!("log {:?}", l.message)
            }
        };
        out.descriptions.push(text);
    }
    out
}

fn identity_of(engine: &DrainEngine, uid: &str) -> Option<SpiffeId> {
    engine.any_workload(uid).map(|w| w.identity.clone())
}

fn goaway(
    engine: &Arc<DrainEngine>,
    workload: &Arc<Workload>,
    g: &sdk::Goaway,
    decided_at: Instant,
) -> String {
    let graceful = g.mode == sdk::GoawayMode::Graceful;
    let hard = g
        .hard_deadline_ms
        .map(Duration::from_millis)
        .unwrap_or(engine.cfg.default_goaway_deadline);
    let cmd = GoawayCommand {
        graceful,
        deadline: decided_at
            .checked_add(Duration::from_millis(g.delay_ms))
            .and_then(|t| t.checked_add(hard)),
        issued: decided_at,
        close_notify: g.close_notify,
    };
    let label = format!(
        "{} goaway ({})",
        if graceful { "graceful" } else { "immediate" },
        g.workload
    );
    let mut parts = Vec::new();
    if matches!(
        g.target,
        sdk::GoawayTarget::Inbound | sdk::GoawayTarget::Both
    ) {
        let inbound = engine.registry.for_workload(&g.workload);
        parts.push(format!("{} inbound tunnels", inbound.len()));
        let delay = Duration::from_millis(g.delay_ms);
        if delay.is_zero() {
            for t in &inbound {
                t.request_goaway(cmd, &label);
            }
        } else {
            let engine = engine.clone();
            let (uid, label) = (g.workload.clone(), label.clone());
            let at = decided_at.checked_add(delay);
            let task = engine.clone();
            task.spawn("delayed-goaway", async move {
                match at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => return,
                }
                for t in engine.registry.for_workload(&uid) {
                    t.request_goaway(cmd, &label);
                }
            });
        }
    }
    if matches!(
        g.target,
        sdk::GoawayTarget::Outbound | sdk::GoawayTarget::Both
    ) {
        let id = if g.workload == workload.uid() {
            Some(workload.identity.clone())
        } else {
            identity_of(engine, &g.workload)
        };
        let n = id.map_or(0, |id| {
            engine
                .pool
                .evict_matching(!graceful, |k| k.src == id || k.dst == id)
        });
        parts.push(format!("{n} pooled outbound tunnels"));
    }
    engine.metrics.action("goaway", "executed");
    format!(
        "{label}: {}, delay {} ms, hard deadline {} ms",
        parts.join(" + "),
        g.delay_ms,
        hard.as_millis()
    )
}
