//! `workloadState` of `/config_dump`, the connections view `istioctl
//! ztunnel-config connections` reads: each local workload by uid, with
//! its state, who it is (`info`), each connection open now both ways as
//! ztunnel lists it (`connections`), and its HBONE tunnels (`tunnels`,
//! tidegate's own).
//!
//! A connection ([`crate::proxy::connections`]): `src`, `originalDst`,
//! `actualDst` and `protocol` (`HBONE`, `TCP`). Outbound: `src` the
//! application's address, `originalDst` the address it dialed (a Service
//! VIP or a workload), `actualDst` the workload it went to (a Service's
//! endpoint, or the original destination itself). Inbound: `src` the peer
//! (an HBONE tunnel's peer gateway, a plaintext client), `originalDst`
//! null (ztunnel writes the Service a waypoint asked for; tidegate takes
//! no such request), `actualDst` the workload's address and port.
//!
//! Tunnels: inbound, `src` the peer node's address, `actualDst` the
//! workload's address at the HBONE port; outbound, a pooled tunnel is
//! shared by the local workloads of its source identity and listed under
//! each, `src` the workload's address (no port: a tunnel carries many),
//! `originalDst` and `actualDst` the peer's HBONE address.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use serde_json::{json, Value};

use crate::proxy::connections::{Direction, LiveConnection};
use crate::proxy::pool::TunnelDump as Outbound;
use crate::proxy::tunnels::TunnelDump as Inbound;
use crate::workloads::{Workload, WorkloadSnapshot};

/// Local workload uid → its state, as ztunnel's `WorkloadState`.
pub(super) fn workload_state(
    snapshot: &WorkloadSnapshot,
    live: &[LiveConnection],
    inbound: &[Inbound],
    outbound: &[Outbound],
    hbone_port: u16,
) -> BTreeMap<String, Value> {
    let mut by_uid: HashMap<&str, (Vec<Value>, Vec<Value>)> = HashMap::new();
    for c in live {
        let entry = by_uid.entry(&c.workload_uid).or_default();
        let list = match c.direction {
            Direction::Inbound => &mut entry.0,
            Direction::Outbound => &mut entry.1,
        };
        list.push(json!({
            "src": c.src,
            "originalDst": c.original_dst,
            "actualDst": c.actual_dst,
            "protocol": c.protocol(),
        }));
    }
    snapshot
        .locals()
        .map(|w| {
            let (ins, outs) = by_uid.remove(w.uid()).unwrap_or_default();
            let state = json!({
                "state": "Up",
                "connections": {"inbound": ins, "outbound": outs},
                "tunnels": tunnels(w, inbound, outbound, hbone_port),
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

/// The HBONE tunnels of local workload `w`, each with its open `streams`.
fn tunnels(w: &Workload, inbound: &[Inbound], outbound: &[Outbound], hbone_port: u16) -> Value {
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
    json!({"inbound": ins, "outbound": outs})
}
