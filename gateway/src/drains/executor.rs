//! Turns validated actions into effects on real tunnels.
//!
//! A function of (actions, [`Handles`]): the drain engine hands in what the
//! actions act on, and a fired timer goes back through [`TimerSink`]; this
//! module does not know the engine.

use std::sync::Arc;
use std::time::Duration;

use tidegate_sdk as sdk;
use tokio::time::Instant;
use tracing::info;

use super::metrics::DrainMetrics;
use super::tasks::DrainTasks;
use crate::oci::drainer::AtCapacity;
use crate::oci::OciDrainer;
use crate::proxy::pool::{BackoffParams, Pool, PoolKey};
use crate::proxy::tunnels::InboundTunnels;
use crate::workloads::Workload;
use tidegate_protocol::hbone::GoawayCommand;
use tidegate_protocol::identity::SpiffeId;

/// What was done, for `GET /drains` and the caller.
#[derive(Debug, Default)]
pub(super) struct Executed {
    pub descriptions: Vec<String>,
    /// Pooled outbound tunnels evicted (by `evict` or an outbound GOAWAY).
    pub tunnels_evicted: usize,
    /// Set by a `hold-teardown` action.
    pub hold: Option<Duration>,
}

/// Where a timer set by a `set-timer` action reports when it fires (the
/// drain engine, which asks the policy again).
pub(super) trait TimerSink: Send + Sync + 'static {
    /// `source`: the workload whose decision set the timer.
    fn timer_fired(self: Arc<Self>, subject: String, tag: String, source: Arc<Workload>);
}

/// What actions act on, handed in by the caller.
pub(super) struct Handles<'a> {
    pub pool: &'a Pool,
    pub inbound: &'a Arc<InboundTunnels>,
    /// `None` when `oci.enabled` is false.
    pub oci: Option<&'a Arc<OciDrainer>>,
    pub metrics: &'a DrainMetrics,
    /// Timers and delayed GOAWAYs run here (shutdown cancels them).
    pub tasks: &'a DrainTasks,
    /// Any workload by uid, including one removed from the store recently.
    pub workload: &'a dyn Fn(&str) -> Option<Arc<Workload>>,
    pub timers: Arc<dyn TimerSink>,
    /// A GOAWAY's hard deadline when the action names none.
    pub default_goaway_deadline: Duration,
    /// When a workload's termination grace ends, if its shutdown was seen:
    /// no deadline about it outlives that ([`Grace`]).
    pub grace_end: &'a dyn Fn(&str) -> Option<Instant>,
    /// Pooled tunnels an action may touch: those of these source identities
    /// (a peer decision made for some local clients only), or all when `None`.
    pub sources: Option<&'a [SpiffeId]>,
}

impl Handles<'_> {
    fn in_scope(&self, k: &PoolKey) -> bool {
        self.sources.is_none_or(|s| s.contains(&k.src))
    }
}

/// Executes `actions` about `workload`, decided at `decided_at`.
pub(super) fn execute(
    h: &Handles<'_>,
    workload: &Arc<Workload>,
    actions: &[sdk::Action],
    decided_at: Instant,
) -> Executed {
    let mut out = Executed::default();
    for action in actions {
        let text = match action {
            sdk::Action::Goaway(g) => goaway(h, workload, g, decided_at, &mut out.tunnels_evicted),
            sdk::Action::Evict(e) => evict(h, e, &mut out.tunnels_evicted),
            sdk::Action::Backoff(b) => backoff(h, b),
            sdk::Action::OciDrain(o) => oci_drain(h, o, decided_at),
            sdk::Action::HoldTeardown(t) => {
                let mut grace = Grace::of(h, &t.workload, decided_at);
                let bound = grace.bound("teardown_hold", Duration::from_millis(t.bound_ms));
                // Two holds in one decision: the longer one.
                out.hold = Some(out.hold.map_or(bound, |b| b.max(bound)));
                h.metrics.action("hold_teardown", "executed");
                format!(
                    "hold teardown up to {} ms{}",
                    bound.as_millis(),
                    grace.note()
                )
            }
            sdk::Action::SetTimer(t) => set_timer(h, workload, t, decided_at),
            sdk::Action::Log(l) => {
                info!(workload = %workload.uid(), level = ?l.level, "policy: {}", l.message);
                format!("log {:?}", l.message)
            }
        };
        out.descriptions.push(text);
    }
    out
}

/// Evicts the pooled tunnels to the peer workload `e.peer` — by uid: another
/// workload with the same identity (its replacement) keeps its tunnels.
fn evict(h: &Handles<'_>, e: &sdk::Evict, evicted: &mut usize) -> String {
    let now = e.when == sdk::EvictWhen::Now;
    match (h.workload)(&e.peer) {
        Some(_) => {
            let n = h
                .pool
                .evict_matching(now, |k| k.dst_uid == e.peer && h.in_scope(k));
            *evicted += n;
            h.metrics.action("evict", "executed");
            format!(
                "evict {n} pooled tunnels to {} ({})",
                e.peer,
                if now { "now" } else { "when idle" }
            )
        }
        None => {
            h.metrics.action("evict", "unknown_peer");
            format!("evict: peer {} is not a known workload", e.peer)
        }
    }
}

fn backoff(h: &Handles<'_>, b: &sdk::Backoff) -> String {
    match b.destination.parse::<std::net::SocketAddr>() {
        Ok(addr) => {
            h.pool.set_backoff(
                addr,
                BackoffParams {
                    initial: Duration::from_millis(b.initial_ms),
                    max: Duration::from_millis(b.max_ms),
                    multiplier: b.multiplier,
                    jitter: b.jitter,
                },
            );
            h.metrics.action("backoff", "executed");
            format!(
                "backoff for {}: {}..{} ms ×{} ±{}",
                b.destination, b.initial_ms, b.max_ms, b.multiplier, b.jitter
            )
        }
        Err(_) => {
            h.metrics.action("backoff", "bad_destination");
            format!("backoff: {:?} is not a destination address", b.destination)
        }
    }
}

fn oci_drain(h: &Handles<'_>, o: &sdk::OciDrain, decided_at: Instant) -> String {
    let Some(oci) = h.oci else {
        h.metrics.action("oci_drain", "not_configured");
        return format!(
            "oci-drain {} drain={}: not configured (oci.enabled is false)",
            o.workload, o.drain
        );
    };
    let at_capacity = match o.at_capacity {
        sdk::AtCapacity::RemoveEarly => AtCapacity::RemoveEarly,
        sdk::AtCapacity::Keep => AtCapacity::Keep,
    };
    // Off the decision path: the drainer runs its API calls in a task.
    let r = oci.request(&o.workload, o.drain, at_capacity, decided_at);
    h.metrics.action("oci_drain", r.result);
    r.description
}

fn set_timer(
    h: &Handles<'_>,
    workload: &Arc<Workload>,
    t: &sdk::SetTimer,
    decided_at: Instant,
) -> String {
    let Some(at) = decided_at.checked_add(Duration::from_millis(t.after_ms)) else {
        return format!(
            "timer {:?} in {} ms: beyond the clock, not set",
            t.tag, t.after_ms
        );
    };
    let sink = h.timers.clone();
    let (subject, tag) = (t.subject.clone(), t.tag.clone());
    let source = workload.clone();
    h.tasks.spawn("timer", async move {
        tokio::time::sleep_until(at).await;
        sink.timer_fired(subject, tag, source);
    });
    format!("timer {:?} in {} ms", t.tag, t.after_ms)
}

fn goaway(
    h: &Handles<'_>,
    workload: &Arc<Workload>,
    g: &sdk::Goaway,
    decided_at: Instant,
    evicted: &mut usize,
) -> String {
    let graceful = g.mode == sdk::GoawayMode::Graceful;
    let mut grace = Grace::of(h, &g.workload, decided_at);
    let delay = grace.bound("goaway_delay", Duration::from_millis(g.delay_ms));
    let hard = g
        .hard_deadline_ms
        .map_or(h.default_goaway_deadline, Duration::from_millis);
    // The hard deadline runs from when the GOAWAY is sent.
    grace.elapse(delay);
    let hard = grace.bound("goaway_hard_deadline", hard);
    let cmd = GoawayCommand {
        graceful,
        deadline: decided_at
            .checked_add(delay)
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
        let n = goaway_inbound(h, &g.workload, cmd, hard, &label, delay, decided_at);
        parts.push(format!("{n} inbound tunnels"));
    }
    if matches!(
        g.target,
        sdk::GoawayTarget::Outbound | sdk::GoawayTarget::Both
    ) {
        // Tunnels to the workload by uid; from it by identity (pooled
        // tunnels are shared by the node's workloads of one identity).
        let src = if g.workload == workload.uid() {
            Some(workload.identity.clone())
        } else {
            (h.workload)(&g.workload).map(|w| w.identity.clone())
        };
        let n = h.pool.evict_matching(!graceful, |k| {
            h.in_scope(k) && (k.dst_uid == g.workload || src.as_ref() == Some(&k.src))
        });
        *evicted += n;
        parts.push(format!("{n} pooled outbound tunnels"));
    }
    h.metrics.action("goaway", "executed");
    format!(
        "{label}: {}, delay {} ms, hard deadline {} ms{}",
        parts.join(" + "),
        delay.as_millis(),
        hard.as_millis(),
        grace.note()
    )
}

/// What a workload has left of its termination grace when an action about
/// it is decided: no deadline the action sets (a GOAWAY's delay and hard
/// deadline, a teardown hold) outlives it, whatever the policy asked. A
/// deadline cut to it is logged, counted and noted in the action's
/// description (`GET /drains`).
struct Grace<'a> {
    metrics: &'a DrainMetrics,
    uid: &'a str,
    /// `None`: the workload's shutdown was not seen, nothing is cut.
    left: Option<Duration>,
    cut: bool,
}

impl<'a> Grace<'a> {
    fn of(h: &'a Handles<'_>, uid: &'a str, decided_at: Instant) -> Self {
        Grace {
            metrics: h.metrics,
            uid,
            left: (h.grace_end)(uid).map(|end| end.saturating_duration_since(decided_at)),
            cut: false,
        }
    }

    /// `elapsed` of the grace passes (a delay before the next deadline).
    fn elapse(&mut self, elapsed: Duration) {
        self.left = self.left.map(|l| l.saturating_sub(elapsed));
    }

    /// `asked`, or the grace left if that is less.
    fn bound(&mut self, deadline: &'static str, asked: Duration) -> Duration {
        match self.left {
            Some(left) if asked > left => {
                info!(
                    workload = self.uid,
                    deadline,
                    asked_ms = asked.as_millis() as u64,
                    left_ms = left.as_millis() as u64,
                    "a deadline past the pod's termination grace was cut to it"
                );
                self.metrics.cut_to_grace(deadline);
                self.cut = true;
                left
            }
            _ => asked,
        }
    }

    /// Said after the description of an action a deadline of which was cut.
    fn note(&self) -> &'static str {
        if self.cut {
            " (cut to the pod's termination grace)"
        } else {
            ""
        }
    }
}

/// Asks the inbound tunnels of `uid` to go away, now or after `delay` (then
/// on the tunnels it has at that time), and every tunnel accepted for it
/// after that (a drain applies to the workload, not to the tunnels it had);
/// returns how many it has now.
fn goaway_inbound(
    h: &Handles<'_>,
    uid: &str,
    cmd: GoawayCommand,
    hard: Duration,
    label: &str,
    delay: Duration,
    decided_at: Instant,
) -> usize {
    if delay.is_zero() {
        return h.inbound.goaway_from_now_on(uid, cmd, Some(hard), label);
    }
    let now = h.inbound.for_workload(uid).len();
    let registry = h.inbound.clone();
    let (uid, label) = (uid.to_owned(), label.to_owned());
    let at = decided_at.checked_add(delay);
    h.tasks.spawn("delayed-goaway", async move {
        match at {
            Some(at) => tokio::time::sleep_until(at).await,
            None => return,
        }
        registry.goaway_from_now_on(&uid, cmd, Some(hard), &label);
    });
    now
}

#[cfg(test)]
mod tests;
