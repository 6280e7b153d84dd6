//! The `shutdown:` and `drains:` sections.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use tidegate_base::duration;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownConfig {
    /// After SIGTERM, open streams get this long to finish before they are closed.
    #[serde(with = "duration")]
    pub deadline: Duration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig {
            deadline: Duration::from_secs(10),
        }
    }
}

/// How drains are executed.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DrainsConfig {
    /// Longest a network teardown is held for a drain (also `max-hold-ms` in events).
    #[serde(with = "duration")]
    pub max_hold: Duration,
    /// Grace period assumed when a source does not give one (workload file).
    #[serde(with = "duration")]
    pub default_grace: Duration,
    /// Hard deadline of a GOAWAY whose action names none.
    #[serde(with = "duration")]
    pub default_goaway_deadline: Duration,
    /// Unix socket `tidegate-cni` asks on CNI DEL; unset: no CNI hook.
    pub cni_socket: Option<PathBuf>,
}

impl Default for DrainsConfig {
    fn default() -> Self {
        DrainsConfig {
            max_hold: Duration::from_secs(30),
            default_grace: Duration::from_secs(30),
            default_goaway_deadline: Duration::from_secs(30),
            cni_socket: None,
        }
    }
}
