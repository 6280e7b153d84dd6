//! istiod's workload resources (`istio.workload.Workload` and `Service`,
//! [`tidegate_xds::workload`]) converted into the store's
//! [`WorkloadSpec`] and [`ServiceSpec`]: pure functions, no I/O.
//!
//! - [`workload`] and [`service`] convert one resource each, or refuse it
//!   with a [`ConvertError`] naming the resource and the field. The caller
//!   NACKs a refused resource and keeps the rest; it holds what converted
//!   and calls [`assemble`] on every change.
//! - A Service lists no endpoints: each workload's `services` map names
//!   the Services it is an endpoint of and its port mapping for each.
//!   [`assemble`] turns those into each [`ServiceSpec`]'s explicit
//!   endpoints, conditions from the workload's status.
//! - An enum value this code does not know is refused where ztunnel
//!   refuses it (tunnel protocol, status, network mode, application tunnel
//!   protocol, a Service's IP families and load balancing), never read as
//!   the default. Fields tidegate does not use and ztunnel does not check
//!   are read as ztunnel reads them, for the dump only: `workload_type`
//!   (an unknown value is a Deployment) and a Service's `visibility` (an
//!   unknown value is public) and `canonical`; `app_protocol` is not read. Waypoints and network gateways are checked as ztunnel
//!   checks them (a destination, a well-sized address).
//! - Waypoints are carried ([`Waypoint`]: a Service's `weighted_waypoints`
//!   when one has a weight, else its `waypoint`; a workload's `waypoint`),
//!   marked remote when on another network than their destination; a
//!   workload behind a `network_gateway` is marked as on another network.
//!   The data path refuses both rather than go around them.
//!
//! Not carried: network gateways themselves and `network` (one network is
//! assumed), `locality`, load
//! balancing (checked, not applied: an unhealthy endpoint stays a
//! terminating one, where ztunnel leaves it out unless ALLOW_ALL),
//! `native_tunnel` (HBONE to port 15008 either way), a hostname-only
//! workload's `hostname`, `cluster_id`, extensions.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use tidegate_xds::workload::{
    self as wds, application_tunnel, load_balancing, IpFamilies, NetworkMode, TunnelProtocol,
    WorkloadStatus, WorkloadType,
};

use crate::workloads::services::{
    Conditions, EndpointTarget, ServicePort, ServiceSpec, TargetPort, Visibility,
};
use crate::workloads::waypoint::{Waypoint, WaypointAddress};
use crate::workloads::{LifecycleState, Protocol, WorkloadSpec};
use tidegate_protocol::identity::SpiffeId;

/// The label Istio's metrics read a workload's canonical service from.
pub const CANONICAL_NAME_LABEL: &str = "service.istio.io/canonical-name";
/// The label Istio's metrics read a workload's canonical revision from.
pub const CANONICAL_REVISION_LABEL: &str = "service.istio.io/canonical-revision";

/// The trust domain an empty `trust_domain` stands for.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

/// A resource refused: which one, which field, and why. The message is
/// what the NACK carries.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// A workload, by uid (or `namespace/name` without one).
    #[error("workload {resource}: {field}: {problem}")]
    Workload {
        resource: String,
        field: String,
        problem: Problem,
    },
    /// A Service, by its key `namespace/hostname`.
    #[error("service {resource}: {field}: {problem}")]
    Service {
        resource: String,
        field: String,
        problem: Problem,
    },
}

/// What is wrong with a field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("empty")]
    Empty,
    #[error("{0} bytes, not an IPv4 (4) or IPv6 (16) address")]
    AddressLength(usize),
    #[error("{value} is not a known {kind} value")]
    UnknownEnum { kind: &'static str, value: i32 },
    #[error("{0} is above 65535")]
    PortRange(u32),
    #[error("{0:?} is not <namespace>/<hostname>")]
    ServiceKey(String),
    /// A Service address with a prefix length below its family's width.
    #[error("a CIDR VIP (/{0}): tidegate routes to single addresses only")]
    CidrVip(u32),
    #[error("prefix length {len} is longer than the address ({bits} bits)")]
    PrefixLength { len: u32, bits: u32 },
    #[error("a gateway address with neither a hostname nor an address")]
    NoDestination,
    /// A value tidegate cannot honour; the reason says why.
    #[error("{0}")]
    Unsupported(&'static str),
    /// A workload of another trust domain ([`IstioWorkload::check_trust_domain`]).
    #[error("{theirs:?}, not the gateway's {ours:?}: its identity would be derived wrongly")]
    ForeignTrustDomain { theirs: String, ours: String },
}

/// A converted workload: the spec the store takes, and what the workload
/// says that the spec has no field for (kept for [`assemble`]).
#[derive(Clone, Debug, PartialEq, Hash)]
pub struct IstioWorkload {
    /// `ips` is empty for a HOST_NETWORK workload (see `addresses`);
    /// `services` holds the Service keys as istiod gives them
    /// (`namespace/hostname`) until [`assemble`] replaces them with the
    /// held Services' keys.
    pub spec: WorkloadSpec,
    /// Its addresses, whatever its network mode.
    pub addresses: Vec<IpAddr>,
    /// HOST_NETWORK: it shares its node's address, so the address does not
    /// identify it. It is not indexed by address (`spec.ips` is empty; the
    /// Kubernetes source never indexes a host-network pod either) but
    /// stays reachable as a Service endpoint at `addresses`
    /// ([`EndpointTarget::ips`]), as ztunnel reaches it.
    pub host_network: bool,
    /// Status HEALTHY (UNHEALTHY: not ready or being deleted, as istiod
    /// reads a pod; `spec.state` is terminating, so the drain engine treats
    /// it as such — unless `starting`).
    pub healthy: bool,
    /// UNHEALTHY and never HEALTHY while held: a pod not ready yet, not one
    /// being deleted (istiod gives both the same status). Running, and no
    /// terminating endpoint. Only the source knows (it remembers what it
    /// held, [`IstioWorkload::mark_starting`]); one resource alone reads
    /// `false`.
    pub starting: bool,
    /// Service key (`namespace/hostname`) → service port → target port.
    /// A target port of 0 is left out (resolved as if the workload gave
    /// none).
    pub services: BTreeMap<String, BTreeMap<u16, u16>>,
    /// Its weight among a Service's endpoints: 1 when absent or 0. Carried
    /// to [`EndpointTarget::capacity`]; endpoint choice does not weigh it
    /// yet.
    pub capacity: u32,
    /// Its trust domain. istiod leaves the field empty for
    /// `cluster.local` (and ztunnel reads an empty one so): empty becomes
    /// `cluster.local` here.
    pub trust_domain: String,
}

impl IstioWorkload {
    /// UNHEALTHY and never HEALTHY while its source held it: starting, not
    /// terminating (see `starting`). No change to a HEALTHY one.
    pub fn mark_starting(&mut self) {
        if !self.healthy {
            self.starting = true;
            self.spec.state = LifecycleState::Running;
        }
    }

    /// Refuses a workload of another trust domain than `ours` (the
    /// gateway's, [`WorkloadStore::trust_domain`]): the store derives
    /// every workload's identity from its own trust domain. The caller
    /// refuses or logs.
    ///
    /// [`WorkloadStore::trust_domain`]: crate::workloads::WorkloadStore::trust_domain
    pub fn check_trust_domain(&self, ours: &str) -> Result<(), ConvertError> {
        if self.trust_domain == ours {
            return Ok(());
        }
        Err(ConvertError::Workload {
            resource: self.spec.uid.clone(),
            field: "trust_domain".into(),
            problem: Problem::ForeignTrustDomain {
                theirs: self.trust_domain.clone(),
                ours: ours.to_owned(),
            },
        })
    }
}

/// One workload as the store takes it, or why not.
pub fn workload(w: &wds::Workload) -> Result<IstioWorkload, ConvertError> {
    let resource = if w.uid.is_empty() {
        format!("{}/{}", w.namespace, w.name)
    } else {
        w.uid.clone()
    };
    let err = |field: String, problem: Problem| ConvertError::Workload {
        resource: resource.clone(),
        field,
        problem,
    };
    if w.uid.is_empty() {
        return Err(err("uid".into(), Problem::Empty));
    }
    let addresses = w
        .addresses
        .iter()
        .enumerate()
        .map(|(i, a)| ip(a).map_err(|p| err(format!("addresses[{i}]"), p)))
        .collect::<Result<Vec<_>, _>>()?;
    let protocol = match TunnelProtocol::try_from(w.tunnel_protocol) {
        Ok(TunnelProtocol::Hbone) => Protocol::Hbone,
        Ok(TunnelProtocol::None) => Protocol::Tcp,
        Ok(TunnelProtocol::LegacyIstioMtls) => {
            return Err(err(
                "tunnel_protocol".into(),
                Problem::Unsupported(
                    "LEGACY_ISTIO_MTLS: tidegate does not speak Istio's sidecar mutual TLS",
                ),
            ))
        }
        Err(_) => {
            return Err(err(
                "tunnel_protocol".into(),
                unknown("TunnelProtocol", w.tunnel_protocol),
            ))
        }
    };
    let healthy = match WorkloadStatus::try_from(w.status) {
        Ok(WorkloadStatus::Healthy) => true,
        Ok(WorkloadStatus::Unhealthy) => false,
        Err(_) => return Err(err("status".into(), unknown("WorkloadStatus", w.status))),
    };
    let host_network = match NetworkMode::try_from(w.network_mode) {
        Ok(NetworkMode::Standard) => false,
        Ok(NetworkMode::HostNetwork) => true,
        Err(_) => {
            return Err(err(
                "network_mode".into(),
                unknown("NetworkMode", w.network_mode),
            ))
        }
    };
    if let Some(tunnel) = &w.application_tunnel {
        match application_tunnel::Protocol::try_from(tunnel.protocol) {
            Ok(application_tunnel::Protocol::None) => {}
            Ok(application_tunnel::Protocol::Proxy) => {
                return Err(err(
                    "application_tunnel.protocol".into(),
                    Problem::Unsupported(
                        "PROXY: tidegate does not write PROXY protocol headers to the application",
                    ),
                ))
            }
            Err(_) => {
                return Err(err(
                    "application_tunnel.protocol".into(),
                    unknown("ApplicationTunnel.Protocol", tunnel.protocol),
                ))
            }
        }
    }
    for (field, gateway) in [
        ("waypoint", &w.waypoint),
        ("network_gateway", &w.network_gateway),
    ] {
        if let Some(g) = gateway {
            check_gateway(g).map_err(|(at, p)| err(format!("{field}{at}"), p))?;
        }
    }
    let mut services = BTreeMap::new();
    for (key, list) in &w.services {
        let at = |field: String| format!("services[{key:?}]{field}");
        if !is_service_key(key) {
            return Err(err(at(String::new()), Problem::ServiceKey(key.clone())));
        }
        let mut ports = BTreeMap::new();
        for (i, p) in list.ports.iter().enumerate() {
            let service_port = port(p.service_port)
                .map_err(|e| err(at(format!(".ports[{i}].service_port")), e))?;
            let target_port =
                port(p.target_port).map_err(|e| err(at(format!(".ports[{i}].target_port")), e))?;
            if target_port > 0 {
                ports.insert(service_port, target_port);
            }
        }
        services.insert(key.clone(), ports);
    }
    let mut labels = BTreeMap::new();
    for (key, value) in [
        (CANONICAL_NAME_LABEL, &w.canonical_name),
        (CANONICAL_REVISION_LABEL, &w.canonical_revision),
    ] {
        if !value.is_empty() {
            labels.insert(key.to_owned(), value.clone());
        }
    }
    let spec = WorkloadSpec {
        uid: w.uid.clone(),
        name: w.name.clone(),
        namespace: w.namespace.clone(),
        service_account: non_empty(&w.service_account).unwrap_or_else(|| "default".into()),
        ips: if host_network {
            Vec::new()
        } else {
            addresses.clone()
        },
        node: w.node.clone(),
        protocol,
        state: if healthy {
            LifecycleState::Running
        } else {
            LifecycleState::Terminating
        },
        labels: crate::workloads::shared(labels),
        annotations: crate::workloads::shared(BTreeMap::new()),
        allow: Vec::new(),
        authorization_policies: w.authorization_policies.clone(),
        oci_backend_draining: false,
        namespace_policy: None,
        deletion_deadline_unix_ms: None,
        services: services.keys().cloned().collect(),
        ports: BTreeMap::new(),
        workload_name: non_empty(&w.workload_name),
        waypoint: w
            .waypoint
            .as_ref()
            .and_then(|g| waypoint(g, &w.network, 1))
            .map(Box::new),
        other_network: w.network_gateway.is_some(),
        workload_type: Some(workload_type(w.workload_type)),
        network_mode: if host_network {
            crate::workloads::NetworkMode::HostNetwork
        } else {
            crate::workloads::NetworkMode::Standard
        },
    };
    Ok(IstioWorkload {
        spec,
        addresses,
        host_network,
        healthy,
        starting: false,
        services,
        capacity: w.capacity.filter(|c| *c > 0).unwrap_or(1),
        trust_domain: non_empty(&w.trust_domain).unwrap_or_else(|| DEFAULT_TRUST_DOMAIN.into()),
    })
}

/// One Service as the store takes it (no endpoints yet: [`assemble`]),
/// or why not.
pub fn service(s: &wds::Service) -> Result<ServiceSpec, ConvertError> {
    let err = |field: String, problem: Problem| ConvertError::Service {
        resource: format!("{}/{}", s.namespace, s.hostname),
        field,
        problem,
    };
    for (field, value) in [
        ("name", &s.name),
        ("namespace", &s.namespace),
        ("hostname", &s.hostname),
    ] {
        if value.is_empty() {
            return Err(err(field.into(), Problem::Empty));
        }
    }
    let mut vips = Vec::with_capacity(s.addresses.len());
    for (i, a) in s.addresses.iter().enumerate() {
        let at = || format!("addresses[{i}]");
        let vip = ip(&a.address).map_err(|p| err(at(), p))?;
        let bits = if vip.is_ipv4() { 32 } else { 128 };
        match a.length {
            None => {}
            Some(len) if len == bits => {}
            Some(len) if len > bits => {
                return Err(err(at(), Problem::PrefixLength { len, bits }));
            }
            Some(len) => return Err(err(at(), Problem::CidrVip(len))),
        }
        vips.push(vip);
    }
    let mut ports = Vec::with_capacity(s.ports.len());
    for (i, p) in s.ports.iter().enumerate() {
        let service_port =
            port(p.service_port).map_err(|e| err(format!("ports[{i}].service_port"), e))?;
        let target_port =
            port(p.target_port).map_err(|e| err(format!("ports[{i}].target_port"), e))?;
        ports.push(ServicePort {
            port: service_port,
            target_port: Some(match target_port {
                0 => TargetPort::PerEndpoint,
                n => TargetPort::Number(n),
            }),
            protocol: "TCP".into(),
        });
    }
    if let Some(g) = &s.waypoint {
        check_gateway(g).map_err(|(at, p)| err(format!("waypoint{at}"), p))?;
    }
    for (i, ww) in s.weighted_waypoints.iter().enumerate() {
        let field = format!("weighted_waypoints[{i}].destination");
        let g = ww
            .destination
            .as_ref()
            .ok_or_else(|| err(field.clone(), Problem::Empty))?;
        check_gateway(g).map_err(|(at, p)| err(format!("{field}{at}"), p))?;
    }
    if IpFamilies::try_from(s.ip_families).is_err() {
        return Err(err(
            "ip_families".into(),
            unknown("IPFamilies", s.ip_families),
        ));
    }
    if let Some(lb) = &s.load_balancing {
        for (i, scope) in lb.routing_preference.iter().enumerate() {
            if load_balancing::Scope::try_from(*scope).is_err() {
                return Err(err(
                    format!("load_balancing.routing_preference[{i}]"),
                    unknown("LoadBalancing.Scope", *scope),
                ));
            }
        }
        if load_balancing::Mode::try_from(lb.mode).is_err() {
            return Err(err(
                "load_balancing.mode".into(),
                unknown("LoadBalancing.Mode", lb.mode),
            ));
        }
        if load_balancing::HealthPolicy::try_from(lb.health_policy).is_err() {
            return Err(err(
                "load_balancing.health_policy".into(),
                unknown("LoadBalancing.HealthPolicy", lb.health_policy),
            ));
        }
    }
    Ok(ServiceSpec {
        name: s.name.clone(),
        namespace: s.namespace.clone(),
        vips,
        ports,
        // Explicit, even when no workload names it: membership comes from
        // the workloads' `services`, never from matching names.
        endpoints: Some(Default::default()),
        endpoint_targets: Default::default(),
        hostname: Some(s.hostname.clone()),
        subject_alt_names: subject_alt_names(s),
        waypoints: service_waypoints(s),
        ip_families: ip_families(s.ip_families),
        canonical: s.canonical,
        visibility: match wds::service::Visibility::try_from(s.visibility) {
            Ok(wds::service::Visibility::Namespace) => Visibility::Namespace,
            Ok(wds::service::Visibility::Public) | Err(_) => Visibility::Public,
        },
    })
}

/// istiod's `workload_type`; an unknown value reads as the enum's
/// default, a Deployment, as ztunnel reads it.
fn workload_type(v: i32) -> crate::workloads::WorkloadType {
    use crate::workloads::WorkloadType as T;
    match WorkloadType::try_from(v) {
        Ok(WorkloadType::Deployment) | Err(_) => T::Deployment,
        Ok(WorkloadType::Cronjob) => T::Cronjob,
        Ok(WorkloadType::Pod) => T::Pod,
        Ok(WorkloadType::Job) => T::Job,
    }
}

/// istiod's `ip_families` (checked known before).
fn ip_families(v: i32) -> crate::workloads::services::IpFamilies {
    use crate::workloads::services::IpFamilies as F;
    match IpFamilies::try_from(v) {
        Ok(IpFamilies::Ipv4Only) => F::Ipv4Only,
        Ok(IpFamilies::Ipv6Only) => F::Ipv6Only,
        Ok(IpFamilies::Dual) => F::Dual,
        Ok(IpFamilies::Automatic) | Err(_) => F::Automatic,
    }
}

/// The Service's `subject_alt_names` that are SPIFFE ids. Another SAN is
/// left out with a warning naming it, as ztunnel ignores it: it narrows
/// whom a tunnel accepts, never widens it, and the Service stays
/// reachable at its endpoints' own identities.
fn subject_alt_names(s: &wds::Service) -> Vec<SpiffeId> {
    s.subject_alt_names
        .iter()
        .enumerate()
        .filter_map(|(i, san)| match san.parse::<SpiffeId>() {
            Ok(id) => Some(id),
            Err(e) => {
                tracing::warn!(
                    service = %format_args!("{}/{}", s.namespace, s.hostname),
                    key = %format_args!("subject_alt_names[{i}]"),
                    san,
                    error = %e,
                    "a Service SAN that is no SPIFFE id is ignored (never trusted)"
                );
                None
            }
        })
        .collect()
}

/// A Service's waypoints as ztunnel chooses among them: its
/// `weighted_waypoints` when one has a weight, else its `waypoint`.
fn service_waypoints(s: &wds::Service) -> Vec<Waypoint> {
    // The Service's own network: that of its addresses.
    let network = s.addresses.first().map_or("", |a| a.network.as_str());
    if s.weighted_waypoints.iter().any(|w| w.weight > 0) {
        return s
            .weighted_waypoints
            .iter()
            .filter_map(|w| waypoint(w.destination.as_ref()?, network, w.weight))
            .collect();
    }
    s.waypoint
        .as_ref()
        .and_then(|g| waypoint(g, network, 1))
        .into_iter()
        .collect()
}

/// A checked gateway address ([`check_gateway`]) as a waypoint of a
/// destination on `network`.
fn waypoint(g: &wds::GatewayAddress, network: &str, weight: u32) -> Option<Waypoint> {
    let (address, remote_network) = match g.destination.as_ref()? {
        wds::gateway_address::Destination::Address(a) => (
            WaypointAddress::Ip(ip(&a.address).ok()?),
            a.network != network,
        ),
        wds::gateway_address::Destination::Hostname(h) => (
            WaypointAddress::Hostname {
                namespace: h.namespace.clone(),
                hostname: h.hostname.clone(),
            },
            false,
        ),
    };
    Some(Waypoint {
        address,
        port: u16::try_from(g.hbone_mtls_port).unwrap_or(0),
        remote_network,
        weight,
    })
}

/// The well-formed addresses among `raw` (4 or 16 bytes each), whatever
/// else is wrong with the resource naming them.
pub fn addresses_named(raw: &[bytes::Bytes]) -> Vec<IpAddr> {
    raw.iter()
        .filter_map(|b| match b.len() {
            4 => <[u8; 4]>::try_from(b.as_ref()).ok().map(IpAddr::from),
            16 => <[u8; 16]>::try_from(b.as_ref()).ok().map(IpAddr::from),
            _ => None,
        })
        .collect()
}

/// The workload set and the Services to publish, from the converted
/// resources held: each workload becomes an explicit endpoint of every
/// held Service its `services` names, with its port mapping, its
/// addresses when it is HOST_NETWORK, its capacity, and conditions from
/// its status (HEALTHY: ready and serving; UNHEALTHY: serving and
/// terminating, not ready). A workload naming a Service not held is an
/// endpoint of nothing there; its `spec.services` keeps the held
/// Services' keys (`namespace/name`) only.
///
/// An address held by several workloads goes to one, as ztunnel chooses
/// (a pod over anything else, then HBONE over plain TCP), then a healthy
/// one over an unhealthy one (the one being deleted gives way); the others
/// keep their other addresses. Two of the same standing (two healthy HBONE
/// pods, say) is a conflict only istiod can resolve: neither has the
/// address ([`owner`]), never the one whose name sorts last.
///
/// The inputs are the converted resources held, by resource name (the
/// caller converts each resource once, when it arrives). Workloads come
/// out sorted by uid, Services by `namespace/name`. One pass over the
/// workloads with a hash lookup per Service they name.
pub fn assemble(
    workloads: &BTreeMap<String, IstioWorkload>,
    services: &BTreeMap<String, ServiceSpec>,
) -> (Vec<WorkloadSpec>, Vec<ServiceSpec>) {
    let mut out_services: Vec<ServiceSpec> = services.values().cloned().collect();
    let by_host: HashMap<String, usize> = out_services
        .iter()
        .enumerate()
        .filter_map(|(i, s)| Some((format!("{}/{}", s.namespace, s.hostname.as_deref()?), i)))
        .collect();
    let workloads: Vec<&IstioWorkload> = workloads.values().collect();
    let mut specs = Vec::with_capacity(workloads.len());
    for w in &workloads {
        let mut spec = w.spec.clone();
        spec.services.clear();
        for (key, ports) in &w.services {
            let Some(&i) = by_host.get(key.as_str()) else {
                continue;
            };
            let svc = &mut out_services[i];
            spec.services.push(svc.key());
            let uid: Arc<str> = Arc::from(spec.uid.as_str());
            svc.endpoints
                .get_or_insert_with(Default::default)
                .insert(uid.clone(), conditions(w.healthy, w.starting));
            let ports = ports.iter().map(|(s, t)| (*s, *t));
            let target = endpoint_target(w.host_network, &w.addresses, w.capacity, ports, svc);
            if target != EndpointTarget::default() {
                svc.endpoint_targets.insert(uid, target);
            }
        }
        specs.push(spec);
    }
    resolve_shared_addresses(&mut specs, &workloads);
    specs.sort_by(|a, b| a.uid.cmp(&b.uid));
    out_services.sort_by_key(ServiceSpec::key);
    (specs, out_services)
}

/// A workload's conditions as an endpoint: from its status (HEALTHY), and
/// whether an UNHEALTHY one is only starting.
pub(super) fn conditions(healthy: bool, starting: bool) -> Conditions {
    Conditions {
        ready: healthy,
        serving: true,
        terminating: !healthy && !starting,
    }
}

/// What a workload brings of its own as an endpoint of `service`
/// (`ports`: its mapping for that Service, less what the Service maps the
/// same way by itself — most endpoints bring nothing but their weight): a
/// HOST_NETWORK workload is reached at its `addresses`.
pub(super) fn endpoint_target(
    host_network: bool,
    addresses: &[IpAddr],
    capacity: u32,
    ports: impl IntoIterator<Item = (u16, u16)>,
    service: &ServiceSpec,
) -> EndpointTarget {
    EndpointTarget {
        ports: ports
            .into_iter()
            .filter(|(sp, tp)| !service.maps_to(*sp, *tp))
            .collect(),
        ips: if host_network {
            addresses.to_vec()
        } else {
            Vec::new()
        },
        capacity,
    }
}

/// A workload's standing for an address it shares: a pod over another
/// kind, HBONE over plain TCP, healthy over not.
pub(super) type Standing = (bool, bool, bool);

pub(super) fn standing(uid: &str, protocol: Protocol, healthy: bool) -> Standing {
    (uid.contains("//Pod/"), protocol == Protocol::Hbone, healthy)
}

impl IstioWorkload {
    pub(super) fn standing(&self) -> Standing {
        standing(&self.spec.uid, self.spec.protocol, self.healthy)
    }
}

/// Who has an address among those claiming it: the one of the highest
/// standing; `None` when two share the highest (a conflict).
pub(super) fn owner<K>(claimants: impl IntoIterator<Item = (K, Standing)>) -> Option<K> {
    let mut best: Option<(K, Standing)> = None;
    let mut tied = false;
    for (k, s) in claimants {
        match &best {
            Some((_, b)) if s < *b => {}
            Some((_, b)) if s == *b => tied = true,
            _ => {
                best = Some((k, s));
                tied = false;
            }
        }
    }
    best.filter(|_| !tied).map(|(k, _)| k)
}

/// Leaves each address in at most one spec's `ips` ([`owner`]; see
/// [`assemble`]). `specs[i]` is `workloads[i]`'s.
fn resolve_shared_addresses(specs: &mut [WorkloadSpec], workloads: &[&IstioWorkload]) {
    let mut claims: HashMap<IpAddr, Vec<usize>> = HashMap::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        for ip in &spec.ips {
            claims.entry(*ip).or_default().push(i);
        }
    }
    claims.retain(|_, c| c.len() > 1);
    if claims.is_empty() {
        return;
    }
    let owners: HashMap<IpAddr, Option<usize>> = claims
        .iter()
        .map(|(ip, c)| (*ip, owner(c.iter().map(|&i| (i, workloads[i].standing())))))
        .collect();
    for (i, spec) in specs.iter_mut().enumerate() {
        spec.ips
            .retain(|ip| owners.get(ip).is_none_or(|o| *o == Some(i)));
    }
}

/// A waypoint or network gateway that ztunnel would read: a destination,
/// an address of 4 or 16 bytes. Checked, not carried. The error's field is
/// relative (`.address`).
fn check_gateway(g: &wds::GatewayAddress) -> Result<(), (String, Problem)> {
    match &g.destination {
        None => Err((String::new(), Problem::NoDestination)),
        Some(wds::gateway_address::Destination::Address(a)) => {
            ip(&a.address).map(drop).map_err(|p| (".address".into(), p))
        }
        Some(wds::gateway_address::Destination::Hostname(_)) => Ok(()),
    }
}

fn ip(bytes: &[u8]) -> Result<IpAddr, Problem> {
    if let Ok(v4) = <[u8; 4]>::try_from(bytes) {
        Ok(IpAddr::from(v4))
    } else if let Ok(v6) = <[u8; 16]>::try_from(bytes) {
        Ok(IpAddr::from(v6))
    } else {
        Err(Problem::AddressLength(bytes.len()))
    }
}

fn port(n: u32) -> Result<u16, Problem> {
    u16::try_from(n).map_err(|_| Problem::PortRange(n))
}

fn unknown(kind: &'static str, value: i32) -> Problem {
    Problem::UnknownEnum { kind, value }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

/// `namespace/hostname`, both non-empty.
fn is_service_key(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(ns, host)| !ns.is_empty() && !host.is_empty())
}

#[cfg(test)]
#[path = "convert_tests.rs"]
mod tests;
