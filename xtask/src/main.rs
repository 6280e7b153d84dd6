//! Developer tasks, run as `cargo xtask <task>` (alias in `.cargo/config.toml`).
//!
//! - `plugins [--out DIR]`: build every crate of the `plugins/` workspace for
//!   `wasm32-unknown-unknown`, turn each core module into a component, check
//!   it imports nothing but `tidegate:policy/…`, and write
//!   `DIR/<name>.wasm` (fixtures: `DIR/fixtures/<name>.wasm`). `DIR`
//!   defaults to `<repo>/target/plugins`.
//! - `test`: the project's whole test run (the README's test command): build
//!   the plugins, build every target of the workspace with its crates
//!   linted as they compile (`lint.rs`: clippy, `-D warnings`), run every
//!   test of the workspace, the plugins' native tests,
//!   every fuzz target for a bounded time, the drain lab's smoke runs
//!   (`lab.rs`), then start the demo as `demo --check` does and run the
//!   READMEs' shell blocks against it (`readme.rs`). Before any build it
//!   checks ARCHITECTURE.md against the code (`architecture.rs`).
//! - `fuzz [--secs N] [TARGET…]`: build the fuzz targets of `fuzz/` and run
//!   each for N seconds (default 60); `test` runs them all for
//!   [`fuzz::TEST_SECS`] each (`fuzz.rs`).
//! - `readme`: what `test` checks of the documents, for whoever edits one:
//!   ARCHITECTURE.md against the code (`architecture.rs`), then the demo and
//!   the READMEs' shell blocks.
//! - `architecture`: ARCHITECTURE.md against the code alone, and
//!   `docs/module-map.md` and the generated regions against what the code
//!   gives (`module_map.rs`, `generated.rs`).
//! - `module-map`: write `docs/module-map.md` from every Rust file's first
//!   doc line (`module_map.rs`), and the generated regions of the README
//!   (its crates) and `docs/performance.md` (its contents), `generated.rs`.
//! - `config-reference`: rewrite the generated table of
//!   `docs/configuration.md` (every key, its default and range) from the
//!   config types, keeping the meanings written; the test
//!   `gateway/tests/readme_config.rs` then checks it, and `test` runs that.
//! - `lab [ARGS…]`: build as `test` does, then run the drain lab
//!   (`target/debug/drain-lab ARGS`; needs root). `test` runs a bounded
//!   smoke runs of it (`lab.rs`).
//! - `demo [--check] [ARGS…]`: build the plugins and the gateway (dev profile:
//!   the build the tests use) and run it on the embedded default; extra
//!   arguments go to `tidegate run`. `--check` runs the "try next" lines the
//!   gateway prints, checks their answers and stops it (`demo.rs`).

#![forbid(unsafe_code)]

mod architecture;
mod checks;
mod child;
mod demo;
mod fuzz;
mod generated;
mod lab;
mod lint;
mod module_map;
mod plugins;
mod readme;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};

const USAGE: &str =
    "usage: cargo xtask plugins [--out DIR] | test | fuzz [--secs N] [TARGET…] | readme | architecture | module-map | config-reference | lab [ARGS…] | demo [--check] [ARGS…]";

fn main() -> ExitCode {
    // The fuzz build runs xtask as its rustc wrapper (`fuzz.rs`).
    if let Some(under) = std::env::var_os(fuzz::INSTRUMENT_UNDER) {
        let args: Vec<OsString> = std::env::args_os().skip(1).collect();
        return fuzz::rustc_wrapper(std::path::Path::new(&under), &args).unwrap_or_else(|e| {
            eprintln!("xtask (rustc wrapper): error: {e:#}");
            ExitCode::FAILURE
        });
    }
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
        Some("test") => {
            let root = repo_root();
            let lint = lint::env(true)?;
            let mut tally = Tally::default();
            let architecture = run_architecture(&root, &mut tally);
            plugins::build_all(&root, &root.join("target").join("plugins"))?;
            // Every target (benches too) built and linted first; the run
            // then builds nothing.
            // Every binary too, as a user runs it: tests start the
            // workspace's binaries (`tidegate-plugin`, a package without
            // integration tests of its own, is built by nothing else).
            // Not xtask's: relinking the running binary would leave the
            // fuzz build, which wraps rustc with it, pointing at a deleted file.
            let bins = ["build", "--workspace", "--exclude", "xtask", "--bins"];
            let workspace = run_cargo_env(
                &root,
                &["test", "--workspace", "--all-targets", "--no-run"],
                &lint,
            )
            .and_then(|()| run_cargo_env(&root, &bins, &lint))
            .and_then(|()| run_tests(&root, &["test", "--workspace"], &lint, &mut tally));
            let plugins = run_tests(
                &root.join("plugins"),
                &[
                    "test",
                    "--workspace",
                    "--target-dir",
                    "../target/plugins/native",
                ],
                &[],
                &mut tally,
            );
            let fuzz = fuzz::run(&root, fuzz::TEST_SECS, &[]);
            if let Err(e) = &fuzz {
                eprintln!("xtask: {e:#}");
            }
            let smoke = run_lab_smoke(&root, &mut tally);
            let docs = run_docs(&root, &mut tally);
            // One closing line for the whole run, whatever ran last.
            println!(
                "\ntests: {} passed, {} failed, {} skipped",
                tally.passed, tally.failed, tally.ignored
            );
            architecture
                .and(workspace)
                .and(plugins)
                .and(fuzz)
                .and(smoke)
                .and(docs)
        }
        Some("fuzz") => {
            let mut secs = 60;
            let mut targets = Vec::new();
            while let Some(arg) = args.next() {
                match arg.as_str() {
                    "--secs" => {
                        secs = args
                            .next()
                            .and_then(|s| s.parse().ok())
                            .context("--secs needs a number of seconds")?
                    }
                    t => targets.push(t.to_owned()),
                }
            }
            fuzz::run(&repo_root(), secs, &targets)
        }
        Some("readme") => {
            let root = repo_root();
            let mut tally = Tally::default();
            let architecture = run_architecture(&root, &mut tally);
            plugins::build_all(&root, &root.join("target").join("plugins"))?;
            architecture.and(run_docs(&root, &mut tally))
        }
        Some("architecture") => run_architecture(&repo_root(), &mut Tally::default()),
        Some("module-map") => {
            let root = repo_root();
            generated::write(&root).and(module_map::write(&root))
        }
        Some("config-reference") => {
            let root = repo_root();
            let write = [("TIDEGATE_WRITE_CONFIG_REFERENCE", OsString::from("1"))];
            run_cargo_env(
                &root,
                &[
                    // The workspace's feature resolution, as every other
                    // build here: `-p tidegate` alone rebuilds most of it.
                    "test",
                    "--workspace",
                    "--test",
                    "readme_config",
                    "--",
                    "docs_configuration",
                ],
                &write,
            )
            .context("docs/configuration.md is written; write the meaning of each key it names without one")
        }
        Some("lab") => {
            let root = repo_root();
            plugins::build_all(&root, &root.join("target").join("plugins"))?;
            lab::run(&root, &args.collect::<Vec<_>>())
        }
        Some("demo") => {
            let root = repo_root();
            let mut extra: Vec<String> = args.collect();
            let check = extra.first().is_some_and(|a| a == "--check");
            if check {
                extra.remove(0);
            }
            plugins::build_all(&root, &root.join("target").join("plugins"))?;
            if check {
                let mut checks = checks::Checks::default();
                demo::check(&root, &extra, &mut checks, |_| Ok(()))?;
                return checks.result();
            }
            let bin = demo::build_gateway(&root)?;
            demo::run(&root, &bin, &extra)
        }
        Some(other) => bail!("unknown task {other:?}\n{USAGE}"),
        None => bail!("{USAGE}"),
    }
}

/// Test counts summed over every `test result:` line.
#[derive(Debug, Default)]
struct Tally {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl Tally {
    /// Adds a libtest summary line (`test result: ok. 3 passed; 0 failed; 1 ignored; …`).
    fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(';') {
            let words: Vec<&str> = part.split_whitespace().collect();
            let (n, what) = match words.as_slice() {
                [_, n, what] | [n, what] => (*n, *what),
                _ => continue,
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

/// The README's first command in check mode, then the READMEs' shell
/// blocks against the running demo; every check counts in the tally.
fn run_docs(root: &std::path::Path, tally: &mut Tally) -> Result<()> {
    println!(
        "\nrunning the README's first command (`cargo xtask demo --check`) and its shell blocks"
    );
    let mut checks = checks::Checks::default();
    demo::check(root, &[], &mut checks, |c| readme::run_all(root, c))?;
    count(tally, &checks, "README checks")
}

/// ARCHITECTURE.md against the code (`architecture.rs`) and the module map
/// against what the code gives (`module_map.rs`): two checks.
fn run_architecture(root: &std::path::Path, tally: &mut Tally) -> Result<()> {
    println!(
        "\nchecking {} against the source trees",
        architecture::DOCUMENT
    );
    let mut checks = checks::Checks::default();
    let result = architecture::check(root).and_then(none_found);
    checks.record(
        &format!(
            "{} names every crate and gateway folder, imports as the manifests, only existing paths",
            architecture::DOCUMENT
        ),
        result,
    );
    let map = module_map::check(root).and_then(|mut problems| {
        problems.extend(generated::check(root)?);
        none_found(problems)
    });
    checks.record(
        &format!(
            "{} and the documents' generated regions are what the code gives, every file with a first doc line",
            module_map::DOCUMENT
        ),
        map,
    );
    count(tally, &checks, "architecture")
}

/// A check's problems as its result: none, or each on a line of its own.
fn none_found(problems: Vec<String>) -> Result<()> {
    if problems.is_empty() {
        Ok(())
    } else {
        bail!("{}", problems.join("\n    "))
    }
}

/// The drain lab's smoke runs (`lab.rs`), counted in the tally.
fn run_lab_smoke(root: &std::path::Path, tally: &mut Tally) -> Result<()> {
    println!("\nrunning the drain lab's smoke runs");
    let mut checks = checks::Checks::default();
    lab::smoke(root, &mut checks)?;
    count(tally, &checks, "drain lab smoke")
}

/// Adds a stage's checks to the tally and prints its `test result:` line.
fn count(tally: &mut Tally, checks: &checks::Checks, stage: &str) -> Result<()> {
    tally.passed += checks.passed;
    tally.failed += checks.failed;
    tally.ignored += checks.skipped;
    println!(
        "test result: {}. {} passed; {} failed; {} ignored ({stage})",
        if checks.failed == 0 { "ok" } else { "FAILED" },
        checks.passed,
        checks.failed,
        checks.skipped
    );
    checks.result()
}

/// Runs `cargo test …` with `env`, echoing its output and counting results.
fn run_tests(
    dir: &std::path::Path,
    args: &[&str],
    env: &[(&str, OsString)],
    tally: &mut Tally,
) -> Result<()> {
    use std::io::BufRead;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut child = std::process::Command::new(cargo)
        .current_dir(dir)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    let stdout = child.stdout.take().expect("piped");
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.context("reading cargo test output")?;
        println!("{line}");
        tally.add_line(&line);
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

/// The build the demo, the lab and the tests share: every member, bins and
/// tests (cargo resolves features per selection, so `-p tidegate` alone
/// would resolve wasmtime's build-time dependencies differently and the
/// tests would rebuild most of it), the members linted as they compile
/// (`lint.rs`) when clippy is installed.
pub(crate) fn build_workspace(root: &std::path::Path) -> Result<()> {
    let lint = lint::env(false)?;
    run_cargo_env(root, &["build", "--workspace", "--bins", "--tests"], &lint)
}

/// Runs cargo with `args` and the extra `env` in `dir`, inheriting stdio;
/// fails on a non-zero exit.
pub(crate) fn run_cargo_env(
    dir: &std::path::Path,
    args: &[&str],
    env: &[(&str, OsString)],
) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .current_dir(dir)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .status()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

/// The main workspace root: xtask lives in `<root>/xtask`.
pub(crate) fn repo_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .expect("xtask is one level below the workspace root")
        .to_path_buf()
}

#[cfg(test)]
mod tally_tests {
    use super::Tally;

    #[test]
    fn sums_libtest_summaries() {
        let mut t = Tally::default();
        t.add_line("test result: ok. 16 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s");
        t.add_line(
            "test result: FAILED. 3 passed; 2 failed; 1 ignored; 0 measured; 0 filtered out",
        );
        t.add_line("running 3 tests");
        assert_eq!((t.passed, t.failed, t.ignored), (19, 2, 1));
    }
}
