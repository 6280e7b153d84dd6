//! The contract version check, done on the compiled component before it is
//! ever instantiated.
//!
//! Rule (also in sdk/README.md): while the major version is 0, a plugin is
//! accepted only when major and minor equal the host's (patch may differ);
//! from 1.0 on, the major must be equal and the plugin's minor must not be
//! newer than the host's.

use wasmtime::component::Component;
use wasmtime::Engine;

use super::error::LoadError;

/// The WIT package version this gateway implements.
pub const HOST_CONTRACT: &str = tidegate_sdk::CONTRACT_VERSION;

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

/// Checks exports and imports; returns the plugin's contract version.
pub fn check(engine: &Engine, component: &Component) -> Result<Version, LoadError> {
    let host = Version::parse(HOST_CONTRACT).expect("the SDK's version is valid");
    let ty = component.component_type();
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_owned()).collect();
    let policy = exports
        .iter()
        .find_map(|n| n.strip_prefix("tidegate:policy/policy@"))
        .ok_or_else(|| LoadError::NoPolicyExport(exports.join(", ")))?;
    let plugin = Version::parse(policy).ok_or_else(|| LoadError::IncompatibleVersion {
        plugin: policy.to_owned(),
        host: host.to_string(),
    })?;
    if !host.accepts(plugin) {
        return Err(LoadError::IncompatibleVersion {
            plugin: plugin.to_string(),
            host: host.to_string(),
        });
    }
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
    Ok(plugin)
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
}
