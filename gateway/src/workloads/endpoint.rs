//! One endpoint of one Service port as the data path dials it
//! ([`Endpoint`]: its workload, address, target port, weight), its
//! conditions as EndpointSlices give them ([`Conditions`]), and which of
//! a workload's addresses it reaches ([`pick_ips`]).

use std::net::IpAddr;
use std::sync::Arc;

use serde::Serialize;

use super::{LifecycleState, Workload};

/// An endpoint's conditions (EndpointSlice `conditions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Conditions {
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

impl Conditions {
    /// From the workload's state (the workload file has no EndpointSlice).
    pub fn of(w: &Workload) -> Conditions {
        let terminating = w.spec.state == LifecycleState::Terminating;
        Conditions {
            ready: !terminating,
            serving: true,
            terminating,
        }
    }

    /// As an EndpointSlice gives them: unset `ready` and `serving` mean
    /// true, unset `terminating` false (the API's defaults, as kube-proxy
    /// reads them).
    pub fn from_slice(
        ready: Option<bool>,
        serving: Option<bool>,
        terminating: Option<bool>,
    ) -> Conditions {
        Conditions {
            ready: ready.unwrap_or(true),
            serving: serving.unwrap_or(true),
            terminating: terminating.unwrap_or(false),
        }
    }

    /// The same endpoint listed twice (two slices during a transition): the
    /// more usable reading of each condition.
    pub fn merge(self, other: Conditions) -> Conditions {
        Conditions {
            ready: self.ready || other.ready,
            serving: self.serving || other.serving,
            terminating: self.terminating && other.terminating,
        }
    }

    /// The slice's conditions, tightened by what the gateway knows of `w`.
    pub(super) fn for_workload(self, w: &Workload) -> Conditions {
        if w.spec.state == LifecycleState::Terminating {
            Conditions {
                ready: false,
                terminating: true,
                ..self
            }
        } else {
            self
        }
    }
}

/// One endpoint of one Service port.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub workload: Arc<Workload>,
    /// The workload's address the port maps to: its first of the family
    /// of the Service's first VIP, else its first ([`pick_ips`]).
    pub ip: IpAddr,
    /// Its first address of the other family, if it has one: what a
    /// connection to a VIP of that family reaches ([`Endpoint::ip_for`]).
    pub alt_ip: Option<IpAddr>,
    pub target_port: u16,
    pub conditions: Conditions,
    /// Its weight ([`EndpointTarget::capacity`]; 1 when its source gives
    /// none): new connections come to it in proportion.
    pub capacity: u32,
}

impl Endpoint {
    /// The address a connection to `dst` (a VIP of the Service) reaches:
    /// the endpoint's of `dst`'s family when it has one, else its other
    /// one: an endpoint of the other family only is reached, never dropped
    /// (ztunnel's choice by the original destination's family).
    pub fn ip_for(&self, dst: IpAddr) -> IpAddr {
        match self.alt_ip {
            Some(alt) if self.ip.is_ipv4() != dst.is_ipv4() => alt,
            _ => self.ip,
        }
    }
}

/// An endpoint's addresses (see [`Endpoint::ip`], [`Endpoint::alt_ip`]):
/// the first of `family_v4`'s family, else the first; then the first of
/// the other family. `None` without any address.
pub fn pick_ips(ips: &[IpAddr], family_v4: bool) -> Option<(IpAddr, Option<IpAddr>)> {
    let same = ips.iter().find(|ip| ip.is_ipv4() == family_v4).copied();
    let other = ips.iter().find(|ip| ip.is_ipv4() != family_v4).copied();
    match (same, other) {
        (Some(ip), alt) => Some((ip, alt)),
        (None, Some(ip)) => Some((ip, None)),
        (None, None) => None,
    }
}
