//! deploy/Dockerfile builds the image for linux/amd64 and linux/arm64: its
//! build stage runs on the builder's platform and cross-compiles for
//! `TARGETARCH` (the gateway and the CA for `<arch>-unknown-linux-gnu`, the
//! CNI plugin statically for `<arch>-unknown-linux-musl`), the final stage is
//! the target platform's, and every binary the manifests run is in it. The
//! build stage's architecture mapping is run here with `sh`, up to the
//! point where it would install toolchains.

use std::collections::BTreeSet;
use std::process::Command;

use super::kustomize;
use super::read::{deploy, install_dirs};

/// The platforms the image is built for, and each one's Rust architecture.
const PLATFORMS: &[(&str, &str)] = &[("linux/amd64", "x86_64"), ("linux/arm64", "aarch64")];

/// `s` with every run of whitespace made one space.
fn squeeze(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The Dockerfile's instructions as Docker reads them: comment lines
/// dropped, lines ending in `\` joined with the next.
fn instructions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                if !current.trim().is_empty() {
                    out.push(current.trim().to_owned());
                }
                current.clear();
            }
        }
    }
    out
}

fn dockerfile() -> Vec<String> {
    instructions(&std::fs::read_to_string(deploy().join("Dockerfile")).unwrap())
}

/// The build stage's RUN, and its part before `rustup target add` (the
/// architecture mapping and the toolchain variables).
fn build_script() -> (String, String) {
    let run = dockerfile()
        .into_iter()
        .find(|i| i.starts_with("RUN ") && i.contains("TARGETARCH"))
        .expect("a RUN that reads TARGETARCH");
    let script = run.strip_prefix("RUN ").unwrap().to_owned();
    let cut = script.find("rustup target add").expect("rustup target add");
    (script.clone(), script[..cut].to_owned())
}

/// Runs the mapping part for `target` (built on the same architecture, so
/// no toolchain is installed) and returns the variables it exports.
fn mapped(target: &str) -> Result<Vec<(String, String)>, String> {
    let (_, mapping) = build_script();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("{mapping} env"))
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("TARGETARCH", target)
        .env("BUILDARCH", target)
        .output()
        .expect("sh");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let env = String::from_utf8(out.stdout).unwrap();
    Ok(env
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| {
            k.starts_with("CARGO_")
                || k.starts_with("CC_")
                || k.starts_with("AR_")
                || k.starts_with("JEMALLOC")
        })
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect())
}

#[test]
fn the_build_stage_cross_compiles_for_each_target_architecture() {
    let steps = dockerfile();
    let froms: Vec<&String> = steps.iter().filter(|i| i.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "a build stage and the image: {froms:?}");
    assert!(
        froms[0].starts_with("FROM --platform=$BUILDPLATFORM ") && froms[0].ends_with(" AS build"),
        "the build stage runs on the builder's platform: {}",
        froms[0]
    );
    assert!(
        !froms[1].contains("--platform"),
        "the image's stage is the target platform's: {}",
        froms[1]
    );
    // TARGETARCH and BUILDARCH are declared inside the build stage (an ARG
    // before FROM is not visible in it).
    let build = &steps[steps.iter().position(|i| i == froms[0]).unwrap()..];
    for arg in ["ARG TARGETARCH", "ARG BUILDARCH"] {
        assert!(build.iter().any(|i| i == arg), "{arg} in the build stage");
    }

    for (platform, arch) in PLATFORMS {
        let docker_arch = platform.strip_prefix("linux/").unwrap();
        let env = mapped(docker_arch).unwrap_or_else(|e| panic!("{platform}: {e}"));
        let get = |k: &str| {
            env.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
                .unwrap_or_else(|| panic!("{platform}: {k} is not set ({env:?})"))
        };
        let gnu = format!("{arch}-unknown-linux-gnu");
        let musl = format!("{arch}-unknown-linux-musl");
        let upper = |t: &str| t.to_uppercase().replace('-', "_");
        let gcc = format!("{arch}-linux-gnu-gcc");
        assert_eq!(get(&format!("CARGO_TARGET_{}_LINKER", upper(&gnu))), gcc);
        assert_eq!(get(&format!("CC_{}", gnu.replace('-', "_"))), gcc);
        assert_eq!(
            get(&format!("CARGO_TARGET_{}_LINKER", upper(&musl))),
            "rust-lld",
            "{platform}: tidegate-cni is linked by the toolchain's lld, statically"
        );
        let page = env.iter().find(|(k, _)| k == "JEMALLOC_SYS_WITH_LG_PAGE");
        match *arch {
            // 64 KiB page kernels exist on arm64; jemalloc built for 4 KiB
            // pages does not start there.
            "aarch64" => assert_eq!(page.map(|(_, v)| v.as_str()), Some("16")),
            _ => assert_eq!(page, None),
        }
    }
    let refused = mapped("s390x").expect_err("an architecture the image is not built for");
    assert!(refused.contains("TARGETARCH=s390x"), "{refused}");

    // What is built with those variables, and what the image takes of it.
    let script = squeeze(&build_script().0);
    for part in [
        r#"if [ "$TARGETARCH" != "$BUILDARCH" ]; then"#,
        r#"apt-get install -y --no-install-recommends "$cross" "$libc""#,
        r#"rustup target add wasm32-unknown-unknown "$gnu" "$musl""#,
        "cargo xtask plugins",
        r#"cargo build --release --target "$gnu" -p tidegate --bin tidegate -p tidegate-ca --bin tidegate-ca"#,
        r#"cargo build --release --target "$musl" -p tidegate-cni"#,
        r#"cp "target/$gnu/release/tidegate" "target/$gnu/release/tidegate-ca" "target/$musl/release/tidegate-cni" /out/bin/"#,
    ] {
        let part = squeeze(part);
        assert!(script.contains(&part), "the build runs {part:?}:\n{script}");
    }
    for copy in [
        "COPY --from=build /out/bin/ /usr/local/bin/",
        "COPY --from=build /out/plugins/ /opt/tidegate/plugins/",
    ] {
        assert!(steps.iter().any(|i| i == copy), "{copy}");
    }
}

#[test]
fn the_documented_platforms_are_the_ones_built() {
    let built: BTreeSet<&str> = PLATFORMS.iter().map(|(p, _)| *p).collect();
    for doc in [deploy().join("Dockerfile"), deploy().join("README.md")] {
        let text = std::fs::read_to_string(&doc).unwrap();
        let mut shown = 0;
        for (at, _) in text.match_indices("--platform ") {
            let list: String = text[at + "--platform ".len()..]
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '`')
                .collect();
            let listed: BTreeSet<&str> = list.split(',').collect();
            assert!(
                listed.is_subset(&built),
                "{}: --platform {list}: built are {built:?}",
                doc.display()
            );
            shown += 1;
        }
        assert!(shown > 0, "{} shows the buildx command", doc.display());
    }
}

/// Every container of a render that runs the image runs a binary the image
/// has.
#[test]
fn the_manifests_run_binaries_the_image_has() {
    let in_image: BTreeSet<String> = ["tidegate", "tidegate-ca", "tidegate-cni"]
        .iter()
        .map(|b| format!("/usr/local/bin/{b}"))
        .collect();
    let (script, _) = build_script();
    for b in &in_image {
        let name = b.rsplit('/').next().unwrap();
        assert!(
            script.contains(&format!("/release/{name}\"")),
            "the build copies {name}"
        );
    }
    let mut checked = 0;
    for dir in install_dirs() {
        let Some(r) = kustomize(&dir) else { return };
        for o in &r.objects {
            let spec = &o["spec"]["template"]["spec"];
            let containers = spec["containers"].as_array().into_iter().flatten();
            let init = spec["initContainers"].as_array().into_iter().flatten();
            for c in containers.chain(init) {
                if !c["image"]
                    .as_str()
                    .is_some_and(|i| i.starts_with("ghcr.io/tidegate/tidegate:"))
                {
                    continue;
                }
                let first = c["command"][0].as_str().map(str::to_owned);
                let first = first.unwrap_or_else(|| {
                    panic!("deploy/{dir}: {} names its binary in `command`", c["name"])
                });
                assert!(
                    in_image.contains(&first),
                    "deploy/{dir}: {} runs {first}, not in the image",
                    c["name"]
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 0, "the renders run the image");
}

#[test]
fn instructions_are_read_as_docker_reads_them() {
    let text = "# c\nFROM a AS b\nRUN x; \\\n  # inside\n    y\n\nCMD [\"run\"]\n";
    assert_eq!(
        instructions(text),
        ["FROM a AS b", "RUN x;     y", "CMD [\"run\"]"]
    );
}
