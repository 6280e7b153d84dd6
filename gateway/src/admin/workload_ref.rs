//! Which workload a `/workloads/<workload>/…` path names — the one rule
//! every command taking a workload follows (`tidegate drain|bind|unbind`
//! through these paths, `tidegate workloads` on its table): its uid,
//! `<namespace>/<name>` (the `/` as `%2F` or as a path separator), its IP,
//! or its bare name when one workload of this node has it.
//!
//! A uid known to the store wins, whatever it contains. Otherwise a value
//! with a `/` is a namespace and a name, resolved through the workload store
//! to exactly one workload of this node: none is a 404 naming what was
//! looked up; several (two pods of the same name while one is re-created)
//! a 409 listing their uids. A value without `/` is an IP when it parses as
//! one (the local workload with it, else a 404); else a bare name when
//! local workloads have it (several: a 409 listing each as
//! `namespace/name (uid …)`); else a uid, looked up as before (the drain
//! engine also remembers deleted workloads by uid).

use http::StatusCode;

use crate::workloads::WorkloadSnapshot;

/// Longest namespace: a DNS label.
const MAX_NAMESPACE: usize = 63;
/// Longest name: a DNS subdomain.
const MAX_NAME: usize = 253;
/// Longest workload reference, decoded: no uid or `ns/name` comes near it.
const MAX_REFERENCE: usize = 1024;

/// Why a workload reference names no single local workload.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RefError {
    #[error("workload {0:?}: {1}")]
    Invalid(String, &'static str),
    #[error(
        "workload reference of {0} bytes is too long (a uid, or a namespace of at most \
         {MAX_NAMESPACE} bytes, '/', a name of at most {MAX_NAME})"
    )]
    TooLong(usize),
    #[error(
        "workload {namespace}/{name} runs on node {node}, not {local_node}: its gateway \
         handles it"
    )]
    Remote {
        namespace: String,
        name: String,
        node: String,
        local_node: String,
    },
    #[error(
        "no workload named {namespace}/{name} (namespace {namespace:?}, name {name:?}) on \
         node {node}; `tidegate workloads` lists them"
    )]
    NotFound {
        namespace: String,
        name: String,
        node: String,
    },
    #[error(
        "{namespace}/{name} names {} workloads on this node (a pod re-created under the same \
         name?): uids {}; name one by its uid",
        .uids.len(),
        .uids.join(", ")
    )]
    Ambiguous {
        namespace: String,
        name: String,
        uids: Vec<String>,
    },
    #[error(
        "the name {name:?} is ambiguous: {} workloads of this node have it: {}; name one by \
         namespace/name or uid",
        .candidates.len(),
        .candidates.join(", ")
    )]
    AmbiguousName {
        name: String,
        /// `namespace/name (uid …)` of each.
        candidates: Vec<String>,
    },
    #[error(
        "no workload of node {node} has the IP {ip}{elsewhere}; `tidegate workloads` lists them"
    )]
    NoIp {
        ip: std::net::IpAddr,
        node: String,
        /// ", it is <ns/name> on node <n>" when a peer has it.
        elsewhere: String,
    },
}

impl RefError {
    /// The admin API's answer to it.
    pub fn status(&self) -> StatusCode {
        match self {
            RefError::Invalid(..) | RefError::TooLong(_) => StatusCode::BAD_REQUEST,
            RefError::Remote { .. } | RefError::NotFound { .. } | RefError::NoIp { .. } => {
                StatusCode::NOT_FOUND
            }
            RefError::Ambiguous { .. } | RefError::AmbiguousName { .. } => StatusCode::CONFLICT,
        }
    }
}

/// A workload reference as written in a path, decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum WorkloadRef {
    Uid(String),
    Named {
        namespace: String,
        name: String,
    },
    /// An IP address.
    Ip(std::net::IpAddr),
    /// No `/`, not a known uid: a bare name if a local workload has it,
    /// else a uid (of a deleted workload the drain engine remembers).
    Bare(String),
}

impl WorkloadRef {
    /// Decodes `raw` (percent-encoded, as in a path) and checks its form.
    /// `known_uid` says whether the decoded value is a uid in the store.
    pub fn parse(raw: &str, known_uid: impl Fn(&str) -> bool) -> Result<WorkloadRef, RefError> {
        let decoded = percent_decode(raw)
            .ok_or_else(|| RefError::Invalid(raw.to_owned(), "invalid percent-encoding"))?;
        if decoded.len() > MAX_REFERENCE {
            return Err(RefError::TooLong(decoded.len()));
        }
        if decoded.is_empty() {
            return Err(RefError::Invalid(
                decoded,
                "empty: give a uid or namespace/name",
            ));
        }
        if known_uid(&decoded) {
            return Ok(WorkloadRef::Uid(decoded));
        }
        let Some((namespace, name)) = decoded.split_once('/') else {
            return Ok(match decoded.parse() {
                Ok(ip) => WorkloadRef::Ip(ip),
                Err(_) => WorkloadRef::Bare(decoded),
            });
        };
        let why = if namespace.is_empty() {
            Some("the namespace before '/' is empty")
        } else if name.is_empty() {
            Some("the name after '/' is empty")
        } else if name.contains('/') {
            Some("more than one '/': give namespace/name")
        } else if namespace.len() > MAX_NAMESPACE {
            Some("the namespace is longer than 63 bytes")
        } else if name.len() > MAX_NAME {
            Some("the name is longer than 253 bytes")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(RefError::Invalid(decoded, why));
        }
        Ok(WorkloadRef::Named {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }

    /// The uid it names on this node (`node`); a uid is taken as it is.
    pub fn resolve(self, snapshot: &WorkloadSnapshot, node: &str) -> Result<String, RefError> {
        let (namespace, name) = match self {
            WorkloadRef::Uid(uid) => return Ok(uid),
            WorkloadRef::Ip(ip) => return resolve_ip(ip, snapshot, node),
            WorkloadRef::Bare(name) => return resolve_bare(name, snapshot),
            WorkloadRef::Named { namespace, name } => (namespace, name),
        };
        let named: Vec<_> = snapshot
            .iter()
            .filter(|w| w.spec.namespace == namespace && w.spec.name == name)
            .collect();
        let mut local: Vec<String> = named
            .iter()
            .filter(|w| w.local)
            .map(|w| w.uid().to_owned())
            .collect();
        match (local.len(), named.first()) {
            (1, _) => Ok(local.remove(0)),
            (0, Some(remote)) => Err(RefError::Remote {
                namespace,
                name,
                node: remote.spec.node.clone(),
                local_node: node.to_owned(),
            }),
            (0, None) => Err(RefError::NotFound {
                namespace,
                name,
                node: node.to_owned(),
            }),
            _ => Err(RefError::Ambiguous {
                namespace,
                name,
                uids: local,
            }),
        }
    }
}

/// The local workload with `ip`.
fn resolve_ip(
    ip: std::net::IpAddr,
    snapshot: &WorkloadSnapshot,
    node: &str,
) -> Result<String, RefError> {
    match snapshot.by_ip(ip) {
        Some(w) if w.local => Ok(w.uid().to_owned()),
        found => Err(RefError::NoIp {
            ip,
            node: node.to_owned(),
            elsewhere: found.map_or(String::new(), |w| {
                format!(
                    ", it is {}/{} on node {}",
                    w.spec.namespace, w.spec.name, w.spec.node
                )
            }),
        }),
    }
}

/// The one local workload named `name`; none: `name` as a uid.
fn resolve_bare(name: String, snapshot: &WorkloadSnapshot) -> Result<String, RefError> {
    let mut local: Vec<_> = snapshot
        .iter()
        .filter(|w| w.local && w.spec.name == name)
        .collect();
    match local.len() {
        0 => Ok(name),
        1 => Ok(local[0].uid().to_owned()),
        _ => {
            local.sort_by(|a, b| (&a.spec.namespace, a.uid()).cmp(&(&b.spec.namespace, b.uid())));
            Err(RefError::AmbiguousName {
                candidates: local
                    .iter()
                    .map(|w| format!("{}/{} (uid {})", w.spec.namespace, w.spec.name, w.uid()))
                    .collect(),
                name,
            })
        }
    }
}

/// `%XX` escapes decoded; `None` for a malformed escape or non-UTF-8 result.
pub(super) fn percent_decode(raw: &str) -> Option<String> {
    let mut out = Vec::with_capacity(raw.len());
    let mut bytes = raw.bytes();
    while let Some(b) = bytes.next() {
        if b != b'%' {
            out.push(b);
            continue;
        }
        let hex = [bytes.next()?, bytes.next()?];
        let hex = std::str::from_utf8(&hex).ok()?;
        out.push(u8::from_str_radix(hex, 16).ok()?);
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &str) -> Result<WorkloadRef, RefError> {
        WorkloadRef::parse(raw, |uid| uid == "odd/uid")
    }

    fn named(namespace: &str, name: &str) -> WorkloadRef {
        WorkloadRef::Named {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    #[test]
    fn uids_and_namespace_names_both_encodings() {
        assert_eq!(parse("echo-uid"), Ok(WorkloadRef::Bare("echo-uid".into())));
        assert_eq!(parse("10.0.0.1"), Ok(WorkloadRef::Ip([10, 0, 0, 1].into())));
        assert_eq!(
            parse("fd00%3A%3A1"),
            Ok(WorkloadRef::Ip("fd00::1".parse().unwrap()))
        );
        assert_eq!(parse("demo%2Fecho"), Ok(named("demo", "echo")));
        assert_eq!(parse("demo%2fecho"), Ok(named("demo", "echo")));
        assert_eq!(parse("demo/echo"), Ok(named("demo", "echo")));
        // A uid the store knows wins over the namespace/name reading.
        assert_eq!(parse("odd%2Fuid"), Ok(WorkloadRef::Uid("odd/uid".into())));
    }

    #[test]
    fn malformed_references_say_what_is_wrong() {
        for (raw, why) in [
            ("", "empty"),
            ("%2Fecho", "the namespace before '/' is empty"),
            ("demo/", "the name after '/' is empty"),
            ("a/b/c", "more than one '/'"),
            ("demo%2", "invalid percent-encoding"),
            ("demo%zzecho", "invalid percent-encoding"),
            ("%ff", "invalid percent-encoding"),
        ] {
            let e = parse(raw).unwrap_err();
            assert_eq!(e.status(), StatusCode::BAD_REQUEST, "{raw}");
            assert!(e.to_string().contains(why), "{raw}: {e}");
        }
        let long_ns = format!("{}/echo", "n".repeat(64));
        assert!(parse(&long_ns)
            .unwrap_err()
            .to_string()
            .contains("63 bytes"));
        let long_name = format!("demo/{}", "n".repeat(254));
        assert!(parse(&long_name).unwrap_err().to_string().contains("253"));
        let e = parse(&"u".repeat(1025)).unwrap_err();
        assert_eq!(e, RefError::TooLong(1025));
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
    }

    /// Node `node-a`'s view of `echo` (demo), two `web`s (shop and
    /// `second_web_ns`) and a `db` on another node.
    fn snapshot_of(second_web_ns: &str) -> std::sync::Arc<crate::workloads::WorkloadSnapshot> {
        let store = crate::workloads::WorkloadStore::new("cluster.local", "node-a");
        let file = format!(
            "workloads:\n\
             - {{uid: u-echo, name: echo, namespace: demo, ips: [10.0.0.1], node: node-a}}\n\
             - {{uid: u-web-1, name: web, namespace: shop, ips: [10.0.0.2], node: node-a}}\n\
             - {{uid: u-web-2, name: web, namespace: {second_web_ns}, ips: [10.0.0.3], node: node-a}}\n\
             - {{uid: u-db, name: db, namespace: shop, ips: [10.0.0.4], node: node-b}}\n"
        );
        store.publish(crate::workloads::parse_workload_file(&file).unwrap());
        store.snapshot()
    }

    #[test]
    fn a_name_resolves_to_its_one_local_workload_or_says_why_not() {
        let snap = snapshot_of("shop");
        let resolve = |r: WorkloadRef| r.resolve(&snap, "node-a");
        assert_eq!(resolve(named("demo", "echo")), Ok("u-echo".into()));
        assert_eq!(resolve(WorkloadRef::Uid("gone".into())), Ok("gone".into()));
        let e = resolve(named("shop", "web")).unwrap_err();
        assert_eq!(e.status(), StatusCode::CONFLICT);
        assert!(e.to_string().contains("uids u-web-1, u-web-2"), "{e}");
        let e = resolve(named("shop", "db")).unwrap_err();
        assert_eq!(e.status(), StatusCode::NOT_FOUND);
        assert!(e.to_string().contains("runs on node node-b"), "{e}");
        let e = resolve(named("demo", "nope")).unwrap_err();
        assert_eq!(e.status(), StatusCode::NOT_FOUND);
        assert!(
            e.to_string().starts_with("no workload named demo/nope"),
            "{e}"
        );
    }

    #[test]
    fn a_bare_name_or_an_ip_resolves_to_one_local_workload_or_says_why_not() {
        let snap = snapshot_of("lab");
        let resolve = |raw: &str| {
            WorkloadRef::parse(raw, |uid| snap.by_uid(uid).is_some())?.resolve(&snap, "node-a")
        };
        assert_eq!(resolve("echo"), Ok("u-echo".into()));
        assert_eq!(resolve("u-echo"), Ok("u-echo".into()));
        assert_eq!(resolve("10.0.0.1"), Ok("u-echo".into()));
        // Nothing local has the name: a uid, as the drain engine may know it.
        assert_eq!(resolve("gone-uid"), Ok("gone-uid".into()));
        let e = resolve("web").unwrap_err();
        assert_eq!(e.status(), StatusCode::CONFLICT);
        assert_eq!(
            e.to_string(),
            "the name \"web\" is ambiguous: 2 workloads of this node have it: \
             lab/web (uid u-web-2), shop/web (uid u-web-1); name one by namespace/name or uid"
        );
        let e = resolve("10.0.0.4").unwrap_err();
        assert_eq!(e.status(), StatusCode::NOT_FOUND);
        assert!(
            e.to_string().contains("it is shop/db on node node-b"),
            "{e}"
        );
        let e = resolve("10.9.9.9").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("no workload of node node-a has the IP 10.9.9.9;"),
            "{e}"
        );
    }
}
