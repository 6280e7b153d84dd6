//! Which pods the gateway takes, checked before a new pod's listeners open
//! (a pod already served in the same namespace is never checked again: a
//! re-add after a ZDS reconnect, a repeated ADD, is accepted as it is):
//!
//! 1. The gateway's own network namespace is never a pod: its listeners
//!    there would capture the node's own traffic.
//! 2. One network namespace is one pod. A second uid handed a namespace
//!    another served pod has — same (device, inode), see
//!    [`tidegate_netns::namespace::NetnsId`] — is refused, naming that pod: two sets of
//!    listeners on one namespace both bind (`SO_REUSEPORT`) and the kernel
//!    splits the pod's connections between them. The same uid in another
//!    namespace is a re-created sandbox and replaces its old one, as ztunnel
//!    does. The gateway holds each served namespace open, so its inode
//!    cannot go to another namespace while the pod is served; a pod removed
//!    frees its namespace.
//! 3. At most `capture.max_pods` pods (a re-created sandbox takes its old
//!    one's place).
//! 4. **The pods' descriptor share** ([`crate::descriptor_budget`]). A
//!    served pod holds its namespace, its three capture listeners and the
//!    DNS proxy's four on 15053 (UDP, TCP; 127.0.0.1 and ::1); four with
//!    `dns.enabled: false` ([`crate::descriptor_budget::per_pod`], where
//!    the per-pod listener counts are defined). The pods' share is sized
//!    at start from `capture.max_pods` × that, beside the DNS proxy's passing
//!    descriptors (forwarded queries in flight, `dns.max_in_flight`, and
//!    TCP connections to 15053, `dns.max_tcp_connections`, each bounded by
//!    its own semaphore), all within half of the descriptors the control
//!    plane leaves to the data path (`D`, see `control/src/limits.rs`). The
//!    inbound caps take three quarters of what the pods' share leaves
//!    (`proxy/inbound/limits.rs`), the outbound side and the files the last
//!    quarter. When `D / 2` does not hold `capture.max_pods` pods (a low
//!    open-file limit), fewer are served, and a pod past them is refused
//!    here. Each bounded by its own share, the pods cannot take a
//!    descriptor the inbound caps may claim, nor the inbound side one a
//!    pod holds.
//! 5. **A backstop, on the kernel's count**: a pod is refused when the free
//!    descriptors (the open-file limit less those open now) would not cover
//!    its listeners and what the inbound caps may still claim (their cap,
//!    at most their share, less the inbound connections open). Inbound load
//!    never refuses a pod this way (an open connection leaves the free
//!    count and the claim alike); something past its share (a limit
//!    lowered at run time, the outbound side) does.
//!
//! Each refusal is its pod's add error (the ZDS NACK text, the CNI ADD
//! error) and counted by reason in `tidegate_inpod_refusals_total`.

use std::sync::Arc;

use crate::descriptor_budget::DescriptorBudget;
use crate::proxy::inbound::limits::ConnectionLimits;
use tidegate_base::descriptors::Usage;
use tidegate_netns::namespace::NetnsId;

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
    #[error("the pods' descriptor share is used up: {served} pods hold {} descriptors, all it keeps for pods' listeners ({} pods of {}; with the DNS proxy's {}, half of the {} descriptors the control plane leaves of the open-file limit {}; capture.max_pods asks more); raise the gateway's open-file limit (LimitNOFILE, ulimit -n)", *served as u64 * budget.per_pod, budget.max_pods, budget.per_pod, budget.dns_forwards + budget.dns_tcp, budget.data_path, budget.limit)]
    DescriptorShare {
        served: usize,
        budget: DescriptorBudget,
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
    /// most the budget's inbound share.
    pub cap: u64,
}

impl InboundClaim {
    pub fn new(limits: Arc<ConnectionLimits>, budget: Option<&DescriptorBudget>) -> InboundClaim {
        let cap = limits.caps().connections as u64;
        let cap = budget.map_or(cap, |b| cap.min(b.inbound));
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
    /// A pod's listeners ([`crate::descriptor_budget::listeners_per_pod`]).
    pub listeners: u64,
    /// `capture.max_pods`.
    pub max_pods: usize,
    /// The split of the descriptors (`None`: the open-file limit is
    /// unknown, and only `max_pods` bounds the pods).
    pub budget: Option<DescriptorBudget>,
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
        self.budget
            .map(|b| usize::try_from(b.max_pods).unwrap_or(usize::MAX))
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
        if let (Some(budget), Some(share)) = (self.budget, self.share_pods()) {
            if !pod.replacing && pod.served >= share {
                return Err(Refusal::DescriptorShare {
                    served: pod.served,
                    budget,
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
    use crate::descriptor_budget::{
        listeners_per_pod, PodWants, DESCRIPTORS_PER_POD, LISTENERS_PER_POD,
    };

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

    fn admission(max_pods: usize, budget: Option<DescriptorBudget>) -> Admission {
        Admission {
            own_netns: Some(OWN),
            listeners: LISTENERS_PER_POD,
            max_pods,
            budget,
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

    /// The budget of `limit` with the default control plane (416) and DNS
    /// bounds, for `max_pods` pods of `per_pod` descriptors.
    fn budget(limit: u64, max_pods: u64, per_pod: u64) -> DescriptorBudget {
        let dns = per_pod == DESCRIPTORS_PER_POD;
        let wants = PodWants {
            max_pods,
            per_pod,
            dns_forwards: if dns { 512 } else { 0 },
            dns_tcp: if dns { 256 } else { 0 },
        };
        DescriptorBudget::derive(limit - 416, 416, wants)
    }

    #[test]
    fn a_thousand_pods_are_served_at_20_000_and_the_next_is_refused_by_the_pod_limit() {
        let a = admission(1_000, Some(budget(20_000, 1_000, DESCRIPTORS_PER_POD)));
        assert_eq!((a.share_pods(), a.effective_max()), (Some(1_000), 1_000));
        a.check_with(&pod(999), None, 0).unwrap();
        assert_eq!(refusal(&a, &pod(1_000)).reason(), "pod_limit");
    }

    #[test]
    fn past_what_the_pods_share_holds_a_pod_is_refused_naming_the_share() {
        // 2,048: the share holds 76 pods of eight (the DNS proxy keeps 204).
        let a = admission(1_000, Some(budget(2_048, 1_000, DESCRIPTORS_PER_POD)));
        assert_eq!((a.share_pods(), a.effective_max()), (Some(76), 76));
        a.check_with(&pod(75), None, 0).unwrap();
        let e = refusal(&a, &pod(76));
        assert_eq!(e.reason(), "descriptor_share");
        assert_eq!(
            e.to_string(),
            "the pods' descriptor share is used up: 76 pods hold 608 descriptors, all it keeps for pods' listeners (76 pods of 8; with the DNS proxy's 204, half of the 1632 descriptors the control plane leaves of the open-file limit 2048; capture.max_pods asks more); raise the gateway's open-file limit (LimitNOFILE, ulimit -n)"
        );
        // A re-created sandbox takes its old one's place.
        let replacing = Candidate {
            replacing: true,
            ..pod(76)
        };
        a.check_with(&replacing, None, 0).unwrap();
        // Without the DNS proxy a pod holds four, and nothing is kept for DNS.
        let without_dns = Admission {
            listeners: listeners_per_pod(false),
            ..admission(1_000, Some(budget(2_048, 1_000, 4)))
        };
        assert_eq!(without_dns.share_pods(), Some(204));
        let e = refusal(&without_dns, &pod(204));
        assert!(
            e.to_string()
                .contains("204 pods hold 816 descriptors, all it keeps for pods' listeners (204 pods of 4; with the DNS proxy's 0"),
            "{e}"
        );
        // Unknown limit: only max_pods bounds.
        assert_eq!(admission(1_000, None).effective_max(), 1_000);
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
