//! The OCI Load Balancing API (version 20170115) types tidegate reads and
//! writes, in the published camelCase JSON form. Unknown fields are ignored
//! so newer API responses still parse.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `GET /loadBalancers/{id}` (only the fields tidegate uses).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancer {
    pub id: String,
    #[serde(default)]
    pub display_name: String,
    #[serde(default)]
    pub lifecycle_state: String,
    #[serde(default)]
    pub backend_sets: BTreeMap<String, BackendSet>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackendSet {
    pub name: String,
    #[serde(default)]
    pub policy: String,
    #[serde(default)]
    pub backends: Vec<Backend>,
}

/// One backend; its name is `ip:port`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Backend {
    pub name: String,
    pub ip_address: String,
    pub port: u16,
    pub weight: u32,
    pub backup: bool,
    pub drain: bool,
    pub offline: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
}

/// The body of `PUT .../backends/{name}`: `weight`, `backup`, `drain` and
/// `offline` are required, so a drain resends the current values of the others.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpdateBackendDetails {
    pub weight: u32,
    pub backup: bool,
    pub drain: bool,
    pub offline: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
}

impl UpdateBackendDetails {
    /// `backend` as it is, with `drain` set.
    pub fn with_drain(backend: &Backend, drain: bool) -> Self {
        UpdateBackendDetails {
            weight: backend.weight,
            backup: backend.backup,
            drain,
            offline: backend.offline,
            max_connections: backend.max_connections,
        }
    }
}

/// `GET /loadBalancerWorkRequests/{id}`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkRequest {
    pub id: String,
    pub load_balancer_id: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// `ACCEPTED`, `IN_PROGRESS`, `SUCCEEDED` or `FAILED`.
    pub lifecycle_state: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub error_details: Vec<WorkRequestError>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkRequestError {
    pub error_code: String,
    pub message: String,
}

/// An OCI error body: `{"code": "...", "message": "..."}`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct ErrorBody {
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_round_trips_in_the_published_form() {
        let json = r#"{"name":"10.0.0.5:8080","ipAddress":"10.0.0.5","port":8080,
            "weight":3,"backup":false,"drain":false,"offline":true,"maxConnections":100}"#;
        let b: Backend = serde_json::from_str(json).unwrap();
        let d = UpdateBackendDetails::with_drain(&b, true);
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"weight":3,"backup":false,"drain":true,"offline":true,"maxConnections":100}"#
        );
    }
}
