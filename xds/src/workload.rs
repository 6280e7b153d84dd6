//! `istio.workload.Address`, the resource istiod sends a node proxy over
//! delta xDS (type URL [`ADDRESS_TYPE_URL`]), and every message it carries,
//! written with prost's derives (no protoc, no build script).
//!
//! - An [`Address`] is either a [`Workload`] (keyed by its `uid`) or a
//!   [`Service`] (keyed `namespace/hostname`).
//! - Field numbers are Istio's (ztunnel's `proto/workload.proto`); the
//!   encodings are pinned byte for byte by the tests below.
//! - Enum fields are kept as the `i32` on the wire, so a value this code
//!   does not know survives decoding and the conversion can refuse it (as
//!   ztunnel does) instead of reading it as the default. Each has a typed
//!   enum with `TryFrom<i32>`; prost's generated accessors
//!   (`w.tunnel_protocol()`) map an unknown value to the default and are
//!   not for deciding anything.
//! - Rust names follow what prost-build would generate (a nested enum of
//!   `LoadBalancing` is `load_balancing::Scope`), so code written against
//!   ztunnel's generated types reads the same here.

use std::collections::BTreeMap;

use bytes::Bytes;
use prost::Message as _;

/// The type URL of [`Address`] resources (`type_url` of the delta xDS
/// request and of each resource's `Any`).
pub const ADDRESS_TYPE_URL: &str = "type.googleapis.com/istio.workload.Address";

/// Decodes one resource's bytes (the `Any` value of a delta xDS resource).
pub fn decode(bytes: &[u8]) -> Result<Address, prost::DecodeError> {
    Address::decode(bytes)
}

/// One WDS resource: a workload or a Service.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Address {
    #[prost(oneof = "address::Type", tags = "1, 2")]
    pub r#type: Option<address::Type>,
}

pub mod address {
    /// What an [`Address`](super::Address) holds. Unboxed, as prost-build
    /// generates it: one resource is decoded at a time.
    #[allow(clippy::large_enum_variant)]
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Type {
        #[prost(message, tag = "1")]
        Workload(super::Workload),
        #[prost(message, tag = "2")]
        Service(super::Service),
    }
}

/// A Service: a hostname and virtual addresses in front of the workloads
/// that name it in their `services`. It lists no endpoints itself.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Service {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// The Service's hostname (`web.shop.svc.cluster.local`); with the
    /// namespace, its resource key.
    #[prost(string, tag = "3")]
    pub hostname: String,
    /// Its virtual IPs; one with a `length` below its family's width is a
    /// range (CIDR VIP).
    #[prost(message, repeated, tag = "4")]
    pub addresses: Vec<NetworkAddress>,
    #[prost(message, repeated, tag = "5")]
    pub ports: Vec<Port>,
    /// Identities, beside the endpoint's own, a client accepts from it.
    #[prost(string, repeated, tag = "6")]
    pub subject_alt_names: Vec<String>,
    /// The waypoint traffic to the Service goes through.
    #[prost(message, optional, tag = "7")]
    pub waypoint: Option<GatewayAddress>,
    #[prost(message, optional, tag = "8")]
    pub load_balancing: Option<LoadBalancing>,
    /// [`IpFamilies`].
    #[prost(enumeration = "IpFamilies", tag = "9")]
    pub ip_families: i32,
    #[prost(message, repeated, tag = "10")]
    pub extensions: Vec<Extension>,
    /// Whether this is the canonical Service for its hostname (several
    /// registries can offer the same one).
    #[prost(bool, tag = "11")]
    pub canonical: bool,
    /// Traffic arriving through an ingress gateway also goes through the
    /// waypoint.
    #[prost(bool, tag = "12")]
    pub ingress_use_waypoint: bool,
    /// Waypoints to choose from by weight, before `waypoint`.
    #[prost(message, repeated, tag = "13")]
    pub weighted_waypoints: Vec<WeightedWaypoint>,
    /// [`service::Visibility`].
    #[prost(enumeration = "service::Visibility", tag = "14")]
    pub visibility: i32,
}

pub mod service {
    /// Who may resolve a Service by name (DNS).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum Visibility {
        /// Every namespace.
        Public = 0,
        /// Its own namespace only.
        Namespace = 1,
    }
}

/// Which address families a Service serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum IpFamilies {
    /// Whatever its addresses are.
    Automatic = 0,
    Ipv4Only = 1,
    Ipv6Only = 2,
    Dual = 3,
}

/// How a workload's addresses are used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum NetworkMode {
    /// Its own addresses.
    Standard = 0,
    /// It shares its node's address: the address does not identify it.
    HostNetwork = 1,
}

/// How a Service's endpoints are chosen.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LoadBalancing {
    /// Scopes, most important first, an endpoint should share with the
    /// client ([`load_balancing::Scope`] values).
    #[prost(enumeration = "load_balancing::Scope", repeated, tag = "1")]
    pub routing_preference: Vec<i32>,
    /// [`load_balancing::Mode`].
    #[prost(enumeration = "load_balancing::Mode", tag = "2")]
    pub mode: i32,
    /// [`load_balancing::HealthPolicy`].
    #[prost(enumeration = "load_balancing::HealthPolicy", tag = "3")]
    pub health_policy: i32,
}

pub mod load_balancing {
    /// What an endpoint can share with its client.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum Scope {
        UnspecifiedScope = 0,
        Region = 1,
        Zone = 2,
        Subzone = 3,
        Node = 4,
        Cluster = 5,
        Network = 6,
    }

    /// How `routing_preference` is applied.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum Mode {
        /// Any endpoint.
        UnspecifiedMode = 0,
        /// Only endpoints sharing every scope.
        Strict = 1,
        /// The endpoints sharing the most scopes.
        Failover = 2,
        /// Connect to the original destination address.
        Passthrough = 3,
    }

    /// Whether unhealthy endpoints are chosen.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum HealthPolicy {
        OnlyHealthy = 0,
        AllowAll = 1,
    }
}

/// A workload (a pod, a VM, a ServiceEntry endpoint).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Workload {
    /// The resource key: for a pod `<cluster>//Pod/<namespace>/<name>`.
    #[prost(string, tag = "20")]
    pub uid: String,
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// Its addresses, 4 (IPv4) or 16 (IPv6) bytes each.
    #[prost(bytes = "bytes", repeated, tag = "3")]
    pub addresses: Vec<Bytes>,
    /// A DNS name to reach it by, for a workload without addresses.
    #[prost(string, tag = "21")]
    pub hostname: String,
    #[prost(string, tag = "4")]
    pub network: String,
    /// [`TunnelProtocol`].
    #[prost(enumeration = "TunnelProtocol", tag = "5")]
    pub tunnel_protocol: i32,
    /// Empty: `cluster.local`.
    #[prost(string, tag = "6")]
    pub trust_domain: String,
    /// Empty: `default`.
    #[prost(string, tag = "7")]
    pub service_account: String,
    #[prost(message, optional, tag = "8")]
    pub waypoint: Option<GatewayAddress>,
    /// The gateway to reach it through from another network.
    #[prost(message, optional, tag = "19")]
    pub network_gateway: Option<GatewayAddress>,
    #[prost(string, tag = "9")]
    pub node: String,
    /// Its canonical service (`service.istio.io/canonical-name`).
    #[prost(string, tag = "10")]
    pub canonical_name: String,
    /// Its canonical revision (`service.istio.io/canonical-revision`).
    #[prost(string, tag = "11")]
    pub canonical_revision: String,
    /// [`WorkloadType`].
    #[prost(enumeration = "WorkloadType", tag = "12")]
    pub workload_type: i32,
    /// The workload it belongs to (its Deployment, Job...).
    #[prost(string, tag = "13")]
    pub workload_name: String,
    /// It terminates HBONE itself (no node proxy in front of it).
    #[prost(bool, tag = "14")]
    pub native_tunnel: bool,
    #[prost(message, optional, tag = "23")]
    pub application_tunnel: Option<ApplicationTunnel>,
    /// The Services it is an endpoint of, `namespace/hostname` → their
    /// ports as it serves them.
    #[prost(btree_map = "string, message", tag = "22")]
    pub services: BTreeMap<String, PortList>,
    /// The authorization policies selecting it, `namespace/name`.
    #[prost(string, repeated, tag = "16")]
    pub authorization_policies: Vec<String>,
    /// [`WorkloadStatus`].
    #[prost(enumeration = "WorkloadStatus", tag = "17")]
    pub status: i32,
    #[prost(string, tag = "18")]
    pub cluster_id: String,
    #[prost(message, optional, tag = "24")]
    pub locality: Option<Locality>,
    /// [`NetworkMode`].
    #[prost(enumeration = "NetworkMode", tag = "25")]
    pub network_mode: i32,
    #[prost(message, repeated, tag = "26")]
    pub extensions: Vec<Extension>,
    /// Its weight among a Service's endpoints (`google.protobuf.UInt32Value`);
    /// absent: 1.
    #[prost(message, optional, tag = "27")]
    pub capacity: Option<u32>,
}

/// Where a workload runs.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Locality {
    #[prost(string, tag = "1")]
    pub region: String,
    #[prost(string, tag = "2")]
    pub zone: String,
    #[prost(string, tag = "3")]
    pub subzone: String,
}

/// Whether a workload should receive traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum WorkloadStatus {
    Healthy = 0,
    /// Not ready, or being deleted (istiod's reading of a pod).
    Unhealthy = 1,
}

/// The kind of thing `workload_name` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum WorkloadType {
    Deployment = 0,
    Cronjob = 1,
    Pod = 2,
    Job = 3,
}

/// A workload's ports for one Service.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct PortList {
    #[prost(message, repeated, tag = "1")]
    pub ports: Vec<Port>,
}

/// A Service port and where it lands.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Port {
    #[prost(uint32, tag = "1")]
    pub service_port: u32,
    /// On a Service: 0 when it is resolved per endpoint (a named port).
    #[prost(uint32, tag = "2")]
    pub target_port: u32,
    /// [`AppProtocol`].
    #[prost(enumeration = "AppProtocol", tag = "3")]
    pub app_protocol: i32,
}

/// The application protocol a port declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum AppProtocol {
    Unknown = 0,
    Http11 = 1,
    Http2 = 2,
    Grpc = 3,
    Tcp = 4,
    Tls = 5,
}

/// How a workload's node proxy reaches it from other nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum TunnelProtocol {
    /// Plain TCP: it is not in the mesh.
    None = 0,
    /// HBONE (HTTP/2 CONNECT over mutual TLS) to port 15008.
    Hbone = 1,
    /// Istio's sidecar mutual TLS.
    LegacyIstioMtls = 2,
}

/// How the node proxy hands inbound traffic to the workload.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct ApplicationTunnel {
    /// [`application_tunnel::Protocol`].
    #[prost(enumeration = "application_tunnel::Protocol", tag = "1")]
    pub protocol: i32,
    /// The port to hand it to; 0: the original one.
    #[prost(uint32, tag = "2")]
    pub port: u32,
}

pub mod application_tunnel {
    /// The wrapping of inbound traffic.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum Protocol {
        /// None: the bare stream.
        None = 0,
        /// A PROXY protocol (v2) header first.
        Proxy = 1,
    }
}

/// A gateway (a waypoint, a network gateway): by hostname or address.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GatewayAddress {
    #[prost(oneof = "gateway_address::Destination", tags = "1, 2")]
    pub destination: Option<gateway_address::Destination>,
    /// Its HBONE port.
    #[prost(uint32, tag = "3")]
    pub hbone_mtls_port: u32,
}

pub mod gateway_address {
    /// Where a [`GatewayAddress`](super::GatewayAddress) is.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Destination {
        /// A Service, by namespace and hostname.
        #[prost(message, tag = "1")]
        Hostname(super::NamespacedHostname),
        #[prost(message, tag = "2")]
        Address(super::NetworkAddress),
    }
}

/// A waypoint and its weight among a Service's waypoints.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WeightedWaypoint {
    #[prost(message, optional, tag = "1")]
    pub destination: Option<GatewayAddress>,
    #[prost(uint32, tag = "2")]
    pub weight: u32,
}

/// An address on a network; with `length`, a range.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct NetworkAddress {
    #[prost(string, tag = "1")]
    pub network: String,
    /// 4 or 16 bytes.
    #[prost(bytes = "bytes", tag = "2")]
    pub address: Bytes,
    /// A prefix length (explicit presence: absent is not 0).
    #[prost(uint32, optional, tag = "3")]
    pub length: Option<u32>,
}

/// A Service's key: namespace and hostname.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct NamespacedHostname {
    #[prost(string, tag = "1")]
    pub namespace: String,
    #[prost(string, tag = "2")]
    pub hostname: String,
}

/// A named extension with its configuration; carried, not interpreted.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Extension {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub config: Option<Any>,
}

/// `google.protobuf.Any`: a type URL and the message's bytes.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Any {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "bytes", tag = "2")]
    pub value: Bytes,
}

#[cfg(test)]
mod tests {
    //! The encodings pinned byte for byte. Each expected byte string was
    //! produced by encoding the same values with ztunnel's prost-build
    //! generated types (`ztunnel::xds::istio::workload`, from its
    //! `proto/workload.proto`) and comparing with what these types encode;
    //! the bytes ztunnel's types encoded were also decoded with these types
    //! into the same values. A byte string here changing means the wire
    //! format changed.

    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    /// Encodes `value`, asserts the bytes, and decodes them back to `value`.
    fn pinned<M: prost::Message + Default + PartialEq + std::fmt::Debug>(
        value: &M,
        expected: &str,
    ) {
        let expected = hex(expected);
        assert_eq!(value.encode_to_vec(), expected, "encoding");
        assert_eq!(
            &M::decode(&expected[..]).expect("decodes"),
            value,
            "decoding"
        );
    }

    fn v4(a: [u8; 4]) -> Bytes {
        Bytes::copy_from_slice(&a)
    }

    fn port(service_port: u32, target_port: u32, app_protocol: AppProtocol) -> Port {
        Port {
            service_port,
            target_port,
            app_protocol: app_protocol as i32,
        }
    }

    fn hostname(namespace: &str, hostname: &str) -> Option<gateway_address::Destination> {
        Some(gateway_address::Destination::Hostname(NamespacedHostname {
            namespace: namespace.into(),
            hostname: hostname.into(),
        }))
    }

    /// Every field set, one Service (ztunnel's map is a `HashMap`, whose
    /// order is not fixed: one entry keeps its bytes comparable).
    fn every_workload_field() -> Workload {
        Workload {
            uid: "Kubernetes//Pod/shop/web-1".into(),
            name: "web-1".into(),
            namespace: "shop".into(),
            addresses: vec![
                v4([10, 0, 0, 7]),
                Bytes::copy_from_slice(&[
                    0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7,
                ]),
            ],
            hostname: String::new(),
            network: "net1".into(),
            tunnel_protocol: TunnelProtocol::Hbone as i32,
            trust_domain: "cluster.local".into(),
            service_account: "web".into(),
            waypoint: Some(GatewayAddress {
                destination: hostname("shop", "waypoint.shop.svc.cluster.local"),
                hbone_mtls_port: 15008,
            }),
            network_gateway: Some(GatewayAddress {
                destination: Some(gateway_address::Destination::Address(NetworkAddress {
                    network: "net2".into(),
                    address: v4([192, 168, 1, 1]),
                    length: None,
                })),
                hbone_mtls_port: 15009,
            }),
            node: "node-a".into(),
            canonical_name: "web".into(),
            canonical_revision: "v2".into(),
            workload_type: WorkloadType::Pod as i32,
            workload_name: "web".into(),
            native_tunnel: true,
            application_tunnel: Some(ApplicationTunnel {
                protocol: application_tunnel::Protocol::Proxy as i32,
                port: 15088,
            }),
            services: [(
                "shop/web.shop.svc.cluster.local".to_owned(),
                PortList {
                    ports: vec![
                        port(80, 8080, AppProtocol::Http11),
                        port(9090, 0, AppProtocol::Unknown),
                    ],
                },
            )]
            .into(),
            authorization_policies: vec!["shop/allow-web".into(), "istio-system/strict".into()],
            status: WorkloadStatus::Unhealthy as i32,
            cluster_id: "Kubernetes".into(),
            locality: Some(Locality {
                region: "eu".into(),
                zone: "eu-1a".into(),
                subzone: "rack3".into(),
            }),
            network_mode: NetworkMode::HostNetwork as i32,
            extensions: vec![Extension {
                name: "ext".into(),
                config: Some(Any {
                    type_url: "type.googleapis.com/x.Y".into(),
                    value: Bytes::from_static(&[8, 1]),
                }),
            }],
            capacity: Some(3),
        }
    }

    #[test]
    fn an_address_holding_a_workload_with_every_field_set() {
        let address = Address {
            r#type: Some(address::Type::Workload(every_workload_field())),
        };
        pinned(
            &address,
            "0af1020a057765622d31120473686f701a040a0000071a1020010db8000000000000000000\
             0000072204\
             6e6574312801320d636c75737465722e6c6f63616c3a03776562422c0a270a0473686f70\
             121f776179706f696e742e73686f702e7376632e636c75737465722e6c6f63616c18a075\
             4a066e6f64652d6152037765625a02763260026a03776562700182010e73686f702f616c\
             6c6f772d776562820113697374696f2d73797374656d2f73747269637488010192010a4b\
             756265726e657465739a0111120c0a046e6574321204c0a8010118a175a2011a4b756265\
             726e657465732f2f506f642f73686f702f7765622d31b201310a1f73686f702f7765622e\
             73686f702e7376632e636c75737465722e6c6f63616c120e0a07085010903f18010a0308\
             8247ba0105080110f075c201120a026575120565752d31611a057261636b33c80101d201\
             240a03657874121d0a17747970652e676f6f676c65617069732e636f6d2f782e59120208\
             01da01020803",
        );
    }

    #[test]
    fn a_pod_workload_as_istiod_sends_one() {
        let pod = Workload {
            uid: "Kubernetes//Pod/shop/web-1".into(),
            name: "web-1".into(),
            namespace: "shop".into(),
            addresses: vec![v4([10, 0, 0, 7])],
            tunnel_protocol: TunnelProtocol::Hbone as i32,
            service_account: "web".into(),
            node: "node-a".into(),
            canonical_name: "web".into(),
            canonical_revision: "v1".into(),
            workload_name: "web".into(),
            workload_type: WorkloadType::Pod as i32,
            services: [(
                "shop/web.shop.svc.cluster.local".to_owned(),
                PortList {
                    ports: vec![port(80, 8080, AppProtocol::Unknown)],
                },
            )]
            .into(),
            status: WorkloadStatus::Unhealthy as i32,
            cluster_id: "Kubernetes".into(),
            capacity: Some(2),
            ..Default::default()
        };
        pinned(
            &pod,
            "0a057765622d31120473686f701a040a00000728013a037765624a066e6f64652d615203\
             7765625a02763160026a0377656288010192010a4b756265726e65746573a2011a4b7562\
             65726e657465732f2f506f642f73686f702f7765622d31b2012a0a1f73686f702f776562\
             2e73686f702e7376632e636c75737465722e6c6f63616c12070a05085010903fda010208\
             02",
        );
    }

    #[test]
    fn capacity_is_a_wrapper_whose_presence_survives_a_zero() {
        // UInt32Value{value: 0} is an empty message, still present.
        let w = Workload {
            uid: "u".into(),
            capacity: Some(0),
            ..Default::default()
        };
        pinned(&w, "a2010175da0100");
        assert_eq!(Workload::decode(&[][..]).unwrap().capacity, None);
        pinned(&Workload::default(), "");
    }

    #[test]
    fn an_address_holding_a_service_with_every_field_set() {
        let service = Service {
            name: "web".into(),
            namespace: "shop".into(),
            hostname: "web.shop.svc.cluster.local".into(),
            addresses: vec![
                NetworkAddress {
                    network: String::new(),
                    address: v4([10, 96, 0, 10]),
                    length: None,
                },
                NetworkAddress {
                    network: "net1".into(),
                    address: v4([10, 97, 0, 0]),
                    length: Some(16),
                },
                NetworkAddress {
                    network: String::new(),
                    address: Bytes::copy_from_slice(&[
                        0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10,
                    ]),
                    // Present though zero: proto3 `optional`.
                    length: Some(0),
                },
            ],
            ports: vec![
                port(80, 8080, AppProtocol::Http2),
                port(9090, 0, AppProtocol::Unknown),
            ],
            subject_alt_names: vec!["spiffe://cluster.local/ns/shop/sa/web".into()],
            waypoint: Some(GatewayAddress {
                destination: Some(gateway_address::Destination::Address(NetworkAddress {
                    network: String::new(),
                    address: v4([10, 0, 0, 99]),
                    length: None,
                })),
                hbone_mtls_port: 15008,
            }),
            load_balancing: Some(LoadBalancing {
                routing_preference: vec![
                    load_balancing::Scope::Node as i32,
                    load_balancing::Scope::Zone as i32,
                ],
                mode: load_balancing::Mode::Strict as i32,
                health_policy: load_balancing::HealthPolicy::AllowAll as i32,
            }),
            ip_families: IpFamilies::Dual as i32,
            extensions: vec![Extension {
                name: "e".into(),
                config: None,
            }],
            canonical: true,
            ingress_use_waypoint: true,
            weighted_waypoints: vec![WeightedWaypoint {
                destination: Some(GatewayAddress {
                    destination: hostname("shop", "wp2.shop.svc.cluster.local"),
                    hbone_mtls_port: 15008,
                }),
                weight: 30,
            }],
            visibility: service::Visibility::Namespace as i32,
        };
        let address = Address {
            r#type: Some(address::Type::Service(service)),
        };
        pinned(
            &address,
            "12db010a03776562120473686f701a1a7765622e73686f702e7376632e636c7573746572\
             2e6c6f63616c220612040a60000a220e0a046e65743112040a610000181022141210fd00\
             000000000000000000000000000a18002a07085010903f18022a03088247322573706966\
             66653a2f2f636c75737465722e6c6f63616c2f6e732f73686f702f73612f7765623a0b12\
             0612040a00006318a07542080a02040210011801480352030a0165580160016a2b0a270a\
             220a0473686f70121a7770322e73686f702e7376632e636c75737465722e6c6f63616c18\
             a075101e7001",
        );
    }

    #[test]
    fn a_cluster_ip_service_as_istiod_sends_one() {
        let service = Service {
            name: "web".into(),
            namespace: "shop".into(),
            hostname: "web.shop.svc.cluster.local".into(),
            addresses: vec![NetworkAddress {
                network: String::new(),
                address: v4([10, 96, 0, 10]),
                length: None,
            }],
            ports: vec![
                port(80, 8080, AppProtocol::Unknown),
                port(9090, 0, AppProtocol::Unknown),
            ],
            ..Default::default()
        };
        pinned(
            &service,
            "0a03776562120473686f701a1a7765622e73686f702e7376632e636c75737465722e6c6f\
             63616c220612040a60000a2a05085010903f2a03088247",
        );
    }

    #[test]
    fn unknown_enum_values_survive_decoding_and_are_refused_by_try_from() {
        let w = Workload {
            uid: "u".into(),
            tunnel_protocol: 7,
            status: 9,
            network_mode: 3,
            workload_type: 11,
            ..Default::default()
        };
        pinned(&w, "2807600b880109a2010175c80103");
        assert!(TunnelProtocol::try_from(w.tunnel_protocol).is_err());
        assert!(WorkloadStatus::try_from(w.status).is_err());
        assert!(NetworkMode::try_from(w.network_mode).is_err());
        assert!(WorkloadType::try_from(w.workload_type).is_err());

        let s = Service {
            name: "s".into(),
            ip_families: 4,
            visibility: 2,
            load_balancing: Some(LoadBalancing {
                routing_preference: vec![7],
                mode: 4,
                health_policy: 2,
            }),
            ..Default::default()
        };
        pinned(&s, "0a017342070a01071004180248047002");
        assert!(IpFamilies::try_from(s.ip_families).is_err());
        assert!(service::Visibility::try_from(s.visibility).is_err());
        let lb = s.load_balancing.as_ref().unwrap();
        assert!(load_balancing::Scope::try_from(lb.routing_preference[0]).is_err());
        assert!(load_balancing::Mode::try_from(lb.mode).is_err());
        assert!(load_balancing::HealthPolicy::try_from(lb.health_policy).is_err());
    }

    #[test]
    fn enum_values_are_istios() {
        assert_eq!(
            TunnelProtocol::try_from(2),
            Ok(TunnelProtocol::LegacyIstioMtls)
        );
        assert_eq!(WorkloadStatus::try_from(1), Ok(WorkloadStatus::Unhealthy));
        assert_eq!(WorkloadType::try_from(3), Ok(WorkloadType::Job));
        assert_eq!(NetworkMode::try_from(1), Ok(NetworkMode::HostNetwork));
        assert_eq!(IpFamilies::try_from(2), Ok(IpFamilies::Ipv6Only));
        assert_eq!(AppProtocol::try_from(5), Ok(AppProtocol::Tls));
        assert_eq!(
            load_balancing::Scope::try_from(6),
            Ok(load_balancing::Scope::Network)
        );
        assert_eq!(
            load_balancing::Mode::try_from(3),
            Ok(load_balancing::Mode::Passthrough)
        );
        assert_eq!(
            application_tunnel::Protocol::try_from(1),
            Ok(application_tunnel::Protocol::Proxy)
        );
        assert_eq!(
            service::Visibility::try_from(1),
            Ok(service::Visibility::Namespace)
        );
    }

    #[test]
    fn decode_reads_one_resource() {
        let bytes = hex("12050a03776562");
        let Some(address::Type::Service(s)) = decode(&bytes).unwrap().r#type else {
            panic!("a service");
        };
        assert_eq!(s.name, "web");
        assert!(decode(&[0x12, 0x05]).is_err(), "truncated");
    }
}
