//! The `oci:` configuration section (disabled by default).
//!
//! ```yaml
//! oci:
//!   enabled: true
//!   region: us-ashburn-1            # endpoint https://iaas.<region>.oraclecloud.com
//!   # endpoint: https://127.0.0.1:8443  # overrides the region's endpoint
//!   ca_file: /etc/ssl/certs/ca-certificates.crt
//!   load_balancers: [ocid1.loadbalancer.oc1..aaaa]
//!   auth: {mode: api-key, tenancy: ocid1.tenancy.., user: ocid1.user.., fingerprint: "aa:bb:..", key_file: /etc/oci/key.pem}
//!   # or: auth: {mode: workload-identity, proxymux_endpoint: "https://10.96.0.1:12250"}
//!   opt_in: [{namespace: shop, selector: {app: web}}]   # besides the Service annotation
//! ```

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use tidegate_base::duration;

/// OCI's own limit: backends per backend set and per load balancer
/// (draining backends count).
pub const OCI_BACKEND_LIMIT: usize = 512;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct OciConfig {
    pub enabled: bool,
    /// The region whose Load Balancing endpoint is used.
    pub region: String,
    /// `https://host[:port]`; default `https://iaas.<region>.oraclecloud.com`.
    pub endpoint: Option<String>,
    /// PEM CA certificates trusted for the endpoint (the system bundle by default).
    pub ca_file: PathBuf,
    /// Load balancer OCIDs whose backends are drained.
    pub load_balancers: Vec<String>,
    pub auth: Option<OciAuth>,
    /// Node addresses (CIDRs, e.g. `10.0.0.0/16`): a backend there is a node
    /// backend (a NodePort behind a node IP, or a host-network pod) that
    /// serves many pods, and is never drained.
    pub node_networks: Vec<Cidr>,
    /// Workloads opted in by configuration, besides `oci_backend_draining`
    /// (the Service annotation `tidegate.io/oci-backend-draining: "true"`).
    pub opt_in: Vec<OptIn>,
    /// A backend set (or a load balancer) holding this many backends is at
    /// capacity: the policy's `at-capacity` choice applies. Below 512 it
    /// keeps slots free for the replacement pods of a rolling update.
    pub capacity_limit: usize,
    /// How often a terminating pod's backends are re-checked (and drain
    /// re-asserted if another controller reset it).
    #[serde(with = "duration")]
    pub reassert_interval: Duration,
    /// Bound on one API call.
    #[serde(with = "duration")]
    pub request_timeout: Duration,
    /// Attempts per backend change (412, 409, 429, 5xx and FAILED work
    /// requests are retried up to this many times in all).
    pub max_attempts: u32,
    #[serde(with = "duration")]
    pub backoff_base: Duration,
    #[serde(with = "duration")]
    pub backoff_max: Duration,
    #[serde(with = "duration")]
    pub work_request_poll: Duration,
    /// A work request not finished within this is given up.
    #[serde(with = "duration")]
    pub work_request_timeout: Duration,
}

impl Default for OciConfig {
    fn default() -> Self {
        OciConfig {
            enabled: false,
            region: String::new(),
            endpoint: None,
            ca_file: "/etc/ssl/certs/ca-certificates.crt".into(),
            load_balancers: Vec::new(),
            auth: None,
            node_networks: Vec::new(),
            opt_in: Vec::new(),
            capacity_limit: OCI_BACKEND_LIMIT,
            reassert_interval: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            max_attempts: 8,
            backoff_base: Duration::from_millis(250),
            backoff_max: Duration::from_secs(10),
            work_request_poll: Duration::from_millis(500),
            work_request_timeout: Duration::from_secs(300),
        }
    }
}

/// How requests are signed.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(tag = "mode", rename_all = "kebab-case", deny_unknown_fields)]
pub enum OciAuth {
    /// A user API key: key id `<tenancy>/<user>/<fingerprint>`.
    ApiKey {
        tenancy: String,
        user: String,
        fingerprint: String,
        key_file: PathBuf,
    },
    /// OKE workload identity: the pod's service-account token is exchanged
    /// for a resource-principal session token (key id `ST$<token>`).
    WorkloadIdentity {
        /// The cluster's proxymux: `https://<KUBERNETES_SERVICE_HOST>:12250`.
        proxymux_endpoint: String,
        #[serde(default = "default_sa_token")]
        token_file: PathBuf,
        /// CA of the proxymux certificate (the service-account CA).
        #[serde(default = "default_sa_ca")]
        ca_file: PathBuf,
    },
}

fn default_sa_token() -> PathBuf {
    "/var/run/secrets/kubernetes.io/serviceaccount/token".into()
}

fn default_sa_ca() -> PathBuf {
    "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt".into()
}

/// Workloads in `namespace` whose labels include all of `selector`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OptIn {
    pub namespace: String,
    #[serde(default)]
    pub selector: BTreeMap<String, String>,
}

impl OciConfig {
    pub fn endpoint(&self) -> String {
        self.endpoint
            .clone()
            .unwrap_or_else(|| format!("https://iaas.{}.oraclecloud.com", self.region))
    }

    /// `(key, message)` of the first problem.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if !self.enabled {
            return Ok(());
        }
        if self.auth.is_none() {
            return Err((
                "oci.auth",
                "required when oci.enabled is true: {mode: api-key, tenancy, user, fingerprint, key_file} or {mode: workload-identity, proxymux_endpoint}".into(),
            ));
        }
        if let Some(OciAuth::ApiKey {
            tenancy,
            user,
            fingerprint,
            ..
        }) = &self.auth
        {
            for (key, v) in [
                ("oci.auth.tenancy", tenancy),
                ("oci.auth.user", user),
                ("oci.auth.fingerprint", fingerprint),
            ] {
                if v.is_empty() {
                    return Err((key, "must not be empty".into()));
                }
            }
        }
        if let Some(OciAuth::WorkloadIdentity {
            proxymux_endpoint, ..
        }) = &self.auth
        {
            if !proxymux_endpoint.starts_with("https://") {
                return Err((
                    "oci.auth.proxymux_endpoint",
                    "must be https://<KUBERNETES_SERVICE_HOST>:12250".into(),
                ));
            }
        }
        if self.load_balancers.is_empty() {
            return Err((
                "oci.load_balancers",
                "name at least one load balancer OCID".into(),
            ));
        }
        if self.endpoint.is_none() && self.region.is_empty() {
            return Err(("oci.region", "set the region (or oci.endpoint)".into()));
        }
        // Numbers (capacity_limit, max_attempts, durations) are checked for
        // every config, enabled or not, in `config/ranges.rs`.
        Ok(())
    }
}

/// An address range, `ip/prefix` (a bare IP is a /32 or /128).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` is in the range; an IPv4-mapped IPv6 address
    /// (`::ffff:10.0.0.1`) is its IPv4 address, never outside an IPv4 range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        let bits = |a: IpAddr| -> (u128, u8) {
            match a {
                IpAddr::V4(v) => (u32::from(v) as u128, 32),
                IpAddr::V6(v) => (u128::from(v), 128),
            }
        };
        let ((net, width), (ip, ip_width)) = (bits(self.addr), bits(ip));
        if width != ip_width {
            return false;
        }
        let host_bits = u32::from(width - self.prefix);
        net.checked_shr(host_bits).unwrap_or(0) == ip.checked_shr(host_bits).unwrap_or(0)
    }
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not an address range like 10.0.0.0/16");
        let (addr, prefix) = s.split_once('/').unwrap_or((s, ""));
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = if prefix.is_empty() {
            max
        } else {
            prefix.parse().map_err(|_| bad())?
        };
        if prefix > max {
            return Err(bad());
        }
        // `::ffff:10.0.0.0/104` is `10.0.0.0/8`.
        if let (IpAddr::V6(v6), 96..) = (addr, prefix) {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return Ok(Cidr {
                    addr: IpAddr::V4(v4),
                    prefix: prefix - 96,
                });
            }
        }
        Ok(Cidr { addr, prefix })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_contain_what_they_should() {
        let c: Cidr = "10.0.0.0/16".parse().unwrap();
        assert!(c.contains("10.0.255.1".parse().unwrap()));
        assert!(!c.contains("10.1.0.1".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        let one: Cidr = "10.0.0.2".parse().unwrap();
        assert!(
            one.contains("10.0.0.2".parse().unwrap()) && !one.contains("10.0.0.3".parse().unwrap())
        );
        assert!("0.0.0.0/0"
            .parse::<Cidr>()
            .unwrap()
            .contains("1.2.3.4".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
    }

    #[test]
    fn ipv6_ranges_hold_ipv6_and_mapped_addresses_are_ipv4() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let pods: Cidr = "fd00:10:244::/56".parse().unwrap();
        assert!(pods.contains(ip("fd00:10:244:0:1::5")));
        assert!(!pods.contains(ip("fd00:10:245::5")));
        assert!(!pods.contains(ip("10.244.0.5")));
        assert!("fd00::/129".parse::<Cidr>().is_err());
        // An IPv4-mapped destination is inside the IPv4 range (never
        // plaintext because it was written the IPv6 way).
        let v4: Cidr = "10.96.0.0/12".parse().unwrap();
        assert!(v4.contains(ip("::ffff:10.96.0.10")));
        let mapped: Cidr = "::ffff:10.96.0.0/108".parse().unwrap();
        assert_eq!(mapped, v4);
        assert_eq!(mapped.to_string(), "10.96.0.0/12");
    }
}
