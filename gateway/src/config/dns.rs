//! The `dns:` section: the DNS proxy each captured pod gets on 15053
//! (in-pod mode only; see [`crate::dns`]).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use tidegate_base::duration;

/// The port istio-cni redirects a captured pod's DNS to (its `DNSCapturePort`).
pub const DNS_CAPTURE_PORT: u16 = 15053;

/// `dns`: the per-pod DNS proxy.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DnsConfig {
    /// UDP and TCP listeners on 15053 inside each captured pod. On by
    /// default: istio-cni (1.25 and later) redirects every enrolled pod's
    /// port 53 there, and a pod with nothing on 15053 has no DNS.
    pub enabled: bool,
    /// Where names the workload store does not answer go: `ip` or
    /// `ip:port` (53 when no port). Empty: the `nameserver` lines of
    /// `resolv_conf`, read at start.
    pub upstream: Vec<Upstream>,
    /// Read for the upstream servers when `upstream` is empty.
    pub resolv_conf: PathBuf,
    /// How long a forwarded query waits for the upstream servers (all of
    /// them, tried in order); past it the pod gets SERVFAIL.
    #[serde(with = "duration")]
    pub timeout: Duration,
    /// Forwarded queries in flight at once, all pods together (each holds
    /// one socket); past it a query is answered REFUSED.
    pub max_in_flight: u32,
    /// Forwarded queries in flight at once from one pod; past it REFUSED.
    pub max_in_flight_per_pod: u32,
    /// TCP connections to 15053 open at once, all pods together (each
    /// holds a descriptor, counted in the pods' share: see
    /// `descriptor_budget.rs`); one past it is closed at accept.
    pub max_tcp_connections: u32,
    /// The most TCP connections one pod keeps open to 15053; one past it
    /// is closed at accept.
    pub max_tcp_connections_per_pod: u32,
    /// The cluster's DNS domain: Services are `<name>.<namespace>.svc.<cluster_domain>`.
    pub cluster_domain: String,
    /// `dns.cache`: forwarded answers kept for their TTL, per pod.
    pub cache: DnsCacheConfig,
}

/// `dns.cache`: each pod's cache of forwarded answers ([`crate::dns::cache`]).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DnsCacheConfig {
    /// Answers one pod's cache holds (the least recently used goes first
    /// past it); `0` turns the cache off.
    pub max_entries: u32,
    /// The longest an answer is kept, whatever its TTL says.
    #[serde(with = "duration")]
    pub max_ttl: Duration,
}

impl Default for DnsCacheConfig {
    fn default() -> Self {
        DnsCacheConfig {
            max_entries: 256,
            max_ttl: Duration::from_secs(3600),
        }
    }
}

impl Default for DnsConfig {
    fn default() -> Self {
        DnsConfig {
            enabled: true,
            upstream: Vec::new(),
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            timeout: Duration::from_secs(5),
            max_in_flight: 512,
            max_in_flight_per_pod: 64,
            max_tcp_connections: 256,
            max_tcp_connections_per_pod: 16,
            cluster_domain: "cluster.local".into(),
            cache: DnsCacheConfig::default(),
        }
    }
}

/// An upstream DNS server: `10.96.0.10`, `10.96.0.10:53`, `fd00::a` or `[fd00::a]:53`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Upstream(pub SocketAddr);

impl FromStr for Upstream {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(Upstream(SocketAddr::new(ip, 53)));
        }
        s.parse::<SocketAddr>().map(Upstream).map_err(|_| {
            format!("{s:?} is not an upstream DNS server like 10.96.0.10, 10.96.0.10:53 or [fd00::a]:53")
        })
    }
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<'de> Deserialize<'de> for Upstream {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl Serialize for Upstream {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Whether each upstream is a server the proxy can forward to: not port
/// 0, not an unspecified address, and not the proxy itself (a loopback
/// address on [`DNS_CAPTURE_PORT`]: every forwarded query would come back).
pub(super) fn check_upstreams(upstreams: &[Upstream]) -> Result<(), String> {
    for Upstream(addr) in upstreams {
        if addr.port() == 0 {
            return Err(format!("{addr}: port 0 is no DNS server"));
        }
        if addr.ip().is_unspecified() {
            return Err(format!("{addr}: an unspecified address is no DNS server"));
        }
        // `::ffff:127.0.0.1` reaches 127.0.0.1 from a dual-stack socket.
        if addr.ip().to_canonical().is_loopback() && addr.port() == DNS_CAPTURE_PORT {
            return Err(format!(
                "{addr} is the DNS proxy itself: every forwarded query would come back to it"
            ));
        }
    }
    Ok(())
}

/// Whether `domain` is a DNS name the proxy can serve below (letters,
/// digits, `-`, dots between labels).
pub(super) fn check_cluster_domain(domain: &str) -> Result<(), String> {
    let ok = !domain.is_empty()
        && domain.len() <= 200
        && domain.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{domain:?} is not a DNS domain like cluster.local (labels of letters, digits and '-', no trailing dot)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_take_an_address_with_or_without_a_port() {
        assert_eq!(
            "10.96.0.10".parse::<Upstream>().unwrap().0,
            "10.96.0.10:53".parse().unwrap()
        );
        assert_eq!(
            "[fd00::a]:5353".parse::<Upstream>().unwrap().0,
            "[fd00::a]:5353".parse().unwrap()
        );
        assert_eq!(
            "fd00::a".parse::<Upstream>().unwrap().0.port(),
            53,
            "a bare IPv6 address"
        );
        let e = "kube-dns".parse::<Upstream>().unwrap_err();
        assert!(e.contains("10.96.0.10:53"), "{e}");
    }

    #[test]
    fn an_upstream_that_cannot_answer_or_is_the_proxy_itself_is_refused() {
        let check = |list: &[&str]| {
            let parsed: Vec<Upstream> = list.iter().map(|s| s.parse().unwrap()).collect();
            check_upstreams(&parsed)
        };
        check(&["10.96.0.10", "[fd00::a]:5353", "127.0.0.53"]).unwrap();
        for (bad, says) in [
            ("1.2.3.4:0", "port 0"),
            ("0.0.0.0", "unspecified"),
            ("[::]:53", "unspecified"),
            ("127.0.0.1:15053", "the DNS proxy itself"),
            ("[::1]:15053", "the DNS proxy itself"),
            ("[::ffff:127.0.0.1]:15053", "the DNS proxy itself"),
        ] {
            let e = check(&["10.96.0.10", bad]).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn the_cluster_domain_is_a_plain_dns_name() {
        check_cluster_domain("cluster.local").unwrap();
        check_cluster_domain("corp-1.example").unwrap();
        for bad in [
            "",
            "cluster.local.",
            ".local",
            "a..b",
            "c_d.local",
            "é.local",
        ] {
            assert!(check_cluster_domain(bad).is_err(), "{bad:?}");
        }
    }
}
