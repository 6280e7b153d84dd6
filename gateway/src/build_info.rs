//! What this binary is: its version, the commit and profile it was built
//! from, and the contract and protocol versions it speaks. Printed by
//! `tidegate version`, answered by the admin API's `GET /version` (a second
//! gateway names the one holding the node's ports with it).

use serde::Serialize;

/// The crate version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit (12 hex digits) in a release build, "unknown" when built
/// outside a git checkout, "dev" in a debug build unless asked
/// (`gateway/build.rs`).
pub const COMMIT: &str = env!("BUILD_GIT_COMMIT");
/// `debug` or `release`: whether debug assertions are compiled in.
pub const PROFILE: &str = if cfg!(debug_assertions) {
    "debug"
} else {
    "release"
};

/// The versions a peer or a plugin must match. Field names are the stable
/// `-o json` keys of `tidegate version` (docs/cli.md).
#[derive(Clone, Debug, Serialize)]
pub struct BuildInfo {
    pub version: &'static str,
    pub commit: &'static str,
    pub profile: &'static str,
    /// WIT packages (`tidegate:policy@…`) the plugin host loads, newest first.
    pub policy_contracts: Vec<String>,
    /// The ZDS hello version announced to istio-cni's node agent
    /// (`istio.workload.zds.Version`).
    pub zds_version: i32,
    /// Delta ADS method and the xDS type URLs subscribed to.
    pub xds_method: &'static str,
    pub xds_type_urls: [&'static str; 2],
    /// HBONE: HTTP/2 CONNECT over mTLS.
    pub hbone: &'static str,
}

impl BuildInfo {
    pub fn get() -> BuildInfo {
        BuildInfo {
            version: VERSION,
            commit: COMMIT,
            profile: PROFILE,
            policy_contracts: tidegate_policy_host::version::HOST_CONTRACTS
                .iter()
                .map(|v| format!("tidegate:policy@{v}"))
                .collect(),
            zds_version: tidegate_zds::messages::Version::V1 as i32,
            xds_method: tidegate_xds::envelope::DELTA_ADS,
            xds_type_urls: [
                tidegate_xds::client::ADDRESS,
                tidegate_xds::client::AUTHORIZATION,
            ],
            hbone: "HTTP/2 CONNECT over mTLS (TLS 1.3, ALPN h2), port 15008",
        }
    }
}
