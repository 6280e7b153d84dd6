//! The certificate source a config asks for, and what keeps it current.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use prometheus_client::registry::Registry;

use super::Wiring;
use tokio::sync::watch;

use crate::config::{CertificatesConfig, Config, IstioCaConfig};
use crate::workloads::{Protocol, WorkloadSnapshot, WorkloadStore};
use tidegate_ca::certs::{IstioCaCerts, IstioCaSettings};
use tidegate_ca::client::CaClientConfig;
use tidegate_ca::metrics::CaMetrics;
use tidegate_protocol::identity::SpiffeId;
use tidegate_protocol::tls::{CertDir, CertSource, DevCa};

/// A certificate source and the task that keeps it current, if any.
pub(super) struct Certificates {
    pub source: Arc<dyn CertSource>,
    keeper: Keeper,
}

enum Keeper {
    /// The development CA mints on demand: nothing to keep.
    Nothing,
    /// The directory is re-read every interval.
    Dir(Arc<CertDir>, Duration),
    /// One certificate per local identity, renewed from the Istio CA.
    IstioCa(IstioCaCerts),
}

/// The certificate source a config asks for (also used by `tidegate connect`).
pub fn cert_source(config: &Config) -> anyhow::Result<Arc<dyn CertSource>> {
    Ok(certificates(config, None)?.source)
}

/// The source, with the Istio CA client's metrics in `registry` when one
/// is given.
pub(super) fn certificates(
    config: &Config,
    registry: Option<&mut Registry>,
) -> anyhow::Result<Certificates> {
    Ok(match &config.certificates {
        CertificatesConfig::DevCa {
            state_dir,
            root_out,
            validity,
        } => {
            let ca = match state_dir {
                Some(dir) => DevCa::open(dir, *validity)
                    .with_context(|| format!("certificates.state_dir {}", dir.display()))?,
                None => DevCa::new(*validity)?,
            };
            if let Some(path) = root_out {
                ca.write_root(path).context("certificates.root_out")?;
            }
            Certificates {
                source: Arc::new(ca),
                keeper: Keeper::Nothing,
            }
        }
        CertificatesConfig::Dir {
            dir,
            trust_bundle,
            reload_interval,
        } => {
            let d = CertDir::load(dir, trust_bundle).context("certificates.dir")?;
            Certificates {
                source: d.clone(),
                keeper: Keeper::Dir(d, *reload_interval),
            }
        }
        CertificatesConfig::IstioCa(ca) => {
            let metrics = registry.map_or_else(CaMetrics::default, CaMetrics::register);
            let certs =
                IstioCaCerts::new(settings(ca), metrics).context("certificates (istio-ca)")?;
            Certificates {
                source: Arc::new(certs.clone()),
                keeper: Keeper::IstioCa(certs),
            }
        }
    })
}

impl Certificates {
    /// Starts what keeps the source current (the Istio CA client follows
    /// the local workloads' identities).
    pub(super) fn keep(
        self,
        workloads: &Arc<WorkloadStore>,
        w: &mut Wiring,
    ) -> Arc<dyn CertSource> {
        match self.keeper {
            Keeper::Nothing => {}
            Keeper::Dir(dir, every) => {
                w.tasks.spawn(dir.watch(every, w.drain.clone()));
            }
            Keeper::IstioCa(certs) => {
                let wanted = local_identities(workloads.clone(), w);
                w.tasks.spawn(certs.run(wanted, w.drain.clone()));
            }
        }
        self.source
    }
}

/// The Istio CA client's settings from the `certificates:` section.
fn settings(c: &IstioCaConfig) -> IstioCaSettings {
    IstioCaSettings {
        client: CaClientConfig {
            address: c.address.clone(),
            roots: c.roots.clone(),
            token: c.token.clone(),
            cluster_id: c.cluster_id.clone(),
            server_name: c.server_name.clone(),
            timeout: c.timeout,
        },
        validity: c.validity,
        first_use_wait: c.first_use_wait,
        reload_interval: c.reload_interval,
        trust_answer_root: c.trust_answer_root,
    }
}

/// The identities of this node's HBONE workloads, the certificates the
/// Istio CA client keeps: republished whenever the set changes them.
fn local_identities(
    store: Arc<WorkloadStore>,
    w: &mut Wiring,
) -> watch::Receiver<BTreeSet<SpiffeId>> {
    let wanted = |snapshot: &WorkloadSnapshot| -> BTreeSet<SpiffeId> {
        snapshot
            .locals()
            .filter(|w| w.spec.protocol == Protocol::Hbone)
            .map(|w| w.identity.clone())
            .collect()
    };
    let mut previous = store.snapshot();
    let (tx, rx) = watch::channel(wanted(&previous));
    let mut changed = store.subscribe();
    let mut drain = w.drain.clone();
    w.tasks.spawn(async move {
        loop {
            tokio::select! {
                r = changed.changed() => if r.is_err() { return },
                _ = drain.signaled() => return,
            }
            // A publish that changed no local workload (most of them, in
            // a large cluster) changes no identity: no walk.
            let current = store.snapshot();
            if current.same_locals(&previous) {
                continue;
            }
            previous = current;
            let now = wanted(&previous);
            tx.send_if_modified(|old| {
                let differs = *old != now;
                if differs {
                    *old = now;
                }
                differs
            });
        }
    });
    rx
}
