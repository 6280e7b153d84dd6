//! Endpoint choice weighed by capacity: a random draw in proportion to it,
//! and `p2c` comparing open streams per unit of capacity.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;

use super::*;
use crate::workloads::services::{Conditions, EndpointTarget, ServicePort, ServiceSpec};
use crate::workloads::WholeSet;
use crate::workloads::{WorkloadSpec, WorkloadStore};
use tidegate_protocol::tls::{DevCa, TlsContext, TlsMetrics};

fn picker(choice: EndpointChoice) -> EndpointPicker {
    let mut reg = Registry::default();
    let ca = DevCa::new(Duration::from_secs(3600)).unwrap();
    let tls = Arc::new(TlsContext::new(
        Arc::new(ca),
        "cluster.local",
        TlsMetrics::register(&mut reg),
    ));
    let pool = Pool::new(
        tls,
        Default::default(),
        Default::default(),
        Default::default(),
        None,
        &mut reg,
    );
    let metrics = EndpointMetrics::register(&mut reg);
    let skips = Skips {
        goaway: Duration::ZERO,
        failing: Duration::from_secs(5),
    };
    EndpointPicker::new(pool, 15008, choice, skips, metrics)
}

fn workload(uid: &str, ip: &str) -> WorkloadSpec {
    serde_yaml::from_str(&format!(
        "{{uid: {uid}, name: {uid}, namespace: ns, ips: [{ip}], node: n}}"
    ))
    .unwrap()
}

/// Service web with endpoints a (capacity 1) and b (capacity 3), each
/// `ready` as given.
fn web(ready: [bool; 2]) -> Arc<Service> {
    let conditions = |ready| Conditions {
        ready,
        serving: true,
        terminating: !ready,
    };
    let spec = ServiceSpec {
        name: "web".into(),
        namespace: "ns".into(),
        vips: vec!["10.96.0.1".parse().unwrap()],
        ports: vec![ServicePort {
            port: 80,
            target_port: None,
            protocol: "TCP".into(),
        }],
        endpoints: Some(
            [("a", conditions(ready[0])), ("b", conditions(ready[1]))]
                .into_iter()
                .map(|(uid, c)| (std::sync::Arc::<str>::from(uid), c))
                .collect(),
        ),
        endpoint_targets: [(
            std::sync::Arc::<str>::from("b"),
            EndpointTarget {
                capacity: 3,
                ..Default::default()
            },
        )]
        .into_iter()
        .collect(),
        hostname: None,
        subject_alt_names: Vec::new(),
        waypoints: Vec::new(),
        ip_families: Default::default(),
        canonical: false,
        visibility: Default::default(),
    };
    let store = WorkloadStore::new("cluster.local", "n");
    store.publish(
        WholeSet::new(vec![workload("a", "10.0.0.1"), workload("b", "10.0.0.2")])
            .services(vec![spec]),
    );
    store.snapshot().services().next().unwrap().clone()
}

/// How many of `n` picks land on b.
fn to_b(picker: &EndpointPicker, svc: &Service, n: usize) -> usize {
    (0..n)
        .filter(|_| picker.pick(svc, 80).unwrap().workload.uid() == "b")
        .count()
}

#[test]
fn a_random_choice_follows_capacity() {
    let p = picker(EndpointChoice::Random);
    let b = to_b(&p, &web([true, true]), 8_000);
    // 6,000 expected (3 of 4); the binomial deviation is 39.
    assert!((5_750..=6_250).contains(&b), "{b} of 8,000");
}

#[test]
fn p2c_with_no_load_follows_capacity_too() {
    // No streams open anywhere: the lighter of two is the first drawn.
    let p = picker(EndpointChoice::P2c);
    let b = to_b(&p, &web([true, true]), 8_000);
    assert!((5_750..=6_250).contains(&b), "{b} of 8,000");
}

#[test]
fn the_fallback_tiers_weigh_capacity_as_well() {
    // Both terminating: the full pass's terminating fallback chooses.
    let p = picker(EndpointChoice::Random);
    let b = to_b(&p, &web([false, false]), 8_000);
    assert!((5_750..=6_250).contains(&b), "{b} of 8,000");
}

#[test]
fn weighted_never_draws_the_excluded_one() {
    let svc = web([true, true]);
    let eps: Vec<&Endpoint> = svc.endpoints[&80].iter().collect();
    for _ in 0..1_000 {
        assert_eq!(weighted(&eps, Some(1)), 0);
        assert_eq!(weighted(&eps, Some(0)), 1);
    }
}

#[test]
fn the_dump_writes_both_families_of_a_dual_stack_endpoint_alike() {
    let file = "workloads:
  - {uid: a, name: a, namespace: ns, ips: [10.0.0.1, 'fd00::1'], node: n, services: [web]}
  - {uid: b, name: b, namespace: ns, ips: ['fd00::2'], node: n, services: [web]}
services:
  - {name: web, namespace: ns, vips: [10.96.0.1, 'fd00:96::1'], ports: [{port: 80, target_port: 8080}]}
";
    let parsed = crate::workloads::parse_file(file).unwrap();
    let store = WorkloadStore::new("cluster.local", "n");
    store.publish(WholeSet::new(parsed.workloads).services(parsed.services));
    let svc = store.snapshot().services().next().unwrap().clone();
    let dump = serde_json::to_value(picker(EndpointChoice::P2c).explain(&svc)).unwrap();
    assert_eq!(dump[0]["addr"], "10.0.0.1:8080", "{dump}");
    assert_eq!(dump[0]["other_family_addr"], "[fd00::1]:8080", "{dump}");
    // An IPv6-only endpoint of a Service whose first VIP is IPv4: kept.
    assert_eq!(dump[1]["addr"], "[fd00::2]:8080", "{dump}");
    assert!(dump[1].get("other_family_addr").is_none(), "{dump}");
}
