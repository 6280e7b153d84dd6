//! Drain option 4: no actions at all; tunnels live until their peers or
//! the kernel close them. Also what the host's built-in fallback does.
//!
//! Configuration: none; an empty string or `{}` (any key is refused).

use tidegate_sdk::config::Config;
use tidegate_sdk::{export_policy, Action, Event, MetadataReads, Policy};

/// See the crate documentation.
#[derive(Debug)]
pub struct KeepaliveOnly;

impl Policy for KeepaliveOnly {
    fn init(config: &str) -> Result<Self, String> {
        Config::parse(config)?.finish()?;
        Ok(Self)
    }

    /// No label and no annotation: the decision never looks at them.
    fn reads(&self) -> MetadataReads {
        MetadataReads::none()
    }

    fn decide(&mut self, _event: &Event) -> Vec<Action> {
        vec![]
    }
}

export_policy!(KeepaliveOnly);

#[cfg(test)]
mod tests {
    use tidegate_sdk::trace::Trace;

    use super::*;

    #[test]
    fn config_must_be_empty() {
        KeepaliveOnly::init("").unwrap();
        KeepaliveOnly::init("{}").unwrap();
        let e = KeepaliveOnly::init(r#"{"hold-ms": 1}"#).unwrap_err();
        assert!(e.contains("`hold-ms`"), "{e}");
    }

    #[test]
    fn trace_passes() {
        // The trace delivers every kind of event and expects nothing.
        let trace = Trace::from_yaml(include_str!("../trace.yaml")).unwrap();
        let mut kinds: Vec<&str> = trace.steps.iter().map(|s| s.event.kind()).collect();
        kinds.sort_unstable();
        kinds.dedup();
        assert_eq!(kinds.len(), 9, "every event kind appears: {kinds:?}");
        trace.run::<KeepaliveOnly>().unwrap();
    }
}
