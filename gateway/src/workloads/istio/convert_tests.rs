use std::collections::BTreeMap;
use std::net::IpAddr;

use bytes::Bytes;
use tidegate_xds::workload as wds;

use super::*;
use crate::workloads::services::{Conditions, EndpointTarget, IpFamilies as F, TargetPort};
use crate::workloads::WholeSet;
use crate::workloads::{LifecycleState, Protocol, WorkloadStore};
use tidegate_protocol::identity::SpiffeId;

const UID: &str = "Kubernetes//Pod/shop/web-1";
const WEB: &str = "shop/web.shop.svc.cluster.local";

fn ipb(ip: &str) -> Bytes {
    match ip.parse::<IpAddr>().unwrap() {
        IpAddr::V4(v4) => Bytes::copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => Bytes::copy_from_slice(&v6.octets()),
    }
}

fn ipa(ip: &str) -> IpAddr {
    ip.parse().unwrap()
}

fn ports(list: &[(u32, u32)]) -> wds::PortList {
    wds::PortList {
        ports: list
            .iter()
            .map(|&(service_port, target_port)| wds::Port {
                service_port,
                target_port,
                app_protocol: 0,
            })
            .collect(),
    }
}

/// A pod as istiod sends it.
fn pod(uid: &str, ip: &str) -> wds::Workload {
    let name = uid.rsplit('/').next().unwrap();
    wds::Workload {
        uid: uid.into(),
        name: name.into(),
        namespace: "shop".into(),
        addresses: vec![ipb(ip)],
        tunnel_protocol: wds::TunnelProtocol::Hbone as i32,
        service_account: "web".into(),
        node: "node-a".into(),
        canonical_name: "web".into(),
        canonical_revision: "v1".into(),
        workload_name: "web".into(),
        workload_type: wds::WorkloadType::Pod as i32,
        cluster_id: "Kubernetes".into(),
        ..Default::default()
    }
}

fn svc(name: &str, vip: &str, ports_: &[(u32, u32)]) -> wds::Service {
    wds::Service {
        name: name.into(),
        namespace: "shop".into(),
        hostname: format!("{name}.shop.svc.cluster.local"),
        addresses: vec![wds::NetworkAddress {
            network: String::new(),
            address: ipb(vip),
            length: None,
        }],
        ports: ports(ports_).ports,
        ..Default::default()
    }
}

fn refusal(w: &wds::Workload) -> String {
    workload(w).expect_err("refused").to_string()
}

fn service_refusal(s: &wds::Service) -> String {
    service(s).expect_err("refused").to_string()
}

// --- workload ---

#[test]
fn a_pod_maps_onto_the_spec() {
    let mut w = pod(UID, "10.0.0.7");
    w.addresses.push(ipb("fd00::7"));
    w.authorization_policies = vec!["shop/allow-web".into()];
    w.services.insert(WEB.into(), ports(&[(80, 8080)]));
    let got = workload(&w).unwrap();
    let s = &got.spec;
    assert_eq!(
        (s.uid.as_str(), s.name.as_str(), s.namespace.as_str()),
        (UID, "web-1", "shop")
    );
    assert_eq!(s.service_account, "web");
    assert_eq!(s.ips, [ipa("10.0.0.7"), ipa("fd00::7")]);
    assert_eq!(s.node, "node-a");
    assert_eq!(s.protocol, Protocol::Hbone);
    assert_eq!(s.state, LifecycleState::Running);
    assert_eq!(s.workload_name.as_deref(), Some("web"));
    assert_eq!(s.authorization_policies, ["shop/allow-web"]);
    assert_eq!(s.services, [WEB]);
    assert_eq!(
        *s.labels,
        BTreeMap::from([
            (
                "service.istio.io/canonical-name".to_owned(),
                "web".to_owned()
            ),
            (
                "service.istio.io/canonical-revision".to_owned(),
                "v1".to_owned()
            ),
        ]),
        "the labels Istio's metrics read the canonical service and revision from"
    );
    assert!(got.healthy);
    assert!(!got.host_network);
    assert_eq!(got.addresses, s.ips);
    assert_eq!(got.services[WEB], BTreeMap::from([(80, 8080)]));
    assert_eq!(got.capacity, 1, "absent: 1");
    assert_eq!(got.trust_domain, "cluster.local", "istiod's empty");
}

#[test]
fn unset_strings_are_left_out_or_defaulted_as_ztunnel_does() {
    let mut w = pod(UID, "10.0.0.7");
    w.service_account.clear();
    w.canonical_name.clear();
    w.canonical_revision.clear();
    w.workload_name.clear();
    let s = workload(&w).unwrap().spec;
    assert_eq!(s.service_account, "default");
    assert!(s.labels.is_empty());
    assert_eq!(s.workload_name, None);
}

#[test]
fn the_tunnel_protocol_decides_hbone_or_tcp_and_refuses_the_rest() {
    let mut w = pod(UID, "10.0.0.7");
    w.tunnel_protocol = wds::TunnelProtocol::None as i32;
    assert_eq!(workload(&w).unwrap().spec.protocol, Protocol::Tcp);
    w.tunnel_protocol = wds::TunnelProtocol::LegacyIstioMtls as i32;
    assert_eq!(
        refusal(&w),
        "workload Kubernetes//Pod/shop/web-1: tunnel_protocol: LEGACY_ISTIO_MTLS: tidegate does not speak Istio's sidecar mutual TLS"
    );
    w.tunnel_protocol = 7;
    assert_eq!(
        refusal(&w),
        "workload Kubernetes//Pod/shop/web-1: tunnel_protocol: 7 is not a known TunnelProtocol value"
    );
}

#[test]
fn an_unhealthy_workload_is_terminating() {
    let mut w = pod(UID, "10.0.0.7");
    w.status = wds::WorkloadStatus::Unhealthy as i32;
    let got = workload(&w).unwrap();
    assert_eq!(got.spec.state, LifecycleState::Terminating);
    assert!(!got.healthy);
    w.status = 2;
    assert_eq!(
        refusal(&w),
        "workload Kubernetes//Pod/shop/web-1: status: 2 is not a known WorkloadStatus value"
    );
}

#[test]
fn an_address_of_the_wrong_size_is_refused_by_index() {
    let mut w = pod(UID, "10.0.0.7");
    w.addresses.push(Bytes::from_static(&[1, 2, 3, 4, 5]));
    assert_eq!(
        refusal(&w),
        "workload Kubernetes//Pod/shop/web-1: addresses[1]: 5 bytes, not an IPv4 (4) or IPv6 (16) address"
    );
    w.addresses = vec![Bytes::new()];
    assert_eq!(
        refusal(&w),
        "workload Kubernetes//Pod/shop/web-1: addresses[0]: 0 bytes, not an IPv4 (4) or IPv6 (16) address"
    );
}

#[test]
fn a_workload_without_addresses_is_kept_unindexed() {
    let mut w = pod(UID, "10.0.0.7");
    w.addresses.clear();
    w.hostname = "vm.example.com".into();
    let got = workload(&w).unwrap();
    assert!(got.spec.ips.is_empty());
    assert!(got.addresses.is_empty());
}

#[test]
fn a_host_network_workload_keeps_its_address_but_is_not_indexed_by_it() {
    let mut w = pod(UID, "192.168.0.10");
    w.network_mode = wds::NetworkMode::HostNetwork as i32;
    let got = workload(&w).unwrap();
    assert!(got.spec.ips.is_empty());
    assert_eq!(got.addresses, [ipa("192.168.0.10")]);
    assert!(got.host_network);
    w.network_mode = 2;
    assert_eq!(
        refusal(&w),
        "workload Kubernetes//Pod/shop/web-1: network_mode: 2 is not a known NetworkMode value"
    );
}

#[test]
fn capacity_defaults_to_one_when_absent_or_zero() {
    let mut w = pod(UID, "10.0.0.7");
    w.capacity = Some(0);
    assert_eq!(workload(&w).unwrap().capacity, 1);
    w.capacity = Some(5);
    assert_eq!(workload(&w).unwrap().capacity, 5);
}

#[test]
fn another_trust_domain_is_reported_for_the_caller_to_refuse() {
    let mut w = pod(UID, "10.0.0.7");
    // istiod leaves the field empty for cluster.local.
    let unset = workload(&w).unwrap();
    assert_eq!(unset.check_trust_domain("cluster.local"), Ok(()));
    assert_eq!(
        unset.check_trust_domain("example.org").unwrap_err().to_string(),
        "workload Kubernetes//Pod/shop/web-1: trust_domain: \"cluster.local\", not the gateway's \"example.org\": its identity would be derived wrongly"
    );
    w.trust_domain = "example.org".into();
    let named = workload(&w).expect("converted: the caller decides");
    assert_eq!(named.trust_domain, "example.org");
    assert_eq!(named.check_trust_domain("example.org"), Ok(()));
    assert_eq!(
        named.check_trust_domain("cluster.local").unwrap_err().to_string(),
        "workload Kubernetes//Pod/shop/web-1: trust_domain: \"example.org\", not the gateway's \"cluster.local\": its identity would be derived wrongly"
    );
}

#[test]
fn a_workloads_services_are_checked_and_their_unset_target_ports_left_out() {
    let mut w = pod(UID, "10.0.0.7");
    w.services
        .insert(WEB.into(), ports(&[(80, 8080), (9090, 0)]));
    let got = workload(&w).unwrap();
    assert_eq!(got.services[WEB], BTreeMap::from([(80, 8080)]));

    w.services.insert("web".into(), ports(&[]));
    assert_eq!(
        refusal(&w),
        "workload Kubernetes//Pod/shop/web-1: services[\"web\"]: \"web\" is not <namespace>/<hostname>"
    );
    w.services.remove("web");
    w.services.insert(WEB.into(), ports(&[(80, 70000)]));
    assert_eq!(
        refusal(&w),
        "workload Kubernetes//Pod/shop/web-1: services[\"shop/web.shop.svc.cluster.local\"].ports[0].target_port: 70000 is above 65535"
    );
    w.services
        .insert(WEB.into(), ports(&[(80, 80), (65536, 80)]));
    assert_eq!(
        refusal(&w),
        "workload Kubernetes//Pod/shop/web-1: services[\"shop/web.shop.svc.cluster.local\"].ports[1].service_port: 65536 is above 65535"
    );
}

#[test]
fn an_application_tunnel_other_than_none_is_refused() {
    let mut w = pod(UID, "10.0.0.7");
    w.application_tunnel = Some(wds::ApplicationTunnel {
        protocol: wds::application_tunnel::Protocol::None as i32,
        port: 0,
    });
    assert!(workload(&w).is_ok());
    w.application_tunnel = Some(wds::ApplicationTunnel {
        protocol: wds::application_tunnel::Protocol::Proxy as i32,
        port: 15088,
    });
    assert_eq!(
        refusal(&w),
        "workload Kubernetes//Pod/shop/web-1: application_tunnel.protocol: PROXY: tidegate does not write PROXY protocol headers to the application"
    );
    w.application_tunnel = Some(wds::ApplicationTunnel {
        protocol: 3,
        port: 0,
    });
    assert_eq!(
        refusal(&w),
        "workload Kubernetes//Pod/shop/web-1: application_tunnel.protocol: 3 is not a known ApplicationTunnel.Protocol value"
    );
}

#[test]
fn a_workload_without_uid_is_refused_by_namespace_and_name() {
    let mut w = pod(UID, "10.0.0.7");
    w.uid.clear();
    assert_eq!(refusal(&w), "workload shop/web-1: uid: empty");
}

#[test]
fn fields_ztunnel_does_not_check_are_not_read() {
    let mut w = pod(UID, "10.0.0.7");
    w.workload_type = 99;
    w.services.insert(
        WEB.into(),
        wds::PortList {
            ports: vec![wds::Port {
                service_port: 80,
                target_port: 8080,
                app_protocol: 42,
            }],
        },
    );
    assert!(workload(&w).is_ok());
    let mut s = svc("web", "10.96.0.10", &[(80, 8080)]);
    s.visibility = 9;
    assert!(service(&s).is_ok());
}

#[test]
fn a_gateway_address_ztunnel_cannot_read_is_refused() {
    let mut w = pod(UID, "10.0.0.7");
    w.waypoint = Some(wds::GatewayAddress {
        destination: Some(wds::gateway_address::Destination::Hostname(
            wds::NamespacedHostname {
                namespace: "shop".into(),
                hostname: "waypoint.shop.svc.cluster.local".into(),
            },
        )),
        hbone_mtls_port: 15008,
    });
    assert!(workload(&w).is_ok(), "checked, not carried");
    w.waypoint = Some(wds::GatewayAddress {
        destination: None,
        hbone_mtls_port: 15008,
    });
    assert_eq!(
        refusal(&w),
        "workload Kubernetes//Pod/shop/web-1: waypoint: a gateway address with neither a hostname nor an address"
    );
    w.waypoint = None;
    w.network_gateway = Some(wds::GatewayAddress {
        destination: Some(wds::gateway_address::Destination::Address(
            wds::NetworkAddress {
                network: "net2".into(),
                address: Bytes::from_static(&[1, 2]),
                length: None,
            },
        )),
        hbone_mtls_port: 15008,
    });
    assert_eq!(
        refusal(&w),
        "workload Kubernetes//Pod/shop/web-1: network_gateway.address: 2 bytes, not an IPv4 (4) or IPv6 (16) address"
    );

    let mut s = svc("web", "10.96.0.10", &[(80, 8080)]);
    s.waypoint = Some(wds::GatewayAddress {
        destination: None,
        hbone_mtls_port: 15008,
    });
    assert_eq!(
        service_refusal(&s),
        "service shop/web.shop.svc.cluster.local: waypoint: a gateway address with neither a hostname nor an address"
    );
    s.waypoint = None;
    s.weighted_waypoints = vec![wds::WeightedWaypoint {
        destination: None,
        weight: 1,
    }];
    assert_eq!(
        service_refusal(&s),
        "service shop/web.shop.svc.cluster.local: weighted_waypoints[0].destination: empty"
    );
}

// --- service ---

#[test]
fn a_service_maps_onto_the_spec() {
    let mut s = svc("web", "10.96.0.10", &[(80, 8080), (9090, 0)]);
    s.addresses.push(wds::NetworkAddress {
        network: String::new(),
        address: ipb("fd00::10"),
        // A full-length prefix is a single address.
        length: Some(128),
    });
    s.subject_alt_names = vec![
        "spiffe://cluster.local/ns/shop/sa/web".into(),
        // Not a SPIFFE id: ignored, as ztunnel ignores it (never trusted).
        "web.shop.svc".into(),
    ];
    let got = service(&s).unwrap();
    assert_eq!(got.name, "web");
    assert_eq!(got.namespace, "shop");
    assert_eq!(got.key(), "shop/web");
    assert_eq!(got.hostname.as_deref(), Some("web.shop.svc.cluster.local"));
    assert_eq!(got.vips, [ipa("10.96.0.10"), ipa("fd00::10")]);
    let ports: Vec<(u16, Option<TargetPort>, &str)> = got
        .ports
        .iter()
        .map(|p| (p.port, p.target_port.clone(), p.protocol.as_str()))
        .collect();
    assert_eq!(
        ports,
        [
            (80, Some(TargetPort::Number(8080)), "TCP"),
            (9090, Some(TargetPort::PerEndpoint), "TCP"),
        ]
    );
    assert_eq!(
        got.subject_alt_names,
        [SpiffeId::new("cluster.local", "shop", "web")]
    );
    assert_eq!(
        got.endpoints,
        Some(Default::default()),
        "explicit, none yet"
    );
    assert!(got.endpoint_targets.is_empty());
    assert_eq!(got.ip_families, F::Automatic);
    for (wire, want) in [
        (wds::IpFamilies::Ipv4Only, F::Ipv4Only),
        (wds::IpFamilies::Ipv6Only, F::Ipv6Only),
        (wds::IpFamilies::Dual, F::Dual),
    ] {
        s.ip_families = wire as i32;
        assert_eq!(service(&s).unwrap().ip_families, want, "{wire:?}");
    }
}

#[test]
fn a_cidr_vip_or_a_bad_address_is_refused_by_index() {
    let mut s = svc("web", "10.96.0.10", &[(80, 8080)]);
    s.addresses.push(wds::NetworkAddress {
        network: String::new(),
        address: ipb("10.97.0.0"),
        length: Some(16),
    });
    assert_eq!(
        service_refusal(&s),
        "service shop/web.shop.svc.cluster.local: addresses[1]: a CIDR VIP (/16): tidegate routes to single addresses only"
    );
    s.addresses[1].length = Some(33);
    assert_eq!(
        service_refusal(&s),
        "service shop/web.shop.svc.cluster.local: addresses[1]: prefix length 33 is longer than the address (32 bits)"
    );
    s.addresses[1] = wds::NetworkAddress {
        network: String::new(),
        address: Bytes::from_static(&[1, 2, 3]),
        length: None,
    };
    assert_eq!(
        service_refusal(&s),
        "service shop/web.shop.svc.cluster.local: addresses[1]: 3 bytes, not an IPv4 (4) or IPv6 (16) address"
    );
}

#[test]
fn a_service_port_out_of_range_is_refused() {
    let s = svc("web", "10.96.0.10", &[(80, 8080), (70000, 1)]);
    assert_eq!(
        service_refusal(&s),
        "service shop/web.shop.svc.cluster.local: ports[1].service_port: 70000 is above 65535"
    );
    let s = svc("web", "10.96.0.10", &[(80, 80000)]);
    assert_eq!(
        service_refusal(&s),
        "service shop/web.shop.svc.cluster.local: ports[0].target_port: 80000 is above 65535"
    );
}

#[test]
fn a_service_without_its_key_is_refused() {
    let mut s = svc("web", "10.96.0.10", &[]);
    s.hostname.clear();
    assert_eq!(service_refusal(&s), "service shop/: hostname: empty");
    let mut s = svc("web", "10.96.0.10", &[]);
    s.name.clear();
    assert_eq!(
        service_refusal(&s),
        "service shop/web.shop.svc.cluster.local: name: empty"
    );
}

#[test]
fn unknown_service_enums_are_refused() {
    let base = svc("web", "10.96.0.10", &[(80, 8080)]);
    let lb = |routing_preference: Vec<i32>, mode: i32, health_policy: i32| {
        let mut s = base.clone();
        s.load_balancing = Some(wds::LoadBalancing {
            routing_preference,
            mode,
            health_policy,
        });
        s
    };
    assert!(service(&lb(vec![4, 2], 1, 1)).is_ok(), "known values");
    let cases = [
        (
            {
                let mut s = base.clone();
                s.ip_families = 4;
                s
            },
            "ip_families: 4 is not a known IPFamilies value",
        ),
        (
            lb(vec![4, 7], 0, 0),
            "load_balancing.routing_preference[1]: 7 is not a known LoadBalancing.Scope value",
        ),
        (
            lb(vec![], 4, 0),
            "load_balancing.mode: 4 is not a known LoadBalancing.Mode value",
        ),
        (
            lb(vec![], 0, 2),
            "load_balancing.health_policy: 2 is not a known LoadBalancing.HealthPolicy value",
        ),
    ];
    for (s, want) in cases {
        assert_eq!(
            service_refusal(&s),
            format!("service shop/web.shop.svc.cluster.local: {want}")
        );
    }
}

// --- assemble ---

fn converted(w: &wds::Workload) -> IstioWorkload {
    workload(w).unwrap()
}

/// Converted and held by resource name (the uid), as the source holds them.
fn held(workloads: &[wds::Workload]) -> BTreeMap<String, IstioWorkload> {
    workloads
        .iter()
        .map(|w| (w.uid.clone(), converted(w)))
        .collect()
}

#[test]
fn workloads_become_the_endpoints_of_the_services_they_name() {
    let mut a = pod("Kubernetes//Pod/shop/web-a", "10.0.0.1");
    a.services.insert(WEB.into(), ports(&[(80, 8080)]));
    let mut b = pod("Kubernetes//Pod/shop/web-b", "10.0.0.2");
    b.status = wds::WorkloadStatus::Unhealthy as i32;
    b.capacity = Some(3);
    b.services
        .insert(WEB.into(), ports(&[(80, 8080), (9090, 9091)]));
    b.services.insert(
        "shop/gone.shop.svc.cluster.local".into(),
        ports(&[(80, 80)]),
    );
    let lone = pod("Kubernetes//Pod/shop/lone", "10.0.0.3");
    let web = service(&svc("web", "10.96.0.10", &[(80, 8080), (9090, 0)])).unwrap();
    let api = service(&svc("api", "10.96.0.11", &[(443, 8443)])).unwrap();
    let held = BTreeMap::from([
        (b.uid.clone(), converted(&b)),
        (lone.uid.clone(), converted(&lone)),
        (a.uid.clone(), converted(&a)),
    ]);
    let services = BTreeMap::from([(WEB.to_owned(), web), ("shop/api".to_owned(), api)]);

    let (specs, services) = assemble(&held, &services);

    let uids: Vec<&str> = specs.iter().map(|s| s.uid.as_str()).collect();
    assert_eq!(
        uids,
        [
            "Kubernetes//Pod/shop/lone",
            "Kubernetes//Pod/shop/web-a",
            "Kubernetes//Pod/shop/web-b"
        ]
    );
    assert_eq!(specs[1].services, ["shop/web"], "the held Service's key");
    assert_eq!(
        specs[2].services,
        ["shop/web"],
        "a Service not held is left out"
    );
    assert!(specs[0].services.is_empty());
    let keys: Vec<String> = services.iter().map(|s| s.key()).collect();
    assert_eq!(keys, ["shop/api", "shop/web"]);
    assert_eq!(services[0].endpoints, Some(Default::default()));
    let web = &services[1];
    assert_eq!(
        web.endpoints,
        Some(imbl::OrdMap::from(vec![
            (
                "Kubernetes//Pod/shop/web-a",
                Conditions {
                    ready: true,
                    serving: true,
                    terminating: false
                }
            ),
            (
                "Kubernetes//Pod/shop/web-b",
                Conditions {
                    ready: false,
                    serving: true,
                    terminating: true
                }
            ),
        ]))
    );
    // web-a maps 80 → 8080 as the Service does: it brings nothing of
    // its own. web-b brings its weight and the mapping the Service lacks.
    assert_eq!(
        web.endpoint_targets,
        imbl::OrdMap::from(vec![(
            "Kubernetes//Pod/shop/web-b",
            EndpointTarget {
                ports: BTreeMap::from([(9090, 9091)]),
                ips: vec![],
                capacity: 3
            }
        ),])
    );
}

#[test]
fn the_store_routes_each_endpoint_by_its_own_port_mapping() {
    // web-a maps 9090 itself; web-b does not, and the Service's 9090 has
    // target port 0: web-b is no endpoint of 9090. Port 80's target is the
    // Service's for web-b, web-a's own for web-a.
    let mut a = pod("Kubernetes//Pod/shop/web-a", "10.0.0.1");
    a.services
        .insert(WEB.into(), ports(&[(80, 8081), (9090, 9443)]));
    let mut b = pod("Kubernetes//Pod/shop/web-b", "10.0.0.2");
    b.services.insert(WEB.into(), ports(&[]));
    b.capacity = Some(4);
    // A host-network pod: reachable as an endpoint at its node's address,
    // yet its address names no workload.
    let mut h = pod("Kubernetes//Pod/shop/web-h", "192.168.0.10");
    h.network_mode = wds::NetworkMode::HostNetwork as i32;
    h.tunnel_protocol = wds::TunnelProtocol::None as i32;
    h.services.insert(WEB.into(), ports(&[(80, 8080)]));
    let web = service(&svc("web", "10.96.0.10", &[(80, 8080), (9090, 0)])).unwrap();
    let services = BTreeMap::from([(WEB.to_owned(), web)]);
    let (specs, services) = assemble(&held(&[a, b, h]), &services);

    let store = WorkloadStore::new("cluster.local", "node-a");
    store.publish(WholeSet::new(specs).services(services));
    let snap = store.snapshot();
    let svc = snap.service_by_vip(ipa("10.96.0.10"), 80).unwrap();
    let eps = |port: u16| -> Vec<(String, IpAddr, u16, u32)> {
        svc.endpoints[&port]
            .iter()
            .map(|e| (e.workload.uid().to_owned(), e.ip, e.target_port, e.capacity))
            .collect()
    };
    assert_eq!(
        eps(80),
        [
            (
                "Kubernetes//Pod/shop/web-a".into(),
                ipa("10.0.0.1"),
                8081,
                1
            ),
            (
                "Kubernetes//Pod/shop/web-b".into(),
                ipa("10.0.0.2"),
                8080,
                4
            ),
            (
                "Kubernetes//Pod/shop/web-h".into(),
                ipa("192.168.0.10"),
                8080,
                1
            ),
        ]
    );
    assert_eq!(
        eps(9090),
        [(
            "Kubernetes//Pod/shop/web-a".into(),
            ipa("10.0.0.1"),
            9443,
            1
        )]
    );
    assert!(svc.unresolved.contains(&(
        "Kubernetes//Pod/shop/web-b".to_owned(),
        9090,
        "no_target_port"
    )));
    assert!(snap.by_ip(ipa("192.168.0.10")).is_none(), "host network");
    assert!(snap.by_uid("Kubernetes//Pod/shop/web-h").is_some());
    assert_eq!(
        snap.by_ip(ipa("10.0.0.1")).map(|w| w.uid()),
        Some("Kubernetes//Pod/shop/web-a")
    );
}

#[test]
fn a_shared_address_goes_to_a_pod_then_hbone_then_a_healthy_one() {
    let entry = {
        let mut w = pod(
            "Kubernetes/networking.istio.io/WorkloadEntry/shop/vm",
            "10.0.0.9",
        );
        w.name = "vm".into();
        w
    };
    let mut old = pod("Kubernetes//Pod/shop/web-old", "10.0.0.9");
    old.status = wds::WorkloadStatus::Unhealthy as i32;
    old.addresses.push(ipb("fd00::9"));
    let new = pod("Kubernetes//Pod/shop/web-new", "10.0.0.9");
    let mut plain = pod("Kubernetes//Pod/shop/web-plain", "10.0.0.9");
    plain.tunnel_protocol = wds::TunnelProtocol::None as i32;

    let ips = |workloads: &[wds::Workload]| -> BTreeMap<String, Vec<IpAddr>> {
        let (specs, _) = assemble(&held(workloads), &BTreeMap::new());
        specs.into_iter().map(|s| (s.name, s.ips)).collect()
    };
    let got = ips(&[entry, old.clone(), new, plain.clone()]);
    assert_eq!(got["web-new"], [ipa("10.0.0.9")]);
    assert_eq!(got["web-old"], [ipa("fd00::9")], "keeps its other address");
    assert!(got["vm"].is_empty(), "a pod wins over a WorkloadEntry");
    assert!(got["web-plain"].is_empty(), "HBONE wins over plain TCP");
    // Only the unhealthy pod and the plain one: HBONE first.
    let got = ips(&[plain, old]);
    assert_eq!(got["web-old"], [ipa("10.0.0.9"), ipa("fd00::9")]);
    assert!(got["web-plain"].is_empty());
}

/// Two workloads of the same standing on one address (a second healthy
/// HBONE pod on echo's address, another service account): neither has
/// it — whichever name sorts last never decides whose identity the
/// address presents. The one being deleted gives way.
#[test]
fn two_workloads_of_the_same_standing_on_one_address_get_neither() {
    let echo = pod("Kubernetes//Pod/shop/echo", "10.0.0.9");
    let mut evil = pod("Kubernetes//Pod/shop/zz-evil", "10.0.0.9");
    evil.service_account = "evil".into();
    evil.addresses.push(ipb("10.0.0.10"));
    let ips = |workloads: &[wds::Workload]| -> BTreeMap<String, Vec<IpAddr>> {
        let (specs, _) = assemble(&held(workloads), &BTreeMap::new());
        specs.into_iter().map(|s| (s.name, s.ips)).collect()
    };
    let got = ips(&[echo.clone(), evil.clone()]);
    assert!(got["echo"].is_empty(), "{got:?}");
    assert_eq!(got["zz-evil"], [ipa("10.0.0.10")], "keeps its own address");
    // echo being deleted (UNHEALTHY): the other has it.
    let mut leaving = echo;
    leaving.status = wds::WorkloadStatus::Unhealthy as i32;
    let got = ips(&[leaving, evil]);
    assert_eq!(got["zz-evil"], [ipa("10.0.0.9"), ipa("10.0.0.10")]);
    assert!(got["echo"].is_empty());
}

#[test]
fn ten_thousand_workloads_across_two_thousand_services() {
    let services: BTreeMap<String, ServiceSpec> = (0..2000u32)
        .map(|i| {
            let vip = format!("10.96.{}.{}", i / 256, i % 256);
            let s = svc(&format!("s{i}"), &vip, &[(80, 8080)]);
            (format!("shop/{}", s.hostname), service(&s).unwrap())
        })
        .collect();
    let workloads: BTreeMap<String, IstioWorkload> = (0..10_000u32)
        .map(|i| {
            let mut w = pod(
                &format!("Kubernetes//Pod/shop/p{i}"),
                &format!("10.1.{}.{}", i / 256, i % 256),
            );
            w.services.insert(
                format!("shop/s{}.shop.svc.cluster.local", i % 2000),
                ports(&[(80, 8080)]),
            );
            (w.uid.clone(), converted(&w))
        })
        .collect();
    let (specs, services) = assemble(&workloads, &services);
    assert_eq!(specs.len(), 10_000);
    assert_eq!(services.len(), 2000);
    assert!(services
        .iter()
        .all(|s| s.endpoints.as_ref().is_some_and(|e| e.len() == 5)));
}

// --- waypoints ---

fn gateway_at(ip: &str, network: &str) -> wds::GatewayAddress {
    wds::GatewayAddress {
        destination: Some(wds::gateway_address::Destination::Address(
            wds::NetworkAddress {
                network: network.into(),
                address: ipb(ip),
                length: None,
            },
        )),
        hbone_mtls_port: 15008,
    }
}

#[test]
fn a_services_weighted_waypoints_win_over_its_waypoint_unless_none_has_weight() {
    let mut s = svc("web", "10.96.0.1", &[(80, 8080)]);
    s.waypoint = Some(gateway_at("10.0.0.9", ""));
    s.weighted_waypoints = vec![
        wds::WeightedWaypoint {
            destination: Some(gateway_at("10.0.0.7", "")),
            weight: 3,
        },
        wds::WeightedWaypoint {
            destination: Some(gateway_at("10.0.0.8", "")),
            weight: 0,
        },
    ];
    let got = service(&s).unwrap().waypoints;
    let at: Vec<(WaypointAddress, u32)> =
        got.iter().map(|w| (w.address.clone(), w.weight)).collect();
    assert_eq!(
        at,
        [
            (WaypointAddress::Ip(ipa("10.0.0.7")), 3),
            (WaypointAddress::Ip(ipa("10.0.0.8")), 0)
        ]
    );
    for w in &mut s.weighted_waypoints {
        w.weight = 0;
    }
    let got = service(&s).unwrap().waypoints;
    assert_eq!(got.len(), 1, "all weights 0: the waypoint");
    assert_eq!(got[0].address, WaypointAddress::Ip(ipa("10.0.0.9")));
    assert_eq!((got[0].port, got[0].remote_network), (15008, false));
    s.waypoint = None;
    assert!(service(&s).unwrap().waypoints.is_empty(), "none");
}

#[test]
fn a_waypoint_on_another_network_and_a_workload_behind_a_gateway_are_marked() {
    let mut w = pod(UID, "10.1.0.1");
    w.network = "net-1".into();
    w.waypoint = Some(gateway_at("10.0.0.9", "net-2"));
    let c = workload(&w).unwrap();
    let wp = c.spec.waypoint.expect("carried");
    assert!(wp.remote_network, "net-2 is not the workload's net-1");
    assert!(!c.spec.other_network);
    w.waypoint = Some(gateway_at("10.0.0.9", "net-1"));
    assert!(!workload(&w).unwrap().spec.waypoint.unwrap().remote_network);
    w.network_gateway = Some(gateway_at("10.0.0.10", "net-1"));
    assert!(
        workload(&w).unwrap().spec.other_network,
        "behind a network gateway"
    );
    let mut s = svc("web", "10.96.0.1", &[(80, 8080)]);
    s.waypoint = Some(wds::GatewayAddress {
        destination: Some(wds::gateway_address::Destination::Hostname(
            wds::NamespacedHostname {
                namespace: "shop".into(),
                hostname: "wp.shop.svc.cluster.local".into(),
            },
        )),
        hbone_mtls_port: 15008,
    });
    assert_eq!(
        service(&s).unwrap().waypoints[0].address,
        WaypointAddress::Hostname {
            namespace: "shop".into(),
            hostname: "wp.shop.svc.cluster.local".into()
        }
    );
}
