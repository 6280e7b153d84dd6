//! Sockets made inside a pod's network namespace by the gateway's reserved
//! thread (`tidegate::inpod::netns`), checked from the kernel's side: which
//! namespace a listener lives in, its mark, and a transparent source.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use socket2::SockRef;
use tidegate::inpod::netns::{DialOpts, ListenOpts, NetnsError, NetnsSockets, PodNetns, MESH_MARK};
use tidegate_e2e::netns::run;

/// A namespace named after the test and the process, deleted on drop.
struct Ns(String);

impl Ns {
    fn new(tag: &str) -> Ns {
        let name = format!("tgp{}{tag}", std::process::id());
        run(&format!("ip netns add {name}"));
        run(&format!("ip -n {name} link set lo up"));
        Ns(name)
    }

    fn open(&self) -> Arc<PodNetns> {
        Arc::new(PodNetns::open(format!("/var/run/netns/{}", self.0).as_ref()).unwrap())
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .status();
    }
}

fn listen_opts() -> ListenOpts {
    ListenOpts {
        mark: MESH_MARK,
        transparent: false,
        backlog: 16,
    }
}

fn dial_opts(source: Option<IpAddr>, transparent: bool) -> DialOpts {
    DialOpts {
        mark: MESH_MARK,
        source,
        transparent,
    }
}

#[tokio::test]
async fn a_listener_made_for_a_pod_lives_in_its_namespace_with_the_mark() {
    if super::skip() {
        return;
    }
    let ns = Ns::new("l");
    let pod = ns.open();
    let sockets = NetnsSockets::start().unwrap();
    // The host namespace holds the port without SO_REUSEPORT: the same
    // port binds again only in another namespace.
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = host.local_addr().unwrap();
    let listener = sockets.listen(&pod, addr, listen_opts()).await.unwrap();
    assert_eq!(SockRef::from(&listener).mark().unwrap(), MESH_MARK);
    assert!(SockRef::from(&listener).reuse_port().unwrap());
    // A dial made in the pod's namespace reaches the pod's listener.
    let socket = sockets
        .dial_socket(&pod, addr.ip(), dial_opts(None, false))
        .await
        .unwrap();
    assert_eq!(SockRef::from(&socket).mark().unwrap(), MESH_MARK);
    let (dialed, accepted) = tokio::join!(socket.connect(addr), listener.accept());
    let dialed = dialed.unwrap();
    let (_accepted, peer) = accepted.unwrap();
    assert_eq!(peer, dialed.local_addr().unwrap());
    // The host's listener saw nothing.
    host.set_nonblocking(true).unwrap();
    assert_eq!(
        host.accept().unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
}

#[tokio::test]
async fn a_dial_from_a_pod_takes_a_source_it_does_not_own_only_when_transparent() {
    if super::skip() {
        return;
    }
    let ns = Ns::new("d");
    let pod = ns.open();
    let sockets = NetnsSockets::start().unwrap();
    let client_ip = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7));
    let s = sockets
        .dial_socket(&pod, client_ip, dial_opts(Some(client_ip), true))
        .await
        .unwrap();
    assert_eq!(s.local_addr().unwrap().ip(), client_ip);
    let e = sockets
        .dial_socket(&pod, client_ip, dial_opts(Some(client_ip), false))
        .await
        .unwrap_err();
    match e {
        NetnsError::Socket { what, source } => {
            assert_eq!(what, "bind the source");
            assert_eq!(source.kind(), std::io::ErrorKind::AddrNotAvailable);
        }
        other => panic!("want a bind error, got {other}"),
    }
    // The thread went back home after the failure: the next job works.
    let l = sockets
        .listen(&pod, SocketAddr::from(([127, 0, 0, 1], 0)), listen_opts())
        .await
        .unwrap();
    assert!(l.local_addr().unwrap().port() > 0);
}

#[test]
fn a_namespace_has_one_identity_and_anything_else_is_refused() {
    if super::skip() {
        return;
    }
    let (a, b) = (Ns::new("ia"), Ns::new("ib"));
    assert_eq!(a.open().id(), a.open().id());
    assert_ne!(a.open().id(), b.open().id());
    let not_ns = std::fs::File::open("/dev/null").unwrap();
    assert!(matches!(
        PodNetns::from_fd(not_ns.into()),
        Err(NetnsError::NotANamespace)
    ));
}
