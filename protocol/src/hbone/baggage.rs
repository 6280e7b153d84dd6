//! The `baggage` header of a CONNECT, as ztunnel writes and reads it
//! (`src/baggage.rs` in its source): the source workload's cluster,
//! namespace, workload, canonical service and revision, so the serving
//! side can label its metrics with a source it may not know by address.
//!
//! `k8s.cluster.name=…,k8s.namespace.name=…,k8s.<type>.name=…,service.name=…,service.version=…`
//! (`<type>`: `deployment`, `job`, `cronjob` or `pod`). Read leniently, as
//! ztunnel reads it: entries split at `,`, then at `=` (the second part is
//! the value, an empty one is none); unknown keys are ignored; a value that
//! is not visible ASCII makes the whole header count for nothing.

use http::header::{GetAll, HeaderValue};

/// The header's name.
pub const BAGGAGE_HEADER: &str = "baggage";

/// What a peer says of the source workload; each field may be missing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Baggage {
    pub cluster_id: Option<String>,
    pub namespace: Option<String>,
    pub workload_name: Option<String>,
    pub service_name: Option<String>,
    pub revision: Option<String>,
    pub region: Option<String>,
    pub zone: Option<String>,
}

impl Baggage {
    /// The header's value; `workload_type` names the workload's kind.
    pub fn header_value(&self, workload_type: &str) -> String {
        [
            ("k8s.cluster.name", &self.cluster_id),
            ("k8s.namespace.name", &self.namespace),
            (&format!("k8s.{workload_type}.name"), &self.workload_name),
            ("service.name", &self.service_name),
            ("service.version", &self.revision),
            ("cloud.region", &self.region),
            ("cloud.availability_zone", &self.zone),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join(",")
    }

    /// Reads every `baggage` value of a request.
    pub fn parse(values: GetAll<'_, HeaderValue>) -> Baggage {
        let mut b = Baggage::default();
        for hv in values {
            let Ok(v) = hv.to_str() else {
                return Baggage::default();
            };
            for entry in v.split(',') {
                let mut parts = entry.split('=');
                let (Some(key), Some(value)) = (parts.next(), parts.next()) else {
                    continue;
                };
                let value = (!value.is_empty()).then(|| value.to_owned());
                match key {
                    "k8s.cluster.name" => b.cluster_id = value,
                    "k8s.namespace.name" => b.namespace = value,
                    "k8s.deployment.name"
                    | "k8s.cronjob.name"
                    | "k8s.pod.name"
                    | "k8s.job.name" => b.workload_name = value,
                    "service.name" => b.service_name = value,
                    "service.version" => b.revision = value,
                    "cloud.region" => b.region = value,
                    "cloud.availability_zone" => b.zone = value,
                    _ => {}
                }
            }
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    fn parse(values: &[&[u8]]) -> Baggage {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(BAGGAGE_HEADER, HeaderValue::from_bytes(v).unwrap());
        }
        Baggage::parse(h.get_all(BAGGAGE_HEADER))
    }

    #[test]
    fn written_as_ztunnel_writes_it_and_read_back() {
        let b = Baggage {
            cluster_id: Some("Kubernetes".into()),
            namespace: Some("shop".into()),
            workload_name: Some("checkout".into()),
            service_name: Some("checkout".into()),
            revision: Some("v2".into()),
            ..Baggage::default()
        };
        let v = b.header_value("deployment");
        assert_eq!(
            v,
            "k8s.cluster.name=Kubernetes,k8s.namespace.name=shop,k8s.deployment.name=checkout,service.name=checkout,service.version=v2"
        );
        assert_eq!(parse(&[v.as_bytes()]), b);
        assert_eq!(Baggage::default().header_value("pod"), "");
    }

    #[test]
    fn read_leniently_as_ztunnel_reads_it() {
        let b = parse(&[
            b"k8s.pod.name=web-1,junk,service.name=,k8s.namespace.name=a=b",
            b"cloud.region=eu,unknown.key=x",
        ]);
        assert_eq!(b.workload_name.as_deref(), Some("web-1"));
        assert_eq!(b.service_name, None, "an empty value is none");
        assert_eq!(b.namespace.as_deref(), Some("a"), "the second part of a=b");
        assert_eq!(
            b.region.as_deref(),
            Some("eu"),
            "a second header counts too"
        );
        assert_eq!(parse(&[b"k8s.pod.name=\xffx"]), Baggage::default());
    }
}
