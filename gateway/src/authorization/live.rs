//! The live inbound connections, each with the signal that closes it when
//! a later check refuses it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tidegate_authz::Denial;
use tokio::sync::Notify;

use super::{Authorizer, Facts};
use tidegate_base::sync::Locked;

/// Every registered connection, by a number of its own.
#[derive(Default)]
pub(super) struct Registry {
    next: AtomicU64,
    entries: Mutex<HashMap<u64, Arc<Entry>>>,
}

pub(super) struct Entry {
    facts: Facts,
    denial: OnceLock<Denial>,
    closing: Notify,
}

impl Entry {
    pub(super) fn facts(&self) -> &Facts {
        &self.facts
    }

    /// Tells the connection to close (once; a second refusal changes nothing).
    pub(super) fn close(&self, denial: Denial) {
        if self.denial.set(denial).is_ok() {
            // A permit is stored if nobody waits yet: the close is not lost.
            self.closing.notify_one();
        }
    }
}

impl Registry {
    pub(super) fn register(authz: &Arc<Authorizer>, facts: Facts) -> Admitted {
        let id = authz.live.next.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(Entry {
            facts,
            denial: OnceLock::new(),
            closing: Notify::new(),
        });
        authz.live.entries.locked().insert(id, entry.clone());
        authz.metrics.live_changed(1);
        Admitted {
            id,
            entry,
            authz: authz.clone(),
        }
    }

    /// The registered connections now (copied out: no lock held while
    /// they are decided on).
    pub(super) fn entries(&self) -> Vec<Arc<Entry>> {
        self.entries.locked().values().cloned().collect()
    }
}

/// A connection's registration: dropped when the connection ends.
pub struct Admitted {
    id: u64,
    entry: Arc<Entry>,
    authz: Arc<Authorizer>,
}

impl Admitted {
    pub(super) fn facts(&self) -> &Facts {
        &self.entry.facts
    }

    /// Resolves when a later check refuses the connection, with why.
    pub async fn refused(&self) -> Denial {
        self.entry.closing.notified().await;
        self.entry
            .denial
            .get()
            .cloned()
            .expect("set before the notification")
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.authz.live.entries.locked().remove(&self.id);
        self.authz.metrics.live_changed(-1);
    }
}
