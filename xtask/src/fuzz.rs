//! `cargo xtask fuzz [--secs N] [TARGET…]`: the fuzz targets under `fuzz/`
//! (libFuzzer through cargo-fuzz, without a sanitizer, so a stable toolchain
//! builds them), each run for a bounded time.
//!
//! cargo-fuzz is installed when missing. Each target starts from its corpus
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

const CARGO_FUZZ_VERSION: &str = "0.13.2";

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
    ensure_cargo_fuzz()?;
    let fuzz = root.join("fuzz");
    println!("xtask: building the fuzz targets (instrumented; the first build takes about 10 minutes on 2 cores)");
    crate::run_cargo(&fuzz, &["fuzz", "build", "-s", "none", "-O"])?;
    let bin_dir = fuzz.join("target").join(host_triple()?).join("release");
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

fn ensure_cargo_fuzz() -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let present = Command::new(&cargo)
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if present {
        return Ok(());
    }
    println!("xtask: installing cargo-fuzz {CARGO_FUZZ_VERSION} (once)");
    crate::run_cargo(
        Path::new("."),
        &[
            "install",
            "cargo-fuzz",
            "--locked",
            "--version",
            CARGO_FUZZ_VERSION,
        ],
    )
}

fn host_triple() -> Result<String> {
    let out = Command::new("rustc").arg("-vV").output()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_owned)
        .context("rustc -vV names no host")
}
