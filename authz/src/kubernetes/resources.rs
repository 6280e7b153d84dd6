//! `AuthorizationPolicy` and `PeerAuthentication` (`security.istio.io/v1`)
//! as the API server holds them: the fields L4 authorization reads, and
//! the HTTP ones only to say they are there. Unknown fields are ignored
//! (the API may grow); an unknown enum value is an error, not a default.

use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use serde::Deserialize;

/// One object: where it lives, when it was created (RFC 3339, as the API
/// server writes it; the oldest PeerAuthentication of a level wins), its
/// annotations and its spec.
#[derive(Clone, Debug, PartialEq)]
pub struct Object<S> {
    pub namespace: String,
    pub name: String,
    pub created: String,
    pub annotations: BTreeMap<String, String>,
    pub spec: S,
}

impl<S> Object<S> {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct WorkloadSelector {
    pub match_labels: Option<BTreeMap<String, String>>,
}

impl WorkloadSelector {
    /// Whether every label it names is on the workload (an empty selector
    /// selects every workload).
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .flatten()
            .all(|(k, v)| labels.get(k) == Some(v))
    }

    pub(crate) fn has_labels(&self) -> bool {
        self.match_labels.as_ref().is_some_and(|m| !m.is_empty())
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PolicyAction {
    #[default]
    Allow,
    Deny,
    Audit,
    Custom,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct AuthorizationPolicySpec {
    pub selector: Option<WorkloadSelector>,
    /// Policies bound to a waypoint, a Service or a Gateway are not for
    /// a node proxy.
    pub target_ref: Option<IgnoredAny>,
    pub target_refs: Vec<IgnoredAny>,
    pub action: PolicyAction,
    pub rules: Vec<RuleSpec>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct RuleSpec {
    pub from: Vec<From>,
    pub to: Vec<To>,
    pub when: Vec<Condition>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct From {
    pub source: Source,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct To {
    pub operation: Operation,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct Source {
    pub principals: Vec<String>,
    pub not_principals: Vec<String>,
    pub request_principals: Vec<String>,
    pub not_request_principals: Vec<String>,
    pub namespaces: Vec<String>,
    pub not_namespaces: Vec<String>,
    pub ip_blocks: Vec<String>,
    pub not_ip_blocks: Vec<String>,
    pub remote_ip_blocks: Vec<String>,
    pub not_remote_ip_blocks: Vec<String>,
    pub service_accounts: Vec<String>,
    pub not_service_accounts: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct Operation {
    pub hosts: Vec<String>,
    pub not_hosts: Vec<String>,
    pub ports: Vec<String>,
    pub not_ports: Vec<String>,
    pub methods: Vec<String>,
    pub not_methods: Vec<String>,
    pub paths: Vec<String>,
    pub not_paths: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct Condition {
    pub key: String,
    pub values: Vec<String>,
    pub not_values: Vec<String>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MtlsMode {
    #[default]
    Unset,
    Disable,
    Permissive,
    Strict,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Mtls {
    pub mode: MtlsMode,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct PeerAuthenticationSpec {
    pub selector: Option<WorkloadSelector>,
    pub mtls: Option<Mtls>,
    /// By port number, as written (a key that is not a port refuses the
    /// resource).
    pub port_level_mtls: BTreeMap<String, Mtls>,
}

impl PeerAuthenticationSpec {
    pub(crate) fn mode(&self) -> MtlsMode {
        self.mtls.map(|m| m.mode).unwrap_or_default()
    }
}
