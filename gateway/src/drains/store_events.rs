//! Lifecycle events derived from workload-store snapshots (the workload
//! file and Kubernetes discovery publish whole sets): level-triggered, so a
//! republished identical set raises nothing and a transition missed while a
//! source was down is seen once in the next snapshot.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tracing::{info, warn};

use tidegate_sdk as sdk;

use super::book::Record;
use super::engine::{DrainEngine, DrainError, Lifecycle, Trigger};
use super::state::PodKey;
use crate::workloads::{LifecycleState, Workload, WorkloadChange, WorkloadSnapshot};
use tidegate_base::shutdown::ShutdownWatch;
use tidegate_base::sync::Locked;

impl DrainEngine {
    /// Raises lifecycle events from workload-store changes until drained: a
    /// local workload whose state becomes `terminating` starts shutting down
    /// (until its `deletion_deadline_unix_ms`, else the configured grace
    /// period); one that disappears is deleted. `trigger` names the source
    /// that publishes the store (workload file or Kubernetes).
    ///
    /// Level-triggered: events come from comparing whole snapshots, so a
    /// republished identical set (a watch restart, a relist) raises nothing,
    /// and a transition missed while a watch was down is seen on the next
    /// snapshot; a transition seen twice drains once (phases only move forward).
    pub async fn watch_workloads(self: Arc<Self>, trigger: Trigger, mut drain: ShutdownWatch) {
        let mut changes = self.workloads.subscribe();
        // The set published before this task subscribed (a source may sync
        // first) counts as a change from nothing: a workload already
        // terminating then drains too.
        let mut previous = Arc::new(WorkloadSnapshot::default());
        loop {
            let current = self.workloads.snapshot();
            self.on_snapshot(&previous, &current, trigger);
            previous = current;
            tokio::select! {
                r = changes.changed() => if r.is_err() { return },
                _ = drain.signaled() => return,
            }
        }
    }

    /// Raises the events between two snapshots, from their difference
    /// ([`WorkloadSnapshot::changes_from`]: what changed, not what is
    /// held).
    pub(super) fn on_snapshot(
        self: &Arc<Self>,
        previous: &WorkloadSnapshot,
        current: &WorkloadSnapshot,
        trigger: Trigger,
    ) {
        let changes: Vec<WorkloadChange<'_>> = current.changes_from(previous).collect();
        if changes.is_empty() {
            return;
        }
        self.remember_removed(&changes);
        // Local workloads that appeared (all of them in the first snapshot);
        // in-pod mode, only those their node agent handed over already.
        let by_agent = self.added_by_node_agent;
        for (old, new) in &changes {
            match (old, new) {
                (Some(old), None) if old.local => self.local_gone(old, trigger),
                (Some(old), None) => {
                    self.on_peer(old, true);
                }
                (Some(old), Some(w)) if became_terminating(old, w) => {
                    if old.local {
                        self.shutdown_started(w, trigger);
                    } else {
                        self.on_peer(old, false);
                    }
                }
                (None, Some(w)) if w.local => {
                    if w.spec.state == LifecycleState::Terminating {
                        self.shutdown_started(w, trigger);
                    }
                    self.forget_earlier_incarnation(w.uid());
                    if !by_agent || self.book.locked().was_handed_over(w) {
                        self.on_added(w);
                    }
                }
                _ => {}
            }
        }
        self.retire_reused_ips(&changes);
        self.forget_old(current);
    }

    /// Workloads gone from the store stay nameable by actions for a while:
    /// local ones, and peers this gateway still has tunnels to (pooled or
    /// draining). Other peers are not kept: no tunnel to a uid gone from
    /// the store can be opened any more, so an action about one has nothing
    /// to act on, and keeping them held every workload of a set that shrank
    /// (200,000 of them: ~250 MB) for as long as the book retains them.
    fn remember_removed(&self, changes: &[WorkloadChange<'_>]) {
        let mut gone = changes
            .iter()
            .filter_map(|(old, new)| old.filter(|_| new.is_none()))
            .peekable();
        if gone.peek().is_none() {
            return;
        }
        let tunneled: HashSet<String> = self
            .pool
            .tunnels()
            .into_iter()
            .chain(self.pool.draining())
            .map(|t| t.key.dst_uid.clone())
            .collect();
        self.book.locked().remember_removed(
            gone,
            |old| old.local || tunneled.contains(old.uid()),
            Instant::now(),
        );
    }

    /// A local workload is gone from the store: a deleted event, about its
    /// last known facts (if it comes back before the event is handled, the
    /// event is dropped).
    fn local_gone(self: &Arc<Self>, old: &Arc<Workload>, trigger: Trigger) {
        let uid = old.uid();
        let record = self
            .book
            .locked()
            .record_of(old, trigger, || self.policies.select(old));
        self.raise(uid, Lifecycle::Deleted, trigger, Record::Only(record));
    }

    /// A local workload started terminating (known before, or new and
    /// already terminating).
    fn shutdown_started(self: &Arc<Self>, w: &Workload, trigger: Trigger) {
        let what = Lifecycle::ShutdownStarted {
            grace: self.grace_of(w),
        };
        self.raise(w.uid(), what, trigger, Record::Current);
    }

    /// Handles a lifecycle event from the store on one of the engine's tasks.
    fn raise(self: &Arc<Self>, uid: &str, what: Lifecycle, trigger: Trigger, record: Record) {
        let this = self.clone();
        let uid = uid.to_owned();
        self.tasks.spawn("lifecycle", async move {
            match this.on_lifecycle_of(&uid, what, trigger, record).await {
                Ok(_) => {}
                Err(e @ DrainError::CameBack(_)) => {
                    info!(reason = %e, source = trigger.label(), "lifecycle event dropped")
                }
                Err(e) => {
                    warn!(error = %e, source = trigger.label(), "lifecycle event from the workload store failed")
                }
            }
        });
    }

    /// The node agent (CNI ADD, ZDS `AddWorkload`) handed `pod` over: its
    /// policy sees `workload-added` now if discovery knows the workload,
    /// else when discovery first lists it (under the pod's uid, or — istiod
    /// keys workloads otherwise — its namespace and name).
    pub fn pod_handed_over(self: &Arc<Self>, pod: &PodKey<'_>) {
        // Removed at an earlier teardown (a re-created sandbox): back.
        self.workloads.restore(pod.uid, pod.namespace, pod.name);
        let newly = self.book.locked().hand_over(pod);
        let known = self
            .workloads
            .snapshot()
            .pod_workload(pod.uid, pod.namespace, pod.name)
            .cloned();
        if let (true, Some(w)) = (newly, known) {
            self.on_added(&w);
        }
    }

    /// The node agent took `pod` back (CNI DEL, ZDS `DelWorkload`).
    pub fn pod_taken_back(&self, pod: &PodKey<'_>) {
        self.book.locked().take_back(pod);
    }

    /// A local workload appeared: its policy sees `workload-added` (to set
    /// a timer, log, or prepare); the actions are executed like any other.
    fn on_added(self: &Arc<Self>, w: &Arc<Workload>) {
        let selection = self.policies.select(w);
        let event = sdk::Event::WorkloadAdded(self.state_of(w));
        let decision = self.policies.decide(&selection, &event);
        if decision.actions.is_empty() {
            return;
        }
        let executed = self.execute(w, &decision.actions, Instant::now());
        info!(workload = w.uid(), policy = %decision.policy, actions = ?executed.descriptions,
            "workload-added decision");
    }

    /// Identity is the workload uid: when an IP now belongs to a different
    /// uid than before (a pod recreated with the same name and IP, or an IP
    /// reused by another pod), pooled tunnels to that IP take no new streams
    /// and close once idle — whatever the policy — so the new workload never
    /// rides a tunnel opened for the old one. Streams already open finish.
    ///
    /// Read from the changes alone: an address a workload gained (new, or
    /// new to it) retires the pooled tunnels to that address opened for any
    /// other uid — including one that left the store in an earlier
    /// snapshot while its tunnels stayed pooled.
    fn retire_reused_ips(&self, changes: &[WorkloadChange<'_>]) {
        let gained = changes.iter().filter_map(|(old, new)| {
            let new = (*new)?;
            let fresh = new
                .spec
                .ips
                .iter()
                .filter(move |ip| !old.is_some_and(|o| o.spec.ips.contains(ip)));
            Some(fresh.map(move |ip| (*ip, new.uid())))
        });
        for (ip, owner) in gained.flatten() {
            let old_uids = std::cell::RefCell::new(Vec::new());
            let n = self.pool.evict_matching(false, |k| {
                let stale = k.dst_addr.ip() == ip && k.dst_uid != owner;
                if stale {
                    old_uids.borrow_mut().push(k.dst_uid.clone());
                }
                stale
            });
            if n > 0 {
                let old_uids = old_uids.into_inner();
                self.metrics.action("evict-reused-ip", "executed");
                info!(%ip, old_uid = ?old_uids, new_uid = owner, tunnels = n,
                    "IP now belongs to another workload: its pooled tunnels are retired");
            }
        }
    }

    /// Time left until a terminating workload's deadline (Kubernetes:
    /// `deletionTimestamp`), else the configured default grace.
    fn grace_of(&self, w: &Workload) -> Duration {
        match w.spec.deletion_deadline_unix_ms {
            Some(ms) => (SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO),
            None => self.cfg.default_grace,
        }
    }

    /// Bounds the engine's memory under pod churn: ended drains of gone
    /// workloads, removed workloads and ages are dropped once the book's
    /// retention has passed.
    fn forget_old(&self, current: &WorkloadSnapshot) {
        let forgotten = self
            .book
            .locked()
            .forget_old(|uid| current.by_uid(uid).is_some(), Instant::now());
        for uid in forgotten {
            self.registry.forget(&uid);
        }
    }
}

/// `old` was not terminating and `now` is.
fn became_terminating(old: &Workload, now: &Workload) -> bool {
    now.spec.state == LifecycleState::Terminating && old.spec.state != LifecycleState::Terminating
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::engine::Trigger;
    use super::super::tests::{engine, spec};
    use crate::workloads::{WorkloadSnapshot, WorkloadStore};

    /// A local workload `local-uid` on `n1` and `peers` peers on `n2`,
    /// published and seen by the engine as its first snapshot.
    fn large_set(
        engine: &Arc<super::DrainEngine>,
        store: &WorkloadStore,
        peers: u16,
    ) -> Arc<WorkloadSnapshot> {
        let mut specs = vec![spec("local-uid", "n1", [10, 0, 0, 1])];
        specs.extend((0..peers).map(|i| {
            let [hi, lo] = i.to_be_bytes();
            spec(&format!("peer-{i}"), "n2", [10, 1, hi, lo])
        }));
        store.publish(specs);
        let snapshot = store.snapshot();
        engine.on_snapshot(
            &WorkloadSnapshot::default(),
            &snapshot,
            Trigger::WorkloadFile,
        );
        snapshot
    }

    /// Of the workloads gone from a set that shrank, the engine keeps the
    /// local one (actions may still name it), not the peers it has no
    /// tunnel to: those are dropped with the old snapshot.
    #[tokio::test]
    async fn a_shrunk_set_does_not_keep_the_peers_it_dropped() {
        let (engine, store) = engine();
        let big = large_set(&engine, &store, 1000);
        let peer = Arc::downgrade(big.by_uid("peer-7").unwrap());
        store.publish(vec![]);
        engine.on_snapshot(&big, &store.snapshot(), Trigger::WorkloadFile);
        drop(big);
        assert!(
            peer.upgrade().is_none(),
            "a removed peer without tunnels is still held"
        );
        assert!(engine.any_workload("peer-7").is_none());
        assert!(
            engine.any_workload("local-uid").is_some(),
            "a removed local workload stays nameable by actions"
        );
    }
}
