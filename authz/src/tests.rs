//! Every rule of the module docs, one table row or test each.

use std::net::SocketAddr;

use crate::policy::*;
use crate::store::{decide, Decision, Denial, Destination, Held, PolicyStore};
use crate::xds;

fn id(ns: &str, sa: &str) -> Identity {
    Identity::new("cluster.local", ns, sa)
}

fn conn<'a>(src: &str, dst: &str, identity: Option<&'a Identity>) -> Connection<'a> {
    Connection {
        src: src.parse::<SocketAddr>().unwrap(),
        dst: dst.parse::<SocketAddr>().unwrap(),
        identity,
    }
}

fn policy(action: Action, rules: Vec<Rule>) -> Policy {
    Policy {
        name: "p".into(),
        namespace: "ns".into(),
        scope: Scope::Namespace,
        action,
        rules,
        dry_run: false,
    }
}

pub(crate) fn rule(clauses: Vec<Vec<Match>>) -> Rule {
    Rule {
        clauses: clauses
            .into_iter()
            .map(|matches| Clause { matches })
            .collect(),
    }
}

/// A policy of one rule, one clause, one match.
fn one(m: Match) -> Policy {
    policy(Action::Allow, vec![rule(vec![vec![m]])])
}

fn exact(s: &str) -> StringMatch {
    StringMatch::Exact(s.into())
}

#[test]
fn the_structure_of_rules_clauses_and_matches() {
    let alice = id("a", "alice");
    let c = conn("10.0.0.1:5000", "10.0.1.1:8080", Some(&alice));
    let yes = Match {
        namespaces: vec![exact("a")],
        ..Match::default()
    };
    let no = Match {
        namespaces: vec![exact("b")],
        ..Match::default()
    };
    let empty = Match::default();
    for (what, rules, want) in [
        ("no rules never matches", vec![], false),
        ("a rule with no clauses matches", vec![rule(vec![])], true),
        (
            "a clause with no matches matches",
            vec![rule(vec![vec![]])],
            true,
        ),
        (
            "an all-empty match is skipped",
            vec![rule(vec![vec![empty.clone()]])],
            false,
        ),
        (
            "an empty match beside a matching one: the clause matches",
            vec![rule(vec![vec![empty.clone(), yes.clone()]])],
            true,
        ),
        (
            "matches are OR-ed",
            vec![rule(vec![vec![no.clone(), yes.clone()]])],
            true,
        ),
        (
            "clauses are AND-ed",
            vec![rule(vec![vec![yes.clone()], vec![no.clone()]])],
            false,
        ),
        (
            "clauses all matching",
            vec![rule(vec![vec![yes.clone()], vec![yes.clone()]])],
            true,
        ),
        (
            "rules are OR-ed",
            vec![rule(vec![vec![no.clone()]]), rule(vec![vec![yes.clone()]])],
            true,
        ),
        (
            "one failing rule alone",
            vec![rule(vec![vec![no.clone()]])],
            false,
        ),
    ] {
        assert_eq!(policy(Action::Allow, rules).matches(&c), want, "{what}");
    }
}

#[test]
fn within_a_match_every_field_must_pass_and_each_pair_is_any_and_none() {
    let alice = id("a", "alice");
    let c = conn("10.0.0.1:5000", "10.0.1.1:8080", Some(&alice));
    let m = |f: &dyn Fn(&mut Match)| {
        let mut m = Match::default();
        f(&mut m);
        one(m).matches(&c)
    };
    // AND across fields.
    assert!(m(&|m| {
        m.namespaces = vec![exact("a")];
        m.destination_ports = vec![8080];
    }));
    assert!(!m(&|m| {
        m.namespaces = vec![exact("a")];
        m.destination_ports = vec![9090];
    }));
    // Positive: any; negative: none; both together.
    assert!(m(&|m| m.destination_ports = vec![1, 8080]));
    assert!(!m(&|m| m.not_destination_ports = vec![1, 8080]));
    assert!(m(&|m| m.not_destination_ports = vec![1, 2]));
    assert!(!m(&|m| {
        m.destination_ports = vec![8080];
        m.not_destination_ports = vec![8080];
    }));
    assert!(m(&|m| {
        m.destination_ports = vec![8080];
        m.not_destination_ports = vec![9090];
    }));
}

#[test]
fn each_field_and_its_twin_reads_its_part_of_the_connection() {
    let alice = id("a", "alice");
    let tls = conn("10.0.0.1:5000", "10.0.1.1:8080", Some(&alice));
    let plain = conn("10.0.0.1:5000", "10.0.1.1:8080", None);
    type Set = fn(&mut Match);
    let rows: &[(&str, Set, bool, bool)] = &[
        // (what, the match, with an identity, on plaintext)
        (
            "namespace exact",
            |m| m.namespaces = vec![exact("a")],
            true,
            false,
        ),
        (
            "namespace other",
            |m| m.namespaces = vec![exact("b")],
            false,
            false,
        ),
        (
            "not namespace",
            |m| m.not_namespaces = vec![exact("a")],
            false,
            true,
        ),
        (
            "namespace presence",
            |m| m.namespaces = vec![StringMatch::Presence],
            true,
            false,
        ),
        // ztunnel reads a missing identity's namespace as "": an empty
        // exact or prefix matches plaintext.
        (
            "namespace exact empty",
            |m| m.namespaces = vec![exact("")],
            false,
            true,
        ),
        (
            "namespace prefix empty",
            |m| m.namespaces = vec![StringMatch::Prefix(String::new())],
            true,
            true,
        ),
        (
            "principal, without spiffe://",
            |m| m.principals = vec![exact("cluster.local/ns/a/sa/alice")],
            true,
            false,
        ),
        (
            "principal with spiffe:// never matches",
            |m| m.principals = vec![exact("spiffe://cluster.local/ns/a/sa/alice")],
            false,
            false,
        ),
        (
            "principal prefix",
            |m| m.principals = vec![StringMatch::Prefix("cluster.local/ns/a/".into())],
            true,
            false,
        ),
        (
            "principal suffix",
            |m| m.principals = vec![StringMatch::Suffix("/sa/alice".into())],
            true,
            false,
        ),
        (
            "principal presence",
            |m| m.principals = vec![StringMatch::Presence],
            true,
            false,
        ),
        // No identity: no principal matches, so a negative passes — istiod's STRICT.
        (
            "not principal presence",
            |m| m.not_principals = vec![StringMatch::Presence],
            false,
            true,
        ),
        (
            "principal empty prefix",
            |m| m.principals = vec![StringMatch::Prefix(String::new())],
            true,
            false,
        ),
        (
            "service account",
            |m| {
                m.service_accounts = vec![ServiceAccount {
                    namespace: "a".into(),
                    service_account: "alice".into(),
                }]
            },
            true,
            false,
        ),
        (
            "service account of another namespace",
            |m| {
                m.service_accounts = vec![ServiceAccount {
                    namespace: "b".into(),
                    service_account: "alice".into(),
                }]
            },
            false,
            false,
        ),
        (
            "not service account",
            |m| {
                m.not_service_accounts = vec![ServiceAccount {
                    namespace: "a".into(),
                    service_account: "alice".into(),
                }]
            },
            false,
            true,
        ),
        (
            "source range",
            |m| m.source_ips = vec!["10.0.0.0/24".parse().unwrap()],
            true,
            true,
        ),
        (
            "source elsewhere",
            |m| m.source_ips = vec!["10.9.0.0/16".parse().unwrap()],
            false,
            false,
        ),
        (
            "not source range",
            |m| m.not_source_ips = vec!["10.0.0.1".parse().unwrap()],
            false,
            false,
        ),
        (
            "destination range",
            |m| m.destination_ips = vec!["10.0.1.0/24".parse().unwrap()],
            true,
            true,
        ),
        (
            "not destination range",
            |m| m.not_destination_ips = vec!["10.0.1.0/24".parse().unwrap()],
            false,
            false,
        ),
        (
            "destination v6 range, v4 connection",
            |m| m.destination_ips = vec!["::/0".parse().unwrap()],
            false,
            false,
        ),
        (
            "destination port",
            |m| m.destination_ports = vec![8080],
            true,
            true,
        ),
        (
            "not destination port",
            |m| m.not_destination_ports = vec![8080],
            false,
            false,
        ),
        (
            "the tunnel's port is not the destination port",
            |m| m.destination_ports = vec![15008],
            false,
            false,
        ),
    ];
    for (what, set, want_tls, want_plain) in rows {
        let mut m = Match::default();
        set(&mut m);
        let p = one(m);
        assert_eq!(p.matches(&tls), *want_tls, "{what}, with an identity");
        assert_eq!(p.matches(&plain), *want_plain, "{what}, on plaintext");
    }
}

fn deny_ns(ns: &str) -> Policy {
    Policy {
        name: format!("deny-{ns}"),
        ..policy(
            Action::Deny,
            vec![rule(vec![vec![Match {
                namespaces: vec![exact(ns)],
                ..Match::default()
            }]])],
        )
    }
}

fn allow_ns(ns: &str) -> Policy {
    Policy {
        name: format!("allow-{ns}"),
        ..policy(
            Action::Allow,
            vec![rule(vec![vec![Match {
                namespaces: vec![exact(ns)],
                ..Match::default()
            }]])],
        )
    }
}

fn dry(mut p: Policy) -> Policy {
    p.dry_run = true;
    p
}

#[test]
fn the_order_of_deny_allow_and_dry_run() {
    let alice = id("a", "alice");
    let c = conn("10.0.0.1:5000", "10.0.1.1:8080", Some(&alice));
    let denied = |name: &str| {
        Decision::Deny(Denial::ExplicitlyDenied {
            namespace: "ns".into(),
            name: name.into(),
        })
    };
    let none_allowed = Decision::Deny(Denial::NotAllowed);
    let rows: Vec<(&str, Vec<Policy>, Decision)> = vec![
        ("no policy: allowed", vec![], Decision::Allow),
        (
            "a matching DENY refuses",
            vec![deny_ns("a")],
            denied("deny-a"),
        ),
        (
            "a DENY that does not match",
            vec![deny_ns("b")],
            Decision::Allow,
        ),
        (
            "DENY wins over a matching ALLOW",
            vec![allow_ns("a"), deny_ns("a")],
            denied("deny-a"),
        ),
        (
            "a dry-run DENY is not enforced",
            vec![dry(deny_ns("a"))],
            Decision::Allow,
        ),
        (
            "a matching ALLOW allows",
            vec![allow_ns("b"), allow_ns("a")],
            Decision::Allow,
        ),
        (
            "ALLOWs exist, none matches",
            vec![allow_ns("b")],
            none_allowed.clone(),
        ),
        (
            "only dry-run ALLOWs: allowed",
            vec![dry(allow_ns("b"))],
            Decision::Allow,
        ),
        (
            "a dry-run ALLOW that matches does not allow",
            vec![dry(allow_ns("a")), allow_ns("b")],
            none_allowed.clone(),
        ),
        (
            "an ALLOW without rules denies everything",
            vec![policy(Action::Allow, vec![])],
            none_allowed.clone(),
        ),
        (
            "a DENY without rules denies nothing",
            vec![policy(Action::Deny, vec![])],
            Decision::Allow,
        ),
    ];
    for (what, policies, want) in rows {
        let refs: Vec<&Policy> = policies.iter().collect();
        assert_eq!(decide(&refs, &c), want, "{what}");
    }
}

#[test]
fn refusals_read_as_ztunnel_writes_them() {
    let d = Denial::ExplicitlyDenied {
        namespace: "prod".into(),
        name: "no-batch".into(),
    };
    assert_eq!(d.to_string(), "explicitly denied by: prod/no-batch");
    assert_eq!(
        Denial::NotAllowed.to_string(),
        "allow policies exist, but none allowed"
    );
}

fn scoped(name: &str, ns: &str, scope: Scope, action: Action) -> Policy {
    Policy {
        name: name.into(),
        namespace: ns.into(),
        scope,
        action,
        rules: vec![Rule::default()],
        dry_run: false,
    }
}

#[test]
fn the_policies_in_scope_of_a_workload() {
    let mut store = PolicyStore::default();
    store.insert(
        "istio-system/mesh".into(),
        scoped("mesh", "istio-system", Scope::Global, Action::Allow),
    );
    store.insert(
        "a/ns-wide".into(),
        scoped("ns-wide", "a", Scope::Namespace, Action::Allow),
    );
    store.insert(
        "b/ns-wide".into(),
        scoped("ns-wide", "b", Scope::Namespace, Action::Allow),
    );
    store.insert(
        "a/picked".into(),
        scoped("picked", "a", Scope::WorkloadSelector, Action::Allow),
    );
    store.insert(
        "a/other".into(),
        scoped("other", "a", Scope::WorkloadSelector, Action::Allow),
    );
    fn names(store: &PolicyStore, ns: &str, picked: &[String]) -> Vec<String> {
        let mut v: Vec<String> = store
            .in_scope(&Destination {
                namespace: ns,
                policies: picked,
            })
            .iter()
            .map(|p| p.key())
            .collect();
        v.sort();
        v
    }
    let picked = ["a/picked".to_owned(), "a/never-received".to_owned()];
    assert_eq!(
        names(&store, "a", &picked),
        ["a/ns-wide", "a/picked", "istio-system/mesh"],
        "global, its namespace's, those it names; an unknown key is skipped"
    );
    assert_eq!(names(&store, "c", &[]), ["istio-system/mesh"]);

    // A policy whose scope changes is re-indexed.
    store.insert(
        "a/ns-wide".into(),
        scoped("ns-wide", "a", Scope::WorkloadSelector, Action::Allow),
    );
    assert_eq!(names(&store, "a", &[]), ["istio-system/mesh"]);
    store.insert(
        "a/ns-wide".into(),
        scoped("ns-wide", "a", Scope::Namespace, Action::Allow),
    );
    assert_eq!(names(&store, "a", &[]), ["a/ns-wide", "istio-system/mesh"]);
    assert!(store.remove("a/ns-wide"));
    assert!(!store.remove("a/ns-wide"));
    assert_eq!(names(&store, "a", &[]), ["istio-system/mesh"]);
    assert_eq!(store.len(), 4);
}

#[test]
fn istiods_strict_peer_authentication_refuses_plaintext_only() {
    // PeerAuthentication STRICT as istiod converts it: a DENY with
    // `not_principals: [presence]`, here with a PERMISSIVE port 8080.
    let strict = Policy {
        name: "istio_converted_static_strict".into(),
        namespace: "a".into(),
        scope: Scope::WorkloadSelector,
        action: Action::Deny,
        rules: vec![rule(vec![
            vec![Match {
                not_principals: vec![StringMatch::Presence],
                ..Match::default()
            }],
            vec![Match {
                not_destination_ports: vec![8080],
                ..Match::default()
            }],
        ])],
        dry_run: false,
    };
    let mut store = PolicyStore::default();
    store.insert("a/istio_converted_static_strict".into(), strict);
    let dest = Destination {
        namespace: "a",
        policies: &["a/istio_converted_static_strict".to_owned()],
    };
    let alice = id("b", "alice");
    for (what, c, allowed) in [
        (
            "mTLS",
            conn("10.0.0.1:1", "10.0.1.1:9090", Some(&alice)),
            true,
        ),
        (
            "plaintext",
            conn("10.0.0.1:1", "10.0.1.1:9090", None),
            false,
        ),
        (
            "plaintext to the permissive port",
            conn("10.0.0.1:1", "10.0.1.1:8080", None),
            true,
        ),
    ] {
        assert_eq!(store.decide(&dest, &c).is_allow(), allowed, "{what}");
    }
}

fn addr(bytes: &[u8], length: u32) -> xds::XdsAddress {
    xds::XdsAddress {
        address: bytes.to_vec().into(),
        length,
    }
}

fn resource(m: xds::XdsMatch) -> xds::Authorization {
    xds::Authorization {
        name: "p".into(),
        namespace: "ns".into(),
        scope: 1,
        action: 1,
        rules: vec![xds::XdsRule {
            clauses: vec![xds::XdsClause { matches: vec![m] }],
        }],
        dry_run: false,
    }
}

#[test]
fn an_xds_resource_converts_field_for_field() {
    use prost::Message;
    let m = xds::XdsMatch {
        namespaces: vec![xds::XdsStringMatch {
            match_type: Some(xds::MatchType::Prefix("team-".into())),
        }],
        not_principals: vec![xds::XdsStringMatch {
            match_type: Some(xds::MatchType::Presence(xds::Empty {})),
        }],
        service_accounts: vec![xds::XdsServiceAccount {
            namespace: "a".into(),
            service_account: "alice".into(),
        }],
        source_ips: vec![addr(&[10, 0, 0, 0], 8)],
        destination_ips: vec![addr(
            &[0x20, 1, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            32,
        )],
        destination_ports: vec![8080],
        not_destination_ports: vec![9090],
        ..Default::default()
    };
    let bytes = resource(m).encode_to_vec();
    let p = xds::decode(&bytes).unwrap().to_policy().unwrap();
    assert_eq!(
        (p.scope, p.action, p.dry_run),
        (Scope::Namespace, Action::Deny, false)
    );
    assert_eq!(
        p.rules[0].clauses[0].matches[0],
        Match {
            namespaces: vec![StringMatch::Prefix("team-".into())],
            not_principals: vec![StringMatch::Presence],
            service_accounts: vec![ServiceAccount {
                namespace: "a".into(),
                service_account: "alice".into()
            }],
            source_ips: vec!["10.0.0.0/8".parse().unwrap()],
            destination_ips: vec!["2001:db8::/32".parse().unwrap()],
            destination_ports: vec![8080],
            not_destination_ports: vec![9090],
            ..Match::default()
        }
    );
}

#[test]
fn what_ztunnel_would_reshape_is_refused_naming_the_entry_and_held_closed() {
    let cases: Vec<(xds::XdsMatch, &str)> = vec![
        (
            xds::XdsMatch {
                source_ips: vec![addr(&[10, 0, 0, 0], 8), addr(&[10, 0, 0], 8)],
                ..Default::default()
            },
            "authorization ns/p: rules[0].clauses[0].matches[0].source_ips[1]: an address of 3 bytes (4 or 16 expected)",
        ),
        (
            xds::XdsMatch {
                not_destination_ips: vec![addr(&[10, 0, 0, 0], 264)],
                ..Default::default()
            },
            "authorization ns/p: rules[0].clauses[0].matches[0].not_destination_ips[0]: prefix length 264 is longer than 32 bits for 10.0.0.0",
        ),
        (
            xds::XdsMatch {
                principals: vec![xds::XdsStringMatch { match_type: None }],
                ..Default::default()
            },
            "authorization ns/p: rules[0].clauses[0].matches[0].principals[0]: a string match with none of exact, prefix, suffix, presence",
        ),
        (
            xds::XdsMatch {
                destination_ports: vec![70000],
                ..Default::default()
            },
            "authorization ns/p: rules[0].clauses[0].matches[0].destination_ports[0]: port 70000 is above 65535",
        ),
    ];
    for (m, want) in cases {
        let e = resource(m).to_policy().unwrap_err();
        assert_eq!(e.to_string(), want);
        let closed = e.closed().expect("scope and action were read");
        // A DENY held closed denies everything in its scope.
        let c = conn("192.0.2.1:1", "192.0.2.2:2", None);
        assert!(closed.matches(&c), "{want}");
    }
    let mut allow = resource(xds::XdsMatch {
        destination_ports: vec![1 << 16],
        ..Default::default()
    });
    allow.action = 0;
    let closed = allow.to_policy().unwrap_err().closed().unwrap();
    assert_eq!(
        decide(&[&closed], &conn("192.0.2.1:1", "192.0.2.2:2", None)),
        Decision::Deny(Denial::NotAllowed),
        "an ALLOW held closed allows nothing"
    );
    let mut bad = resource(xds::XdsMatch::default());
    bad.scope = 7;
    let e = bad.to_policy().unwrap_err();
    assert_eq!(e.to_string(), "authorization ns/p: scope: unknown scope 7");
    assert!(e.closed().is_none());
}

/// Random resources survive the wire: what is encoded decodes and
/// converts to the policy it describes (every field in its place).
#[test]
fn random_resources_convert_to_the_policy_they_describe() {
    use prost::Message;
    let mut rng = fastrand::Rng::with_seed(7);
    let strings = ["a", "", "cluster.local/ns/a/sa/alice", "/sa/bob"];
    for _ in 0..2000 {
        let mut m = Match::default();
        let mut x = xds::XdsMatch::default();
        if rng.bool() {
            let s = strings[rng.usize(..strings.len())].to_owned();
            let (ours, theirs) = match rng.u8(..4) {
                0 => (StringMatch::Exact(s.clone()), xds::MatchType::Exact(s)),
                1 => (StringMatch::Prefix(s.clone()), xds::MatchType::Prefix(s)),
                2 => (StringMatch::Suffix(s.clone()), xds::MatchType::Suffix(s)),
                _ => (
                    StringMatch::Presence,
                    xds::MatchType::Presence(xds::Empty {}),
                ),
            };
            let theirs = xds::XdsStringMatch {
                match_type: Some(theirs),
            };
            if rng.bool() {
                m.principals.push(ours);
                x.principals.push(theirs);
            } else {
                m.not_namespaces.push(ours);
                x.not_namespaces.push(theirs);
            }
        }
        if rng.bool() {
            let len = rng.u32(..=32);
            let octets = rng.u32(..).to_be_bytes();
            m.not_source_ips
                .push(crate::Cidr::new(octets.into(), len).unwrap());
            x.not_source_ips.push(addr(&octets, len));
        }
        if rng.bool() {
            let len = rng.u32(..=128);
            let octets = rng.u128(..).to_be_bytes();
            m.destination_ips
                .push(crate::Cidr::new(octets.into(), len).unwrap());
            x.destination_ips.push(addr(&octets, len));
        }
        if rng.bool() {
            let p = rng.u16(..);
            m.destination_ports.push(p);
            x.destination_ports.push(p.into());
        }
        let mut res = resource(x);
        res.dry_run = rng.bool();
        res.action = rng.i32(0..2);
        res.scope = rng.i32(0..3);
        let back = xds::decode(&res.encode_to_vec())
            .unwrap()
            .to_policy()
            .unwrap();
        assert_eq!(back.rules[0].clauses[0].matches[0], m);
        assert_eq!(back.dry_run, res.dry_run);
        assert_eq!(back.action == Action::Deny, res.action == 1);
        assert_eq!(
            back.scope,
            [Scope::Global, Scope::Namespace, Scope::WorkloadSelector][res.scope as usize]
        );
    }
}

#[test]
fn ipv6_ranges_match_ipv6_peers_and_mapped_addresses_are_their_ipv4_address() {
    let deny_src = |range: &str| {
        policy(
            Action::Deny,
            vec![rule(vec![vec![Match {
                source_ips: vec![range.parse().unwrap()],
                ..Match::default()
            }]])],
        )
    };
    let allow_dst = |range: &str| {
        policy(
            Action::Allow,
            vec![rule(vec![vec![Match {
                destination_ips: vec![range.parse().unwrap()],
                ..Match::default()
            }]])],
        )
    };
    let denied = Decision::Deny(Denial::ExplicitlyDenied {
        namespace: "ns".into(),
        name: "p".into(),
    });
    let rows: Vec<(&str, Policy, &str, &str, Decision)> = vec![
        (
            "an IPv6 source range holds an IPv6 peer",
            deny_src("fd00:10::/64"),
            "[fd00:10::7]:5000",
            "[fd00:20::1]:8080",
            denied.clone(),
        ),
        (
            "and not one outside it",
            deny_src("fd00:10::/64"),
            "[fd00:11::7]:5000",
            "[fd00:20::1]:8080",
            Decision::Allow,
        ),
        (
            "nor an IPv4 peer",
            deny_src("::/0"),
            "10.0.0.1:5000",
            "10.0.1.1:8080",
            Decision::Allow,
        ),
        (
            "an IPv6 destination range allows its own",
            allow_dst("fd00:20::/48"),
            "[fd00:10::7]:5000",
            "[fd00:20:0:1::1]:8080",
            Decision::Allow,
        ),
        (
            "and no other",
            allow_dst("fd00:20::/48"),
            "[fd00:10::7]:5000",
            "[fd00:21::1]:8080",
            Decision::Deny(Denial::NotAllowed),
        ),
        (
            "an IPv4-mapped peer is its IPv4 address: denied by the IPv4 rule",
            deny_src("10.0.0.0/24"),
            "[::ffff:10.0.0.1]:5000",
            "10.0.1.1:8080",
            denied.clone(),
        ),
        (
            "an IPv4-mapped destination is allowed as its IPv4 address",
            allow_dst("10.0.1.1"),
            "10.0.0.1:5000",
            "[::ffff:10.0.1.1]:8080",
            Decision::Allow,
        ),
        (
            "and a mapped range is the IPv4 range",
            deny_src("::ffff:10.0.0.0/120"),
            "10.0.0.1:5000",
            "10.0.1.1:8080",
            denied.clone(),
        ),
    ];
    for (what, p, src, dst, want) in rows {
        assert_eq!(decide(&[&p], &conn(src, dst, None)), want, "{what}");
    }
}

#[test]
fn a_refusal_is_remembered_until_the_key_is_written_again() {
    let mut store = PolicyStore::default();
    store.insert("demo/b".into(), one(Match::default()));
    store.insert("demo/a".into(), one(Match::default()));
    store.refuse("demo/a", "rules[0]: bad", Held::LastVersion);
    store.refuse("demo/gone", "scope: unknown", Held::Nothing);
    let a = store.refusal("demo/a").unwrap();
    assert_eq!((&*a.reason, a.held), ("rules[0]: bad", Held::LastVersion));
    assert!(store.refusal("demo/b").is_none());
    let keys: Vec<&str> = store.iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["demo/a", "demo/b"], "held, in key order");
    assert_eq!(store.refusals().count(), 2);
    let before = store.clone();
    store.refuse("demo/b", "again", Held::LastVersion);
    assert_ne!(store, before, "a refusal is part of what is held");

    store.insert("demo/a".into(), one(Match::default()));
    assert!(store.refusal("demo/a").is_none(), "a new version clears it");
    store.remove("demo/gone");
    assert!(store.refusal("demo/gone").is_none(), "a removal clears it");
}
