//! `cargo xtask fuzz [--secs N] [TARGET…]`: the fuzz targets under `fuzz/`
//! (libFuzzer through `libfuzzer-sys`, without a sanitizer, so a stable
//! toolchain builds them), each run for a bounded time.
//!
//! The build is plain `cargo build` with the coverage instrumentation
//! cargo-fuzz would add (`cargo fuzz build -s none`: SanitizerCoverage's
//! inline 8-bit counters, PC table, comparison tracing and stack depth,
//! `--cfg fuzzing`), so nothing has to be installed first. Unlike
//! cargo-fuzz, it instruments only this repository's crates (the gateway
//! library, the SDK, the targets): xtask is the build's `RUSTC_WRAPPER` and
//! adds the flags to a crate only when its source lies in the repository
//! ([`instrumented`]). The fuzzed parsers are ours, and the serde code that
//! drives them is generic, so it is compiled — and instrumented — inside our
//! crates. Dependencies (wasmtime and kube among them, which no target runs)
//! are built at `opt-level = 0` without instrumentation (`fuzz/Cargo.toml`):
//! with every crate instrumented at `opt-level = 1` this build took 18 of
//! CI's 68 minutes. The targets are the same `fuzz/Cargo.toml` bins, so
//! `cargo fuzz run <target>` still works for whoever has cargo-fuzz.
//!
//! Each target starts from its corpus
//! in the repository (`fuzz/corpus/<target>`) and writes what it finds to
//! `target/fuzz/corpus/<target>` (kept between runs, never committed); a
//! crash fails the run and leaves its input in `fuzz/artifacts/<target>/`,
//! to reproduce with `fuzz/target/<host>/release/<target> <file>`.

use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{bail, Context, Result};

/// Every target of `fuzz/Cargo.toml`, in the order they run.
pub const TARGETS: [&str; 11] = [
    "connect_route",
    "config",
    "workload_file",
    "cni_stdin",
    "cni_socket",
    "admin_workloads",
    "admin_dump_query",
    "wit_convert",
    "authorization",
    "dns",
    "xds",
];

/// What `cargo xtask test` gives each target.
pub const TEST_SECS: u64 = 20;

/// Set (to the repository's root) on the fuzz build's cargo: xtask, started
/// by cargo as `RUSTC_WRAPPER`, compiles the crates under it instrumented.
pub const INSTRUMENT_UNDER: &str = "TIDEGATE_FUZZ_INSTRUMENT_UNDER";

/// libFuzzer's coverage feedback, as `cargo fuzz build -s none` passes it
/// (rustc's stable `-C passes`/`-C llvm-args`; no sanitizer runtime).
const INSTRUMENT: [&str; 8] = [
    "-Cpasses=sancov-module",
    "-Cllvm-args=-sanitizer-coverage-level=4",
    "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
    "-Cllvm-args=-sanitizer-coverage-pc-table",
    "-Cllvm-args=-sanitizer-coverage-trace-compares",
    "-Cllvm-args=-sanitizer-coverage-stack-depth",
    "-Cllvm-args=-simplifycfg-branch-fold-threshold=0",
    "--cfg=fuzzing",
];

pub fn run(root: &Path, secs: u64, targets: &[String]) -> Result<()> {
    for t in targets {
        if !TARGETS.contains(&t.as_str()) {
            bail!("unknown fuzz target {t:?}; the targets are {TARGETS:?}");
        }
    }
    let targets: Vec<&str> = if targets.is_empty() {
        TARGETS.to_vec()
    } else {
        targets.iter().map(String::as_str).collect()
    };
    let fuzz = root.join("fuzz");
    let bin_dir = build(root, &fuzz)?;
    let mut crashed = Vec::new();
    for t in targets {
        let found = root.join("target").join("fuzz").join("corpus").join(t);
        let artifacts = fuzz.join("artifacts").join(t);
        let log = root.join("target").join("fuzz").join(format!("{t}.log"));
        std::fs::create_dir_all(&found)?;
        std::fs::create_dir_all(&artifacts)?;
        let started = Instant::now();
        let out = Command::new(bin_dir.join(t))
            .arg(&found)
            .arg(fuzz.join("corpus").join(t))
            .arg(format!("-max_total_time={secs}"))
            .arg("-rss_limit_mb=2048")
            .arg("-timeout=10")
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .output()
            .with_context(|| format!("running fuzz target {t}"))?;
        let text = String::from_utf8_lossy(&out.stderr);
        std::fs::write(&log, text.as_bytes())?;
        let runs = text
            .lines()
            .rev()
            .find(|l| l.starts_with("Done "))
            .unwrap_or("no summary");
        if out.status.success() {
            println!(
                "fuzz {t:<16} ok in {:>3} s: {runs}",
                started.elapsed().as_secs()
            );
        } else {
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            eprintln!(
                "fuzz {t}: FAILED ({}); log {}:\n{}",
                out.status,
                log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
            crashed.push(t);
        }
    }
    if !crashed.is_empty() {
        bail!(
            "fuzz targets failed: {} (inputs in fuzz/artifacts/)",
            crashed.join(", ")
        );
    }
    Ok(())
}

/// Builds every target instrumented; returns the directory of the binaries.
fn build(root: &Path, fuzz: &Path) -> Result<std::path::PathBuf> {
    let triple = host_triple()?;
    println!("xtask: building the fuzz targets (only this repository's crates instrumented)");
    // An explicit --target keeps the caller's RUSTFLAGS off build scripts
    // and proc macros.
    let me = std::env::current_exe().context("locating xtask, the fuzz build's rustc wrapper")?;
    crate::run_cargo_env(
        fuzz,
        &["build", "--release", "--bins", "--target", &triple],
        &[
            ("RUSTC_WRAPPER", me.into_os_string()),
            (INSTRUMENT_UNDER, root.as_os_str().to_owned()),
        ],
    )?;
    Ok(fuzz.join("target").join(triple).join("release"))
}

/// xtask as cargo's `RUSTC_WRAPPER`: `args` are the compiler (rustc, or a
/// workspace wrapper and rustc) and its arguments; crates whose source
/// lies under `under` get [`INSTRUMENT`] too.
pub fn rustc_wrapper(under: &Path, args: &[OsString]) -> Result<ExitCode> {
    let (compiler, rest) = args
        .split_first()
        .context("rustc wrapper: no compiler named")?;
    let cwd = std::env::current_dir()?;
    let mut cmd = Command::new(compiler);
    cmd.args(rest);
    if instrumented(under, &cwd, rest) {
        cmd.args(INSTRUMENT);
    }
    let status = cmd
        .status()
        .with_context(|| format!("running {}", Path::new(compiler).display()))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        None => ExitCode::from(101),
    })
}

/// Whether the compilation `args` (run in `cwd`) is a crate of ours: its
/// root source file lies under `under`. Build scripts are left alone
/// (they would need libFuzzer's runtime to link), as are version queries.
fn instrumented(under: &Path, cwd: &Path, args: &[OsString]) -> bool {
    let name = args
        .windows(2)
        .find(|w| w[0] == "--crate-name")
        .map(|w| w[1].to_string_lossy());
    match name {
        None => false,
        Some(n) if n.starts_with("build_script_") => false,
        Some(_) => args.iter().any(|a| {
            let p = Path::new(a);
            p.extension() == Some(OsStr::new("rs")) && cwd.join(p).starts_with(under)
        }),
    }
}

fn host_triple() -> Result<String> {
    let out = Command::new("rustc").arg("-vV").output()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_owned)
        .context("rustc -vV names no host")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn only_our_crates_are_instrumented() {
        let under = Path::new("/repo");
        let fuzz = Path::new("/repo/fuzz");
        let target = args(&[
            "--crate-name",
            "config",
            "--edition=2021",
            "fuzz_targets/config.rs",
        ]);
        assert!(instrumented(under, fuzz, &target));
        let gateway = args(&["--crate-name", "tidegate", "/repo/gateway/src/lib.rs"]);
        assert!(instrumented(under, fuzz, &gateway));
        let dep = args(&[
            "--crate-name",
            "wasmtime",
            "/root/.cargo/registry/src/x/wasmtime-48.0.0/src/lib.rs",
        ]);
        assert!(!instrumented(under, fuzz, &dep));
        let script = args(&["--crate-name", "build_script_build", "/repo/sdk/build.rs"]);
        assert!(!instrumented(under, fuzz, &script));
        assert!(!instrumented(under, fuzz, &args(&["-vV"])));
    }
}
