//! `GET /config_dump?…`: which parts of the dump to build. A gateway that
//! holds a large cluster (100,000 workloads: tens of megabytes of JSON)
//! pays for every workload on every dump; a script that watches one thing
//! asks for that thing.
//!
//! - `only=<section>[,<section>…]`: these top-level sections alone (`node`
//!   is always there);
//! - `workload=<uid>`: `workloads` lists that workload alone (none when it
//!   is not held);
//! - `service=<namespace>/<name>`: `services` lists that Service alone.
//!
//! Values are percent-decoded. An unknown key, an unknown section, a key
//! given twice, an empty value, a malformed escape or a query over
//! [`MAX_QUERY`] bytes is refused (400, naming the key); nothing is built.

use super::workload_ref::percent_decode;

/// The sections `only` may name, in the dump's order.
pub const SECTIONS: &[&str] = &[
    "workloads",
    "workloads_generation",
    "inbound_tunnels",
    "pool",
    "services",
    "outbound",
    "certificates",
    "capture",
    "descriptors",
    "policies",
    "certificate_source",
    "workloadState",
];

/// Longest query accepted, as received.
pub const MAX_QUERY: usize = 2048;

/// What a `/config_dump` query asks for.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DumpQuery {
    /// `None`: every section.
    pub only: Option<Vec<&'static str>>,
    pub workload: Option<String>,
    /// (namespace, name).
    pub service: Option<(String, String)>,
}

/// Why a `/config_dump` query is refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DumpQueryError {
    #[error("query key {0:?} is not known; accepted: only, workload, service")]
    UnknownKey(String),
    #[error("query key `{0}` is given twice")]
    Repeated(&'static str),
    #[error("query `{0}` is empty")]
    Empty(&'static str),
    #[error("query `{0}`: invalid percent-encoding")]
    Encoding(&'static str),
    #[error("query `only`: no section {0:?}; sections: {sections}", sections = SECTIONS.join(", "))]
    UnknownSection(String),
    #[error("query `service`: {0:?} is not <namespace>/<name>")]
    Service(String),
    #[error("query of {0} bytes is too long (at most {MAX_QUERY})")]
    TooLong(usize),
}

impl DumpQuery {
    /// Whether `section` is to be built.
    pub fn wants(&self, section: &str) -> bool {
        self.only.as_ref().is_none_or(|o| o.contains(&section))
    }
}

/// Parses the query of a `/config_dump` request (`None`: no query).
pub fn parse(query: Option<&str>) -> Result<DumpQuery, DumpQueryError> {
    let mut q = DumpQuery::default();
    let Some(query) = query.filter(|s| !s.is_empty()) else {
        return Ok(q);
    };
    if query.len() > MAX_QUERY {
        return Err(DumpQueryError::TooLong(query.len()));
    }
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, raw) = pair.split_once('=').unwrap_or((pair, ""));
        let key: &'static str = match key {
            "only" => "only",
            "workload" => "workload",
            "service" => "service",
            other => return Err(DumpQueryError::UnknownKey(other.to_owned())),
        };
        let value = percent_decode(raw).ok_or(DumpQueryError::Encoding(key))?;
        if value.is_empty() {
            return Err(DumpQueryError::Empty(key));
        }
        let repeated = match key {
            "only" => q.only.replace(sections(&value)?).is_some(),
            "workload" => q.workload.replace(value).is_some(),
            _ => q.service.replace(service(&value)?).is_some(),
        };
        if repeated {
            return Err(DumpQueryError::Repeated(key));
        }
    }
    Ok(q)
}

fn sections(value: &str) -> Result<Vec<&'static str>, DumpQueryError> {
    value
        .split(',')
        .map(|s| {
            SECTIONS
                .iter()
                .copied()
                .find(|known| *known == s)
                .ok_or_else(|| DumpQueryError::UnknownSection(s.to_owned()))
        })
        .collect()
}

fn service(value: &str) -> Result<(String, String), DumpQueryError> {
    match value.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => Err(DumpQueryError::Service(value.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_query_is_the_whole_dump() {
        for q in [None, Some("")] {
            let got = parse(q).unwrap();
            assert_eq!(got, DumpQuery::default());
            assert!(SECTIONS.iter().all(|s| got.wants(s)));
        }
    }

    #[test]
    fn sections_a_workload_and_a_service() {
        let got = parse(Some(
            "only=pool,workloads&workload=Kubernetes%2F%2FPod%2Flab%2Fa&service=lab/server",
        ))
        .unwrap();
        assert_eq!(got.only, Some(vec!["pool", "workloads"]));
        assert!(got.wants("pool") && got.wants("workloads"));
        assert!(!got.wants("services") && !got.wants("certificates"));
        assert_eq!(got.workload.as_deref(), Some("Kubernetes//Pod/lab/a"));
        assert_eq!(got.service, Some(("lab".into(), "server".into())));
    }

    #[test]
    fn bad_queries_name_the_key() {
        use DumpQueryError as E;
        let cases: &[(&str, DumpQueryError)] = &[
            ("sections=pool", E::UnknownKey("sections".into())),
            ("only=pool&only=services", E::Repeated("only")),
            ("workload=a&workload=b", E::Repeated("workload")),
            ("only=", E::Empty("only")),
            ("workload", E::Empty("workload")),
            ("workload=%zz", E::Encoding("workload")),
            ("only=pool,tunnels", E::UnknownSection("tunnels".into())),
            ("only=pool,", E::UnknownSection(String::new())),
            ("service=server", E::Service("server".into())),
            ("service=/server", E::Service("/server".into())),
            ("service=lab/a/b", E::Service("lab/a/b".into())),
        ];
        for (q, want) in cases {
            assert_eq!(parse(Some(q)).as_ref(), Err(want), "{q}");
        }
        let long = format!("workload={}", "a".repeat(MAX_QUERY));
        assert_eq!(parse(Some(&long)), Err(E::TooLong(long.len())));
        assert!(E::UnknownSection("x".into())
            .to_string()
            .contains("workloads, workloads_generation, inbound_tunnels, pool"));
    }
}
