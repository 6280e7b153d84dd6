//! The desired workload set, built from whole watch stores (level-triggered):
//! the same stores always give the same set, whatever order events came in.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::core::PartialObjectMeta;
use tidegate_authz::kubernetes::Conversion;

use crate::config::{Cidr, KubernetesConfig};
use crate::workloads::membership::{self, Membership, PodFacts};
use crate::workloads::services::{Conditions, ServicePort, ServiceSpec, TargetPort};
use crate::workloads::{LifecycleState, Protocol, WorkloadSpec};

/// The Service annotation that opts the pods it selects into OCI backend draining.
pub const OCI_DRAINING_ANNOTATION: &str = "tidegate.io/oci-backend-draining";
/// The EndpointSlice label naming its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// What the watches hold right now.
#[derive(Default)]
pub struct Stores {
    pub pods: Vec<Arc<Pod>>,
    pub namespaces: Vec<Arc<PartialObjectMeta<Namespace>>>,
    pub slices: Vec<Arc<EndpointSlice>>,
    pub services: Vec<Arc<Service>>,
}

/// The workload set to publish, plus what could not be resolved.
#[derive(Debug, Default, PartialEq)]
pub struct Desired {
    /// Sorted by uid.
    pub specs: Vec<WorkloadSpec>,
    /// Services with a ClusterIP, sorted by `namespace/name`; endpoints
    /// from their EndpointSlices.
    pub services: Vec<ServiceSpec>,
    /// EndpointSlice endpoints naming a pod UID no pod watch holds (informer
    /// skew: the slice arrived before the pod, or after it went). They are
    /// ignored until the pod shows up; counted and logged by the caller.
    pub unknown_endpoints: Vec<String>,
    /// Addresses two pods of the same standing claim (two running pods):
    /// neither has the address, which is held closed until one leaves it
    /// ([`resolve_ip_reuse`]). Sorted by address.
    pub conflicts: Vec<IpConflict>,
}

/// An address two or more pods of the same standing claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpConflict {
    pub ip: IpAddr,
    /// `namespace/name (uid)` of each claimant, sorted.
    pub pods: Vec<String>,
}

impl IpConflict {
    /// The name the store holds the address closed under: the istio
    /// source's name for a conflict (`address <ip>`), so `/config_dump`
    /// and the refusal read the same whichever source found it.
    pub fn resource(&self) -> String {
        format!("address {}", self.ip)
    }
}

/// What the EndpointSlices say about one pod.
#[derive(Default)]
struct EndpointFacts {
    terminating: bool,
    oci_draining: bool,
}

/// What the EndpointSlices say, per pod and per Service.
struct SliceFacts<'a> {
    pods: HashMap<&'a str, EndpointFacts>,
    /// (namespace, Service name) → pod uid → conditions.
    services: HashMap<(&'a str, &'a str), BTreeMap<String, Conditions>>,
    unknown: Vec<String>,
}

/// Each namespace's labels, by name (a namespace without labels maps to none).
fn namespace_labels(
    namespaces: &[Arc<PartialObjectMeta<Namespace>>],
) -> HashMap<&str, Option<&BTreeMap<String, String>>> {
    namespaces
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, n.metadata.labels.as_ref())))
        .collect()
}

/// The pod's mesh membership by the one rule ([`membership::decide`]).
fn membership_of(
    pod: &Pod,
    ns_labels: Option<&BTreeMap<String, String>>,
    cfg: &KubernetesConfig,
) -> Membership {
    membership::decide(
        &cfg.mesh_label,
        PodFacts {
            namespace: pod.metadata.namespace.as_deref().unwrap_or("default"),
            pod_labels: pod.metadata.labels.as_ref(),
            namespace_labels: ns_labels,
            host_network: pod
                .spec
                .as_ref()
                .and_then(|s| s.host_network)
                .unwrap_or(false),
        },
    )
}

/// The mesh membership of each of `local_pods` (this node's), by uid —
/// what the gateway answers `tidegate-cni` ADD with. Pods without an IP
/// yet are included: a pod's ADD comes before its address. A pod whose
/// namespace the namespace watch does not hold yet is left out (unknown:
/// its namespace's labels may opt it in), as is one without a uid.
pub fn members(
    local_pods: &[Arc<Pod>],
    namespaces: &[Arc<PartialObjectMeta<Namespace>>],
    cfg: &KubernetesConfig,
) -> BTreeMap<String, Membership> {
    let ns_labels = namespace_labels(namespaces);
    local_pods
        .iter()
        .filter_map(|p| {
            let uid = p.metadata.uid.clone()?;
            let ns = p.metadata.namespace.as_deref().unwrap_or("default");
            let labels = *ns_labels.get(ns)?;
            Some((uid, membership_of(p, labels, cfg)))
        })
        .collect()
}

/// The desired set; each pod names the authorization policies that
/// select it (`authorization`: what the security resources converted to).
pub fn build(stores: &Stores, cfg: &KubernetesConfig, authorization: &Conversion) -> Desired {
    let ns_labels = namespace_labels(&stores.namespaces);
    let pod_uids: HashSet<&str> = stores
        .pods
        .iter()
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    let SliceFacts {
        pods: facts,
        services: mut endpoints,
        unknown: unknown_endpoints,
    } = slice_facts(stores, &pod_uids);

    let mut specs: Vec<WorkloadSpec> = stores
        .pods
        .iter()
        .filter_map(|p| {
            let uid = p.metadata.uid.as_deref()?;
            let ns = p.metadata.namespace.as_deref().unwrap_or("default");
            let mut spec = pod_spec(p, facts.get(uid), ns_labels.get(ns).copied().flatten(), cfg)?;
            spec.authorization_policies = authorization.policies_for(ns, &spec.labels);
            Some(spec)
        })
        .collect();
    specs.sort_by(|a, b| a.uid.cmp(&b.uid));
    let conflicts = resolve_ip_reuse(&mut specs);
    let mut services: Vec<ServiceSpec> = stores
        .services
        .iter()
        .filter_map(|s| service_spec(s, &mut endpoints))
        .collect();
    services.sort_by_key(ServiceSpec::key);
    Desired {
        specs,
        services,
        unknown_endpoints,
        conflicts,
    }
}

/// A Service as the data path routes it; `None` without a ClusterIP
/// (headless, ExternalName: clients resolve those to pod IPs themselves).
/// Only TCP ports are kept.
fn service_spec<'a>(
    svc: &'a Service,
    endpoints: &mut HashMap<(&'a str, &'a str), BTreeMap<String, Conditions>>,
) -> Option<ServiceSpec> {
    let name = svc.metadata.name.as_deref()?;
    let namespace = svc.metadata.namespace.as_deref().unwrap_or("default");
    let spec = svc.spec.as_ref()?;
    let vips = primary_first(
        spec.cluster_ip.as_deref(),
        spec.cluster_ips.iter().flatten().map(String::as_str),
    );
    if vips.is_empty() {
        return None;
    }
    let ports = spec
        .ports
        .iter()
        .flatten()
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
        .filter_map(|p| {
            Some(ServicePort {
                port: u16::try_from(p.port).ok()?,
                target_port: match &p.target_port {
                    None => None,
                    Some(IntOrString::Int(n)) => Some(TargetPort::Number(u16::try_from(*n).ok()?)),
                    Some(IntOrString::String(s)) => match s.parse::<u16>() {
                        Ok(n) => Some(TargetPort::Number(n)),
                        Err(_) => Some(TargetPort::Name(s.clone())),
                    },
                },
                protocol: "TCP".into(),
            })
        })
        .collect();
    Some(ServiceSpec {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        vips,
        ports,
        endpoints: Some(
            endpoints
                .remove(&(namespace, name))
                .unwrap_or_default()
                .into_iter()
                .map(|(uid, c)| (std::sync::Arc::from(uid), c))
                .collect(),
        ),
        endpoint_targets: Default::default(),
        hostname: None,
        subject_alt_names: Vec::new(),
        waypoints: Vec::new(),
        ip_families: Default::default(),
        canonical: false,
        visibility: Default::default(),
    })
}

fn slice_facts<'a>(stores: &'a Stores, pod_uids: &HashSet<&str>) -> SliceFacts<'a> {
    let oci_services: HashSet<(&str, &str)> = stores
        .services
        .iter()
        .filter(|s| {
            s.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(OCI_DRAINING_ANNOTATION))
                .is_some_and(|v| v == "true")
        })
        .filter_map(|s| {
            Some((
                s.metadata.namespace.as_deref()?,
                s.metadata.name.as_deref()?,
            ))
        })
        .collect();
    let mut facts: HashMap<&str, EndpointFacts> = HashMap::new();
    let mut services: HashMap<(&str, &str), BTreeMap<String, Conditions>> = HashMap::new();
    let mut unknown = Vec::new();
    for slice in &stores.slices {
        let ns = slice.metadata.namespace.as_deref().unwrap_or("default");
        let service = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL));
        let oci = service.is_some_and(|s| oci_services.contains(&(ns, s.as_str())));
        for ep in &slice.endpoints {
            let Some(r) = ep.target_ref.as_ref() else {
                continue;
            };
            if r.kind.as_deref() != Some("Pod") {
                continue;
            }
            let Some(uid) = r.uid.as_deref() else {
                continue;
            };
            if !pod_uids.contains(uid) {
                unknown.push(format!(
                    "{ns}/{} -> pod {}/{} uid {uid}",
                    slice.metadata.name.as_deref().unwrap_or("?"),
                    r.namespace.as_deref().unwrap_or(ns),
                    r.name.as_deref().unwrap_or("?"),
                ));
                continue;
            }
            let c = ep.conditions.as_ref();
            let conditions = Conditions::from_slice(
                c.and_then(|c| c.ready),
                c.and_then(|c| c.serving),
                c.and_then(|c| c.terminating),
            );
            let f = facts.entry(uid).or_default();
            f.terminating |= conditions.terminating;
            f.oci_draining |= oci;
            if let Some(service) = service {
                services
                    .entry((ns, service.as_str()))
                    .or_default()
                    .entry(uid.to_owned())
                    .and_modify(|have| *have = have.merge(conditions))
                    .or_insert(conditions);
            }
        }
    }
    unknown.sort();
    unknown.dedup();
    SliceFacts {
        pods: facts,
        services,
        unknown,
    }
}

/// One pod as a workload; `None` for pods without an IP yet, whose
/// containers all ended (phase Succeeded/Failed: nothing left to drain), or
/// on the host network (they share the node's IP; no mesh identity).
fn pod_spec(
    pod: &Pod,
    facts: Option<&EndpointFacts>,
    ns_labels: Option<&BTreeMap<String, String>>,
    cfg: &KubernetesConfig,
) -> Option<WorkloadSpec> {
    let meta = &pod.metadata;
    let status = pod.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return None;
    }
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
    {
        return None;
    }
    let ips = pod_ips(pod);
    if ips.is_empty() {
        return None;
    }
    let in_mesh = membership_of(pod, ns_labels, cfg).member;
    let labels = meta.labels.clone().unwrap_or_default();
    let deadline = meta
        .deletion_timestamp
        .as_ref()
        .map(|t| t.0.as_millisecond());
    let terminating = deadline.is_some() || facts.is_some_and(|f| f.terminating);
    let spec = pod.spec.as_ref();
    Some(WorkloadSpec {
        uid: meta.uid.clone()?,
        name: meta.name.clone().unwrap_or_default(),
        namespace: meta.namespace.clone().unwrap_or_else(|| "default".into()),
        service_account: spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into()),
        ips,
        node: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        protocol: if in_mesh {
            Protocol::Hbone
        } else {
            Protocol::Tcp
        },
        state: if terminating {
            LifecycleState::Terminating
        } else {
            LifecycleState::Running
        },
        labels: crate::workloads::shared(labels),
        annotations: crate::workloads::shared(meta.annotations.clone().unwrap_or_default()),
        allow: Vec::new(),
        authorization_policies: Vec::new(),
        oci_backend_draining: facts.is_some_and(|f| f.oci_draining),
        namespace_policy: ns_labels.and_then(|l| l.get(&cfg.policy_label)).cloned(),
        deletion_deadline_unix_ms: deadline.map(|ms| ms.max(0) as u64),
        services: Vec::new(),
        ports: named_ports(pod),
        workload_name: workload_name(pod),
        waypoint: None,
        other_network: false,
        workload_type: None,
        network_mode: Default::default(),
    })
}

/// The cluster's pod and Service ranges: every Node's `spec.podCIDRs` (or
/// `podCIDR`) and every ServiceCIDR's `spec.cidrs`, sorted, each once; an
/// entry that does not parse is left out.
pub fn cluster_ranges(nodes: &[Arc<Node>], cidrs: &[Arc<ServiceCIDR>]) -> Vec<Cidr> {
    let from_nodes = nodes.iter().filter_map(|n| n.spec.as_ref()).flat_map(|s| {
        s.pod_cidrs
            .iter()
            .flatten()
            .chain(s.pod_cidr.iter())
            .cloned()
            .collect::<Vec<_>>()
    });
    let from_cidrs = cidrs
        .iter()
        .filter_map(|c| c.spec.as_ref())
        .flat_map(|s| s.cidrs.iter().flatten().cloned().collect::<Vec<_>>());
    let mut ranges: Vec<Cidr> = from_nodes
        .chain(from_cidrs)
        .filter_map(|s| s.parse().ok())
        .collect();
    ranges.sort_by_key(ToString::to_string);
    ranges.dedup();
    ranges
}

/// The pod's workload as istiod names it: the Deployment of its
/// ReplicaSet (the ReplicaSet's name less its `-<pod-template-hash>`), its
/// Job; `None` (the pod's own name) for any other controller or none.
fn workload_name(pod: &Pod) -> Option<String> {
    let meta = &pod.metadata;
    let controller = meta
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))?;
    match controller.kind.as_str() {
        "ReplicaSet" => {
            let hash = meta.labels.as_ref()?.get("pod-template-hash")?;
            let deployment = controller.name.strip_suffix(hash)?.strip_suffix('-')?;
            Some(deployment.to_owned())
        }
        "Job" => Some(controller.name.clone()),
        _ => None,
    }
}

/// The pod's named container ports (a Service's `targetPort` by name).
fn named_ports(pod: &Pod) -> BTreeMap<String, u16> {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
        .filter_map(|p| Some((p.name.clone()?, u16::try_from(p.container_port).ok()?)))
        .collect()
}

fn pod_ips(pod: &Pod) -> Vec<IpAddr> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    primary_first(
        status.pod_ip.as_deref(),
        status.pod_ips.iter().flatten().map(|p| p.ip.as_str()),
    )
}

/// The addresses of a dual-stack field pair (`podIP`/`podIPs`,
/// `clusterIP`/`clusterIPs`): the list, the primary first; what does not
/// parse (`None` of a headless Service) is left out.
fn primary_first<'a>(primary: Option<&str>, all: impl Iterator<Item = &'a str>) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = all.filter_map(|ip| ip.parse().ok()).collect();
    if let Some(ip) = primary.and_then(|ip| ip.parse().ok()) {
        if !ips.contains(&ip) {
            ips.insert(0, ip);
        }
    }
    ips
}

/// An IP held by two pods (reused after the first terminated, or seen
/// before the old pod's removal arrived) belongs to one only when one
/// stands above the others: a running pod over a terminating one (a pod
/// whose containers all ended or that was deleted is no workload at all).
/// Two of the same standing — two running pods — is a conflict only the
/// cluster can resolve: neither has the address (never the newer, never
/// the uid that sorts last), and it is returned to be held closed until
/// one of them leaves it. The pods keep their other IPs and stay in the
/// set (a terminating pod still drains), so the IP never resolves to an
/// identity it may not be.
fn resolve_ip_reuse(specs: &mut [WorkloadSpec]) -> Vec<IpConflict> {
    let mut claims: HashMap<IpAddr, Vec<usize>> = HashMap::new();
    for (i, spec) in specs.iter().enumerate() {
        for ip in &spec.ips {
            claims.entry(*ip).or_default().push(i);
        }
    }
    claims.retain(|_, c| c.len() > 1);
    let running = |s: &WorkloadSpec| s.state == LifecycleState::Running;
    let mut conflicts = Vec::new();
    let mut owners: HashMap<IpAddr, Option<usize>> = HashMap::with_capacity(claims.len());
    for (ip, claimants) in claims {
        let best = claimants.iter().any(|&i| running(&specs[i]));
        let top: Vec<usize> = claimants
            .into_iter()
            .filter(|&i| running(&specs[i]) == best)
            .collect();
        if let [only] = top[..] {
            owners.insert(ip, Some(only));
            continue;
        }
        owners.insert(ip, None);
        let mut pods: Vec<String> = top
            .iter()
            .map(|&i| {
                let s = &specs[i];
                format!("{}/{} ({})", s.namespace, s.name, s.uid)
            })
            .collect();
        pods.sort();
        conflicts.push(IpConflict { ip, pods });
    }
    for (i, spec) in specs.iter_mut().enumerate() {
        spec.ips
            .retain(|ip| owners.get(ip).is_none_or(|owner| *owner == Some(i)));
    }
    conflicts.sort_by_key(|c| c.ip);
    conflicts
}

#[cfg(test)]
#[path = "desired_tests.rs"]
mod tests;
