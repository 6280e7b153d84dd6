//! A policy and whether it matches a connection, as ztunnel's
//! `Authorization::matches` decides (`src/rbac.rs` in its source):
//!
//! - a policy with no rules never matches; any rule may match;
//! - a rule matches when all its clauses do (a rule with none matches);
//! - a clause matches when any of its matches does (a clause with none
//!   matches), but a match with every field empty is skipped;
//! - a match matches when every field pair does: a positive list passes
//!   when empty or when any entry matches, its `not_` twin when empty or
//!   when none does.
//!
//! Principals are compared without `spiffe://` and never match a
//! connection without an identity; namespaces compare the identity's
//! namespace, the empty string without one; service accounts never match
//! without one. The destination port is the workload's target port.

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

use crate::cidr::Cidr;

/// Which workloads a policy applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Every workload (policies in the root namespace).
    Global,
    /// Every workload of the policy's namespace.
    Namespace,
    /// The workloads that name the policy.
    WorkloadSelector,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Allow,
    Deny,
}

/// One policy: `namespace/name` names it in logs and refusals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub name: String,
    pub namespace: String,
    pub scope: Scope,
    pub action: Action,
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// Logged, never enforced.
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    #[serde(default)]
    pub clauses: Vec<Clause>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Clause {
    #[serde(default)]
    pub matches: Vec<Match>,
}

/// Twelve lists, six pairs; see the module's rules.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Match {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<StringMatch>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_namespaces: Vec<StringMatch>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub service_accounts: Vec<ServiceAccount>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_service_accounts: Vec<ServiceAccount>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub principals: Vec<StringMatch>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_principals: Vec<StringMatch>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub source_ips: Vec<Cidr>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_source_ips: Vec<Cidr>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub destination_ips: Vec<Cidr>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_destination_ips: Vec<Cidr>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub destination_ports: Vec<u16>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_destination_ports: Vec<u16>,
}

/// `{exact: s}`, `{prefix: s}`, `{suffix: s}` or `{presence: {}}` (any
/// non-empty value), as istiod's JSON writes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "StringMatchForm", into = "StringMatchForm")]
pub enum StringMatch {
    Exact(String),
    Prefix(String),
    Suffix(String),
    Presence,
}

/// A string match as written: exactly one key set.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StringMatchForm {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    exact: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    suffix: Option<String>,
    /// `{}` (protobuf's Empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    presence: Option<Empty>,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Empty {}

impl TryFrom<StringMatchForm> for StringMatch {
    type Error = String;

    fn try_from(f: StringMatchForm) -> Result<Self, String> {
        match (f.exact, f.prefix, f.suffix, f.presence) {
            (Some(s), None, None, None) => Ok(StringMatch::Exact(s)),
            (None, Some(s), None, None) => Ok(StringMatch::Prefix(s)),
            (None, None, Some(s), None) => Ok(StringMatch::Suffix(s)),
            (None, None, None, Some(_)) => Ok(StringMatch::Presence),
            _ => Err("a string match has exactly one of exact, prefix, suffix, presence".into()),
        }
    }
}

impl From<StringMatch> for StringMatchForm {
    fn from(m: StringMatch) -> Self {
        let mut f = StringMatchForm::default();
        match m {
            StringMatch::Exact(s) => f.exact = Some(s),
            StringMatch::Prefix(s) => f.prefix = Some(s),
            StringMatch::Suffix(s) => f.suffix = Some(s),
            StringMatch::Presence => f.presence = Some(Empty {}),
        }
        f
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceAccount {
    pub namespace: String,
    pub service_account: String,
}

/// A peer's SPIFFE identity as the rules read it, built once per
/// connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// `<trust-domain>/ns/<namespace>/sa/<service-account>`: the SPIFFE id
    /// without `spiffe://`, as principals are written.
    principal: String,
    namespace: String,
    service_account: String,
}

impl Identity {
    pub fn new(trust_domain: &str, namespace: &str, service_account: &str) -> Identity {
        Identity {
            principal: format!("{trust_domain}/ns/{namespace}/sa/{service_account}"),
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
        }
    }

    pub fn principal(&self) -> &str {
        &self.principal
    }
}

/// What a decision is about: the peer's address and identity (none on
/// plaintext), and the destination address with the workload's target
/// port (never 15008).
#[derive(Clone, Copy, Debug)]
pub struct Connection<'a> {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub identity: Option<&'a Identity>,
}

impl StringMatch {
    fn matches(&self, value: &str) -> bool {
        match self {
            StringMatch::Exact(s) => value == s,
            StringMatch::Prefix(s) => value.starts_with(s.as_str()),
            StringMatch::Suffix(s) => value.ends_with(s.as_str()),
            StringMatch::Presence => !value.is_empty(),
        }
    }
}

impl ServiceAccount {
    fn matches(&self, id: Option<&Identity>) -> bool {
        id.is_some_and(|id| {
            id.namespace == self.namespace && id.service_account == self.service_account
        })
    }
}

/// A positive list and its `not_` twin against one predicate.
fn pair<T>(positive: &[T], negative: &[T], pred: impl Fn(&T) -> bool) -> bool {
    (positive.is_empty() || positive.iter().any(&pred))
        && (negative.is_empty() || !negative.iter().any(&pred))
}

impl Match {
    /// Every list empty: the match is skipped, never counted as matching.
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
            && self.not_namespaces.is_empty()
            && self.service_accounts.is_empty()
            && self.not_service_accounts.is_empty()
            && self.principals.is_empty()
            && self.not_principals.is_empty()
            && self.source_ips.is_empty()
            && self.not_source_ips.is_empty()
            && self.destination_ips.is_empty()
            && self.not_destination_ips.is_empty()
            && self.destination_ports.is_empty()
            && self.not_destination_ports.is_empty()
    }

    fn matches(&self, c: &Connection<'_>) -> bool {
        let in_range = |ip: IpAddr| move |r: &Cidr| r.contains(ip);
        let namespace = c.identity.map_or("", |i| i.namespace.as_str());
        pair(
            &self.destination_ips,
            &self.not_destination_ips,
            in_range(c.dst.ip()),
        ) && pair(&self.source_ips, &self.not_source_ips, in_range(c.src.ip()))
            && pair(
                &self.destination_ports,
                &self.not_destination_ports,
                |p: &u16| *p == c.dst.port(),
            )
            && pair(
                &self.service_accounts,
                &self.not_service_accounts,
                |s: &ServiceAccount| s.matches(c.identity),
            )
            && pair(&self.principals, &self.not_principals, |p: &StringMatch| {
                c.identity.is_some_and(|i| p.matches(&i.principal))
            })
            && pair(&self.namespaces, &self.not_namespaces, |n: &StringMatch| {
                n.matches(namespace)
            })
    }
}

impl Clause {
    fn matches(&self, c: &Connection<'_>) -> bool {
        self.matches.is_empty() || self.matches.iter().any(|m| !m.is_empty() && m.matches(c))
    }
}

impl Rule {
    fn matches(&self, c: &Connection<'_>) -> bool {
        self.clauses.iter().all(|clause| clause.matches(c))
    }
}

impl Policy {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether the connection matches; a policy without rules never does.
    pub fn matches(&self, c: &Connection<'_>) -> bool {
        self.rules.iter().any(|r| r.matches(c))
    }
}
