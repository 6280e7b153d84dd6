//! Sockets inside a pod's network namespace.
//!
//! A socket belongs to the network namespace of the thread that creates it
//! and stays there whatever thread uses it later. So the thread that needs
//! a pod socket ([`NetnsSockets`]) `setns()`es into the pod's namespace,
//! creates and sets up the socket, and `setns()`es back into the namespace
//! it came from, all in one synchronous call (nothing can await, so no
//! other task runs on the thread meanwhile); the socket is then served
//! from tokio as usual. A thread that cannot get back stops the gateway:
//! its next sockets would be made in the wrong namespace. (ztunnel makes
//! its pod sockets the same way. A reserved thread making them would cost
//! every inbound delivery two cross-thread wake-ups: one context switch and
//! 1.5 futex calls more per new connection, docs/performance.md.)
//!
//! Every socket made here carries `SO_MARK` (the mesh's packet mark, 0x539
//! by default) so the pod's capture rules let the gateway's own traffic
//! through (DNS included: istio-cni's redirect of port 53 skips it too);
//! listeners get `SO_REUSEPORT` (an upgraded gateway binds beside
//! the old one); a dial can take a source address that is not the pod's own
//! (`IP_TRANSPARENT` + `IP_FREEBIND`: inbound delivery with the original
//! client's IP, so the app sees its real peer).
//!
//! The namespace itself ([`PodNetns`], its `NetnsId`, `MESH_MARK`) is
//! `tidegate_netns::namespace`, shared with `tidegate-cni`: imported from
//! there by its users.

use std::fs::File;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;

use socket2::{Domain, Protocol, Socket, Type};
use tidegate_netns::namespace::setns;
use tidegate_netns::namespace::{NetnsError, PodNetns};
use tracing::error;

/// What a listener in a pod namespace gets.
#[derive(Clone, Copy, Debug)]
pub struct ListenOpts {
    pub mark: u32,
    /// `IP_TRANSPARENT`: accept connections to any address (inbound
    /// listeners, where the original destination is the pod's app).
    pub transparent: bool,
    pub backlog: i32,
}

/// What a dial from a pod namespace gets.
#[derive(Clone, Copy, Debug)]
pub struct DialOpts {
    pub mark: u32,
    /// Bind to this source first; with `transparent`, it need not be an
    /// address of the pod (`IP_TRANSPARENT` + `IP_FREEBIND`).
    pub source: Option<IpAddr>,
    pub transparent: bool,
}

/// Makes sockets inside pod namespaces (see the module documentation).
#[derive(Clone, Copy, Debug, Default)]
pub struct NetnsSockets;

thread_local! {
    /// The namespace this thread returns to after making a pod socket:
    /// the one it was in the first time it made one.
    static HOME: std::cell::OnceCell<OwnedFd> = const { std::cell::OnceCell::new() };
}

impl NetnsSockets {
    pub fn new() -> NetnsSockets {
        NetnsSockets
    }

    /// Runs `f` on the calling thread inside `ns` and brings the thread
    /// back to its own namespace before returning.
    fn run<T>(
        &self,
        ns: &PodNetns,
        f: impl FnOnce() -> Result<T, NetnsError>,
    ) -> Result<T, NetnsError> {
        HOME.with(|home| {
            let home = match home.get() {
                Some(fd) => fd,
                None => {
                    let fd: OwnedFd = File::open("/proc/thread-self/ns/net")
                        .map_err(NetnsError::Open)?
                        .into();
                    home.get_or_init(|| fd)
                }
            };
            ns.enter().map_err(NetnsError::Enter)?;
            let r = f();
            if let Err(e) = setns(home) {
                error!(error = %e, "cannot return to the gateway's network namespace after making a pod socket; stopping");
                std::process::abort();
            }
            r
        })
    }

    /// A TCP listener on `addr` inside `ns` (`SO_REUSEADDR`, `SO_REUSEPORT`,
    /// the mark, `IP_TRANSPARENT` when asked; dual-stack on `[::]`).
    pub fn listen(
        &self,
        ns: &PodNetns,
        addr: SocketAddr,
        opts: ListenOpts,
    ) -> Result<tokio::net::TcpListener, NetnsError> {
        let socket = self.run(ns, move || {
            let s = new_socket(addr.ip(), opts.mark)?;
            let err = |what| move |source| NetnsError::Socket { what, source };
            crate::proxy::listener::dual_stack(&s, addr).map_err(err("IPV6_V6ONLY off"))?;
            s.set_reuse_address(true).map_err(err("SO_REUSEADDR"))?;
            s.set_reuse_port(true).map_err(err("SO_REUSEPORT"))?;
            if opts.transparent {
                set_transparent(&s).map_err(err("IP_TRANSPARENT"))?;
            }
            s.bind(&addr.into()).map_err(err("bind"))?;
            s.listen(opts.backlog).map_err(err("listen"))?;
            Ok(s)
        })?;
        tokio::net::TcpListener::from_std(socket.into()).map_err(|source| NetnsError::Socket {
            what: "register with tokio",
            source,
        })
    }

    /// An unconnected TCP socket for `family_of` inside `ns` (the mark; the
    /// source bound when asked), for the caller to connect from tokio.
    pub fn dial_socket(
        &self,
        ns: &PodNetns,
        family_of: IpAddr,
        opts: DialOpts,
    ) -> Result<tokio::net::TcpSocket, NetnsError> {
        let socket = self.run(ns, move || {
            let s = new_socket(family_of, opts.mark)?;
            let err = |what| move |source| NetnsError::Socket { what, source };
            if opts.transparent {
                set_transparent(&s).map_err(err("IP_TRANSPARENT"))?;
                set_freebind(&s).map_err(err("IP_FREEBIND"))?;
            }
            if let Some(ip) = opts.source {
                s.bind(&SocketAddr::new(ip, 0).into())
                    .map_err(err("bind the source"))?;
            }
            Ok(s)
        })?;
        Ok(tokio::net::TcpSocket::from_std_stream(socket.into()))
    }

    /// A UDP socket bound to `addr` inside `ns`, with the mark: a listener
    /// (`reuse`: `SO_REUSEADDR` and `SO_REUSEPORT`, as TCP listeners get) or,
    /// bound to port 0, the socket of one query sent from the pod.
    pub fn udp_bind(
        &self,
        ns: &PodNetns,
        addr: SocketAddr,
        mark: u32,
        reuse: bool,
    ) -> Result<tokio::net::UdpSocket, NetnsError> {
        let socket = self.run(ns, move || {
            let s = new_socket_of(addr.ip(), Type::DGRAM, Protocol::UDP, mark)?;
            let err = |what| move |source| NetnsError::Socket { what, source };
            if reuse {
                s.set_reuse_address(true).map_err(err("SO_REUSEADDR"))?;
                s.set_reuse_port(true).map_err(err("SO_REUSEPORT"))?;
            }
            s.bind(&addr.into()).map_err(err("bind"))?;
            Ok(s)
        })?;
        tokio::net::UdpSocket::from_std(socket.into()).map_err(|source| NetnsError::Socket {
            what: "register with tokio",
            source,
        })
    }
}

/// A nonblocking TCP socket of `ip`'s family with `SO_MARK`.
fn new_socket(ip: IpAddr, mark: u32) -> Result<Socket, NetnsError> {
    new_socket_of(ip, Type::STREAM, Protocol::TCP, mark)
}

/// A nonblocking socket of `ip`'s family, of type `ty`, with `SO_MARK`.
fn new_socket_of(
    ip: IpAddr,
    ty: Type,
    protocol: Protocol,
    mark: u32,
) -> Result<Socket, NetnsError> {
    let err = |what| move |source| NetnsError::Socket { what, source };
    let s = Socket::new(
        Domain::for_address(SocketAddr::new(ip, 0)),
        ty,
        Some(protocol),
    )
    .map_err(err("socket"))?;
    s.set_nonblocking(true).map_err(err("nonblocking"))?;
    s.set_mark(mark)
        .map_err(err("SO_MARK (needs CAP_NET_ADMIN)"))?;
    Ok(s)
}

fn set_transparent(s: &Socket) -> io::Result<()> {
    match s.domain()? {
        Domain::IPV6 => s.set_ip_transparent_v6(true),
        _ => s.set_ip_transparent_v4(true),
    }
}

fn set_freebind(s: &Socket) -> io::Result<()> {
    match s.domain()? {
        Domain::IPV6 => s.set_freebind_v6(true),
        _ => s.set_freebind_v4(true),
    }
}
