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
//! through; listeners get `SO_REUSEPORT` (an upgraded gateway binds beside
//! the old one); a dial can take a source address that is not the pod's own
//! (`IP_TRANSPARENT` + `IP_FREEBIND`: inbound delivery with the original
//! client's IP, so the app sees its real peer).

use std::fs::File;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use socket2::{Domain, Protocol, Socket, Type};
use tracing::error;

/// The packet mark istio-cni's rules exempt from capture (1337).
pub const MESH_MARK: u32 = 0x539;

/// A network namespace's identity: the (device, inode) of its nsfs file.
/// The same pod sandbox keeps it; a re-created sandbox gets a new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct NetnsId {
    pub dev: u64,
    pub ino: u64,
}

/// A pod's network namespace, held open by its file descriptor (so it stays
/// valid even after its bind mount is gone).
#[derive(Debug)]
pub struct PodNetns {
    fd: OwnedFd,
    id: NetnsId,
}

impl PodNetns {
    /// Takes a namespace descriptor (from CNI's `CNI_NETNS` path, or
    /// received over a Unix socket); refuses one that is no network namespace.
    pub fn from_fd(fd: OwnedFd) -> Result<PodNetns, NetnsError> {
        let meta = File::from(fd.try_clone().map_err(NetnsError::Open)?)
            .metadata()
            .map_err(NetnsError::Open)?;
        let id = NetnsId {
            dev: meta.dev(),
            ino: meta.ino(),
        };
        // setns with CLONE_NEWNET refuses anything else; check up front so
        // a bad descriptor is refused where it is handed over.
        let fs = nix::sys::statfs::fstatfs(&fd).map_err(|e| NetnsError::Open(e.into()))?;
        if fs.filesystem_type() != NSFS_MAGIC {
            return Err(NetnsError::NotANamespace(kind_of(&meta.file_type())));
        }
        Ok(PodNetns { fd, id })
    }

    /// Opens a namespace by path (`/var/run/netns/<name>`, `/proc/<pid>/ns/net`).
    pub fn open(path: &Path) -> Result<PodNetns, NetnsError> {
        PodNetns::from_fd(open_nonblocking(path).map_err(NetnsError::Open)?)
    }

    pub fn id(&self) -> NetnsId {
        self.id
    }

    /// The descriptor (to hand the namespace over).
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// Moves the calling thread into this namespace (for a thread that
    /// stays there or ends afterwards).
    pub fn enter(&self) -> io::Result<()> {
        setns(&self.fd)
    }
}

/// Opens `path` read-only without ever blocking: a FIFO or a device where
/// a namespace should be (a bad `CNI_NETNS`, a stale pod record) would
/// block a plain open until some writer came; with `O_NONBLOCK` it opens at
/// once and fails the namespace check.
pub fn open_nonblocking(path: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    Ok(file.into())
}

/// The identity of the network namespace of the calling thread (the
/// gateway's own, called from one of its threads).
pub fn current_id() -> io::Result<NetnsId> {
    let meta = std::fs::metadata("/proc/thread-self/ns/net")?;
    Ok(NetnsId {
        dev: meta.dev(),
        ino: meta.ino(),
    })
}

/// What a file that is not a namespace is, for the error.
fn kind_of(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_fifo() {
        "a FIFO"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_file() {
        "a regular file"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "some other kind of file"
    }
}

/// `NSFS_MAGIC` (linux/magic.h): the file system of namespace files.
const NSFS_MAGIC: nix::sys::statfs::FsType = nix::sys::statfs::FsType(0x6e73_6673);

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("cannot open the network namespace: {0}")]
    Open(io::Error),
    #[error("it is {0}, not a network namespace")]
    NotANamespace(&'static str),
    #[error(
        "cannot enter the pod's network namespace: {0} (the gateway needs CAP_SYS_ADMIN for setns)"
    )]
    Enter(io::Error),
    #[error("{what} inside the pod's network namespace: {source}")]
    Socket {
        what: &'static str,
        source: io::Error,
    },
}

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
            setns(&ns.fd).map_err(NetnsError::Enter)?;
            let r = f();
            if let Err(e) = setns(home) {
                error!(error = %e, "cannot return to the gateway's network namespace after making a pod socket; stopping");
                std::process::abort();
            }
            r
        })
    }

    /// A TCP listener on `addr` inside `ns` (`SO_REUSEADDR`, `SO_REUSEPORT`,
    /// the mark, `IP_TRANSPARENT` when asked).
    pub fn listen(
        &self,
        ns: &PodNetns,
        addr: SocketAddr,
        opts: ListenOpts,
    ) -> Result<tokio::net::TcpListener, NetnsError> {
        let socket = self.run(ns, move || {
            let s = new_socket(addr.ip(), opts.mark)?;
            let err = |what| move |source| NetnsError::Socket { what, source };
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
}

fn setns(ns: &impl AsFd) -> io::Result<()> {
    nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).map_err(Into::into)
}

/// A nonblocking TCP socket of `ip`'s family with `SO_MARK`.
fn new_socket(ip: IpAddr, mark: u32) -> Result<Socket, NetnsError> {
    let err = |what| move |source| NetnsError::Socket { what, source };
    let s = Socket::new(
        Domain::for_address(SocketAddr::new(ip, 0)),
        Type::STREAM,
        Some(Protocol::TCP),
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
