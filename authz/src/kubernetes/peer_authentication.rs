//! `PeerAuthentication` as istiod turns it into L4 authorization for a
//! node proxy (`convertPeerAuthentication`,
//! `convertedSelectorPeerAuthentications` in istiod's ambient index):
//!
//! - STRICT without port exceptions is one shared DENY,
//!   `<root>/istio_converted_static_strict` (`not_principals: [presence]`:
//!   refuse a peer without an identity), published whenever any
//!   PeerAuthentication exists and named by the workloads it applies to;
//! - a workload-level PeerAuthentication with `portLevelMtls` (outside the
//!   root namespace) becomes its own DENY,
//!   `<ns>/converted_peer_authentication_<name>`, with one rule per STRICT
//!   port and the port exceptions of a STRICT level, merged with the
//!   STRICT it inherits;
//! - per workload, the effective level is the oldest mesh-wide (root
//!   namespace, no selector), namespace-wide and selecting policy; UNSET
//!   inherits.
//!
//! Reproduced as istiod writes it, quirks included, so this node decides
//! as ztunnel fed by istiod would.

use std::collections::BTreeMap;

use super::resources::{MtlsMode, Object, PeerAuthenticationSpec};
use super::{Converted, Outcome};
use crate::policy::{Action, Clause, Match, Policy, Rule, Scope, StringMatch};
use crate::xds::ConvertError;

/// The shared STRICT policy's name (`_` cannot appear in a Kubernetes name).
pub const STATIC_STRICT: &str = "istio_converted_static_strict";
/// The prefix of a converted PeerAuthentication's name.
pub const CONVERTED_PREFIX: &str = "converted_peer_authentication_";

type Pa = Object<PeerAuthenticationSpec>;

/// `not_principals: [presence]`: a peer without an identity.
fn no_identity() -> Match {
    Match {
        not_principals: vec![StringMatch::Presence],
        ..Match::default()
    }
}

/// The shared STRICT DENY.
pub fn static_strict(root_namespace: &str) -> Policy {
    Policy {
        name: STATIC_STRICT.to_owned(),
        namespace: root_namespace.to_owned(),
        scope: Scope::WorkloadSelector,
        action: Action::Deny,
        rules: vec![Rule {
            clauses: vec![Clause {
                matches: vec![no_identity()],
            }],
        }],
        dry_run: false,
    }
}

fn strict(m: MtlsMode) -> bool {
    m == MtlsMode::Strict
}

fn lenient(m: MtlsMode) -> bool {
    matches!(m, MtlsMode::Permissive | MtlsMode::Disable)
}

/// The oldest of `candidates` (creation time, then name: the API server's
/// timestamps have a resolution of a second).
fn oldest<'a>(candidates: impl Iterator<Item = &'a Pa>) -> Option<&'a Pa> {
    candidates.min_by(|a, b| (&a.created, &a.name).cmp(&(&b.created, &b.name)))
}

/// The oldest policy without a selector in `namespace` (istiod's index of
/// namespace-level policies).
fn level<'a>(all: &'a [Pa], namespace: &str) -> Option<&'a Pa> {
    oldest(
        all.iter()
            .filter(|p| p.namespace == namespace && p.spec.selector.is_none()),
    )
}

fn converted_name(name: &str) -> String {
    format!("{CONVERTED_PREFIX}{name}")
}

/// The policy a selecting PeerAuthentication with port exceptions becomes,
/// or none.
pub fn convert(root_namespace: &str, pa: &Pa, all: &[Pa]) -> Option<Converted> {
    let spec = &pa.spec;
    if pa.namespace == root_namespace || spec.selector.is_none() || spec.port_level_mtls.is_empty()
    {
        return None;
    }
    let key = format!("{}/{}", pa.namespace, converted_name(&pa.name));
    let ports = match ports(pa) {
        Ok(p) => p,
        Err((field, problem)) => {
            let err = ConvertError::new(
                &pa.namespace,
                &converted_name(&pa.name),
                field,
                problem,
                Some((Scope::WorkloadSelector, Action::Deny, false)),
            );
            return Some(Converted::refused(key, &err));
        }
    };
    let ns_mode = level(all, &pa.namespace).map(|p| p.spec.mode());
    let root_mode = level(all, root_namespace).map(|p| p.spec.mode());
    let ns_strict = ns_mode.is_some_and(strict);
    let root_strict = root_mode.is_some_and(strict);
    let ns_unset = ns_mode.is_none_or(|m| m == MtlsMode::Unset);
    let mode = spec.mode();

    let mut rules: Vec<Clause> = Vec::new();
    let mut groups: Vec<Rule> = Vec::new();
    if strict(mode) {
        rules.push(Clause {
            matches: vec![no_identity()],
        });
    }
    let mut found_lenient_port = false;
    for (port, port_mode) in ports {
        if strict(port_mode) {
            // As istiod's condition reads (Go's precedence: the last
            // alternative does not require the workload level to be unset).
            let inherited =
                strict(mode) || (mode == MtlsMode::Unset && ns_strict) || (ns_unset && root_strict);
            if inherited {
                continue;
            }
            groups.push(Rule {
                clauses: vec![Clause {
                    matches: vec![Match {
                        destination_ports: vec![port],
                        ..no_identity()
                    }],
                }],
            });
        } else if lenient(port_mode) {
            if lenient(mode) {
                continue;
            }
            if mode == MtlsMode::Unset
                && ((ns_mode.is_some() && !ns_strict)
                    || (ns_mode.is_none() && root_mode.is_some() && !root_strict)
                    || (ns_mode.is_none() && root_mode.is_none()))
            {
                continue;
            }
            found_lenient_port = true;
            rules.push(Clause {
                matches: vec![Match {
                    not_destination_ports: vec![port],
                    ..Match::default()
                }],
            });
        }
    }
    if strict(mode) && !found_lenient_port {
        return None;
    }
    if rules.is_empty() && groups.is_empty() {
        return None;
    }
    let merge_strict = ns_strict || (root_strict && ns_unset);
    if merge_strict && found_lenient_port {
        rules.push(Clause {
            matches: vec![no_identity()],
        });
    }
    if !rules.is_empty() {
        groups.push(Rule { clauses: rules });
    }
    Some(Converted {
        key,
        policy: Some(Policy {
            name: converted_name(&pa.name),
            namespace: pa.namespace.clone(),
            scope: Scope::WorkloadSelector,
            action: Action::Deny,
            rules: groups,
            dry_run: false,
        }),
        outcome: Outcome::Enforced,
    })
}

/// The port-level modes by port, in port order; a key that is not a port
/// is named.
fn ports(pa: &Pa) -> Result<Vec<(u16, MtlsMode)>, (String, String)> {
    let mut out = BTreeMap::new();
    for (k, m) in &pa.spec.port_level_mtls {
        let port = k.parse::<u16>().map_err(|_| {
            (
                format!("portLevelMtls[{k:?}]"),
                format!("{k:?} is not a port number (0-65535)"),
            )
        })?;
        out.insert(port, m.mode);
    }
    Ok(out.into_iter().collect())
}

/// The keys of the PeerAuthentication-derived policies a workload in
/// `namespace` with `labels` names (istiod's
/// `convertedSelectorPeerAuthentications` over the policies that apply
/// to it: the mesh-wide ones, and its namespace's that select it).
pub fn keys_for(
    root_namespace: &str,
    all: &[Pa],
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<String> {
    let applies = all.iter().filter(|p| {
        (p.namespace == root_namespace && p.spec.selector.is_none())
            || (p.namespace == namespace
                && p.spec.selector.as_ref().is_none_or(|s| s.selects(labels)))
    });
    let (mut mesh, mut ns, mut workload) = (Vec::new(), Vec::new(), Vec::new());
    for p in applies {
        let selecting = p.spec.selector.as_ref().is_some_and(|s| s.has_labels());
        if !selecting {
            if p.namespace == root_namespace {
                mesh.push(p);
            } else {
                ns.push(p);
            }
        } else if p.namespace != root_namespace {
            workload.push(p);
        }
    }
    let mesh = oldest(mesh.into_iter());
    let ns = oldest(ns.into_iter());
    let workload = oldest(workload.into_iter());

    let mut effective_strict = mesh.is_some_and(|p| strict(p.spec.mode()));
    if let Some(n) = ns {
        if n.spec.mode() != MtlsMode::Unset {
            effective_strict = strict(n.spec.mode());
        }
    }
    let mut port_key = None;
    if let Some(w) = workload {
        let mode = w.spec.mode();
        if strict(mode) {
            effective_strict = true;
        }
        if lenient(mode) {
            effective_strict = false;
        }
        let own = || Some(format!("{}/{}", w.namespace, converted_name(&w.name)));
        let port_modes = || w.spec.port_level_mtls.values().map(|m| m.mode);
        if !w.spec.port_level_mtls.is_empty() {
            match mode {
                MtlsMode::Strict => {
                    if port_modes().any(lenient) {
                        port_key = own();
                        effective_strict = false;
                    }
                }
                MtlsMode::Permissive | MtlsMode::Disable => {
                    if port_modes().any(strict) {
                        port_key = own();
                    }
                }
                MtlsMode::Unset => {
                    if effective_strict {
                        if port_modes().any(|m| m == MtlsMode::Permissive) {
                            port_key = own();
                            effective_strict = false;
                        }
                    } else if port_modes().any(strict) {
                        port_key = own();
                    }
                }
            }
        }
    }
    let mut keys = Vec::new();
    if effective_strict {
        keys.push(format!("{root_namespace}/{STATIC_STRICT}"));
    }
    keys.extend(port_key);
    keys.sort();
    keys.dedup();
    keys
}
