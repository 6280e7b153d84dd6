//! Which policy a workload gets, and why. One function, [`resolve`], is used
//! both by the drain engine's selection and by the reports (`/config_dump`,
//! `tidegate workloads`), so what is shown is what decides.
//!
//! Precedence, first match wins:
//! 1. a run-time binding set with `PUT /workloads/<uid>/policy` (`admin`);
//! 2. the pod annotation `tidegate.io/drain-policy` (`annotation`);
//! 3. the namespace's policy label (`namespace`);
//! 4. the first matching `policies.bindings` entry (`binding`);
//! 5. `policies.default` (`default`);
//! 6. the built-in fallback (`fallback`).
//!
//! A name in 1–3 that is no policy (neither configured nor uploaded) is
//! skipped, and the skip is part of the answer.
//!
//! A peer's events (peer-terminating, peer-deleted) are decided by the
//! policy of the workload that terminates — the peer, resolved as above from
//! what discovery says of it ([`resolve_for_peer`]) — unless the local client
//! overrides it with the annotation `tidegate.io/peer-drain-policy`.

use std::borrow::Cow;

use serde::Serialize;

use crate::config::PoliciesConfig;
use crate::subject::Subject;

/// The annotation that picks a workload's policy by name.
pub const POLICY_ANNOTATION: &str = "tidegate.io/drain-policy";

/// Why a workload got the policy its annotation names: a constant, so the
/// most common resolution copies it instead of formatting it (a test keeps
/// it in step with [`POLICY_ANNOTATION`]).
const ANNOTATION_WHY: &str = "pod annotation tidegate.io/drain-policy";

/// The client annotation that picks the policy deciding its peers' events
/// (instead of each terminating peer's own policy).
pub const PEER_POLICY_ANNOTATION: &str = "tidegate.io/peer-drain-policy";

/// How a workload's policy was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SelectedBy {
    /// A run-time binding (`PUT /workloads/<uid>/policy`).
    Admin,
    Annotation,
    /// A local client's `tidegate.io/peer-drain-policy` (peer events only).
    ClientOverride,
    /// The namespace's policy label (Kubernetes discovery).
    Namespace,
    /// The index in `policies.bindings`.
    Binding(usize),
    Default,
    Fallback,
}

impl SelectedBy {
    /// The kebab-case name shown in `/config_dump` (`source`).
    pub fn label(&self) -> &'static str {
        match self {
            SelectedBy::Admin => "admin",
            SelectedBy::Annotation => "annotation",
            SelectedBy::ClientOverride => "client-override",
            SelectedBy::Namespace => "namespace",
            SelectedBy::Binding(_) => "binding",
            SelectedBy::Default => "default",
            SelectedBy::Fallback => "fallback",
        }
    }
}

/// A name the resolution passed over, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Skipped {
    pub policy: String,
    /// Where the name came from (`admin`, `annotation`, `namespace`).
    pub source: &'static str,
    pub reason: String,
}

/// The answer of [`resolve`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolution {
    pub name: String,
    pub by: SelectedBy,
    /// Human-readable: the rule that chose `name` (borrowed when it is a
    /// constant: the annotation, `policies.default`, the fallback).
    pub why: Cow<'static, str>,
    pub skipped: Vec<Skipped>,
}

/// Resolves the policy of `spec`. `admin` is its run-time binding (if any);
/// `known` says whether a name is a policy (configured or uploaded).
pub fn resolve(
    spec: &Subject<'_>,
    admin: Option<&str>,
    cfg: &PoliciesConfig,
    known: impl Fn(&str) -> bool,
) -> Resolution {
    let mut skipped = Vec::new();
    // Every event resolves its workload's policy: the texts saying why are
    // written only for the source that wins (formatting all three first
    // cost more than the rest of the resolution).
    type Why = fn(&Subject<'_>) -> Cow<'static, str>;
    let named: [(Option<&str>, SelectedBy, Why); 3] = [
        (admin, SelectedBy::Admin, |s| {
            format!("run-time binding (PUT /workloads/{}/policy)", s.uid).into()
        }),
        (
            spec.annotations.get(POLICY_ANNOTATION).map(String::as_str),
            SelectedBy::Annotation,
            |_| Cow::Borrowed(ANNOTATION_WHY),
        ),
        (spec.namespace_policy, SelectedBy::Namespace, |s| {
            format!("namespace {}'s policy label", s.namespace).into()
        }),
    ];
    for (name, by, why) in named {
        let Some(name) = name else { continue };
        if known(name) {
            let why = why(spec);
            return Resolution {
                name: name.to_owned(),
                by,
                why,
                skipped,
            };
        }
        skipped.push(Skipped {
            policy: name.to_owned(),
            source: by.label(),
            reason: "no such policy (neither in policies.plugins nor uploaded)".into(),
        });
    }
    for (i, b) in cfg.bindings.iter().enumerate() {
        let ns_ok = b.namespace.as_ref().is_none_or(|ns| ns == spec.namespace);
        let labels_ok = b
            .selector
            .iter()
            .all(|(k, v)| spec.labels.get(k) == Some(v));
        if ns_ok && labels_ok {
            let mut what: Vec<String> = b
                .namespace
                .iter()
                .map(|ns| format!("namespace {ns}"))
                .collect();
            what.extend(b.selector.iter().map(|(k, v)| format!("{k}={v}")));
            if what.is_empty() {
                what.push("every workload".into());
            }
            return Resolution {
                name: b.policy.clone(),
                by: SelectedBy::Binding(i),
                why: format!("policies.bindings[{i}] ({})", what.join(", ")).into(),
                skipped,
            };
        }
    }
    if let Some(name) = &cfg.default {
        return Resolution {
            name: name.clone(),
            by: SelectedBy::Default,
            why: "policies.default (no binding matched)".into(),
            skipped,
        };
    }
    Resolution {
        name: cfg.fallback.name().to_owned(),
        by: SelectedBy::Fallback,
        why: "built-in fallback (no binding matched, policies.default unset)".into(),
        skipped,
    }
}

/// Which policy decides the events of `peer` for the local `client`: the
/// client's `tidegate.io/peer-drain-policy` when it names a policy, else the
/// peer's own (its run-time binding lives on its own node, not here).
pub fn resolve_for_peer(
    peer: &Subject<'_>,
    client: &Subject<'_>,
    cfg: &PoliciesConfig,
    known: impl Fn(&str) -> bool,
) -> Resolution {
    let mut skipped = Vec::new();
    if let Some(name) = client.annotations.get(PEER_POLICY_ANNOTATION) {
        if known(name) {
            return Resolution {
                name: name.clone(),
                by: SelectedBy::ClientOverride,
                why: format!(
                    "client {}/{}'s annotation {PEER_POLICY_ANNOTATION}",
                    client.namespace, client.name
                )
                .into(),
                skipped,
            };
        }
        skipped.push(Skipped {
            policy: name.clone(),
            source: SelectedBy::ClientOverride.label(),
            reason: "no such policy (neither in policies.plugins nor uploaded)".into(),
        });
    }
    let mut r = resolve(peer, None, cfg, known);
    skipped.append(&mut r.skipped);
    r.skipped = skipped;
    r.why = format!("the peer's: {}", r.why).into();
    r
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// The fields of a workload the gateway lends as a [`Subject`].
    #[derive(Clone, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Spec {
        uid: String,
        name: String,
        #[serde(default = "default_namespace")]
        namespace: String,
        #[serde(default)]
        labels: BTreeMap<String, String>,
        #[serde(default)]
        annotations: BTreeMap<String, String>,
        #[serde(default)]
        namespace_policy: Option<String>,
    }

    fn default_namespace() -> String {
        "default".into()
    }

    impl Spec {
        fn subject(&self) -> Subject<'_> {
            Subject {
                uid: &self.uid,
                name: &self.name,
                namespace: &self.namespace,
                labels: &self.labels,
                annotations: &self.annotations,
                namespace_policy: self.namespace_policy.as_deref(),
            }
        }
    }

    fn spec(yaml: &str) -> Spec {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn cfg(yaml: &str) -> PoliciesConfig {
        serde_yaml::from_str(yaml).unwrap()
    }

    const CFG: &str =
        "default: d\nplugins:\n  a: {file: a.wasm}\n  b: {file: b.wasm}\n  d: {file: d.wasm}\n\
                       bindings:\n  - {namespace: pay, selector: {app: web}, policy: b}\n";

    #[test]
    fn precedence_admin_annotation_namespace_binding_default() {
        let c = cfg(CFG);
        let known = |n: &str| ["a", "b", "d"].contains(&n);
        let w = spec(
            "{uid: u, name: w, namespace: pay, labels: {app: web}, \
             annotations: {tidegate.io/drain-policy: a}, namespace_policy: d}",
        );
        let r = resolve(&w.subject(), Some("b"), &c, known);
        assert_eq!((r.name.as_str(), r.by), ("b", SelectedBy::Admin));
        let r = resolve(&w.subject(), None, &c, known);
        assert_eq!((r.name.as_str(), r.by), ("a", SelectedBy::Annotation));
        assert_eq!(r.why, format!("pod annotation {POLICY_ANNOTATION}"));
        let mut w2 = w.clone();
        w2.annotations.clear();
        let r = resolve(&w2.subject(), None, &c, known);
        assert_eq!((r.name.as_str(), r.by), ("d", SelectedBy::Namespace));
        w2.namespace_policy = None;
        let r = resolve(&w2.subject(), None, &c, known);
        assert_eq!((r.name.as_str(), r.by), ("b", SelectedBy::Binding(0)));
        assert_eq!(r.why, "policies.bindings[0] (namespace pay, app=web)");
        w2.labels.clear();
        let r = resolve(&w2.subject(), None, &c, known);
        assert_eq!((r.name.as_str(), r.by), ("d", SelectedBy::Default));
        let r = resolve(&w2.subject(), None, &cfg("{}"), known);
        assert_eq!(r.by, SelectedBy::Fallback);
        assert_eq!(r.name, "builtin:keepalive-only");
    }

    #[test]
    fn a_peer_event_takes_the_peers_policy_unless_the_client_overrides() {
        let c = cfg(CFG);
        let known = |n: &str| ["a", "b", "d"].contains(&n);
        let peer = spec(
            "{uid: p, name: server, namespace: web, \
             annotations: {tidegate.io/drain-policy: a}}",
        );
        let client = spec("{uid: c, name: client, namespace: web}");
        let r = resolve_for_peer(&peer.subject(), &client.subject(), &c, known);
        assert_eq!((r.name.as_str(), r.by), ("a", SelectedBy::Annotation));
        assert_eq!(r.why, "the peer's: pod annotation tidegate.io/drain-policy");
        // The client's own drain policy does not decide its peers' events.
        let mut client2 = client.clone();
        client2
            .annotations
            .insert(POLICY_ANNOTATION.into(), "b".into());
        let r = resolve_for_peer(&peer.subject(), &client2.subject(), &c, known);
        assert_eq!(r.name, "a");
        // Its peer-drain-policy does, when it names a policy.
        client2
            .annotations
            .insert(PEER_POLICY_ANNOTATION.into(), "b".into());
        let r = resolve_for_peer(&peer.subject(), &client2.subject(), &c, known);
        assert_eq!((r.name.as_str(), r.by), ("b", SelectedBy::ClientOverride));
        assert_eq!(
            r.why,
            "client web/client's annotation tidegate.io/peer-drain-policy"
        );
        client2
            .annotations
            .insert(PEER_POLICY_ANNOTATION.into(), "typo".into());
        let r = resolve_for_peer(&peer.subject(), &client2.subject(), &c, known);
        assert_eq!(r.name, "a");
        assert_eq!(r.skipped[0].policy, "typo");
        assert_eq!(r.skipped[0].source, "client-override");
    }

    #[test]
    fn unknown_names_are_skipped_and_reported() {
        let c = cfg(CFG);
        let w = spec(
            "{uid: u, name: w, \
             annotations: {tidegate.io/drain-policy: typo}, namespace_policy: nope}",
        );
        let r = resolve(&w.subject(), Some("gone"), &c, |n| n == "d");
        assert_eq!((r.name.as_str(), r.by), ("d", SelectedBy::Default));
        let skipped: Vec<_> = r
            .skipped
            .iter()
            .map(|s| (s.policy.as_str(), s.source))
            .collect();
        assert_eq!(
            skipped,
            [
                ("gone", "admin"),
                ("typo", "annotation"),
                ("nope", "namespace")
            ]
        );
    }
}
