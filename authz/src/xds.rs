//! `istio.security.Authorization`, the resource istiod sends over xDS
//! (ztunnel's `proto/authorization.proto`), written with prost's derives,
//! and its conversion to a [`Policy`].
//!
//! ztunnel converts what it cannot read by dropping or reshaping it: an
//! address of the wrong size or with a prefix longer than its family is
//! dropped (which can empty a match, and an empty match is skipped), a
//! string match with nothing set is dropped, a port above 65535 keeps its
//! low 16 bits, a prefix length above 255 keeps its low 8. Each of those
//! can widen what a policy allows (a DENY that loses its only source range
//! denies nothing). Here each is refused with an error naming the policy
//! and the entry ([`ConvertError`]); the caller keeps the policy's previous
//! version or, having none, holds it closed ([`ConvertError::closed`]). An
//! unknown scope or action is refused, as ztunnel does. Extensions are
//! ignored, as ztunnel does.

use std::net::IpAddr;

use bytes::Bytes;
use prost::Message as _;

use crate::cidr::Cidr;
use crate::policy::{Action, Clause, Match, Policy, Rule, Scope, ServiceAccount, StringMatch};

#[derive(Clone, PartialEq, prost::Message)]
pub struct Authorization {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(int32, tag = "3")]
    pub scope: i32,
    #[prost(int32, tag = "4")]
    pub action: i32,
    #[prost(message, repeated, tag = "5")]
    pub rules: Vec<XdsRule>,
    #[prost(bool, tag = "6")]
    pub dry_run: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct XdsRule {
    #[prost(message, repeated, tag = "1")]
    pub clauses: Vec<XdsClause>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct XdsClause {
    #[prost(message, repeated, tag = "2")]
    pub matches: Vec<XdsMatch>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct XdsMatch {
    #[prost(message, repeated, tag = "1")]
    pub namespaces: Vec<XdsStringMatch>,
    #[prost(message, repeated, tag = "2")]
    pub not_namespaces: Vec<XdsStringMatch>,
    #[prost(message, repeated, tag = "11")]
    pub service_accounts: Vec<XdsServiceAccount>,
    #[prost(message, repeated, tag = "12")]
    pub not_service_accounts: Vec<XdsServiceAccount>,
    #[prost(message, repeated, tag = "3")]
    pub principals: Vec<XdsStringMatch>,
    #[prost(message, repeated, tag = "4")]
    pub not_principals: Vec<XdsStringMatch>,
    #[prost(message, repeated, tag = "5")]
    pub source_ips: Vec<XdsAddress>,
    #[prost(message, repeated, tag = "6")]
    pub not_source_ips: Vec<XdsAddress>,
    #[prost(message, repeated, tag = "7")]
    pub destination_ips: Vec<XdsAddress>,
    #[prost(message, repeated, tag = "8")]
    pub not_destination_ips: Vec<XdsAddress>,
    #[prost(uint32, repeated, tag = "9")]
    pub destination_ports: Vec<u32>,
    #[prost(uint32, repeated, tag = "10")]
    pub not_destination_ports: Vec<u32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct XdsAddress {
    #[prost(bytes = "bytes", tag = "1")]
    pub address: Bytes,
    #[prost(uint32, tag = "2")]
    pub length: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct XdsServiceAccount {
    #[prost(string, tag = "1")]
    pub namespace: String,
    #[prost(string, tag = "2")]
    pub service_account: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct XdsStringMatch {
    #[prost(oneof = "MatchType", tags = "1, 2, 3, 4")]
    pub match_type: Option<MatchType>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum MatchType {
    #[prost(string, tag = "1")]
    Exact(String),
    #[prost(string, tag = "2")]
    Prefix(String),
    #[prost(string, tag = "3")]
    Suffix(String),
    /// `google.protobuf.Empty`.
    #[prost(message, tag = "4")]
    Presence(Empty),
}

#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Empty {}

/// A resource that cannot be enforced as written: which policy, where the
/// conversion stopped, and what is known of it to hold it closed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("authorization {namespace}/{name}: {at}: {problem}")]
pub struct ConvertError {
    pub namespace: String,
    pub name: String,
    /// `rules[0].clauses[1].matches[0].source_ips[2]`, or the field.
    pub at: String,
    pub problem: String,
    /// Its scope, action and dry-run flag, when they were read.
    known: Option<(Scope, Action, bool)>,
}

impl ConvertError {
    pub(crate) fn new(
        namespace: &str,
        name: &str,
        at: String,
        problem: String,
        known: Option<(Scope, Action, bool)>,
    ) -> ConvertError {
        ConvertError {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            at,
            problem,
            known,
        }
    }

    /// The policy held in its place when no earlier version is: an ALLOW
    /// that matches nothing (the workloads in scope keep an ALLOW, so
    /// nothing is allowed that it might not have allowed) or a DENY that
    /// matches everything. Trust is never wider than the policy meant.
    /// `None` when its scope or action is unknown: it cannot be indexed.
    pub fn closed(&self) -> Option<Policy> {
        let (scope, action, dry_run) = self.known?;
        let rules = match action {
            Action::Allow => Vec::new(),
            Action::Deny => vec![Rule::default()],
        };
        Some(Policy {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            scope,
            action,
            rules,
            dry_run,
        })
    }
}

/// Decodes one resource's bytes.
pub fn decode(bytes: &[u8]) -> Result<Authorization, prost::DecodeError> {
    Authorization::decode(bytes)
}

impl Authorization {
    /// The policy, or why it cannot be enforced as written.
    pub fn to_policy(&self) -> Result<Policy, Box<ConvertError>> {
        let err = |at: String, problem: String, known| {
            Box::new(ConvertError {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                at,
                problem,
                known,
            })
        };
        let scope = match self.scope {
            0 => Scope::Global,
            1 => Scope::Namespace,
            2 => Scope::WorkloadSelector,
            n => return Err(err("scope".into(), format!("unknown scope {n}"), None)),
        };
        let action = match self.action {
            0 => Action::Allow,
            1 => Action::Deny,
            n => return Err(err("action".into(), format!("unknown action {n}"), None)),
        };
        let known = Some((scope, action, self.dry_run));
        let mut rules = Vec::with_capacity(self.rules.len());
        for (r, rule) in self.rules.iter().enumerate() {
            let mut clauses = Vec::with_capacity(rule.clauses.len());
            for (c, clause) in rule.clauses.iter().enumerate() {
                let mut matches = Vec::with_capacity(clause.matches.len());
                for (m, xm) in clause.matches.iter().enumerate() {
                    let at = format!("rules[{r}].clauses[{c}].matches[{m}]");
                    let converted = convert_match(xm)
                        .map_err(|(field, problem)| err(format!("{at}.{field}"), problem, known))?;
                    matches.push(converted);
                }
                clauses.push(Clause { matches });
            }
            rules.push(Rule { clauses });
        }
        Ok(Policy {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            scope,
            action,
            rules,
            dry_run: self.dry_run,
        })
    }
}

type FieldError = (String, String);

fn convert_match(m: &XdsMatch) -> Result<Match, FieldError> {
    Ok(Match {
        namespaces: strings("namespaces", &m.namespaces)?,
        not_namespaces: strings("not_namespaces", &m.not_namespaces)?,
        service_accounts: accounts(&m.service_accounts),
        not_service_accounts: accounts(&m.not_service_accounts),
        principals: strings("principals", &m.principals)?,
        not_principals: strings("not_principals", &m.not_principals)?,
        source_ips: ranges("source_ips", &m.source_ips)?,
        not_source_ips: ranges("not_source_ips", &m.not_source_ips)?,
        destination_ips: ranges("destination_ips", &m.destination_ips)?,
        not_destination_ips: ranges("not_destination_ips", &m.not_destination_ips)?,
        destination_ports: ports("destination_ports", &m.destination_ports)?,
        not_destination_ports: ports("not_destination_ports", &m.not_destination_ports)?,
    })
}

fn strings(field: &str, list: &[XdsStringMatch]) -> Result<Vec<StringMatch>, FieldError> {
    list.iter()
        .enumerate()
        .map(|(i, s)| match &s.match_type {
            Some(MatchType::Exact(v)) => Ok(StringMatch::Exact(v.clone())),
            Some(MatchType::Prefix(v)) => Ok(StringMatch::Prefix(v.clone())),
            Some(MatchType::Suffix(v)) => Ok(StringMatch::Suffix(v.clone())),
            Some(MatchType::Presence(_)) => Ok(StringMatch::Presence),
            None => Err((
                format!("{field}[{i}]"),
                "a string match with none of exact, prefix, suffix, presence".into(),
            )),
        })
        .collect()
}

fn accounts(list: &[XdsServiceAccount]) -> Vec<ServiceAccount> {
    list.iter()
        .map(|a| ServiceAccount {
            namespace: a.namespace.clone(),
            service_account: a.service_account.clone(),
        })
        .collect()
}

fn ranges(field: &str, list: &[XdsAddress]) -> Result<Vec<Cidr>, FieldError> {
    list.iter()
        .enumerate()
        .map(|(i, a)| {
            let at = || format!("{field}[{i}]");
            let addr = match a.address.len() {
                4 => IpAddr::from(<[u8; 4]>::try_from(&a.address[..]).expect("4 bytes")),
                16 => IpAddr::from(<[u8; 16]>::try_from(&a.address[..]).expect("16 bytes")),
                n => return Err((at(), format!("an address of {n} bytes (4 or 16 expected)"))),
            };
            Cidr::new(addr, a.length).map_err(|e| (at(), e.to_string()))
        })
        .collect()
}

fn ports(field: &str, list: &[u32]) -> Result<Vec<u16>, FieldError> {
    list.iter()
        .enumerate()
        .map(|(i, p)| {
            u16::try_from(*p)
                .map_err(|_| (format!("{field}[{i}]"), format!("port {p} is above 65535")))
        })
        .collect()
}
