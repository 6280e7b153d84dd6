//! The drain book: what the engine remembers of workloads, their drains and
//! its peers' drains, and the transitions that change it — each takes the
//! book and one event and returns what the engine then does outside its lock.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::peer_book::{PeerBook, PeerDecision, PeerDrainView};
use super::phase::{transition, Lifecycle, Phase, Transition};
use super::state::{unix_ms, DrainView, PodKey, Trigger};
use crate::workloads::Workload;
use tidegate_policy_host::Selection;

/// How long ended drains and removed workloads are remembered (for
/// `GET /drains` and late actions naming them) before they are forgotten.
const RETAIN: Duration = Duration::from_secs(600);

/// One workload's drain record.
struct DrainState {
    /// Tells this record from a later one of the same uid (a workload
    /// deleted and added again): see [`DrainBook::forget_incarnation`].
    record: u64,
    workload: Arc<Workload>,
    phase: Phase,
    selection: Selection,
    trigger: Trigger,
    started: SystemTime,
    shutdown_at: Option<Instant>,
    /// When the pod's termination grace ends (from `shutdown-started`): no
    /// deadline about it outlives this (the executor cuts any that would).
    grace_end: Option<Instant>,
    deadline: Option<SystemTime>,
    actions: Vec<String>,
    ended: Option<&'static str>,
    ended_at: Option<Instant>,
}

impl DrainState {
    /// A workload's drain record before its first lifecycle event.
    fn new(workload: Arc<Workload>, selection: Selection, trigger: Trigger) -> Self {
        static RECORDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        DrainState {
            record: RECORDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            workload,
            phase: Phase::Running,
            selection,
            trigger,
            started: SystemTime::now(),
            shutdown_at: None,
            grace_end: None,
            deadline: None,
            actions: Vec::new(),
            ended: None,
            ended_at: None,
        }
    }
}

/// Which drain record an event is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Record {
    /// The workload's record, created by the event if it has none.
    Current,
    /// This record only (a deletion the store showed, raised for the record
    /// it was seen with): gone means the workload came back meanwhile.
    Only(u64),
}

/// Where one lifecycle event left its drain.
pub(super) struct Step {
    /// The policy selection the drain pinned.
    pub(super) selection: Selection,
    pub(super) since_shutdown: Option<Duration>,
    /// The pod's remaining grace, once its shutdown was seen.
    pub(super) grace_left: Option<Duration>,
    pub(super) duplicate: bool,
    /// The event started the drain (the engine counts it).
    pub(super) started: bool,
}

/// What the engine remembers about workloads and their drains.
#[derive(Default)]
pub(super) struct DrainBook {
    drains: BTreeMap<String, DrainState>,
    first_seen: HashMap<String, Instant>,
    /// Workloads removed from the store recently, so actions can still name them.
    removed: HashMap<String, (Arc<Workload>, Instant)>,
    /// Peers' drains as this gateway (their client) handled them, by peer
    /// uid (or destination address for a connect-failing one).
    peers: PeerBook,
    /// In-pod mode: the pods the node agent handed over (`workload-added`
    /// waits for both the handover and discovery), by uid and by
    /// `namespace/name` ([`name_key`]).
    handed_over: HashSet<String>,
}

/// A pod's `namespace/name`: never a uid (Kubernetes uids have no `/`, and
/// istiod's have more than one).
fn name_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Whether `at` is older than [`RETAIN`] at `now`.
fn expired(at: Instant, now: Instant) -> bool {
    now.saturating_duration_since(at) > RETAIN
}

impl DrainBook {
    /// The lifecycle event `what` moves `workload`'s drain record forward
    /// (created on its first event, pinning `select()`'s policy); `None`
    /// when the event is for a record that is gone (`Record::Only` of an
    /// earlier incarnation).
    pub(super) fn advance(
        &mut self,
        workload: &Arc<Workload>,
        what: Lifecycle,
        trigger: Trigger,
        decided_at: Instant,
        record: Record,
        select: impl FnOnce() -> Selection,
    ) -> Option<Step> {
        let uid = workload.uid();
        if let Record::Only(id) = record {
            if self.drains.get(uid).map(|d| d.record) != Some(id) {
                return None;
            }
        }
        let d = self
            .drains
            .entry(uid.to_owned())
            .or_insert_with(|| DrainState::new(workload.clone(), select(), trigger));
        let step = transition(d.phase, what);
        let started = matches!(step, Transition::Start(_));
        if started {
            d.trigger = trigger;
            d.started = SystemTime::now();
        }
        if let Transition::Start(_) | Transition::Advance(_) = step {
            d.phase = what.phase();
            if let Lifecycle::ShutdownStarted { grace } = what {
                d.shutdown_at = Some(decided_at);
                d.grace_end = decided_at.checked_add(grace);
                d.deadline = SystemTime::now().checked_add(grace);
            }
        }
        Some(Step {
            selection: d.selection.clone(),
            since_shutdown: d.shutdown_at.map(|t| t.elapsed()),
            grace_left: d
                .grace_end
                .map(|end| end.saturating_duration_since(decided_at)),
            duplicate: step == Transition::Duplicate,
            started,
        })
    }

    /// The record a deletion of `workload` is raised for: its drain's,
    /// created (pinning `select()`'s policy) if it has none.
    pub(super) fn record_of(
        &mut self,
        workload: &Arc<Workload>,
        trigger: Trigger,
        select: impl FnOnce() -> Selection,
    ) -> u64 {
        self.drains
            .entry(workload.uid().to_owned())
            .or_insert_with(|| DrainState::new(workload.clone(), select(), trigger))
            .record
    }

    /// Adds what a decision's actions did to `uid`'s drain, if it has one.
    pub(super) fn record_actions(&mut self, uid: &str, descriptions: &[String]) {
        if let Some(d) = self.drains.get_mut(uid) {
            d.actions.extend(descriptions.iter().cloned());
        }
    }

    /// Ends `uid`'s drain with `result` at `now`; true when it ended now
    /// (not before, and it has a drain): the engine counts it once.
    pub(super) fn end(&mut self, uid: &str, result: &'static str, now: Instant) -> bool {
        match self.drains.get_mut(uid) {
            Some(d) if d.ended.is_none() => {
                d.ended = Some(result);
                d.ended_at = Some(now);
                true
            }
            _ => false,
        }
    }

    /// A local workload appeared in the store: a drain its uid had was
    /// about an earlier incarnation, forgotten with the removed record and
    /// the age. Returns that drain's phase (the engine then drops the
    /// tunnels' standing GOAWAY).
    pub(super) fn forget_incarnation(&mut self, uid: &str) -> Option<Phase> {
        let earlier = self.drains.remove(uid)?;
        self.removed.remove(uid);
        self.first_seen.remove(uid);
        Some(earlier.phase)
    }

    /// When `uid`'s termination grace ends, once its shutdown was seen.
    pub(super) fn grace_end(&self, uid: &str) -> Option<Instant> {
        self.drains.get(uid).and_then(|d| d.grace_end)
    }

    /// The policy selection `uid`'s drain record pinned, and the workload
    /// it is about (which may be gone from the store).
    pub(super) fn pinned(&self, uid: &str) -> Option<(Selection, Arc<Workload>)> {
        self.drains
            .get(uid)
            .map(|d| (d.selection.clone(), d.workload.clone()))
    }

    /// `uid`'s phase and, once a drain started, the selection it pinned.
    pub(super) fn phase_of(&self, uid: &str) -> (Phase, Option<Selection>) {
        match self.drains.get(uid) {
            Some(d) if d.phase > Phase::Running => (d.phase, Some(d.selection.clone())),
            _ => (Phase::Running, None),
        }
    }

    /// The drains started, as `GET /drains` shows them; `live` fills in
    /// what the book does not keep (the tunnels and streams left, the OCI
    /// backend drain).
    pub(super) fn views(&self, live: impl Fn(&str, &mut DrainView)) -> Vec<DrainView> {
        self.drains
            .iter()
            .filter(|(_, d)| d.phase > Phase::Running)
            .map(|(uid, d)| {
                let mut view = DrainView {
                    uid: uid.clone(),
                    workload: format!("{}/{}", d.workload.spec.namespace, d.workload.spec.name),
                    policy: d.selection.name.clone(),
                    version: d.selection.version.as_ref().map(|v| v.hash.clone()),
                    trigger: d.trigger,
                    phase: d.phase,
                    started_unix_ms: unix_ms(d.started),
                    deadline_unix_ms: d.deadline.map(unix_ms),
                    actions_taken: d.actions.clone(),
                    tunnels_remaining: 0,
                    streams_remaining: 0,
                    ended: d.ended,
                    oci: None,
                };
                live(uid, &mut view);
                view
            })
            .collect()
    }

    /// When local workload `uid` was first seen (now, if never before).
    pub(super) fn first_seen(&mut self, uid: &str, now: Instant) -> Instant {
        *self.first_seen.entry(uid.to_owned()).or_insert(now)
    }

    /// Workloads gone from the store at `now`: each one `keep` accepts stays
    /// nameable by actions for [`RETAIN`].
    pub(super) fn remember_removed<'a>(
        &mut self,
        gone: impl IntoIterator<Item = &'a Arc<Workload>>,
        keep: impl Fn(&Workload) -> bool,
        now: Instant,
    ) {
        for old in gone.into_iter().filter(|w| keep(w)) {
            self.removed
                .insert(old.uid().to_owned(), (old.clone(), now));
        }
    }

    /// A workload removed from the store recently.
    pub(super) fn removed_workload(&self, uid: &str) -> Option<Arc<Workload>> {
        self.removed.get(uid).map(|(w, _)| w.clone())
    }

    /// Bounds the book under pod churn: at `now`, ended drains of workloads
    /// no longer `listed`, removed workloads and ages are dropped after
    /// [`RETAIN`] (an age once its workload is neither listed nor drained).
    /// Returns the uids whose drain was dropped (the engine forgets their
    /// tunnels' standing GOAWAY).
    pub(super) fn forget_old(
        &mut self,
        listed: impl Fn(&str) -> bool,
        now: Instant,
    ) -> Vec<String> {
        let mut forgotten = Vec::new();
        self.drains.retain(|uid, d| {
            let keep = listed(uid) || !d.ended_at.is_some_and(|t| expired(t, now));
            if !keep {
                forgotten.push(uid.clone());
            }
            keep
        });
        self.removed.retain(|_, (_, at)| !expired(*at, now));
        let drains = &self.drains;
        self.first_seen
            .retain(|uid, _| listed(uid) || drains.contains_key(uid));
        shrink_if_sparse(&mut self.removed);
        shrink_if_sparse(&mut self.first_seen);
        forgotten
    }

    /// Records a decision about a peer (by its uid, or the destination of a
    /// connect-failing one); peers without a decision for [`RETAIN`] are
    /// forgotten.
    pub(super) fn record_peer(&mut self, key: &str, peer: Option<&Workload>, d: PeerDecision) {
        self.peers.record(key, peer, d, RETAIN);
    }

    /// `GET /drains` `peer_drains`: the peers this gateway decided about.
    pub(super) fn peer_views(&self) -> Vec<PeerDrainView> {
        self.peers.views()
    }

    /// The node agent handed `pod` over: it is known by its uid and by its
    /// `namespace/name` from now on. True when its uid is new (a repeated
    /// hand-over, a retried CNI ADD, is not a new pod).
    pub(super) fn hand_over(&mut self, pod: &PodKey<'_>) -> bool {
        self.handed_over.insert(name_key(pod.namespace, pod.name));
        self.handed_over.insert(pod.uid.to_owned())
    }

    /// The node agent took `pod` back: neither its uid nor its name is
    /// handed over any more.
    pub(super) fn take_back(&mut self, pod: &PodKey<'_>) {
        self.handed_over.remove(pod.uid);
        self.handed_over.remove(&name_key(pod.namespace, pod.name));
    }

    /// Whether the node agent handed over the pod of local workload `w`
    /// (under `w`'s uid, or under the pod's own uid when the source keys
    /// workloads otherwise: by namespace and name).
    pub(super) fn was_handed_over(&self, w: &Workload) -> bool {
        self.handed_over.contains(w.uid())
            || self
                .handed_over
                .contains(&name_key(&w.spec.namespace, &w.spec.name))
    }
}

/// Gives a map's table back once it holds under a quarter of what it has
/// room for: `retain` keeps the capacity, so a map that once indexed a
/// large workload set would otherwise keep its table for good.
fn shrink_if_sparse<K: Eq + std::hash::Hash, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 64 && map.len() < map.capacity() / 4 {
        map.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests;
