//! `cargo xtask fuzz [--secs N] [TARGET…]`: the fuzz targets under `fuzz/`
//! (libFuzzer through `libfuzzer-sys`, without a sanitizer, so a stable
//! toolchain builds them), each run for a bounded time.
//!
//! The build is plain `cargo build` with the coverage instrumentation
//! cargo-fuzz would add (`cargo fuzz build -s none`: SanitizerCoverage's
//! inline 8-bit counters, PC table, comparison tracing and stack depth,
//! `--cfg fuzzing`), so nothing has to be installed first, and without the
//! three settings cargo-fuzz's release build adds: debug info, one codegen
//! unit per crate (wasmtime and Cranelift compiled on one thread each) and
//! `-Clink-dead-code` (not timed against cargo-fuzz's build: the build here
//! took 18 minutes in CI). The targets are the same `fuzz/Cargo.toml` bins, so
//! `cargo fuzz run <target>` still works for whoever has cargo-fuzz.
//!
//! Each target starts from its corpus
//! in the repository (`fuzz/corpus/<target>`) and writes what it finds to
//! `target/fuzz/corpus/<target>` (kept between runs, never committed); a
//! crash fails the run and leaves its input in `fuzz/artifacts/<target>/`,
//! to reproduce with `fuzz/target/<host>/release/<target> <file>`.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

/// Every target of `fuzz/Cargo.toml`, in the order they run.
pub const TARGETS: [&str; 7] = [
    "connect_route",
    "config",
    "workload_file",
    "cni_stdin",
    "cni_socket",
    "admin_workloads",
    "wit_convert",
];

/// What `cargo xtask test` gives each target.
pub const TEST_SECS: u64 = 20;

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
    let bin_dir = build(&fuzz)?;
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
fn build(fuzz: &Path) -> Result<std::path::PathBuf> {
    let triple = host_triple()?;
    println!("xtask: building the fuzz targets (instrumented; the first build took 18 minutes on a 2-core machine)");
    // An explicit --target keeps the flags off build scripts and proc macros
    // (they would link libFuzzer's hooks without its runtime).
    let flags = rustflags(std::env::var("RUSTFLAGS").ok());
    crate::run_cargo_env(
        fuzz,
        &["build", "--release", "--bins", "--target", &triple],
        &[("RUSTFLAGS", &flags)],
    )?;
    Ok(fuzz.join("target").join(triple).join("release"))
}

/// The instrumentation flags, then whatever the caller's `RUSTFLAGS` adds.
fn rustflags(extra: Option<String>) -> String {
    let mut flags = INSTRUMENT.join(" ");
    if let Some(extra) = extra.filter(|e| !e.trim().is_empty()) {
        flags.push(' ');
        flags.push_str(&extra);
    }
    flags
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

    #[test]
    fn instrumentation_comes_first_and_callers_flags_are_kept() {
        assert_eq!(rustflags(None), INSTRUMENT.join(" "));
        assert_eq!(rustflags(Some("  ".into())), INSTRUMENT.join(" "));
        let with = rustflags(Some("-Ctarget-cpu=native".into()));
        assert!(with.starts_with("-Cpasses=sancov-module "));
        assert!(with.ends_with(" -Ctarget-cpu=native"));
        assert!(with.contains("--cfg=fuzzing"));
    }
}
