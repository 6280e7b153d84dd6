//! CONNECT routing and authorization: [`route`] on its own, no sockets.

use std::net::SocketAddr;
use std::sync::Arc;

use http::{Method, Request, StatusCode};

use super::{route, InboundError, OwnPorts, TunnelCtx};
use crate::workloads::{WorkloadSnapshot, WorkloadSpec, WorkloadStore};
use tidegate_protocol::identity::SpiffeId;

const NODE: &str = "node-a";

fn spec(uid: &str, ip: &str, node: &str, allow: &[&str]) -> WorkloadSpec {
    serde_json::from_value(serde_json::json!({
        "uid": uid,
        "name": uid,
        "ips": [ip],
        "node": node,
        "allow": allow,
    }))
    .expect("valid workload spec")
}

/// `echo` (10.0.0.1) and `locked` (10.0.0.2, only `ns/client` allowed) on
/// this node, `remote` (10.0.0.9) elsewhere.
fn snapshot() -> Arc<WorkloadSnapshot> {
    let store = WorkloadStore::new("cluster.local", NODE);
    store.publish(vec![
        spec("echo", "10.0.0.1", NODE, &[]),
        spec(
            "locked",
            "10.0.0.2",
            NODE,
            &["spiffe://cluster.local/ns/default/sa/client"],
        ),
        spec("remote", "10.0.0.9", "node-b", &[]),
    ]);
    store.snapshot()
}

/// A tunnel from `peer_sa` that dialed `dialed`.
fn ctx(snapshot: &WorkloadSnapshot, dialed: &str, peer_sa: &str) -> TunnelCtx {
    let dialed: SocketAddr = dialed.parse().unwrap();
    let peer = SpiffeId::new("cluster.local", "default", peer_sa);
    TunnelCtx {
        peer_identity: crate::authorization::identity_of(&peer),
        peer,
        peer_addr: "10.1.0.1:40000".parse().unwrap(),
        dialed,
        workload: snapshot
            .by_ip(dialed.ip())
            .cloned()
            .expect("dialed workload"),
    }
}

fn connect(authority: &str) -> Request<()> {
    Request::builder()
        .method(Method::CONNECT)
        .uri(authority)
        .body(())
        .unwrap()
}

#[test]
fn a_connect_to_the_dialed_local_workload_is_routed_to_it() {
    let snap = snapshot();
    let ctx = ctx(&snap, "10.0.0.1:15008", "client");
    let target = route(&connect("10.0.0.1:8080"), &ctx, &snap, &OwnPorts::default()).unwrap();
    assert_eq!(target, "10.0.0.1:8080".parse::<SocketAddr>().unwrap());
}

#[test]
fn a_method_other_than_connect_is_refused() {
    let snap = snapshot();
    let ctx = ctx(&snap, "10.0.0.1:15008", "client");
    let req = Request::builder()
        .method(Method::GET)
        .uri("http://10.0.0.1:8080/")
        .body(())
        .unwrap();
    let err = route(&req, &ctx, &snap, &OwnPorts::default()).unwrap_err();
    assert!(
        matches!(err, InboundError::NotConnect(Method::GET)),
        "{err}"
    );
    assert_eq!(err.status(), StatusCode::BAD_REQUEST);
    assert_eq!(err.reason(), "not_connect");
}

#[test]
fn an_authority_that_is_not_ip_port_is_refused() {
    let snap = snapshot();
    let ctx = ctx(&snap, "10.0.0.1:15008", "client");
    let err = route(
        &connect("echo.default.svc:8080"),
        &ctx,
        &snap,
        &OwnPorts::default(),
    )
    .unwrap_err();
    assert!(
        matches!(&err, InboundError::BadAuthority(a) if a == "echo.default.svc:8080"),
        "{err}"
    );
    assert_eq!(err.status(), StatusCode::BAD_REQUEST);
    assert_eq!(err.reason(), "bad_authority");
}

#[test]
fn a_target_that_is_not_a_workload_on_this_node_is_refused() {
    let snap = snapshot();
    let ctx = ctx(&snap, "10.0.0.1:15008", "client");
    for authority in ["10.0.0.9:8080", "192.0.2.1:8080"] {
        let err = route(&connect(authority), &ctx, &snap, &OwnPorts::default()).unwrap_err();
        assert!(
            matches!(err, InboundError::NotLocal(_)),
            "{authority}: {err}"
        );
        assert_eq!(err.status(), StatusCode::BAD_REQUEST);
        assert_eq!(err.reason(), "target_not_local");
    }
}

#[test]
fn a_target_other_than_the_dialed_workload_is_refused() {
    // Never an open proxy: a tunnel to echo cannot reach locked, though both are local.
    let snap = snapshot();
    let ctx = ctx(&snap, "10.0.0.1:15008", "client");
    let err = route(&connect("10.0.0.2:8080"), &ctx, &snap, &OwnPorts::default()).unwrap_err();
    assert!(
        matches!(
            err,
            InboundError::AuthorityMismatch { authority, dialed }
                if authority.to_string() == "10.0.0.2" && dialed.to_string() == "10.0.0.1"
        ),
        "{err}"
    );
    assert_eq!(err.status(), StatusCode::BAD_REQUEST);
    assert_eq!(err.reason(), "authority_mismatch");
}

#[test]
fn a_peer_the_workload_does_not_allow_is_denied() {
    let snap = snapshot();
    let ctx = ctx(&snap, "10.0.0.2:15008", "intruder");
    let err = route(&connect("10.0.0.2:8080"), &ctx, &snap, &OwnPorts::default()).unwrap_err();
    assert!(
        matches!(&err, InboundError::Denied { workload, .. } if workload == "locked"),
        "{err}"
    );
    assert_eq!(err.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(err.reason(), "denied");
}

#[test]
fn a_peer_the_workload_allows_is_routed() {
    let snap = snapshot();
    let ctx = ctx(&snap, "10.0.0.2:15008", "client");
    let target = route(&connect("10.0.0.2:8080"), &ctx, &snap, &OwnPorts::default()).unwrap();
    assert_eq!(target, "10.0.0.2:8080".parse::<SocketAddr>().unwrap());
}

#[test]
fn the_gateways_own_ports_and_port_0_are_refused_on_a_local_workload() {
    let snap = snapshot();
    let ctx = ctx(&snap, "10.0.0.1:15008", "client");
    let own = OwnPorts::new([15008, 15001, 15000, 15020, 15021]);
    for authority in [
        "10.0.0.1:15008",
        "10.0.0.1:15001",
        "10.0.0.1:15020",
        "10.0.0.1:0",
    ] {
        let err = route(&connect(authority), &ctx, &snap, &own).unwrap_err();
        assert!(
            matches!(err, InboundError::IllegalPort(a) if a.to_string() == authority),
            "{authority}: {err}"
        );
        assert_eq!(err.status(), StatusCode::BAD_REQUEST);
        assert_eq!(err.reason(), "illegal_port");
    }
    // Port 0 even when no port was configured; other ports are the workload's.
    let err = route(&connect("10.0.0.1:0"), &ctx, &snap, &OwnPorts::default()).unwrap_err();
    assert_eq!(err.reason(), "illegal_port");
    assert!(route(&connect("10.0.0.1:15009"), &ctx, &snap, &own).is_ok());
}

/// `dual` on this node: 10.0.0.3 and fd00::3.
fn dual_stack() -> Arc<WorkloadSnapshot> {
    let store = WorkloadStore::new("cluster.local", NODE);
    store.publish(vec![serde_json::from_value(serde_json::json!({
        "uid": "dual", "name": "dual", "ips": ["10.0.0.3", "fd00::3"], "node": NODE,
    }))
    .expect("valid workload spec")]);
    store.snapshot()
}

#[test]
fn an_ipv6_connect_to_the_dialed_workload_is_routed_to_it() {
    let snap = dual_stack();
    let ctx = ctx(&snap, "[fd00::3]:15008", "client");
    let target = route(
        &connect("[fd00::3]:8080"),
        &ctx,
        &snap,
        &OwnPorts::default(),
    )
    .unwrap();
    assert_eq!(target, "[fd00::3]:8080".parse::<SocketAddr>().unwrap());
    // The other family of the same workload is not what the peer dialed.
    let err = route(&connect("10.0.0.3:8080"), &ctx, &snap, &OwnPorts::default()).unwrap_err();
    assert_eq!(err.reason(), "authority_mismatch");
}

#[test]
fn ipv6_self_targets_and_other_spellings_are_refused_with_a_reason() {
    let snap = dual_stack();
    let own = OwnPorts::new([15008, 15001, 15006]);
    for (dialed, authority, reason) in [
        ("[fd00::3]:15008", "[fd00::3]:15008", "illegal_port"),
        ("[fd00::3]:15008", "[fd00::3]:15001", "illegal_port"),
        ("[fd00::3]:15008", "[::1]:15008", "target_not_local"),
        ("[fd00::3]:15008", "[::]:8080", "target_not_local"),
        (
            "10.0.0.3:15008",
            "[::ffff:10.0.0.3]:15008",
            "authority_v4_mapped",
        ),
        (
            "10.0.0.3:15008",
            "[::ffff:10.0.0.3]:8080",
            "authority_v4_mapped",
        ),
        (
            "[fd00::3]:15008",
            "[fe80::1%25eth0]:8080",
            "authority_zone_id",
        ),
    ] {
        let ctx = ctx(&snap, dialed, "client");
        let Ok(req) = Request::builder()
            .method(Method::CONNECT)
            .uri(authority)
            .body(())
        else {
            panic!("{authority}: the HTTP layer refuses it before routing");
        };
        let err = route(&req, &ctx, &snap, &own).unwrap_err();
        assert_eq!(err.reason(), reason, "{authority}: {err}");
        assert_eq!(err.status(), StatusCode::BAD_REQUEST, "{authority}");
    }
}

#[test]
fn malformed_bracket_forms_never_reach_a_workload() {
    let snap = dual_stack();
    let ctx = ctx(&snap, "[fd00::3]:15008", "client");
    for authority in [
        "[fd00::3:8080",
        "[fd00::3]",
        "[fd00::3]:",
        "[fd00::3]]:8080",
    ] {
        // The HTTP layer refuses some of them itself; none is routed.
        if let Ok(req) = Request::builder()
            .method(Method::CONNECT)
            .uri(authority)
            .body(())
        {
            let err = route(&req, &ctx, &snap, &OwnPorts::default()).unwrap_err();
            assert_eq!(err.reason(), "bad_authority", "{authority}: {err}");
            assert_eq!(err.status(), StatusCode::BAD_REQUEST);
        }
    }
}
