//! The `wasm32-unknown-unknown` standard library: is it installed for the
//! toolchain cargo will use, and installing it with rustup when it is not.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};

/// Policies are built for this target: no WASI, so the component imports
/// nothing but `tidegate:policy/…`.
pub const WASM_TARGET: &str = "wasm32-unknown-unknown";

/// The wasm target is missing and could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error(
        "the {WASM_TARGET} target is not installed for this toolchain and rustup is not on \
         PATH; install it (with rustup: `rustup target add {WASM_TARGET}`) and try again"
    )]
    MissingNoRustup,
    #[error(
        "`rustup target add {WASM_TARGET}` failed ({0}); plugins cannot be built without the \
         target. Check network access to static.rust-lang.org, or install the target offline, \
         then try again"
    )]
    AddFailed(ExitStatus),
    #[error(
        "`rustup target add {WASM_TARGET}` succeeded but rustc still has no {WASM_TARGET} \
         standard library (a toolchain that is not rustup's?)"
    )]
    StillMissing,
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
}

/// Makes sure the toolchain used in `dir` (where a `rust-toolchain` file
/// may pick another one) can build for the wasm target, running
/// `rustup target add` when rustup is on `PATH`.
pub fn ensure(dir: &Path) -> Result<(), TargetError> {
    if installed(dir)? {
        return Ok(());
    }
    let rustup = Command::new("rustup")
        .arg("--version")
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !rustup.is_ok_and(|s| s.success()) {
        return Err(TargetError::MissingNoRustup);
    }
    eprintln!("the {WASM_TARGET} target is missing; running `rustup target add {WASM_TARGET}`");
    let status = Command::new("rustup")
        .args(["target", "add", WASM_TARGET])
        .current_dir(dir)
        .status()
        .map_err(|source| TargetError::Spawn {
            program: "rustup".into(),
            source,
        })?;
    if !status.success() {
        return Err(TargetError::AddFailed(status));
    }
    if installed(dir)? {
        Ok(())
    } else {
        Err(TargetError::StillMissing)
    }
}

/// Whether rustc (`$RUSTC` or `rustc`, run in `dir`) has the wasm target's
/// standard library: `rustc --print target-libdir` names a directory with
/// `libcore` in it.
fn installed(dir: &Path) -> Result<bool, TargetError> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| OsString::from("rustc"));
    let output = Command::new(&rustc)
        .args(["--print", "target-libdir", "--target", WASM_TARGET])
        .current_dir(dir)
        .output()
        .map_err(|source| TargetError::Spawn {
            program: rustc.to_string_lossy().into_owned(),
            source,
        })?;
    // rustc without the target's spec at all fails here: not installed.
    if !output.status.success() {
        return Ok(false);
    }
    let libdir = String::from_utf8_lossy(&output.stdout);
    Ok(has_libcore(Path::new(libdir.trim())))
}

/// A target libdir is usable when it holds the `core` rlib.
fn has_libcore(libdir: &Path) -> bool {
    std::fs::read_dir(libdir).is_ok_and(|entries| {
        entries.filter_map(Result::ok).any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("libcore-") && name.ends_with(".rlib")
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_libdir_counts_only_with_libcore_in_it() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!has_libcore(&dir.path().join("absent")));
        assert!(!has_libcore(dir.path()));
        std::fs::write(dir.path().join("libstd-0123.rlib"), b"").unwrap();
        assert!(!has_libcore(dir.path()));
        std::fs::write(dir.path().join("libcore-0123.rlib"), b"").unwrap();
        assert!(has_libcore(dir.path()));
    }
}
