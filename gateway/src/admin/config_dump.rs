//! `GET /config_dump`: the node, every workload (a local one with its real
//! lifecycle phase and its policy: name, version, source, why), the inbound
//! tunnels, the outbound pool, the certificates held (an `istio-ca`
//! source: identity, serial, not-after, state), what becomes of unknown
//! addresses (the cluster's ranges, the addresses held as the mesh's) and
//! (in-pod mode) the pods served in their own namespaces, and the split
//! of the open-file limit (`descriptors`, see `descriptor_budget.rs`).
//! A query narrows it ([`super::dump_query`]).

use serde_json::{json, Map, Value};

use super::dump_query::{DumpQuery, SECTIONS};
use super::AdminState;
use crate::workloads::Workload;

pub(super) async fn dump(state: &AdminState, q: &DumpQuery) -> Value {
    let snapshot = state.workloads.snapshot();
    let mut out = Map::new();
    out.insert("node".into(), json!(state.node));
    for &section in SECTIONS.iter().filter(|s| q.wants(s)) {
        let v = match section {
            "workloads" => match &q.workload {
                Some(uid) => json!(snapshot
                    .by_uid(uid)
                    .map(|w| workload(state, w))
                    .into_iter()
                    .collect::<Vec<_>>()),
                None => json!(snapshot
                    .iter()
                    .map(|w| workload(state, w))
                    .collect::<Vec<_>>()),
            },
            "workloads_generation" => json!(snapshot.generation),
            "inbound_tunnels" => json!(state.registry.dump()),
            "pool" => json!(state.pool.dump()),
            "services" => json!(services(state, &snapshot, q.service.as_ref())),
            "outbound" => outbound(state, &snapshot),
            "certificates" => json!(state.certificates.dump()),
            "capture" => match &state.pods {
                None => json!({"mode": "node"}),
                Some(pods) => json!({"mode": "inpod", "pods": pods.dump().await}),
            },
            "descriptors" => json!(state.descriptors),
            other => unreachable!("section {other} is listed in SECTIONS"),
        };
        out.insert(section.into(), v);
    }
    Value::Object(out)
}

/// What becomes of addresses that are no workload or Service: the
/// cluster's ranges (configured and learned), whether an unknown address
/// can leave in plaintext, and the addresses held as the mesh's (departed,
/// refused), which never do.
fn outbound(state: &AdminState, snapshot: &crate::workloads::WorkloadSnapshot) -> Value {
    let routing = &state.routing;
    let ranges: Vec<String> = routing
        .cluster_cidrs
        .iter()
        .chain(snapshot.cluster_ranges.iter())
        .map(ToString::to_string)
        .collect();
    let (departed, refused) = snapshot.formerly_known_len();
    json!({
        "cluster_ranges": ranges,
        "unknown_in_cluster": routing.unknown_in_cluster,
        "unknown_outside_ranges": "passthrough",
        "plaintext_to_unknown": ranges.is_empty()
            || routing.unknown_in_cluster == crate::config::UnknownInCluster::Passthrough,
        "formerly_known": {
            "departed": departed,
            "refused": refused,
            "retention_secs": crate::workloads::DEPARTED_RETENTION.as_secs(),
        },
    })
}

/// Each Service: its VIPs and ports, and every endpoint with its
/// conditions and why a new connection would not go there now.
fn services(
    state: &AdminState,
    snapshot: &crate::workloads::WorkloadSnapshot,
    only: Option<&(String, String)>,
) -> Vec<Value> {
    snapshot
        .services()
        .filter(|svc| only.is_none_or(|(ns, name)| svc.spec.namespace == *ns && svc.spec.name == *name))
        .map(|svc| {
            json!({
                "name": svc.spec.name,
                "namespace": svc.spec.namespace,
                "vips": svc.spec.vips,
                "ports": svc.spec.ports,
                "endpoints": state.routing.picker.explain(svc),
                "unresolved": svc.unresolved.iter().map(|(uid, port, why)| json!({"workload_uid": uid, "port": port, "reason": why})).collect::<Vec<_>>(),
            })
        })
        .collect()
}

/// One workload as its source gave it, plus for a local one:
/// - `state`: the drain engine's phase (`running`, `shutting-down`,
///   `torn-down`, `deleted`), and `source_state` what the source says;
/// - `policy`: [`tidegate_policy_host::PolicyReport`].
fn workload(state: &AdminState, w: &Workload) -> Value {
    let mut v = serde_json::to_value(w).expect("workloads serialize");
    if w.local {
        let (phase, pinned) = state.drains.phase_of(w.uid());
        let report = state.policies.report(w, pinned.as_ref());
        v["source_state"] = v["state"].take();
        v["state"] = json!(phase);
        v["policy"] = serde_json::to_value(report).expect("reports serialize");
    }
    v
}
