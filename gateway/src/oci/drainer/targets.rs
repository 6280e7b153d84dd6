//! Which of a load balancer's backends belong to the workload, and what
//! each needs.

use std::net::IpAddr;

use super::AtCapacity;
use crate::workloads::WorkloadSnapshot;
use tidegate_oci::model::LoadBalancer;

/// One backend of the workload, as found on a load balancer.
pub(super) struct Target {
    pub(super) lb: String,
    pub(super) set: String,
    pub(super) name: String,
    pub(super) drain: bool,
    /// Backends in its set and on its load balancer.
    pub(super) set_len: usize,
    pub(super) lb_len: usize,
}

impl Target {
    pub(super) fn key(&self) -> String {
        format!("{}/{}/{}", self.lb, self.set, self.name)
    }
}

/// What to do about one of the workload's backends, as the load balancer
/// view shows it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// It already has the wanted `drain`.
    Keep,
    /// Change it. `full`: its backend set or load balancer is at capacity;
    /// `remove`: delete it rather than drain it.
    Change { full: bool, remove: bool },
}

/// Only a drain can find a set at capacity (an un-drain never removes).
pub(super) fn plan(
    t: &Target,
    drain: bool,
    at_capacity: AtCapacity,
    capacity_limit: usize,
) -> Plan {
    if t.drain == drain {
        return Plan::Keep;
    }
    let full = drain && (t.set_len >= capacity_limit || t.lb_len >= capacity_limit);
    Plan::Change {
        full,
        remove: full && at_capacity == AtCapacity::RemoveEarly,
    }
}

/// The workload's backends on `lb`: `ipAddress` is one of the workload's
/// IPs and the store says that IP belongs to this exact workload uid. A
/// backend in a node network (a NodePort behind a node IP, a host-network
/// pod) serves many pods and is never drained.
pub(super) fn targets_of(
    lb: &str,
    view: &LoadBalancer,
    uid: &str,
    ips: &[IpAddr],
    snapshot: &WorkloadSnapshot,
    node_networks: &[crate::oci::Cidr],
) -> Vec<Target> {
    let node = |ip: IpAddr| node_networks.iter().any(|n| n.contains(ip));
    let lb_len = view.backend_sets.values().map(|s| s.backends.len()).sum();
    let mut out = Vec::new();
    for (set_name, set) in &view.backend_sets {
        for b in &set.backends {
            let Ok(ip) = b.ip_address.parse::<IpAddr>() else {
                continue;
            };
            let owner = snapshot.by_ip(ip).map(|w| w.uid());
            if !ips.contains(&ip) || owner != Some(uid) || node(ip) {
                continue;
            }
            out.push(Target {
                lb: lb.to_owned(),
                set: set_name.clone(),
                name: b.name.clone(),
                drain: b.drain,
                set_len: set.backends.len(),
                lb_len,
            });
        }
    }
    out
}
