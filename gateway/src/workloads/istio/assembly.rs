//! istiod's converted resources, held by resource name and assembled as
//! they change: what [`convert::assemble`] makes of a whole set, made for
//! the part an update touched ([`Assembly::take_delta`]).
//!
//! A Service lists no endpoints; each workload names the Services it is an
//! endpoint of. So a workload's change touches the Services it names or
//! named (their endpoint lists), and a Service appearing or leaving
//! touches the workloads naming it (their `services`). Two workloads
//! claiming one address touch each other: the address goes to one of them
//! by [`convert`]'s rule. Everything else stays as the store holds it.
//! Indexes: host (`namespace/hostname`) → the Service held under it and
//! the workloads naming it; address → the workloads claiming it.
//!
//! A workload's resource name is allocated once ([`Name`]) and shared by
//! every index that holds it (and by its uid, which istiod makes the
//! same); a host once, shared by the workloads naming it.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Arc;

use foldhash::{HashMap, HashSet};
use tracing::{info, warn};

use super::convert::{self, IstioWorkload, Standing};
use crate::workloads::services::{Conditions, EndpointTarget, ServiceSpec};
use crate::workloads::{Delta, EndpointChange, WorkloadSpec};

/// A resource name or a host, shared by everything that holds it.
type Name = Arc<str>;

#[derive(Debug, Default)]
pub struct Assembly {
    workloads: HashMap<Name, Kept>,
    /// Converted specs the store has not taken yet, by resource name
    /// ([`Assembly::take_delta`] hands them over and lets them go).
    pending: HashMap<Name, WorkloadSpec>,
    services: HashMap<String, ServiceSpec>,
    /// Host → the resource name of the Service held under it.
    hosts: HashMap<String, String>,
    /// Host → the workloads (resource names) naming it, held or not.
    naming: HashMap<Name, BTreeSet<Name>>,
    /// Address → the workloads (resource names) claiming it; almost
    /// always one.
    claims: HashMap<IpAddr, Vec<Name>>,
    /// The addresses more than one workload claims (a handful, usually
    /// none): any other claimed address is its one claimant's, found
    /// without probing `claims`.
    shared: HashSet<IpAddr>,
    /// Changed since the last [`Assembly::take_delta`]: workloads (by
    /// resource name) to assemble again, hosts whose Service is to be
    /// assembled whole (it changed), endpoints to assemble one by one
    /// (host, workload resource name, uid: a workload that changed in a
    /// Service that did not), and what left.
    dirty_workloads: HashSet<Name>,
    dirty_hosts: HashSet<Name>,
    /// Possibly twice over, and possibly in a Service assembled whole
    /// after all: sorted out once, in [`Assembly::take_delta`].
    dirty_endpoints: Vec<(Name, Name, Name)>,
    dirty_ips: BTreeSet<IpAddr>,
    removed_workloads: Vec<String>,
    removed_services: Vec<String>,
    /// Refused resources with nothing held under their name (and
    /// addresses in conflict, as `address <ip>`): the addresses they name,
    /// held closed by the store.
    refused: HashMap<String, Vec<IpAddr>>,
    /// The addresses in conflict (held in `refused` as `address <ip>`).
    conflicts: HashSet<IpAddr>,
    /// Refusals to tell the store of (an empty list: lifted).
    refusals: BTreeMap<String, Vec<IpAddr>>,
    /// Keys the digests (per process: not computable from outside).
    digests: std::collections::hash_map::RandomState,
    /// Label sets, shared by the workloads that carry the same (a
    /// Deployment's replicas: istiod gives each its canonical name and
    /// revision).
    labels: Interned,
    /// The host a workload named last: its replicas, one after another,
    /// share it without a lookup.
    last_host: Option<Name>,
}

/// Label sets held once however many workloads carry them. A set no
/// workload holds any more is let go when the table has doubled since it
/// was last swept (amortised O(1) a workload).
#[derive(Debug, Default)]
struct Interned {
    sets: HashSet<Arc<BTreeMap<String, String>>>,
    swept_at: usize,
    /// The set shared last: a Deployment's replicas come one after
    /// another, and are matched without hashing their labels.
    last: Option<Arc<BTreeMap<String, String>>>,
}

impl Interned {
    fn share(&mut self, labels: Arc<BTreeMap<String, String>>) -> Arc<BTreeMap<String, String>> {
        if let Some(last) = self.last.as_ref().filter(|l| **l == labels) {
            return last.clone();
        }
        let shared = self.share_held(labels);
        self.last = Some(shared.clone());
        shared
    }

    fn share_held(
        &mut self,
        labels: Arc<BTreeMap<String, String>>,
    ) -> Arc<BTreeMap<String, String>> {
        if let Some(held) = self.sets.get(&labels) {
            return held.clone();
        }
        if self.sets.len() >= 2 * self.swept_at + 1024 {
            self.sets.retain(|l| Arc::strong_count(l) > 1);
            self.swept_at = self.sets.len();
        }
        self.sets.insert(labels.clone());
        labels
    }
}

/// Service port → target port, in order.
type PortMap = Box<[(u16, u16)]>;

/// What the assembly keeps of a workload: what its indexes, its address
/// claims and its Services' endpoints need. The rest of its spec is held
/// once, by the store, and read back from it when the workload is
/// assembled again ([`Assembly::take_delta`]'s `held`); a spec the store
/// has not taken yet waits in `pending`.
#[derive(Debug)]
struct Kept {
    /// The resource's name when istiod makes the uid the same (it does).
    uid: Name,
    standing: Standing,
    healthy: bool,
    /// UNHEALTHY since it was first held ([`IstioWorkload::starting`]).
    starting: bool,
    host_network: bool,
    /// Its addresses, whatever its network mode.
    addresses: Box<[IpAddr]>,
    /// Host (`namespace/hostname`) → its port mapping for that Service
    /// (service port → target port, in order: a slice, not a map, for a
    /// mapping of a port or two).
    services: Box<[(Name, PortMap)]>,
    capacity: u32,
    /// The resource's digest ([`Assembly::digest`]): an update with the
    /// same bytes is not even decoded again.
    digest: u64,
}

impl Kept {
    /// Splits a converted workload, held under `name`, into what is kept
    /// and its spec; `host` gives each Service host's shared allocation.
    fn split(
        name: &Name,
        w: IstioWorkload,
        digest: u64,
        mut host: impl FnMut(String) -> Name,
    ) -> (Kept, WorkloadSpec) {
        let uid = if *w.spec.uid == **name {
            name.clone()
        } else {
            Name::from(w.spec.uid.as_str())
        };
        let kept = Kept {
            uid,
            standing: w.standing(),
            healthy: w.healthy,
            starting: w.starting,
            host_network: w.host_network,
            addresses: w.addresses.into(),
            services: w
                .services
                .into_iter()
                .map(|(h, p)| (host(h), p.into_iter().collect()))
                .collect(),
            capacity: w.capacity,
            digest,
        };
        (kept, w.spec)
    }

    /// The addresses it is indexed by: none for a HOST_NETWORK workload
    /// (its node's).
    fn claims(&self) -> &[IpAddr] {
        if self.host_network {
            &[]
        } else {
            &self.addresses
        }
    }

    fn ports(&self, host: &str) -> Option<&[(u16, u16)]> {
        self.services
            .iter()
            .find_map(|(h, p)| (**h == *host).then_some(&**p))
    }
}

/// The key of the Service held under a host, as last looked up: the
/// workloads assembled one after another name the same few hosts.
#[derive(Default)]
struct ServiceKeys {
    last: Option<(Name, Option<String>)>,
}

impl ServiceKeys {
    /// The key of the Service held under host `h`, from `look_up` unless
    /// `h` was the host asked for last.
    fn get(&mut self, h: &Name, look_up: impl FnOnce() -> Option<String>) -> Option<String> {
        match &self.last {
            Some((held, key)) if Arc::ptr_eq(held, h) => key.clone(),
            _ => {
                let key = look_up();
                self.last = Some((h.clone(), key.clone()));
                key
            }
        }
    }
}

/// A Service's host: how workloads name it (`namespace/hostname`).
fn host(s: &ServiceSpec) -> Option<String> {
    Some(format!("{}/{}", s.namespace, s.hostname.as_deref()?))
}

impl Assembly {
    pub fn workloads_len(&self) -> usize {
        self.workloads.len()
    }

    pub fn services_len(&self) -> usize {
        self.services.len()
    }

    /// Room for `n` more resources (a response's count) in what is let go
    /// once assembled: a large first answer's specs are not rehashed on
    /// the way in. (The held map grows by itself: reserving for Services
    /// too could double its table.)
    pub fn reserve(&mut self, n: usize) {
        self.pending.reserve(n);
        self.dirty_workloads.reserve(n);
    }

    /// Resource `name` was refused: with nothing held under its name, the
    /// addresses it names are held closed until it is accepted or removed
    /// (a refused resource makes its addresses more closed, never less).
    /// With a version held, that version stays and nothing changes.
    pub fn refuse(&mut self, name: String, addresses: Vec<IpAddr>) {
        let held = self.workloads.contains_key(name.as_str()) || self.services.contains_key(&name);
        if held || addresses.is_empty() || self.refused.get(&name) == Some(&addresses) {
            return;
        }
        self.refused.insert(name.clone(), addresses.clone());
        self.refusals.insert(name, addresses);
    }

    /// Held addresses of refused resources, as `(resources, addresses)`.
    pub fn refused_len(&self) -> (usize, usize) {
        (
            self.refused.len(),
            self.refused.values().map(Vec::len).sum(),
        )
    }

    /// Resource `name` is no longer refused (accepted or removed).
    fn lift(&mut self, name: &str) {
        if !self.refused.is_empty() && self.refused.remove(name).is_some() {
            self.refusals.insert(name.to_owned(), Vec::new());
        }
    }

    /// The digest of a resource's bytes (SipHash, keyed per process: not
    /// computable from outside), for [`Assembly::holds`] and
    /// [`Assembly::put_workload`].
    pub fn digest(&self, resource: &[u8]) -> u64 {
        self.digests.hash_one(resource)
    }

    /// Whether workload `name` is held as the resource of `digest`: the
    /// update changes nothing.
    pub fn holds(&self, name: &str, digest: u64) -> bool {
        self.workloads.get(name).is_some_and(|k| k.digest == digest)
    }

    /// Holds `w`, the resource of `digest`, under resource `name`
    /// (replacing a Service of that name).
    pub fn put_workload(&mut self, name: String, mut w: IstioWorkload, digest: u64) {
        self.lift(&name);
        self.remove_service(&name);
        let (name, was_healthy) = match self.workloads.get_key_value(name.as_str()) {
            Some((_, k)) if k.digest == digest => return,
            Some((held, k)) => (held.clone(), k.healthy || !k.starting),
            None => (Name::from(name), false),
        };
        if !was_healthy {
            w.mark_starting();
        }
        let naming = &self.naming;
        let last_host = &mut self.last_host;
        let (kept, mut spec) = Kept::split(&name, w, digest, |h| {
            if let Some(last) = last_host.as_ref().filter(|l| ***l == *h) {
                return last.clone();
            }
            let shared = naming
                .get_key_value(h.as_str())
                .map_or_else(|| Name::from(h), |(held, _)| held.clone());
            *last_host = Some(shared.clone());
            shared
        });
        spec.labels = self.labels.share(spec.labels);
        if let Some(old) = self.workloads.remove(&name) {
            self.index(&name, &old, false);
            if old.uid != kept.uid {
                self.removed_workloads.push(old.uid.to_string());
            }
        }
        self.index(&name, &kept, true);
        self.workloads.insert(name.clone(), kept);
        self.pending.insert(name.clone(), spec);
        self.dirty_workloads.insert(name);
    }

    /// Holds `s` under resource `name` (replacing a workload of that name).
    pub fn put_service(&mut self, name: String, s: ServiceSpec) {
        self.lift(&name);
        self.remove_workload(&name);
        let old = match self.services.get(&name) {
            Some(old) if *old == s => return,
            Some(old) => Some((host(old), old.key())),
            None => None,
        };
        let new_host = host(&s);
        if let Some((old_host, old_key)) = old {
            if old_key != s.key() {
                self.removed_services.push(old_key);
            }
            if old_host != new_host {
                if let Some(h) = old_host {
                    self.unhost(&name, h);
                }
            }
        }
        if let Some(h) = new_host {
            if self.hosts.get(&h) != Some(&name) {
                self.hosts.insert(h.clone(), name.clone());
                self.touch_naming(&h);
            }
            let h = self
                .naming
                .get_key_value(h.as_str())
                .map_or_else(|| Name::from(h), |(held, _)| held.clone());
            self.dirty_hosts.insert(h);
        }
        self.services.insert(name, s);
    }

    /// Drops resource `name`, a workload or a Service; false when neither
    /// was held.
    pub fn remove(&mut self, name: &str) -> bool {
        let refused = self.refused.contains_key(name);
        self.lift(name);
        self.remove_workload(name) | self.remove_service(name) | refused
    }

    fn remove_workload(&mut self, name: &str) -> bool {
        let Some((name, old)) = self.workloads.remove_entry(name) else {
            return false;
        };
        self.pending.remove(&name);
        self.index(&name, &old, false);
        self.removed_workloads.push(old.uid.to_string());
        true
    }

    fn remove_service(&mut self, name: &str) -> bool {
        let Some(old) = self.services.remove(name) else {
            return false;
        };
        self.removed_services.push(old.key());
        if let Some(h) = host(&old) {
            self.unhost(name, h);
        }
        true
    }

    /// Service `name` no longer holds host `h`: the workloads naming it
    /// lose it.
    fn unhost(&mut self, name: &str, h: String) {
        if self.hosts.get(&h).is_some_and(|n| n == name) {
            self.hosts.remove(&h);
            self.touch_naming(&h);
        }
    }

    /// The workloads naming host `h` are assembled again.
    fn touch_naming(&mut self, h: &str) {
        if let Some(names) = self.naming.get(h) {
            self.dirty_workloads.extend(names.iter().cloned());
        }
    }

    /// Adds (`add`) or drops workload `name`'s entries in the indexes,
    /// marking what they touch.
    fn index(&mut self, name: &Name, w: &Kept, add: bool) {
        for (h, _) in &w.services {
            let names = self.naming.entry(h.clone()).or_default();
            if add {
                names.insert(name.clone());
            } else {
                names.remove(name);
                if names.is_empty() {
                    self.naming.remove(h);
                }
            }
            if !self.dirty_hosts.contains(h) {
                self.dirty_endpoints
                    .push((h.clone(), name.clone(), w.uid.clone()));
            }
        }
        for ip in w.claims() {
            let names = self.claims.entry(*ip).or_default();
            match names.binary_search(name) {
                Err(at) if add => names.insert(at, name.clone()),
                Ok(at) if !add => {
                    names.remove(at);
                }
                _ => {}
            }
            match names.len() {
                0 => {
                    self.claims.remove(ip);
                    self.shared.remove(ip);
                }
                1 => {
                    self.dirty_workloads.insert(names[0].clone());
                    self.shared.remove(ip);
                }
                _ => {
                    self.dirty_workloads.extend(names.iter().cloned());
                    self.shared.insert(*ip);
                }
            }
            self.dirty_ips.insert(*ip);
        }
    }

    /// What changed since the last call, assembled: the workloads and
    /// Services to put (as [`convert::assemble`] would give them) and the
    /// ones that left. `held` gives a workload's spec as the store holds
    /// it, by uid ([`crate::workloads::WorkloadStore::spec`]): a workload
    /// assembled again because something else changed (a Service it
    /// names, an address it shares) is rebuilt from it.
    pub fn take_delta(&mut self, held: impl Fn(&str) -> Option<WorkloadSpec>) -> Delta {
        for ip in std::mem::take(&mut self.dirty_ips) {
            self.check_conflict(ip);
        }
        let mut delta = Delta {
            removed_workloads: std::mem::take(&mut self.removed_workloads),
            removed_services: std::mem::take(&mut self.removed_services),
            refused: std::mem::take(&mut self.refusals).into_iter().collect(),
            ..Default::default()
        };
        let mut pending = std::mem::take(&mut self.pending);
        // In name order (the uid's, as istiod names them): a Deployment's
        // replicas come one after another and name the same Services, and
        // the store puts them in that order.
        let mut dirty: Vec<Name> = std::mem::take(&mut self.dirty_workloads)
            .into_iter()
            .collect();
        dirty.sort_unstable();
        delta.workloads.reserve(dirty.len());
        let mut keys = ServiceKeys::default();
        for name in dirty {
            let Some(k) = self.workloads.get(&name) else {
                continue;
            };
            let Some(base) = pending.remove(&name).or_else(|| held(&k.uid)) else {
                warn!(%name, uid = %k.uid,
                    "a workload to assemble again is not in the store; it is published at its next update");
                continue;
            };
            delta
                .workloads
                .push(self.workload_spec(&name, k, base, &mut keys));
        }
        let whole = std::mem::take(&mut self.dirty_hosts);
        let mut endpoints = std::mem::take(&mut self.dirty_endpoints);
        endpoints.retain(|(h, _, _)| !whole.contains(h));
        endpoints.sort_unstable();
        endpoints.dedup();
        for (h, name, uid) in endpoints {
            if let Some(change) = self.endpoint_change(&h, &name, uid) {
                delta.endpoints.push(change);
            }
        }
        for h in whole {
            if let Some(spec) = self.service_spec(&h) {
                delta.services.push(spec);
            }
        }
        // Removed, then put again under the same uid or key (a resource
        // renamed, or named twice in one response): a put, nothing removed.
        if !delta.removed_workloads.is_empty() {
            let put: HashSet<&str> = delta.workloads.iter().map(|w| w.uid.as_str()).collect();
            delta
                .removed_workloads
                .retain(|uid| !put.contains(uid.as_str()));
        }
        if !delta.removed_services.is_empty() {
            let put: HashSet<String> = delta.services.iter().map(|s| s.key()).collect();
            delta.removed_services.retain(|key| !put.contains(key));
        }
        delta
    }

    /// Workload `name` (`k`, its spec `base`) as the store takes it: the
    /// held Services it names, the addresses it owns.
    fn workload_spec(
        &self,
        name: &str,
        k: &Kept,
        mut spec: WorkloadSpec,
        keys: &mut ServiceKeys,
    ) -> WorkloadSpec {
        spec.services = k
            .services
            .iter()
            .filter_map(|(h, _)| {
                keys.get(h, || Some(self.services.get(self.hosts.get(&**h)?)?.key()))
            })
            .collect();
        spec.ips = k
            .claims()
            .iter()
            .copied()
            // Its own alone (almost always): no standing to compare.
            .filter(|ip| !self.shared.contains(ip) || self.owner(ip) == Some(name))
            .collect();
        spec
    }

    /// Which of the workloads claiming `ip` has it ([`convert::owner`]):
    /// none when two of the same standing claim it.
    fn owner(&self, ip: &IpAddr) -> Option<&str> {
        let claimants = self
            .claims
            .get(ip)?
            .iter()
            .filter_map(|n| Some((&**n, self.workloads.get(n)?.standing)));
        convert::owner(claimants)
    }

    /// An address two workloads of the same standing claim: neither has
    /// it, and the store holds it closed until istiod resolves it (one of
    /// them leaves it, or is being deleted). Says so once, when it starts
    /// and when it ends.
    fn check_conflict(&mut self, ip: IpAddr) {
        let shared = self.claims.get(&ip).is_some_and(|c| c.len() > 1);
        let conflict = shared && self.owner(&ip).is_none();
        if !conflict && !self.conflicts.contains(&ip) {
            return;
        }
        let name = format!("address {ip}");
        match (conflict, self.refused.contains_key(&name)) {
            (true, false) => {
                let claimants: Vec<&str> = self.claims[&ip].iter().map(|n| &**n).collect();
                warn!(%ip, workloads = ?claimants,
                    "an address claimed by two workloads of the same standing: neither is served on it until istiod resolves it");
                self.conflicts.insert(ip);
                self.refused.insert(name.clone(), vec![ip]);
                self.refusals.insert(name, vec![ip]);
            }
            (false, true) => {
                info!(%ip, "an address's conflict is resolved");
                self.conflicts.remove(&ip);
                self.lift(&name);
            }
            (false, false) => {
                self.conflicts.remove(&ip);
            }
            (true, true) => {}
        }
    }

    /// The Service held under host `h`, its endpoints the workloads
    /// naming it.
    fn service_spec(&self, h: &str) -> Option<ServiceSpec> {
        let mut spec = self.services.get(self.hosts.get(h)?)?.clone();
        let mut endpoints = imbl::OrdMap::new();
        for w in self
            .naming
            .get(h)
            .into_iter()
            .flatten()
            .filter_map(|n| self.workloads.get(n))
        {
            let Some((conditions, target)) = self.endpoint(w, h, &spec) else {
                continue;
            };
            endpoints.insert(w.uid.clone(), conditions);
            if let Some(target) = target {
                spec.endpoint_targets.insert(w.uid.clone(), target);
            }
        }
        spec.endpoints = Some(endpoints);
        Some(spec)
    }

    /// Workload `w`'s entry as an endpoint of the Service `spec` held under
    /// host `h`: its conditions and what it brings of its own; `None`
    /// when it does not name the host.
    fn endpoint(
        &self,
        w: &Kept,
        h: &str,
        spec: &ServiceSpec,
    ) -> Option<(Conditions, Option<EndpointTarget>)> {
        let ports = w.ports(h)?.iter().copied();
        let target =
            convert::endpoint_target(w.host_network, &w.addresses, w.capacity, ports, spec);
        let target = (target != EndpointTarget::default()).then_some(target);
        Some((convert::conditions(w.healthy, w.starting), target))
    }

    /// The endpoint of `uid` (workload resource `name`) in the Service held
    /// under host `h`, as it now is (`entry: None`: no longer one); `None`
    /// without a Service under the host.
    fn endpoint_change(&self, h: &str, name: &str, uid: Name) -> Option<EndpointChange> {
        let spec = self.services.get(self.hosts.get(h)?)?;
        let entry = self
            .workloads
            .get(name)
            .filter(|w| w.uid == uid)
            .and_then(|w| self.endpoint(w, h, spec));
        Some(EndpointChange {
            service: spec.key(),
            uid,
            entry,
        })
    }
}

#[cfg(test)]
#[path = "assembly_tests.rs"]
mod tests;
