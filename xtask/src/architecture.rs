//! ARCHITECTURE.md against the code: it names every crate and every
//! folder of the node gateway, its crate table says what each crate imports
//! as the manifests do, and it names no path that is not there. The
//! inventory of files is `docs/module-map.md`, generated (`module_map.rs`).
//!
//! - A crate is each member of the workspace (`Cargo.toml`'s `members`);
//!   its row of the table under `## Crates` has its path (`gateway/`) in
//!   the second column and, in the third, every `tidegate*` crate of its
//!   `[dependencies]` in backticks (dev-dependencies are not imports) and
//!   no other.
//! - A folder is each directory of `gateway/src` holding code (not only
//!   sibling test files, `*tests.rs`); it is named when the
//!   document has it in backticks, from the repository root
//!   (`gateway/src/dns/`) or relative to `gateway/src` (`dns/`).
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
const EXTENSIONS: &[&str] = &[".rs", ".md", ".toml", ".yaml", ".yml", ".wit", ".json"];

/// Every problem of the repository's ARCHITECTURE.md, one line each.
pub fn check(root: &Path) -> Result<Vec<String>> {
    let doc = std::fs::read_to_string(root.join(DOCUMENT))
        .with_context(|| format!("reading {DOCUMENT}"))?;
    let mut folders = Vec::new();
    for entry in std::fs::read_dir(root.join(SRC)).with_context(|| format!("reading {SRC}"))? {
        let entry = entry?;
        if entry.file_type()?.is_dir() && has_code(&entry.path())? {
            folders.push(format!("{}/", entry.file_name().to_string_lossy()));
        }
    }
    folders.sort();
    let workspace =
        std::fs::read_to_string(root.join("Cargo.toml")).context("reading Cargo.toml")?;
    let mut crates = Vec::new();
    for member in members(&workspace) {
        let manifest = std::fs::read_to_string(root.join(&member).join("Cargo.toml"))
            .with_context(|| format!("reading {member}/Cargo.toml"))?;
        crates.push((format!("{member}/"), imports(&manifest)));
    }
    let exists = |p: &str| root.join(p).exists() || root.join(SRC).join(p).exists();
    let mut out = problems(&doc, &folders, exists);
    out.extend(table_problems(&doc, &crates));
    Ok(out)
}

/// Whether a directory holds a `.rs` file that is not a sibling test
/// (`*tests.rs`), at any depth.
fn has_code(dir: &Path) -> Result<bool> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let code = if entry.file_type()?.is_dir() {
            has_code(&entry.path())?
        } else {
            name.ends_with(".rs") && !name.ends_with("tests.rs")
        };
        if code {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The members of a workspace manifest (`members = ["a", "b"]`, one line).
pub fn members(workspace: &str) -> Vec<String> {
    workspace
        .lines()
        .find_map(|l| l.trim().strip_prefix("members"))
        .map(|l| l.split('"').skip(1).step_by(2).map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The `tidegate*` crates a manifest's `[dependencies]` name, sorted.
pub fn imports(manifest: &str) -> Vec<String> {
    let mut section = "";
    let mut out = Vec::new();
    for line in manifest.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            section = t;
            continue;
        }
        let normal = section == "[dependencies]"
            || (section.starts_with("[target.") && section.ends_with(".dependencies]"));
        if !normal || !t.starts_with("tidegate") {
            continue;
        }
        if let Some(name) = t.split(['=', '.', ' ']).next() {
            out.push(name.to_owned());
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The crate table's rows against each crate's imports: a row per crate
/// (by its path), its third column the crate's `tidegate*` imports.
pub fn table_problems(doc: &str, crates: &[(String, Vec<String>)]) -> Vec<String> {
    let rows: Vec<Vec<&str>> = doc
        .lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| l.split('|').map(str::trim).collect())
        .collect();
    let mut out = Vec::new();
    for (path, want) in crates {
        let cell = format!("`{path}`");
        let Some(row) = rows.iter().find(|r| r.get(2) == Some(&cell.as_str())) else {
            out.push(format!(
                "{DOCUMENT}'s crate table has no row for `{path}` (a workspace member)"
            ));
            continue;
        };
        let mut named: Vec<String> = row
            .get(3)
            .map(|c| c.split('`').skip(1).step_by(2).map(str::to_owned).collect())
            .unwrap_or_default();
        named.sort();
        if &named != want {
            out.push(format!(
                "{DOCUMENT}'s crate table says `{path}` imports {named:?}; its Cargo.toml's [dependencies] say {want:?}"
            ));
        }
    }
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

/// Folders of the gateway the document does not name, and paths it names
/// that do not exist.
pub fn problems(doc: &str, folders: &[String], exists: impl Fn(&str) -> bool) -> Vec<String> {
    let words = backticked(doc);
    let mut out = Vec::new();
    for m in folders {
        let full = format!("{SRC}/{m}");
        let named = words.iter().any(|w| {
            let w = w.trim_end_matches('/');
            w == m.trim_end_matches('/') || w == full.trim_end_matches('/')
        });
        if !named {
            out.push(format!(
                "{DOCUMENT} does not name the folder `{m}` of {SRC} (write `{m}` where it belongs)"
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
    fn a_folder_the_document_does_not_name_is_reported() {
        let folders = files(&["proxy/", "dns/"]);
        let doc = "The data path (`gateway/src/proxy/`).\n";
        let p = problems(doc, &folders, |_| true);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("`dns/`"), "{p:?}");
        let doc = format!("{doc}The DNS proxy: `dns/`.\n");
        assert_eq!(problems(&doc, &folders, |_| true), Vec::<String>::new());
        // A name inside a fenced block is not a mention.
        let fenced = "```\n`dns/`\n```\n`proxy/`";
        assert_eq!(problems(fenced, &folders, |_| true).len(), 1);
    }

    #[test]
    fn the_crate_table_says_what_the_manifests_import() {
        let manifest = "[package]\nname = \"tidegate-ca\"\n\n[dependencies]\ntidegate-base = { path = \"../base\" }\ntidegate-xds.workspace = true\nserde = \"1\"\n\n[dev-dependencies]\ntidegate-authz = { path = \"../authz\" }\n";
        assert_eq!(imports(manifest), ["tidegate-base", "tidegate-xds"]);
        let crates = vec![
            ("ca/".to_owned(), imports(manifest)),
            ("base/".to_owned(), vec![]),
        ];
        let doc = "| crate | path | imports | role |\n|---|---|---|---|\n\
                   | `tidegate-ca` | `ca/` | `tidegate-base` | the CA |\n";
        let p = table_problems(doc, &crates);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(
            p[0].contains("`ca/` imports") && p[0].contains("tidegate-xds"),
            "{p:?}"
        );
        assert!(p[1].contains("no row for `base/`"), "{p:?}");
        let doc = "| `tidegate-ca` | `ca/` | `tidegate-xds`, `tidegate-base` | the CA |\n\
                   | `tidegate-base` | `base/` | — | leaves |\n";
        assert_eq!(table_problems(doc, &crates), Vec::<String>::new());
        assert_eq!(
            members("[workspace]\nmembers = [\"ca\", \"base\"]\n"),
            ["ca", "base"]
        );
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
