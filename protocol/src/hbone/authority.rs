//! The CONNECT authority of an HBONE stream: `ip:port`, an IPv6 address in
//! brackets (`[fd00::2]:8080`), read and written as ztunnel does.
//!
//! Written canonical: an IPv4-mapped IPv6 address (`::ffff:10.0.0.1`, what a
//! dual-stack socket reports for an IPv4 peer) as its IPv4 address, never a
//! zone id or flow label. Read strictly: a zone id (`[fe80::1%eth0]`) names
//! an interface of the sender, meaningless to the peer; an IPv4-mapped
//! address is another spelling of an IPv4 one, so a peer writing it could
//! pass a check made on one spelling and be served on the other. Both are
//! refused with their own reason, as is anything that is not `ip:port`.

use std::net::{IpAddr, SocketAddr};

/// Why an authority is not an HBONE target.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthorityError {
    #[error("authority {0:?} is not ip:port (an IPv6 address in brackets: [fd00::2]:8080)")]
    Malformed(String),
    #[error("authority {0:?} has an IPv6 zone id; a zone names one of the sender's interfaces, not an address of this node")]
    ZoneId(String),
    #[error("authority {0:?} is an IPv4-mapped IPv6 address; write the IPv4 address")]
    V4Mapped(String),
}

impl AuthorityError {
    /// The bounded reason, for metrics and the refusal header.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthorityError::Malformed(_) => "bad_authority",
            AuthorityError::ZoneId(_) => "authority_zone_id",
            AuthorityError::V4Mapped(_) => "authority_v4_mapped",
        }
    }
}

/// The target of a CONNECT authority (see the module documentation).
pub fn parse(authority: &str) -> Result<SocketAddr, AuthorityError> {
    // Raw or percent-encoded (RFC 6874: `%25`), a zone follows a `%`.
    if authority.starts_with('[') && authority.contains('%') {
        return Err(AuthorityError::ZoneId(authority.to_owned()));
    }
    let addr: SocketAddr = authority
        .parse()
        .map_err(|_| AuthorityError::Malformed(authority.to_owned()))?;
    match addr {
        SocketAddr::V4(_) => Ok(addr),
        SocketAddr::V6(v6) => {
            if v6.scope_id() != 0 {
                return Err(AuthorityError::ZoneId(authority.to_owned()));
            }
            if v6.ip().to_ipv4_mapped().is_some() {
                return Err(AuthorityError::V4Mapped(authority.to_owned()));
            }
            // No flow label: the parsed form has none to carry.
            Ok(SocketAddr::new(IpAddr::V6(*v6.ip()), v6.port()))
        }
    }
}

/// The authority naming `addr`: `10.0.0.1:8080`, `[fd00::2]:8080`
/// (canonical: see the module documentation).
pub fn write(addr: SocketAddr) -> String {
    canonical(addr).to_string()
}

/// `addr` with an IPv4-mapped IPv6 address as its IPv4 address, and
/// without zone id or flow label.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_and_bracketed_ipv6_are_read_as_written() {
        for text in ["10.0.0.1:8080", "[fd00::2]:8080", "[::1]:15008"] {
            let addr = parse(text).unwrap();
            assert_eq!(write(addr), text);
        }
        assert_eq!(
            parse("[FD00:0::2]:80").unwrap(),
            "[fd00::2]:80".parse::<SocketAddr>().unwrap()
        );
    }

    #[test]
    fn a_mapped_or_zoned_address_is_written_canonical() {
        let mapped: SocketAddr = "[::ffff:10.0.0.1]:8080".parse().unwrap();
        assert_eq!(write(mapped), "10.0.0.1:8080");
        let zoned = SocketAddr::V6(std::net::SocketAddrV6::new(
            "fe80::1".parse().unwrap(),
            80,
            7,
            3,
        ));
        assert_eq!(write(zoned), "[fe80::1]:80");
    }

    #[test]
    fn malformed_forms_are_refused_as_malformed() {
        for text in [
            "fd00::2:8080",
            "[fd00::2:8080",
            "fd00::2]:8080",
            "[fd00::2]",
            "[fd00::2]:",
            "[fd00::2]:65536",
            "[10.0.0.1]:80",
            "[[fd00::2]]:80",
            "[fd00::2] :80",
            "[]:80",
            "[fd00::g]:80",
            "web.shop.svc:80",
            "",
        ] {
            let err = parse(text).unwrap_err();
            assert_eq!(err, AuthorityError::Malformed(text.into()), "{text}");
            assert_eq!(err.reason(), "bad_authority");
        }
    }

    #[test]
    fn a_zone_id_is_refused_with_its_reason() {
        for text in ["[fe80::1%eth0]:80", "[fe80::1%25eth0]:80", "[fe80::1%4]:80"] {
            let err = parse(text).unwrap_err();
            assert_eq!(err, AuthorityError::ZoneId(text.into()), "{text}");
            assert_eq!(err.reason(), "authority_zone_id");
            assert!(err.to_string().contains("zone id"), "{err}");
        }
    }

    #[test]
    fn an_ipv4_mapped_address_is_refused_with_its_reason() {
        for text in ["[::ffff:10.0.0.1]:8080", "[::ffff:a00:1]:15008"] {
            let err = parse(text).unwrap_err();
            assert_eq!(err, AuthorityError::V4Mapped(text.into()), "{text}");
            assert_eq!(err.reason(), "authority_v4_mapped");
        }
    }
}
