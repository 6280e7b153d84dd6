//! The generated regions of hand-written documents: the README's list of
//! crates (from the workspace's manifests) and of fuzz targets (from
//! `fuzz.rs`), and `docs/performance.md`'s contents (from its headings).
//!
//! A region lies between `<!-- generated: NAME -->` and
//! `<!-- end generated -->`; what is outside is written by hand.
//! `cargo xtask module-map` rewrites every region, and
//! `cargo xtask architecture` fails when one differs from what the sources
//! give, naming the document and the region.

use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::architecture;
use crate::module_map::{first_sentence, package_key};

const END: &str = "<!-- end generated -->";

/// The regions: the document, the region's name, and what fills it.
const REGIONS: &[(&str, &str, Source)] = &[
    ("README.md", "crates", Source::Crates),
    ("README.md", "fuzz-targets", Source::FuzzTargets),
    ("docs/performance.md", "contents", Source::Contents),
];

#[derive(Clone, Copy)]
enum Source {
    /// A line per workspace member: its path, package name and description.
    Crates,
    /// The fuzz targets the test command runs, counted and named.
    FuzzTargets,
    /// A link per `## ` heading of the document itself.
    Contents,
}

/// Every document with its regions filled as the sources give them.
fn generate(root: &Path) -> Result<Vec<(&'static str, String, String)>> {
    let mut out: Vec<(&'static str, String, String)> = Vec::new();
    for (doc, name, source) in REGIONS {
        let text = match out.iter().find(|(d, _, _)| d == doc) {
            Some((_, _, t)) => t.clone(),
            None => {
                std::fs::read_to_string(root.join(doc)).with_context(|| format!("reading {doc}"))?
            }
        };
        let body = match source {
            Source::Crates => crates(root)?,
            Source::FuzzTargets => fuzz_targets(root)?,
            Source::Contents => contents(&text),
        };
        let filled = fill(&text, name, &body).with_context(|| doc.to_string())?;
        out.retain(|(d, _, _)| d != doc);
        let committed = std::fs::read_to_string(root.join(doc))?;
        out.push((doc, committed, filled));
    }
    Ok(out)
}

/// Documents whose generated regions differ from what the sources give.
pub fn check(root: &Path) -> Result<Vec<String>> {
    Ok(generate(root)?
        .into_iter()
        .filter(|(_, committed, filled)| committed != filled)
        .map(|(doc, _, _)| {
            format!("{doc}'s generated region is not what the sources give: run `cargo xtask module-map`")
        })
        .collect())
}

/// Rewrites every region.
pub fn write(root: &Path) -> Result<()> {
    for (doc, committed, filled) in generate(root)? {
        if committed != filled {
            std::fs::write(root.join(doc), filled).with_context(|| format!("writing {doc}"))?;
            println!("wrote {doc}");
        }
    }
    Ok(())
}

/// The text with region `name`'s body replaced.
pub fn fill(text: &str, name: &str, body: &str) -> Result<String> {
    let start = format!("<!-- generated: {name} -->");
    let Some(begin) = text.find(&start) else {
        bail!("no `{start}` line");
    };
    let after = begin + start.len();
    let Some(end) = text[after..].find(END) else {
        bail!("`{start}` has no `{END}` after it");
    };
    Ok(format!(
        "{}\n{body}{}",
        &text[..after],
        &text[after + end..]
    ))
}

/// A line per workspace member, in the manifest's order.
fn crates(root: &Path) -> Result<String> {
    let workspace =
        std::fs::read_to_string(root.join("Cargo.toml")).context("reading Cargo.toml")?;
    let mut out = String::new();
    for member in architecture::members(&workspace) {
        let manifest = std::fs::read_to_string(root.join(&member).join("Cargo.toml"))
            .with_context(|| format!("reading {member}/Cargo.toml"))?;
        let name = package_key(&manifest, "name").unwrap_or_default();
        let description = package_key(&manifest, "description").unwrap_or_default();
        out.push_str(&format!("- `{member}/` (`{name}`): {description}\n"));
    }
    Ok(out)
}

/// The targets of [`crate::fuzz::TARGETS`], counted and named, each
/// checked to have its file and first doc line (the module map shows it).
fn fuzz_targets(root: &Path) -> Result<String> {
    let mut names = Vec::new();
    for t in crate::fuzz::TARGETS {
        let path = format!("fuzz/fuzz_targets/{t}.rs");
        let text =
            std::fs::read_to_string(root.join(&path)).with_context(|| format!("reading {path}"))?;
        first_sentence(&text).with_context(|| format!("{path} has no first doc line"))?;
        names.push(format!("`{t}`"));
    }
    Ok(format!("{} targets: {}.\n", names.len(), names.join(", ")))
}

/// A link per `## ` heading, outside fenced blocks.
pub fn contents(markdown: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if let Some(title) = line.strip_prefix("## ").filter(|_| !fenced) {
            out.push_str(&format!("- [{title}](#{})\n", anchor(title)));
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces
/// as hyphens.
pub fn anchor(title: &str) -> String {
    title
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_is_replaced_and_the_rest_kept() {
        let text = "intro\n<!-- generated: contents -->\n- old\n<!-- end generated -->\nrest\n";
        let filled = fill(text, "contents", "- new\n").unwrap();
        assert_eq!(
            filled,
            "intro\n<!-- generated: contents -->\n- new\n<!-- end generated -->\nrest\n"
        );
        assert!(fill(text, "crates", "x").is_err());
        assert!(fill("<!-- generated: crates -->\n", "crates", "x").is_err());
    }

    #[test]
    fn contents_link_each_second_level_heading() {
        let doc = "# T\n\n## Running the benches\n```sh\n## not a heading\n```\n### Sub\n## xDS apply: 10,000 to 100,000 workloads\n";
        assert_eq!(
            contents(doc),
            "- [Running the benches](#running-the-benches)\n\
             - [xDS apply: 10,000 to 100,000 workloads](#xds-apply-10000-to-100000-workloads)\n"
        );
    }
}
