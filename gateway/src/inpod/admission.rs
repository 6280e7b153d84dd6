//! Which pods the gateway takes, checked before a new pod's listeners open
//! (a pod already served in the same namespace is never checked again):
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
//!    cannot go to another namespace while the pod is served.
//! 3. At most `capture.max_pods` pods (a re-created sandbox takes its old
//!    one's place).
//! 4. Descriptors: a pod holds its namespace and three listeners for as long
//!    as it is served. It is refused when opening its listeners would leave
//!    less than a quarter of the open-file limit free for connections.
//!
//! Each refusal is its pod's add error (the ZDS NACK text, the CNI ADD
//! error) and counted by reason in `tidegate_inpod_refusals_total`.

use crate::descriptors::Usage;
use crate::netns::NetnsId;

/// The default of `capture.max_pods`: well above the pods a Kubernetes
/// node runs (110 by default, a few hundred when raised).
pub const DEFAULT_MAX_PODS: u32 = 1_000;

/// Descriptors a pod's listeners take (15001, 15006, 15008); its namespace
/// descriptor is open already when it is checked.
pub const LISTENERS_PER_POD: u64 = 3;

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
    #[error("out of file descriptors ({usage}): its listeners need {LISTENERS_PER_POD} and {reserve} stay free for connections; raise the gateway's open-file limit (LimitNOFILE, ulimit -n) or lower capture.max_pods")]
    Descriptors { usage: Usage, reserve: u64 },
}

impl Refusal {
    /// A bounded metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::GatewayNetns { .. } => "gateway_netns",
            Refusal::NetnsTaken { .. } => "netns_taken",
            Refusal::PodLimit { .. } => "pod_limit",
            Refusal::Descriptors { .. } => "descriptors",
        }
    }
}

/// What a new pod is checked against.
#[derive(Clone, Debug)]
pub struct Admission {
    /// The gateway's own namespace (`None` when it could not be read).
    pub own_netns: Option<NetnsId>,
    pub max_pods: usize,
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
    /// Checks `pod` with the descriptors in use now (when they cannot be
    /// counted the check is skipped: a pod is never refused on a guess).
    pub fn check(&self, pod: &Candidate<'_>) -> Result<(), Refusal> {
        self.check_with(pod, Usage::now().ok())
    }

    /// [`Admission::check`] against `usage`.
    pub fn check_with(&self, pod: &Candidate<'_>, usage: Option<Usage>) -> Result<(), Refusal> {
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
        if let Some(usage) = usage {
            let reserve = usage.limit / 4;
            if usage.free() < LISTENERS_PER_POD + reserve {
                return Err(Refusal::Descriptors { usage, reserve });
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

    fn admission(max_pods: usize) -> Admission {
        Admission {
            own_netns: Some(OWN),
            max_pods,
        }
    }

    fn refusal(a: &Admission, c: &Candidate<'_>, usage: Option<Usage>) -> String {
        a.check_with(c, usage).expect_err("refused").to_string()
    }

    #[test]
    fn the_gateways_namespace_and_anothers_are_refused_naming_why() {
        let a = admission(10);
        let own = Candidate {
            netns: OWN,
            ..pod(0)
        };
        let e = a.check_with(&own, None).unwrap_err();
        assert_eq!(e.reason(), "gateway_netns");
        assert!(e
            .to_string()
            .contains("the gateway's own network namespace is never a pod"));
        let owner = Owner {
            uid: "pb-uid".into(),
            namespace: "demo".into(),
            name: "echo".into(),
        };
        let taken = Candidate {
            owner: Some(&owner),
            ..pod(1)
        };
        let e = refusal(&a, &taken, None);
        assert_eq!(
            e,
            "its network namespace (inode 40) is already pod pb-uid's (demo/echo): one network namespace is one pod"
        );
        a.check_with(&pod(1), None).unwrap();
    }

    #[test]
    fn the_pod_limit_counts_new_pods_only() {
        let a = admission(2);
        a.check_with(&pod(1), None).unwrap();
        let e = refusal(&a, &pod(2), None);
        assert_eq!(
            e,
            "pod limit reached (2 pods on this node; capture.max_pods is 2)"
        );
        let replacing = Candidate {
            replacing: true,
            ..pod(2)
        };
        a.check_with(&replacing, None).unwrap();
    }

    #[test]
    fn a_pod_is_refused_when_its_listeners_would_eat_the_connections_quarter() {
        let a = admission(1_000);
        // 1,024 descriptors: 256 stay free, the listeners take 3.
        let fits = Usage {
            open: 1_024 - 259,
            limit: 1_024,
        };
        a.check_with(&pod(0), Some(fits)).unwrap();
        let full = Usage {
            open: fits.open + 1,
            limit: 1_024,
        };
        let e = a.check_with(&pod(0), Some(full)).unwrap_err();
        assert_eq!(e.reason(), "descriptors");
        let text = e.to_string();
        assert!(
            text.starts_with("out of file descriptors (766 of the open-file limit 1024 in use)"),
            "{text}"
        );
        assert!(text.contains("256 stay free for connections"), "{text}");
    }
}
