//! A synthetic cluster for the xDS double: `workloads` pods over
//! `services` Services as istiod would send them (`istio.workload.Address`
//! resources, encoded), and single-pod updates to churn it. Used by the
//! xDS bench and by the drain lab's background.
//!
//! Each workload is an endpoint of one Service (five per Service at the
//! bench's ratio, a port mapping 80 → 8080 each); pods spread over
//! [`NODES`] nodes, about [`LOCAL_PODS`] of them on [`GATEWAY_NODE`].
//! Addresses: workloads from 10.64.0.0, VIPs from 172.16.0.0; nothing
//! dials them.

use std::net::Ipv4Addr;

use bytes::Bytes;
use prost::Message as _;
use tidegate_xds::workload::{
    address, Address, NetworkAddress, Port, PortList, Service, TunnelProtocol, Workload,
    WorkloadStatus, WorkloadType,
};

/// Nodes the pods are spread over.
pub const NODES: usize = 1000;
/// About this many workloads are on the gateway's node.
pub const LOCAL_PODS: usize = 30;
/// The node about [`LOCAL_PODS`] pods are on (no drain lab node).
pub const GATEWAY_NODE: &str = "node-000";
/// Namespaces the Services are spread over.
pub const NAMESPACES: usize = 20;

/// A set of `workloads` pods over `services` Services.
#[derive(Clone, Copy)]
pub struct Set {
    pub workloads: usize,
    pub services: usize,
}

impl Set {
    pub fn namespace(&self, svc: usize) -> String {
        format!("ns-{}", svc % NAMESPACES)
    }

    pub fn hostname(&self, svc: usize) -> String {
        format!("svc-{svc}.{}.svc.cluster.local", self.namespace(svc))
    }

    pub fn service_of(&self, i: usize) -> usize {
        i % self.services
    }

    pub fn node_of(&self, i: usize) -> String {
        if i % self.local_every() == 0 {
            GATEWAY_NODE.to_owned()
        } else {
            format!("node-{:04}", 1 + i % (NODES - 1))
        }
    }

    /// Pod `i`'s name, as a ReplicaSet names its pods: the Deployment's
    /// name, a hash of the pod template, a suffix of its own (so a
    /// Deployment's replicas sort together, as in a real cluster).
    pub fn pod_name(&self, i: usize) -> String {
        let svc = self.service_of(i);
        let template = (svc as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 24;
        format!("deploy-{svc}-{template:010x}-{i:06x}")
    }

    pub fn uid(&self, i: usize) -> String {
        let ns = self.namespace(self.service_of(i));
        format!("Kubernetes//Pod/{ns}/{}", self.pod_name(i))
    }

    pub fn local_every(&self) -> usize {
        (self.workloads / LOCAL_PODS).max(1)
    }

    pub fn pod_ip(i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 64 + (i >> 16) as u8, (i >> 8) as u8, i as u8)
    }

    pub fn vip(svc: usize) -> Ipv4Addr {
        Ipv4Addr::new(172, 16, (svc >> 8) as u8, svc as u8)
    }

    /// Remote workloads (the update phase's targets: a local one going
    /// unhealthy would drain).
    pub fn remote(&self) -> Vec<usize> {
        (0..self.workloads)
            .filter(|i| i % self.local_every() != 0)
            .collect()
    }

    pub fn workload(&self, i: usize, healthy: bool) -> Bytes {
        let svc = self.service_of(i);
        let ns = self.namespace(svc);
        let ports = PortList {
            ports: vec![Port {
                service_port: 80,
                target_port: 8080,
                app_protocol: 0,
            }],
        };
        let status = if healthy {
            WorkloadStatus::Healthy
        } else {
            WorkloadStatus::Unhealthy
        };
        let w = Workload {
            uid: self.uid(i),
            name: self.pod_name(i),
            namespace: ns.clone(),
            addresses: vec![Bytes::copy_from_slice(&Self::pod_ip(i).octets())],
            tunnel_protocol: TunnelProtocol::Hbone as i32,
            trust_domain: "cluster.local".into(),
            service_account: format!("sa-{svc}"),
            node: self.node_of(i),
            canonical_name: format!("svc-{svc}"),
            canonical_revision: "v1".into(),
            workload_type: WorkloadType::Deployment as i32,
            workload_name: format!("deploy-{svc}"),
            services: [(format!("{ns}/{}", self.hostname(svc)), ports)].into(),
            status: status as i32,
            cluster_id: "Kubernetes".into(),
            ..Default::default()
        };
        Address {
            r#type: Some(address::Type::Workload(w)),
        }
        .encode_to_vec()
        .into()
    }

    pub fn service(&self, svc: usize) -> Bytes {
        Address {
            r#type: Some(address::Type::Service(Service {
                name: format!("svc-{svc}"),
                namespace: self.namespace(svc),
                hostname: self.hostname(svc),
                addresses: vec![NetworkAddress {
                    network: String::new(),
                    address: Bytes::copy_from_slice(&Self::vip(svc).octets()),
                    length: None,
                }],
                ports: vec![Port {
                    service_port: 80,
                    target_port: 8080,
                    app_protocol: 0,
                }],
                ..Default::default()
            })),
        }
        .encode_to_vec()
        .into()
    }

    /// Every resource, by the name istiod gives it (a workload's uid, a
    /// Service's `namespace/hostname`).
    pub fn resources(&self) -> Vec<(String, Bytes)> {
        let services = (0..self.services).map(|s| {
            (
                format!("{}/{}", self.namespace(s), self.hostname(s)),
                self.service(s),
            )
        });
        let workloads = (0..self.workloads).map(|i| (self.uid(i), self.workload(i, true)));
        services.chain(workloads).collect()
    }

    /// The same set as a workload file.
    pub fn yaml(&self) -> String {
        let mut y = String::from("workloads:\n");
        for i in 0..self.workloads {
            let svc = self.service_of(i);
            y += &format!(
                "- {{uid: '{}', name: {}, namespace: {}, service_account: sa-{svc}, ips: [{}], node: {}, services: [svc-{svc}], workload_name: deploy-{svc}}}\n",
                self.uid(i),
                self.pod_name(i),
                self.namespace(svc),
                Self::pod_ip(i),
                self.node_of(i),
            );
        }
        y += "services:\n";
        for s in 0..self.services {
            y += &format!(
                "- {{name: svc-{s}, namespace: {}, vips: [{}], ports: [{{port: 80, target_port: 8080}}]}}\n",
                self.namespace(s),
                Self::vip(s)
            );
        }
        y
    }

    /// The `k`-th update: a remote workload turning unhealthy (then back,
    /// once every remote one has been updated).
    pub fn update(&self, remote: &[usize], k: usize) -> (String, Bytes) {
        let i = remote[k % remote.len()];
        let healthy = (k / remote.len()) % 2 == 1;
        (self.uid(i), self.workload(i, healthy))
    }
}
