//! Waypoints: the L7 proxy istiod names for a Service or a workload
//! (`waypoint`, `weighted_waypoints`). Traffic to such a destination goes
//! over HBONE to the waypoint, with the original destination as the
//! CONNECT authority, so the waypoint's L7 policy applies — never around
//! it (the routing is `proxy/waypoint.rs`). Only istiod names waypoints;
//! the workload file and Kubernetes discovery have none.

use std::net::IpAddr;

use serde::Serialize;

/// Where a destination's waypoint is.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaypointAddress {
    /// A Service VIP (the waypoint's Service: one of its endpoints is
    /// chosen) or a workload's address.
    Ip(IpAddr),
    /// A Service by hostname (`namespace`, `hostname`).
    Hostname { namespace: String, hostname: String },
}

/// A destination's waypoint.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Waypoint {
    pub address: WaypointAddress,
    /// The waypoint's HBONE port as istiod gives it (`hbone_mtls_port`).
    pub port: u16,
    /// On another network than its destination: reaching it needs double
    /// HBONE through a network gateway, which tidegate does not speak —
    /// such traffic is refused, never sent around the waypoint.
    pub remote_network: bool,
    /// Its weight among a Service's `weighted_waypoints` (1 for a single
    /// `waypoint`).
    pub weight: u32,
}

impl Waypoint {
    /// One of `waypoints`, by weight (ztunnel picks one per connection).
    /// `None` when there is none.
    pub fn pick(waypoints: &[Waypoint]) -> Option<&Waypoint> {
        let total: u64 = waypoints.iter().map(|w| u64::from(w.weight)).sum();
        if total == 0 {
            return waypoints.first();
        }
        let mut at = fastrand::u64(0..total);
        for w in waypoints {
            let weight = u64::from(w.weight);
            if at < weight {
                return Some(w);
            }
            at -= weight;
        }
        waypoints.last()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wp(last: u8, weight: u32) -> Waypoint {
        Waypoint {
            address: WaypointAddress::Ip(IpAddr::from([10, 0, 0, last])),
            port: 15008,
            remote_network: false,
            weight,
        }
    }

    #[test]
    fn a_pick_follows_the_weights_and_never_takes_a_zero_weight() {
        let all = [wp(1, 3), wp(2, 0), wp(3, 1)];
        let mut counts = [0u32; 3];
        for _ in 0..4000 {
            let got = Waypoint::pick(&all).unwrap();
            let i = all.iter().position(|w| w == got).unwrap();
            counts[i] += 1;
        }
        assert_eq!(counts[1], 0, "weight 0 is never picked");
        // 3:1 within a wide margin (4,000 draws: 3,000 ± ~55 σ=27).
        assert!((2700..3300).contains(&counts[0]), "{counts:?}");
        assert!(Waypoint::pick(&[]).is_none());
        assert_eq!(
            Waypoint::pick(&[wp(4, 0)]),
            Some(&wp(4, 0)),
            "all zero: the first"
        );
    }
}
