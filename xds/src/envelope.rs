//! The delta xDS envelope (`envoy.service.discovery.v3`'s
//! `DeltaDiscoveryRequest` / `DeltaDiscoveryResponse`, Envoy's `Node`,
//! `google.protobuf.{Any, Struct}`, `google.rpc.Status`), written with
//! prost's derives: only the fields a node proxy sends or reads. Field
//! numbers follow the published protos; `tests` pins the bytes.

use std::collections::HashMap;

/// `/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources`.
pub const DELTA_ADS: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

#[derive(Clone, PartialEq, prost::Message)]
pub struct DeltaDiscoveryRequest {
    #[prost(message, optional, tag = "1")]
    pub node: Option<Node>,
    #[prost(string, tag = "2")]
    pub type_url: String,
    #[prost(string, repeated, tag = "3")]
    pub resource_names_subscribe: Vec<String>,
    #[prost(string, repeated, tag = "4")]
    pub resource_names_unsubscribe: Vec<String>,
    /// What the client holds from a previous stream, name → version.
    #[prost(map = "string, string", tag = "5")]
    pub initial_resource_versions: HashMap<String, String>,
    #[prost(string, tag = "6")]
    pub response_nonce: String,
    /// Set: a NACK of the response `response_nonce` names.
    #[prost(message, optional, tag = "7")]
    pub error_detail: Option<Status>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DeltaDiscoveryResponse {
    #[prost(string, tag = "1")]
    pub system_version_info: String,
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<Resource>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
    #[prost(string, repeated, tag = "6")]
    pub removed_resources: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Resource {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(message, optional, tag = "2")]
    pub resource: Option<Any>,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(string, repeated, tag = "4")]
    pub aliases: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Any {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "bytes", tag = "2")]
    pub value: bytes::Bytes,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Node {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub cluster: String,
    #[prost(message, optional, tag = "3")]
    pub metadata: Option<Struct>,
}

/// `google.protobuf.Struct`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Struct {
    #[prost(map = "string, message", tag = "1")]
    pub fields: HashMap<String, Value>,
}

/// `google.protobuf.Value`: a string or a list is all a node's metadata
/// carries here.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    #[prost(oneof = "Kind", tags = "3, 4, 6")]
    pub kind: Option<Kind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Kind {
    #[prost(string, tag = "3")]
    String(String),
    #[prost(bool, tag = "4")]
    Bool(bool),
    #[prost(message, tag = "6")]
    List(ListValue),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListValue {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<Value>,
}

impl Value {
    pub fn string(s: impl Into<String>) -> Value {
        Value {
            kind: Some(Kind::String(s.into())),
        }
    }

    pub fn strings(values: impl IntoIterator<Item = String>) -> Value {
        Value {
            kind: Some(Kind::List(ListValue {
                values: values.into_iter().map(Value::string).collect(),
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    // Each pin was written out from the published field numbers and wire
    // types (tag byte = field << 3 | wire type) and checked against
    // ztunnel's generated types.
    #[test]
    fn a_nack_encodes_nonce_then_error_detail() {
        let r = DeltaDiscoveryRequest {
            type_url: "t".into(),
            response_nonce: "n".into(),
            error_detail: Some(Status {
                code: 0,
                message: "e".into(),
            }),
            ..Default::default()
        };
        assert_eq!(
            r.encode_to_vec(),
            [0x12, 1, b't', 0x32, 1, b'n', 0x3a, 3, 0x12, 1, b'e']
        );
    }

    #[test]
    fn initial_resource_versions_is_a_map_entry_of_two_strings() {
        let r = DeltaDiscoveryRequest {
            initial_resource_versions: [("a".to_string(), "1".to_string())].into(),
            ..Default::default()
        };
        assert_eq!(r.encode_to_vec(), [0x2a, 6, 0x0a, 1, b'a', 0x12, 1, b'1']);
    }

    #[test]
    fn a_response_decodes_resources_and_removals() {
        let bytes = [
            0x22, 1, b't', // type_url = 4
            0x2a, 1, b'n', // nonce = 5
            0x12, 11, // resources = 2
            0x0a, 1, b'v', // version = 1
            0x12, 3, 0x0a, 1, b'u', // resource = 2 (Any{type_url})
            0x1a, 1, b'r', // name = 3
            0x32, 1, b'x', // removed_resources = 6
        ];
        let r = DeltaDiscoveryResponse::decode(&bytes[..]).unwrap();
        assert_eq!((r.type_url.as_str(), r.nonce.as_str()), ("t", "n"));
        assert_eq!(r.removed_resources, ["x"]);
        let res = &r.resources[0];
        assert_eq!((res.name.as_str(), res.version.as_str()), ("r", "v"));
        assert_eq!(res.resource.as_ref().unwrap().type_url, "u");
    }

    #[test]
    fn node_metadata_is_a_struct_of_values() {
        let n = Node {
            id: "i".into(),
            metadata: Some(Struct {
                fields: [("K".to_string(), Value::string("v"))].into(),
            }),
            ..Default::default()
        };
        assert_eq!(
            n.encode_to_vec(),
            [0x0a, 1, b'i', 0x1a, 10, 0x0a, 8, 0x0a, 1, b'K', 0x12, 3, 0x1a, 1, b'v']
        );
    }
}
