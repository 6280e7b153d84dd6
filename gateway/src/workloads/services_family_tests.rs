//! The endpoint address of a Service by IP family, as ztunnel picks it: the
//! address of the dialed VIP's family, else the endpoint's other one.

use crate::workloads::WholeSet;
use std::net::IpAddr;

use super::{pick_ips, Endpoint, IpFamilies};
use crate::workloads::file::parse_file;
use crate::workloads::WorkloadStore;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|s| ip(s)).collect()
}

#[test]
fn the_vip_family_is_preferred_and_the_other_is_kept() {
    let dual = ips(&["10.0.0.1", "fd00::1"]);
    assert_eq!(
        pick_ips(&dual, true),
        Some((ip("10.0.0.1"), Some(ip("fd00::1"))))
    );
    assert_eq!(
        pick_ips(&dual, false),
        Some((ip("fd00::1"), Some(ip("10.0.0.1"))))
    );
    // Of several of one family, the first (the pod's primary address).
    let two_v6 = ips(&["fd00::1", "fd00::2", "10.0.0.1"]);
    assert_eq!(
        pick_ips(&two_v6, false),
        Some((ip("fd00::1"), Some(ip("10.0.0.1"))))
    );
}

#[test]
fn an_endpoint_of_the_other_family_only_is_reached_not_dropped() {
    assert_eq!(
        pick_ips(&ips(&["fd00::1"]), true),
        Some((ip("fd00::1"), None))
    );
    assert_eq!(
        pick_ips(&ips(&["10.0.0.1"]), false),
        Some((ip("10.0.0.1"), None))
    );
    assert_eq!(pick_ips(&[], true), None);
}

/// `web`: dual-stack VIPs 10.96.0.1 and fd00:96::1; `a` dual-stack, `b`
/// IPv6 only, `c` IPv4 only.
const FILE: &str = "workloads:
  - {uid: a, name: a, namespace: shop, ips: [10.0.0.1, 'fd00::1'], node: n, services: [web]}
  - {uid: b, name: b, namespace: shop, ips: ['fd00::2'], node: n, services: [web]}
  - {uid: c, name: c, namespace: shop, ips: [10.0.0.3], node: n, services: [web]}
services:
  - {name: web, namespace: shop, vips: [10.96.0.1, 'fd00:96::1'], ports: [{port: 80, target_port: 8080}]}
";

fn endpoints(store: &WorkloadStore, vip: &str) -> Vec<(String, IpAddr)> {
    let snap = store.snapshot();
    let svc = snap
        .service_by_vip(ip(vip), 80)
        .expect("the Service by either VIP");
    assert!(svc.unresolved.is_empty(), "{:?}", svc.unresolved);
    svc.endpoints[&80]
        .iter()
        .map(|e: &Endpoint| (e.workload.uid().to_owned(), e.ip_for(ip(vip))))
        .collect()
}

#[test]
fn a_dual_stack_service_reaches_each_endpoint_by_the_dialed_vips_family() {
    let parsed = parse_file(FILE).unwrap();
    let store = WorkloadStore::new("cluster.local", "n");
    store.publish(WholeSet::new(parsed.workloads).services(parsed.services));
    let by = |list: &[(&str, &str)]| -> Vec<(String, IpAddr)> {
        list.iter().map(|(u, a)| (u.to_string(), ip(a))).collect()
    };
    assert_eq!(
        endpoints(&store, "10.96.0.1"),
        by(&[("a", "10.0.0.1"), ("b", "fd00::2"), ("c", "10.0.0.3")]),
    );
    assert_eq!(
        endpoints(&store, "fd00:96::1"),
        by(&[("a", "fd00::1"), ("b", "fd00::2"), ("c", "10.0.0.3")]),
    );
}

#[test]
fn an_ipv6_only_service_reaches_its_ipv6_endpoints() {
    let file = FILE.replace("vips: [10.96.0.1, 'fd00:96::1']", "vips: ['fd00:96::1']");
    let parsed = parse_file(&file).unwrap();
    let store = WorkloadStore::new("cluster.local", "n");
    store.publish(WholeSet::new(parsed.workloads).services(parsed.services));
    let got = endpoints(&store, "fd00:96::1");
    assert_eq!(got[0], ("a".to_owned(), ip("fd00::1")));
    assert_eq!(got[1], ("b".to_owned(), ip("fd00::2")));
}

/// istiod's `ip_families` restricts the addresses as ztunnel does: an
/// IPv4-only Service reaches its dual-stack endpoint at its IPv4 address
/// whichever VIP was dialed, and an endpoint with IPv6 alone is none of
/// its endpoints (unresolved, with the reason), never reached in the
/// family the Service excludes; `Dual` keeps both, as without a
/// restriction.
#[test]
fn the_services_ip_families_restrict_its_endpoint_addresses() {
    let parsed = parse_file(FILE).unwrap();
    let store = WorkloadStore::new("cluster.local", "n");
    // Under `families`, dialing `vip`: each endpoint's address, and the
    // endpoints left out with why.
    let under = |families: IpFamilies, vip: &str| {
        let mut services = parsed.services.clone();
        services[0].ip_families = families;
        store.publish(WholeSet::new(parsed.workloads.clone()).services(services));
        let snap = store.snapshot();
        let svc = snap.service_by_vip(ip(vip), 80).unwrap();
        let reached: Vec<(String, IpAddr)> = svc.endpoints[&80]
            .iter()
            .map(|e| (e.workload.uid().to_owned(), e.ip_for(ip(vip))))
            .collect();
        (reached, svc.unresolved.clone())
    };
    let by = |list: &[(&str, &str)]| -> Vec<(String, IpAddr)> {
        list.iter().map(|(u, a)| (u.to_string(), ip(a))).collect()
    };
    let left_out = |uid: &str| vec![(uid.to_owned(), 80, "no_address_of_the_service_family")];
    assert_eq!(
        under(IpFamilies::Ipv4Only, "fd00:96::1"),
        (by(&[("a", "10.0.0.1"), ("c", "10.0.0.3")]), left_out("b"))
    );
    assert_eq!(
        under(IpFamilies::Ipv6Only, "10.96.0.1"),
        (by(&[("a", "fd00::1"), ("b", "fd00::2")]), left_out("c"))
    );
    assert_eq!(
        under(IpFamilies::Dual, "fd00:96::1"),
        (
            by(&[("a", "fd00::1"), ("b", "fd00::2"), ("c", "10.0.0.3")]),
            vec![]
        )
    );
}
