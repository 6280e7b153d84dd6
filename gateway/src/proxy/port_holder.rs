//! Who holds a TCP port, named in the error of a listener that cannot bind
//! ("address in use" alone leaves the operator to find the process).
//!
//! Best effort, from `/proc`: the listening sockets of `/proc/net/tcp` and
//! `tcp6` with the port give socket inodes, and the process with a
//! descriptor on one of them is the holder. A process of another user (or
//! in another network namespace) may not be found: then "another process".

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

/// The holder of a port, as far as `/proc` tells.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holder {
    Process { pid: u32, name: String },
    Unknown,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Holder::Process { pid, name } if *pid == std::process::id() => {
                write!(f, "in use by this process (pid {pid}, {name})")
            }
            Holder::Process { pid, name } => write!(f, "in use by pid {pid} ({name})"),
            Holder::Unknown => f.write_str("in use by another process"),
        }
    }
}

/// Whoever listens on `addr`'s port at `addr`'s IP (or on a wildcard that
/// covers it).
pub fn find(addr: SocketAddr) -> Holder {
    find_in(Path::new("/proc"), addr).unwrap_or(Holder::Unknown)
}

fn find_in(proc: &Path, addr: SocketAddr) -> Option<Holder> {
    let mut inodes = Vec::new();
    for table in ["net/tcp", "net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(proc.join(table)) else {
            continue;
        };
        inodes.extend(
            text.lines()
                .skip(1)
                .filter_map(|l| listening_inode(l, addr)),
        );
    }
    if inodes.is_empty() {
        return None;
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    for entry in std::fs::read_dir(proc).ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| wanted.iter().any(|w| target.as_os_str() == w.as_str()))
        });
        if holds {
            let name = std::fs::read_to_string(entry.path().join("comm"))
                .map(|c| c.trim().to_owned())
                .unwrap_or_else(|_| "?".into());
            return Some(Holder::Process { pid, name });
        }
    }
    None
}

/// The socket inode of one `/proc/net/tcp*` line when it is a listener on
/// `addr`'s port whose address covers `addr`'s (equal, or either one a wildcard).
fn listening_inode(line: &str, addr: SocketAddr) -> Option<u64> {
    const LISTEN: &str = "0A";
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
    if *state != LISTEN {
        return None;
    }
    let (ip, port) = local.split_once(':')?;
    if u16::from_str_radix(port, 16).ok()? != addr.port() {
        return None;
    }
    let ip = parse_ip(ip)?;
    let mapped = match (ip, addr.ip()) {
        (IpAddr::V6(v6), IpAddr::V4(v4)) => v6.to_ipv4_mapped() == Some(v4),
        _ => false,
    };
    let covers = ip == addr.ip() || ip.is_unspecified() || addr.ip().is_unspecified() || mapped;
    covers.then(|| inode.parse().ok())?
}

/// An address as `/proc/net/tcp*` writes it: the bytes of each 32-bit word
/// in host order (little-endian here), in hex.
fn parse_ip(hex: &str) -> Option<IpAddr> {
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(0)?))),
        32 => {
            let mut octets = [0u8; 16];
            for i in 0..4 {
                octets[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(octets)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:3A98 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0\n\
   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 100 0 0 10 0\n\
   2: 0100007F:3A99 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 4444 1 0000000000000000 100 0 0 10 0\n";

    fn inodes(addr: &str) -> Vec<u64> {
        let addr: SocketAddr = addr.parse().unwrap();
        TCP.lines()
            .skip(1)
            .filter_map(|l| listening_inode(l, addr))
            .collect()
    }

    #[test]
    fn listeners_are_matched_by_port_and_covering_address() {
        assert_eq!(inodes("127.0.0.1:15000"), [4242]);
        assert_eq!(inodes("0.0.0.0:15000"), [4242], "a wildcard bind covers it");
        assert_eq!(
            inodes("127.0.0.2:8080"),
            [4343],
            "held by a wildcard listener"
        );
        assert!(inodes("127.0.0.2:15000").is_empty(), "another IP");
        assert!(
            inodes("127.0.0.1:15001").is_empty(),
            "established, not listening"
        );
    }

    #[test]
    fn proc_addresses_parse() {
        assert_eq!(parse_ip("0100007F"), Some(IpAddr::from([127, 0, 0, 1])));
        assert_eq!(
            parse_ip("00000000000000000000000001000000"),
            Some(IpAddr::V6(Ipv6Addr::LOCALHOST))
        );
        assert_eq!(parse_ip("zz"), None);
    }

    #[test]
    fn a_port_this_process_listens_on_is_found() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let holder = find(l.local_addr().unwrap());
        assert_eq!(
            holder.to_string(),
            format!(
                "in use by this process (pid {}, {})",
                std::process::id(),
                std::fs::read_to_string("/proc/self/comm").unwrap().trim()
            )
        );
    }
}
