//! An address range: an address and a prefix length within its family.

use std::fmt;
use std::net::IpAddr;

/// `10.0.0.0/8`, `2001:db8::/32`, or one address (`/32`, `/128`). Host
/// bits past the prefix are ignored, as in ztunnel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    len: u8,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CidrError {
    #[error("prefix length {len} is longer than {max} bits for {addr}")]
    Length { addr: IpAddr, len: u32, max: u8 },
    #[error("{0:?} is not an address or address/length")]
    Syntax(String),
}

impl Cidr {
    /// A range of IPv4-mapped IPv6 addresses (`::ffff:10.0.0.0/104`) is
    /// the IPv4 range it maps (`10.0.0.0/8`): one host, one range,
    /// whichever way it is written.
    pub fn new(addr: IpAddr, len: u32) -> Result<Cidr, CidrError> {
        let max = max_len(addr);
        match u8::try_from(len) {
            Ok(l) if l <= max => Ok(match addr {
                IpAddr::V6(v6) if l >= 96 => match v6.to_ipv4_mapped() {
                    Some(v4) => Cidr {
                        addr: IpAddr::V4(v4),
                        len: l - 96,
                    },
                    None => Cidr { addr, len: l },
                },
                _ => Cidr { addr, len: l },
            }),
            _ => Err(CidrError::Length { addr, len, max }),
        }
    }

    /// The address alone: a range of one.
    pub fn host(addr: IpAddr) -> Cidr {
        let addr = addr.to_canonical();
        Cidr {
            addr,
            len: max_len(addr),
        }
    }

    /// Whether `ip` is in the range; an address of the other family never
    /// is. An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`, what a
    /// dual-stack socket reports for an IPv4 peer) is its IPv4 address, so
    /// writing an address one way or the other never gets around a rule.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                prefix_eq(u32::from(net).into(), u32::from(ip).into(), self.len, 32)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(u128::from(net), u128::from(ip), self.len, 128)
            }
            _ => false,
        }
    }
}

fn max_len(addr: IpAddr) -> u8 {
    if addr.is_ipv4() {
        32
    } else {
        128
    }
}

/// Whether the first `len` of `bits` bits of `a` and `b` are equal.
fn prefix_eq(a: u128, b: u128, len: u8, bits: u8) -> bool {
    if len == 0 {
        return true;
    }
    let shift = u32::from(bits - len);
    (a >> shift) == (b >> shift)
}

impl std::str::FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Cidr, CidrError> {
        let bad = || CidrError::Syntax(s.to_owned());
        match s.split_once('/') {
            None => Ok(Cidr::host(s.parse().map_err(|_| bad())?)),
            Some((addr, len)) => Cidr::new(
                addr.parse().map_err(|_| bad())?,
                len.parse().map_err(|_| bad())?,
            ),
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl serde::Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Cidr, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn a_range_holds_the_addresses_under_its_prefix_and_no_other_family() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(c("10.0.0.0/8").contains(ip("10.255.1.2")));
        assert!(!c("10.0.0.0/8").contains(ip("11.0.0.1")));
        assert!(
            c("10.1.2.3/8").contains(ip("10.9.9.9")),
            "host bits ignored"
        );
        assert!(c("0.0.0.0/0").contains(ip("192.0.2.1")));
        assert!(
            !c("0.0.0.0/0").contains(ip("::1")),
            "v6 is not in a v4 range"
        );
        assert!(c("10.0.0.1").contains(ip("10.0.0.1")));
        assert!(!c("10.0.0.1").contains(ip("10.0.0.2")));
        assert!(c("2001:db8::/32").contains(ip("2001:db8:1::5")));
        assert!(!c("2001:db8::/32").contains(ip("2001:db9::5")));
        assert!(c("::/0").contains(ip("::1")));
        // An IPv4-mapped address is the IPv4 address, as a range or as an
        // address looked up.
        assert!(c("::ffff:10.0.0.1/128").contains(ip("10.0.0.1")));
        assert!(c("10.0.0.0/8").contains(ip("::ffff:10.0.0.1")));
        assert!(!c("10.0.0.0/8").contains(ip("::ffff:11.0.0.1")));
        assert!(c("::ffff:10.0.0.0/104").contains(ip("10.9.9.9")));
        assert_eq!(c("::ffff:10.0.0.0/104").to_string(), "10.0.0.0/8");
        assert_eq!(c("::ffff:10.0.0.1"), c("10.0.0.1"));
        // Not an IPv4 range: the mapped prefix is cut by the length.
        assert!(!c("::ffff:0:0/95").contains(ip("10.0.0.1")));
        assert!(!c("::/0").contains(ip("::ffff:10.0.0.1")));
    }

    #[test]
    fn a_length_past_the_family_or_bad_syntax_is_refused() {
        assert_eq!(
            "10.0.0.0/33".parse::<Cidr>().unwrap_err().to_string(),
            "prefix length 33 is longer than 32 bits for 10.0.0.0"
        );
        assert!("::/129".parse::<Cidr>().is_err());
        assert!("10.0.0/8".parse::<Cidr>().is_err());
        assert!("10.0.0.0/x".parse::<Cidr>().is_err());
        assert_eq!(c("10.0.0.0/8").to_string(), "10.0.0.0/8");
    }
}
