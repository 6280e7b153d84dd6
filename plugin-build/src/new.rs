//! `tidegate-plugin new`: a standalone policy crate (SDK dependency, a
//! policy skeleton, a trace and native tests) that builds and passes its
//! trace as written.

use std::path::{Path, PathBuf};

const CARGO_TOML: &str = include_str!("template/Cargo.toml.in");
const LIB_RS: &str = include_str!("template/lib.rs.in");
const TRACE_YAML: &str = include_str!("template/trace.yaml.in");
const GITIGNORE: &str = include_str!("template/gitignore.in");

/// Where the SDK path came from, for the error when it is not an SDK.
#[derive(Debug, Clone)]
pub enum SdkSource {
    /// `--sdk PATH`.
    Flag(PathBuf),
    /// The SDK source the running binary was built from.
    BuiltFrom(PathBuf),
}

/// What to create.
#[derive(Debug, Clone)]
pub struct NewOptions {
    /// Package name; also the component's file name and a natural policy name.
    pub name: String,
    /// The crate directory; `./<name>` when `None`.
    pub dir: Option<PathBuf>,
    pub sdk: SdkSource,
}

/// What was created.
#[derive(Debug)]
pub struct Created {
    pub dir: PathBuf,
    /// The SDK the crate depends on (absolute).
    pub sdk: PathBuf,
    pub files: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum NewError {
    #[error("invalid plugin name {name:?}: {why}")]
    BadName { name: String, why: String },
    #[error("{} exists and is not empty; choose another name or --path", .0.display())]
    NotEmpty(PathBuf),
    #[error("{} exists and is not a directory", .0.display())]
    NotADirectory(PathBuf),
    #[error(
        "--sdk {}: not the tidegate SDK ({why}); pass the sdk/ directory of a tidegate checkout",
        .path.display()
    )]
    SdkFlag { path: PathBuf, why: String },
    #[error(
        "no tidegate SDK at {} ({why}), the source this tidegate was built from; pass --sdk PATH \
         (the sdk/ directory of a tidegate checkout)",
        .path.display()
    )]
    SdkBuiltFrom { path: PathBuf, why: String },
    #[error("cannot write {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Writes the crate. Refuses a bad name, an existing non-empty directory
/// and an SDK path without the SDK, before writing anything.
pub fn create(opts: &NewOptions) -> Result<Created, NewError> {
    let type_name = check_name(&opts.name)?;
    let sdk = find_sdk(&opts.sdk)?;
    let dir = opts
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&opts.name));
    match std::fs::read_dir(&dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(NewError::NotEmpty(dir));
            }
        }
        Err(_) if dir.exists() => return Err(NewError::NotADirectory(dir)),
        Err(_) => {}
    }
    let fill = |template: &str| {
        template
            .replace("{{name}}", &opts.name)
            .replace("{{Struct}}", &type_name)
            .replace("{{sdk}}", &toml_string(&sdk.to_string_lossy()))
    };
    let files = [
        ("Cargo.toml", fill(CARGO_TOML)),
        ("src/lib.rs", fill(LIB_RS)),
        ("trace.yaml", fill(TRACE_YAML)),
        (".gitignore", fill(GITIGNORE)),
    ];
    let mut written = Vec::new();
    for (rel, text) in files {
        let path = dir.join(rel);
        let write = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, text));
        write.map_err(|source| NewError::Write {
            path: path.clone(),
            source,
        })?;
        written.push(path);
    }
    Ok(Created {
        dir,
        sdk,
        files: written,
    })
}

/// The SDK directory, absolute: it must hold the `tidegate-sdk` package.
fn find_sdk(source: &SdkSource) -> Result<PathBuf, NewError> {
    let (path, refuse): (&Path, fn(PathBuf, String) -> NewError) = match source {
        SdkSource::Flag(p) => (p, |path, why| NewError::SdkFlag { path, why }),
        SdkSource::BuiltFrom(p) => (p, |path, why| NewError::SdkBuiltFrom { path, why }),
    };
    let dir = path
        .canonicalize()
        .map_err(|e| refuse(path.to_owned(), e.to_string()))?;
    let manifest = dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .map_err(|e| refuse(dir.clone(), format!("reading Cargo.toml: {e}")))?;
    let is_sdk = text.lines().any(|l| {
        l.split_once('=')
            .is_some_and(|(k, v)| k.trim() == "name" && v.trim() == "\"tidegate-sdk\"")
    });
    if !is_sdk {
        return Err(refuse(
            dir,
            "its Cargo.toml is not the tidegate-sdk package".into(),
        ));
    }
    Ok(dir)
}

/// Names Rust or cargo would refuse (as a package or as the library name
/// `-` → `_` becomes), or that clash with the SDK's crate.
const RESERVED: &[&str] = &[
    "abstract",
    "alloc",
    "as",
    "async",
    "await",
    "become",
    "box",
    "break",
    "const",
    "continue",
    "core",
    "crate",
    "do",
    "dyn",
    "else",
    "enum",
    "extern",
    "false",
    "final",
    "fn",
    "for",
    "gen",
    "if",
    "impl",
    "in",
    "let",
    "loop",
    "macro",
    "match",
    "mod",
    "move",
    "mut",
    "override",
    "priv",
    "proc_macro",
    "pub",
    "ref",
    "return",
    "self",
    "static",
    "std",
    "struct",
    "super",
    "test",
    "tidegate_sdk",
    "trait",
    "true",
    "try",
    "type",
    "typeof",
    "union",
    "unsafe",
    "unsized",
    "use",
    "virtual",
    "where",
    "while",
    "yield",
];

/// Type names the skeleton's code already uses; a policy type named like
/// one of them gets a `Plugin` suffix.
const TAKEN_TYPE_NAMES: &[&str] = &[
    "Action",
    "Box",
    "Config",
    "Debug",
    "Err",
    "Event",
    "None",
    "Ok",
    "Option",
    "Policy",
    "Result",
    "ShutdownStarted",
    "Some",
    "String",
    "Trace",
    "Vec",
    "WorkloadInfo",
    "WorkloadState",
];

/// Checks a plugin name and returns the policy's type name (`my-policy` →
/// `MyPolicy`). A name is a lowercase crate name of at most 64 characters
/// (also valid as a policy name for `PUT /policies/<name>`).
pub fn check_name(name: &str) -> Result<String, NewError> {
    let bad = |why: &str| NewError::BadName {
        name: name.to_owned(),
        why: why.to_owned(),
    };
    if name.is_empty() || name.len() > 64 {
        return Err(bad("use 1 to 64 characters"));
    }
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        return Err(bad("start with a lowercase letter (a-z)"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    {
        return Err(bad("use only a-z, 0-9, '-' and '_'"));
    }
    if name.ends_with(['-', '_']) {
        return Err(bad("end with a letter or a digit"));
    }
    if RESERVED.contains(&name.replace('-', "_").as_str()) {
        return Err(bad("a Rust keyword or a reserved crate name"));
    }
    let camel: String = name
        .split(['-', '_'])
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect();
    Ok(if TAKEN_TYPE_NAMES.contains(&camel.as_str()) {
        camel + "Plugin"
    } else {
        camel
    })
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sdk() -> SdkSource {
        SdkSource::Flag(Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk"))
    }

    #[test]
    fn names_become_type_names_or_are_refused_with_the_rule() {
        assert_eq!(check_name("my-policy").unwrap(), "MyPolicy");
        assert_eq!(check_name("drain_v2").unwrap(), "DrainV2");
        assert_eq!(check_name("policy").unwrap(), "PolicyPlugin");
        assert_eq!(check_name("result").unwrap(), "ResultPlugin");
        for (name, why) in [
            ("", "1 to 64"),
            ("My-Policy", "lowercase letter"),
            ("2fast", "lowercase letter"),
            ("my policy", "only a-z"),
            ("my.policy", "only a-z"),
            ("trailing-", "end with"),
            ("self", "keyword"),
            ("tidegate-sdk", "reserved"),
        ] {
            let err = check_name(name).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("invalid plugin name {name:?}")),
                "{err}"
            );
            assert!(err.contains(why), "{name}: {err}");
        }
        assert!(check_name(&"a".repeat(65)).is_err());
    }

    #[test]
    fn creates_the_crate_with_an_absolute_sdk_path() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("my-policy");
        let created = create(&NewOptions {
            name: "my-policy".into(),
            dir: Some(dir.clone()),
            sdk: sdk(),
        })
        .unwrap();
        assert!(created.sdk.is_absolute());
        assert_eq!(created.files.len(), 4);
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        assert!(manifest.contains("name = \"my-policy\""), "{manifest}");
        assert!(manifest.contains("\n[workspace]\n"), "{manifest}");
        assert!(
            manifest.contains(&format!(
                "tidegate-sdk = {{ path = {} }}",
                toml_string(&created.sdk.to_string_lossy())
            )),
            "{manifest}"
        );
        let lib = std::fs::read_to_string(dir.join("src/lib.rs")).unwrap();
        assert!(lib.contains("export_policy!(MyPolicy);"), "{lib}");
        assert!(!lib.contains("{{"), "{lib}");
        let trace = std::fs::read_to_string(dir.join("trace.yaml")).unwrap();
        assert!(trace.contains("target/my-policy.wasm"), "{trace}");
    }

    #[test]
    fn an_empty_directory_is_used_a_non_empty_one_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let opts = |dir: &Path| NewOptions {
            name: "p".into(),
            dir: Some(dir.to_owned()),
            sdk: sdk(),
        };
        create(&opts(tmp.path())).unwrap();
        let err = create(&opts(tmp.path())).unwrap_err();
        assert!(matches!(err, NewError::NotEmpty(_)), "{err:?}");
        assert!(err
            .to_string()
            .ends_with("exists and is not empty; choose another name or --path"));
        let file = tmp.path().join("trace.yaml");
        let err = create(&opts(&file)).unwrap_err();
        assert!(matches!(err, NewError::NotADirectory(_)), "{err:?}");
    }

    #[test]
    fn a_missing_sdk_names_the_flag() {
        let tmp = tempfile::tempdir().unwrap();
        let err = create(&NewOptions {
            name: "p".into(),
            dir: Some(tmp.path().join("p")),
            sdk: SdkSource::BuiltFrom(tmp.path().join("gone/sdk")),
        })
        .unwrap_err();
        assert!(err.to_string().contains("pass --sdk PATH"), "{err}");
        let err = create(&NewOptions {
            name: "p".into(),
            dir: Some(tmp.path().join("p")),
            sdk: SdkSource::Flag(Path::new(env!("CARGO_MANIFEST_DIR")).to_owned()),
        })
        .unwrap_err();
        assert!(err.to_string().starts_with("--sdk "), "{err}");
        assert!(
            err.to_string().contains("not the tidegate-sdk package"),
            "{err}"
        );
        assert!(!tmp.path().join("p").exists(), "nothing written on refusal");
    }

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_string(r#"C:\a "b""#), r#""C:\\a \"b\"""#);
    }
}
