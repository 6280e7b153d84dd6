//! Istio's security resources from the API server: AuthorizationPolicy
//! and PeerAuthentication (`security.istio.io/v1`) read from the watch
//! stores and converted as istiod converts them
//! ([`tidegate_authz::kubernetes`]), each outcome logged when it changes
//! and counted.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde::de::DeserializeOwned;
use tidegate_authz::kubernetes::resources::Object;
use tidegate_authz::kubernetes::{Conversion, Outcome};
use tidegate_authz::PolicyStore;
use tracing::{info, warn};

use super::metrics::KubernetesMetrics;

/// The two resources, as kube addresses them.
pub fn api_resource(kind: &str) -> ApiResource {
    let gvk = GroupVersionKind::gvk("security.istio.io", "v1", kind);
    ApiResource::from_gvk(&gvk)
}

pub const AUTHORIZATION_POLICY: &str = "AuthorizationPolicy";
pub const PEER_AUTHENTICATION: &str = "PeerAuthentication";

/// An object's metadata and typed spec, or why its spec does not read.
fn object<S: DeserializeOwned + Default>(
    obj: &DynamicObject,
) -> Result<Object<S>, (String, String)> {
    let m = &obj.metadata;
    let namespace = m.namespace.clone().unwrap_or_else(|| "default".into());
    let name = m.name.clone().unwrap_or_default();
    let spec = match obj.data.get("spec") {
        None | Some(serde_json::Value::Null) => S::default(),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| {
            (
                format!("{namespace}/{name}"),
                format!("authorization {namespace}/{name}: spec: {e}"),
            )
        })?,
    };
    Ok(Object {
        namespace,
        name,
        created: m
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
        annotations: m.annotations.clone().unwrap_or_default(),
        spec,
    })
}

/// Converts what the stores hold. A spec that does not read is refused:
/// its last good version stays in force, else nothing is held for it.
pub fn convert(
    root_namespace: &str,
    authorization_policies: &[Arc<DynamicObject>],
    peer_authentications: &[Arc<DynamicObject>],
    previous: &PolicyStore,
) -> Conversion {
    let mut unreadable = Vec::new();
    let aps: Vec<_> = authorization_policies
        .iter()
        .filter_map(|o| object(o).map_err(|e| unreadable.push(e)).ok())
        .collect();
    let pas: Vec<_> = peer_authentications
        .iter()
        .filter_map(|o| object(o).map_err(|e| unreadable.push(e)).ok())
        .collect();
    let mut c = Conversion::new(root_namespace, &aps, pas, previous);
    for (key, message) in unreadable {
        c.unreadable(key, message, previous);
    }
    c
}

/// Logs what changed since `last` and sets the outcome gauge.
pub fn report(
    outcomes: &BTreeMap<String, Outcome>,
    last: &BTreeMap<String, Outcome>,
    metrics: &KubernetesMetrics,
) {
    for (key, outcome) in outcomes {
        if last.get(key) == Some(outcome) {
            continue;
        }
        match outcome {
            Outcome::Enforced => info!(policy = %key, "authorization policy enforced"),
            Outcome::HttpIgnored(why) => {
                warn!(policy = %key, reason = %why, "authorization policy enforced at L4 only")
            }
            Outcome::Skipped(why) => {
                info!(policy = %key, reason = %why, "authorization policy not for a node proxy")
            }
            Outcome::Refused(why) => warn!(
                policy = %key,
                error = %why,
                "authorization policy refused: its last good version, or a closed one, is held"
            ),
        }
    }
    for key in last.keys().filter(|k| !outcomes.contains_key(*k)) {
        info!(policy = %key, "authorization policy removed");
    }
    for label in ["enforced", "http_attributes_ignored", "skipped", "refused"] {
        let n = outcomes.values().filter(|o| o.label() == label).count();
        metrics
            .authorization_resources
            .get_or_create(&super::metrics::OutcomeLabels { outcome: label })
            .set(n as i64);
    }
}
