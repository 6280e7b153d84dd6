//! The shell blocks of the READMEs, run against the running demo.
//!
//! Every fenced block marked `sh` or `bash` in a document of [`DOCUMENTS`]
//! is a script a reader is meant to run: it runs in the repository root with
//! `bash -euo pipefail` while the demo gateway is up, and must exit 0. A
//! block that cannot run here (it needs a cluster, or runs for half an hour)
//! is preceded by `<!-- readme-test: skip (why) -->`, and the reason is
//! printed. A block written for "any empty directory" is preceded by
//! `<!-- readme-test: in-tempdir [SUBDIR] -->`: it runs in a directory of
//! its own, shared by the document's blocks so marked (SUBDIR below it,
//! for a block that continues where an earlier one `cd`-ed). A few lines are
//! replaced because the test command itself already does them (see
//! [`SUBSTITUTED`]).

use std::path::Path;

use anyhow::{Context, Result};

use crate::checks::Checks;

/// The documents whose shell blocks are run, in this order.
pub const DOCUMENTS: &[&str] = &[
    "README.md",
    "sdk/README.md",
    "docs/performance.md",
    "docs/drain-lab.md",
    "docs/oci.md",
];

/// Lines (by prefix) the test does not run, and why: they are what is
/// running the test, or what it already did.
const SUBSTITUTED: &[(&str, &str)] = &[
    (
        "cargo xtask demo",
        "the demo is running: the test started it",
    ),
    ("cargo xtask test", "this is the test command"),
    (
        "cargo install --path gateway",
        "target/debug (the test's build) is first on PATH instead",
    ),
];

const MARK: &str = "<!-- readme-test:";

/// One fenced shell block.
#[derive(Debug, PartialEq)]
pub struct Block {
    /// 1-based line of the opening fence.
    pub line: usize,
    pub script: String,
    pub mode: Mode,
}

/// Where and whether a block runs (its preceding `readme-test` comment).
#[derive(Debug, PartialEq)]
pub enum Mode {
    /// In the repository root.
    Root,
    /// Not at all, for this reason.
    Skip(String),
    /// In the document's own empty directory, or this subdirectory of it.
    TempDir(Option<String>),
}

impl Mode {
    fn parse(comment: &str) -> Mode {
        let Some(rest) = comment.strip_prefix(MARK) else {
            return Mode::Root;
        };
        let rest = rest.trim().trim_end_matches("-->").trim();
        if let Some(why) = rest.strip_prefix("skip") {
            let why = why.trim().trim_start_matches('(').trim_end_matches(')');
            return Mode::Skip(why.to_owned());
        }
        if let Some(sub) = rest.strip_prefix("in-tempdir") {
            let sub = sub.trim();
            return Mode::TempDir((!sub.is_empty()).then(|| sub.to_owned()));
        }
        Mode::Skip(format!("unknown readme-test comment {comment:?}"))
    }
}

/// The `sh`/`bash` blocks of a markdown text.
pub fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = markdown.lines().enumerate();
    let mut last_text: Option<&str> = None;
    while let Some((i, line)) = lines.next() {
        let trimmed = line.trim_start();
        let Some(info) = trimmed.strip_prefix("```") else {
            if !trimmed.is_empty() {
                last_text = Some(trimmed);
            }
            continue;
        };
        let lang = info.split_whitespace().next().unwrap_or("");
        let mut body = Vec::new();
        for (_, l) in lines.by_ref() {
            if l.trim_start().starts_with("```") {
                break;
            }
            body.push(l);
        }
        if matches!(lang, "sh" | "bash") {
            out.push(Block {
                line: i + 1,
                script: body.join("\n"),
                mode: last_text.map(Mode::parse).unwrap_or(Mode::Root),
            });
        }
        last_text = None;
    }
    out
}

/// The script with [`SUBSTITUTED`] lines turned into `echo` notes.
fn substituted(script: &str) -> String {
    script
        .lines()
        .map(|l| {
            match SUBSTITUTED
                .iter()
                .find(|(p, _)| l.trim_start().starts_with(p))
            {
                Some((p, why)) => format!("echo 'readme-test: not running `{p}`: {why}'"),
                None => l.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs every block of every document, one check per block.
pub fn run_all(root: &Path, checks: &mut Checks) -> Result<()> {
    // New crates made by the blocks (`tidegate-plugin new`) build here, so
    // a second run (and the CLI test's, which uses the same directory) is
    // incremental; dependencies come from cargo's cache, never the network.
    let cargo_target = root.join("target").join("plugin-new-test");
    let env = [
        ("CARGO_TARGET_DIR", cargo_target.display().to_string()),
        ("CARGO_NET_OFFLINE", "true".to_owned()),
    ];
    for doc in DOCUMENTS {
        let text =
            std::fs::read_to_string(root.join(doc)).with_context(|| format!("reading {doc}"))?;
        let tempdir = root
            .join("target")
            .join("readme-test")
            .join(doc.replace('/', "_"));
        let _ = std::fs::remove_dir_all(&tempdir);
        std::fs::create_dir_all(&tempdir)
            .with_context(|| format!("creating {}", tempdir.display()))?;
        for block in blocks(&text) {
            let name = format!("{doc}:{} shell block", block.line);
            let dir = match &block.mode {
                Mode::Skip(why) => {
                    checks.skip(&name, why);
                    continue;
                }
                Mode::Root => root.to_path_buf(),
                Mode::TempDir(None) => tempdir.clone(),
                Mode::TempDir(Some(sub)) => tempdir.join(sub),
            };
            let script = substituted(&block.script);
            let result = crate::checks::bash(&dir, &script, &env).map(|_| ());
            checks.record(&name, result);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_shell_blocks_and_skip_marks() {
        let md = "text\n```sh\necho a\n```\n\n<!-- readme-test: skip (needs a cluster) -->\n\
                  ```bash\nkubectl apply -k x\n```\n```yaml\na: 1\n```\n```sh\necho b\n```\n";
        let b = blocks(md);
        assert_eq!(b.len(), 3);
        assert_eq!((b[0].line, b[0].script.as_str()), (2, "echo a"));
        assert_eq!(b[0].mode, Mode::Root);
        assert_eq!(b[1].mode, Mode::Skip("needs a cluster".into()));
        assert_eq!((b[2].script.as_str(), &b[2].mode), ("echo b", &Mode::Root));
    }

    #[test]
    fn parses_modes() {
        assert_eq!(
            Mode::parse("<!-- readme-test: in-tempdir -->"),
            Mode::TempDir(None)
        );
        assert_eq!(
            Mode::parse("<!-- readme-test: in-tempdir my-policy -->"),
            Mode::TempDir(Some("my-policy".into()))
        );
        assert!(matches!(
            Mode::parse("<!-- readme-test: sometimes -->"),
            Mode::Skip(_)
        ));
        assert_eq!(Mode::parse("plain text"), Mode::Root);
    }

    #[test]
    fn substitutes_only_what_the_test_already_does() {
        let s = substituted("cargo xtask demo   # x\ncurl -s 127.0.0.1:15000/policies");
        assert!(s.starts_with("echo 'readme-test: not running `cargo xtask demo`"));
        assert!(s.ends_with("\ncurl -s 127.0.0.1:15000/policies"));
    }
}
