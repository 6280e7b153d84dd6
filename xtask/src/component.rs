//! Core module -> component, and what a component imports and exports.

use anyhow::{bail, Result};
use wasmparser::{Parser, Payload};
use wit_component::ComponentEncoder;

/// The only namespace a policy may import from.
pub const ALLOWED_IMPORT_PREFIX: &str = "tidegate:policy/";

/// What a policy must export (followed by `@<version>`).
pub const POLICY_EXPORT: &str = "tidegate:policy/policy@";

/// Turns a core module built with `wit-bindgen` (which embeds the world in
/// a custom section) into a validated component.
pub fn encode(core: &[u8]) -> Result<Vec<u8>> {
    ComponentEncoder::default()
        .module(core)?
        .validate(true)
        .encode()
}

/// The top-level import and export names of a component.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub imports: Vec<String>,
    pub exports: Vec<String>,
}

impl Summary {
    /// Fails when anything outside `tidegate:policy/…` is imported (WASI
    /// would show up here).
    pub fn check_imports(&self) -> Result<()> {
        let foreign: Vec<&str> = self
            .imports
            .iter()
            .map(String::as_str)
            .filter(|name| !name.starts_with(ALLOWED_IMPORT_PREFIX))
            .collect();
        if !foreign.is_empty() {
            bail!(
                "imports outside {ALLOWED_IMPORT_PREFIX}: {} (build for wasm32-unknown-unknown, \
                 not a WASI target, and do not use crates that need WASI)",
                foreign.join(", ")
            );
        }
        Ok(())
    }

    /// Fails unless `tidegate:policy/policy@<version>` is exported.
    pub fn check_exports(&self) -> Result<()> {
        if !self.exports.iter().any(|e| e.starts_with(POLICY_EXPORT)) {
            bail!(
                "no {POLICY_EXPORT}<version> export (exports: [{}]); did the crate call \
                 tidegate_sdk::export_policy!?",
                self.exports.join(", ")
            );
        }
        Ok(())
    }
}

/// Reads the top-level imports and exports of a component (nested modules
/// and components are skipped).
pub fn inspect(component: &[u8]) -> Result<Summary> {
    let mut summary = Summary::default();
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(component) {
        match payload? {
            Payload::Version { encoding, .. } => {
                if depth == 0 && encoding != wasmparser::Encoding::Component {
                    bail!("not a component (a core module?)");
                }
                depth += 1;
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 1 => {
                for import in reader {
                    summary.imports.push(import?.name.name.to_owned());
                }
            }
            Payload::ComponentExportSection(reader) if depth == 1 => {
                for export in reader {
                    summary.exports.push(export?.name.name.to_owned());
                }
            }
            _ => {}
        }
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_level_imports_are_listed_and_foreign_ones_refused() {
        let wasi = wat::parse_str(
            r#"(component
                 (import "tidegate:policy/host@0.1.0" (instance))
                 (import "wasi:cli/environment@0.2.0" (instance))
                 (component (import "wasi:nested/ignored" (instance)))
               )"#,
        )
        .unwrap();
        let summary = inspect(&wasi).unwrap();
        assert_eq!(
            summary.imports,
            vec!["tidegate:policy/host@0.1.0", "wasi:cli/environment@0.2.0"]
        );
        let err = summary.check_imports().unwrap_err().to_string();
        assert!(err.contains("wasi:cli/environment@0.2.0"), "{err}");
        assert!(!err.contains("tidegate:policy/host"), "{err}");
    }

    #[test]
    fn tidegate_only_imports_pass_and_exports_are_listed() {
        let ok = wat::parse_str(
            r#"(component
                 (import "tidegate:policy/host@0.1.0" (instance $h))
                 (export "tidegate:policy/policy@0.1.0" (instance $h))
               )"#,
        )
        .unwrap();
        let summary = inspect(&ok).unwrap();
        summary.check_imports().unwrap();
        assert_eq!(summary.exports, vec!["tidegate:policy/policy@0.1.0"]);
        summary.check_exports().unwrap();
    }

    #[test]
    fn core_modules_are_not_components() {
        let core = wat::parse_str("(module)").unwrap();
        assert!(inspect(&core)
            .unwrap_err()
            .to_string()
            .contains("not a component"));
    }

    #[test]
    fn a_component_without_the_policy_export_is_refused() {
        // A module with no embedded world encodes to an empty component.
        let empty = encode(&wat::parse_str("(module)").unwrap()).unwrap();
        let summary = inspect(&empty).unwrap();
        summary.check_imports().unwrap();
        let err = summary.check_exports().unwrap_err().to_string();
        assert!(err.contains("tidegate:policy/policy@"), "{err}");
    }

    #[test]
    fn a_core_import_outside_the_world_cannot_be_encoded() {
        let module = wat::parse_str(
            r#"(module (import "wasi_snapshot_preview1" "fd_write"
                 (func (param i32 i32 i32 i32) (result i32))))"#,
        )
        .unwrap();
        assert!(encode(&module).is_err());
    }
}
