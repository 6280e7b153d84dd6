//! The shell blocks of the READMEs, run against the running demo.
//!
//! Every fenced block marked `sh` or `bash` in a document of [`DOCUMENTS`]
//! is a script a reader is meant to run: it runs in the repository root with
//! `bash -euo pipefail` while the demo gateway is up, and must exit 0. A
//! block that cannot run here (it needs a cluster, or runs for half an hour)
//! is preceded by `<!-- readme-test: skip (why) -->`, and the reason is
//! printed. A few lines are replaced because the test command itself already
//! does them (see [`SUBSTITUTED`]).

use std::path::Path;

use anyhow::{Context, Result};

use crate::checks::Checks;

/// The documents whose shell blocks are run, in this order.
pub const DOCUMENTS: &[&str] = &["README.md", "sdk/README.md"];

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

const SKIP_MARK: &str = "<!-- readme-test: skip";

/// One fenced shell block.
#[derive(Debug, PartialEq)]
pub struct Block {
    /// 1-based line of the opening fence.
    pub line: usize,
    pub script: String,
    /// The reason given in a preceding skip comment.
    pub skip: Option<String>,
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
            let skip = last_text
                .and_then(|t| t.strip_prefix(SKIP_MARK))
                .map(|rest| {
                    rest.trim()
                        .trim_end_matches("-->")
                        .trim()
                        .trim_start_matches('(')
                        .trim_end_matches(')')
                        .to_owned()
                });
            out.push(Block {
                line: i + 1,
                script: body.join("\n"),
                skip,
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
    for doc in DOCUMENTS {
        let text =
            std::fs::read_to_string(root.join(doc)).with_context(|| format!("reading {doc}"))?;
        for block in blocks(&text) {
            let name = format!("{doc}:{} shell block", block.line);
            if let Some(why) = &block.skip {
                checks.skip(&name, why);
                continue;
            }
            let result = crate::checks::bash(root, &substituted(&block.script), &[]).map(|_| ());
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
        assert_eq!(
            (b[0].line, b[0].script.as_str(), b[0].skip.as_deref()),
            (2, "echo a", None)
        );
        assert_eq!(b[1].skip.as_deref(), Some("needs a cluster"));
        assert_eq!(
            (b[2].script.as_str(), b[2].skip.as_deref()),
            ("echo b", None)
        );
    }

    #[test]
    fn substitutes_only_what_the_test_already_does() {
        let s = substituted("cargo xtask demo   # x\ncurl -s 127.0.0.1:15000/policies");
        assert!(s.starts_with("echo 'readme-test: not running `cargo xtask demo`"));
        assert!(s.ends_with("\ncurl -s 127.0.0.1:15000/policies"));
    }
}
