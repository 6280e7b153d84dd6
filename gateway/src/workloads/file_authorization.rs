//! The workload file's `authorization:` policies: each named once, and
//! every key a workload names held — a typo refuses the file, naming the
//! key, rather than leave a workload without the policy meant for it.

use std::collections::BTreeSet;

use tidegate_authz::{Policy, PolicyStore};

use super::WorkloadSpec;

/// The policies indexed by key (`<namespace>/<name>`), or the first
/// problem as (the file's key, message).
pub(super) fn check(
    policies: Vec<Policy>,
    workloads: &[WorkloadSpec],
) -> Result<PolicyStore, (String, String)> {
    let mut store = PolicyStore::default();
    let mut keys = BTreeSet::new();
    for (i, p) in policies.into_iter().enumerate() {
        let bad = |field: &str, message: String| (format!("authorization[{i}].{field}"), message);
        if p.name.is_empty() {
            return Err(bad("name", "must not be empty".into()));
        }
        if p.namespace.is_empty() {
            return Err(bad("namespace", "must not be empty".into()));
        }
        let key = p.key();
        if !keys.insert(key.clone()) {
            return Err(bad("name", format!("duplicate policy {key}")));
        }
        store.insert(key, p);
    }
    for (i, w) in workloads.iter().enumerate() {
        for (j, key) in w.authorization_policies.iter().enumerate() {
            if !keys.contains(key) {
                return Err((
                    format!("workloads[{i}].authorization_policies[{j}]"),
                    format!("no policy {key:?} under `authorization:`"),
                ));
            }
        }
    }
    Ok(store)
}

#[cfg(test)]
mod tests {
    use crate::workloads::{parse_file, WorkloadFileError};

    const WORKLOAD: &str = "workloads:\n- {uid: u1, name: web, namespace: shop, ips: [10.0.0.1], node: n, authorization_policies: [shop/web-only-frontend]}\n";

    fn refused(text: &str) -> String {
        match parse_file(text) {
            Err(WorkloadFileError::Invalid { key, message }) => format!("{key}: {message}"),
            other => panic!(
                "expected a refusal, got {:?}",
                other.map(|p| p.policies.len())
            ),
        }
    }

    #[test]
    fn policies_are_read_indexed_and_named_by_workloads() {
        let text = format!(
            "{WORKLOAD}authorization:\n\
             - name: web-only-frontend\n  namespace: shop\n  scope: workload_selector\n  action: allow\n  rules:\n  - clauses:\n    - matches:\n      - principals: [{{exact: cluster.local/ns/shop/sa/frontend}}]\n\
             - name: no-plaintext\n  namespace: shop\n  scope: namespace\n  action: deny\n  rules:\n  - clauses:\n    - matches:\n      - not_principals: [{{presence: {{}}}}]\n"
        );
        let parsed = parse_file(&text).unwrap();
        assert_eq!(parsed.policies.len(), 2);
        let p = parsed.policies.get("shop/web-only-frontend").unwrap();
        assert_eq!(p.rules[0].clauses[0].matches[0].principals.len(), 1);
        assert!(parsed.policies.get("shop/no-plaintext").is_some());
    }

    #[test]
    fn a_bad_policy_or_an_unknown_key_refuses_the_file_naming_it() {
        let policy = "- {name: web-only-frontend, namespace: shop, scope: workload_selector, action: allow}\n";
        assert_eq!(
            refused(WORKLOAD),
            "workloads[0].authorization_policies[0]: no policy \"shop/web-only-frontend\" under `authorization:`"
        );
        assert_eq!(
            refused(&format!("{WORKLOAD}authorization:\n{policy}{policy}")),
            "authorization[1].name: duplicate policy shop/web-only-frontend"
        );
        let bad_scope =
            "authorization:\n- {name: x, namespace: shop, scope: cluster, action: allow}\n";
        let e = refused(&format!("{WORKLOAD}{bad_scope}"));
        assert!(
            e.starts_with("authorization[0].scope: ") && e.contains("unknown variant `cluster`"),
            "{e}"
        );
        let two = "authorization:\n- {name: x, namespace: shop, scope: namespace, action: deny, rules: [{clauses: [{matches: [{principals: [{exact: a, prefix: b}]}]}]}]}\n";
        let e = refused(&format!("{WORKLOAD}{two}"));
        assert!(
            e.contains("exactly one of exact, prefix, suffix, presence"),
            "{e}"
        );
        let bad_cidr = "authorization:\n- {name: x, namespace: shop, scope: namespace, action: deny, rules: [{clauses: [{matches: [{source_ips: [10.0.0.0/33]}]}]}]}\n";
        let e = refused(&format!("{WORKLOAD}{bad_cidr}"));
        assert!(
            e.contains("source_ips") && e.contains("prefix length 33"),
            "{e}"
        );
        let unknown_field = "authorization:\n- {name: x, namespace: shop, scope: namespace, action: deny, rules: [{clauses: [{matches: [{paths: [/admin]}]}]}]}\n";
        assert!(refused(&format!("{WORKLOAD}{unknown_field}")).contains("unknown field `paths`"));
    }
}
