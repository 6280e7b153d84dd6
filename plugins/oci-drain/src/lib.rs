//! When a workload's shutdown starts, drain its OCI load-balancer backends
//! (so the load balancer stops sending new connections) — by default only
//! for workloads that opt in with the annotation
//! `tidegate.io/oci-drain: "true"`.
//!
//! Configuration (JSON object, every key optional):
//! - `require-opt-in` (boolean, default true): drain only opted-in workloads.
//! - `opt-in-annotation` (non-empty string, default `"tidegate.io/oci-drain"`):
//!   the annotation whose value `"true"` opts a workload in.
//! - `at-capacity` (`"keep"` or `"remove-early"`, default `"keep"`).

use tidegate_sdk::config::Config;
use tidegate_sdk::{export_policy, Action, AtCapacity, Event, MetadataReads, Policy, WorkloadInfo};

/// See the crate documentation.
#[derive(Debug)]
pub struct OciDrainPolicy {
    require_opt_in: bool,
    opt_in_annotation: String,
    at_capacity: AtCapacity,
}

impl OciDrainPolicy {
    fn opted_in(&self, w: &WorkloadInfo) -> bool {
        !self.require_opt_in || w.annotation(&self.opt_in_annotation) == Some("true")
    }
}

impl Policy for OciDrainPolicy {
    fn init(config: &str) -> Result<Self, String> {
        let mut c = Config::parse(config)?;
        let policy = Self {
            require_opt_in: c.bool("require-opt-in", true)?,
            opt_in_annotation: c.string("opt-in-annotation", "tidegate.io/oci-drain")?,
            at_capacity: c.choice(
                "at-capacity",
                AtCapacity::Keep,
                &[
                    ("keep", AtCapacity::Keep),
                    ("remove-early", AtCapacity::RemoveEarly),
                ],
            )?,
        };
        c.finish()?;
        Ok(policy)
    }

    /// Only the opt-in annotation, when it is required.
    fn reads(&self) -> MetadataReads {
        if self.require_opt_in {
            MetadataReads::none().annotation(&self.opt_in_annotation)
        } else {
            MetadataReads::none()
        }
    }

    fn decide(&mut self, event: &Event) -> Vec<Action> {
        match event {
            Event::ShutdownStarted(s) if self.opted_in(&s.workload.info) => {
                vec![Action::oci_drain(&s.workload)
                    .at_capacity(self.at_capacity)
                    .into()]
            }
            _ => vec![],
        }
    }
}

export_policy!(OciDrainPolicy);

#[cfg(test)]
mod tests {
    use tidegate_sdk::trace::Trace;
    use tidegate_sdk::{ShutdownStarted, WorkloadState};

    use super::*;

    fn shutdown(info: WorkloadInfo) -> Event {
        Event::ShutdownStarted(ShutdownStarted {
            workload: WorkloadState::new(info),
            grace_deadline_ms: 30_000,
            grace_remaining_ms: 30_000,
        })
    }

    #[test]
    fn only_opted_in_workloads_are_drained_by_default() {
        let mut p = OciDrainPolicy::init("").unwrap();
        let opted = WorkloadInfo::new("in").with_annotation("tidegate.io/oci-drain", "true");
        assert_eq!(
            p.decide(&shutdown(opted)),
            vec![Action::oci_drain("in").into()]
        );
        let other = WorkloadInfo::new("out").with_annotation("tidegate.io/oci-drain", "yes");
        assert!(p.decide(&shutdown(other)).is_empty());
        assert!(p.decide(&shutdown(WorkloadInfo::new("none"))).is_empty());
    }

    #[test]
    fn opt_in_can_be_dropped_or_renamed() {
        let mut all =
            OciDrainPolicy::init(r#"{"require-opt-in": false, "at-capacity": "remove-early"}"#)
                .unwrap();
        assert_eq!(
            all.decide(&shutdown(WorkloadInfo::new("any"))),
            vec![Action::oci_drain("any")
                .at_capacity(AtCapacity::RemoveEarly)
                .into()]
        );
        let mut renamed = OciDrainPolicy::init(r#"{"opt-in-annotation": "lb/drain"}"#).unwrap();
        let w = WorkloadInfo::new("w").with_annotation("lb/drain", "true");
        assert_eq!(
            renamed.decide(&shutdown(w)),
            vec![Action::oci_drain("w").into()]
        );
    }

    #[test]
    fn bad_config_names_the_key() {
        let e = OciDrainPolicy::init(r#"{"at-capacity": "evict"}"#).unwrap_err();
        assert!(e.contains("`at-capacity`"), "{e}");
        let e = OciDrainPolicy::init(r#"{"opt-in-annotation": ""}"#).unwrap_err();
        assert!(e.contains("`opt-in-annotation`"), "{e}");
    }

    #[test]
    fn trace_passes() {
        Trace::from_yaml(include_str!("../trace.yaml"))
            .unwrap()
            .run::<OciDrainPolicy>()
            .unwrap();
    }
}
