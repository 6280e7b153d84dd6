//! What every part of the DNS proxy shares about the wire: the header's
//! length, the EDNS payload the proxy announces, and the two transports.

/// The EDNS payload size the proxy announces (the DNS Flag Day 2020 size:
/// no IP fragmentation on common paths).
pub const EDNS_PAYLOAD: u16 = 1232;

/// The length of a DNS header.
pub const HEADER_LEN: usize = 12;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

impl Transport {
    pub fn label(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        }
    }
}
