//! `tidegate-plugin build`: one policy crate → `cargo build` for wasm32 →
//! component (imports checked) → `target/<name>.wasm`.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::cargo::{self, CargoError};
use crate::component::{componentize, Component, ComponentError};
use crate::wasm_target::{self, TargetError};

/// What to build.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// The plugin crate's directory (holding its `Cargo.toml`).
    pub dir: PathBuf,
    /// Where to write the component; `<dir>/target/<package>.wasm` when `None`.
    pub out: Option<PathBuf>,
    /// Cargo's release profile instead of dev.
    pub release: bool,
}

/// A written component.
#[derive(Debug)]
pub struct Built {
    pub package: String,
    /// Built with cargo's release profile.
    pub release: bool,
    pub dir: PathBuf,
    pub out: PathBuf,
    pub component: Component,
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(
        "no Cargo.toml in {}; run this in a plugin crate (`tidegate-plugin new NAME` creates one) \
         or pass --path DIR",
        .0.display()
    )]
    NoManifest(PathBuf),
    #[error(transparent)]
    Cargo(#[from] CargoError),
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error("{} is not a package (a virtual workspace?); pass --path to the plugin crate", .0.display())]
    NotAPackage(PathBuf),
    #[error(
        "package {0} builds no cdylib; add `crate-type = [\"cdylib\", \"rlib\"]` under `[lib]` in \
         its Cargo.toml"
    )]
    NotCdylib(String),
    #[error("cargo wrote no core module at {}: {source}", .path.display())]
    CoreMissing {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("plugin {package} is not a drain policy")]
    Component {
        package: String,
        #[source]
        source: ComponentError,
    },
    #[error("cannot write {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Builds the crate in `opts.dir` for wasm32 (cargo's output on the
/// terminal), componentizes it, checks it and writes the component.
pub fn build(opts: &BuildOptions) -> Result<Built, BuildError> {
    let manifest = opts.dir.join("Cargo.toml");
    let manifest = manifest
        .canonicalize()
        .map_err(|_| BuildError::NoManifest(opts.dir.clone()))?;
    let dir = manifest
        .parent()
        .expect("a canonical file path has a parent")
        .to_owned();
    let metadata = cargo::metadata(&manifest)?;
    let package = metadata
        .packages
        .iter()
        .find(|p| p.manifest_path == manifest)
        .ok_or_else(|| BuildError::NotAPackage(manifest.clone()))?;
    let lib = package
        .cdylib()
        .ok_or_else(|| BuildError::NotCdylib(package.name.clone()))?;

    wasm_target::ensure(&dir)?;
    let mut extra: Vec<&OsStr> = vec![OsStr::new("--lib")];
    if opts.release {
        extra.push(OsStr::new("--release"));
    }
    cargo::build_wasm(&manifest, &extra)?;

    let profile = if opts.release { "release" } else { "debug" };
    let core_path = metadata.wasm_dir(profile).join(lib.core_module_file());
    let core = std::fs::read(&core_path).map_err(|source| BuildError::CoreMissing {
        path: core_path.clone(),
        source,
    })?;
    let component = componentize(&core).map_err(|source| BuildError::Component {
        package: package.name.clone(),
        source,
    })?;
    let out = opts
        .out
        .clone()
        .unwrap_or_else(|| dir.join("target").join(format!("{}.wasm", package.name)));
    let write = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&out, &component.bytes));
    write.map_err(|source| BuildError::Write {
        path: out.clone(),
        source,
    })?;
    Ok(Built {
        package: package.name.clone(),
        release: opts.release,
        dir,
        out,
        component,
    })
}

impl Built {
    /// What was written and the commands that come next, with paths as
    /// seen from `cwd`.
    pub fn report(&self, cwd: &Path) -> String {
        let out = shown(&self.out, cwd);
        let s = &self.component.summary;
        let size = self.component.bytes.len();
        let mut text = format!(
            "wrote {out} ({size} bytes, {})\n",
            if self.release { "release" } else { "debug" }
        );
        match crate::configmap::fits(size) {
            Ok(None) => {}
            Ok(Some(note)) => {
                let _ = writeln!(text, "  note: {note}");
            }
            Err(e) => {
                let instead = if self.release {
                    "ship it in the image, or upload it to one gateway with `tidegate policy upload`"
                } else {
                    "build it without --debug to ship it"
                };
                let _ = writeln!(text, "  not for a ConfigMap: {e}; {instead}");
            }
        }
        let _ = write!(
            text,
            "  imports: {}\n  exports: {}\nnext:\n",
            if s.imports.is_empty() {
                "none".to_owned()
            } else {
                s.imports.join(", ")
            },
            s.exports.join(", "),
        );
        let _ = writeln!(text, "  tidegate policy check {out}");
        let trace = self.dir.join("trace.yaml");
        if trace.exists() {
            let _ = writeln!(text, "  tidegate policy test {out} {}", shown(&trace, cwd));
        }
        let _ = write!(
            text,
            "  tidegate policy upload {} {out}   # hot swap on a running gateway (PUT /policies/<name>)",
            self.package
        );
        text
    }
}

/// `path` relative to `cwd` when it lies below it.
fn shown(path: &Path, cwd: &Path) -> String {
    let cwd = cwd.canonicalize().unwrap_or_else(|_| cwd.to_owned());
    let abs = match path.parent().map(|p| p.canonicalize()) {
        Some(Ok(parent)) => parent.join(path.file_name().unwrap_or_default()),
        _ => path.to_owned(),
    };
    abs.strip_prefix(&cwd)
        .map(Path::to_owned)
        .unwrap_or(abs)
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_without_cargo_toml_is_refused_before_cargo_runs() {
        let tmp = tempfile::tempdir().unwrap();
        let err = build(&BuildOptions {
            dir: tmp.path().to_owned(),
            out: None,
            release: false,
        })
        .unwrap_err();
        assert!(matches!(err, BuildError::NoManifest(_)), "{err:?}");
        assert!(
            err.to_string().contains("tidegate-plugin new NAME"),
            "{err}"
        );
    }

    #[test]
    fn the_report_names_the_next_commands_relative_to_the_cwd() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        std::fs::create_dir_all(dir.join("target")).unwrap();
        std::fs::write(dir.join("trace.yaml"), "").unwrap();
        let built = Built {
            package: "p".into(),
            release: false,
            dir: dir.clone(),
            out: dir.join("target/p.wasm"),
            component: Component {
                bytes: vec![0; 10],
                summary: crate::component::Summary {
                    imports: vec![],
                    exports: vec!["tidegate:policy/policy@0.1.0".into()],
                },
            },
        };
        let report = built.report(&dir);
        assert!(
            report.starts_with("wrote target/p.wasm (10 bytes, debug)\n  imports: none\n"),
            "{report}"
        );
        assert!(
            report.contains("\n  tidegate policy check target/p.wasm\n"),
            "{report}"
        );
        assert!(
            report.contains("\n  tidegate policy test target/p.wasm trace.yaml\n"),
            "{report}"
        );
        assert!(
            report.contains("tidegate policy upload p target/p.wasm   # hot swap"),
            "{report}"
        );
        let report = built.report(tmp.path());
        assert!(
            report.contains("policy test p/target/p.wasm p/trace.yaml"),
            "{report}"
        );
    }

    #[test]
    fn the_report_says_a_component_over_one_mib_is_not_for_a_configmap() {
        let tmp = tempfile::tempdir().unwrap();
        let built = |release, size| Built {
            package: "p".into(),
            release,
            dir: tmp.path().to_owned(),
            out: tmp.path().join("target/p.wasm"),
            component: Component {
                bytes: vec![0; size],
                summary: crate::component::Summary {
                    imports: vec![],
                    exports: vec![],
                },
            },
        };
        let report = built(false, 2_000_000).report(tmp.path());
        assert!(
            report.starts_with(
                "wrote target/p.wasm (2000000 bytes, debug)\n  not for a ConfigMap: 2000000 bytes \
                 is too large for the tidegate-plugins ConfigMap, which holds at most 1048576 \
                 bytes (1 MiB, the API server's limit on a ConfigMap's data); build it without \
                 --debug to ship it\n"
            ),
            "{report}"
        );
        let report = built(true, 2_000_000).report(tmp.path());
        assert!(
            report.contains("; ship it in the image, or upload it"),
            "{report}"
        );
        let report = built(true, 126_000).report(tmp.path());
        assert!(
            report.starts_with("wrote target/p.wasm (126000 bytes, release)\n  imports: none\n"),
            "{report}"
        );
    }
}
