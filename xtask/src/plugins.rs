//! `cargo xtask plugins`: wasm32 build, component encoding, import check.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::component;

const WASM_TARGET: &str = "wasm32-unknown-unknown";

/// Builds every plugin of `<root>/plugins` into `out`.
pub fn build_all(root: &Path, out: &Path) -> Result<()> {
    let plugins_dir = root.join("plugins");
    let target_dir = root.join("target").join("plugins").join("cargo");
    ensure_wasm_target()?;
    let plugins = list_plugins(&plugins_dir)?;

    let status = Command::new(cargo())
        .current_dir(&plugins_dir)
        .args(["build", "--release", "--workspace", "--target", WASM_TARGET])
        .arg("--target-dir")
        .arg(&target_dir)
        .status()
        .context("running cargo build for the plugins")?;
    if !status.success() {
        bail!(
            "cargo build --target {WASM_TARGET} in {} failed ({status})",
            plugins_dir.display()
        );
    }

    let core_dir = target_dir.join(WASM_TARGET).join("release");
    for plugin in &plugins {
        let core_path = core_dir.join(format!("{}.wasm", plugin.lib_name));
        let core = std::fs::read(&core_path)
            .with_context(|| format!("reading the core module {}", core_path.display()))?;
        let bytes = component::encode(&core)
            .with_context(|| format!("turning {} into a component", plugin.name))?;
        let summary = component::inspect(&bytes)
            .with_context(|| format!("inspecting the component of {}", plugin.name))?;
        summary
            .check_imports()
            .and_then(|()| summary.check_exports())
            .with_context(|| format!("plugin {} is not a drain policy", plugin.name))?;
        let path = out.join(&plugin.out_name);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&path, &bytes).with_context(|| format!("writing {}", path.display()))?;
        println!(
            "{:<34} {:>8} bytes  imports [{}]  exports [{}]",
            plugin.out_name.display().to_string(),
            bytes.len(),
            summary.imports.join(", "),
            summary.exports.join(", ")
        );
    }
    println!("{} plugins in {}", plugins.len(), out.display());
    Ok(())
}

/// The cargo that runs us (cargo sets `CARGO` for `cargo run`).
fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

/// Installs the wasm target with rustup when it is missing.
fn ensure_wasm_target() -> Result<()> {
    let listed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context(
            "running `rustup target list --installed` (is rustup on PATH? without rustup, \
             install the wasm32-unknown-unknown standard library for your toolchain yourself)",
        )?;
    if !listed.status.success() {
        bail!(
            "`rustup target list --installed` failed ({}): {}",
            listed.status,
            String::from_utf8_lossy(&listed.stderr).trim()
        );
    }
    if target_listed(&String::from_utf8_lossy(&listed.stdout)) {
        return Ok(());
    }
    eprintln!(
        "xtask: the {WASM_TARGET} target is missing; running `rustup target add {WASM_TARGET}`"
    );
    let status = Command::new("rustup")
        .args(["target", "add", WASM_TARGET])
        .status()
        .context("running `rustup target add`")?;
    if !status.success() {
        bail!(
            "`rustup target add {WASM_TARGET}` failed ({status}); plugins cannot be built without \
             it. Check network access to static.rust-lang.org, or install the target offline, \
             then run `cargo xtask plugins` again"
        );
    }
    Ok(())
}

/// Whether `rustup target list --installed` output names the wasm target.
fn target_listed(stdout: &str) -> bool {
    stdout.lines().any(|l| l.trim() == WASM_TARGET)
}

/// A crate of the plugins workspace that builds a cdylib.
#[derive(Debug, PartialEq, Eq)]
pub struct Plugin {
    /// Package name, e.g. `fixture-trap`.
    pub name: String,
    /// Library target name: the core module is `<lib_name>.wasm`.
    pub lib_name: String,
    /// Output path relative to the out dir: `recommended.wasm`,
    /// `fixtures/trap.wasm`.
    pub out_name: PathBuf,
}

#[derive(Deserialize)]
struct Metadata {
    packages: Vec<Package>,
}

#[derive(Deserialize)]
struct Package {
    name: String,
    manifest_path: PathBuf,
    targets: Vec<Target>,
}

#[derive(Deserialize)]
struct Target {
    name: String,
    crate_types: Vec<String>,
}

fn list_plugins(plugins_dir: &Path) -> Result<Vec<Plugin>> {
    let output = Command::new(cargo())
        .current_dir(plugins_dir)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .context("running cargo metadata for the plugins workspace")?;
    if !output.status.success() {
        bail!(
            "cargo metadata in {} failed: {}",
            plugins_dir.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let metadata: Metadata =
        serde_json::from_slice(&output.stdout).context("parsing cargo metadata")?;
    plugins_from_metadata(plugins_dir, metadata)
}

fn plugins_from_metadata(plugins_dir: &Path, metadata: Metadata) -> Result<Vec<Plugin>> {
    let mut plugins = Vec::new();
    for package in metadata.packages {
        let Some(lib) = package
            .targets
            .iter()
            .find(|t| t.crate_types.iter().any(|c| c == "cdylib"))
        else {
            continue;
        };
        let dir = package
            .manifest_path
            .parent()
            .context("manifest path has no parent")?;
        let rel = dir
            .strip_prefix(plugins_dir)
            .with_context(|| format!("{} is outside {}", dir.display(), plugins_dir.display()))?;
        // plugins/<name> -> <name>.wasm; plugins/fixtures/<name> -> fixtures/<name>.wasm
        let out_name = rel.with_extension("wasm");
        plugins.push(Plugin {
            name: package.name,
            lib_name: lib.name.replace('-', "_"),
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
    fn the_installed_target_is_recognised_exactly() {
        assert!(target_listed(
            "x86_64-unknown-linux-gnu\nwasm32-unknown-unknown\n"
        ));
        assert!(!target_listed("x86_64-unknown-linux-gnu\nwasm32-wasip2\n"));
        assert!(!target_listed("wasm32-unknown-unknown-extra\n"));
    }

    #[test]
    fn output_names_follow_the_directory_layout() {
        let json = r#"{"packages": [
          {"name": "fixture-trap", "manifest_path": "/r/plugins/fixtures/trap/Cargo.toml",
           "targets": [{"name": "fixture-trap", "crate_types": ["cdylib", "rlib"]}]},
          {"name": "recommended", "manifest_path": "/r/plugins/recommended/Cargo.toml",
           "targets": [{"name": "recommended", "crate_types": ["cdylib", "rlib"]}]},
          {"name": "helper", "manifest_path": "/r/plugins/helper/Cargo.toml",
           "targets": [{"name": "helper", "crate_types": ["lib"]}]}
        ]}"#;
        let plugins =
            plugins_from_metadata(Path::new("/r/plugins"), serde_json::from_str(json).unwrap())
                .unwrap();
        assert_eq!(
            plugins,
            vec![
                Plugin {
                    name: "fixture-trap".into(),
                    lib_name: "fixture_trap".into(),
                    out_name: "fixtures/trap.wasm".into(),
                },
                Plugin {
                    name: "recommended".into(),
                    lib_name: "recommended".into(),
                    out_name: "recommended.wasm".into(),
                },
            ]
        );
    }
}
