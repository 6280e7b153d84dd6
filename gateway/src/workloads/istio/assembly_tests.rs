use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use tidegate_xds::workload as wds;

use super::*;
use crate::workloads::istio::convert::{self as cv, IstioWorkload};
use crate::workloads::WholeSet;
use crate::workloads::{WorkloadSnapshot, WorkloadStore};

fn ipb(ip: IpAddr) -> Bytes {
    match ip {
        IpAddr::V4(v4) => Bytes::copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => Bytes::copy_from_slice(&v6.octets()),
    }
}

fn host(svc: usize) -> String {
    format!("shop/s{svc}.shop.svc.cluster.local")
}

/// Pod `i` at `ip`, on node `node-{i % 3}` (node-0 is the gateway's),
/// healthy or not, an endpoint of the Services `services`.
fn pod(i: usize, ip: IpAddr, healthy: bool, plain: bool, services: &[usize]) -> IstioWorkload {
    let uid = format!("Kubernetes//Pod/shop/p{i}");
    let w = wds::Workload {
        uid: uid.clone(),
        name: format!("p{i}"),
        namespace: "shop".into(),
        addresses: vec![ipb(ip)],
        tunnel_protocol: if plain {
            wds::TunnelProtocol::None
        } else {
            wds::TunnelProtocol::Hbone
        } as i32,
        service_account: "web".into(),
        node: format!("node-{}", i % 3),
        status: if healthy {
            wds::WorkloadStatus::Healthy
        } else {
            wds::WorkloadStatus::Unhealthy
        } as i32,
        workload_type: wds::WorkloadType::Pod as i32,
        cluster_id: "Kubernetes".into(),
        services: services
            .iter()
            .map(|s| {
                let port = wds::Port {
                    service_port: 80,
                    target_port: 8080 + *s as u32,
                    app_protocol: 0,
                };
                (host(*s), wds::PortList { ports: vec![port] })
            })
            .collect(),
        ..Default::default()
    };
    cv::workload(&w).unwrap()
}

fn service(i: usize, vip_generation: u8) -> crate::workloads::services::ServiceSpec {
    let s = wds::Service {
        name: format!("s{i}"),
        namespace: "shop".into(),
        hostname: format!("s{i}.shop.svc.cluster.local"),
        addresses: vec![wds::NetworkAddress {
            network: String::new(),
            address: ipb(IpAddr::from([10, 96, vip_generation, i as u8])),
            length: None,
        }],
        ports: vec![wds::Port {
            service_port: 80,
            target_port: 0,
            app_protocol: 0,
        }],
        ..Default::default()
    };
    cv::service(&s).unwrap()
}

/// What a snapshot holds, compared whole: every workload's spec and
/// identity, the address index, every Service's spec and resolved
/// endpoints, the VIP index, the local pods' membership.
fn held(s: &WorkloadSnapshot) -> String {
    let mut out = String::new();
    for w in s.iter() {
        out += &format!("W {:?} {} local={}\n", w.spec, w.identity, w.local);
        for ip in &w.spec.ips {
            let owner = s.by_ip(*ip).map(|o| o.uid());
            out += &format!("  ip {ip} -> {owner:?}\n");
        }
        out += &format!("  member {:?}\n", s.membership(w.uid()));
    }
    for svc in s.services() {
        out += &format!("S {:?}\n", svc.spec);
        for (port, eps) in &svc.endpoints {
            for e in eps {
                out += &format!(
                    "  {port} -> {} {} {} {:?} {}\n",
                    e.workload.uid(),
                    e.ip,
                    e.target_port,
                    e.conditions,
                    e.capacity
                );
            }
        }
        for vip in &svc.spec.vips {
            let at = s.service_by_vip(*vip, 80).map(|x| x.key());
            out += &format!("  vip {vip} -> {at:?}\n");
        }
        out += &format!("  unresolved {:?}\n", svc.unresolved);
    }
    let locals: Vec<&str> = s.locals().map(|w| w.uid()).collect();
    out += &format!("locals {locals:?}\n");
    out
}

/// The whole-set path: `assemble` of everything held, published whole.
fn whole(
    workloads: &BTreeMap<String, IstioWorkload>,
    services: &BTreeMap<String, crate::workloads::services::ServiceSpec>,
) -> Arc<WorkloadSnapshot> {
    let store = WorkloadStore::new("cluster.local", "node-0");
    let (specs, services) = cv::assemble(workloads, services);
    store.publish(
        WholeSet::new(specs)
            .services(services)
            .policies(Default::default())
            .members_by_protocol(crate::workloads::membership::Reason::Istio),
    );
    store.snapshot()
}

/// Takes the assembly's delta, rebuilding from `store`, and applies it
/// there (as the istiod source does); returns what was applied.
fn take(assembly: &mut Assembly, store: &WorkloadStore) -> Delta {
    let delta = assembly.take_delta(|uid| store.spec(uid));
    store.apply(delta.clone());
    delta
}

/// The shape of a random run: how many pods, Services and addresses, and
/// how many responses of how many changes.
struct Shape {
    seed: u64,
    pods: usize,
    services: usize,
    /// Addresses the pods draw from: fewer than pods, claims collide.
    addresses: u16,
    responses: usize,
    changes: usize,
    /// Pods (and every Service) put in one first response before the
    /// random ones: 1,024 pods or more take the store's bulk path.
    initial: usize,
}

/// Random updates — pods added, changed (health, protocol, Services
/// named, an address taken from another pod), removed; Services added,
/// moved to another VIP, removed — applied one response at a time
/// through the assembly, match after every response what `assemble` of
/// the whole set gives.
#[test]
fn updates_applied_as_deltas_match_the_whole_set_assembled() {
    deltas_match_the_whole_set(Shape {
        seed: 52,
        pods: 40,
        services: 8,
        addresses: 30,
        responses: 300,
        changes: 6,
        initial: 0,
    });
}

/// The same with Services of hundreds of endpoints: each endpoint change
/// is applied alone to lists of several chunks.
#[test]
fn endpoint_changes_in_large_services_match_the_whole_set_assembled() {
    let endpoints = deltas_match_the_whole_set(Shape {
        seed: 53,
        pods: 600,
        services: 2,
        addresses: 2000,
        responses: 150,
        changes: 12,
        initial: 0,
    });
    assert!(
        endpoints > 2 * crate::workloads::endpoint_list::CHUNK,
        "{endpoints} endpoints in the largest Service"
    );
}

/// The same after a first answer of thousands of pods, which the store
/// applies in bulk (in uid order, its Services resolved against a table of
/// the new workloads), then updates.
#[test]
fn a_bulk_first_answer_then_updates_match_the_whole_set_assembled() {
    deltas_match_the_whole_set(Shape {
        seed: 54,
        pods: 3000,
        services: 40,
        addresses: 2500,
        responses: 60,
        changes: 12,
        initial: 3000,
    });
}

/// Runs `shape`; the endpoints of the largest Service at the end.
fn deltas_match_the_whole_set(shape: Shape) -> usize {
    let mut rng = fastrand::Rng::with_seed(shape.seed);
    let store = WorkloadStore::new("cluster.local", "node-0");
    let mut assembly = Assembly::default();
    let mut workloads = BTreeMap::new();
    let mut services = BTreeMap::new();
    let mut deltas_seen = 0;
    if shape.initial > 0 {
        for s in 0..shape.services {
            assembly.put_service(host(s), service(s, 0));
            services.insert(host(s), service(s, 0));
        }
        for i in 0..shape.initial {
            let n = rng.u16(1..shape.addresses).to_be_bytes();
            let ip = IpAddr::from([10, 0, n[0], n[1]]);
            let named: Vec<usize> = (0..rng.usize(0..3))
                .map(|_| rng.usize(0..shape.services))
                .collect();
            let mut w = pod(i, ip, rng.bool(), rng.u8(0..5) == 0, &named);
            put(&mut assembly, w.spec.uid.clone(), w.clone());
            w.mark_starting();
            workloads.insert(w.spec.uid.clone(), w);
        }
        let delta = take(&mut assembly, &store);
        assert!(
            delta.workloads.len() >= shape.initial / 2,
            "one bulk response"
        );
        let expected = whole(&workloads, &services);
        assert_eq!(held(&store.snapshot()), held(&expected), "after the first");
    }
    for response in 0..shape.responses {
        for _ in 0..rng.usize(1..shape.changes) {
            let i = rng.usize(0..shape.pods);
            match rng.u8(0..10) {
                0..=5 => {
                    // Few addresses for many pods: claims collide.
                    let n = rng.u16(1..shape.addresses).to_be_bytes();
                    let ip = IpAddr::from([10, 0, n[0], n[1]]);
                    let named: Vec<usize> = (0..rng.usize(0..3))
                        .map(|_| rng.usize(0..shape.services))
                        .collect();
                    let w = pod(i, ip, rng.bool(), rng.u8(0..5) == 0, &named);
                    let name = w.spec.uid.clone();
                    put(&mut assembly, name.clone(), w.clone());
                    services.remove(&name);
                    // The whole set, as the source remembers it: UNHEALTHY
                    // and never HEALTHY while held is starting.
                    let mut w = w;
                    match workloads.get(&name) {
                        Some(p) if same(p, &w) => continue,
                        Some(p) if p.healthy || !p.starting => {}
                        _ => w.mark_starting(),
                    }
                    workloads.insert(name, w);
                }
                6 => {
                    let name = format!("Kubernetes//Pod/shop/p{i}");
                    assert_eq!(assembly.remove(&name), workloads.remove(&name).is_some());
                }
                7 | 8 => {
                    let s = rng.usize(0..shape.services);
                    let spec = service(s, rng.u8(0..2));
                    let name = host(s);
                    assembly.put_service(name.clone(), spec.clone());
                    services.insert(name, spec);
                }
                _ => {
                    let name = host(rng.usize(0..shape.services));
                    assert_eq!(assembly.remove(&name), services.remove(&name).is_some());
                }
            }
        }
        let delta = take(&mut assembly, &store);
        deltas_seen += delta.workloads.len() + delta.services.len() + delta.endpoints.len();
        let expected = whole(&workloads, &services);
        assert_eq!(
            held(&store.snapshot()),
            held(&expected),
            "after response {response}"
        );
    }
    assert!(deltas_seen > 0);
    let snap = store.snapshot();
    snap.services()
        .flat_map(|s| s.endpoints.values().map(|l| l.len()))
        .max()
        .unwrap_or(0)
}

/// One pod's update puts that pod and its endpoint in the Services it
/// names, nothing else: the delta is the size of the change, not of the
/// set nor of the Service.
#[test]
fn a_pods_update_touches_only_it_and_its_services() {
    let store = WorkloadStore::new("cluster.local", "node-0");
    let mut assembly = Assembly::default();
    for s in 0..100 {
        assembly.put_service(host(s), service(s, 0));
    }
    for i in 0..1000 {
        let ip = IpAddr::from([10, 1, (i / 256) as u8, (i % 256) as u8]);
        put(
            &mut assembly,
            format!("Kubernetes//Pod/shop/p{i}"),
            pod(i, ip, true, false, &[i % 100]),
        );
    }
    let first = take(&mut assembly, &store);
    assert_eq!((first.workloads.len(), first.services.len()), (1000, 100));
    assert!(
        take(&mut assembly, &store).is_empty(),
        "nothing changed since"
    );

    let ip = IpAddr::from([10, 1, 0, 7]);
    put(
        &mut assembly,
        "Kubernetes//Pod/shop/p7".into(),
        pod(7, ip, false, false, &[7]),
    );
    let delta = take(&mut assembly, &store);
    let uids: Vec<&str> = delta.workloads.iter().map(|w| w.uid.as_str()).collect();
    assert_eq!(uids, ["Kubernetes//Pod/shop/p7"]);
    assert!(delta.services.is_empty(), "no Service is put whole");
    let [change] = &delta.endpoints[..] else {
        panic!("one endpoint changed: {:?}", delta.endpoints);
    };
    assert_eq!(
        (change.service.as_str(), &*change.uid),
        ("shop/s7", "Kubernetes//Pod/shop/p7")
    );
    assert!(change.entry.as_ref().is_some_and(|(c, _)| !c.ready));
    let snap = store.snapshot();
    let s7 = snap.service("shop/s7").unwrap();
    let eps = s7.spec.endpoints.as_ref().unwrap();
    assert_eq!(eps.len(), 10, "the Service's ten endpoints, one changed");
    assert!(!eps["Kubernetes//Pod/shop/p7"].ready);
    let p7 = s7.endpoints[&80].find("Kubernetes//Pod/shop/p7").unwrap();
    assert!(!p7.conditions.ready);

    // The same update again changes nothing.
    put(
        &mut assembly,
        "Kubernetes//Pod/shop/p7".into(),
        pod(7, ip, false, false, &[7]),
    );
    assert!(take(&mut assembly, &store).is_empty());
}

/// A Service arriving after the pods naming it makes them its endpoints
/// (and names it in their specs); leaving, it is removed and they no
/// longer name it.
#[test]
fn a_service_arriving_late_gathers_the_pods_naming_it() {
    let store = WorkloadStore::new("cluster.local", "node-0");
    let mut assembly = Assembly::default();
    let ip = IpAddr::from([10, 1, 0, 1]);
    put(&mut assembly, "p1".into(), pod(1, ip, true, false, &[3]));
    let delta = take(&mut assembly, &store);
    assert!(delta.workloads[0].services.is_empty(), "not held yet");
    assert!(delta.services.is_empty());

    assembly.put_service(host(3), service(3, 0));
    let delta = take(&mut assembly, &store);
    assert_eq!(delta.workloads[0].services, ["shop/s3"]);
    let eps = delta.services[0].endpoints.as_ref().unwrap();
    assert!(eps.contains_key("Kubernetes//Pod/shop/p1"));

    assert!(assembly.remove(&host(3)));
    let delta = take(&mut assembly, &store);
    assert_eq!(delta.removed_services, ["shop/s3"]);
    assert!(delta.workloads[0].services.is_empty());
}

/// A refused resource with nothing held under its name holds its
/// addresses closed until it is accepted or removed; with a version held,
/// nothing changes (that version stays).
#[test]
fn a_refused_resource_holds_its_addresses_closed_until_lifted() {
    let store = WorkloadStore::new("cluster.local", "node-0");
    let mut assembly = Assembly::default();
    let ip = IpAddr::from([10, 1, 0, 1]);
    assembly.refuse("p1".into(), vec![ip]);
    assert_eq!(
        take(&mut assembly, &store).refused,
        [("p1".to_owned(), vec![ip])]
    );
    assert_eq!(assembly.refused_len(), (1, 1));
    // Refused again the same way: nothing new to say.
    assembly.refuse("p1".into(), vec![ip]);
    assert!(take(&mut assembly, &store).is_empty());
    // Accepted: lifted in the same delta that puts it.
    put(&mut assembly, "p1".into(), pod(1, ip, true, false, &[]));
    let delta = take(&mut assembly, &store);
    assert_eq!(delta.refused, [("p1".to_owned(), vec![])]);
    assert_eq!(delta.workloads.len(), 1);
    // Refused while a version is held: that version stays, nothing closed.
    assembly.refuse("p1".into(), vec![ip]);
    assert!(take(&mut assembly, &store).is_empty());
    // Refused with nothing held, then removed by istiod: lifted.
    assembly.refuse("p2".into(), vec![IpAddr::from([10, 1, 0, 2])]);
    take(&mut assembly, &store);
    assert!(assembly.remove("p2"), "a refused name is held");
    assert_eq!(
        take(&mut assembly, &store).refused,
        [("p2".to_owned(), vec![])]
    );
}

/// A resource named twice in one response, with two uids: applied again,
/// the same response changes nothing (the uid put is not also removed).
#[test]
fn a_response_applied_twice_changes_nothing_the_second_time() {
    let store = WorkloadStore::new("cluster.local", "node-0");
    let mut assembly = Assembly::default();
    let ip = IpAddr::from([10, 1, 0, 1]);
    let response = |assembly: &mut Assembly| {
        put(assembly, "x".into(), pod(1, ip, true, false, &[2]));
        put(assembly, "x".into(), pod(2, ip, false, false, &[2]));
        assembly.put_service(host(2), service(2, 0));
        assembly.take_delta(|uid| store.spec(uid))
    };
    store.apply(response(&mut assembly));
    let before = store.snapshot();
    assert_eq!(before.len(), 1);
    let delta = response(&mut assembly);
    let held = "Kubernetes//Pod/shop/p2".to_owned();
    assert!(!delta.removed_workloads.contains(&held), "{delta:?}");
    store.apply(delta);
    assert_eq!(store.snapshot().changes_from(&before).count(), 0);
}

/// Two healthy HBONE pods on one address: neither is indexed there, the
/// address is held closed (refused) until one of them gives way.
#[test]
fn an_address_in_conflict_is_held_closed_until_resolved() {
    let store = WorkloadStore::new("cluster.local", "node-0");
    let mut assembly = Assembly::default();
    let ip = IpAddr::from([10, 1, 0, 9]);
    put(&mut assembly, "a".into(), pod(1, ip, true, false, &[]));
    take(&mut assembly, &store);
    assert_eq!(
        store.snapshot().by_ip(ip).map(|w| w.uid()),
        Some("Kubernetes//Pod/shop/p1")
    );

    put(&mut assembly, "b".into(), pod(2, ip, true, false, &[]));
    take(&mut assembly, &store);
    let snap = store.snapshot();
    assert!(snap.by_ip(ip).is_none(), "neither has the address");
    assert_eq!(snap.formerly_known(ip).map(|k| k.label()), Some("refused"));

    // The first one is being deleted: the second has it, the refusal lifted.
    put(&mut assembly, "a".into(), pod(1, ip, false, false, &[]));
    take(&mut assembly, &store);
    let snap = store.snapshot();
    assert_eq!(
        snap.by_ip(ip).map(|w| w.uid()),
        Some("Kubernetes//Pod/shop/p2")
    );
    assert_eq!(snap.formerly_known(ip), None);
}

/// Replicas with the same labels share one label set, in the store too;
/// a set no workload holds any more is let go.
#[test]
fn workloads_with_the_same_labels_share_one_set() {
    let store = WorkloadStore::new("cluster.local", "node-0");
    let mut assembly = Assembly::default();
    let labelled = |i: usize, name: &str| {
        let mut w = pod(i, IpAddr::from([10, 2, 0, i as u8]), true, false, &[]);
        w.spec.labels = Arc::new(BTreeMap::from([("app".to_owned(), name.to_owned())]));
        w
    };
    for i in 0..3 {
        let w = labelled(i, "web");
        put(&mut assembly, w.spec.uid.clone(), w);
    }
    let w = labelled(3, "db");
    put(&mut assembly, w.spec.uid.clone(), w);
    take(&mut assembly, &store);
    let snap = store.snapshot();
    let labels = |i: usize| {
        snap.by_uid(&format!("Kubernetes//Pod/shop/p{i}"))
            .unwrap()
            .spec
            .labels
            .clone()
    };
    assert!(Arc::ptr_eq(&labels(0), &labels(1)) && Arc::ptr_eq(&labels(1), &labels(2)));
    assert!(!Arc::ptr_eq(&labels(0), &labels(3)));
    assert_eq!(labels(3)["app"], "db");
    drop(snap);

    // Past the sweep point, the sets nobody holds are let go.
    assembly.remove("Kubernetes//Pod/shop/p3");
    take(&mut assembly, &store);
    for i in 0..1100 {
        let w = labelled(i % 200, &format!("app-{i}"));
        put(&mut assembly, w.spec.uid.clone(), w);
        take(&mut assembly, &store);
    }
    // Without the sweep, all 1,102 sets would be held.
    assert!(
        assembly.labels.sets.len() < 500,
        "{} label sets held for 200 workloads",
        assembly.labels.sets.len()
    );
    assert!(!assembly
        .labels
        .sets
        .iter()
        .any(|l| l.get("app").is_some_and(|a| a == "db")));
}

/// Puts `w` as the source does, its digest standing for the resource's
/// bytes (equal workloads, equal digests).
fn put(assembly: &mut Assembly, name: String, w: IstioWorkload) {
    let digest = std::hash::BuildHasher::hash_one(
        &std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default(),
        &w,
    );
    assembly.put_workload(name, w, digest);
}

/// Whether `held` (as the model holds it, marked or not) is the resource
/// `w` again: the assembly keeps it as it is.
fn same(held: &IstioWorkload, w: &IstioWorkload) -> bool {
    let mut unmarked = held.clone();
    unmarked.starting = false;
    if !unmarked.healthy {
        unmarked.spec.state = crate::workloads::LifecycleState::Terminating;
    }
    unmarked == *w
}

/// istiod lists a new pod UNHEALTHY until it is ready, and a pod being
/// deleted UNHEALTHY too: the first is starting (running, not ready, no
/// drain), only the second terminating.
#[test]
fn a_pod_unhealthy_since_listed_is_starting_not_terminating() {
    use crate::workloads::LifecycleState;
    let store = WorkloadStore::new("cluster.local", "node-0");
    let mut assembly = Assembly::default();
    let ip = IpAddr::from([10, 1, 0, 9]);
    let name = "Kubernetes//Pod/shop/p1".to_owned();
    let look = |store: &WorkloadStore| {
        let snap = store.snapshot();
        let w = snap.by_uid(&name).expect("held");
        let svc = snap.service("shop/s3").expect("service");
        let c = svc.spec.endpoints.as_ref().unwrap()[name.as_str()];
        (w.spec.state, c.ready, c.terminating)
    };
    assembly.put_service(host(3), service(3, 0));
    put(&mut assembly, name.clone(), pod(1, ip, false, false, &[3]));
    take(&mut assembly, &store);
    assert_eq!(
        look(&store),
        (LifecycleState::Running, false, false),
        "starting"
    );
    put(&mut assembly, name.clone(), pod(1, ip, true, false, &[3]));
    take(&mut assembly, &store);
    assert_eq!(
        look(&store),
        (LifecycleState::Running, true, false),
        "ready"
    );
    put(&mut assembly, name.clone(), pod(1, ip, false, false, &[3]));
    take(&mut assembly, &store);
    assert_eq!(
        look(&store),
        (LifecycleState::Terminating, false, true),
        "being deleted"
    );
    // Gone, then listed again UNHEALTHY: starting again.
    assert!(assembly.remove(&name));
    take(&mut assembly, &store);
    put(&mut assembly, name.clone(), pod(1, ip, false, false, &[3]));
    take(&mut assembly, &store);
    assert_eq!(
        look(&store),
        (LifecycleState::Running, false, false),
        "new again"
    );
}
