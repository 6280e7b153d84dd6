//! Outbound through a waypoint (ztunnel's `build_request`): a destination
//! with a waypoint ([`crate::workloads::waypoint`]) is reached over HBONE
//! to the waypoint, the CONNECT authority being the original destination
//! (the Service VIP:port, or the workload's address:port), so the
//! waypoint's L7 policy applies.
//!
//! - The waypoint's address is its Service's VIP (one of its endpoints is
//!   chosen, as for any Service, on the waypoint's HBONE port) or a
//!   workload's address; a hostname names its Service.
//! - A source that is the waypoint itself goes straight to the
//!   destination (`check_from_waypoint`): the waypoint's own outbound
//!   traffic is what it decided to send.
//! - A waypoint on another network, a waypoint that is no known Service
//!   or workload, or one with no endpoint, refuses the connection with a
//!   reason ([`WaypointError`]) and a count
//!   (`tidegate_outbound_waypoint_total{result}`): never around it, never
//!   in plaintext. So does a destination on another network (behind a
//!   network gateway).

use std::net::IpAddr;
use std::sync::Arc;

use crate::proxy::endpoints::EndpointPicker;
use crate::workloads::waypoint::{Waypoint, WaypointAddress};
use crate::workloads::{Workload, WorkloadSnapshot};
use tidegate_protocol::identity::SpiffeId;

#[derive(Debug, thiserror::Error)]
pub enum WaypointError {
    #[error("the waypoint of {destination} is on another network (double HBONE is not supported): refused, not sent around it")]
    OtherNetwork { destination: String },
    #[error("the waypoint of {destination} ({address}) is no known Service or workload: refused, not sent around it")]
    Unknown {
        destination: String,
        address: String,
    },
    #[error(
        "the waypoint of {destination} ({address}) has no endpoint: refused, not sent around it"
    )]
    NoEndpoint {
        destination: String,
        address: String,
    },
    #[error(
        "{destination} is on another network (reachable only through a network gateway): refused"
    )]
    DestinationOnOtherNetwork { destination: String },
}

impl WaypointError {
    pub fn reason(&self) -> &'static str {
        match self {
            WaypointError::OtherNetwork { .. } => "waypoint_other_network",
            WaypointError::Unknown { .. } => "waypoint_unknown",
            WaypointError::NoEndpoint { .. } => "waypoint_no_endpoint",
            WaypointError::DestinationOnOtherNetwork { .. } => "other_network",
        }
    }
}

/// The waypoint a connection is tunneled to.
#[derive(Debug)]
pub struct Via {
    pub workload: Arc<Workload>,
    /// The address its gateway is reached at.
    pub ip: IpAddr,
    /// Identities it may present beside its own: its Service's
    /// `subject_alt_names` (ztunnel: the waypoint's identity plus its
    /// Service's SANs).
    pub also: Vec<SpiffeId>,
}

/// The waypoint to tunnel to; `None` when `source` is that waypoint
/// (straight to the destination).
pub fn resolve(
    snapshot: &WorkloadSnapshot,
    picker: &EndpointPicker,
    wp: &Waypoint,
    destination: &str,
    source: Option<&Workload>,
) -> Result<Option<Via>, WaypointError> {
    if wp.remote_network {
        return Err(WaypointError::OtherNetwork {
            destination: destination.to_owned(),
        });
    }
    let address = || match &wp.address {
        WaypointAddress::Ip(ip) => ip.to_string(),
        WaypointAddress::Hostname {
            namespace,
            hostname,
        } => format!("{namespace}/{hostname}"),
    };
    let service = match &wp.address {
        WaypointAddress::Ip(ip) => snapshot.service_by_vip(*ip, wp.port),
        // Waypoints are named by address in practice; a hostname is
        // looked up among the Services.
        WaypointAddress::Hostname {
            namespace,
            hostname,
        } => snapshot.services().find(|s| {
            s.spec.namespace == *namespace && s.spec.hostname.as_deref() == Some(hostname)
        }),
    };
    let (target, ip, also) = match (service, &wp.address) {
        (Some(svc), _) => {
            let e = picker
                .pick(svc, wp.port)
                .ok_or_else(|| WaypointError::NoEndpoint {
                    destination: destination.to_owned(),
                    address: address(),
                })?;
            // The waypoint's address of its VIP's family, as for any Service.
            let ip = match &wp.address {
                WaypointAddress::Ip(vip) => e.ip_for(*vip),
                WaypointAddress::Hostname { .. } => e.ip,
            };
            (e.workload.clone(), ip, svc.spec.subject_alt_names.clone())
        }
        (None, WaypointAddress::Ip(ip)) => match snapshot.by_ip(*ip) {
            Some(w) => (w.clone(), *ip, Vec::new()),
            None => {
                return Err(WaypointError::Unknown {
                    destination: destination.to_owned(),
                    address: address(),
                })
            }
        },
        (None, WaypointAddress::Hostname { .. }) => {
            return Err(WaypointError::Unknown {
                destination: destination.to_owned(),
                address: address(),
            })
        }
    };
    if source.is_some_and(|s| s.uid() == target.uid()) {
        return Ok(None);
    }
    Ok(Some(Via {
        workload: target,
        ip,
        also,
    }))
}
