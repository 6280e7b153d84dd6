//! What the manifest tests read: a file of the repository by its path, the
//! YAML documents of a text, every YAML file and every kustomization under
//! `deploy/`, the installs among them, and the documents that show an
//! install.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::Kustomization;

pub(super) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub(super) fn deploy() -> PathBuf {
    repo().join("deploy")
}

/// The documents of a (multi-document) YAML text.
pub(super) fn documents_of(text: &str, origin: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{origin}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

pub(super) fn documents(path: &Path) -> Vec<Value> {
    documents_of(
        &std::fs::read_to_string(path).unwrap(),
        &path.display().to_string(),
    )
}

/// Every directory under `deploy/` and the directories below it.
fn deploy_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut stack = vec![deploy()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            }
        }
        dirs.push(d);
    }
    dirs.sort();
    dirs
}

/// Every `.yaml` file under `deploy/`, sorted.
pub(super) fn yaml_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for d in deploy_dirs() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_file() && p.extension().is_some_and(|x| x == "yaml") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

/// Every directory under `deploy/` holding a `kustomization.yaml`.
pub(super) fn kustomization_dirs() -> Vec<PathBuf> {
    deploy_dirs()
        .into_iter()
        .filter(|d| d.join("kustomization.yaml").exists())
        .collect()
}

/// Every kustomization that is not a component (what `kubectl apply -k`
/// installs), relative to `deploy/`.
pub(super) fn install_dirs() -> Vec<String> {
    kustomization_dirs()
        .into_iter()
        .filter(|d| !Kustomization::read(d).is_component())
        .map(|d| {
            d.strip_prefix(deploy())
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// The documents that show an install and how to check it, each with its
/// text.
pub(super) fn install_docs() -> Vec<(&'static str, String)> {
    [
        "README.md",
        "deploy/README.md",
        "docs/istio.md",
        "docs/troubleshooting.md",
    ]
    .into_iter()
    .map(|doc| (doc, std::fs::read_to_string(repo().join(doc)).unwrap()))
    .collect()
}
