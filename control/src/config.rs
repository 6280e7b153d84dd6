//! The `control_plane:` section: the limits the admin, metrics, readiness and CNI listeners share.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use tidegate_base::duration;

/// The most connections `control_plane.max_connections` and
/// `control_plane.cni_max_connections` may allow each.
pub const CONTROL_PLANE_MAX_CONNECTIONS: u64 = 1_024;

/// `control_plane`: the admin (127.0.0.1:15000), metrics (15020), readiness
/// (15021) and CNI socket listeners. Their connection caps are small and
/// fixed so that together they can never take the descriptors the data path
/// needs (the budget is checked at start, see `control/src/limits.rs`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControlPlaneConfig {
    /// An HTTP request's head (request line and headers) must arrive within
    /// this, and an idle keep-alive connection is closed after it.
    #[serde(with = "duration")]
    pub header_read_timeout: Duration,
    /// Connections open at once on each of the admin, metrics and readiness
    /// listeners; beyond it a new connection is closed at once.
    pub max_connections: u32,
    /// The CNI socket: a peer's request line must arrive within this.
    #[serde(with = "duration")]
    pub cni_read_timeout: Duration,
    /// Connections open at once on the CNI socket (one per pod deletion in
    /// progress, held while the pod drains).
    pub cni_max_connections: u32,
}

impl Default for ControlPlaneConfig {
    fn default() -> Self {
        ControlPlaneConfig {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 32,
            cni_read_timeout: Duration::from_secs(5),
            cni_max_connections: 256,
        }
    }
}
