//! How the gateway's descriptors are split, decided once at start from the
//! open-file limit and the configuration, logged (`descriptor budget`) and
//! shown in `/config_dump` (`descriptors`).
//!
//! The control plane takes its budget first (`control/src/limits.rs`, at
//! most half the limit); what it leaves is the data path's, `D`. Of `D`:
//!
//! 1. **The pods' share** (in-pod mode): what the pods can make the gateway
//!    hold, sized from the configuration, at most `D / 2`:
//!    - each served pod's descriptors, [`per_pod`] (its namespace, 15001,
//!      15006, 15008, and the DNS proxy's 15053 UDP and TCP on 127.0.0.1
//!      and ::1: eight; four with `dns.enabled: false`), times
//!      `capture.max_pods`;
//!    - the DNS proxy's passing descriptors: a socket per forwarded query
//!      in flight (`dns.max_in_flight`) and the pods' TCP connections to
//!      15053 (`dns.max_tcp_connections`, all pods together).
//!
//!    When both do not fit in `D / 2`, the DNS part keeps at least a
//!    quarter of it (its two bounds lowered in proportion) and the pods
//!    get the rest: fewer than `capture.max_pods` are served (warned at
//!    start; `tidegate_inpod_max_pods`; a pod past it is refused,
//!    `descriptor_share`).
//! 2. **The inbound caps** (`proxy/inbound/limits.rs`): three quarters of
//!    what the pods' share leaves — `hbone.max_connections` when 0, and
//!    the most a configured value is given.
//! 3. **The outbound side and the files**: the last quarter of it.
//!
//! Each bound is enforced where its descriptors are made (the pods'
//! admission, the DNS proxy's semaphores, the inbound caps), so no pod can
//! take a descriptor the inbound caps count on, nor an inbound peer one the
//! pods' share holds. At this machine's 20,000 (the control plane's 416
//! with the CNI socket): 1,000 pods hold 8,000, the DNS proxy 768, the
//! inbound caps 8,112 and the outbound side and files 2,704. In node mode
//! the pods' share is 0: the inbound caps take three quarters of `D`.

use serde::Serialize;
use tracing::{info, warn};

use crate::config::{CaptureMode, Config};

/// The capture listeners of a pod: 15001, 15006, 15008.
pub const CAPTURE_LISTENERS: u64 = 3;

/// The DNS proxy's listeners of a pod: 15053 UDP and TCP on 127.0.0.1 and
/// on ::1 (a pod without IPv6 takes two fewer).
pub const DNS_LISTENERS: u64 = 4;

/// Descriptors a pod's listeners take (15001, 15006, 15008, and 15053 UDP
/// and TCP on both loopback addresses) with the DNS proxy on, the default;
/// its namespace descriptor is open already when it is checked.
pub const LISTENERS_PER_POD: u64 = CAPTURE_LISTENERS + DNS_LISTENERS;

/// Descriptors a served pod holds with the DNS proxy on: its namespace and
/// its listeners.
pub const DESCRIPTORS_PER_POD: u64 = LISTENERS_PER_POD + 1;

/// The listeners of a pod, with the DNS proxy (`dns.enabled`) or without.
pub fn listeners_per_pod(dns: bool) -> u64 {
    if dns {
        LISTENERS_PER_POD
    } else {
        CAPTURE_LISTENERS
    }
}

/// What the pods ask of the budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodWants {
    /// `capture.max_pods` (0 in node mode).
    pub max_pods: u64,
    /// Descriptors a served pod holds ([`per_pod`]).
    pub per_pod: u64,
    /// `dns.max_in_flight` (0 without the DNS proxy).
    pub dns_forwards: u64,
    /// `dns.max_tcp_connections` (0 without the DNS proxy).
    pub dns_tcp: u64,
}

impl PodWants {
    /// What `config` asks: nothing in node mode.
    pub fn of(config: &Config) -> PodWants {
        if config.capture.mode != CaptureMode::Inpod {
            return PodWants::default();
        }
        let dns = config.dns.enabled;
        PodWants {
            max_pods: config.capture.max_pods.into(),
            per_pod: per_pod(dns),
            dns_forwards: if dns {
                config.dns.max_in_flight.into()
            } else {
                0
            },
            dns_tcp: if dns {
                config.dns.max_tcp_connections.into()
            } else {
                0
            },
        }
    }
}

/// Descriptors a served pod holds: its namespace and its listeners.
pub fn per_pod(dns: bool) -> u64 {
    listeners_per_pod(dns) + 1
}

/// The split of the data path's descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DescriptorBudget {
    /// The open-file limit in force.
    pub limit: u64,
    /// The control plane's budget.
    pub control_plane: u64,
    /// What the control plane leaves: `D`.
    pub data_path: u64,
    /// Descriptors a served pod holds (0 in node mode).
    pub per_pod: u64,
    /// The most pods served: `capture.max_pods`, or fewer when `D / 2`
    /// does not hold them.
    pub max_pods: u64,
    /// Their descriptors: `max_pods × per_pod`.
    pub pods: u64,
    /// Forwarded DNS queries in flight, all pods (one socket each).
    pub dns_forwards: u64,
    /// DNS TCP connections to 15053, all pods.
    pub dns_tcp: u64,
    /// The inbound caps' share: the most `hbone.max_connections` is.
    pub inbound: u64,
    /// The outbound side and the files.
    pub outbound_and_files: u64,
}

/// Three quarters of `n`, without overflow.
fn three_quarters(n: u64) -> u64 {
    n / 4 * 3 + n % 4 * 3 / 4
}

/// `n × part / whole`, rounded down (`whole` > 0).
fn prorate(n: u64, part: u64, whole: u64) -> u64 {
    u64::try_from(u128::from(n) * u128::from(part) / u128::from(whole)).unwrap_or(u64::MAX)
}

impl DescriptorBudget {
    /// The split of `data_path` descriptors (the control plane holds
    /// `control_plane` more).
    pub fn derive(data_path: u64, control_plane: u64, wants: PodWants) -> DescriptorBudget {
        let d = data_path;
        let cap = d / 2;
        let listeners_wanted = wants.max_pods.saturating_mul(wants.per_pod);
        let dns_wanted = wants.dns_forwards.saturating_add(wants.dns_tcp);
        // The DNS part: all it asks when that fits beside the pods, else
        // what the pods leave of `cap`, and at least a quarter of it.
        let dns = dns_wanted.min((cap / 4).max(cap.saturating_sub(listeners_wanted)));
        let (mut dns_forwards, mut dns_tcp) = (wants.dns_forwards, wants.dns_tcp);
        if dns < dns_wanted {
            dns_forwards = prorate(dns, wants.dns_forwards, dns_wanted);
            dns_tcp = dns - dns_forwards;
            // Each bound keeps one place while the part has two.
            if dns_tcp == 0 && dns_forwards > 1 && wants.dns_tcp > 0 {
                (dns_forwards, dns_tcp) = (dns_forwards - 1, 1);
            }
            if dns_forwards == 0 && dns_tcp > 1 && wants.dns_forwards > 0 {
                (dns_forwards, dns_tcp) = (1, dns_tcp - 1);
            }
        }
        let max_pods = match wants.per_pod {
            0 => 0,
            per_pod => (cap - dns).min(listeners_wanted) / per_pod,
        };
        let pods = max_pods * wants.per_pod;
        let rest = d - pods - dns_forwards - dns_tcp;
        let inbound = three_quarters(rest);
        DescriptorBudget {
            limit: d.saturating_add(control_plane),
            control_plane,
            data_path: d,
            per_pod: wants.per_pod,
            max_pods,
            pods,
            dns_forwards,
            dns_tcp,
            inbound,
            outbound_and_files: rest - inbound,
        }
    }

    /// The pods' share: their listeners and the DNS proxy's passing descriptors.
    pub fn pods_share(&self) -> u64 {
        self.pods + self.dns_forwards + self.dns_tcp
    }

    /// Logs the split; warns when the configuration asks more than it holds.
    pub fn log(&self, wants: PodWants) {
        info!(
            limit = self.limit,
            control_plane = self.control_plane,
            data_path = self.data_path,
            pods = self.max_pods,
            per_pod = self.per_pod,
            pods_descriptors = self.pods,
            dns_forwards = self.dns_forwards,
            dns_tcp = self.dns_tcp,
            inbound = self.inbound,
            outbound_and_files = self.outbound_and_files,
            "descriptor budget: the control plane's, then the pods' share (pods × per_pod + \
             DNS forwards + DNS TCP connections, at most half the data path's), three quarters \
             of the rest for the inbound caps, the last quarter for the outbound side and the files"
        );
        if self.max_pods < wants.max_pods
            || self.dns_forwards < wants.dns_forwards
            || self.dns_tcp < wants.dns_tcp
        {
            warn!(
                limit = self.limit,
                max_pods = wants.max_pods,
                served_at_most = self.max_pods,
                dns_max_in_flight = wants.dns_forwards,
                dns_forwards = self.dns_forwards,
                dns_max_tcp_connections = wants.dns_tcp,
                dns_tcp = self.dns_tcp,
                "capture.max_pods and the DNS proxy's bounds ask more descriptors than half of \
                 what the control plane leaves; fewer are served; raise the open-file limit \
                 (LimitNOFILE) to serve them all"
            );
        }
    }
}

#[cfg(test)]
mod tests;
