//! `policies` of `/config_dump`: every authorization policy held, in
//! ztunnel's shape (`istioctl ztunnel-config policies` reads it: name,
//! namespace, scope, action, rules as rules of clauses of matches,
//! `dryRun`), and how tidegate holds each (`held`):
//!
//! - `applied`: enforced as istiod sent it;
//! - `dry-run`: logged, never enforced (`dryRun` true);
//! - `last-version`: istiod's latest version was refused (`refused` says
//!   why); the one before it is enforced;
//! - `closed`: refused with no earlier version; held closed (an ALLOW
//!   that allows nothing, a DENY of everything), `rules` show it so;
//! - `nothing`: refused, and its scope or action unreadable: nothing
//!   could be held (listed with empty `rules`).

use serde_json::{json, Value};
use tidegate_authz::{Action, Held, Match, Policy, PolicyStore, Scope, StringMatch};

/// Every policy of `store`, in key order, then the refused ones that hold
/// nothing.
pub(super) fn policies(store: &PolicyStore) -> Vec<Value> {
    let mut out: Vec<Value> = store
        .iter()
        .map(|(key, p)| {
            let mut v = policy(p);
            v["key"] = json!(key);
            match store.refusal(key) {
                Some(r) => {
                    v["held"] = json!(r.held);
                    v["refused"] = json!(&*r.reason);
                }
                None if p.dry_run => v["held"] = json!("dry-run"),
                None => v["held"] = json!("applied"),
            }
            v
        })
        .collect();
    let mut unheld: Vec<(&str, &str)> = store
        .refusals()
        .filter(|(_, r)| r.held == Held::Nothing)
        .map(|(k, r)| (k, &*r.reason))
        .collect();
    unheld.sort_unstable();
    out.extend(unheld.into_iter().map(|(key, reason)| {
        let (namespace, name) = key.split_once('/').unwrap_or(("", key));
        json!({
            "name": name,
            "namespace": namespace,
            "scope": "",
            "action": "",
            "rules": [],
            "dryRun": false,
            "key": key,
            "held": Held::Nothing,
            "refused": reason,
        })
    }));
    out
}

/// One policy as ztunnel writes its `Authorization`.
fn policy(p: &Policy) -> Value {
    let scope = match p.scope {
        Scope::Global => "Global",
        Scope::Namespace => "Namespace",
        Scope::WorkloadSelector => "WorkloadSelector",
    };
    let action = match p.action {
        Action::Allow => "Allow",
        Action::Deny => "Deny",
    };
    let rules: Vec<Vec<Vec<Value>>> = p
        .rules
        .iter()
        .map(|r| {
            r.clauses
                .iter()
                .map(|c| c.matches.iter().map(rbac_match).collect())
                .collect()
        })
        .collect();
    json!({
        "name": p.name,
        "namespace": p.namespace,
        "scope": scope,
        "action": action,
        "rules": rules,
        "dryRun": p.dry_run,
    })
}

/// `items` under `key`, unless there are none (ztunnel leaves empty lists
/// out).
fn list<T: serde::Serialize>(o: &mut serde_json::Map<String, Value>, key: &str, items: &[T]) {
    if !items.is_empty() {
        o.insert(key.into(), json!(items));
    }
}

/// A match as ztunnel's `RbacMatch`: camelCase lists, empty ones left out.
fn rbac_match(m: &Match) -> Value {
    let mut o = serde_json::Map::new();
    let mut strings = |key: &str, list: &[StringMatch]| {
        if !list.is_empty() {
            o.insert(key.into(), list.iter().map(string_match).collect());
        }
    };
    strings("namespaces", &m.namespaces);
    strings("notNamespaces", &m.not_namespaces);
    strings("principals", &m.principals);
    strings("notPrincipals", &m.not_principals);
    let accounts = |list: &[tidegate_authz::ServiceAccount]| -> Vec<Value> {
        list.iter()
            .map(|a| json!({"namespace": a.namespace, "serviceAccount": a.service_account}))
            .collect()
    };
    list(&mut o, "serviceAccounts", &accounts(&m.service_accounts));
    list(
        &mut o,
        "notServiceAccounts",
        &accounts(&m.not_service_accounts),
    );
    list(&mut o, "sourceIps", &m.source_ips);
    list(&mut o, "notSourceIps", &m.not_source_ips);
    list(&mut o, "destinationIps", &m.destination_ips);
    list(&mut o, "notDestinationIps", &m.not_destination_ips);
    list(&mut o, "destinationPorts", &m.destination_ports);
    list(&mut o, "notDestinationPorts", &m.not_destination_ports);
    Value::Object(o)
}

/// `{"Exact": s}`, `{"Prefix": s}`, `{"Suffix": s}`, `{"Presence": []}`.
fn string_match(m: &StringMatch) -> Value {
    match m {
        StringMatch::Exact(s) => json!({ "Exact": s }),
        StringMatch::Prefix(s) => json!({ "Prefix": s }),
        StringMatch::Suffix(s) => json!({ "Suffix": s }),
        StringMatch::Presence => json!({ "Presence": [] }),
    }
}
