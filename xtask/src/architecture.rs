//! ARCHITECTURE.md against the code: it names every module of the gateway
//! and of the crates beside it, and no path that is not there.
//!
//! - A module is each `.rs` file under a source tree of [`SOURCES`] (a
//!   directory's `mod.rs` is its directory) and each directory there,
//!   except test-only ones: a file whose name ends in `tests.rs`, and a
//!   directory holding only such files. It is named when the document has
//!   it in backticks from the repository root (`base/src/sync.rs`,
//!   `gateway/src/proxy/pool.rs`) or, for the node gateway's, relative to
//!   `gateway/src` (`proxy/pool.rs`, `proxy/inbound/`).
//! - A path is a backticked word without spaces that ends in a file
//!   extension or has a `/` after a first segment without dots (so
//!   `tidegate.io/mesh` and `discovery.k8s.io/v1` are not paths); a route
//!   (`/healthz/ready`), a URL, a placeholder (`<uid>`), a glob and build
//!   output (`target/…`) are not either. It must exist from the repository
//!   root or from `gateway/src`.

use std::path::Path;

use anyhow::{Context, Result};

pub const DOCUMENT: &str = "ARCHITECTURE.md";
const SRC: &str = "gateway/src";
/// Every source tree whose modules the document names: the node gateway's
/// and those of the crates along its walls.
const SOURCES: &[&str] = &[
    SRC,
    "authz/src",
    "base/src",
    "ca/src",
    "protocol/src",
    "policy-host/src",
    "netns/src",
    "cni/src",
    "control/src",
];
const EXTENSIONS: &[&str] = &[".rs", ".md", ".toml", ".yaml", ".yml", ".wit", ".json"];

/// Every problem of the repository's ARCHITECTURE.md, one line each.
pub fn check(root: &Path) -> Result<Vec<String>> {
    let doc = std::fs::read_to_string(root.join(DOCUMENT))
        .with_context(|| format!("reading {DOCUMENT}"))?;
    let mut all = Vec::new();
    for src in SOURCES {
        let mut files = Vec::new();
        walk(&root.join(src), "", &mut files)?;
        let rooted = |m: String| match *src {
            SRC => m,
            other => format!("{other}/{m}"),
        };
        all.extend(modules(&files).into_iter().map(rooted));
    }
    let exists = |p: &str| root.join(p).exists() || root.join(SRC).join(p).exists();
    Ok(problems(&doc, &all, exists))
}

/// The files under `dir`, relative to the walk's start.
fn walk(dir: &Path, rel: &str, out: &mut Vec<String>) -> Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = format!("{rel}{name}");
        if entry.file_type()?.is_dir() {
            walk(&entry.path(), &format!("{path}/"), out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

/// The modules of a source tree given its files (relative paths, `/`):
/// files as they are, directories with a trailing `/`, sorted.
pub fn modules(files: &[String]) -> Vec<String> {
    let test_only = |f: &str| f.ends_with("tests.rs");
    let mut out = Vec::new();
    for f in files.iter().filter(|f| f.ends_with(".rs")) {
        let mut dir = String::new();
        let segments: Vec<&str> = f.split('/').collect();
        for seg in &segments[..segments.len() - 1] {
            dir.push_str(seg);
            dir.push('/');
            let has_code = files
                .iter()
                .any(|g| g.starts_with(&dir) && g.ends_with(".rs") && !test_only(g));
            if has_code && !out.contains(&dir) {
                out.push(dir.clone());
            }
        }
        let is_mod = segments.last() == Some(&"mod.rs") && segments.len() > 1;
        if !test_only(f) && !is_mod {
            out.push(f.clone());
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The backticked words of a markdown text (inline code spans).
fn backticked(doc: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut in_fence = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        out.extend(line.split('`').skip(1).step_by(2));
    }
    out
}

/// Whether a backticked word is a repository path (see the module doc).
fn is_path(word: &str) -> bool {
    let refused = [
        ' ', ':', '<', '>', '*', '{', '}', '=', '@', '(', '$', '?', '[', ',',
    ];
    if word.is_empty()
        || word.contains(refused)
        || word.starts_with('/')
        || word.starts_with("target/")
        || word.starts_with('-')
    {
        return false;
    }
    match word.split_once('/') {
        Some((first, _)) => !first.contains('.') && !first.is_empty(),
        None => EXTENSIONS.iter().any(|e| word.ends_with(e)) && word.len() > 3,
    }
}

/// Modules the document does not name, and paths it names that do not exist.
pub fn problems(doc: &str, modules: &[String], exists: impl Fn(&str) -> bool) -> Vec<String> {
    let words = backticked(doc);
    let mut out = Vec::new();
    for m in modules {
        let full = format!("{SRC}/{m}");
        let named = words.iter().any(|w| {
            let w = w.trim_end_matches('/');
            w == m.trim_end_matches('/') || w == full.trim_end_matches('/')
        });
        if !named {
            out.push(format!(
                "{DOCUMENT} does not name the module `{m}` (write `{m}` where it belongs)"
            ));
        }
    }
    let mut dead: Vec<&str> = words
        .into_iter()
        .filter(|w| is_path(w) && !exists(w))
        .collect();
    dead.dedup();
    for w in dead {
        out.push(format!(
            "{DOCUMENT} names `{w}`, which is no path of the repository (nor of {SRC})"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn modules_are_files_and_directories_without_test_only_ones() {
        let m = modules(&files(&[
            "lib.rs",
            "proxy/mod.rs",
            "proxy/pool.rs",
            "proxy/pool/key_and_limit_tests.rs",
            "oci/sign_tests.rs",
            "oci/mod.rs",
            "bin/cni/main.rs",
            "defaults.yaml",
        ]));
        assert_eq!(
            m,
            [
                "bin/",
                "bin/cni/",
                "bin/cni/main.rs",
                "lib.rs",
                "oci/",
                "proxy/",
                "proxy/pool.rs"
            ]
        );
    }

    #[test]
    fn a_module_the_document_does_not_name_is_reported() {
        let modules = files(&["proxy/", "proxy/pool.rs", "netns.rs"]);
        let doc = "The pool (`gateway/src/proxy/pool.rs`) in `proxy/`.\n";
        let p = problems(doc, &modules, |_| true);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("`netns.rs`"), "{p:?}");
        let doc = format!("{doc}Pod sockets: `netns.rs`.\n");
        assert_eq!(problems(&doc, &modules, |_| true), Vec::<String>::new());
        // A name inside a fenced block is not a mention.
        let fenced = "```\n`netns.rs`\n```\n`proxy/pool.rs` `proxy`";
        assert_eq!(problems(fenced, &modules, |_| true).len(), 1);
    }

    #[test]
    fn a_path_that_does_not_exist_is_reported() {
        let doc = "See `inpod/netns.rs`, `netns.rs`, `sdk/wit/policy.wit` and `docs/gone.md`; \
                   not paths: `tidegate.io/mesh`, `/healthz/ready`, `fuzz/corpus/<target>`, \
                   `target/plugins`, `discovery.k8s.io/v1`, `tidegate:policy/types@0.3.0`, \
                   `cargo xtask test`, `h2`, `0.3.0`.";
        let exists = |p: &str| ["netns.rs", "sdk/wit/policy.wit"].contains(&p);
        let p = problems(doc, &[], exists);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("`inpod/netns.rs`"), "{p:?}");
        assert!(p[1].contains("`docs/gone.md`"), "{p:?}");
    }
}
