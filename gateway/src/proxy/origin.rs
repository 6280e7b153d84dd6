//! Where the data path's sockets live: the gateway's own network namespace
//! (node mode: the lab, the demo, iptables REDIRECT on the node) or a pod's
//! (in-pod mode: one set of listeners inside each meshed pod, as Istio
//! ambient's ztunnel does).
//!
//! A pod's outbound tunnels are dialed from inside the pod, so they leave
//! with the pod's own IP; its inbound deliveries are dialed from inside the
//! pod with the original client's IP as source, so the app sees its real
//! peer. Every such socket carries the mesh mark: the pod's capture rules
//! let it through (and route the app's replies back to it).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use tokio::net::{TcpSocket, TcpStream};

use crate::inpod::netns::{DialOpts, NetnsSockets};
use crate::proxy::congestion::Congestion;
use tidegate_netns::namespace::{NetnsId, PodNetns, MESH_MARK};

/// A pod served in its own namespace, as its node agent handed it over.
#[derive(Debug)]
pub struct Pod {
    /// Kubernetes `metadata.uid`: the key of the pod's workload.
    pub uid: String,
    pub name: String,
    pub namespace: String,
    /// As the node agent named it (ZDS does, `tidegate-cni` cannot): the
    /// identity used while discovery does not know the pod yet.
    pub service_account: Option<String>,
    pub netns: Arc<PodNetns>,
    pub sockets: NetnsSockets,
}

impl Pod {
    /// The pod's workload in `snapshot` ([`crate::workloads::WorkloadSnapshot::pod_workload`]).
    pub fn workload<'s>(
        &self,
        snapshot: &'s crate::workloads::WorkloadSnapshot,
    ) -> Option<&'s Arc<crate::workloads::Workload>> {
        snapshot.pod_workload(&self.uid, &self.namespace, &self.name)
    }

    /// Whether `w` is this pod's workload.
    pub fn is(&self, w: &crate::workloads::Workload) -> bool {
        w.uid() == self.uid
            || (w.local && w.spec.namespace == self.namespace && w.spec.name == self.name)
    }
}

/// The namespace a listener, and every socket made for its connections, is in.
#[derive(Clone, Debug, Default)]
pub enum Origin {
    /// The gateway's own namespace.
    #[default]
    Node,
    Pod(Arc<Pod>),
}

impl Origin {
    /// The pod namespace, for pool keys: tunnels of different pods are never
    /// shared (each leaves with its own pod's address).
    pub fn netns(&self) -> Option<NetnsId> {
        match self {
            Origin::Node => None,
            Origin::Pod(p) => Some(p.netns.id()),
        }
    }

    pub fn pod(&self) -> Option<&Arc<Pod>> {
        match self {
            Origin::Node => None,
            Origin::Pod(p) => Some(p),
        }
    }

    /// A connection to `addr` made in this namespace, with congestion
    /// control `cc`. `as_client`: the original client's address as source
    /// (in a pod: `IP_TRANSPARENT`), so the destination sees its real peer;
    /// ignored in the node's namespace.
    pub async fn connect(
        &self,
        addr: SocketAddr,
        as_client: Option<IpAddr>,
        cc: &Congestion,
    ) -> io::Result<TcpStream> {
        let Origin::Pod(pod) = self else {
            let socket = match addr {
                SocketAddr::V4(_) => TcpSocket::new_v4()?,
                SocketAddr::V6(_) => TcpSocket::new_v6()?,
            };
            cc.apply_or_log(&socket);
            return socket.connect(addr).await;
        };
        let source = as_client.filter(|ip| ip.is_ipv4() == addr.is_ipv4());
        let socket = pod
            .sockets
            .dial_socket(
                &pod.netns,
                addr.ip(),
                DialOpts {
                    mark: MESH_MARK,
                    source,
                    transparent: source.is_some(),
                },
            )
            .map_err(io::Error::other)?;
        cc.apply_or_log(&socket);
        socket.connect(addr).await
    }
}
