//! SPIFFE identities as HBONE carries them: URI SANs of the form
//! `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// A workload identity. Cheap to clone (one shared allocation holding its
/// URI); compared by value; ordered by trust domain, namespace, then
/// service account.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SpiffeId {
    /// `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`.
    uri: Arc<str>,
    /// Where the trust domain and the namespace end in `uri`.
    trust_domain_end: u32,
    namespace_end: u32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid SPIFFE id {input:?}: {reason} (expected spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>)")]
pub struct SpiffeIdError {
    input: String,
    reason: &'static str,
}

const SCHEME: &str = "spiffe://";
const NS: &str = "/ns/";
const SA: &str = "/sa/";

impl SpiffeId {
    pub fn new(trust_domain: &str, namespace: &str, service_account: &str) -> Self {
        let mut uri = String::new();
        Self::write_uri(&mut uri, trust_domain, namespace, service_account);
        let trust_domain_end = SCHEME.len() + trust_domain.len();
        let namespace_end = trust_domain_end + NS.len() + namespace.len();
        SpiffeId {
            uri: Arc::from(uri),
            // An identity's parts are DNS labels and names (at most 253
            // bytes each); saturating keeps a nonsense input harmless.
            trust_domain_end: u32::try_from(trust_domain_end).unwrap_or(u32::MAX),
            namespace_end: u32::try_from(namespace_end).unwrap_or(u32::MAX),
        }
    }

    /// Appends the URI of the identity of `service_account` in `namespace`
    /// of `trust_domain` to `out`, as [`SpiffeId::new`] writes it (for a
    /// lookup by URI without building the identity).
    pub fn write_uri(out: &mut String, trust_domain: &str, namespace: &str, service_account: &str) {
        for part in [SCHEME, trust_domain, NS, namespace, SA, service_account] {
            out.push_str(part);
        }
    }

    pub fn trust_domain(&self) -> &str {
        &self.uri[SCHEME.len()..self.trust_domain_end as usize]
    }

    pub fn namespace(&self) -> &str {
        &self.uri[self.trust_domain_end as usize + NS.len()..self.namespace_end as usize]
    }

    pub fn service_account(&self) -> &str {
        &self.uri[self.namespace_end as usize + SA.len()..]
    }

    /// The URI, as [`fmt::Display`] writes it, without formatting.
    pub fn as_str(&self) -> &str {
        &self.uri
    }

    /// Whether another clone of this identity is alive (an interning table
    /// lets go of the ones only it holds).
    pub fn is_shared(&self) -> bool {
        Arc::strong_count(&self.uri) > 1
    }
}

impl Ord for SpiffeId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        fn parts(id: &SpiffeId) -> (&str, &str, &str) {
            (id.trust_domain(), id.namespace(), id.service_account())
        }
        parts(self).cmp(&parts(other))
    }
}

impl PartialOrd for SpiffeId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Debug for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SpiffeId").field(&&*self.uri).finish()
    }
}

impl FromStr for SpiffeId {
    type Err = SpiffeIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| SpiffeIdError {
            input: s.to_owned(),
            reason,
        };
        let rest = s
            .strip_prefix("spiffe://")
            .ok_or_else(|| err("missing spiffe:// scheme"))?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            [td, "ns", ns, "sa", sa] => {
                if td.is_empty() || ns.is_empty() || sa.is_empty() {
                    return Err(err("empty path segment"));
                }
                let valid = |x: &str| {
                    x.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
                };
                if !valid(td) || !valid(ns) || !valid(sa) {
                    return Err(err("segments may hold only letters, digits, '-', '.', '_'"));
                }
                Ok(SpiffeId::new(td, ns, sa))
            }
            _ => Err(err("path is not /ns/<namespace>/sa/<service-account>")),
        }
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.uri)
    }
}

impl serde::Serialize for SpiffeId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let id: SpiffeId = "spiffe://cluster.local/ns/default/sa/echo".parse().unwrap();
        assert_eq!(id.trust_domain(), "cluster.local");
        assert_eq!(id.namespace(), "default");
        assert_eq!(id.service_account(), "echo");
        assert_eq!(id.to_string(), "spiffe://cluster.local/ns/default/sa/echo");
        assert_eq!(id.as_str(), "spiffe://cluster.local/ns/default/sa/echo");
        assert_eq!(id, SpiffeId::new("cluster.local", "default", "echo"));
    }

    /// Ordered by its parts, not by its URI ("a" before "a-b", where the
    /// URIs' '/' sorts after '-').
    #[test]
    fn orders_by_parts() {
        let a = SpiffeId::new("td", "a", "x");
        let ab = SpiffeId::new("td", "a-b", "x");
        assert!(a < ab);
        assert!(a.as_str() > ab.as_str());
        assert!(SpiffeId::new("td", "a", "y") > a);
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "http://cluster.local/ns/a/sa/b",
            "spiffe://cluster.local/ns/a",
            "spiffe://cluster.local/ns//sa/b",
            "spiffe://cluster.local/ns/a/sa/b/extra",
            "spiffe://clu ster/ns/a/sa/b",
        ] {
            assert!(bad.parse::<SpiffeId>().is_err(), "{bad} should be rejected");
        }
    }
}
