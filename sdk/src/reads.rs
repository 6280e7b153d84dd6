//! The pod metadata a policy reads (`metadata-reads` in the WIT, contract
//! 0.2.0): the host copies only these label and annotation keys into the
//! sandbox on every decision, so declaring them is what makes a decision
//! cheap on pods with many labels.

use std::collections::BTreeMap;

use crate::{Event, WorkloadInfo};

/// Which keys of one map (labels or annotations) a policy reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Keys {
    /// Every key (the WIT list `["*"]`).
    All,
    /// Only these (none when empty).
    Only(Vec<String>),
}

impl Keys {
    /// Whether `key` is handed to the policy.
    pub fn keeps(&self, key: &str) -> bool {
        match self {
            Keys::All => true,
            Keys::Only(keys) => keys.iter().any(|k| k == key),
        }
    }

    /// The WIT form: `["*"]` for every key.
    pub fn to_list(&self) -> Vec<String> {
        match self {
            Keys::All => vec!["*".to_owned()],
            Keys::Only(keys) => keys.clone(),
        }
    }

    /// From the WIT form.
    pub fn from_list(list: Vec<String>) -> Keys {
        if list.len() == 1 && list[0] == "*" {
            Keys::All
        } else {
            Keys::Only(list)
        }
    }

    fn filter(&self, map: &mut BTreeMap<String, String>) {
        if let Keys::Only(keys) = self {
            map.retain(|k, _| keys.iter().any(|x| x == k));
        }
    }
}

/// The labels and annotations a policy reads; returned by
/// [`Policy::reads`](crate::Policy::reads) after `init`.
///
/// ```
/// use tidegate_sdk::MetadataReads;
/// let reads = MetadataReads::none().annotation("tidegate.io/oci-drain");
/// assert!(reads.annotations.keeps("tidegate.io/oci-drain"));
/// assert!(!reads.labels.keeps("app"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetadataReads {
    pub labels: Keys,
    pub annotations: Keys,
}

impl Default for MetadataReads {
    /// Every label and annotation: correct for any policy, and the slowest.
    fn default() -> Self {
        Self::everything()
    }
}

impl MetadataReads {
    /// Every label and every annotation (what a 0.1.0 plugin gets).
    pub fn everything() -> Self {
        MetadataReads {
            labels: Keys::All,
            annotations: Keys::All,
        }
    }

    /// No label and no annotation.
    pub fn none() -> Self {
        MetadataReads {
            labels: Keys::Only(Vec::new()),
            annotations: Keys::Only(Vec::new()),
        }
    }

    /// The same reads with each list of keys sorted and without repeats:
    /// the host's encoder then looks each declared key up in a pod's labels
    /// and annotations instead of walking them all.
    pub fn in_key_order(mut self) -> Self {
        for keys in [&mut self.labels, &mut self.annotations] {
            if let Keys::Only(keys) = keys {
                keys.sort_unstable();
                keys.dedup();
            }
        }
        self
    }

    /// Also reads the label `key`.
    pub fn label(mut self, key: &str) -> Self {
        if let Keys::Only(keys) = &mut self.labels {
            keys.push(key.to_owned());
        }
        self
    }

    /// Also reads the annotation `key`.
    pub fn annotation(mut self, key: &str) -> Self {
        if let Keys::Only(keys) = &mut self.annotations {
            keys.push(key.to_owned());
        }
        self
    }

    /// Keeps only the declared keys of `info` (what the host hands over).
    pub fn filter_info(&self, info: &mut WorkloadInfo) {
        self.labels.filter(&mut info.labels);
        self.annotations.filter(&mut info.annotations);
    }

    /// Keeps only the declared keys of every workload in `event`: a native
    /// run sees what the policy would see in the gateway.
    pub fn filter(&self, event: &mut Event) {
        match event {
            Event::WorkloadAdded(w) | Event::WorkloadDeleted(w) => self.filter_info(&mut w.info),
            Event::ShutdownStarted(s) => self.filter_info(&mut s.workload.info),
            Event::NetworkTeardown(t) => self.filter_info(&mut t.workload.info),
            Event::GatewayShutdown(g) => {
                for w in &mut g.workloads {
                    self.filter_info(&mut w.info);
                }
            }
            Event::TimerFired(t) => {
                if let Some(w) = &mut t.workload {
                    self.filter_info(&mut w.info);
                }
            }
            Event::PeerTerminating(_) | Event::PeerDeleted(_) | Event::ConnectFailing(_) => {}
        }
    }
}
