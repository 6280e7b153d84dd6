//! CONNECT routing and authorization (`proxy::inbound::connect::route`): any
//! method and authority is routed or refused, never a panic; and a routed
//! CONNECT always targets the very workload the peer dialed, on this node,
//! on a port that is not the gateway's own. The authority parser
//! (`tidegate_protocol::hbone::authority`) on the same text: an accepted
//! authority has no zone id and no IPv4-mapped spelling, and reads back
//! as written.
#![no_main]

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use tidegate_protocol::hbone::authority;
use tidegate_protocol::identity::SpiffeId;
use tidegate::proxy::inbound::connect::{route, OwnPorts, TunnelCtx};
use tidegate::workloads::{parse_workload_file, WorkloadSnapshot, WorkloadStore};

const WORKLOADS: &str = "workloads:
  - {uid: echo, name: echo, namespace: demo, service_account: echo, ips: [10.0.0.2], node: node-a, protocol: HBONE}
  - {uid: web, name: web, namespace: shop, service_account: web, ips: [10.0.0.3, 'fd00::3'], node: node-a, protocol: HBONE,
     allow: ['spiffe://cluster.local/ns/demo/sa/client']}
  - {uid: far, name: far, namespace: demo, service_account: far, ips: [10.0.1.9], node: node-b, protocol: HBONE}
";

struct Fixture {
    snapshot: Arc<WorkloadSnapshot>,
    ports: OwnPorts,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let store = WorkloadStore::new("cluster.local", "node-a");
        store.publish(parse_workload_file(WORKLOADS).unwrap());
        Fixture {
            snapshot: store.snapshot(),
            ports: OwnPorts::new([15001, 15008, 15020, 15021, 15000]),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    // Byte 0: which workload was dialed, byte 1: which peer; the rest is
    // "METHOD authority".
    let (Some(&dialed), Some(&peer), Ok(text)) = (
        data.first(),
        data.get(1),
        std::str::from_utf8(data.get(2..).unwrap_or(&[])),
    ) else {
        return;
    };
    let (method, authority) = text.split_once(' ').unwrap_or(("CONNECT", text));
    if let Ok(addr) = authority::parse(authority) {
        if let std::net::SocketAddr::V6(v6) = addr {
            assert_eq!(v6.scope_id(), 0, "{authority}");
            assert!(v6.ip().to_ipv4_mapped().is_none(), "{authority}");
        }
        assert_eq!(authority::parse(&authority::write(addr)), Ok(addr), "{authority}");
    }
    let Ok(req) = http::Request::builder()
        .method(method)
        .uri(authority)
        .body(())
    else {
        return;
    };
    let f = fixture();
    let dialed_ip = ["10.0.0.2", "10.0.0.3", "fd00::3", "10.0.1.9"][dialed as usize % 4];
    let dialed: SocketAddr = SocketAddr::new(dialed_ip.parse().unwrap(), 15008);
    let Some(workload) = f.snapshot.by_ip(dialed.ip()).cloned() else {
        return;
    };
    let peer_sa = ["client", "other"][peer as usize % 2];
    let peer = SpiffeId::new("cluster.local", "demo", peer_sa);
    let ctx = TunnelCtx {
        peer_identity: tidegate::authorization::identity_of(&peer),
        peer,
        peer_addr: "10.0.9.9:40000".parse().unwrap(),
        dialed,
        workload,
    };
    if let Ok(target) = route(&req, &ctx, &f.snapshot, &f.ports) {
        assert_eq!(req.method(), http::Method::CONNECT);
        assert_eq!(target.ip(), dialed.ip(), "{authority}");
        assert_eq!(target.ip(), target.ip().to_canonical(), "{authority}");
        assert!(!f.ports.contains(target.port()), "{authority}");
        let w = f.snapshot.by_ip(target.ip()).expect("routed to a workload");
        assert!(w.local, "routed to a workload on another node: {authority}");
        assert!(
            w.allows(&ctx.peer),
            "routed a peer the workload does not allow"
        );
    }
});
