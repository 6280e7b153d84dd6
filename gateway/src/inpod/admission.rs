//! Which pods the gateway takes, checked before a new pod's listeners open
//! (a pod already served in the same namespace is never checked again: a
//! re-add after a ZDS reconnect, a repeated ADD, is accepted as it is):
//!
//! 1. The gateway's own network namespace is never a pod: its listeners
//!    there would capture the node's own traffic.
//! 2. One network namespace is one pod. A second uid handed a namespace
//!    another served pod has — same (device, inode), see
//!    [`crate::netns::NetnsId`] — is refused, naming that pod: two sets of
//!    listeners on one namespace both bind (`SO_REUSEPORT`) and the kernel
//!    splits the pod's connections between them. The same uid in another
//!    namespace is a re-created sandbox and replaces its old one, as ztunnel
//!    does. The gateway holds each served namespace open, so its inode
//!    cannot go to another namespace while the pod is served; a pod removed
//!    frees its namespace.
//! 3. At most `capture.max_pods` pods (a re-created sandbox takes its old
//!    one's place).
//! 4. **The pods' descriptor share.** A served pod holds
//!    [`DESCRIPTORS_PER_POD`] descriptors: its namespace, its three capture
//!    listeners and the DNS proxy's four on 15053 (UDP, TCP; 127.0.0.1
//!    and ::1); four with `dns.enabled: false` ([`listeners_per_pod`]). The DNS proxy's
//!    passing descriptors — a socket per forwarded query in flight (at most
//!    `dns.max_in_flight` for the gateway) and the TCP connections pods
//!    open to 15053 (at most `dns.max_in_flight_per_pod` each, closed after
//!    `dns.timeout` idle) — are not a pod's share: they come out of the
//!    half left to the outbound side and the files, like outbound dials.
//!    Of the descriptors the control plane leaves to the data path (`D`,
//!    see `control/src/limits.rs`), the derived inbound caps take three quarters
//!    (`proxy/inbound/limits.rs`); of the last quarter, half is the pods'
//!    (`D / 8`, so at most `D / 32` pods) and half stays with the outbound
//!    side and the files. Each bounded by its own share, the pods cannot
//!    take a descriptor the inbound caps may claim, nor the inbound side
//!    one a pod holds.
//! 5. **A backstop, on the kernel's count**: a pod is refused when the free
//!    descriptors (the open-file limit less those open now) would not cover
//!    its listeners and what the inbound caps may still claim (their cap,
//!    at most `3 D / 4`, less the inbound connections open). Inbound load
//!    never refuses a pod this way (an open connection leaves the free
//!    count and the claim alike); something past its share (a limit
//!    lowered at run time, the outbound side) does.
//!
//! Each refusal is its pod's add error (the ZDS NACK text, the CNI ADD
//! error) and counted by reason in `tidegate_inpod_refusals_total`.

use std::sync::Arc;

use crate::descriptors::Usage;
use crate::netns::NetnsId;
use crate::proxy::inbound::limits::{inbound_share, ConnectionLimits};

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

/// The pods' share of the data path's descriptors `data_path`: an eighth.
pub fn pods_share(data_path: u64) -> u64 {
    data_path / 8
}

/// The pod that already has a namespace.
#[derive(Clone, Debug)]
pub struct Owner {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("its network namespace (inode {}) is the gateway's own: the gateway's own network namespace is never a pod", id.ino)]
    GatewayNetns { id: NetnsId },
    #[error("its network namespace (inode {}) is already pod {}'s ({}/{}): one network namespace is one pod", id.ino, owner.uid, owner.namespace, owner.name)]
    NetnsTaken { id: NetnsId, owner: Owner },
    #[error("pod limit reached ({served} pods on this node; capture.max_pods is {max})")]
    PodLimit { served: usize, max: usize },
    #[error("the pods' descriptor share is used up: {served} pods hold {} of the {} descriptors kept for pods (an eighth of the {data_path} the control plane leaves to the data path; the inbound caps take three quarters); raise the gateway's open-file limit (LimitNOFILE, ulimit -n)", *served as u64 * (listeners + 1), pods_share(*data_path))]
    DescriptorShare {
        served: usize,
        data_path: u64,
        /// A pod's listeners.
        listeners: u64,
    },
    #[error("out of file descriptors ({usage}): its listeners need {listeners} and the inbound connection caps may still claim {inbound}; raise the gateway's open-file limit (LimitNOFILE, ulimit -n) or lower capture.max_pods")]
    Descriptors {
        usage: Usage,
        inbound: u64,
        listeners: u64,
    },
}

impl Refusal {
    /// A bounded metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::GatewayNetns { .. } => "gateway_netns",
            Refusal::NetnsTaken { .. } => "netns_taken",
            Refusal::PodLimit { .. } => "pod_limit",
            Refusal::DescriptorShare { .. } => "descriptor_share",
            Refusal::Descriptors { .. } => "descriptors",
        }
    }
}

/// The inbound connections' claim on descriptors: their cap (at most the
/// inbound share of the data path's descriptors) less those open now.
#[derive(Clone, Debug)]
pub struct InboundClaim {
    pub limits: Arc<ConnectionLimits>,
    /// The cap counted: `hbone.max_connections` or its derived value, at
    /// most [`inbound_share`] of the data path's descriptors.
    pub cap: u64,
}

impl InboundClaim {
    pub fn new(limits: Arc<ConnectionLimits>, data_path: Option<u64>) -> InboundClaim {
        let cap = limits.caps().connections as u64;
        let cap = data_path.map_or(cap, |d| cap.min(inbound_share(d)));
        InboundClaim { limits, cap }
    }

    /// Descriptors the inbound connections may still take.
    pub fn left(&self) -> u64 {
        self.cap
            .saturating_sub(self.limits.open_connections() as u64)
    }
}

/// What a new pod is checked against.
#[derive(Clone, Debug)]
pub struct Admission {
    /// The gateway's own namespace (`None` when it could not be read).
    pub own_netns: Option<NetnsId>,
    /// A pod's listeners ([`listeners_per_pod`]).
    pub listeners: u64,
    /// `capture.max_pods`.
    pub max_pods: usize,
    /// The descriptors the control plane leaves to the data path (`None`:
    /// the open-file limit is unknown, and only `max_pods` bounds the pods).
    pub data_path: Option<u64>,
    /// For the backstop (`None`: no inbound claim is counted).
    pub inbound: Option<InboundClaim>,
}

/// A pod about to be served, and what is served already.
#[derive(Debug)]
pub struct Candidate<'a> {
    pub netns: NetnsId,
    /// The served pod of another uid in the same namespace, if any.
    pub owner: Option<&'a Owner>,
    /// Pods served now.
    pub served: usize,
    /// It replaces its own uid's old namespace (the count does not grow).
    pub replacing: bool,
}

impl Admission {
    /// The most pods the descriptor share holds (`None`: unbounded).
    pub fn share_pods(&self) -> Option<usize> {
        let per_pod = self.listeners + 1;
        self.data_path
            .map(|d| usize::try_from(pods_share(d) / per_pod).unwrap_or(usize::MAX))
    }

    /// The most pods served at once: `capture.max_pods`, or less when the
    /// descriptor share holds fewer.
    pub fn effective_max(&self) -> usize {
        self.share_pods()
            .map_or(self.max_pods, |s| s.min(self.max_pods))
    }

    /// Checks `pod` with the descriptors in use now (when they cannot be
    /// counted the backstop is skipped: a pod is never refused on a guess).
    pub fn check(&self, pod: &Candidate<'_>) -> Result<(), Refusal> {
        let inbound = self.inbound.as_ref().map_or(0, InboundClaim::left);
        self.check_with(pod, Usage::now().ok(), inbound)
    }

    /// [`Admission::check`] against `usage`, with `inbound` descriptors
    /// still claimed by the inbound caps.
    pub fn check_with(
        &self,
        pod: &Candidate<'_>,
        usage: Option<Usage>,
        inbound: u64,
    ) -> Result<(), Refusal> {
        if self.own_netns == Some(pod.netns) {
            return Err(Refusal::GatewayNetns { id: pod.netns });
        }
        if let Some(owner) = pod.owner {
            return Err(Refusal::NetnsTaken {
                id: pod.netns,
                owner: owner.clone(),
            });
        }
        if !pod.replacing && pod.served >= self.max_pods {
            return Err(Refusal::PodLimit {
                served: pod.served,
                max: self.max_pods,
            });
        }
        if let (Some(data_path), Some(share)) = (self.data_path, self.share_pods()) {
            if !pod.replacing && pod.served >= share {
                return Err(Refusal::DescriptorShare {
                    served: pod.served,
                    data_path,
                    listeners: self.listeners,
                });
            }
        }
        if let Some(usage) = usage {
            if usage.free() < self.listeners.saturating_add(inbound) {
                return Err(Refusal::Descriptors {
                    usage,
                    inbound,
                    listeners: self.listeners,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: NetnsId = NetnsId { dev: 4, ino: 40 };
    const OWN: NetnsId = NetnsId { dev: 4, ino: 1 };

    fn pod(served: usize) -> Candidate<'static> {
        Candidate {
            netns: NS,
            owner: None,
            served,
            replacing: false,
        }
    }

    fn admission(max_pods: usize, data_path: Option<u64>) -> Admission {
        Admission {
            own_netns: Some(OWN),
            listeners: LISTENERS_PER_POD,
            max_pods,
            data_path,
            inbound: None,
        }
    }

    fn refusal(a: &Admission, c: &Candidate<'_>) -> Refusal {
        a.check_with(c, None, 0).expect_err("refused")
    }

    #[test]
    fn the_gateways_namespace_and_anothers_are_refused_naming_why() {
        let a = admission(10, None);
        let own = Candidate {
            netns: OWN,
            ..pod(0)
        };
        let e = refusal(&a, &own);
        assert_eq!(e.reason(), "gateway_netns");
        assert!(e
            .to_string()
            .ends_with("the gateway's own network namespace is never a pod"));
        let owner = Owner {
            uid: "pb-uid".into(),
            namespace: "demo".into(),
            name: "echo".into(),
        };
        let taken = Candidate {
            owner: Some(&owner),
            ..pod(1)
        };
        let e = refusal(&a, &taken);
        assert_eq!(e.reason(), "netns_taken");
        assert_eq!(
            e.to_string(),
            "its network namespace (inode 40) is already pod pb-uid's (demo/echo): one network namespace is one pod"
        );
        a.check_with(&pod(1), None, 0).unwrap();
    }

    #[test]
    fn the_pod_limit_counts_new_pods_only() {
        let a = admission(2, None);
        a.check_with(&pod(1), None, 0).unwrap();
        let e = refusal(&a, &pod(2));
        assert_eq!(e.reason(), "pod_limit");
        assert_eq!(
            e.to_string(),
            "pod limit reached (2 pods on this node; capture.max_pods is 2)"
        );
        let replacing = Candidate {
            replacing: true,
            ..pod(2)
        };
        a.check_with(&replacing, None, 0).unwrap();
    }

    #[test]
    fn the_pods_share_is_an_eighth_of_the_data_paths_descriptors() {
        // 1,024 − 416 (the default control-plane budget) = 608 left to the
        // data path: 456 for the inbound caps, 76 for pods (9 of them at
        // eight descriptors: the namespace, 15001, 15006, 15008, and 15053
        // UDP and TCP on 127.0.0.1 and ::1).
        let a = admission(1_000, Some(608));
        assert_eq!(inbound_share(608), 456);
        assert_eq!((a.share_pods(), a.effective_max()), (Some(9), 9));
        a.check_with(&pod(8), None, 0).unwrap();
        let e = refusal(&a, &pod(9));
        assert_eq!(e.reason(), "descriptor_share");
        assert!(
            e.to_string().starts_with(
                "the pods' descriptor share is used up: 9 pods hold 72 of the 76 descriptors kept for pods (an eighth of the 608 "
            ),
            "{e}"
        );
        // Without the DNS proxy a pod holds four: 19 of them.
        let without_dns = Admission {
            listeners: listeners_per_pod(false),
            ..admission(1_000, Some(608))
        };
        assert_eq!(without_dns.share_pods(), Some(19));
        let e = refusal(&without_dns, &pod(19));
        assert!(
            e.to_string()
                .contains("19 pods hold 76 of the 76 descriptors kept for pods"),
            "{e}"
        );
        // The shares never overlap: inbound, pods, and what is left.
        for d in [0, 7, 608, 1_048_160, u64::from(u32::MAX)] {
            let pods = a_pods(d) * DESCRIPTORS_PER_POD;
            assert!(inbound_share(d) + pods <= d - d / 8, "{d}");
        }
        // A node's hard limit today (1,048,576): the default max_pods holds.
        let a = admission(1_000, Some(1_048_576 - 416));
        assert_eq!(a.effective_max(), 1_000);
        // Unknown limit: only max_pods bounds.
        assert_eq!(admission(1_000, None).effective_max(), 1_000);
    }

    fn a_pods(d: u64) -> u64 {
        admission(usize::MAX, Some(d)).share_pods().unwrap() as u64
    }

    #[test]
    fn the_backstop_keeps_the_inbound_claim_and_the_listeners_free() {
        let a = admission(1_000, None);
        let usage = |open| Usage { open, limit: 1_024 };
        // 502 free: the listeners (7) and an inbound claim of 495 fit.
        a.check_with(&pod(0), Some(usage(522)), 495).unwrap();
        let e = a.check_with(&pod(0), Some(usage(523)), 495).unwrap_err();
        assert_eq!(e.reason(), "descriptors");
        assert_eq!(
            e.to_string(),
            "out of file descriptors (523 of the open-file limit 1024 in use): its listeners need 7 and the inbound connection caps may still claim 495; raise the gateway's open-file limit (LimitNOFILE, ulimit -n) or lower capture.max_pods"
        );
        // Inbound load leaves the answer alone: 100 more connections open
        // take 100 from the free count and from the claim alike.
        a.check_with(&pod(0), Some(usage(622)), 395).unwrap();
    }
}
