//! `tidegate-cni install` / `tidegate-cni uninstall`: put the plugin on a node
//! and chain it into the node's primary CNI network configuration, or take it
//! out again. Run by the DaemonSet (see deploy/) with the host's CNI
//! directories mounted.
//!
//! - The primary configuration is the one the container runtime uses: the
//!   first `*.conflist`, `*.conf` or `*.json` file of the configuration
//!   directory in lexical order (libcni's rule).
//! - Install copies this executable into the binary directory first, then adds
//!   `{"type": "tidegate-cni", ...}` as the last plugin of the list, so the
//!   configuration never names a binary that is not there. A single-plugin
//!   `.conf` becomes a `.conflist` (the original is kept beside it as
//!   `<name>.tidegate-orig` and restored by uninstall). Both writes are atomic
//!   (temporary file + rename) and skipped when nothing changes, so running
//!   install again — or every few seconds with `--watch`, to re-chain after the
//!   primary plugin rewrites its file — is harmless.
//! - Uninstall removes our entry from every configuration, restores a
//!   converted `.conf`, then deletes the binary. With `--watch` it keeps
//!   running and keeps the plugin out (an installer of the previous pod
//!   may still re-chain it during a rollout); the binary is deleted in a
//!   round that found nothing to unchain, so the container runtime has
//!   re-read its configuration before the binary it named goes. That is
//!   the first step of removing tidegate from a node (deploy/uninstall):
//!   no pod is enrolled any more while the gateway still serves.

use std::fmt;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::{json, Map, Value};

const PLUGIN_TYPE: &str = "tidegate-cni";
const BACKUP_SUFFIX: &str = ".tidegate-orig";

/// Parsed command line of `install` / `uninstall`.
#[derive(Debug)]
pub struct Options {
    pub bin_dir: PathBuf,
    pub conf_dir: PathBuf,
    /// Written into our plugin entry when set (the plugin's defaults otherwise).
    pub socket: Option<String>,
    pub timeout_ms: Option<u64>,
    /// `capture` and `state_dir` keys (in-pod mode), written when set.
    pub capture: Option<String>,
    pub state_dir: Option<String>,
    /// Keep re-checking at this interval.
    pub watch: Option<Duration>,
}

#[derive(Debug)]
pub enum InstallError {
    Usage(String),
    NoConfig(PathBuf),
    Io(PathBuf, std::io::Error),
    BadConfig(PathBuf, String),
}

impl fmt::Display for InstallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InstallError::Usage(m) => write!(
                f,
                "{m}\nusage: tidegate-cni install --cni-bin-dir DIR --cni-conf-dir DIR \
                 [--socket PATH] [--timeout-ms N] [--capture node|inpod] [--state-dir DIR] \
                 [--watch SECONDS]\n       \
                 tidegate-cni uninstall --cni-bin-dir DIR --cni-conf-dir DIR [--watch SECONDS]"
            ),
            InstallError::NoConfig(dir) => write!(
                f,
                "no CNI network configuration (*.conflist, *.conf, *.json) in {}: \
                 tidegate-cni chains after the node's primary CNI plugin, install that first \
                 (or pass --watch to wait for it)",
                dir.display()
            ),
            InstallError::Io(p, e) => write!(f, "{}: {e}", p.display()),
            InstallError::BadConfig(p, m) => write!(f, "{}: {m}", p.display()),
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> InstallError + '_ {
    move |e| InstallError::Io(path.to_owned(), e)
}

/// Entry point for `tidegate-cni install|uninstall ARGS`.
pub fn main(command: &str, args: &[String]) -> ExitCode {
    let result = parse(command, args).and_then(|o| match command {
        "install" => match o.watch {
            None => install(&o).map(report),
            Some(every) => loop {
                match install(&o) {
                    Ok(changes) => report(changes),
                    Err(e @ InstallError::NoConfig(_)) => eprintln!("tidegate-cni: {e}"),
                    Err(e) => return Err(e),
                }
                std::thread::sleep(every);
            },
        },
        _ => match o.watch {
            None => uninstall(&o).map(report),
            Some(every) => loop {
                let unchained = unchain(&o)?;
                let nothing_chained = unchained.is_empty();
                report(unchained);
                if nothing_chained {
                    report(remove_binary(&o)?);
                }
                std::thread::sleep(every);
            },
        },
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tidegate-cni {command}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn report(changes: impl IntoIterator<Item = String>) {
    for c in changes {
        println!("tidegate-cni: {c}");
    }
}

pub fn parse(command: &str, args: &[String]) -> Result<Options, InstallError> {
    let mut o = Options {
        bin_dir: PathBuf::new(),
        conf_dir: PathBuf::new(),
        socket: None,
        timeout_ms: None,
        capture: None,
        state_dir: None,
        watch: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| InstallError::Usage(format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--cni-bin-dir" => o.bin_dir = value()?.into(),
            "--cni-conf-dir" => o.conf_dir = value()?.into(),
            "--socket" if command == "install" => o.socket = Some(value()?),
            "--timeout-ms" if command == "install" => {
                let v = value()?;
                o.timeout_ms = Some(
                    v.parse()
                        .ok()
                        .filter(|t| (1..=super::conf::MAX_TIMEOUT_MS).contains(t))
                        .ok_or_else(|| {
                            InstallError::Usage(format!(
                                "--timeout-ms {v:?} is not a number of milliseconds from 1 to {}",
                                super::conf::MAX_TIMEOUT_MS
                            ))
                        })?,
                );
            }
            "--capture" if command == "install" => {
                let v = value()?;
                if v != "node" && v != "inpod" {
                    return Err(InstallError::Usage(format!(
                        "--capture {v:?} is not node or inpod"
                    )));
                }
                o.capture = Some(v);
            }
            "--state-dir" if command == "install" => {
                let v = value()?;
                if !v.starts_with('/') {
                    return Err(InstallError::Usage(format!(
                        "--state-dir {v:?} is not an absolute path"
                    )));
                }
                o.state_dir = Some(v);
            }
            "--watch" => {
                let v = value()?;
                let secs: u64 = v.parse().ok().filter(|s| *s > 0).ok_or_else(|| {
                    InstallError::Usage(format!(
                        "--watch {v:?} is not a positive number of seconds"
                    ))
                })?;
                o.watch = Some(Duration::from_secs(secs));
            }
            other => {
                return Err(InstallError::Usage(format!(
                    "unknown argument {other:?} for {command}"
                )))
            }
        }
    }
    if o.bin_dir.as_os_str().is_empty() || o.conf_dir.as_os_str().is_empty() {
        return Err(InstallError::Usage(
            "--cni-bin-dir and --cni-conf-dir are required".into(),
        ));
    }
    Ok(o)
}

/// The runtime's network configuration: first config file in lexical order.
fn primary_config(dir: &Path) -> Result<Option<PathBuf>, InstallError> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("conflist" | "conf" | "json")
                )
        })
        .collect();
    files.sort();
    Ok(files.into_iter().next())
}

fn read_json(path: &Path) -> Result<Map<String, Value>, InstallError> {
    let text = fs::read_to_string(path).map_err(io(path))?;
    match serde_json::from_str(&text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(InstallError::BadConfig(
            path.into(),
            "not a JSON object".into(),
        )),
        Err(e) => Err(InstallError::BadConfig(path.into(), e.to_string())),
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory.
fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), InstallError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = path.with_file_name(format!(".{name}.tidegate-tmp"));
    let mut f = fs::File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode)).map_err(io(&tmp))?;
    fs::rename(&tmp, path).map_err(io(path))
}

fn is_ours(plugin: &Value) -> bool {
    plugin.get("type").and_then(Value::as_str) == Some(PLUGIN_TYPE)
}

fn our_entry(o: &Options) -> Value {
    let mut e = json!({"type": PLUGIN_TYPE});
    if let Some(s) = &o.socket {
        e["socket"] = json!(s);
    }
    if let Some(t) = o.timeout_ms {
        e["timeout_ms"] = json!(t);
    }
    if let Some(c) = &o.capture {
        e["capture"] = json!(c);
    }
    if let Some(d) = &o.state_dir {
        e["state_dir"] = json!(d);
    }
    e
}

fn mode_of(path: &Path) -> u32 {
    fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o644)
}

/// Installs (idempotently). Returns what changed, empty when nothing did.
pub fn install(o: &Options) -> Result<Vec<String>, InstallError> {
    let mut changes = Vec::new();
    let exe = std::env::current_exe().map_err(io(Path::new("/proc/self/exe")))?;
    let ours = fs::read(&exe).map_err(io(&exe))?;
    let target = o.bin_dir.join(PLUGIN_TYPE);
    if fs::read(&target).ok().as_deref() != Some(&ours[..]) {
        write_atomic(&target, &ours, 0o755)?;
        changes.push(format!("installed {}", target.display()));
    }

    let path =
        primary_config(&o.conf_dir)?.ok_or_else(|| InstallError::NoConfig(o.conf_dir.clone()))?;
    let mut conf = read_json(&path)?;
    let entry = our_entry(o);
    match conf.get_mut("plugins") {
        Some(Value::Array(plugins)) => {
            let before = plugins.clone();
            plugins.retain(|p| !is_ours(p));
            plugins.push(entry);
            if *plugins != before {
                let text = serde_json::to_vec_pretty(&conf).unwrap_or_default();
                write_atomic(&path, &text, mode_of(&path))?;
                changes.push(format!("chained into {}", path.display()));
            }
        }
        Some(_) => {
            return Err(InstallError::BadConfig(
                path,
                "\"plugins\" is not a list".into(),
            ))
        }
        None => {
            // A single-plugin configuration: turn it into a list.
            if conf.get("type").is_none() {
                return Err(InstallError::BadConfig(
                    path,
                    "neither a plugin list (\"plugins\") nor a plugin (\"type\")".into(),
                ));
            }
            let version = conf.get("cniVersion").cloned().unwrap_or(json!("1.0.0"));
            let name = conf
                .get("name")
                .cloned()
                .unwrap_or(json!("k8s-pod-network"));
            let list = json!({"cniVersion": version, "name": name, "plugins": [conf, entry]});
            let file = path.file_name().and_then(|n| n.to_str()).unwrap_or("net");
            let backup = path.with_file_name(format!("{file}{BACKUP_SUFFIX}"));
            fs::copy(&path, &backup).map_err(io(&backup))?;
            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("net");
            let list_path = path.with_file_name(format!("{stem}.conflist"));
            let text = serde_json::to_vec_pretty(&list).unwrap_or_default();
            write_atomic(&list_path, &text, mode_of(&path))?;
            fs::remove_file(&path).map_err(io(&path))?;
            changes.push(format!(
                "converted {} into {} (original kept as {})",
                path.display(),
                list_path.display(),
                backup.display()
            ));
        }
    }
    Ok(changes)
}

/// Removes our entry from every configuration, then the binary.
pub fn uninstall(o: &Options) -> Result<Vec<String>, InstallError> {
    let mut changes = unchain(o)?;
    changes.extend(remove_binary(o)?);
    Ok(changes)
}

/// Removes our entry from every configuration (restoring a converted
/// `.conf`). Returns what changed, empty when nothing was chained.
pub fn unchain(o: &Options) -> Result<Vec<String>, InstallError> {
    let mut changes = Vec::new();
    let entries: Vec<PathBuf> = fs::read_dir(&o.conf_dir)
        .map_err(io(&o.conf_dir))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    for path in &entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let Some(original) = name.strip_suffix(BACKUP_SUFFIX) {
            // A converted single-plugin file: put it back, drop our list.
            let restored = path.with_file_name(original);
            let stem = Path::new(original)
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("");
            let list = path.with_file_name(format!("{stem}.conflist"));
            fs::rename(path, &restored).map_err(io(&restored))?;
            if list != restored && list.exists() {
                fs::remove_file(&list).map_err(io(&list))?;
            }
            changes.push(format!("restored {}", restored.display()));
            continue;
        }
        if !matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("conflist" | "json")
        ) {
            continue;
        }
        let Ok(mut conf) = read_json(path) else {
            continue; // Not ours to judge; leave it alone.
        };
        if let Some(Value::Array(plugins)) = conf.get_mut("plugins") {
            let n = plugins.len();
            plugins.retain(|p| !is_ours(p));
            if plugins.len() != n {
                let text = serde_json::to_vec_pretty(&conf).unwrap_or_default();
                write_atomic(path, &text, mode_of(path))?;
                changes.push(format!("unchained from {}", path.display()));
            }
        }
    }
    Ok(changes)
}

/// Deletes the plugin's binary, if it is there.
pub fn remove_binary(o: &Options) -> Result<Option<String>, InstallError> {
    let target = o.bin_dir.join(PLUGIN_TYPE);
    match fs::remove_file(&target) {
        Ok(()) => Ok(Some(format!("removed {}", target.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(InstallError::Io(target, e)),
    }
}
