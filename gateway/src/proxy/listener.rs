//! Listening sockets: SO_REUSEPORT so a new gateway can bind beside an old
//! one during an upgrade, and the original destination of captured traffic.
//!
//! A wildcard listener on `[::]` is dual-stack (no `IPV6_V6ONLY`, as
//! ztunnel's): one socket takes both families, so a port cannot be half
//! taken by another process, and one accept loop serves both. An IPv4
//! connection on it shows IPv4-mapped addresses (`::ffff:10.0.0.1`);
//! [`canonical`] turns them into IPv4 ones wherever an address enters
//! (peer, local, original destination), so a policy, a workload lookup or
//! the own-port guard sees one spelling. Where IPv6 is off (no `::1`,
//! `disable_ipv6`, a kernel without it) the wildcard falls back to
//! `0.0.0.0`, logged once: IPv4 is served all the same.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};

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

/// Binds a TCP listener with SO_REUSEADDR and SO_REUSEPORT; `[::]` is
/// dual-stack, or `0.0.0.0` where IPv6 is off (see the module documentation).
pub fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, BindError> {
    bind_with(what, addr, true)
}

/// Like [`bind`] without SO_REUSEPORT: a port another process listens on
/// is refused (`AddrInUse`), never shared. For the admin, metrics and
/// readiness ports, which answer for one gateway (`app/control_ports.rs`).
pub fn bind_exclusive(what: &'static str, addr: SocketAddr) -> Result<TcpListener, BindError> {
    bind_with(what, addr, false)
}

fn bind_with(
    what: &'static str,
    addr: SocketAddr,
    reuse_port: bool,
) -> Result<TcpListener, BindError> {
    let err = |source| BindError::new(what, addr, source);
    let socket = match bind_socket(addr, reuse_port) {
        Err(e) if is_ipv6_wildcard(addr) && ipv6_off(&e) => {
            let v4 = SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port()));
            let socket =
                bind_socket(v4, reuse_port).map_err(|source| BindError::new(what, v4, source))?;
            ipv6_unavailable(&e);
            socket
        }
        r => r.map_err(err)?,
    };
    TcpListener::from_std(socket.into()).map_err(err)
}

fn bind_socket(addr: SocketAddr, reuse_port: bool) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    dual_stack(&socket, addr)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(reuse_port)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket)
}

/// Whether binding `[::]` failed because IPv6 is off here (no IPv6 in the
/// kernel, or no address of it): the cases the IPv4 fallback is for. Any
/// other failure (the port in use, a missing capability) is reported, not
/// papered over with a listener of one family.
pub fn ipv6_off(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL | libc::EPROTONOSUPPORT)
    )
}

/// Whether `addr` is `[::]:port`: the wildcard of both families.
pub fn is_ipv6_wildcard(addr: SocketAddr) -> bool {
    matches!(addr, SocketAddr::V6(v6) if v6.ip().is_unspecified())
}

/// Clears `IPV6_V6ONLY` on a socket for `[::]` (the system default may set
/// it: `net.ipv6.bindv6only`), so it takes IPv4 connections too.
pub fn dual_stack(socket: &Socket, addr: SocketAddr) -> io::Result<()> {
    if is_ipv6_wildcard(addr) {
        socket.set_only_v6(false)?;
    }
    Ok(())
}

/// Logs, once per process, that `[::]` could not be bound and IPv4 alone
/// is served.
pub fn ipv6_unavailable(e: &dyn std::fmt::Display) {
    static LOGGED: AtomicBool = AtomicBool::new(false);
    if !LOGGED.swap(true, Ordering::Relaxed) {
        tracing::warn!(error = %e, "IPv6 is not available here: listening on 0.0.0.0, serving IPv4 only (logged once)");
    }
}

/// `addr` with an IPv4-mapped IPv6 address (an IPv4 peer of a dual-stack
/// socket) as its IPv4 address.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    tidegate_protocol::hbone::authority::canonical(addr)
}

/// The destination the client originally dialed: `SO_ORIGINAL_DST`
/// (`IP6T_SO_ORIGINAL_DST` for IPv6) when iptables REDIRECT rewrote it,
/// `None` when the connection was not redirected. Canonical: an IPv4
/// connection on a dual-stack socket asks the IPv4 table and is answered
/// with IPv4 addresses.
pub fn original_dst(tcp: &TcpStream) -> Option<SocketAddr> {
    let sock = SockRef::from(tcp);
    let local = canonical(tcp.local_addr().ok()?);
    let orig = match local {
        SocketAddr::V4(_) => sock.original_dst_v4(),
        SocketAddr::V6(_) => sock.original_dst_v6(),
    }
    .ok()?
    .as_socket()
    .map(canonical)?;
    // Without a NAT entry the kernel reports the local address itself.
    (orig != local).then_some(orig)
}

/// The original destination if redirected, else the address the client
/// dialed (canonical).
pub fn destination(tcp: &TcpStream) -> io::Result<SocketAddr> {
    match original_dst(tcp) {
        Some(a) => Ok(a),
        None => tcp.local_addr().map(canonical),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_addresses_become_ipv4_and_others_stay() {
        for (given, canonical_form) in [
            ("[::ffff:10.0.0.1]:80", "10.0.0.1:80"),
            ("[::ffff:127.0.0.1]:15001", "127.0.0.1:15001"),
            ("10.0.0.1:80", "10.0.0.1:80"),
            ("[fd00::1]:80", "[fd00::1]:80"),
            ("[::1]:15008", "[::1]:15008"),
        ] {
            let addr: SocketAddr = given.parse().unwrap();
            assert_eq!(canonical(addr).to_string(), canonical_form, "{given}");
        }
    }

    #[test]
    fn only_ipv6_being_off_falls_back_to_ipv4() {
        for errno in [
            libc::EAFNOSUPPORT,
            libc::EADDRNOTAVAIL,
            libc::EPROTONOSUPPORT,
        ] {
            assert!(ipv6_off(&io::Error::from_raw_os_error(errno)), "{errno}");
        }
        for errno in [libc::EADDRINUSE, libc::EACCES, libc::EPERM] {
            assert!(!ipv6_off(&io::Error::from_raw_os_error(errno)), "{errno}");
        }
    }

    #[test]
    fn a_taken_wildcard_port_is_an_error_not_an_ipv4_listener() {
        // Held without SO_REUSEPORT: the gateway's bind must fail.
        let held = std::net::TcpListener::bind("[::]:0").unwrap();
        let addr = held.local_addr().unwrap();
        let err = bind("inbound", addr).unwrap_err();
        assert_eq!(err.source.kind(), io::ErrorKind::AddrInUse, "{err}");
        assert_eq!(err.addr, addr);
    }

    #[tokio::test]
    async fn an_exclusive_listener_is_never_shared() {
        // A data listener's port is shared by a second one (the upgrade)...
        let data = bind("inbound", "127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = data.local_addr().unwrap();
        assert!(bind("inbound", addr).is_ok());
        // ... an exclusive one's is not, whichever of the two came first.
        let admin = bind_exclusive("admin", "127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = admin.local_addr().unwrap();
        for second in [bind_exclusive("admin", addr), bind("admin", addr)] {
            let err = second.unwrap_err();
            assert_eq!(err.source.kind(), io::ErrorKind::AddrInUse, "{err}");
        }
        let err = bind_exclusive("admin", data.local_addr().unwrap()).unwrap_err();
        assert_eq!(err.source.kind(), io::ErrorKind::AddrInUse, "{err}");
    }

    #[tokio::test]
    async fn a_wildcard_listener_takes_both_families_with_canonical_addresses() {
        let l = bind("outbound", "[::]:0".parse().unwrap()).unwrap();
        let port = l.local_addr().unwrap().port();
        let v4 = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let (accepted, peer) = l.accept().await.unwrap();
        assert_eq!(canonical(peer), v4.local_addr().unwrap());
        assert_eq!(
            destination(&accepted).unwrap(),
            SocketAddr::from(([127, 0, 0, 1], port)),
            "not redirected: the dialed address, as IPv4"
        );
        assert_eq!(original_dst(&accepted), None);
        if l.local_addr().unwrap().is_ipv6() {
            let v6 = tokio::net::TcpStream::connect(("::1", port)).await;
            // A host without ::1 (IPv6 off on loopback) cannot dial it.
            if let Ok(v6) = v6 {
                let (accepted, peer) = l.accept().await.unwrap();
                assert_eq!(peer, v6.local_addr().unwrap());
                assert_eq!(
                    destination(&accepted).unwrap(),
                    "[::1]:0"
                        .parse::<SocketAddr>()
                        .map(|a| SocketAddr::new(a.ip(), port))
                        .unwrap()
                );
            }
        }
    }
}
