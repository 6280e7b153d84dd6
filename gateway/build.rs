//! Embeds the git commit the binary is built from (`tidegate version`,
//! `GET /version`): `BUILD_GIT_COMMIT` when set; otherwise, in a release
//! build (or with `TIDEGATE_EMBED_COMMIT=1`), `git rev-parse HEAD`, with
//! HEAD watched so a new commit re-embeds it — "unknown" outside a git
//! checkout (a source tarball, the image build, whose context leaves `.git`
//! out); otherwise (a debug build) `dev`, and HEAD is not watched, so a
//! commit does not rebuild this crate and relink every test binary.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}

/// Rebuilt when HEAD moves: HEAD itself, the branch it names, packed refs.
fn watch_head() {
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for path in watched {
        if let Some(file) = git(&["rev-parse", "--git-path", &path]) {
            if std::path::Path::new(&file).exists() {
                println!("cargo:rerun-if-changed={file}");
            }
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=BUILD_GIT_COMMIT");
    println!("cargo:rerun-if-env-changed=TIDEGATE_EMBED_COMMIT");
    let given = std::env::var("BUILD_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty());
    // Cargo's PROFILE is `release` for the release profile and those
    // inheriting it (bench), `debug` for the others.
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    let asked = std::env::var("TIDEGATE_EMBED_COMMIT").is_ok_and(|v| v == "1");
    let commit = match given {
        Some(c) => c,
        None if release || asked => {
            watch_head();
            git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into())
        }
        None => "dev".into(),
    };
    println!("cargo:rustc-env=BUILD_GIT_COMMIT={commit}");
}
