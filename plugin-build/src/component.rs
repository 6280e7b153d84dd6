//! Core module -> component, and what a component imports and exports.

use wasmparser::{Parser, Payload, TypeRef};
use wit_component::ComponentEncoder;

/// The only namespace a policy may import from.
pub const ALLOWED_IMPORT_PREFIX: &str = "tidegate:policy/";

/// What a policy must export (followed by `@<version>`).
pub const POLICY_EXPORT: &str = "tidegate:policy/policy@";

const NO_WASI: &str = "build for wasm32-unknown-unknown, not a WASI target, and do not use \
                       crates that need WASI or JavaScript glue";

/// Why a core module did not become a drain-policy component.
#[derive(Debug, thiserror::Error)]
pub enum ComponentError {
    /// The core module imports functions no policy world provides (WASI,
    /// wasm-bindgen, a hand-written `extern` block).
    #[error("imports outside {ALLOWED_IMPORT_PREFIX}: {} (in the core module; {NO_WASI})", .0.join(", "))]
    ForeignCoreImports(Vec<String>),
    /// `wit-component` refused the module for another reason.
    #[error("cannot turn the core module into a component: {0}")]
    Encode(String),
    /// The bytes are not valid WebAssembly.
    #[error("invalid WebAssembly: {0}")]
    Parse(#[from] wasmparser::BinaryReaderError),
    /// A core module where a component was expected.
    #[error("not a component (a core module?)")]
    NotComponent,
    /// The component imports something outside `tidegate:policy/…`.
    #[error("imports outside {ALLOWED_IMPORT_PREFIX}: {} ({NO_WASI})", .0.join(", "))]
    ForeignImports(Vec<String>),
    /// The component does not export the policy interface.
    #[error(
        "no {POLICY_EXPORT}<version> export (exports: [{}]); did the crate call \
         tidegate_sdk::export_policy!?",
        .0.join(", ")
    )]
    NoPolicyExport(Vec<String>),
}

/// A checked drain-policy component.
#[derive(Debug)]
pub struct Component {
    /// The component's bytes.
    pub bytes: Vec<u8>,
    /// Its top-level imports and exports.
    pub summary: Summary,
}

/// The one path from a `wit-bindgen` core module to a policy component:
/// encode, then refuse foreign imports and a missing policy export.
pub fn componentize(core: &[u8]) -> Result<Component, ComponentError> {
    let bytes = encode(core)?;
    let summary = inspect(&bytes)?;
    summary.check_imports()?;
    summary.check_exports()?;
    Ok(Component { bytes, summary })
}

/// Turns a core module built with `wit-bindgen` (which embeds the world in
/// a custom section) into a validated component. A module importing
/// functions outside the policy world is reported as such.
pub fn encode(core: &[u8]) -> Result<Vec<u8>, ComponentError> {
    let encoded = ComponentEncoder::default()
        .module(core)
        .and_then(|e| e.validate(true).encode());
    encoded.map_err(|e| match foreign_core_imports(core) {
        Ok(foreign) if !foreign.is_empty() => ComponentError::ForeignCoreImports(foreign),
        _ => ComponentError::Encode(format!("{e:#}")),
    })
}

/// `module::name` of every function a core module imports from outside the
/// policy interfaces (`tidegate:policy/…`, and `[export]tidegate:policy/…`
/// for the glue `wit-bindgen` generates for exports).
pub fn foreign_core_imports(core: &[u8]) -> Result<Vec<String>, ComponentError> {
    let mut foreign = Vec::new();
    for payload in Parser::new(0).parse_all(core) {
        if let Payload::ImportSection(reader) = payload? {
            for import in reader.into_imports() {
                let import = import?;
                let ours = import.module.starts_with(ALLOWED_IMPORT_PREFIX)
                    || import
                        .module
                        .strip_prefix("[export]")
                        .is_some_and(|m| m.starts_with(ALLOWED_IMPORT_PREFIX));
                if !ours && matches!(import.ty, TypeRef::Func(_)) {
                    foreign.push(format!("{}::{}", import.module, import.name));
                }
            }
        }
    }
    Ok(foreign)
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
    pub fn check_imports(&self) -> Result<(), ComponentError> {
        let foreign: Vec<String> = self
            .imports
            .iter()
            .filter(|name| !name.starts_with(ALLOWED_IMPORT_PREFIX))
            .cloned()
            .collect();
        if foreign.is_empty() {
            Ok(())
        } else {
            Err(ComponentError::ForeignImports(foreign))
        }
    }

    /// Fails unless `tidegate:policy/policy@<version>` is exported.
    pub fn check_exports(&self) -> Result<(), ComponentError> {
        if self.exports.iter().any(|e| e.starts_with(POLICY_EXPORT)) {
            Ok(())
        } else {
            Err(ComponentError::NoPolicyExport(self.exports.clone()))
        }
    }
}

/// Reads the top-level imports and exports of a component (nested modules
/// and components are skipped).
pub fn inspect(component: &[u8]) -> Result<Summary, ComponentError> {
    let mut summary = Summary::default();
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(component) {
        match payload? {
            Payload::Version { encoding, .. } => {
                if depth == 0 && encoding != wasmparser::Encoding::Component {
                    return Err(ComponentError::NotComponent);
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
        assert!(
            err.starts_with("imports outside tidegate:policy/: wasi:cli/environment@0.2.0 ("),
            "{err}"
        );
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
        assert!(matches!(inspect(&core), Err(ComponentError::NotComponent)));
    }

    #[test]
    fn a_component_without_the_policy_export_is_refused() {
        // A module with no embedded world encodes to an empty component.
        let empty = encode(&wat::parse_str("(module)").unwrap()).unwrap();
        let summary = inspect(&empty).unwrap();
        summary.check_imports().unwrap();
        let err = summary.check_exports().unwrap_err().to_string();
        assert!(
            err.starts_with("no tidegate:policy/policy@<version> export"),
            "{err}"
        );
        let err = componentize(&wat::parse_str("(module)").unwrap()).unwrap_err();
        assert!(matches!(err, ComponentError::NoPolicyExport(_)), "{err}");
    }

    #[test]
    fn a_core_module_importing_wasi_is_refused_by_name() {
        let module = wat::parse_str(
            r#"(module
                 (import "wasi_snapshot_preview1" "fd_write"
                   (func (param i32 i32 i32 i32) (result i32)))
                 (import "tidegate:policy/host@0.1.0" "now-ms" (func (result i64)))
                 (import "[export]tidegate:policy/policy@0.1.0" "[resource-drop]x" (func (param i32))))"#,
        )
        .unwrap();
        assert_eq!(
            foreign_core_imports(&module).unwrap(),
            vec!["wasi_snapshot_preview1::fd_write"]
        );
        let err = componentize(&module).unwrap_err();
        assert!(
            matches!(err, ComponentError::ForeignCoreImports(_)),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.starts_with("imports outside tidegate:policy/: wasi_snapshot_preview1::fd_write"),
            "{msg}"
        );
        assert!(msg.contains("wasm32-unknown-unknown"), "{msg}");
    }

    #[test]
    fn garbage_is_invalid_webassembly() {
        let err = componentize(b"not wasm").unwrap_err();
        assert!(
            matches!(err, ComponentError::Encode(_) | ComponentError::Parse(_)),
            "{err:?}"
        );
    }
}
