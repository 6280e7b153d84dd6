//! The conversion, case by case: cases written from istiod's own
//! input → output pairs (its ambient index's test data) and its
//! conversion code, plus the refusals where tidegate is stricter.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::authorization_policy::convert as convert_ap;
use super::peer_authentication::{convert as convert_pa, keys_for};
use super::resources::{AuthorizationPolicySpec, Object, PeerAuthenticationSpec};
use super::{Conversion, Outcome};
use crate::policy::{Action, Match, Policy, Rule, Scope, ServiceAccount, StringMatch};
use crate::{Connection, Destination, Identity, PolicyStore};

const ROOT: &str = "istio-system";

/// Objects from a multi-document YAML, as the API server would hold them.
fn objects<S: DeserializeOwned>(yaml: &str) -> Vec<Object<S>> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| {
            let v = serde_yaml::Value::deserialize(doc).unwrap();
            let meta = &v["metadata"];
            let s = |k: &str| meta[k].as_str().unwrap_or_default().to_owned();
            Object {
                namespace: meta["namespace"].as_str().unwrap_or("default").to_owned(),
                name: s("name"),
                created: s("creationTimestamp"),
                annotations: serde_yaml::from_value(meta["annotations"].clone())
                    .unwrap_or_default(),
                spec: serde_yaml::from_value(v["spec"].clone()).unwrap(),
            }
        })
        .collect()
}

fn ap(yaml: &str) -> Object<AuthorizationPolicySpec> {
    objects(yaml).remove(0)
}

fn m(f: impl FnOnce(&mut Match)) -> Match {
    let mut m = Match::default();
    f(&mut m);
    m
}

use crate::tests::rule;

fn exact(s: &str) -> StringMatch {
    StringMatch::Exact(s.into())
}

#[test]
fn an_allow_policy_converts_field_by_field_and_drops_its_http_rules() {
    let c = convert_ap(
        ROOT,
        &ap(r#"
metadata: {name: allow, namespace: cfg}
spec:
  action: ALLOW
  rules:
  - from:
    - source:
        principals: ["principal", "principal-prefix-*", "*-suffix-principal", "*"]
        notPrincipals: ["not-principal"]
  - from:
    - source: {serviceAccounts: ["ns/sa", "sa-only"], notServiceAccounts: ["ns/sa-not"]}
  - from:
    - source: {requestPrincipals: ["issuer/subject"]}
  - from:
    - source: {ipBlocks: ["1.2.3.4", "5.6.0.0/16"], notIpBlocks: ["2.2.3.4"]}
  - to:
    - operation: {methods: ["GET"]}
  - to:
    - operation: {ports: ["80", "90"], notPorts: ["800"]}
  - when:
    - {key: "request.headers[X-header]", values: ["header"]}
  - when:
    - {key: source.namespace, values: ["ns", "ns-prefix-*"], notValues: ["not-ns"]}
    - {key: destination.port, values: ["91"], notValues: ["9001"]}
  - when:
    - {key: destination.ip, values: ["10.10.10.10", "192.168.10.0/24"]}
"#),
    );
    let p = c.policy.expect("converted");
    assert_eq!((p.scope, p.action), (Scope::Namespace, Action::Allow));
    assert_eq!(
        p.rules,
        vec![
            rule(vec![vec![m(|m| {
                m.principals = vec![
                    exact("principal"),
                    StringMatch::Prefix("principal-prefix-".into()),
                    StringMatch::Suffix("-suffix-principal".into()),
                    StringMatch::Presence,
                ];
                m.not_principals = vec![exact("not-principal")];
            })]]),
            rule(vec![vec![m(|m| {
                let sa = |ns: &str, sa: &str| ServiceAccount {
                    namespace: ns.into(),
                    service_account: sa.into(),
                };
                m.service_accounts = vec![sa("ns", "sa"), sa("cfg", "sa-only")];
                m.not_service_accounts = vec![sa("ns", "sa-not")];
            })]]),
            rule(vec![vec![m(|m| {
                m.source_ips = vec!["1.2.3.4/32".parse().unwrap(), "5.6.0.0/16".parse().unwrap()];
                m.not_source_ips = vec!["2.2.3.4/32".parse().unwrap()];
            })]]),
            rule(vec![vec![m(|m| {
                m.destination_ports = vec![80, 90];
                m.not_destination_ports = vec![800];
            })]]),
            rule(vec![
                vec![m(|m| {
                    m.namespaces = vec![exact("ns"), StringMatch::Prefix("ns-prefix-".into())];
                    m.not_namespaces = vec![exact("not-ns")];
                })],
                vec![m(|m| {
                    m.destination_ports = vec![91];
                    m.not_destination_ports = vec![9001];
                })],
            ]),
            rule(vec![vec![m(|m| {
                m.destination_ips = vec![
                    "10.10.10.10/32".parse().unwrap(),
                    "192.168.10.0/24".parse().unwrap(),
                ];
            })]]),
        ],
        "the requestPrincipals, methods and header rules are dropped whole"
    );
    match c.outcome {
        Outcome::HttpIgnored(msg) => assert!(
            msg.contains("methods, request.headers[X-header], requestPrincipals")
                && msg.contains("never allow"),
            "{msg}"
        ),
        other => panic!("expected HTTP attributes reported, got {other:?}"),
    }
}

fn conn(identity: Option<&Identity>, dst_port: u16) -> Connection<'_> {
    Connection {
        src: SocketAddr::from(([10, 0, 0, 1], 40000)),
        dst: SocketAddr::from(([10, 0, 0, 2], dst_port)),
        identity,
    }
}

fn store_of(policies: impl IntoIterator<Item = Policy>) -> PolicyStore {
    let mut s = PolicyStore::default();
    for p in policies {
        s.insert(p.key(), p);
    }
    s
}

#[test]
fn a_deny_keeps_its_l4_part_and_decides_as_ztunnel_does() {
    // From a principal, on GET: istiod keeps the `to` entry with its HTTP
    // field removed — an empty match, which ztunnel skips, so the rule
    // never matches at L4.
    let c = convert_ap(
        ROOT,
        &ap(r#"
metadata: {name: no-get, namespace: shop}
spec:
  action: DENY
  rules:
  - from: [{source: {principals: ["cluster.local/ns/shop/sa/bad"]}}]
    to: [{operation: {methods: ["GET"]}}]
  - from: [{source: {principals: ["cluster.local/ns/shop/sa/worse"]}}]
    to: [{operation: {ports: ["8080"], paths: ["/admin"]}}]
"#),
    );
    assert!(
        matches!(c.outcome, Outcome::HttpIgnored(ref m) if m.contains("enforced without them"))
    );
    let store = store_of(c.policy);
    let dest = Destination {
        namespace: "shop",
        policies: &[],
    };
    let bad = Identity::new("cluster.local", "shop", "bad");
    let worse = Identity::new("cluster.local", "shop", "worse");
    assert!(store.decide(&dest, &conn(Some(&bad), 8080)).is_allow());
    assert!(!store.decide(&dest, &conn(Some(&worse), 8080)).is_allow());
    assert!(store.decide(&dest, &conn(Some(&worse), 9090)).is_allow());
}

#[test]
fn scope_follows_the_selector_and_the_root_namespace() {
    let scope = |ns: &str, selector: &str| {
        let yaml = format!("metadata: {{name: p, namespace: {ns}}}\nspec: {{{selector}}}\n");
        convert_ap(ROOT, &ap(&yaml)).policy.unwrap().scope
    };
    assert_eq!(scope("shop", ""), Scope::Namespace);
    assert_eq!(scope(ROOT, ""), Scope::Global);
    assert_eq!(
        scope("shop", "selector: {matchLabels: {app: web}}"),
        Scope::WorkloadSelector
    );
    assert_eq!(
        scope(ROOT, "selector: {matchLabels: {app: web}}"),
        Scope::WorkloadSelector
    );
    // No rules: an ALLOW that allows nothing.
    assert!(
        convert_ap(ROOT, &ap("metadata: {name: p, namespace: a}\nspec: {}\n"))
            .policy
            .unwrap()
            .rules
            .is_empty()
    );
}

#[test]
fn waypoint_bound_audit_and_custom_policies_are_not_for_this_node() {
    for (spec, why) in [
        ("targetRefs: [{kind: Service, name: web}]", "targetRef"),
        ("targetRef: {kind: Gateway, name: waypoint}", "targetRef"),
        ("action: AUDIT", "ztunnel does not support the AUDIT action"),
        ("action: CUSTOM, provider: {name: ext}", "CUSTOM"),
    ] {
        let c = convert_ap(
            ROOT,
            &ap(&format!(
                "metadata: {{name: p, namespace: a}}\nspec: {{{spec}}}\n"
            )),
        );
        assert_eq!(c.policy, None, "{spec}");
        assert!(
            matches!(c.outcome, Outcome::Skipped(ref m) if m.contains(why)),
            "{spec}: {:?}",
            c.outcome
        );
    }
}

#[test]
fn the_dry_run_annotation_makes_a_policy_log_only() {
    let yaml = |v: &str| {
        format!("metadata: {{name: p, namespace: a, annotations: {{istio.io/dry-run: {v:?}}}}}\nspec: {{action: DENY, rules: [{{}}]}}\n")
    };
    assert!(convert_ap(ROOT, &ap(&yaml("true"))).policy.unwrap().dry_run);
    assert!(convert_ap(ROOT, &ap(&yaml("1"))).policy.unwrap().dry_run);
    assert!(
        !convert_ap(ROOT, &ap(&yaml("false")))
            .policy
            .unwrap()
            .dry_run
    );
}

#[test]
fn a_malformed_entry_refuses_the_resource_naming_it_and_holds_it_closed() {
    for (rules, at) in [
        (
            "[{to: [{operation: {ports: [http]}}]}]",
            "rules[0].to[0].operation.ports[0]",
        ),
        (
            "[{}, {from: [{source: {ipBlocks: [10.0.0.0/8, 10.0.0.300]}}]}]",
            "rules[1].from[0].source.ipBlocks[1]",
        ),
        (
            "[{from: [{source: {notIpBlocks: [\"\"]}}]}]",
            "rules[0].from[0].source.notIpBlocks[0]",
        ),
        (
            "[{when: [{key: destination.port, values: [\"70000\"]}]}]",
            "rules[0].when[0].values[0]",
        ),
        (
            "[{when: [{key: source.ip, notValues: [1.2.3.4/33]}]}]",
            "rules[0].when[0].notValues[0]",
        ),
    ] {
        for action in ["ALLOW", "DENY"] {
            let c = convert_ap(
                ROOT,
                &ap(&format!("metadata: {{name: p, namespace: a}}\nspec: {{action: {action}, rules: {rules}}}\n")),
            );
            let Outcome::Refused(msg) = &c.outcome else {
                panic!("{rules}: expected a refusal, got {:?}", c.outcome)
            };
            assert!(
                msg.starts_with(&format!("authorization a/p: {at}: ")),
                "{msg}"
            );
            let p = c.policy.unwrap();
            // Closed: an ALLOW that allows nothing, a DENY that denies all.
            let id = Identity::new("cluster.local", "a", "x");
            assert_eq!(
                p.matches(&conn(Some(&id), 80)),
                action == "DENY",
                "{rules} {action}"
            );
        }
    }
}

#[test]
fn a_refused_resource_keeps_its_previous_version_in_force() {
    let good = ap("metadata: {name: p, namespace: a}\nspec: {action: DENY, rules: [{to: [{operation: {ports: [\"9090\"]}}]}]}\n");
    let bad = ap("metadata: {name: p, namespace: a}\nspec: {action: DENY, rules: [{to: [{operation: {ports: [web]}}]}]}\n");
    let first = Conversion::new(
        ROOT,
        std::slice::from_ref(&good),
        vec![],
        &PolicyStore::default(),
    );
    assert_eq!(first.outcomes["a/p"], Outcome::Enforced);
    let second = Conversion::new(ROOT, std::slice::from_ref(&bad), vec![], &first.policies);
    assert!(matches!(second.outcomes["a/p"], Outcome::Refused(_)));
    assert_eq!(
        second.policies, first.policies,
        "the last good version stays"
    );
    let fresh = Conversion::new(ROOT, &[bad], vec![], &PolicyStore::default());
    assert_eq!(
        fresh.policies.get("a/p").unwrap().rules,
        vec![Rule::default()],
        "closed"
    );
}

fn pas(yaml: &str) -> Vec<Object<PeerAuthenticationSpec>> {
    objects(yaml)
}

fn no_identity(f: impl FnOnce(&mut Match)) -> Match {
    m(|m| {
        m.not_principals = vec![StringMatch::Presence];
        f(m)
    })
}

#[test]
fn strict_with_a_permissive_port_becomes_one_deny_with_the_exception() {
    let all = pas("metadata: {name: strict-and-permissive-mtls}\nspec: {selector: {matchLabels: {app: a}}, mtls: {mode: STRICT}, portLevelMtls: {\"9090\": {mode: PERMISSIVE}}}\n");
    let c = convert_pa(ROOT, &all[0], &all).unwrap();
    assert_eq!(
        c.key,
        "default/converted_peer_authentication_strict-and-permissive-mtls"
    );
    let p = c.policy.unwrap();
    assert_eq!((p.scope, p.action), (Scope::WorkloadSelector, Action::Deny));
    assert_eq!(
        p.rules,
        vec![rule(vec![
            vec![no_identity(|_| {})],
            vec![m(|m| m.not_destination_ports = vec![9090])],
        ])]
    );
    let labels = BTreeMap::from([("app".to_owned(), "a".to_owned())]);
    assert_eq!(
        keys_for(ROOT, &all, "default", &labels),
        ["default/converted_peer_authentication_strict-and-permissive-mtls"],
        "the static STRICT is left out: the converted policy carries it"
    );
}

const PERMISSIVE_ROOT: &str =
    "metadata: {name: default-mesh, namespace: istio-system}\nspec: {mtls: {mode: PERMISSIVE}}\n";

#[test]
fn strict_ports_under_permissive_levels_become_one_rule_each_in_port_order() {
    let all = pas(&format!(
        "{PERMISSIVE_ROOT}---\nmetadata: {{name: default-foo, namespace: foo}}\nspec: {{mtls: {{mode: PERMISSIVE}}}}\n---\n\
         metadata: {{name: workload, namespace: foo}}\nspec: {{selector: {{matchLabels: {{app: a}}}}, portLevelMtls: {{\"9090\": {{mode: STRICT}}, \"8080\": {{mode: STRICT}}}}}}\n"
    ));
    let c = convert_pa(ROOT, &all[2], &all).unwrap();
    assert_eq!(
        c.policy.unwrap().rules,
        vec![
            rule(vec![vec![
                no_identity(|m| m.destination_ports = vec![8080])
            ]]),
            rule(vec![vec![
                no_identity(|m| m.destination_ports = vec![9090])
            ]]),
        ]
    );
    assert!(
        convert_pa(ROOT, &all[0], &all).is_none(),
        "mesh-wide: no policy of its own"
    );
    assert!(
        convert_pa(ROOT, &all[1], &all).is_none(),
        "namespace-wide: no policy of its own"
    );
    let a = BTreeMap::from([("app".to_owned(), "a".to_owned())]);
    assert_eq!(
        keys_for(ROOT, &all, "foo", &a),
        ["foo/converted_peer_authentication_workload"]
    );
    assert!(
        keys_for(ROOT, &all, "foo", &BTreeMap::new()).is_empty(),
        "permissive"
    );
}

#[test]
fn a_permissive_port_under_a_strict_namespace_merges_the_strictness() {
    let all = pas(&format!(
        "{PERMISSIVE_ROOT}---\nmetadata: {{name: default-foo, namespace: foo}}\nspec: {{mtls: {{mode: STRICT}}}}\n---\n\
         metadata: {{name: workload, namespace: foo}}\nspec: {{selector: {{matchLabels: {{app: a}}}}, portLevelMtls: {{\"9090\": {{mode: PERMISSIVE}}}}}}\n"
    ));
    let c = convert_pa(ROOT, &all[2], &all).unwrap();
    assert_eq!(
        c.policy.unwrap().rules,
        vec![rule(vec![
            vec![m(|m| m.not_destination_ports = vec![9090])],
            vec![no_identity(|_| {})],
        ])]
    );
    let a = BTreeMap::from([("app".to_owned(), "a".to_owned())]);
    assert_eq!(
        keys_for(ROOT, &all, "foo", &a),
        ["foo/converted_peer_authentication_workload"]
    );
    assert_eq!(
        keys_for(ROOT, &all, "foo", &BTreeMap::new()),
        ["istio-system/istio_converted_static_strict"],
        "other workloads of the strict namespace"
    );
    assert!(
        keys_for(ROOT, &all, "bar", &a).is_empty(),
        "the mesh is permissive"
    );
}

#[test]
fn the_oldest_policy_of_a_level_wins() {
    let all = pas(
        "metadata: {name: new, namespace: foo, creationTimestamp: \"2026-01-02T00:00:00Z\"}\nspec: {mtls: {mode: PERMISSIVE}}\n---\n\
         metadata: {name: old, namespace: foo, creationTimestamp: \"2026-01-01T00:00:00Z\"}\nspec: {mtls: {mode: STRICT}}\n",
    );
    assert_eq!(
        keys_for(ROOT, &all, "foo", &BTreeMap::new()),
        ["istio-system/istio_converted_static_strict"]
    );
}

#[test]
fn a_port_key_that_is_not_a_port_refuses_the_converted_policy() {
    let all = pas("metadata: {name: w, namespace: foo}\nspec: {selector: {matchLabels: {app: a}}, mtls: {mode: STRICT}, portLevelMtls: {web: {mode: PERMISSIVE}}}\n");
    let c = convert_pa(ROOT, &all[0], &all).unwrap();
    assert!(
        matches!(&c.outcome, Outcome::Refused(m) if m.contains("portLevelMtls[\"web\"]")),
        "{:?}",
        c.outcome
    );
    assert_eq!(
        c.policy.unwrap().rules,
        vec![Rule::default()],
        "held closed: deny all"
    );
}

#[test]
fn workloads_name_the_selecting_policies_of_their_namespace_and_the_root() {
    let aps: Vec<Object<AuthorizationPolicySpec>> = objects(
        "metadata: {name: web-only, namespace: shop}\nspec: {selector: {matchLabels: {app: web}}}\n---\n\
         metadata: {name: everyone, namespace: shop}\nspec: {action: DENY, rules: [{}]}\n---\n\
         metadata: {name: mesh-web, namespace: istio-system}\nspec: {selector: {matchLabels: {app: web}}}\n---\n\
         metadata: {name: other-web, namespace: other}\nspec: {selector: {matchLabels: {app: web}}}\n---\n\
         metadata: {name: waypoint, namespace: shop}\nspec: {targetRefs: [{kind: Service, name: web}]}\n",
    );
    let strict =
        pas("metadata: {name: default, namespace: istio-system}\nspec: {mtls: {mode: STRICT}}\n");
    let c = Conversion::new(ROOT, &aps, strict, &PolicyStore::default());
    let web = BTreeMap::from([("app".to_owned(), "web".to_owned())]);
    assert_eq!(
        c.policies_for("shop", &web),
        [
            "istio-system/mesh-web",
            "shop/web-only",
            "istio-system/istio_converted_static_strict"
        ]
    );
    assert_eq!(
        c.policies_for("shop", &BTreeMap::new()),
        ["istio-system/istio_converted_static_strict"]
    );
    assert!(c.policies.get("shop/waypoint").is_none());
    assert_eq!(c.outcomes["shop/waypoint"].label(), "skipped");
    // The namespace-scoped DENY applies by scope, never by name.
    assert_eq!(
        c.policies.get("shop/everyone").unwrap().scope,
        Scope::Namespace
    );
    // Plaintext to a web pod of another namespace is refused by the
    // mesh-wide STRICT; with an identity, by the ALLOWs without rules
    // that select it (they allow nothing).
    let names = c.policies_for("other", &web);
    let dest = Destination {
        namespace: "other",
        policies: &names,
    };
    assert_eq!(
        c.policies.decide(&dest, &conn(None, 80)),
        crate::Decision::Deny(crate::Denial::ExplicitlyDenied {
            namespace: ROOT.into(),
            name: "istio_converted_static_strict".into()
        })
    );
    let id = Identity::new("cluster.local", "other", "x");
    assert_eq!(
        c.policies.decide(&dest, &conn(Some(&id), 80)),
        crate::Decision::Deny(crate::Denial::NotAllowed)
    );
}

#[test]
fn istiods_looser_conditions_are_reproduced_as_written() {
    let a = BTreeMap::from([("app".to_owned(), "a".to_owned())]);
    let strict_mesh =
        "metadata: {name: mesh, namespace: istio-system}\nspec: {mtls: {mode: STRICT}}\n";
    // A STRICT port under a PERMISSIVE workload mode, the namespace level
    // unset, the mesh STRICT: no rule for the port, and the workload names
    // the converted policy, which is not held.
    let all = pas(&format!(
        "{strict_mesh}---\nmetadata: {{name: w, namespace: foo}}\nspec: {{selector: {{matchLabels: {{app: a}}}}, mtls: {{mode: PERMISSIVE}}, portLevelMtls: {{\"8080\": {{mode: STRICT}}}}}}\n"
    ));
    assert!(convert_pa(ROOT, &all[1], &all).is_none());
    assert_eq!(
        keys_for(ROOT, &all, "foo", &a),
        ["foo/converted_peer_authentication_w"]
    );
    // A PERMISSIVE port with an UNSET namespace policy in a STRICT mesh:
    // the workload drops the shared STRICT for a policy not held.
    let all = pas(&format!(
        "{strict_mesh}---\nmetadata: {{name: ns, namespace: foo}}\nspec: {{}}\n---\n\
         metadata: {{name: w, namespace: foo}}\nspec: {{selector: {{matchLabels: {{app: a}}}}, portLevelMtls: {{\"8080\": {{mode: PERMISSIVE}}}}}}\n"
    ));
    assert!(convert_pa(ROOT, &all[2], &all).is_none());
    assert_eq!(
        keys_for(ROOT, &all, "foo", &a),
        ["foo/converted_peer_authentication_w"]
    );
    assert_eq!(
        keys_for(ROOT, &all, "foo", &BTreeMap::new()),
        ["istio-system/istio_converted_static_strict"]
    );
}
