//! Developer tasks, run as `cargo xtask <task>` (alias in `.cargo/config.toml`).
//!
//! - `plugins [--out DIR]`: build every crate of the `plugins/` workspace for
//!   `wasm32-unknown-unknown`, turn each core module into a component, check
//!   it imports nothing but `tidegate:policy/…`, and write
//!   `DIR/<name>.wasm` (fixtures: `DIR/fixtures/<name>.wasm`). `DIR`
//!   defaults to `<repo>/target/plugins`.

mod component;
mod plugins;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};

const USAGE: &str = "usage: cargo xtask plugins [--out DIR]";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<()> {
    let mut args = args.into_iter();
    match args.next().as_deref() {
        Some("plugins") => {
            let root = repo_root();
            let mut out = root.join("target").join("plugins");
            while let Some(arg) = args.next() {
                match arg.as_str() {
                    "--out" => out = PathBuf::from(args.next().context("--out needs a directory")?),
                    other => bail!("unknown argument {other:?}\n{USAGE}"),
                }
            }
            plugins::build_all(&root, &out)
        }
        Some(other) => bail!("unknown task {other:?}\n{USAGE}"),
        None => bail!("{USAGE}"),
    }
}

/// The main workspace root: xtask lives in `<root>/xtask`.
fn repo_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .expect("xtask is one level below the workspace root")
        .to_path_buf()
}
