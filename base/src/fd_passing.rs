//! Receiving file descriptors (`SCM_RIGHTS`) with a message: how a node
//! agent hands a pod's network namespace over, on the CNI socket
//! (`tidegate-cni`) and on the ZDS socket (istio-cni).

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags};

/// The most descriptors taken from one message; more are a protocol error
/// the callers report (`too_many_fds`; the extra ones are closed).
pub const MAX_FDS: usize = 4;

/// One message: its bytes in the caller's buffer, its descriptors.
#[derive(Debug)]
pub struct Received {
    pub bytes: usize,
    pub fds: Vec<OwnedFd>,
    /// The message was longer than the buffer (datagram sockets).
    pub truncated: bool,
    /// More descriptors than [`MAX_FDS`] came (the rest were closed).
    pub too_many_fds: bool,
    /// Descriptors came that the kernel could not install: the process's
    /// descriptor table is full (the open-file limit), and they were closed.
    pub fds_lost: bool,
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
    // The kernel sets MSG_CTRUNC both when more descriptors came than the
    // control buffer holds (it installs as many as fit, at least MAX_FDS:
    // the buffer is rounded up) and when installing one failed (it stops
    // there). Fewer than MAX_FDS with MSG_CTRUNC is the latter: the
    // descriptor table is full, not the sender's doing.
    let ctrunc = msg.flags.contains(ReturnFlags::CTRUNC);
    let too_many_fds = fds.len() > MAX_FDS || (ctrunc && fds.len() == MAX_FDS);
    let fds_lost = ctrunc && fds.len() < MAX_FDS;
    fds.truncate(MAX_FDS);
    Ok(Received {
        bytes: msg.bytes,
        fds,
        truncated: msg.flags.contains(ReturnFlags::TRUNC),
        too_many_fds,
        fds_lost,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::unix::net::UnixDatagram;

    fn send_with(sock: &UnixDatagram, fds: &[File]) {
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(8))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(&borrowed)));
        rustix::net::sendmsg(
            sock,
            &[io::IoSlice::new(b"x")],
            &mut control,
            SendFlags::empty(),
        )
        .unwrap();
    }

    fn null_files(n: usize) -> Vec<File> {
        (0..n).map(|_| File::open("/dev/null").unwrap()).collect()
    }

    #[test]
    fn more_descriptors_than_room_are_too_many() {
        let (a, b) = UnixDatagram::pair().unwrap();
        // One more than taken (the control buffer may hold it), and more
        // than it holds (the kernel cuts them off).
        for n in [MAX_FDS + 1, 8] {
            send_with(&a, &null_files(n));
            let got = recv_with_fds(&b, &mut [0u8; 16]).unwrap();
            assert_eq!(got.fds.len(), MAX_FDS, "{n} sent");
            assert!(got.too_many_fds && !got.fds_lost, "{n} sent: {got:?}");
        }
        send_with(&a, &null_files(1));
        let got = recv_with_fds(&b, &mut [0u8; 16]).unwrap();
        assert_eq!(got.fds.len(), 1);
        assert!(!got.too_many_fds && !got.fds_lost, "{got:?}");
    }

    const CHILD: &str = "TIDEGATE_TEST_FDS_EXHAUSTED";

    /// A descriptor that arrives when the descriptor table is full is
    /// reported lost, not "too many". The open-file limit is the whole
    /// process's, so this runs in a child process of its own (this test
    /// binary again, running only this test).
    #[test]
    fn a_descriptor_arriving_at_the_open_file_limit_is_lost_not_too_many() {
        if std::env::var_os(CHILD).is_some() {
            return at_the_limit();
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "fd_passing::tests::a_descriptor_arriving_at_the_open_file_limit_is_lost_not_too_many",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("child: lost, as it should be"),
            "child: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn at_the_limit() {
        let (a, b) = UnixDatagram::pair().unwrap();
        send_with(&a, &null_files(1));
        // Lower the limit to just above the highest descriptor open, then
        // fill every free slot below it.
        let highest = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
            .max()
            .unwrap();
        let (_, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
        rlimit::setrlimit(rlimit::Resource::NOFILE, highest + 1, hard).unwrap();
        let mut fillers = Vec::new();
        loop {
            match File::open("/dev/null") {
                Ok(f) => fillers.push(f),
                Err(e) => {
                    assert!(crate::descriptors::is_exhaustion(&e), "{e}");
                    break;
                }
            }
        }
        let got = recv_with_fds(&b, &mut [0u8; 16]).unwrap();
        let why = crate::descriptors::why_lost();
        drop(fillers);
        assert!(
            got.fds.is_empty() && got.fds_lost && !got.too_many_fds,
            "{got:?}"
        );
        assert!(why.contains("out of file descriptors"), "{why}");
        println!("child: lost, as it should be ({why})");
    }
}
