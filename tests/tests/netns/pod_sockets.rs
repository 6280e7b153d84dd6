//! Sockets made inside a pod's network namespace by the thread that asks
//! for them (`tidegate::inpod::netns`), checked from the kernel's side: which
//! namespace a listener lives in, its mark, a transparent source, and the
//! thread back in its own namespace afterwards.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use socket2::SockRef;
use tidegate::inpod::netns::{DialOpts, ListenOpts, NetnsSockets};
use tidegate_e2e::netns::run;
use tidegate_netns::namespace::{NetnsError, PodNetns, MESH_MARK};

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

/// The network namespace the calling thread is in (`net:[inode]`).
fn this_threads_namespace() -> std::path::PathBuf {
    std::fs::read_link("/proc/thread-self/ns/net").unwrap()
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
    let sockets = NetnsSockets::new();
    // The host namespace holds the port without SO_REUSEPORT: the same
    // port binds again only in another namespace.
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = host.local_addr().unwrap();
    let listener = sockets.listen(&pod, addr, listen_opts()).unwrap();
    assert_eq!(SockRef::from(&listener).mark().unwrap(), MESH_MARK);
    assert!(SockRef::from(&listener).reuse_port().unwrap());
    // A dial made in the pod's namespace reaches the pod's listener.
    let socket = sockets
        .dial_socket(&pod, addr.ip(), dial_opts(None, false))
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

/// The DNS proxy's UDP sockets: a listener and a query's socket, both
/// in the pod with the mark; a datagram between them stays in the pod.
#[tokio::test]
async fn a_udp_socket_made_for_a_pod_lives_in_its_namespace_with_the_mark() {
    if super::skip() {
        return;
    }
    let ns = Ns::new("u");
    let pod = ns.open();
    let sockets = NetnsSockets::new();
    let home = this_threads_namespace();
    // The host namespace holds the port without SO_REUSEPORT.
    let host = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = host.local_addr().unwrap();
    let listener = sockets.udp_bind(&pod, addr, MESH_MARK, true).unwrap();
    assert_eq!(SockRef::from(&listener).mark().unwrap(), MESH_MARK);
    assert!(SockRef::from(&listener).reuse_port().unwrap());
    let any = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
    let query = sockets.udp_bind(&pod, any, MESH_MARK, false).unwrap();
    assert_eq!(SockRef::from(&query).mark().unwrap(), MESH_MARK);
    assert!(!SockRef::from(&query).reuse_port().unwrap());
    assert_eq!(
        this_threads_namespace(),
        home,
        "back home after the sockets"
    );
    query.send_to(b"q", addr).await.unwrap();
    let mut buf = [0u8; 8];
    let (n, from) = listener.recv_from(&mut buf).await.unwrap();
    assert_eq!(
        (&buf[..n], from.port()),
        (&b"q"[..], query.local_addr().unwrap().port())
    );
    // The host's socket saw nothing.
    host.set_nonblocking(true).unwrap();
    assert_eq!(
        host.recv(&mut buf).unwrap_err().kind(),
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
    let sockets = NetnsSockets::new();
    let home = this_threads_namespace();
    let client_ip = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7));
    let s = sockets
        .dial_socket(&pod, client_ip, dial_opts(Some(client_ip), true))
        .unwrap();
    assert_eq!(s.local_addr().unwrap().ip(), client_ip);
    assert_eq!(this_threads_namespace(), home, "back home after a dial");
    let e = sockets
        .dial_socket(&pod, client_ip, dial_opts(Some(client_ip), false))
        .unwrap_err();
    assert_eq!(this_threads_namespace(), home, "back home after a failure");
    match e {
        NetnsError::Socket { what, source } => {
            assert_eq!(what, "bind the source");
            assert_eq!(source.kind(), std::io::ErrorKind::AddrNotAvailable);
        }
        other => panic!("want a bind error, got {other}"),
    }
    // And the next socket is made in the pod again: the port the host
    // namespace holds (without SO_REUSEPORT) binds there.
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let l = sockets
        .listen(&pod, host.local_addr().unwrap(), listen_opts())
        .unwrap();
    assert_eq!(l.local_addr().unwrap(), host.local_addr().unwrap());
    assert_eq!(this_threads_namespace(), home);
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
        Err(NetnsError::NotANamespace("a device"))
    ));
}

/// istio-cni's rule set installed in a pod's namespace: the app's outbound
/// TCP lands on 15001 with its original destination; a socket with the
/// gateway's mark goes where it dials; the rules and the reply route are
/// there as `iptables-save` and `ip rule` show them, and installing twice
/// (a repeated ADD) is fine.
#[tokio::test]
async fn the_capture_rules_send_the_apps_outbound_tcp_to_15001_but_not_the_gateways() {
    use tidegate_netns::capture::{install, CapturePorts};
    if super::skip() || super::tool_missing("iptables-restore", "--version") {
        return;
    }
    let ns = Ns::new("c");
    // A route out of the pod (a veth whose peer stays in the pod, so
    // nothing answers): the destination needs one.
    run(&format!(
        "ip -n {} link add eth0 type veth peer name peer0",
        ns.0
    ));
    run(&format!("ip -n {} link set peer0 up", ns.0));
    run(&format!("ip -n {} addr add 10.77.0.2/24 dev eth0", ns.0));
    run(&format!("ip -n {} link set eth0 up", ns.0));
    run(&format!("ip -n {} route add default dev eth0", ns.0));
    let path = std::path::PathBuf::from(format!("/var/run/netns/{}", ns.0));
    install(&path, CapturePorts::default()).unwrap();
    install(&path, CapturePorts::default()).unwrap();
    let pod = ns.open();
    let sockets = NetnsSockets::new();
    let any = SocketAddr::from(([0, 0, 0, 0], 15001));
    let outbound = sockets.listen(&pod, any, listen_opts()).unwrap();
    // The app: an unmarked socket dialing somewhere outside.
    let app = sockets
        .dial_socket(
            &pod,
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            DialOpts {
                mark: 0,
                source: None,
                transparent: false,
            },
        )
        .unwrap();
    let elsewhere = SocketAddr::from(([10, 200, 0, 1], 80));
    let (dialed, accepted) = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        tokio::join!(app.connect(elsewhere), outbound.accept())
    })
    .await
    .expect("the app's dial lands on 15001");
    dialed.unwrap();
    let (tcp, _) = accepted.unwrap();
    assert_eq!(
        tidegate::proxy::listener::original_dst(&tcp),
        Some(elsewhere)
    );
    // The gateway's own dial (mark 0x539) is not captured: it goes out
    // eth0, where nothing answers, so it does not reach 15001.
    let gw = sockets
        .dial_socket(
            &pod,
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            dial_opts(None, false),
        )
        .unwrap();
    let r =
        tokio::time::timeout(std::time::Duration::from_millis(300), gw.connect(elsewhere)).await;
    assert!(
        !matches!(r, Ok(Ok(_))),
        "a marked dial must not be redirected"
    );
    let pending =
        tokio::time::timeout(std::time::Duration::from_millis(50), outbound.accept()).await;
    assert!(pending.is_err(), "nothing more reached 15001");
    let save = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.0, "iptables-save", "-t", "nat"])
        .output()
        .unwrap();
    let save = String::from_utf8_lossy(&save.stdout);
    assert!(save.contains("--to-ports 15006"), "{save}");
    assert_eq!(
        save.matches("-A OUTPUT -j ISTIO_OUTPUT").count(),
        1,
        "installed once: {save}"
    );
    let rules = std::process::Command::new("ip")
        .args(["-n", &ns.0, "rule"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&rules.stdout).contains("lookup 100"));
}
