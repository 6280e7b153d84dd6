//! Clippy inside the test build.
//!
//! Every build xtask runs of the main workspace compiles the workspace's own
//! crates with `clippy-driver` as `RUSTC_WORKSPACE_WRAPPER` and
//! `-D warnings`: what `cargo clippy --workspace --all-targets -- -D
//! warnings` reports, reported by the build the tests run from. A separate
//! `cargo clippy` type-checks every dependency once more (metadata only,
//! nothing shared with a build that generates code): 11 of the 68 minutes of
//! the last CI run. Dependencies are compiled by plain rustc either way.
//!
//! `cargo xtask test` needs clippy (`rustup component add clippy`); the
//! demo and the lab build without it when it is missing, so the README's
//! first command works on a minimal toolchain.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

/// `clippy-driver`'s `-D warnings`, in the encoding `cargo clippy` passes it.
const CLIPPY_ARGS: &str = "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__";

/// The environment of a linted build; empty when clippy is missing and
/// `required` is false.
pub fn env(required: bool) -> Result<Vec<(&'static str, OsString)>> {
    match driver() {
        Some(driver) => Ok(vec![
            ("RUSTC_WORKSPACE_WRAPPER", driver.into_os_string()),
            ("CLIPPY_ARGS", CLIPPY_ARGS.into()),
        ]),
        None if required => bail!(
            "clippy-driver not found beside cargo: the test command lints the workspace as it \
             builds it (rustup component add clippy)"
        ),
        None => {
            eprintln!("xtask: clippy-driver not found beside cargo; building without lints");
            Ok(Vec::new())
        }
    }
}

/// `clippy-driver` of the toolchain running xtask: cargo sets `CARGO` to
/// the toolchain's own cargo (not rustup's proxy), and clippy sits beside it.
fn driver() -> Option<PathBuf> {
    let cargo = PathBuf::from(std::env::var_os("CARGO")?);
    let driver = beside(&cargo, "clippy-driver");
    driver.is_file().then_some(driver)
}

fn beside(cargo: &Path, name: &str) -> PathBuf {
    let file = format!("{name}{}", std::env::consts::EXE_SUFFIX);
    cargo.with_file_name(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_is_looked_up_beside_cargo() {
        let at = beside(Path::new("/t/bin/cargo"), "clippy-driver");
        assert_eq!(
            at,
            PathBuf::from(format!(
                "/t/bin/clippy-driver{}",
                std::env::consts::EXE_SUFFIX
            ))
        );
    }
}
