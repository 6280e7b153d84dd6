//! Receiving file descriptors (`SCM_RIGHTS`) with a message: how a node
//! agent hands a pod's network namespace over, on the CNI socket
//! (`tidegate-cni`) and on the ZDS socket (istio-cni).

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags};

/// The most descriptors taken from one message; more are a protocol error
/// the callers report (the kernel closes what does not fit: `truncated_fds`).
pub const MAX_FDS: usize = 4;

/// One message: its bytes in the caller's buffer, its descriptors.
#[derive(Debug)]
pub struct Received {
    pub bytes: usize,
    pub fds: Vec<OwnedFd>,
    /// The message was longer than the buffer (datagram sockets).
    pub truncated: bool,
    /// More descriptors than [`MAX_FDS`] came (the rest were closed).
    pub truncated_fds: bool,
}

/// One `recvmsg` on `fd` (non-blocking as the socket is), descriptors
/// received close-on-exec.
pub fn recv_with_fds(fd: impl AsFd, buf: &mut [u8]) -> io::Result<Received> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        fd,
        &mut [io::IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = m {
            fds.extend(got);
        }
    }
    Ok(Received {
        bytes: msg.bytes,
        fds,
        truncated: msg.flags.contains(ReturnFlags::TRUNC),
        truncated_fds: msg.flags.contains(ReturnFlags::CTRUNC),
    })
}
