//! ztunnel's fields for a workload and a Service, as `istioctl
//! ztunnel-config workloads|services` reads them from `/config_dump`
//! (istio/istio `istioctl/pkg/writer/ztunnel/configdump/api.go`): each is
//! added beside tidegate's own, camelCase where tidegate's are snake_case,
//! so both readers find theirs in one object. istioctl ignores the keys it
//! does not know, and so does tidegate's CLI.
//!
//! A workload's `services` is ztunnel's list, `namespace/hostname` of
//! each Service it is an endpoint of (a Service without a hostname, from
//! the workload file: its `namespace/name`); tidegate's own names are
//! `service_keys`.
//!
//! What tidegate does not carry is written as ztunnel writes an unset
//! value: `workloadType` of a workload from another source than istiod
//! and `hostname` of a workload empty, a Service from the workload file
//! without `hostname`; no `locality` or `network` (one network is
//! assumed); `clusterId` the configured `cluster_id`. A Service's
//! `ipFamilies` is written only when istiod restricted it, as ztunnel
//! writes it (`IPv4`, `IPv6`, `Dual`).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use serde_json::{json, Map, Value};

use crate::workloads::services::{IpFamilies, Service, TargetPort, Visibility};
use crate::workloads::waypoint::{Waypoint, WaypointAddress};
use crate::workloads::{LifecycleState, Workload, WorkloadSnapshot};

/// A Service's (and so a workload's) weight among endpoints by workload
/// uid, as istiod gave it (`capacity`); a workload in none weighs 1.
pub(super) fn capacities(snapshot: &WorkloadSnapshot) -> HashMap<String, u32> {
    let mut out = HashMap::new();
    for svc in snapshot.services() {
        for (uid, target) in &svc.spec.endpoint_targets {
            out.insert(uid.to_string(), target.capacity);
        }
    }
    out
}

/// ztunnel's `NetworkAddress` as it is written: `<network>/<ip>` (one
/// network: always the empty one).
pub(super) fn network_address(ip: IpAddr) -> String {
    format!("/{ip}")
}

/// Adds ztunnel's workload fields to `v` (tidegate's workload object);
/// `snapshot` gives the hostnames of the Services it is an endpoint of.
pub(super) fn workload(
    v: &mut Value,
    w: &Workload,
    snapshot: &WorkloadSnapshot,
    cluster_id: &str,
    capacity: u32,
) {
    let s = &w.spec;
    let label = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| s.labels.get(*k).filter(|v| !v.is_empty()))
            .cloned()
    };
    let workload_name = s.workload_name.clone().unwrap_or_else(|| s.name.clone());
    let canonical_name = label(&[
        "service.istio.io/canonical-name",
        "app.kubernetes.io/name",
        "app",
    ])
    .unwrap_or_else(|| workload_name.clone());
    let canonical_revision = label(&[
        "service.istio.io/canonical-revision",
        "app.kubernetes.io/version",
        "version",
    ])
    .unwrap_or_else(|| "latest".into());
    let Value::Object(o) = v else {
        return;
    };
    o.insert("workloadIps".into(), json!(s.ips));
    o.insert("serviceAccount".into(), json!(s.service_account));
    o.insert("workloadName".into(), json!(workload_name));
    let workload_type = s.workload_type.map(|t| json!(t)).unwrap_or(json!(""));
    o.insert("workloadType".into(), workload_type);
    o.insert("networkMode".into(), json!(s.network_mode));
    o.insert("canonicalName".into(), json!(canonical_name));
    o.insert("canonicalRevision".into(), json!(canonical_revision));
    o.insert("clusterId".into(), json!(cluster_id));
    o.insert("trustDomain".into(), json!(w.identity.trust_domain()));
    let status = match s.state {
        LifecycleState::Running => "Healthy",
        LifecycleState::Terminating => "Unhealthy",
    };
    o.insert("status".into(), json!(status));
    o.insert("hostname".into(), json!(""));
    o.insert("capacity".into(), json!(capacity));
    if !s.authorization_policies.is_empty() {
        o.insert(
            "authorizationPolicies".into(),
            json!(s.authorization_policies),
        );
    }
    if let (Some(wp), Some(Value::Object(shown))) = (&s.waypoint, o.get_mut("waypoint")) {
        gateway_address(shown, wp);
    }
    if let Some(own) = o.remove("services") {
        o.insert("service_keys".into(), own);
        let hosts: Vec<String> = s
            .services
            .iter()
            .map(|name| service_host(snapshot, &s.namespace, name))
            .collect();
        o.insert("services".into(), json!(hosts));
    }
}

/// ztunnel's name of a Service a workload of `namespace` names `name`
/// (`<name>` or `<namespace>/<name>`): `namespace/hostname`, or its key
/// when it has no hostname (or is not held).
fn service_host(snapshot: &WorkloadSnapshot, namespace: &str, name: &str) -> String {
    let key = if name.contains('/') {
        name.to_owned()
    } else {
        format!("{namespace}/{name}")
    };
    match snapshot.service(&key) {
        Some(svc) => match &svc.spec.hostname {
            Some(h) => format!("{}/{h}", svc.spec.namespace),
            None => key,
        },
        None => key,
    }
}

/// ztunnel's `GatewayAddress` fields added to tidegate's waypoint object.
fn gateway_address(o: &mut Map<String, Value>, wp: &Waypoint) {
    let destination = match &wp.address {
        WaypointAddress::Ip(ip) => network_address(*ip),
        WaypointAddress::Hostname {
            namespace,
            hostname,
        } => format!("{namespace}/{hostname}"),
    };
    o.insert("destination".into(), json!(destination));
    o.insert("hboneMtlsPort".into(), json!(wp.port));
}

/// A Service in ztunnel's shape beside tidegate's: `vips`, `ports` and
/// `endpoints` are ztunnel's (tidegate's port list is `service_ports`, its
/// endpoint choice `endpoint_choice`).
pub(super) fn service(svc: &Service, endpoint_choice: Value) -> Value {
    let spec = &svc.spec;
    let hostname = spec.hostname.clone().unwrap_or_default();
    let visibility = match spec.visibility {
        Visibility::Public => "Public",
        Visibility::Namespace => "Namespace",
    };
    let ports: BTreeMap<String, u16> = spec
        .ports
        .iter()
        .map(|p| {
            let target = match &p.target_port {
                None => p.port,
                Some(TargetPort::Number(n)) => *n,
                // Resolved per endpoint, as ztunnel shows a named port.
                Some(TargetPort::Name(_) | TargetPort::PerEndpoint) => 0,
            };
            (p.port.to_string(), target)
        })
        .collect();
    let mut endpoints: BTreeMap<&str, Value> = BTreeMap::new();
    for (port, list) in &svc.endpoints {
        for e in list {
            let entry = endpoints.entry(e.workload.uid()).or_insert_with(|| {
                let status = if e.conditions.ready {
                    "Healthy"
                } else {
                    "Unhealthy"
                };
                json!({
                    "workloadUid": e.workload.uid(),
                    "service": format!("{}/{hostname}", spec.namespace),
                    "port": {},
                    "status": status,
                    "capacity": e.capacity,
                })
            });
            entry["port"][port.to_string()] = json!(e.target_port);
        }
    }
    // istiod's restriction when it sent one; none is not written.
    let ip_families = match spec.ip_families {
        IpFamilies::Ipv4Only => Some("IPv4"),
        IpFamilies::Ipv6Only => Some("IPv6"),
        IpFamilies::Dual => Some("Dual"),
        IpFamilies::Automatic => None,
    };
    let mut v = json!({
        "name": spec.name,
        "namespace": spec.namespace,
        "hostname": hostname,
        "vips": spec.vips.iter().map(|ip| network_address(*ip)).collect::<Vec<_>>(),
        "ports": ports,
        "endpoints": endpoints,
        "subjectAltNames": spec.subject_alt_names,
        "canonical": spec.canonical,
        "visibility": visibility,
        "service_ports": spec.ports,
        "endpoint_choice": endpoint_choice,
        "unresolved": svc.unresolved.iter().map(|(uid, port, why)| json!({"workload_uid": uid, "port": port, "reason": why})).collect::<Vec<_>>(),
    });
    if let Some(families) = ip_families {
        v["ipFamilies"] = json!(families);
    }
    if let Some(first) = spec.waypoints.first() {
        let mut o = Map::new();
        gateway_address(&mut o, first);
        v["waypoint"] = Value::Object(o);
        v["waypoints"] = json!(spec.waypoints);
    }
    v
}
