//! Running cargo: `cargo metadata` (which crates build a cdylib, where the
//! target dir is) and `cargo build --target wasm32-unknown-unknown`.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use serde::Deserialize;

use crate::wasm_target::WASM_TARGET;

/// Why a cargo command did not give what we need.
#[derive(Debug, thiserror::Error)]
pub enum CargoError {
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}){}", stderr_suffix(.stderr))]
    Failed {
        command: String,
        status: ExitStatus,
        /// Captured stderr (empty when it went to the terminal).
        stderr: String,
    },
    #[error("cannot parse the output of cargo metadata: {0}")]
    Metadata(#[from] serde_json::Error),
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.trim().is_empty() {
        String::new()
    } else {
        format!(": {}", stderr.trim())
    }
}

/// The cargo to run: `$CARGO` (set by cargo for `cargo run`, tests and
/// build scripts), else `cargo` from `PATH`.
pub fn program() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// What `cargo metadata --no-deps` says about a workspace.
#[derive(Debug, Deserialize)]
pub struct Metadata {
    pub packages: Vec<Package>,
    /// Honours `CARGO_TARGET_DIR` and `build.target-dir`.
    pub target_directory: PathBuf,
}

#[derive(Debug, Deserialize)]
pub struct Package {
    pub name: String,
    pub manifest_path: PathBuf,
    pub targets: Vec<Target>,
}

#[derive(Debug, Deserialize)]
pub struct Target {
    pub name: String,
    pub crate_types: Vec<String>,
}

impl Package {
    /// The library target when it builds a cdylib (a core module on wasm32).
    pub fn cdylib(&self) -> Option<&Target> {
        self.targets
            .iter()
            .find(|t| t.crate_types.iter().any(|c| c == "cdylib"))
    }
}

impl Target {
    /// File name of the core module cargo writes for this library.
    pub fn core_module_file(&self) -> String {
        format!("{}.wasm", self.name.replace('-', "_"))
    }
}

impl Metadata {
    /// Where cargo writes the wasm32 artifacts of `profile` (`debug`, `release`).
    pub fn wasm_dir(&self, profile: &str) -> PathBuf {
        self.target_directory.join(WASM_TARGET).join(profile)
    }
}

/// `cargo metadata --format-version 1 --no-deps` for `manifest`.
pub fn metadata(manifest: &Path) -> Result<Metadata, CargoError> {
    let mut cmd = Command::new(program());
    cmd.args([
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
        "--manifest-path",
    ])
    .arg(manifest)
    .current_dir(config_dir(manifest));
    let output = cmd.output().map_err(spawn_error)?;
    if !output.status.success() {
        return Err(CargoError::Failed {
            command: describe(&cmd),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// `cargo build --target wasm32-unknown-unknown --manifest-path <manifest>
/// <extra…>`, with cargo's progress on the terminal.
pub fn build_wasm(manifest: &Path, extra: &[&OsStr]) -> Result<(), CargoError> {
    let mut cmd = Command::new(program());
    cmd.args(["build", "--target", WASM_TARGET, "--manifest-path"])
        .arg(manifest)
        .args(extra)
        .current_dir(config_dir(manifest));
    let status = cmd.status().map_err(spawn_error)?;
    if !status.success() {
        return Err(CargoError::Failed {
            command: describe(&cmd),
            status,
            stderr: String::new(),
        });
    }
    Ok(())
}

/// Cargo reads `.cargo/config.toml` from the working directory up, not
/// from the manifest's: run it beside the manifest so the crate's own
/// configuration applies.
fn config_dir(manifest: &Path) -> &Path {
    match manifest.parent() {
        Some(dir) if !dir.as_os_str().is_empty() && dir.is_dir() => dir,
        _ => Path::new("."),
    }
}

fn spawn_error(source: std::io::Error) -> CargoError {
    CargoError::Spawn {
        program: program().to_string_lossy().into_owned(),
        source,
    }
}

/// `cargo build …` as one would type it (the program's file name, not its path).
fn describe(cmd: &Command) -> String {
    let program = Path::new(cmd.get_program())
        .file_name()
        .unwrap_or(cmd.get_program())
        .to_string_lossy()
        .into_owned();
    std::iter::once(program)
        .chain(cmd.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_names_the_cdylib_and_its_core_module() {
        let json = r#"{"target_directory": "/r/target", "packages": [
          {"name": "my-policy", "manifest_path": "/r/my-policy/Cargo.toml",
           "targets": [{"name": "my-policy", "crate_types": ["cdylib", "rlib"]}]},
          {"name": "helper", "manifest_path": "/r/helper/Cargo.toml",
           "targets": [{"name": "helper", "crate_types": ["lib"]}]}
        ]}"#;
        let m: Metadata = serde_json::from_str(json).unwrap();
        let lib = m.packages[0].cdylib().unwrap();
        assert_eq!(lib.core_module_file(), "my_policy.wasm");
        assert!(m.packages[1].cdylib().is_none());
        assert_eq!(
            m.wasm_dir("release"),
            Path::new("/r/target/wasm32-unknown-unknown/release")
        );
    }

    #[test]
    fn a_failing_cargo_is_reported_with_its_command() {
        let err = metadata(Path::new("/nonexistent/dir/Cargo.toml")).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(
                "metadata --format-version 1 --no-deps --manifest-path /nonexistent/dir/Cargo.toml"
            ),
            "{msg}"
        );
        assert!(matches!(err, CargoError::Failed { .. }), "{err:?}");
    }
}
