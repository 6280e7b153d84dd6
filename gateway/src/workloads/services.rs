//! Services: a VIP and ports in front of endpoints (workloads), as the
//! workload file, Kubernetes discovery or istiod gives them. Resolved when
//! it or one of its endpoints changes ([`resolve_one`]) into what the data
//! path needs: VIP:port → the Service and, per endpoint, the target port
//! and its conditions.
//!
//! - A workload joins a Service by naming it (`services: [<name>]` or
//!   `<namespace>/<name>` in the workload file). Kubernetes discovery lists
//!   the endpoints explicitly instead (its EndpointSlices, by pod uid, with
//!   their conditions): [`ServiceSpec::endpoints`]. So does discovery from
//!   istiod, whose endpoints also bring their own port mapping
//!   ([`ServiceSpec::endpoint_targets`]).
//! - `target_port` is a number, or a name resolved per endpoint from the
//!   workload's named ports (`ports: {http: 8080}`); an endpoint without that
//!   name is not an endpoint of that port. An endpoint's own mapping of a
//!   port ([`EndpointTarget::ports`]) comes first; a Service whose target
//!   port is [`TargetPort::PerEndpoint`] (istiod's `target_port: 0`) has
//!   only those, and an endpoint without one is no endpoint of that port.
//! - Conditions follow Kubernetes' EndpointSlice: `ready`, `serving`,
//!   `terminating`. From the workload file they follow the workload's state
//!   (running: ready and serving; terminating: serving and terminating).
//!   From EndpointSlices they are the slice's, except that a workload the
//!   gateway knows is terminating (its pod's deletionTimestamp, which can
//!   arrive before the slice update) is never `ready`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize, Serializer};

pub use super::endpoint::{pick_ips, Conditions, Endpoint};
use super::endpoint_list::EndpointList;
use super::Workload;

/// Explicit endpoints, workload uid → conditions: persistent, so a
/// Service's endpoints change one entry at a time and a copy of the
/// Service shares the rest.
pub type EndpointConditions = imbl::OrdMap<Arc<str>, Conditions>;
/// What explicit endpoints bring of their own, by workload uid (see
/// [`ServiceSpec::endpoint_targets`]); persistent like
/// [`EndpointConditions`].
pub type EndpointTargets = imbl::OrdMap<Arc<str>, EndpointTarget>;

/// A map by workload uid, written as a map of strings.
mod by_uid {
    use std::sync::Arc;

    use serde::ser::SerializeMap;
    use serde::{Serialize, Serializer};

    pub fn serialize<S: Serializer, V: Serialize + Clone>(
        map: &imbl::OrdMap<Arc<str>, V>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let mut out = s.serialize_map(Some(map.len()))?;
        for (uid, v) in map {
            out.serialize_entry(&**uid, v)?;
        }
        out.end()
    }

    pub fn serialize_some<S: Serializer, V: Serialize + Clone>(
        map: &Option<imbl::OrdMap<Arc<str>, V>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match map {
            Some(map) => serialize(map, s),
            None => s.serialize_none(),
        }
    }
}

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
    /// Each endpoint's own mapping only ([`EndpointTarget::ports`]): the
    /// Service names no target port (istiod's `target_port: 0`, a named
    /// port it resolved per endpoint). Not a workload-file value; shown as
    /// `per-endpoint`.
    #[serde(skip_deserializing, serialize_with = "per_endpoint")]
    PerEndpoint,
}

fn per_endpoint<S: Serializer>(s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("per-endpoint")
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
    /// Explicit endpoints, workload uid → conditions (Kubernetes
    /// EndpointSlices). Absent (the workload file): the workloads naming
    /// the Service, conditions from their state.
    #[serde(
        default,
        skip_deserializing,
        skip_serializing_if = "Option::is_none",
        serialize_with = "by_uid::serialize_some"
    )]
    pub endpoints: Option<EndpointConditions>,
    /// What explicit endpoints bring of their own, by workload uid: their
    /// port mapping, addresses, weight (istiod: each workload's entry for
    /// this Service). An endpoint not listed has none.
    #[serde(
        default,
        skip_deserializing,
        skip_serializing_if = "imbl::OrdMap::is_empty",
        serialize_with = "by_uid::serialize"
    )]
    pub endpoint_targets: EndpointTargets,
    /// The Service's DNS name (istiod: `web.shop.svc.cluster.local`, with
    /// the namespace its key there). Not a workload-file key.
    #[serde(default, skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Identities an endpoint may present beside its own (istiod's
    /// `subject_alt_names`): a tunnel to an endpoint of this Service
    /// accepts the endpoint's identity or any of these, as ztunnel's
    /// upstream SANs do. Not a workload-file key.
    #[serde(default, skip_deserializing, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<tidegate_protocol::identity::SpiffeId>,
    /// Its waypoints (istiod's `weighted_waypoints`, else its `waypoint`):
    /// traffic to the VIP goes through one of them. Not a workload-file key.
    #[serde(default, skip_deserializing, skip_serializing_if = "Vec::is_empty")]
    pub waypoints: Vec<super::waypoint::Waypoint>,
    /// The address families its endpoints are reached in (istiod's
    /// `ip_families`): an endpoint address of another family is never
    /// used. Not a workload-file key.
    #[serde(
        default,
        skip_deserializing,
        skip_serializing_if = "IpFamilies::is_automatic"
    )]
    pub ip_families: IpFamilies,
    /// Marked canonical by istiod, the one of several Services with the
    /// same hostname that resolves it (`canonical`). Carried for the
    /// dump only. Not a workload-file key.
    #[serde(skip)]
    pub canonical: bool,
    /// Who may resolve and reach it (istiod's `visibility`). Carried for
    /// the dump only: tidegate does not restrict a `Namespace` Service to
    /// its namespace's clients. Not a workload-file key.
    #[serde(skip)]
    pub visibility: Visibility,
}

/// istiod's `visibility` of a Service, written as ztunnel writes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub enum Visibility {
    /// Every namespace's clients.
    #[default]
    Public,
    /// Its own namespace's clients only.
    Namespace,
}

/// Which of an endpoint's addresses a Service may reach it at, as ztunnel
/// restricts them (`src/state.rs`, `pick_workload_destination_or_resolve`):
/// any (`Automatic`, `Dual`), or one family's only. Among those left, the
/// address of the dialed VIP's family comes first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IpFamilies {
    #[default]
    Automatic,
    Ipv4Only,
    Ipv6Only,
    Dual,
}

impl IpFamilies {
    /// Whether an endpoint may be reached at `ip`.
    pub fn accepts(self, ip: &IpAddr) -> bool {
        match self {
            IpFamilies::Automatic | IpFamilies::Dual => true,
            IpFamilies::Ipv4Only => ip.is_ipv4(),
            IpFamilies::Ipv6Only => ip.is_ipv6(),
        }
    }

    fn is_automatic(&self) -> bool {
        *self == IpFamilies::Automatic
    }
}

/// Where one explicit endpoint is reached, beyond what its workload says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EndpointTarget {
    /// Service port → the endpoint's target port. Wins over the Service's
    /// `target_port`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub ports: BTreeMap<u16, u16>,
    /// Addresses used in place of the workload's, for a workload that is
    /// not indexed by address (istiod's HOST_NETWORK: it shares its node's
    /// IP). Empty: the workload's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpAddr>,
    /// Its weight among the endpoints (istiod's `capacity`): chosen in
    /// proportion to it ([`Endpoint::capacity`]).
    pub capacity: u32,
}

impl Default for EndpointTarget {
    fn default() -> Self {
        EndpointTarget {
            ports: BTreeMap::new(),
            ips: Vec::new(),
            capacity: 1,
        }
    }
}

fn default_namespace() -> String {
    "default".into()
}

impl ServiceSpec {
    /// `namespace/name`, the Service's key.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether the Service maps `service_port` to `target` by itself (a
    /// numeric target port, or none: the same number), on every entry of
    /// that port: an endpoint's own mapping of it to `target` adds nothing.
    pub fn maps_to(&self, service_port: u16, target: u16) -> bool {
        let mut entries = self
            .ports
            .iter()
            .filter(|p| p.port == service_port)
            .peekable();
        entries.peek().is_some()
            && entries.all(|p| match &p.target_port {
                None => service_port == target,
                Some(TargetPort::Number(n)) => *n == target,
                Some(_) => false,
            })
    }
}

/// A Service with its endpoints, resolved per port.
#[derive(Clone, Debug)]
pub struct Service {
    pub spec: ServiceSpec,
    /// Service port → its endpoints, in uid order.
    pub endpoints: BTreeMap<u16, EndpointList>,
    /// Members that are no endpoint of some port, and why (`/config_dump`),
    /// by port then uid.
    pub unresolved: Vec<(String, u16, &'static str)>,
}

impl Service {
    pub fn key(&self) -> String {
        self.spec.key()
    }
}

/// Resolves one Service: its endpoints from `spec.endpoints` (looked up
/// with `workload`) or, without explicit endpoints, `named` (the workloads
/// naming it, in uid order); per TCP port, each endpoint's target port,
/// address and conditions.
pub fn resolve_one<'a>(
    spec: ServiceSpec,
    workload: impl Fn(&str) -> Option<&'a Arc<Workload>>,
    named: &'a [Arc<Workload>],
) -> Service {
    // Explicit endpoints whose pod is no workload (host network, no IP
    // yet, or not known yet): listed as unresolved.
    let mut strangers = Vec::new();
    let members: Vec<(&Arc<Workload>, Conditions)> = match &spec.endpoints {
        Some(eps) => eps
            .iter()
            .filter_map(|(uid, c)| match workload(uid) {
                Some(w) => Some((w, c.for_workload(w))),
                None => {
                    strangers.push(uid);
                    None
                }
            })
            .collect(),
        None => named.iter().map(|w| (w, Conditions::of(w))).collect(),
    };
    let mut endpoints = BTreeMap::new();
    let mut unresolved = Vec::new();
    for p in spec.ports.iter().filter(|p| p.protocol == "TCP") {
        for uid in &strangers {
            unresolved.push((uid.to_string(), p.port, "not_a_workload"));
        }
        let mut list = Vec::new();
        for (w, conditions) in &members {
            match endpoint_of(&spec, p, w, *conditions) {
                Ok(e) => list.push(e),
                Err(reason) => unresolved.push((w.uid().to_owned(), p.port, reason)),
            }
        }
        endpoints.insert(p.port, EndpointList::from_sorted(list));
    }
    unresolved.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
    Service {
        spec,
        endpoints,
        unresolved,
    }
}

impl Service {
    /// Workload `uid`'s endpoints resolved again, alone, from the Service's
    /// explicit entry for it and `workload` (its workload now, if any): what
    /// [`resolve_one`] gives for that uid, at the cost of one endpoint a
    /// port. A Service without explicit endpoints (members by name) is
    /// resolved whole instead.
    pub fn resolve_member(&mut self, uid: &str, workload: Option<&Arc<Workload>>) {
        let Service {
            spec,
            endpoints,
            unresolved,
        } = self;
        unresolved.retain(|(u, _, _)| u != uid);
        let conditions = spec.endpoints.as_ref().and_then(|e| e.get(uid)).copied();
        for p in spec.ports.iter().filter(|p| p.protocol == "TCP") {
            let list = endpoints.entry(p.port).or_default();
            let resolved = match (conditions, workload) {
                (None, _) => {
                    list.remove(uid);
                    continue;
                }
                (Some(_), None) => Err("not_a_workload"),
                (Some(c), Some(w)) => endpoint_of(spec, p, w, c.for_workload(w)),
            };
            match resolved {
                Ok(e) => list.put(e),
                Err(reason) => {
                    list.remove(uid);
                    let at = unresolved
                        .partition_point(|(u, port, _)| (*port, u.as_str()) <= (p.port, uid));
                    unresolved.insert(at, (uid.to_owned(), p.port, reason));
                }
            }
        }
    }
}

/// Workload `w`'s endpoint of Service port `p` with `conditions`, or why
/// it is none.
fn endpoint_of(
    spec: &ServiceSpec,
    p: &ServicePort,
    w: &Arc<Workload>,
    conditions: Conditions,
) -> Result<Endpoint, &'static str> {
    let own = spec.endpoint_targets.get(w.uid());
    let target_port = match (own.and_then(|o| o.ports.get(&p.port)), &p.target_port) {
        (Some(n), _) if *n > 0 => *n,
        (_, None) => p.port,
        (_, Some(TargetPort::Number(n))) => *n,
        (_, Some(TargetPort::Name(name))) => {
            w.spec.ports.get(name).copied().ok_or("no_named_port")?
        }
        (_, Some(TargetPort::PerEndpoint)) => return Err("no_target_port"),
    };
    let ips = match own {
        Some(o) if !o.ips.is_empty() => &o.ips,
        _ => &w.spec.ips,
    };
    let family_v4 = spec.vips.first().is_none_or(|v| v.is_ipv4());
    let (ip, alt_ip) = if spec.ip_families.is_automatic() {
        pick_ips(ips, family_v4).ok_or("no_address")?
    } else {
        let allowed: Vec<IpAddr> = ips
            .iter()
            .copied()
            .filter(|ip| spec.ip_families.accepts(ip))
            .collect();
        match pick_ips(&allowed, family_v4) {
            Some(picked) => picked,
            None if ips.is_empty() => return Err("no_address"),
            None => return Err("no_address_of_the_service_family"),
        }
    };
    Ok(Endpoint {
        workload: w.clone(),
        ip,
        alt_ip,
        target_port,
        conditions,
        capacity: own.map_or(1, |o| o.capacity),
    })
}

#[cfg(test)]
#[path = "services_family_tests.rs"]
mod family_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::WholeSet;
    use crate::workloads::{LifecycleState, WorkloadSpec, WorkloadStore};

    fn spec(uid: &str, ip: &str, state: LifecycleState) -> WorkloadSpec {
        WorkloadSpec::new(uid, "n")
            .namespace("ns")
            .ips([ip.parse().unwrap()])
            .state(state)
    }

    #[test]
    fn explicit_endpoints_keep_their_conditions_unless_the_pod_is_known_to_terminate() {
        let store = WorkloadStore::new("cluster.local", "n");
        let ready = Conditions::from_slice(None, None, None);
        let svc = ServiceSpec {
            name: "web".into(),
            namespace: "ns".into(),
            vips: vec!["10.96.0.1".parse().unwrap()],
            ports: vec![ServicePort {
                port: 80,
                target_port: Some(TargetPort::Number(8080)),
                protocol: "TCP".into(),
            }],
            endpoints: Some(uids([("a", ready), ("b", ready), ("gone", ready)])),
            endpoint_targets: EndpointTargets::new(),
            hostname: None,
            subject_alt_names: Vec::new(),
            waypoints: Vec::new(),
            ip_families: Default::default(),
            canonical: false,
            visibility: Default::default(),
        };
        store.publish(
            WholeSet::new(vec![
                spec("a", "10.0.0.1", LifecycleState::Running),
                // Its pod has a deletionTimestamp; the slice has not caught up.
                spec("b", "10.0.0.2", LifecycleState::Terminating),
            ])
            .services(vec![svc]),
        );
        let snap = store.snapshot();
        let web = snap
            .service_by_vip("10.96.0.1".parse().unwrap(), 80)
            .unwrap();
        let eps: Vec<(&str, u16, Conditions)> = web.endpoints[&80]
            .iter()
            .map(|e| (e.workload.uid(), e.target_port, e.conditions))
            .collect();
        assert_eq!(
            eps,
            [
                ("a", 8080, ready),
                (
                    "b",
                    8080,
                    Conditions {
                        ready: false,
                        serving: true,
                        terminating: true
                    }
                ),
            ],
            "an endpoint naming no known workload is left out"
        );
        assert_eq!(web.unresolved, [("gone".to_owned(), 80, "not_a_workload")]);
    }

    fn web(ports: Vec<ServicePort>, endpoint_targets: EndpointTargets) -> ServiceSpec {
        ServiceSpec {
            name: "web".into(),
            namespace: "ns".into(),
            vips: vec!["10.96.0.1".parse().unwrap()],
            ports,
            endpoints: Some(uids([
                ("a", Conditions::from_slice(None, None, None)),
                ("b", Conditions::from_slice(None, None, None)),
            ])),
            endpoint_targets,
            hostname: None,
            subject_alt_names: Vec::new(),
            waypoints: Vec::new(),
            ip_families: Default::default(),
            canonical: false,
            visibility: Default::default(),
        }
    }

    /// A map by workload uid, as the sources build one.
    pub(crate) fn uids<V: Clone, const N: usize>(
        entries: [(&str, V); N],
    ) -> imbl::OrdMap<Arc<str>, V> {
        entries
            .into_iter()
            .map(|(uid, v)| (Arc::from(uid), v))
            .collect()
    }

    fn port(port: u16, target_port: Option<TargetPort>) -> ServicePort {
        ServicePort {
            port,
            target_port,
            protocol: "TCP".into(),
        }
    }

    /// (uid, ip, target port, capacity) of an endpoint.
    type Seen = (String, IpAddr, u16, u32);

    /// Each endpoint of `port` and the Service's unresolved members.
    fn endpoints_of(spec: ServiceSpec, port: u16) -> (Vec<Seen>, Vec<(String, u16, &'static str)>) {
        let mut a = spec_of("a", "10.0.0.1");
        a.ports.insert("http".into(), 8080);
        let store = WorkloadStore::new("cluster.local", "n");
        store.publish(WholeSet::new(vec![a, spec_of("b", "10.0.0.2")]).services(vec![spec]));
        let snap = store.snapshot();
        let svc = snap.services().next().unwrap().clone();
        let eps = svc.endpoints[&port]
            .iter()
            .map(|e| (e.workload.uid().to_owned(), e.ip, e.target_port, e.capacity))
            .collect();
        (eps, svc.unresolved.clone())
    }

    fn spec_of(uid: &str, ip: &str) -> WorkloadSpec {
        spec(uid, ip, LifecycleState::Running)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_endpoints_own_target_port_wins_over_the_services() {
        let own = EndpointTarget {
            ports: [(80, 9000), (81, 0)].into(),
            ..Default::default()
        };
        for target in [
            None,
            Some(TargetPort::Number(8080)),
            Some(TargetPort::Name("http".into())),
        ] {
            let spec = web(vec![port(80, target.clone())], uids([("b", own.clone())]));
            let (eps, _) = endpoints_of(spec, 80);
            assert_eq!(eps[1], ("b".into(), ip("10.0.0.2"), 9000, 1), "{target:?}");
        }
        // A mapping to port 0 is none: the Service's target port applies.
        let spec = web(
            vec![port(81, Some(TargetPort::Number(8181)))],
            uids([("a", own)]),
        );
        let (eps, _) = endpoints_of(spec, 81);
        assert_eq!(eps[0], ("a".into(), ip("10.0.0.1"), 8181, 1));
    }

    #[test]
    fn a_per_endpoint_port_has_only_the_endpoints_that_map_it() {
        let own = EndpointTarget {
            ports: [(80, 9000)].into(),
            ..Default::default()
        };
        let spec = web(
            vec![port(80, Some(TargetPort::PerEndpoint))],
            uids([("a", own)]),
        );
        let (eps, unresolved) = endpoints_of(spec, 80);
        assert_eq!(eps, [("a".into(), ip("10.0.0.1"), 9000, 1)]);
        assert_eq!(unresolved, [("b".to_owned(), 80, "no_target_port")]);
    }

    #[test]
    fn an_endpoints_own_addresses_and_capacity_are_used() {
        let own = EndpointTarget {
            ips: vec![ip("192.168.0.2")],
            capacity: 5,
            ..Default::default()
        };
        let spec = web(
            vec![port(80, Some(TargetPort::Number(8080)))],
            uids([("b", own)]),
        );
        let (eps, _) = endpoints_of(spec, 80);
        assert_eq!(
            eps,
            [
                ("a".into(), ip("10.0.0.1"), 8080, 1),
                ("b".into(), ip("192.168.0.2"), 8080, 5)
            ]
        );
    }

    /// The resolved Service of `spec` (workloads a and b).
    fn resolved(spec: ServiceSpec) -> Arc<Service> {
        let store = WorkloadStore::new("cluster.local", "n");
        store.publish(
            WholeSet::new(vec![spec_of("a", "10.0.0.1"), spec_of("b", "10.0.0.2")])
                .services(vec![spec]),
        );
        store.snapshot().services().next().unwrap().clone()
    }

    #[test]
    fn endpoints_are_sampled_in_proportion_to_their_capacity() {
        let heavy = EndpointTarget {
            capacity: 9,
            ..Default::default()
        };
        let svc = resolved(web(vec![port(80, None)], uids([("b", heavy)])));
        let eps = &svc.endpoints[&80];
        let b = (0..10_000)
            .filter(|_| eps[eps.sample()].workload.uid() == "b")
            .count();
        // 9,000 expected; the binomial deviation is 30.
        assert!(
            (8_700..=9_300).contains(&b),
            "{b} of 10,000 to capacity 9 of 10"
        );
        // Equal capacities: a uniform draw.
        let even = resolved(web(vec![port(80, None)], EndpointTargets::new()));
        let eps = &even.endpoints[&80];
        let b = (0..10_000)
            .filter(|_| eps[eps.sample()].workload.uid() == "b")
            .count();
        assert!((4_700..=5_300).contains(&b), "{b} of 10,000 to one of two");
    }

    #[test]
    fn the_istio_only_fields_are_no_workload_file_keys() {
        let yaml = "{name: web, vips: [10.96.0.1], ports: [{port: 80}]}";
        let spec: ServiceSpec = serde_yaml::from_str(yaml).unwrap();
        assert_eq!(
            (spec.hostname, spec.subject_alt_names, spec.endpoint_targets),
            (None, vec![], EndpointTargets::new())
        );
        for extra in [
            "hostname: web.default.svc.cluster.local",
            "subject_alt_names: [a]",
            "endpoint_targets: {}",
            "ip_families: dual",
        ] {
            let yaml = format!("{{name: web, vips: [10.96.0.1], ports: [{{port: 80}}], {extra}}}");
            assert!(
                serde_yaml::from_str::<ServiceSpec>(&yaml).is_err(),
                "{extra}"
            );
        }
        // A target port the file leaves null is the service port, never per-endpoint.
        let p: ServicePort = serde_yaml::from_str("{port: 80, target_port: null}").unwrap();
        assert_eq!(p.target_port, None);
        let p: ServicePort = serde_yaml::from_str("{port: 80, target_port: per-endpoint}").unwrap();
        assert_eq!(p.target_port, Some(TargetPort::Name("per-endpoint".into())));
    }

    #[test]
    fn a_per_endpoint_port_and_the_istio_fields_show_in_the_dump() {
        let mut spec = web(
            vec![port(80, Some(TargetPort::PerEndpoint))],
            uids([("a", EndpointTarget::default())]),
        );
        spec.hostname = Some("web.ns.svc.cluster.local".into());
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["ports"][0]["target_port"], "per-endpoint");
        assert_eq!(json["hostname"], "web.ns.svc.cluster.local");
        assert_eq!(
            json["endpoint_targets"]["a"],
            serde_json::json!({"capacity": 1})
        );
        assert!(json.get("subject_alt_names").is_none(), "empty: left out");
    }
}
