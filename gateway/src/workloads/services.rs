//! Services: a VIP and ports in front of endpoints (workloads), as the
//! workload file or Kubernetes discovery gives them. Resolved once per
//! publish into what the data path needs: VIP:port → the Service and, per
//! endpoint, the target port and its conditions.
//!
//! - A workload joins a Service by naming it (`services: [<name>]` or
//!   `<namespace>/<name>` in the workload file; EndpointSlices in Kubernetes).
//! - `target_port` is a number, or a name resolved per endpoint from the
//!   workload's named ports (`ports: {http: 8080}`); an endpoint without that
//!   name is not an endpoint of that port.
//! - Conditions follow Kubernetes' EndpointSlice: `ready`, `serving`,
//!   `terminating`. From the workload file they follow the workload's state
//!   (running: ready and serving; terminating: serving and terminating).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{LifecycleState, Workload};

/// A Service's port: the port clients dial on the VIP, and where it lands on
/// each endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServicePort {
    pub port: u16,
    /// A number, or the name of a workload port (`ports:` of the workload).
    /// Absent: the same number as `port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_port: Option<TargetPort>,
    /// Only TCP is carried.
    #[serde(default = "tcp")]
    pub protocol: String,
}

fn tcp() -> String {
    "TCP".into()
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum TargetPort {
    Number(u16),
    Name(String),
}

/// A Service as its source gave it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// ClusterIPs (Kubernetes `spec.clusterIPs`).
    pub vips: Vec<IpAddr>,
    pub ports: Vec<ServicePort>,
}

fn default_namespace() -> String {
    "default".into()
}

impl ServiceSpec {
    /// `namespace/name`, the Service's key.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// An endpoint's conditions (EndpointSlice `conditions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Conditions {
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

impl Conditions {
    /// From the workload's state (the workload file has no EndpointSlice).
    pub fn of(w: &Workload) -> Conditions {
        let terminating = w.spec.state == LifecycleState::Terminating;
        Conditions {
            ready: !terminating,
            serving: true,
            terminating,
        }
    }
}

/// One endpoint of one Service port.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub workload: Arc<Workload>,
    /// The workload's address the port maps to (its first IP of the VIP's family).
    pub ip: IpAddr,
    pub target_port: u16,
    pub conditions: Conditions,
}

/// A Service with its endpoints, resolved per port.
#[derive(Debug)]
pub struct Service {
    pub spec: ServiceSpec,
    /// Service port → its endpoints.
    pub endpoints: BTreeMap<u16, Vec<Endpoint>>,
    /// Members that are no endpoint of some port, and why (`/config_dump`).
    pub unresolved: Vec<(String, u16, &'static str)>,
}

impl Service {
    pub fn key(&self) -> String {
        self.spec.key()
    }
}

/// Whether workload `w` names the Service `svc` (`name` in its own
/// namespace, or `namespace/name`).
fn member(w: &Workload, svc: &ServiceSpec) -> bool {
    w.spec.services.iter().any(|s| match s.split_once('/') {
        Some((ns, name)) => ns == svc.namespace && name == svc.name,
        None => w.spec.namespace == svc.namespace && *s == svc.name,
    })
}

/// VIP:port → its Service.
pub type VipIndex = HashMap<(IpAddr, u16), Arc<Service>>;

/// Resolves every Service against the workloads; indexes VIP:port.
pub fn resolve(
    specs: Vec<ServiceSpec>,
    workloads: &BTreeMap<String, Arc<Workload>>,
) -> (Vec<Arc<Service>>, VipIndex) {
    let mut services = Vec::new();
    let mut by_vip = HashMap::new();
    for spec in specs {
        let members: Vec<&Arc<Workload>> =
            workloads.values().filter(|w| member(w, &spec)).collect();
        let mut endpoints = BTreeMap::new();
        let mut unresolved = Vec::new();
        for p in &spec.ports {
            let mut list = Vec::new();
            for w in &members {
                let target = match &p.target_port {
                    None => Some(p.port),
                    Some(TargetPort::Number(n)) => Some(*n),
                    Some(TargetPort::Name(name)) => w.spec.ports.get(name).copied(),
                };
                let Some(target_port) = target else {
                    unresolved.push((w.uid().to_owned(), p.port, "no_named_port"));
                    continue;
                };
                let family = spec.vips.first().is_none_or(|v| v.is_ipv4());
                let Some(ip) = w.spec.ips.iter().find(|ip| ip.is_ipv4() == family).copied() else {
                    unresolved.push((w.uid().to_owned(), p.port, "no_address_of_the_vip_family"));
                    continue;
                };
                list.push(Endpoint {
                    workload: (*w).clone(),
                    ip,
                    target_port,
                    conditions: Conditions::of(w),
                });
            }
            endpoints.insert(p.port, list);
        }
        let svc = Arc::new(Service {
            spec,
            endpoints,
            unresolved,
        });
        for vip in &svc.spec.vips {
            for p in &svc.spec.ports {
                by_vip.insert((*vip, p.port), svc.clone());
            }
        }
        services.push(svc);
    }
    (services, by_vip)
}
