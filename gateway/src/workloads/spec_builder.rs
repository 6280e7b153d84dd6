//! A `WorkloadSpec` built from its uid and node, the other fields set by
//! name: what unit tests, end-to-end tests and benches write instead of a
//! literal of every field.
//!
//! The sources (`file`, `kubernetes`, `istio`) keep writing every field:
//! a field added to the spec must be decided there, and a literal makes the
//! compiler say so.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::{LifecycleState, Protocol, WorkloadSpec};

impl WorkloadSpec {
    /// A running HBONE workload on `node`, named after its `uid`, in the
    /// `default` namespace with the `default` service account, no address,
    /// no label and no Service.
    pub fn new(uid: impl Into<String>, node: impl Into<String>) -> Self {
        let uid = uid.into();
        WorkloadSpec {
            name: uid.clone(),
            uid,
            namespace: "default".to_owned(),
            service_account: "default".to_owned(),
            ips: Vec::new(),
            node: node.into(),
            protocol: Protocol::Hbone,
            state: LifecycleState::Running,
            labels: super::shared(BTreeMap::new()),
            annotations: super::shared(BTreeMap::new()),
            allow: Vec::new(),
            authorization_policies: Vec::new(),
            oci_backend_draining: false,
            namespace_policy: None,
            deletion_deadline_unix_ms: None,
            services: Vec::new(),
            ports: BTreeMap::new(),
            workload_name: None,
            waypoint: None,
            other_network: false,
            workload_type: None,
            network_mode: Default::default(),
        }
    }

    /// Its name (the uid's by default).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Its namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Its service account.
    pub fn service_account(mut self, service_account: impl Into<String>) -> Self {
        self.service_account = service_account.into();
        self
    }

    /// Its addresses.
    pub fn ips(mut self, ips: impl IntoIterator<Item = IpAddr>) -> Self {
        self.ips = ips.into_iter().collect();
        self
    }

    /// HBONE or plain TCP.
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// Its lifecycle state.
    pub fn state(mut self, state: LifecycleState) -> Self {
        self.state = state;
        self
    }

    /// Its labels.
    pub fn labels(mut self, labels: BTreeMap<String, String>) -> Self {
        self.labels = super::shared(labels);
        self
    }

    /// Its annotations.
    pub fn annotations(mut self, annotations: BTreeMap<String, String>) -> Self {
        self.annotations = super::shared(annotations);
        self
    }

    /// The Services it is an endpoint of (`<name>` or `<namespace>/<name>`).
    pub fn services<S: Into<String>>(mut self, services: impl IntoIterator<Item = S>) -> Self {
        self.services = services.into_iter().map(Into::into).collect();
        self
    }

    /// Opted in to OCI load-balancer backend draining.
    pub fn oci_backend_draining(mut self, on: bool) -> Self {
        self.oci_backend_draining = on;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The builder's defaults are the workload file's: a spec built with
    /// only a uid, a name and a node equals the one the file gives for
    /// the same three keys.
    #[test]
    fn a_built_spec_has_the_workload_files_defaults() {
        let from_file: WorkloadSpec =
            serde_yaml::from_str("{uid: u1, name: u1, node: n1, ips: []}").unwrap();
        assert_eq!(WorkloadSpec::new("u1", "n1"), from_file);
        let built = WorkloadSpec::new("u2", "n2")
            .name("web")
            .namespace("shop")
            .service_account("web-sa")
            .ips(["10.0.0.7".parse().unwrap()])
            .protocol(Protocol::Tcp)
            .state(LifecycleState::Terminating)
            .services(["web", "other/web"])
            .oci_backend_draining(true);
        let from_file: WorkloadSpec = serde_yaml::from_str(
            "{uid: u2, name: web, namespace: shop, service_account: web-sa, ips: [10.0.0.7], \
             node: n2, protocol: TCP, state: terminating, services: [web, other/web], \
             oci_backend_draining: true}",
        )
        .unwrap();
        assert_eq!(built, from_file);
    }
}
