//! The contract version check, done on the compiled component before it is
//! ever instantiated.
//!
//! The host implements several contract versions ([`HOST_CONTRACTS`]). Rule
//! (also in sdk/README.md): while the major version is 0, a plugin is
//! accepted only when its major and minor equal those of one of them (patch
//! may differ); from 1.0 on, the major must be equal and the plugin's minor
//! must not be newer than the host's.
//!
//! How long an older contract is carried ([`CARRIED`], sdk/README.md "How
//! long a contract is carried"): the host implements the newest contract
//! and the two before it, so a plugin keeps loading across two contract
//! releases without a rebuild; the next release retires the oldest (0.4.0
//! retires 0.1). A plugin on an older contract loads with a log line naming
//! the release that retires it ([`retired_by`]).

use wasmtime::component::Component;
use wasmtime::Engine;

use super::error::LoadError;

/// The newest WIT package version this gateway implements (the SDK's).
pub const HOST_CONTRACT: &str = tidegate_sdk::CONTRACT_VERSION;

/// Every WIT package version this gateway implements, newest first.
pub const HOST_CONTRACTS: &[&str] = &[HOST_CONTRACT, "0.2.0", "0.1.0"];

/// How many contract versions the host carries: the newest and the two
/// before it. A test holds [`HOST_CONTRACTS`] to it.
pub const CARRIED: usize = 3;

/// For a plugin built for an older contract, the contract release that
/// retires it (`0.1.x` → `0.4.0`); `None` for a plugin on the newest.
pub fn retired_by(plugin: Version) -> Option<Version> {
    let newest = Version::parse(HOST_CONTRACT).expect("the host's version is valid");
    if newest.accepts(plugin) {
        return None;
    }
    let retiring = if plugin.major == 0 {
        Version {
            major: 0,
            minor: plugin.minor + CARRIED as u64,
            patch: 0,
        }
    } else {
        Version {
            major: plugin.major + 1,
            minor: 0,
            patch: 0,
        }
    };
    Some(retiring)
}

/// The contract versions the host has bindings for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contract {
    /// `init` returns nothing; every label and annotation is handed over.
    V0_1,
    /// `init` returns the metadata the policy reads.
    V0_2,
    /// As 0.2.0, and `decide` takes the event encoded in one buffer.
    V0_3,
}

impl Contract {
    fn of(v: Version) -> Option<Contract> {
        match (v.major, v.minor) {
            (0, 1) => Some(Contract::V0_1),
            (0, 2) => Some(Contract::V0_2),
            (0, 3) => Some(Contract::V0_3),
            _ => None,
        }
    }
}

fn host_versions() -> Vec<Version> {
    HOST_CONTRACTS
        .iter()
        .map(|v| Version::parse(v).expect("the host's versions are valid"))
        .collect()
}

/// "0.3.0, 0.2.0 and 0.1.0".
fn host_list() -> String {
    match HOST_CONTRACTS.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

const PACKAGE: &str = "tidegate:policy/";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

impl Version {
    pub fn parse(s: &str) -> Option<Version> {
        let core = s.split(['-', '+']).next()?;
        let mut it = core.split('.').map(|p| p.parse::<u64>().ok());
        let v = Version {
            major: it.next()??,
            minor: it.next()??,
            patch: it.next()??,
        };
        it.next().is_none().then_some(v)
    }

    /// Whether a host implementing `self` accepts a plugin built for `plugin`.
    pub fn accepts(self, plugin: Version) -> bool {
        if self.major == 0 {
            plugin.major == 0 && plugin.minor == self.minor
        } else {
            plugin.major == self.major && plugin.minor <= self.minor
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Checks exports and imports; returns the plugin's contract version and
/// the bindings that serve it.
pub fn check(engine: &Engine, component: &Component) -> Result<(Version, Contract), LoadError> {
    let ty = component.component_type();
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_owned()).collect();
    let policy = exports
        .iter()
        .find_map(|n| n.strip_prefix("tidegate:policy/policy@"))
        .ok_or_else(|| LoadError::NoPolicyExport(exports.join(", ")))?;
    let plugin = Version::parse(policy).ok_or_else(|| LoadError::IncompatibleVersion {
        plugin: policy.to_owned(),
        host: host_list(),
    })?;
    let incompatible = || LoadError::IncompatibleVersion {
        plugin: plugin.to_string(),
        host: host_list(),
    };
    let host = host_versions()
        .into_iter()
        .find(|h| h.accepts(plugin))
        .ok_or_else(incompatible)?;
    let contract = Contract::of(host).ok_or_else(incompatible)?;
    for (name, _) in ty.imports(engine) {
        let Some(rest) = name.strip_prefix(PACKAGE) else {
            return Err(LoadError::UnsupportedImport(name.to_owned()));
        };
        let version = rest.split_once('@').and_then(|(_, v)| Version::parse(v));
        if version.is_none_or(|v| !host.accepts(v)) {
            return Err(LoadError::IncompatibleVersion {
                plugin: name.to_owned(),
                host: host.to_string(),
            });
        }
    }
    Ok((plugin, contract))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_major_needs_equal_minor() {
        let host = Version::parse("0.1.0").unwrap();
        assert!(host.accepts(Version::parse("0.1.7").unwrap()));
        assert!(!host.accepts(Version::parse("0.2.0").unwrap()));
        assert!(!host.accepts(Version::parse("9.0.0").unwrap()));
        let one = Version::parse("1.3.0").unwrap();
        assert!(one.accepts(Version::parse("1.1.0").unwrap()));
        assert!(!one.accepts(Version::parse("1.4.0").unwrap()));
        assert!(!one.accepts(Version::parse("2.0.0").unwrap()));
        assert!(Version::parse("1.2").is_none());
    }

    #[test]
    fn every_listed_version_has_bindings() {
        for v in host_versions() {
            assert!(Contract::of(v).is_some(), "{v}");
        }
        assert_eq!(HOST_CONTRACTS[0], tidegate_sdk::CONTRACT_VERSION);
        assert_eq!(host_list(), "0.3.0, 0.2.0 and 0.1.0");
    }

    /// The host carries the newest contract and the two before it, no
    /// more and no fewer: adding a contract without retiring the oldest
    /// fails here.
    #[test]
    fn the_host_carries_the_newest_contract_and_the_two_before_it() {
        let versions = host_versions();
        assert_eq!(versions.len(), CARRIED, "{HOST_CONTRACTS:?}");
        for pair in versions.windows(2) {
            assert_eq!(pair[0].major, 0, "from 1.0 on, a major carries its minors");
            assert_eq!(pair[1].minor + 1, pair[0].minor, "{HOST_CONTRACTS:?}");
        }
        let oldest = *versions.last().unwrap();
        let newest = versions[0];
        assert_eq!(retired_by(newest), None);
        let retiring = retired_by(oldest).expect("the oldest is retired by a later release");
        assert_eq!(
            retiring.minor,
            newest.minor + 1,
            "the next release retires the oldest"
        );
        assert_eq!(
            retired_by(Version::parse("0.2.5").unwrap()).map(|v| v.to_string()),
            Some("0.5.0".to_owned())
        );
    }
}
