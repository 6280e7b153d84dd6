//! `tidegate policy upload NAME FILE [--policy-config JSON]` and `tidegate
//! policy list [-o json|yaml]` against a running gateway's admin API
//! (`PUT /policies/<name>`, `GET /policies`). A refused plugin is the error
//! (exit 1), with the gateway's reason; the previous version stays loaded.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde_json::Value;

use super::admin_api::{self, path_segment, AdminError};
use super::output::{table, Output};
use super::UploadArgs;
use crate::admin::POLICY_CONFIG_HEADER;

/// Why an upload was not sent or not taken.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("cannot read the plugin {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "--policy-config must be visible ASCII and spaces on one line (it travels in the \
         {POLICY_CONFIG_HEADER} header); found {0:?}"
    )]
    Config(char),
    #[error(transparent)]
    Admin(#[from] AdminError),
}

/// Whether `config` can travel as a header value.
fn check_config(config: &str) -> Result<(), UploadError> {
    match config
        .chars()
        .find(|c| !(c.is_ascii_graphic() || *c == ' '))
    {
        Some(c) => Err(UploadError::Config(c)),
        None => Ok(()),
    }
}

/// `PUT /policies/<name>` with the component; one line saying what changed.
pub fn upload(admin: SocketAddr, args: &UploadArgs) -> Result<String, UploadError> {
    if let Some(c) = &args.policy_config {
        check_config(c)?;
    }
    let wasm = std::fs::read(&args.file).map_err(|source| UploadError::Read {
        path: args.file.clone(),
        source,
    })?;
    let headers: Vec<(&str, &str)> = args
        .policy_config
        .as_deref()
        .map(|c| (POLICY_CONFIG_HEADER, c))
        .into_iter()
        .collect();
    let path = format!("/policies/{}", path_segment(&args.name));
    let answer = admin_api::call_with(admin_api::dial_addr(admin), "PUT", &path, &headers, &wasm)?;
    Ok(upload_line(&answer))
}

fn upload_line(answer: &Value) -> String {
    let previous = match answer["previous"].as_str() {
        Some(p) => format!(", replacing version {p}"),
        None => String::new(),
    };
    format!(
        "policy {}: {}, version {} ({} bytes){previous}",
        answer["policy"].as_str().unwrap_or("?"),
        answer["result"].as_str().unwrap_or("?"),
        answer["version"].as_str().unwrap_or("?"),
        answer["size"],
    )
}

/// `GET /policies`: a table, or the admin API's answer as it is.
pub fn list(admin: SocketAddr, output: Output) -> Result<String, AdminError> {
    let answer = admin_api::call(admin_api::dial_addr(admin), "GET", "/policies", b"")?;
    Ok(output.render(&answer, || render(&answer)))
}

fn render(answer: &Value) -> String {
    let cell = |v: &Value| match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let rows: Vec<[String; 6]> = answer["policies"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
        .iter()
        .map(|p| {
            let state = match (p["loaded"].as_bool(), p["quarantined"].as_bool()) {
                (_, Some(true)) => "quarantined".to_owned(),
                (Some(true), _) => "loaded".to_owned(),
                _ => "not loaded".to_owned(),
            };
            let state = match p["last_error"].as_str() {
                Some(e) => format!("{state}; last error: {e}"),
                None => state,
            };
            [
                cell(&p["name"]),
                cell(&p["version"]),
                cell(&p["source"]),
                cell(&p["calls"]),
                cell(&p["failures"]),
                state,
            ]
        })
        .collect();
    if rows.is_empty() {
        return "no policy loaded (the built-in fallback decides)\n".to_owned();
    }
    table(
        ["NAME", "VERSION", "SOURCE", "CALLS", "FAILURES", "STATE"],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_config_that_cannot_be_a_header_is_refused_naming_the_character() {
        assert!(check_config(r#"{"hold-ms": 5000}"#).is_ok());
        let e = check_config("{\"a\":\n1}").unwrap_err();
        assert!(e.to_string().contains("'\\n'"), "{e}");
        assert!(check_config("é").is_err());
    }

    #[test]
    fn upload_and_list_say_what_is_loaded() {
        let up = json!({"policy": "trial", "version": "ab12", "size": 1234, "result": "swapped", "previous": "9f00"});
        assert_eq!(
            upload_line(&up),
            "policy trial: swapped, version ab12 (1234 bytes), replacing version 9f00"
        );
        let list = json!({"policies": [
            {"name": "recommended", "loaded": true, "source": "file", "version": "ab12",
             "calls": 3, "failures": 0, "quarantined": false, "last_error": null},
            {"name": "broken", "loaded": false, "source": null, "version": null,
             "calls": 0, "failures": 0, "quarantined": false, "last_error": "no such file"}
        ]});
        let t = render(&list);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("NAME"), "{t}");
        assert!(
            lines[1].starts_with("recommended")
                && lines[1].contains("file")
                && lines[1].ends_with("loaded"),
            "{t}"
        );
        assert!(
            lines[2].ends_with("not loaded; last error: no such file"),
            "{t}"
        );
    }
}
