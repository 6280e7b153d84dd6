//! Who may ask for whose certificate: istiod's node authorizer
//! (`security/pkg/server/ca/node_auth.go`), as a pure decision over the
//! authenticated caller and the pods the CA sees. Every refusal reads the
//! same to the caller (`Unauthenticated`); the reason is for the CA's log.

use tidegate_protocol::identity::SpiffeId;

/// The caller, as TokenReview authenticated it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub namespace: String,
    pub service_account: String,
    /// From the token's `authentication.kubernetes.io/pod-name` extra
    /// (a pod-bound projected token).
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
}

/// What the CA knows of one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    pub uid: String,
    pub service_account: String,
    pub node: String,
}

/// The pods the CA sees (a watch of pods not in phase Failed).
pub trait Pods {
    fn get(&self, namespace: &str, name: &str) -> Option<PodFacts>;
    /// Whether a pod of `namespace`/`service_account` runs on `node`.
    fn any_on_node(&self, node: &str, namespace: &str, service_account: &str) -> bool;
}

/// Why a request was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("caller {0} may not impersonate: not in the trusted node agents")]
    UntrustedCaller(String),
    #[error("impersonated identity {0:?} is not a SPIFFE id of this trust domain")]
    BadIdentity(String),
    #[error("caller {0} impersonates without a pod-bound token (no pod name or uid)")]
    NoCallerPod(String),
    #[error("caller pod {0} does not exist")]
    CallerPodGone(String),
    #[error("caller pod {pod} does not match its token: {what}")]
    CallerPodMismatch { pod: String, what: &'static str },
    #[error("no pod of {identity} runs on the caller's node {node}")]
    NotOnCallerNode { identity: String, node: String },
}

/// The configured policy.
pub struct Authorizer {
    pub trust_domain: String,
    /// `namespace/service-account` of callers allowed to impersonate.
    pub trusted: Vec<String>,
}

impl Authorizer {
    /// The identity to sign for, or why not. Without impersonation, the
    /// caller's own identity.
    pub fn decide(
        &self,
        caller: &Caller,
        requested: Option<&str>,
        pods: &impl Pods,
    ) -> Result<SpiffeId, Refusal> {
        let own = SpiffeId::new(
            &self.trust_domain,
            &caller.namespace,
            &caller.service_account,
        );
        let Some(requested) = requested else {
            return Ok(own);
        };
        let who = format!("{}/{}", caller.namespace, caller.service_account);
        if !self.trusted.contains(&who) {
            return Err(Refusal::UntrustedCaller(who));
        }
        let id: SpiffeId = requested
            .parse()
            .map_err(|_| Refusal::BadIdentity(requested.to_owned()))?;
        if id.trust_domain() != self.trust_domain {
            return Err(Refusal::BadIdentity(requested.to_owned()));
        }
        let (Some(name), Some(uid)) = (&caller.pod_name, &caller.pod_uid) else {
            return Err(Refusal::NoCallerPod(who));
        };
        let pod_key = format!("{}/{name}", caller.namespace);
        let pod = pods
            .get(&caller.namespace, name)
            .ok_or_else(|| Refusal::CallerPodGone(pod_key.clone()))?;
        if pod.uid != *uid {
            return Err(Refusal::CallerPodMismatch {
                pod: pod_key,
                what: "uid",
            });
        }
        if pod.service_account != caller.service_account {
            return Err(Refusal::CallerPodMismatch {
                pod: pod_key,
                what: "service account",
            });
        }
        if !pods.any_on_node(&pod.node, id.namespace(), id.service_account()) {
            return Err(Refusal::NotOnCallerNode {
                identity: id.to_string(),
                node: pod.node,
            });
        }
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// (namespace, name) → (uid, service account, node).
    struct Fake(BTreeMap<(&'static str, &'static str), (&'static str, &'static str, &'static str)>);

    impl Pods for Fake {
        fn get(&self, namespace: &str, name: &str) -> Option<PodFacts> {
            self.0
                .iter()
                .find(|((ns, n), _)| *ns == namespace && *n == name)
                .map(|(_, (uid, sa, node))| PodFacts {
                    uid: (*uid).into(),
                    service_account: (*sa).into(),
                    node: (*node).into(),
                })
        }
        fn any_on_node(&self, node: &str, namespace: &str, service_account: &str) -> bool {
            self.0.iter().any(|((ns, _), (_, sa, n))| {
                *n == node && *ns == namespace && *sa == service_account
            })
        }
    }

    fn setup() -> (Authorizer, Fake, Caller) {
        let pods = Fake(
            [
                (
                    ("tidegate-system", "tidegate-a"),
                    ("uid-a", "tidegate", "node-a"),
                ),
                (("shop", "web-1"), ("uid-w", "web", "node-a")),
                (("shop", "db-1"), ("uid-d", "db", "node-b")),
            ]
            .into(),
        );
        let caller = Caller {
            namespace: "tidegate-system".into(),
            service_account: "tidegate".into(),
            pod_name: Some("tidegate-a".into()),
            pod_uid: Some("uid-a".into()),
        };
        let auth = Authorizer {
            trust_domain: "cluster.local".into(),
            trusted: vec!["tidegate-system/tidegate".into()],
        };
        (auth, pods, caller)
    }

    #[test]
    fn a_node_agent_gets_the_identities_of_pods_on_its_node_only() {
        let (auth, pods, caller) = setup();
        let web = "spiffe://cluster.local/ns/shop/sa/web";
        assert_eq!(
            auth.decide(&caller, Some(web), &pods).unwrap().to_string(),
            web
        );
        let db = "spiffe://cluster.local/ns/shop/sa/db";
        assert_eq!(
            auth.decide(&caller, Some(db), &pods),
            Err(Refusal::NotOnCallerNode {
                identity: db.into(),
                node: "node-a".into()
            })
        );
    }

    #[test]
    fn without_impersonation_the_caller_gets_its_own_identity() {
        let (auth, pods, mut caller) = setup();
        caller.namespace = "shop".into();
        caller.service_account = "web".into();
        assert_eq!(
            auth.decide(&caller, None, &pods).unwrap().to_string(),
            "spiffe://cluster.local/ns/shop/sa/web"
        );
    }

    #[test]
    fn untrusted_callers_foreign_identities_and_mismatched_pods_are_refused() {
        let (auth, pods, caller) = setup();
        let web = Some("spiffe://cluster.local/ns/shop/sa/web");
        let mut untrusted = caller.clone();
        untrusted.service_account = "web".into();
        assert!(matches!(
            auth.decide(&untrusted, web, &pods),
            Err(Refusal::UntrustedCaller(_))
        ));
        for bad in [
            "spiffe://other.td/ns/shop/sa/web",
            "web",
            "spiffe://cluster.local/ns/shop",
        ] {
            assert!(matches!(
                auth.decide(&caller, Some(bad), &pods),
                Err(Refusal::BadIdentity(_))
            ));
        }
        let mut unbound = caller.clone();
        unbound.pod_uid = None;
        assert!(matches!(
            auth.decide(&unbound, web, &pods),
            Err(Refusal::NoCallerPod(_))
        ));
        let mut gone = caller.clone();
        gone.pod_name = Some("tidegate-old".into());
        assert!(matches!(
            auth.decide(&gone, web, &pods),
            Err(Refusal::CallerPodGone(_))
        ));
        let mut replaced = caller.clone();
        replaced.pod_uid = Some("uid-old".into());
        assert_eq!(
            auth.decide(&replaced, web, &pods),
            Err(Refusal::CallerPodMismatch {
                pod: "tidegate-system/tidegate-a".into(),
                what: "uid"
            })
        );
    }
}
