//! The endpoint list against a model (a sorted map): every change keeps
//! uid order, index and lookup; a change copies one chunk; samples follow
//! capacity.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use tidegate_protocol::identity::SpiffeId;

use super::*;
use crate::workloads::services::Conditions;
use crate::workloads::{Workload, WorkloadSpec};

fn endpoint(i: usize, capacity: u32, port: u16) -> Endpoint {
    let uid = format!("pod-{i:05}");
    let w = Workload {
        spec: WorkloadSpec::new(uid, "node-a"),
        identity: SpiffeId::new("cluster.local", "default", "default"),
        local: false,
    };
    Endpoint {
        workload: Arc::new(w),
        ip: IpAddr::from([10, 0, (i / 256) as u8, (i % 256) as u8]),
        alt_ip: None,
        target_port: port,
        conditions: Conditions::from_slice(None, None, None),
        capacity,
    }
}

/// What the list reads as, in order: (uid, target port, capacity).
fn read(list: &EndpointList) -> Vec<(String, u16, u32)> {
    list.iter()
        .map(|e| (e.workload.uid().to_owned(), e.target_port, e.capacity))
        .collect()
}

fn check(list: &EndpointList, model: &BTreeMap<String, Endpoint>) {
    let want: Vec<(String, u16, u32)> = model
        .values()
        .map(|e| (e.workload.uid().to_owned(), e.target_port, e.capacity))
        .collect();
    assert_eq!(read(list), want);
    assert_eq!(list.len(), model.len());
    for (i, (uid, _, _)) in want.iter().enumerate() {
        assert_eq!(list[i].workload.uid(), uid, "index {i}");
        assert_eq!(list.find(uid).map(|e| e.workload.uid()), Some(&**uid));
    }
    assert!(list.get(model.len()).is_none());
    for c in &list.chunks {
        assert!(!c.entries.is_empty() && c.entries.len() <= CHUNK);
    }
}

/// Random puts (new and replacing) and removals, checked after each
/// against a sorted map.
#[test]
fn changes_keep_uid_order_index_and_lookup() {
    let mut rng = fastrand::Rng::with_seed(54);
    let mut list = EndpointList::default();
    let mut model = BTreeMap::new();
    for step in 0..3000 {
        let i = rng.usize(0..400);
        if rng.u8(0..4) == 0 {
            let uid = format!("pod-{i:05}");
            assert_eq!(
                list.remove(&uid),
                model.remove(&uid).is_some(),
                "step {step}"
            );
        } else {
            let e = endpoint(i, rng.u32(1..4), rng.u16(1..9));
            model.insert(e.workload.uid().to_owned(), e.clone());
            list.put(e);
        }
        check(&list, &model);
    }
    assert!(list.chunks.len() > 4, "the list grew past one chunk");
    let whole = EndpointList::from_sorted(model.values().cloned().collect());
    assert_eq!(read(&whole), read(&list));
}

/// A change copies the chunk it falls in; the others are shared with the
/// list before it.
#[test]
fn a_change_copies_one_chunk() {
    let list = EndpointList::from_sorted((0..1000).map(|i| endpoint(i, 1, 80)).collect());
    let mut next = list.clone();
    next.put(endpoint(500, 1, 8080));
    let shared = list
        .chunks
        .iter()
        .zip(&next.chunks)
        .filter(|(a, b)| Arc::ptr_eq(&a.entries, &b.entries))
        .count();
    assert_eq!(shared, list.chunks.len() - 1);
    assert_eq!(list.find("pod-00500").map(|e| e.target_port), Some(80));
    assert_eq!(next.find("pod-00500").map(|e| e.target_port), Some(8080));
}

/// Samples follow capacity across chunks: endpoints of capacity 3 are
/// chosen three times as often as those of 1, and a uniform list
/// uniformly.
#[test]
fn samples_follow_capacity() {
    fastrand::seed(7);
    let list = EndpointList::from_sorted(
        (0..200)
            .map(|i| endpoint(i, if i % 2 == 0 { 3 } else { 1 }, 80))
            .collect(),
    );
    let draws = 200_000;
    let heavy = (0..draws)
        .filter(|_| list[list.sample()].capacity == 3)
        .count();
    let share = heavy as f64 / draws as f64;
    assert!((share - 0.75).abs() < 0.01, "share of capacity 3: {share}");

    let uniform = EndpointList::from_sorted((0..200).map(|i| endpoint(i, 2, 80)).collect());
    let low = (0..draws).filter(|_| uniform.sample() < 100).count();
    let share = low as f64 / draws as f64;
    assert!(
        (share - 0.5).abs() < 0.01,
        "share of the first half: {share}"
    );

    // One endpoint's capacity changed: no longer uniform.
    let mut changed = uniform.clone();
    changed.put(endpoint(0, 200, 80));
    let first = (0..draws).filter(|_| changed.sample() == 0).count();
    let share = first as f64 / draws as f64;
    assert!(
        (share - 200.0 / 598.0).abs() < 0.01,
        "share of the heavy one: {share}"
    );
}
