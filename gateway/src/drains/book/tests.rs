//! The drain book's transitions driven directly: no runtime, no sockets.

use std::sync::Arc;

use super::DrainBook;
use crate::drains::state::PodKey;
use crate::workloads::{Workload, WorkloadSpec, WorkloadStore};

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
