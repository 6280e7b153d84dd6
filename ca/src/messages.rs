//! The messages of `citadel.proto` (package `istio.v1.auth`) and the part of
//! `google/protobuf/struct.proto` its metadata uses, written by hand with
//! prost's derives: no protoc, no build script. Field numbers are the wire
//! contract with istiod and ztunnel; the tests pin the encoded bytes.

use std::collections::BTreeMap;

/// `IstioCertificateRequest`. Field 2 is unused upstream.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IstioCertificateRequest {
    /// PEM-encoded certificate signing request.
    #[prost(string, tag = "1")]
    pub csr: String,
    /// Requested validity, in seconds.
    #[prost(int64, tag = "3")]
    pub validity_duration: i64,
    /// `ImpersonatedIdentity` (a string SPIFFE id) when a node agent asks on
    /// a pod's behalf.
    #[prost(message, optional, tag = "4")]
    pub metadata: Option<Struct>,
}

impl IstioCertificateRequest {
    /// The identity asked for on someone's behalf, if any (a non-string
    /// value counts as absent, as istiod reads it).
    pub fn impersonated_identity(&self) -> Option<&str> {
        match self
            .metadata
            .as_ref()?
            .fields
            .get(super::IMPERSONATED_IDENTITY)?
            .kind
            .as_ref()?
        {
            value::Kind::StringValue(s) => Some(s),
            _ => None,
        }
    }

    /// A request for `identity` on a pod's behalf.
    pub fn impersonating(csr: String, validity_seconds: i64, identity: &str) -> Self {
        IstioCertificateRequest {
            csr,
            validity_duration: validity_seconds,
            metadata: Some(Struct {
                fields: [(
                    super::IMPERSONATED_IDENTITY.to_owned(),
                    Value::string(identity),
                )]
                .into(),
            }),
        }
    }
}

/// `IstioCertificateResponse`: PEM certificates, the leaf first, the root last.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IstioCertificateResponse {
    #[prost(string, repeated, tag = "1")]
    pub cert_chain: Vec<String>,
}

/// `google.protobuf.Struct`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Struct {
    #[prost(btree_map = "string, message", tag = "1")]
    pub fields: BTreeMap<String, Value>,
}

/// `google.protobuf.Value`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    #[prost(oneof = "value::Kind", tags = "1, 2, 3, 4, 5, 6")]
    pub kind: Option<value::Kind>,
}

impl Value {
    pub fn string(s: &str) -> Value {
        Value {
            kind: Some(value::Kind::StringValue(s.to_owned())),
        }
    }
}

pub mod value {
    /// The oneof `kind` of `google.protobuf.Value`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        /// `NullValue` (its only value is 0).
        #[prost(int32, tag = "1")]
        NullValue(i32),
        #[prost(double, tag = "2")]
        NumberValue(f64),
        #[prost(string, tag = "3")]
        StringValue(String),
        #[prost(bool, tag = "4")]
        BoolValue(bool),
        #[prost(message, tag = "5")]
        StructValue(super::Struct),
        #[prost(message, tag = "6")]
        ListValue(super::ListValue),
    }
}

/// `google.protobuf.ListValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListValue {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn a_request_encodes_as_citadel_proto_says() {
        let req = IstioCertificateRequest::impersonating("C".into(), 86400, "spiffe://x");
        let bytes = req.encode_to_vec();
        let mut want = vec![0x0a, 1, b'C', 0x18];
        // 86400 as a varint.
        want.extend([0x80, 0xa3, 0x05]);
        // metadata (4, length-delimited) { fields (1) { key (1), value (2) { string_value (3) } } }
        let key = b"ImpersonatedIdentity";
        let val = b"spiffe://x";
        let value = [&[0x1a, val.len() as u8][..], val].concat();
        let entry = [
            &[0x0a, key.len() as u8][..],
            key,
            &[0x12, value.len() as u8],
            &value,
        ]
        .concat();
        let fields = [&[0x0a, entry.len() as u8][..], &entry].concat();
        want.extend([0x22, fields.len() as u8]);
        want.extend(fields);
        assert_eq!(bytes, want);
        let back = IstioCertificateRequest::decode(&bytes[..]).unwrap();
        assert_eq!(back.impersonated_identity(), Some("spiffe://x"));
    }

    #[test]
    fn a_non_string_identity_is_no_impersonation() {
        let mut req = IstioCertificateRequest::impersonating("C".into(), 1, "x");
        req.metadata.as_mut().unwrap().fields.insert(
            crate::IMPERSONATED_IDENTITY.into(),
            Value {
                kind: Some(value::Kind::BoolValue(true)),
            },
        );
        assert_eq!(req.impersonated_identity(), None);
        let plain = IstioCertificateRequest {
            csr: "C".into(),
            validity_duration: 1,
            metadata: None,
        };
        assert_eq!(plain.impersonated_identity(), None);
    }

    #[test]
    fn a_response_is_repeated_field_one() {
        let resp = IstioCertificateResponse {
            cert_chain: vec!["a".into(), "bc".into()],
        };
        assert_eq!(resp.encode_to_vec(), [0x0a, 1, b'a', 0x0a, 2, b'b', b'c']);
    }
}
