//! An `AuthorizationPolicy` as istiod converts it for a node proxy
//! (`convertAuthorizationPolicy` in istiod's ambient index):
//!
//! - bound to a target (`targetRef`, `targetRefs`): for a waypoint, not
//!   for this node; AUDIT and CUSTOM: not enforced by a node proxy; the
//!   `istio.io/dry-run` annotation: not sent (held here as dry-run, so it
//!   is logged and never enforced);
//! - no selector: NAMESPACE scope, or GLOBAL in the root namespace; a
//!   selector: WORKLOAD_SELECTOR;
//! - each rule becomes one rule of clauses: its `to` entries (ports), its
//!   `from` entries (principals, namespaces, service accounts — `name`
//!   alone meaning the policy's namespace — and IP blocks), then one
//!   clause per `when` condition on `source.ip`, `source.namespace`,
//!   `source.principal`, `destination.ip` or `destination.port`;
//! - strings: `*` is presence, `*x` a suffix, `x*` a prefix, else exact;
//! - a rule naming an HTTP attribute (hosts, methods, paths, request
//!   principals, remote IP blocks, any other `when` key) is left to
//!   waypoints: in an ALLOW the whole rule is dropped (it never allows);
//!   in a DENY only the HTTP attributes are (istiod's conversion, so this
//!   node decides as ztunnel would).
//!
//! Where istiod drops a malformed entry silently (a port or an address
//! that does not parse), the resource is refused instead: held closed.

use std::collections::BTreeSet;

use super::resources::{
    AuthorizationPolicySpec, Condition, Object, Operation, PolicyAction, Source,
};
use super::{Converted, Outcome};
use crate::cidr::Cidr;
use crate::policy::{Action, Clause, Match, Policy, Rule, Scope, ServiceAccount, StringMatch};
use crate::xds::ConvertError;

/// The `when` keys a node proxy reads.
const L4_WHEN_KEYS: [&str; 5] = [
    "source.ip",
    "source.namespace",
    "source.principal",
    "destination.ip",
    "destination.port",
];

/// The annotation that makes a policy log-only.
pub const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

pub fn convert(root_namespace: &str, obj: &Object<AuthorizationPolicySpec>) -> Converted {
    let spec = &obj.spec;
    let key = obj.key();
    let skipped = |why: &str| Converted {
        key: key.clone(),
        policy: None,
        outcome: Outcome::Skipped(why.to_owned()),
    };
    if spec.target_ref.is_some() || !spec.target_refs.is_empty() {
        return skipped("bound to a target (targetRef): enforced by a waypoint, not a node proxy");
    }
    let action = match spec.action {
        PolicyAction::Allow => Action::Allow,
        PolicyAction::Deny => Action::Deny,
        PolicyAction::Audit => return skipped("ztunnel does not support the AUDIT action"),
        PolicyAction::Custom => return skipped("ztunnel does not support the CUSTOM action"),
    };
    let scope = match (&spec.selector, obj.namespace == root_namespace) {
        (Some(_), _) => Scope::WorkloadSelector,
        (None, true) => Scope::Global,
        (None, false) => Scope::Namespace,
    };
    let dry_run = obj
        .annotations
        .get(DRY_RUN_ANNOTATION)
        .is_some_and(|v| parse_bool(v));
    let (rules, http) = match rules_of(spec, action, &obj.namespace) {
        Ok(converted) => converted,
        Err(bad) => {
            let err = ConvertError::new(
                &obj.namespace,
                &obj.name,
                bad.field,
                bad.problem,
                Some((scope, action, dry_run)),
            );
            return Converted::refused(key, &err);
        }
    };
    let policy = Policy {
        name: obj.name.clone(),
        namespace: obj.namespace.clone(),
        scope,
        action,
        rules,
        dry_run,
    };
    let outcome = if http.is_empty() {
        Outcome::Enforced
    } else {
        let found: Vec<_> = http.into_iter().collect();
        let effect = match action {
            Action::Allow => "the ALLOW rules that name them are dropped (they never allow)",
            Action::Deny => "the DENY is enforced without them",
        };
        Outcome::HttpIgnored(format!(
            "HTTP attributes ({}) are enforced by a waypoint, not a node proxy: {effect}",
            found.join(", ")
        ))
    };
    Converted {
        key,
        policy: Some(policy),
        outcome,
    }
}

/// The rules as istiod writes them, and the HTTP attributes met.
fn rules_of(
    spec: &AuthorizationPolicySpec,
    action: Action,
    namespace: &str,
) -> Result<(Vec<Rule>, BTreeSet<String>), Bad> {
    let mut rules = Vec::new();
    let mut http = BTreeSet::new();
    for (r, rule) in spec.rules.iter().enumerate() {
        let at = |field: &str, bad: Bad| bad.under(&format!("rules[{r}].{field}"));
        let mut found = BTreeSet::new();
        let mut clauses = Vec::new();
        let mut to = Vec::new();
        for (i, t) in rule.to.iter().enumerate() {
            let op = &t.operation;
            http_operation(op, &mut found);
            let ports =
                |field, list| ports(field, list).map_err(|b| at(&format!("to[{i}].operation"), b));
            to.push(Match {
                destination_ports: ports("ports", &op.ports)?,
                not_destination_ports: ports("notPorts", &op.not_ports)?,
                ..Match::default()
            });
        }
        let mut from = Vec::new();
        for (i, f) in rule.from.iter().enumerate() {
            http_source(&f.source, &mut found);
            let m = source_match(&f.source, namespace)
                .map_err(|b| at(&format!("from[{i}].source"), b))?;
            from.push(m);
        }
        if !to.is_empty() {
            clauses.push(Clause { matches: to });
        }
        if !from.is_empty() {
            clauses.push(Clause { matches: from });
        }
        for (i, when) in rule.when.iter().enumerate() {
            if !L4_WHEN_KEYS.contains(&when.key.as_str()) {
                found.insert(when.key.clone());
            }
            let m = when_match(when).map_err(|b| at(&format!("when[{i}]"), b))?;
            clauses.push(Clause { matches: vec![m] });
        }
        let l7 = !found.is_empty();
        http.extend(found);
        if action == Action::Allow && l7 {
            // An ALLOW rule that needs HTTP never matches at L4.
            continue;
        }
        rules.push(Rule { clauses });
    }
    Ok((rules, http))
}

/// Go's `strconv.ParseBool`, which istiod reads the annotation with.
fn parse_bool(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "TRUE" | "true" | "True")
}

fn http_operation(op: &Operation, found: &mut BTreeSet<String>) {
    for (name, list) in [
        ("hosts", &op.hosts),
        ("notHosts", &op.not_hosts),
        ("methods", &op.methods),
        ("notMethods", &op.not_methods),
        ("paths", &op.paths),
        ("notPaths", &op.not_paths),
    ] {
        if !list.is_empty() {
            found.insert(name.to_owned());
        }
    }
}

fn http_source(s: &Source, found: &mut BTreeSet<String>) {
    for (name, list) in [
        ("remoteIpBlocks", &s.remote_ip_blocks),
        ("notRemoteIpBlocks", &s.not_remote_ip_blocks),
        ("requestPrincipals", &s.request_principals),
        ("notRequestPrincipals", &s.not_request_principals),
    ] {
        if !list.is_empty() {
            found.insert(name.to_owned());
        }
    }
}

/// A malformed entry: where (`rules[0].from[1].source.ipBlocks[2]`) and why.
struct Bad {
    field: String,
    problem: String,
}

impl Bad {
    fn new(field: &str, i: usize, problem: String) -> Bad {
        Bad {
            field: format!("{field}[{i}]"),
            problem,
        }
    }

    fn under(mut self, parent: &str) -> Bad {
        self.field = format!("{parent}.{}", self.field);
        self
    }
}

fn strings(list: &[String]) -> Vec<StringMatch> {
    list.iter()
        .map(|v| {
            if v == "*" {
                StringMatch::Presence
            } else if let Some(s) = v.strip_prefix('*') {
                StringMatch::Suffix(s.to_owned())
            } else if let Some(p) = v.strip_suffix('*') {
                StringMatch::Prefix(p.to_owned())
            } else {
                StringMatch::Exact(v.clone())
            }
        })
        .collect()
}

fn accounts(list: &[String], namespace: &str) -> Vec<ServiceAccount> {
    list.iter()
        .map(|v| match v.split_once('/') {
            Some((ns, sa)) => ServiceAccount {
                namespace: ns.to_owned(),
                service_account: sa.to_owned(),
            },
            None => ServiceAccount {
                namespace: namespace.to_owned(),
                service_account: v.clone(),
            },
        })
        .collect()
}

fn ports(field: &str, list: &[String]) -> Result<Vec<u16>, Bad> {
    list.iter()
        .enumerate()
        .map(|(i, p)| {
            p.parse::<u16>()
                .map_err(|_| Bad::new(field, i, format!("{p:?} is not a port number (0-65535)")))
        })
        .collect()
}

fn ranges(field: &str, list: &[String]) -> Result<Vec<Cidr>, Bad> {
    list.iter()
        .enumerate()
        .map(|(i, s)| {
            s.parse::<Cidr>()
                .map_err(|e| Bad::new(field, i, e.to_string()))
        })
        .collect()
}

fn source_match(s: &Source, namespace: &str) -> Result<Match, Bad> {
    Ok(Match {
        source_ips: ranges("ipBlocks", &s.ip_blocks)?,
        not_source_ips: ranges("notIpBlocks", &s.not_ip_blocks)?,
        namespaces: strings(&s.namespaces),
        not_namespaces: strings(&s.not_namespaces),
        service_accounts: accounts(&s.service_accounts, namespace),
        not_service_accounts: accounts(&s.not_service_accounts, namespace),
        principals: strings(&s.principals),
        not_principals: strings(&s.not_principals),
        ..Match::default()
    })
}

fn when_match(w: &Condition) -> Result<Match, Bad> {
    let mut m = Match::default();
    match w.key.as_str() {
        "source.namespace" => {
            m.namespaces = strings(&w.values);
            m.not_namespaces = strings(&w.not_values);
        }
        "source.principal" => {
            m.principals = strings(&w.values);
            m.not_principals = strings(&w.not_values);
        }
        "source.ip" => {
            m.source_ips = ranges("values", &w.values)?;
            m.not_source_ips = ranges("notValues", &w.not_values)?;
        }
        "destination.ip" => {
            m.destination_ips = ranges("values", &w.values)?;
            m.not_destination_ips = ranges("notValues", &w.not_values)?;
        }
        "destination.port" => {
            m.destination_ports = ports("values", &w.values)?;
            m.not_destination_ports = ports("notValues", &w.not_values)?;
        }
        _ => {}
    }
    Ok(m)
}
