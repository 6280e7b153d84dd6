//! Listening sockets: SO_REUSEPORT so a new gateway can bind beside an old
//! one during an upgrade, and the original destination of captured traffic.

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} for {what}: {source}{hint}")]
pub struct BindError {
    pub what: &'static str,
    pub addr: SocketAddr,
    pub source: io::Error,
    /// What to check: the port's holder when it is in use (see [`in_use_hint`]).
    hint: String,
}

impl BindError {
    fn new(what: &'static str, addr: SocketAddr, source: io::Error) -> Self {
        let hint = match source.kind() {
            io::ErrorKind::AddrInUse => in_use_hint(addr, &format!("`listeners.{what}`")),
            _ => format!(" (set `listeners.{what}`)"),
        };
        BindError {
            what,
            addr,
            source,
            hint,
        }
    }
}

/// "; port P is in use by pid N (name): stop it or change `key`", the
/// holder found in `/proc` ([`super::port_holder`]).
pub fn in_use_hint(addr: SocketAddr, key: &str) -> String {
    format!(
        "; port {} is {}: stop it or change {key}",
        addr.port(),
        super::port_holder::find(addr)
    )
}

/// Binds a TCP listener with SO_REUSEADDR and SO_REUSEPORT.
pub fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, BindError> {
    let err = |source| BindError::new(what, addr, source);
    let socket =
        Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(err)?;
    socket.set_reuse_address(true).map_err(err)?;
    socket.set_reuse_port(true).map_err(err)?;
    socket.set_nonblocking(true).map_err(err)?;
    socket.bind(&addr.into()).map_err(err)?;
    socket.listen(1024).map_err(err)?;
    TcpListener::from_std(socket.into()).map_err(err)
}

/// The destination the client originally dialed: `SO_ORIGINAL_DST` when
/// iptables REDIRECT rewrote it, `None` when the connection was not redirected.
pub fn original_dst(tcp: &TcpStream) -> Option<SocketAddr> {
    let sock = SockRef::from(tcp);
    let local = tcp.local_addr().ok()?;
    let orig = match local {
        SocketAddr::V4(_) => sock.original_dst_v4(),
        SocketAddr::V6(_) => sock.original_dst_v6(),
    }
    .ok()?
    .as_socket()?;
    // Without a NAT entry the kernel reports the local address itself.
    (orig != local).then_some(orig)
}

/// The original destination if redirected, else the address the client dialed.
pub fn destination(tcp: &TcpStream) -> io::Result<SocketAddr> {
    match original_dst(tcp) {
        Some(a) => Ok(a),
        None => tcp.local_addr(),
    }
}
