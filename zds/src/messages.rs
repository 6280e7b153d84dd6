//! The messages of `zds.proto` (protobuf package `istio.workload.zds`),
//! written by hand with prost's derives: no protoc, no build script.
//!
//! Each message travels alone in one `SOCK_SEQPACKET` datagram, without a
//! length prefix. Field numbers are the wire contract with istio-cni; the
//! tests at the end pin the encoded bytes.

/// Protocol version the client announces in [`ZdsHello`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, prost::Enumeration)]
#[repr(i32)]
pub enum Version {
    NotUsed = 0,
    V1 = 1,
}

/// The client's first message on every connection.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ZdsHello {
    #[prost(enumeration = "Version", tag = "1")]
    pub version: i32,
}

/// Who the pod is (field 4, the old `trust_domain`, is reserved upstream).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct WorkloadInfo {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(string, tag = "3")]
    pub service_account: String,
}

/// A pod to serve; its network namespace comes with it as one `SCM_RIGHTS` fd.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AddWorkload {
    #[prost(string, tag = "1")]
    pub uid: String,
    #[prost(message, optional, tag = "2")]
    pub workload_info: Option<WorkloadInfo>,
}

/// During the snapshot: a pod the agent knows but whose namespace it cannot open.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeepWorkload {
    #[prost(string, tag = "1")]
    pub uid: String,
}

/// A pod to stop serving. Its uid is field **2** upstream.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DelWorkload {
    #[prost(string, tag = "2")]
    pub uid: String,
}

/// The snapshot is complete: pods not named since the connection began are gone.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SnapshotSent {}

/// What the agent sends; one [`WorkloadResponse`] answers each.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadRequest {
    #[prost(oneof = "Request", tags = "1, 5, 2, 3")]
    pub payload: Option<Request>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Request {
    #[prost(message, tag = "1")]
    Add(AddWorkload),
    #[prost(message, tag = "5")]
    Keep(KeepWorkload),
    #[prost(message, tag = "2")]
    Del(DelWorkload),
    #[prost(message, tag = "3")]
    SnapshotSent(SnapshotSent),
}

/// The client's answer to one request.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadResponse {
    #[prost(oneof = "Response", tags = "1")]
    pub payload: Option<Response>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Response {
    #[prost(message, tag = "1")]
    Ack(Ack),
}

/// An empty `error` is an ACK; anything else a NACK with the reason.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Ack {
    #[prost(string, tag = "1")]
    pub error: String,
}

/// The longest NACK text sent, in bytes: with its framing an ack stays
/// within the node agent's 1,024-byte read (a longer one would reach it
/// truncated and undecodable).
pub const MAX_ERROR_TEXT: usize = 1000;

impl WorkloadResponse {
    /// The ack of one request: `Ok` → ACK, `Err(text)` → NACK carrying
    /// `text`, cut to [`MAX_ERROR_TEXT`] bytes.
    pub fn ack(result: Result<(), String>) -> WorkloadResponse {
        WorkloadResponse {
            payload: Some(Response::Ack(Ack {
                error: result.err().map(clip).unwrap_or_default(),
            })),
        }
    }
}

fn clip(mut text: String) -> String {
    if text.len() > MAX_ERROR_TEXT {
        let mut end = MAX_ERROR_TEXT - '…'.len_utf8();
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn info(name: &str) -> WorkloadInfo {
        WorkloadInfo {
            name: name.into(),
            namespace: String::new(),
            service_account: String::new(),
        }
    }

    fn request(r: Request) -> Vec<u8> {
        WorkloadRequest { payload: Some(r) }.encode_to_vec()
    }

    #[test]
    fn hello_v1_is_field_1_varint_1() {
        let hello = ZdsHello {
            version: Version::V1 as i32,
        };
        assert_eq!(hello.encode_to_vec(), [0x08, 0x01]);
    }

    #[test]
    fn requests_use_the_upstream_field_numbers() {
        let add = request(Request::Add(AddWorkload {
            uid: "u".into(),
            workload_info: Some(info("n")),
        }));
        assert_eq!(add, [0x0a, 8, 0x0a, 1, b'u', 0x12, 3, 0x0a, 1, b'n']);
        let keep = request(Request::Keep(KeepWorkload { uid: "u".into() }));
        assert_eq!(keep, [0x2a, 3, 0x0a, 1, b'u']);
        let del = request(Request::Del(DelWorkload { uid: "u".into() }));
        assert_eq!(del, [0x12, 3, 0x12, 1, b'u']);
        assert_eq!(request(Request::SnapshotSent(SnapshotSent {})), [0x1a, 0]);
    }

    #[test]
    fn acks_encode_an_empty_error_as_a_present_empty_message() {
        assert_eq!(WorkloadResponse::ack(Ok(())).encode_to_vec(), [0x0a, 0]);
        let nack = WorkloadResponse::ack(Err("x".into())).encode_to_vec();
        assert_eq!(nack, [0x0a, 3, 0x0a, 1, b'x']);
    }

    #[test]
    fn a_long_nack_is_cut_to_fit_the_agents_read() {
        let nack = WorkloadResponse::ack(Err("é".repeat(3000))).encode_to_vec();
        assert!(nack.len() <= 1024, "{} bytes", nack.len());
        let Some(Response::Ack(ack)) = WorkloadResponse::decode(&nack[..]).unwrap().payload else {
            panic!("no ack");
        };
        assert!(ack.error.ends_with('…') && ack.error.len() <= MAX_ERROR_TEXT);
    }

    #[test]
    fn workload_info_round_trips_every_field() {
        let wi = WorkloadInfo {
            name: "p".into(),
            namespace: "ns".into(),
            service_account: "sa".into(),
        };
        let bytes = wi.encode_to_vec();
        assert_eq!(
            bytes,
            [0x0a, 1, b'p', 0x12, 2, b'n', b's', 0x1a, 2, b's', b'a']
        );
        assert_eq!(WorkloadInfo::decode(&bytes[..]).unwrap(), wi);
    }
}
