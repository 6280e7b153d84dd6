//! The caps on their own: derivation, refusals, release.

use super::*;
use tidegate_base::sync::Locked;

fn cfg(max_connections: u32, per_identity: u32) -> HboneConfig {
    HboneConfig {
        max_connections,
        max_connections_per_identity: per_identity,
        ..HboneConfig::default()
    }
}

fn id(sa: &str) -> SpiffeId {
    SpiffeId::new("cluster.local", "demo", sa)
}

fn encoded(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

#[test]
fn caps_are_derived_from_the_budgets_inbound_share() {
    // This machine's 20,000 in in-pod mode with 1,000 pods: 8,112 (see
    // descriptor_budget.rs).
    let caps = Caps::derive(&cfg(0, 0), Some(8_112));
    assert_eq!(
        caps,
        Caps {
            connections: 8_112,
            tunnels: 4_056,
            per_identity: 2_028
        }
    );
    // No overflow at the largest share.
    let caps = Caps::derive(&cfg(0, 0), Some(u64::MAX));
    assert!(caps.tunnels > 1 << 40);
    // An unknown limit: no cap.
    assert!(Caps::derive(&cfg(0, 0), None).tunnels > 1 << 40);
    // Configured values win, up to the share.
    let caps = Caps::derive(&cfg(10, 3), Some(20_000));
    assert_eq!(
        caps,
        Caps {
            connections: 10,
            tunnels: 5,
            per_identity: 3
        }
    );
    let caps = Caps::derive(&cfg(16_000, 0), Some(8_112));
    assert_eq!(
        caps.connections, 8_112,
        "no configuration takes the pods' descriptors"
    );
    assert_eq!(Caps::derive(&cfg(16_000, 0), None).connections, 16_000);
}

#[test]
fn one_identity_is_refused_past_its_cap_while_another_is_admitted() {
    let mut registry = Registry::default();
    let limits = ConnectionLimits::new(Caps::derive(&cfg(100, 2), None), &mut registry);
    let a = limits.admit_tunnel().unwrap();
    let a_id = a.identify(&id("a")).unwrap();
    let b = limits.admit_tunnel().unwrap();
    let _b_id = b.identify(&id("a")).unwrap();
    let c = limits.admit_tunnel().unwrap();
    assert_eq!(c.identify(&id("a")).unwrap_err(), OverLimit::PerIdentity(2));
    // The same cap bounds the identity's upstream connections.
    assert_eq!(a_id.admit_dial().unwrap_err(), OverLimit::PerIdentity(2));
    let other = c.identify(&id("other")).unwrap();
    let dial = other.admit_dial().unwrap();
    let text = encoded(&registry);
    assert!(
        text.contains(r#"inbound_connections_open{kind="tunnel"} 3"#),
        "{text}"
    );
    assert!(
        text.contains(r#"inbound_connections_open{kind="upstream"} 1"#),
        "{text}"
    );
    assert!(text.contains("inbound_peer_identities 2"), "{text}");
    assert!(
        text.contains(r#"inbound_connection_caps{limit="per_identity"} 2"#),
        "{text}"
    );
    drop((dial, other, c));
    drop(a_id);
    // A slot given back is a slot taken again.
    let again = a.identify(&id("a")).unwrap();
    drop((again, a, b, _b_id));
    let text = encoded(&registry);
    assert!(text.contains("inbound_peer_identities 0"), "{text}");
    assert!(
        text.contains(r#"inbound_connections_open{kind="tunnel"} 0"#),
        "{text}"
    );
    assert!(limits.identities.locked().is_empty());
}

#[test]
fn tunnels_may_take_half_and_dials_the_rest() {
    let mut registry = Registry::default();
    let limits = ConnectionLimits::new(Caps::derive(&cfg(4, 4), None), &mut registry);
    let t1 = limits.admit_tunnel().unwrap();
    let _t2 = limits.admit_tunnel().unwrap();
    assert_eq!(limits.admit_tunnel().unwrap_err(), OverLimit::Tunnels(2));
    let i1 = t1.identify(&id("a")).unwrap();
    let _d1 = i1.admit_dial().unwrap();
    let _d2 = i1.admit_dial().unwrap();
    assert_eq!(i1.admit_dial().unwrap_err(), OverLimit::Connections(4));
    limits.refused(
        OverLimit::Connections(4),
        Refused::Dial,
        "10.0.0.1:1".parse().unwrap(),
        Some(&id("a")),
    );
    let text = encoded(&registry);
    assert!(
        text.contains(r#"inbound_limit_refusals_total{limit="connections",kind="dial"} 1"#),
        "{text}"
    );
}
