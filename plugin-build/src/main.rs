//! `tidegate-plugin new|build`: writing a drain policy outside this
//! repository. The plugin toolchain lives here, beside the library that
//! does the work (shared with `cargo xtask plugins`), so the node gateway
//! carries none of it; `tidegate policy test|check` then run a built
//! component in the gateway's own host.

#![forbid(unsafe_code)]

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tidegate_plugin_build::build_crate::{self, BuildOptions};
use tidegate_plugin_build::new::{self, NewOptions, SdkSource};

/// Create and build drain-policy plugins (standalone crates, outside this repository).
#[derive(Debug, Parser)]
#[command(name = "tidegate-plugin", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create a policy crate: the SDK dependency, a policy skeleton, a trace and native tests.
    New {
        /// Package name (lowercase letters, digits, '-', '_'); also the component's file name.
        name: String,
        /// Directory to create the crate in (default: ./<name>); must not exist or be empty.
        #[arg(long, value_name = "DIR")]
        path: Option<PathBuf>,
        /// The SDK to depend on (default: the sdk/ this binary was built from).
        #[arg(long, value_name = "PATH")]
        sdk: Option<PathBuf>,
    },
    /// Build a policy crate for wasm32 (release profile), turn it into a component and check its
    /// imports; prints its size and whether it fits a ConfigMap.
    Build {
        /// The crate's directory.
        #[arg(long, value_name = "DIR", default_value = ".")]
        path: PathBuf,
        /// Where to write the component (default: <DIR>/target/<name>.wasm).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Build with cargo's dev profile: quicker to build, but slower and far larger (the
        /// skeleton: 5.8 MB against 126 KB), too large for the tidegate-plugins ConfigMap.
        #[arg(long, conflicts_with = "release")]
        debug: bool,
        /// Build with cargo's release profile: the default (kept for scripts).
        #[arg(long, hide = true)]
        release: bool,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            // The whole chain, causes after the error they caused.
            let mut line = e.to_string();
            let mut cause = e.source();
            while let Some(c) = cause {
                line.push_str(&format!(": {c}"));
                cause = c.source();
            }
            eprintln!("tidegate-plugin: {line}");
            ExitCode::FAILURE
        }
    }
}

/// The SDK source this binary was built from (`<checkout>/sdk`); what
/// `new` depends on unless `--sdk` says otherwise.
fn built_from_sdk() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk")
}

/// Runs one command; its report on success.
fn run(command: Command) -> Result<String, Box<dyn Error>> {
    let cwd = std::env::current_dir()?;
    Ok(match command {
        Command::New { name, path, sdk } => {
            let sdk = match sdk {
                Some(p) => SdkSource::Flag(p),
                None => SdkSource::BuiltFrom(built_from_sdk()),
            };
            let created = new::create(&NewOptions {
                name: name.clone(),
                dir: path,
                sdk,
            })?;
            new_report(&name, &created, &cwd)
        }
        Command::Build {
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
            built.report(&cwd)
        }
    })
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
         cargo test                       # the policy and trace.yaml, natively\n  \
         tidegate-plugin build            # -> target/{name}.wasm\n  \
         tidegate policy test target/{name}.wasm trace.yaml",
        sdk = created.sdk.display(),
    )
}
