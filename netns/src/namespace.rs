//! A pod's network namespace: opened by path or taken as a descriptor,
//! checked to be one (`nsfs`), known by its identity (device, inode), and
//! entered by a thread. The gateway makes its pod sockets inside one
//! (`gateway/src/netns.rs`); `tidegate-cni` opens `CNI_NETNS` to hand it to
//! the gateway, and the capture rules are installed inside it
//! ([`crate::capture`]).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

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

/// Moves the calling thread into the network namespace `ns` (a descriptor
/// of one: a [`PodNetns`]'s, or a thread's own to come back to).
pub fn setns(ns: &impl AsFd) -> io::Result<()> {
    nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).map_err(Into::into)
}
