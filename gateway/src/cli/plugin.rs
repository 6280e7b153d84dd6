//! `tidegate plugin new|build`: writing a policy outside this repository.
//! The work is done by `tidegate-plugin-build` (shared with `cargo xtask
//! plugins`); this maps the command line onto it and prints the results.

use std::path::{Path, PathBuf};

use tidegate_plugin_build::build_crate::{self, BuildOptions};
use tidegate_plugin_build::new::{self, NewOptions, SdkSource};

use super::PluginCommand;

/// The SDK source this binary was built from (`<checkout>/sdk`); what
/// `plugin new` depends on unless `--sdk` says otherwise.
pub fn built_from_sdk() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk")
}

/// Runs a `tidegate plugin …` command, printing what it did.
pub fn run(cmd: PluginCommand) -> anyhow::Result<()> {
    let cwd = std::env::current_dir()?;
    match cmd {
        PluginCommand::New { name, path, sdk } => {
            let sdk = match sdk {
                Some(p) => SdkSource::Flag(p),
                None => SdkSource::BuiltFrom(built_from_sdk()),
            };
            let created = new::create(&NewOptions {
                name: name.clone(),
                dir: path,
                sdk,
            })?;
            println!("{}", new_report(&name, &created, &cwd));
        }
        PluginCommand::Build {
            path,
            out,
            debug,
            release: _,
        } => {
            let built = build_crate::build(&BuildOptions {
                dir: path,
                out,
                release: !debug,
            })?;
            println!("{}", built.report(&cwd));
        }
    }
    Ok(())
}

fn new_report(name: &str, created: &new::Created, cwd: &Path) -> String {
    let dir = created
        .dir
        .strip_prefix(cwd)
        .unwrap_or(&created.dir)
        .display()
        .to_string();
    let files: String = created
        .files
        .iter()
        .map(|f| format!("  {}\n", f.strip_prefix(cwd).unwrap_or(f).display()))
        .collect();
    format!(
        "created policy crate {name} (tidegate-sdk at {sdk}):\n{files}next:\n  \
         cd {dir}\n  \
         cargo test                 # the policy and trace.yaml, natively\n  \
         tidegate plugin build      # -> target/{name}.wasm\n  \
         tidegate policy test target/{name}.wasm trace.yaml",
        sdk = created.sdk.display(),
    )
}
