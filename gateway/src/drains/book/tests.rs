//! The drain book's transitions driven directly: no runtime, no sockets.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{DrainBook, Record, RETAIN};
use crate::drains::peer_book::PeerDecision;
use crate::drains::phase::{Lifecycle, Phase};
use crate::drains::state::{PodKey, Trigger};
use crate::workloads::{Workload, WorkloadSpec, WorkloadStore};
use tidegate_policy_host::{SelectedBy, Selection};

/// A local workload `uid`, pod `ns/name`, as a store on node `n1` lists it.
fn workload(uid: &str, ns: &str, name: &str) -> Arc<Workload> {
    let store = WorkloadStore::new("td", "n1");
    store.publish(vec![WorkloadSpec::new(uid, "n1").namespace(ns).name(name)]);
    store.snapshot().by_uid(uid).unwrap().clone()
}

fn pod<'a>(uid: &'a str, name: &'a str) -> PodKey<'a> {
    PodKey {
        uid,
        namespace: "ns",
        name,
    }
}

fn policy(name: &str) -> Selection {
    Selection {
        name: name.to_owned(),
        by: SelectedBy::Default,
        version: None,
        why: "test".into(),
        skipped: Vec::new(),
    }
}

const SHUTDOWN: Lifecycle = Lifecycle::ShutdownStarted {
    grace: Duration::from_secs(30),
};

/// `w`'s current record moved by `what`, the policy `p` pinned if it has none.
fn advance(book: &mut DrainBook, w: &Arc<Workload>, what: Lifecycle, p: &str) -> super::Step {
    book.advance(
        w,
        what,
        Trigger::Admin,
        Instant::now(),
        Record::Current,
        || policy(p),
    )
    .expect("the current record is never gone")
}

#[test]
fn a_pod_is_new_once_and_known_by_uid_or_name() {
    let mut book = DrainBook::default();
    assert!(book.hand_over(&pod("pod-uid", "a")), "first hand-over");
    assert!(
        !book.hand_over(&pod("pod-uid", "a")),
        "a retried ADD is not new"
    );
    assert!(book.was_handed_over(&workload("pod-uid", "ns", "a")));
    // istiod keys the workload otherwise: found by namespace and name.
    assert!(book.was_handed_over(&workload("cluster//Pod/ns/a", "ns", "a")));
    assert!(!book.was_handed_over(&workload("other-uid", "ns", "b")));
}

#[test]
fn a_pod_taken_back_is_no_longer_handed_over_and_is_new_again() {
    let mut book = DrainBook::default();
    book.hand_over(&pod("pod-uid", "a"));
    book.hand_over(&pod("other-uid", "b"));
    book.take_back(&pod("pod-uid", "a"));
    assert!(!book.was_handed_over(&workload("pod-uid", "ns", "a")));
    assert!(!book.was_handed_over(&workload("cluster//Pod/ns/a", "ns", "a")));
    assert!(
        book.was_handed_over(&workload("other-uid", "ns", "b")),
        "only that pod"
    );
    assert!(
        book.hand_over(&pod("pod-uid", "a")),
        "handed over again: new"
    );
}

#[test]
fn the_first_event_starts_the_drain_and_pins_its_policy() {
    let mut book = DrainBook::default();
    let w = workload("w", "ns", "a");
    assert!(matches!(book.phase_of("w"), (Phase::Running, None)));
    let first = advance(&mut book, &w, SHUTDOWN, "first");
    assert!(first.started && !first.duplicate);
    assert_eq!(first.selection.name, "first");
    assert!(first
        .grace_left
        .is_some_and(|g| g <= Duration::from_secs(30)));
    assert!(book.grace_end("w").is_some());
    // Later events keep the pinned policy, whatever would be selected now.
    let teardown = advance(&mut book, &w, Lifecycle::Teardown, "second");
    assert!(!teardown.started && !teardown.duplicate, "an advance");
    assert_eq!(teardown.selection.name, "first");
    assert!(teardown.since_shutdown.is_some());
    let (phase, pinned) = book.phase_of("w");
    assert_eq!(phase, Phase::TornDown);
    assert_eq!(pinned.unwrap().name, "first");
    assert_eq!(book.pinned("w").unwrap().0.name, "first");
}

#[test]
fn an_event_seen_again_or_behind_the_phase_is_a_duplicate() {
    let mut book = DrainBook::default();
    let w = workload("w", "ns", "a");
    advance(&mut book, &w, Lifecycle::Teardown, "p");
    for what in [Lifecycle::Teardown, SHUTDOWN] {
        let again = advance(&mut book, &w, what, "p");
        assert!(again.duplicate && !again.started, "{what:?}");
    }
    assert_eq!(book.phase_of("w").0, Phase::TornDown);
    assert_eq!(book.grace_end("w"), None, "a late shutdown sets nothing");
}

#[test]
fn a_deletion_is_for_its_record_only() {
    let mut book = DrainBook::default();
    let w = workload("w", "ns", "a");
    let record = book.record_of(&w, Trigger::Kubernetes, || policy("p"));
    assert_eq!(
        book.record_of(&w, Trigger::Kubernetes, || policy("q")),
        record
    );
    assert_eq!(
        book.phase_of("w").0,
        Phase::Running,
        "a record is not a drain"
    );
    // The workload came back: its earlier record is forgotten, and the
    // deletion raised for it is dropped.
    assert_eq!(book.forget_incarnation("w"), Some(Phase::Running));
    assert_eq!(book.forget_incarnation("w"), None);
    let deleted = |book: &mut DrainBook, record| {
        book.advance(
            &w,
            Lifecycle::Deleted,
            Trigger::Kubernetes,
            Instant::now(),
            record,
            || policy("p"),
        )
    };
    assert!(deleted(&mut book, Record::Only(record)).is_none());
    let current = book.record_of(&w, Trigger::Kubernetes, || policy("p"));
    assert_ne!(current, record);
    assert!(deleted(&mut book, Record::Only(current)).is_some_and(|s| s.started));
    assert_eq!(book.phase_of("w").0, Phase::Deleted);
}

#[test]
fn a_drain_ends_once_with_its_actions_recorded() {
    let mut book = DrainBook::default();
    let now = Instant::now();
    assert!(!book.end("w", "completed", now), "no drain: nothing ends");
    book.record_actions("w", &["goaway".to_owned()]);
    let w = workload("w", "ns", "a");
    advance(&mut book, &w, Lifecycle::Teardown, "p");
    book.record_actions("w", &["goaway".to_owned(), "hold".to_owned()]);
    book.record_actions("w", &["evict".to_owned()]);
    assert!(book.end("w", "forced", now));
    assert!(!book.end("w", "completed", now), "ended once");
    let views = book.views(|uid, view| view.streams_remaining = uid.len());
    assert_eq!(views.len(), 1);
    assert_eq!(views[0].actions_taken, ["goaway", "hold", "evict"]);
    assert_eq!(views[0].ended, Some("forced"));
    assert_eq!(views[0].workload, "ns/a");
    assert_eq!(views[0].streams_remaining, 1, "filled in by the engine");
}

#[test]
fn only_started_drains_are_shown() {
    let mut book = DrainBook::default();
    book.record_of(&workload("w", "ns", "a"), Trigger::Admin, || policy("p"));
    assert!(book.views(|_, _| {}).is_empty());
    assert!(book.pinned("w").is_some(), "but remembered");
}

#[test]
fn removed_workloads_and_ages_go_with_a_new_incarnation() {
    let mut book = DrainBook::default();
    let (kept, dropped) = (workload("w", "ns", "a"), workload("x", "ns", "b"));
    let then = Instant::now();
    assert_eq!(book.first_seen("w", then), then);
    assert_eq!(
        book.first_seen("w", then + RETAIN),
        then,
        "the first time stays"
    );
    book.remember_removed([&kept, &dropped], |w| w.uid() == "w", then);
    assert!(book.removed_workload("w").is_some());
    assert!(book.removed_workload("x").is_none(), "not kept");
    advance(&mut book, &kept, Lifecycle::Deleted, "p");
    assert!(book.forget_incarnation("w").is_some());
    assert!(book.removed_workload("w").is_none());
    let later = then + Duration::from_secs(1);
    assert_eq!(book.first_seen("w", later), later, "aged afresh");
}

#[test]
fn old_records_are_forgotten_after_retain() {
    let mut book = DrainBook::default();
    let then = Instant::now();
    for uid in ["gone-ended", "listed-ended", "gone-running"] {
        let w = workload(uid, "ns", uid);
        advance(&mut book, &w, Lifecycle::Teardown, "p");
        book.first_seen(uid, then);
        book.remember_removed([&w], |_| true, then);
    }
    book.end("gone-ended", "completed", then);
    book.end("listed-ended", "completed", then);
    book.first_seen("gone-never-drained", then);
    let listed = |uid: &str| uid == "listed-ended";
    assert!(book.forget_old(listed, then + RETAIN).is_empty(), "not yet");
    let forgotten = book.forget_old(listed, then + RETAIN + Duration::from_secs(1));
    assert_eq!(forgotten, ["gone-ended"]);
    assert!(book.pinned("gone-ended").is_none());
    assert!(book.pinned("listed-ended").is_some(), "still listed");
    assert!(book.pinned("gone-running").is_some(), "not ended");
    assert!(
        book.removed_workload("gone-running").is_none(),
        "removed ones expire"
    );
    let later = then + RETAIN * 2;
    assert_eq!(
        book.first_seen("gone-never-drained", later),
        later,
        "its age went"
    );
    assert_eq!(
        book.first_seen("gone-running", later),
        then,
        "a drain keeps its age"
    );
}

#[test]
fn peer_decisions_are_recorded_by_peer() {
    let mut book = DrainBook::default();
    let decision = |event| PeerDecision {
        event,
        policy: "p".to_owned(),
        version: None,
        selected_by: "default",
        clients: vec![],
        actions: vec!["evict".to_owned()],
        tunnels_evicted: 1,
        at_unix_ms: 0,
    };
    let peer = workload("peer", "ns", "a");
    book.record_peer("peer", Some(&peer), decision("peer-terminating"));
    book.record_peer("peer", Some(&peer), decision("peer-deleted"));
    book.record_peer("10.0.0.9:8080", None, decision("connect-failing"));
    let views = book.peer_views();
    let peer = views.iter().find(|v| v.peer == "peer").unwrap();
    assert_eq!(peer.workload.as_deref(), Some("ns/a"));
    let events: Vec<_> = peer.decisions.iter().map(|d| d.event).collect();
    assert_eq!(events, ["peer-terminating", "peer-deleted"]);
    assert!(views
        .iter()
        .any(|v| v.peer == "10.0.0.9:8080" && v.workload.is_none()));
}
