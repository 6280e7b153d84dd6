//! `cargo xtask plugins`: every crate of `plugins/` built for wasm32 and
//! turned into a checked component by `tidegate-plugin-build` (the same
//! code as `tidegate-plugin build`).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tidegate_plugin_build::cargo::{self, Metadata};
use tidegate_plugin_build::{component, wasm_target};

/// Builds every plugin of `<root>/plugins` into `out`.
pub fn build_all(root: &Path, out: &Path) -> Result<()> {
    let plugins_dir = root.join("plugins");
    let manifest = plugins_dir.join("Cargo.toml");
    let target_dir = root.join("target").join("plugins").join("cargo");
    wasm_target::ensure(&plugins_dir)?;
    let plugins = plugins_from_metadata(&plugins_dir, cargo::metadata(&manifest)?)?;

    cargo::build_wasm(
        &manifest,
        &[
            OsStr::new("--release"),
            OsStr::new("--workspace"),
            OsStr::new("--target-dir"),
            target_dir.as_os_str(),
        ],
    )?;

    let core_dir = target_dir
        .join(tidegate_plugin_build::WASM_TARGET)
        .join("release");
    for plugin in &plugins {
        let core_path = core_dir.join(&plugin.core_file);
        let core = std::fs::read(&core_path)
            .with_context(|| format!("reading the core module {}", core_path.display()))?;
        let built = component::componentize(&core)
            .with_context(|| format!("plugin {} is not a drain policy", plugin.name))?;
        let path = out.join(&plugin.out_name);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&path, &built.bytes)
            .with_context(|| format!("writing {}", path.display()))?;
        println!(
            "{:<34} {:>8} bytes  imports [{}]  exports [{}]",
            plugin.out_name.display().to_string(),
            built.bytes.len(),
            built.summary.imports.join(", "),
            built.summary.exports.join(", ")
        );
    }
    println!("{} plugins in {}", plugins.len(), out.display());
    Ok(())
}

/// A crate of the plugins workspace that builds a cdylib.
#[derive(Debug, PartialEq, Eq)]
pub struct Plugin {
    /// Package name, e.g. `fixture-trap`.
    pub name: String,
    /// The core module cargo writes: `fixture_trap.wasm`.
    pub core_file: String,
    /// Output path relative to the out dir: `recommended.wasm`,
    /// `fixtures/trap.wasm`.
    pub out_name: PathBuf,
}

fn plugins_from_metadata(plugins_dir: &Path, metadata: Metadata) -> Result<Vec<Plugin>> {
    let plugins_dir = plugins_dir
        .canonicalize()
        .unwrap_or_else(|_| plugins_dir.to_owned());
    let mut plugins = Vec::new();
    for package in &metadata.packages {
        let Some(lib) = package.cdylib() else {
            continue;
        };
        let dir = package
            .manifest_path
            .parent()
            .context("manifest path has no parent")?;
        let rel = dir
            .strip_prefix(&plugins_dir)
            .with_context(|| format!("{} is outside {}", dir.display(), plugins_dir.display()))?;
        // plugins/<name> -> <name>.wasm; plugins/fixtures/<name> -> fixtures/<name>.wasm
        let out_name = rel.with_extension("wasm");
        plugins.push(Plugin {
            name: package.name.clone(),
            core_file: lib.core_module_file(),
            out_name,
        });
    }
    if plugins.is_empty() {
        bail!("no cdylib crates in {}", plugins_dir.display());
    }
    plugins.sort_by(|a, b| a.out_name.cmp(&b.out_name));
    Ok(plugins)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_names_follow_the_directory_layout() {
        let json = r#"{"target_directory": "/r/target", "packages": [
          {"name": "fixture-trap", "manifest_path": "/r/plugins/fixtures/trap/Cargo.toml",
           "targets": [{"name": "fixture-trap", "crate_types": ["cdylib", "rlib"]}]},
          {"name": "recommended", "manifest_path": "/r/plugins/recommended/Cargo.toml",
           "targets": [{"name": "recommended", "crate_types": ["cdylib", "rlib"]}]},
          {"name": "helper", "manifest_path": "/r/plugins/helper/Cargo.toml",
           "targets": [{"name": "helper", "crate_types": ["lib"]}]}
        ]}"#;
        let metadata: Metadata = serde_json::from_str(json).unwrap();
        let plugins = plugins_from_metadata(Path::new("/r/plugins"), metadata).unwrap();
        assert_eq!(
            plugins,
            vec![
                Plugin {
                    name: "fixture-trap".into(),
                    core_file: "fixture_trap.wasm".into(),
                    out_name: "fixtures/trap.wasm".into(),
                },
                Plugin {
                    name: "recommended".into(),
                    core_file: "recommended.wasm".into(),
                    out_name: "recommended.wasm".into(),
                },
            ]
        );
    }
}
