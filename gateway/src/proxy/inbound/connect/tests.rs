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
