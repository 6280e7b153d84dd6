//! `workloadState` of `/config_dump`, the connections view `istioctl
//! ztunnel-config connections` reads: each local workload by uid, with
//! its state, who it is (`info`) and its open HBONE tunnels both ways.
//!
//! tidegate keeps tunnels, not each connection: an entry is one tunnel
//! with its open `streams` (each a connection of the application), where
//! ztunnel lists one entry per connection. Inbound: `src` is the peer
//! node's address, `actualDst` the workload's address at the HBONE port.
//! Outbound: a pooled tunnel is shared by the local workloads of its
//! source identity and listed under each; `src` is the workload's
//! address (no port: a tunnel carries many), `originalDst` and
//! `actualDst` the peer's HBONE address.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde_json::{json, Value};

use crate::proxy::pool::TunnelDump as Outbound;
use crate::proxy::tunnels::TunnelDump as Inbound;
use crate::workloads::WorkloadSnapshot;

/// Local workload uid → its state, as ztunnel's `WorkloadState`.
pub(super) fn workload_state(
    snapshot: &WorkloadSnapshot,
    inbound: &[Inbound],
    outbound: &[Outbound],
    hbone_port: u16,
) -> BTreeMap<String, Value> {
    snapshot
        .locals()
        .map(|w| {
            let ip = w.spec.ips.first();
            let ins: Vec<Value> = inbound
                .iter()
                .filter(|t| t.workload_uid == w.uid())
                .map(|t| {
                    json!({
                        "src": t.peer_addr,
                        "originalDst": null,
                        "actualDst": ip.map(|ip| SocketAddr::new(*ip, hbone_port).to_string()),
                        "protocol": "HBONE",
                        "tunnel_id": t.id,
                        "streams": t.streams,
                        "peer_identity": t.peer_identity,
                    })
                })
                .collect();
            let identity = w.identity.to_string();
            let outs: Vec<Value> = outbound
                .iter()
                .filter(|t| t.src == identity)
                .map(|t| {
                    json!({
                        "src": ip.map(ToString::to_string),
                        "originalDst": t.dst_addr,
                        "actualDst": t.dst_addr,
                        "protocol": "HBONE",
                        "tunnel_id": t.id,
                        "streams": t.streams,
                        "peer_identity": t.dst,
                        "state": t.state,
                    })
                })
                .collect();
            let state = json!({
                "state": "Up",
                "connections": {"inbound": ins, "outbound": outs},
                "info": {
                    "name": w.spec.name,
                    "namespace": w.spec.namespace,
                    "trustDomain": w.identity.trust_domain(),
                    "serviceAccount": w.spec.service_account,
                },
            });
            (w.uid().to_owned(), state)
        })
        .collect()
}
