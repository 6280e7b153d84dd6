//! SPIFFE identities as HBONE carries them: URI SANs of the form
//! `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`.

use std::fmt;
use std::str::FromStr;

/// A workload identity. Cheap to clone; compared by value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpiffeId {
    trust_domain: String,
    namespace: String,
    service_account: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid SPIFFE id {input:?}: {reason} (expected spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>)")]
pub struct SpiffeIdError {
    input: String,
    reason: &'static str,
}

impl SpiffeId {
    pub fn new(trust_domain: &str, namespace: &str, service_account: &str) -> Self {
        SpiffeId {
            trust_domain: trust_domain.to_owned(),
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
        }
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn service_account(&self) -> &str {
        &self.service_account
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
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
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
