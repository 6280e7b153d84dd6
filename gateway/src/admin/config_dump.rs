//! `GET /config_dump`: the node, every workload (a local one with its real
//! lifecycle phase and its policy: name, version, source, why), the inbound
//! tunnels, the outbound pool, the certificates held, what becomes of
//! unknown addresses (the cluster's ranges, the addresses held as the
//! mesh's) and (in-pod mode) the pods served in their own namespaces, and
//! the split of the open-file limit (`descriptors`, see
//! `descriptor_budget.rs`). A query narrows it ([`super::dump_query`]).
//!
//! It is also ztunnel's dump, field for field, so that `istioctl
//! ztunnel-config workloads|services|policies|certificates|connections|all`
//! reads it: `workloads` and `services` carry ztunnel's fields beside
//! tidegate's ([`super::ztunnel_view`]), `policies`
//! ([`super::ztunnel_policies`]), `certificates`
//! ([`super::ztunnel_certificates`]; the source's own report is
//! `certificate_source`) and `workloadState` ([`super::workload_state`])
//! are in ztunnel's shape.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use super::dump_query::{DumpQuery, SECTIONS};
use super::{workload_state, ztunnel_certificates, ztunnel_policies, ztunnel_view, AdminState};
use crate::workloads::Workload;

pub(super) async fn dump(state: &AdminState, q: &DumpQuery) -> Value {
    let snapshot = state.workloads.snapshot();
    let capacities = if q.wants("workloads") {
        ztunnel_view::capacities(&snapshot)
    } else {
        Default::default()
    };
    let shown = |w: &Workload| {
        let capacity = capacities.get(w.uid()).copied().unwrap_or(1);
        workload(state, w, &snapshot, capacity)
    };
    let mut out = Map::new();
    out.insert("node".into(), json!(state.node));
    for &section in SECTIONS.iter().filter(|s| q.wants(s)) {
        let v = match section {
            "workloads" => match &q.workload {
                Some(uid) => json!(snapshot
                    .by_uid(uid)
                    .map(|w| shown(w))
                    .into_iter()
                    .collect::<Vec<_>>()),
                None => json!(snapshot.iter().map(|w| shown(w)).collect::<Vec<_>>()),
            },
            "workloads_generation" => json!(snapshot.generation),
            "inbound_tunnels" => json!(state.registry.dump()),
            "pool" => json!(state.pool.dump()),
            "services" => json!(services(state, &snapshot, q.service.as_ref())),
            "outbound" => outbound(state, &snapshot),
            "certificates" => {
                let mut ids: BTreeSet<_> = snapshot.locals().map(|w| w.identity.clone()).collect();
                ids.extend(ztunnel_certificates::held_by_source(
                    &state.certificates.dump(),
                ));
                json!(ztunnel_certificates::certificates(
                    state.certificates.as_ref(),
                    ids
                ))
            }
            "certificate_source" => json!(state.certificates.dump()),
            "policies" => json!(ztunnel_policies::policies(&snapshot.policies)),
            "workloadState" => json!(workload_state::workload_state(
                &snapshot,
                &state.live.list(),
                &state.registry.dump(),
                &state.pool.dump(),
                state.hbone_port,
            )),
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

/// Each Service in ztunnel's shape ([`ztunnel_view::service`]), with
/// every endpoint's conditions and why a new connection would not go
/// there now (`endpoint_choice`).
fn services(
    state: &AdminState,
    snapshot: &crate::workloads::WorkloadSnapshot,
    only: Option<&(String, String)>,
) -> Vec<Value> {
    snapshot
        .services()
        .filter(|svc| {
            only.is_none_or(|(ns, name)| svc.spec.namespace == *ns && svc.spec.name == *name)
        })
        .map(|svc| ztunnel_view::service(svc, json!(state.routing.picker.explain(svc))))
        .collect()
}

/// One workload as its source gave it, with ztunnel's fields
/// ([`ztunnel_view::workload`]), plus for a local one:
/// - `state`: the drain engine's phase (`running`, `shutting-down`,
///   `torn-down`, `deleted`), and `source_state` what the source says;
/// - `policy`: [`tidegate_policy_host::PolicyReport`].
fn workload(
    state: &AdminState,
    w: &Workload,
    snapshot: &crate::workloads::WorkloadSnapshot,
    capacity: u32,
) -> Value {
    let mut v = serde_json::to_value(w).expect("workloads serialize");
    ztunnel_view::workload(&mut v, w, snapshot, &state.cluster_id, capacity);
    if w.local {
        let (phase, pinned) = state.drains.phase_of(w.uid());
        let report = state.policies.report(w, pinned.as_ref());
        v["source_state"] = v["state"].take();
        v["state"] = json!(phase);
        v["policy"] = serde_json::to_value(report).expect("reports serialize");
    }
    v
}
