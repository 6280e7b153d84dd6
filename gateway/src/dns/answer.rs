//! Names the workload store answers: Services by hostname, seen from the
//! querying pod's namespace.
//!
//! A Service's hostname is the one istiod gives it, else
//! `<name>.<namespace>.svc.<cluster domain>` ([`service_hostname`]). A query is matched against, in order:
//!
//! 1. the name as asked;
//! 2. its Kubernetes expansions: one label (`web`) is a Service of the
//!    pod's namespace (`web.<ns>.svc.<domain>`); two (`web.shop`) a Service
//!    of another namespace, or a pod's hostname under a subdomain of the
//!    pod's namespace; three ending in `svc` (`web.shop.svc`) gains the
//!    domain, any other three gains `svc.<domain>`; four ending in `svc`
//!    gains the domain;
//! 3. the name with one of the pod's search domains taken off (the ones
//!    Kubernetes writes into a pod's `resolv.conf`: `<ns>.svc.<domain>`,
//!    `svc.<domain>`, `<domain>`) and that name's expansions. A stub
//!    resolver tries `web.shop` as `web.shop.<ns>.svc.<domain>` first;
//!    stripped back to `web.shop` it is found at once, and the answer
//!    says so with a CNAME from the name asked to `web.shop`, whose
//!    addresses follow.
//!
//! Each candidate is looked up as itself, then as the wildcards above it
//! (`*.shop.svc.<domain>`, …). A Service without VIPs is only found under
//! the cluster's `svc` domain (a headless Service: its ready endpoints'
//! addresses); when two Services share a hostname the one in the pod's
//! namespace wins. Only A and AAAA are answered; a name found without an
//! address of the asked family is NOERROR with no records (the name
//! exists), never NXDOMAIN. Everything else — other types, names the store
//! does not have — goes upstream.
//!
//! This is what Istio ambient's ztunnel answers, so a pod resolves the same
//! under either node proxy. Like ztunnel, workloads are not resolved by pod
//! name: a pod is reached through its Services (a headless Service gives
//! its endpoints' own addresses).

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use hickory_proto::op::Query;
use hickory_proto::rr::rdata::{A, AAAA, CNAME};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

use crate::workloads::services::{Service, ServiceSpec};
use crate::workloads::{WorkloadSnapshot, WorkloadStore};
use tidegate_base::sync::Locked;

/// The TTL of the store's answers (ztunnel's).
pub const TTL_SECONDS: u32 = 30;

/// A Service's DNS name, without the trailing dot: istiod's `hostname`
/// when the Service came from istiod, else the Kubernetes name.
pub fn service_hostname(spec: &ServiceSpec, domain: &str) -> String {
    match &spec.hostname {
        Some(h) => h.trim_end_matches('.').to_ascii_lowercase(),
        None => format!("{}.{}.svc.{domain}", spec.name, spec.namespace),
    }
}

/// What the store says about a query.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Not a name of the store, or not A/AAAA: the upstream server answers.
    NotOurs,
    /// The store's answer: the records (none: the name exists without an
    /// address of the asked family).
    Answer(Vec<Record>),
}

/// Services by lowercase hostname, for one published snapshot: brought
/// up to date from the previous one by what changed (a persistent map:
/// the copy is O(1), the update O(changed Services)).
struct Index {
    generation: u64,
    snapshot: Arc<WorkloadSnapshot>,
    by_host: imbl::HashMap<String, Vec<Arc<Service>>>,
}

/// The store's names, as pods query them.
pub struct Names {
    workloads: Arc<WorkloadStore>,
    domain: String,
    /// `svc.<domain>`, as labels.
    svc_domain: Vec<String>,
    domain_labels: Vec<String>,
    index: Mutex<Option<Arc<Index>>>,
}

type Labels = Vec<String>;

impl Names {
    /// `domain`: the cluster domain (`dns.cluster_domain`), checked by the config.
    pub fn new(workloads: Arc<WorkloadStore>, domain: &str) -> Names {
        let domain = domain.to_ascii_lowercase();
        let domain_labels: Labels = domain.split('.').map(str::to_owned).collect();
        let mut svc_domain = vec!["svc".to_owned()];
        svc_domain.extend(domain_labels.iter().cloned());
        Names {
            workloads,
            domain,
            svc_domain,
            domain_labels,
            index: Mutex::new(None),
        }
    }

    /// The index of the current snapshot (rebuilt after a publish).
    fn index(&self) -> Arc<Index> {
        let snapshot = self.workloads.snapshot();
        let mut cached = self.index.locked();
        if let Some(i) = cached
            .as_ref()
            .filter(|i| i.generation == snapshot.generation)
        {
            return i.clone();
        }
        let by_host = match cached.as_ref() {
            Some(before) => self.updated(before, &snapshot),
            None => {
                let mut by_host: imbl::HashMap<String, Vec<Arc<Service>>> = Default::default();
                for svc in snapshot.services() {
                    by_host.entry(self.host(svc)).or_default().push(svc.clone());
                }
                by_host
            }
        };
        let i = Arc::new(Index {
            generation: snapshot.generation,
            snapshot,
            by_host,
        });
        *cached = Some(i.clone());
        i
    }

    fn host(&self, svc: &Service) -> String {
        service_hostname(&svc.spec, &self.domain).to_ascii_lowercase()
    }

    /// `before`'s index with the Services changed since applied: each
    /// host's list stays in key order, as a full build gives it.
    fn updated(
        &self,
        before: &Index,
        now: &WorkloadSnapshot,
    ) -> imbl::HashMap<String, Vec<Arc<Service>>> {
        let mut by_host = before.by_host.clone();
        for (old, new) in now.service_changes_from(&before.snapshot) {
            if let Some(old) = old {
                let host = self.host(old);
                if let Some(list) = by_host.get_mut(&host) {
                    list.retain(|s| !Arc::ptr_eq(s, old));
                    if list.is_empty() {
                        by_host.remove(&host);
                    }
                }
            }
            if let Some(new) = new {
                let list = by_host.entry(self.host(new)).or_default();
                list.push(new.clone());
                list.sort_by_key(|s| s.key());
            }
        }
        by_host
    }

    /// Answers `query` from a pod of `namespace`.
    pub fn lookup(&self, namespace: &str, query: &Query) -> Lookup {
        let family = match query.query_type() {
            RecordType::A => Family::V4,
            RecordType::AAAA => Family::V6,
            _ => return Lookup::NotOurs,
        };
        if query.query_class() != DNSClass::IN {
            return Lookup::NotOurs;
        }
        let Some(labels) = labels_of(query.name()) else {
            return Lookup::NotOurs;
        };
        let index = self.index();
        let Some(found) = self.find(&index, namespace, &labels) else {
            return Lookup::NotOurs;
        };
        let mut addrs = addresses(&index.snapshot, &found.service, family);
        fastrand::shuffle(&mut addrs);
        let asked = query.name().clone();
        let mut records = Vec::new();
        let owner = match found.stripped {
            Some(n) if !found.wildcard => {
                // The labels as asked (their case kept), less the search domain.
                let mut stripped = Name::from_labels(asked.iter().take(n)).unwrap_or_default();
                stripped.set_fqdn(true);
                if !addrs.is_empty() {
                    records.push(Record::from_rdata(
                        asked,
                        TTL_SECONDS,
                        RData::CNAME(CNAME(stripped.clone())),
                    ));
                }
                stripped
            }
            _ => asked,
        };
        for ip in addrs {
            let rdata = match ip {
                IpAddr::V4(v4) => RData::A(A(v4)),
                IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
            };
            records.push(Record::from_rdata(owner.clone(), TTL_SECONDS, rdata));
        }
        Lookup::Answer(records)
    }

    /// The first Service the aliases of `labels` reach.
    fn find(&self, index: &Index, namespace: &str, labels: &[String]) -> Option<Found> {
        for alias in self.aliases(namespace, labels) {
            for (i, candidate) in wildcards(&alias.name).into_iter().enumerate() {
                let Some(services) = index.by_host.get(&candidate) else {
                    continue;
                };
                let svc_suffix = format!(".{}", self.svc_domain.join("."));
                let usable = services
                    .iter()
                    .filter(|s| !s.spec.vips.is_empty() || candidate.ends_with(&svc_suffix));
                let mut best = None;
                for s in usable {
                    if s.spec.namespace == namespace {
                        best = Some(s);
                        break;
                    }
                    best = best.or(Some(s));
                }
                if let Some(s) = best {
                    return Some(Found {
                        service: s.clone(),
                        stripped: alias.stripped,
                        wildcard: i > 0,
                    });
                }
            }
        }
        None
    }

    /// The names `labels` may stand for, from a pod of `namespace`, in
    /// the order they are tried (see the module documentation).
    fn aliases(&self, namespace: &str, labels: &[String]) -> Vec<Alias> {
        let ns = namespace.to_ascii_lowercase();
        let mut ns_domain = vec![ns];
        ns_domain.extend(self.svc_domain.iter().cloned());
        let search = [
            ns_domain.clone(),
            self.svc_domain.clone(),
            self.domain_labels.clone(),
        ];
        let mut out: Vec<Alias> = Vec::new();
        let mut add = |name: Labels, stripped: Option<usize>| {
            if !out.iter().any(|a| a.name == name) {
                out.push(Alias { name, stripped });
            }
        };
        add(labels.to_vec(), None);
        for name in self.expansions(labels, &ns_domain) {
            add(name, None);
        }
        for domain in &search {
            let Some(stripped) = strip(labels, domain) else {
                continue;
            };
            let n = stripped.len();
            add(stripped.to_vec(), Some(n));
            for name in self.expansions(stripped, &ns_domain) {
                add(name, Some(n));
            }
        }
        out
    }

    /// The Kubernetes names `labels` expands to (`ns_domain`: `<ns>.svc.<domain>`).
    fn expansions(&self, labels: &[String], ns_domain: &[String]) -> Vec<Labels> {
        let join = |a: &[String], b: &[String]| -> Labels { a.iter().chain(b).cloned().collect() };
        let ends_in_svc = labels.last().is_some_and(|l| l == "svc");
        match labels.len() {
            1 => vec![join(labels, ns_domain)],
            2 => vec![join(labels, &self.svc_domain), join(labels, ns_domain)],
            3 if ends_in_svc => vec![
                join(labels, &self.domain_labels),
                join(labels, &self.svc_domain),
            ],
            3 => vec![join(labels, &self.svc_domain)],
            4 if ends_in_svc => vec![join(labels, &self.domain_labels)],
            _ => Vec::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn of(ip: &IpAddr) -> Family {
        if ip.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }
}

#[derive(Debug)]
struct Alias {
    name: Labels,
    /// Found by taking a search domain off: the labels left.
    stripped: Option<usize>,
}

struct Found {
    service: Arc<Service>,
    stripped: Option<usize>,
    /// Matched as a wildcard (`*.example.com`): no CNAME then.
    wildcard: bool,
}

/// The lowercase labels of `name`; `None` for a name no Service has (the
/// root, a label that is not plain ASCII or holds a dot).
fn labels_of(name: &Name) -> Option<Labels> {
    let labels: Option<Labels> = name
        .iter()
        .map(|l| {
            let ok = !l.is_empty() && l.iter().all(|b| b.is_ascii_graphic() && *b != b'.');
            ok.then(|| String::from_utf8_lossy(l).to_ascii_lowercase())
        })
        .collect();
    labels.filter(|l| !l.is_empty())
}

/// `labels` less `domain` at its end, when something is left.
fn strip<'a>(labels: &'a [String], domain: &[String]) -> Option<&'a [String]> {
    let keep = labels.len().checked_sub(domain.len()).filter(|k| *k > 0)?;
    (labels[keep..] == *domain).then(|| &labels[..keep])
}

/// `a.b.c` → `a.b.c`, `*.b.c`, `*.c`.
fn wildcards(labels: &[String]) -> Vec<String> {
    let mut out = vec![labels.join(".")];
    for i in 1..labels.len() {
        out.push(format!("*.{}", labels[i..].join(".")));
    }
    out
}

/// The addresses of the asked family: the VIPs, or (a headless Service)
/// each ready endpoint's first address of that family.
fn addresses(snapshot: &WorkloadSnapshot, svc: &Service, family: Family) -> Vec<IpAddr> {
    if !svc.spec.vips.is_empty() {
        return svc
            .spec
            .vips
            .iter()
            .filter(|ip| Family::of(ip) == family)
            .copied()
            .collect();
    }
    let mut uids: Vec<&str> = match &svc.spec.endpoints {
        Some(eps) => eps
            .iter()
            .filter(|(_, c)| c.ready)
            .map(|(uid, _)| &**uid)
            .collect(),
        None => svc
            .endpoints
            .values()
            .flatten()
            .filter(|e| e.conditions.ready)
            .map(|e| e.workload.uid())
            .collect(),
    };
    uids.sort_unstable();
    uids.dedup();
    uids.into_iter()
        .filter_map(|uid| snapshot.by_uid(uid))
        .filter(|w| {
            // A workload the gateway knows is terminating is not ready,
            // whatever its slice still says.
            w.spec.state != crate::workloads::LifecycleState::Terminating
        })
        .filter_map(|w| {
            w.spec
                .ips
                .iter()
                .find(|ip| Family::of(ip) == family)
                .copied()
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::workloads::WholeSet;
    use crate::workloads::WorkloadSpec;

    /// A Service as the workload file gives it (port 80).
    pub(crate) fn service(name: &str, ns: &str, vips: &[&str]) -> ServiceSpec {
        let vips: Vec<String> = vips.iter().map(|v| format!("'{v}'")).collect();
        serde_yaml::from_str(&format!(
            "{{name: {name}, namespace: {ns}, vips: [{}], ports: [{{port: 80}}]}}",
            vips.join(", ")
        ))
        .unwrap()
    }

    fn workload(uid: &str, ns: &str, ips: &[&str], services: &[&str]) -> WorkloadSpec {
        WorkloadSpec::new(uid, "n")
            .namespace(ns)
            .service_account("sa")
            .ips(ips.iter().map(|v| v.parse().unwrap()))
            .services(services.iter().copied())
    }

    fn names() -> Names {
        let store = WorkloadStore::new("cluster.local", "n");
        store.publish(
            WholeSet::new(vec![
                workload("db-0", "shop", &["10.134.1.10", "fd00::10"], &["db"]),
                workload("db-1", "shop", &["10.134.1.11"], &["db"]),
            ])
            .services(vec![
                service("web", "shop", &["10.134.0.1", "fd00::1"]),
                service("web", "blog", &["10.134.0.2"]),
                service("v4only", "shop", &["10.134.0.3"]),
                service("db", "shop", &[]),
            ]),
        );
        Names::new(store, "cluster.local")
    }

    fn q(name: &str, t: RecordType) -> Query {
        Query::query(Name::from_ascii(name).unwrap(), t)
    }

    /// The records as `owner type data` lines, sorted.
    fn lines(l: Lookup) -> Vec<String> {
        let Lookup::Answer(records) = l else {
            panic!("not answered from the store: {l:?}");
        };
        let mut v: Vec<String> = records
            .iter()
            .map(|r| format!("{} {} {}", r.name, r.record_type(), r.data))
            .collect();
        v.sort();
        v
    }

    /// The index kept across publishes (updated from what changed) answers
    /// as one built afresh from the same snapshot, after Services come, move
    /// to other VIPs and go.
    #[test]
    fn the_name_index_follows_service_changes_as_a_fresh_one_would() {
        let store = WorkloadStore::new("cluster.local", "n");
        let kept = Names::new(store.clone(), "cluster.local");
        let answer = |n: &Names, ns: &str, name: &str| match n.lookup(ns, &q(name, RecordType::A)) {
            Lookup::NotOurs => vec!["not ours".to_owned()],
            l => lines(l),
        };
        let asked = [
            ("shop", "web."),
            ("blog", "web."),
            ("x", "web.shop.svc.cluster.local."),
            ("x", "api.blog.svc.cluster.local."),
            ("shop", "db."),
        ];
        let steps: Vec<Vec<ServiceSpec>> = vec![
            vec![service("web", "shop", &["10.134.0.1"])],
            vec![
                service("web", "shop", &["10.134.0.1"]),
                service("web", "blog", &["10.134.0.2"]),
                service("api", "blog", &["10.134.0.3"]),
            ],
            vec![
                service("web", "shop", &["10.134.0.9"]),
                service("api", "blog", &["10.134.0.3"]),
            ],
            vec![service("api", "blog", &["10.134.0.4"])],
            vec![],
        ];
        for (i, services) in steps.into_iter().enumerate() {
            store.publish(WholeSet::new(vec![]).services(services));
            let fresh = Names::new(store.clone(), "cluster.local");
            for (ns, name) in asked {
                assert_eq!(
                    answer(&kept, ns, name),
                    answer(&fresh, ns, name),
                    "step {i}: {name} from {ns}"
                );
            }
        }
        assert_eq!(
            answer(&kept, "x", "api.blog.svc.cluster.local."),
            ["not ours"]
        );
    }

    #[test]
    fn the_service_hostname_is_name_namespace_svc_domain() {
        let s = service("web", "shop", &[]);
        assert_eq!(
            service_hostname(&s, "cluster.local"),
            "web.shop.svc.cluster.local"
        );
        assert_eq!(service_hostname(&s, "corp"), "web.shop.svc.corp");
        let mut from_istiod = s.clone();
        from_istiod.hostname = Some("Web.Shop.svc.mesh.example.".into());
        assert_eq!(
            service_hostname(&from_istiod, "cluster.local"),
            "web.shop.svc.mesh.example",
            "istiod's hostname, as a DNS name"
        );
    }

    #[test]
    fn a_service_resolves_by_its_full_name_from_any_namespace() {
        let n = names();
        for ns in ["shop", "blog", "other"] {
            assert_eq!(
                lines(n.lookup(ns, &q("web.shop.svc.cluster.local.", RecordType::A))),
                ["web.shop.svc.cluster.local. A 10.134.0.1"],
                "from {ns}"
            );
        }
        // Case-insensitive; the answer keeps the case asked.
        assert_eq!(
            lines(n.lookup("x", &q("WEB.Shop.svc.cluster.local.", RecordType::A))),
            ["WEB.Shop.svc.cluster.local. A 10.134.0.1"]
        );
    }

    #[test]
    fn short_names_resolve_from_the_pods_namespace_like_kube_dns() {
        let n = names();
        // `web` from shop is shop's web, from blog blog's.
        assert_eq!(
            lines(n.lookup("shop", &q("web.", RecordType::A))),
            ["web. A 10.134.0.1"]
        );
        assert_eq!(
            lines(n.lookup("blog", &q("web.", RecordType::A))),
            ["web. A 10.134.0.2"]
        );
        // `web.shop` and `web.shop.svc` from anywhere.
        assert_eq!(
            lines(n.lookup("blog", &q("web.shop.", RecordType::A))),
            ["web.shop. A 10.134.0.1"]
        );
        assert_eq!(
            lines(n.lookup("blog", &q("web.shop.svc.", RecordType::A))),
            ["web.shop.svc. A 10.134.0.1"]
        );
    }

    #[test]
    fn a_search_domain_expansion_is_answered_with_a_cname_to_the_short_name() {
        let n = names();
        // The stub resolver's first try for `web` from shop: the name itself.
        assert_eq!(
            lines(n.lookup("shop", &q("web.shop.svc.cluster.local.", RecordType::A))),
            ["web.shop.svc.cluster.local. A 10.134.0.1"]
        );
        // Its first try for `web.shop` from blog: `web.shop.blog.svc.cluster.local`.
        assert_eq!(
            lines(n.lookup(
                "blog",
                &q("web.shop.blog.svc.cluster.local.", RecordType::A)
            )),
            [
                "web.shop. A 10.134.0.1",
                "web.shop.blog.svc.cluster.local. CNAME web.shop."
            ]
        );
        // `web` from blog tried under `svc.cluster.local` (the second search domain).
        assert_eq!(
            lines(n.lookup("blog", &q("web.svc.cluster.local.", RecordType::A))),
            ["web. A 10.134.0.2", "web.svc.cluster.local. CNAME web."]
        );
    }

    #[test]
    fn a_and_aaaa_answer_their_own_family_and_an_empty_family_is_noerror() {
        let n = names();
        let fqdn = "web.shop.svc.cluster.local.";
        assert_eq!(
            lines(n.lookup("shop", &q(fqdn, RecordType::AAAA))),
            [format!("{fqdn} AAAA fd00::1")]
        );
        // The name exists; it has no IPv6 address: no records, not NXDOMAIN.
        assert_eq!(
            n.lookup(
                "shop",
                &q("v4only.shop.svc.cluster.local.", RecordType::AAAA)
            ),
            Lookup::Answer(vec![])
        );
        // Nor a CNAME for a stripped name without records.
        assert_eq!(
            n.lookup(
                "blog",
                &q("v4only.shop.blog.svc.cluster.local.", RecordType::AAAA)
            ),
            Lookup::Answer(vec![])
        );
    }

    /// A dual-stack Service (IPv6 primary, as `ipFamilies: [IPv6, IPv4]`
    /// lists it) answers each family its own address; an IPv6-only one
    /// answers AAAA, and A with no records (NOERROR, never NXDOMAIN: the
    /// client goes on to AAAA).
    #[test]
    fn dual_stack_and_ipv6_only_services_answer_aaaa_from_the_store() {
        let store = WorkloadStore::new("cluster.local", "n");
        store.publish(WholeSet::new(vec![]).services(vec![
            service("dual", "shop", &["fd00::5", "10.134.0.5"]),
            service("six", "shop", &["fd00::6"]),
        ]));
        let n = Names::new(store, "cluster.local");
        let dual = "dual.shop.svc.cluster.local.";
        assert_eq!(
            lines(n.lookup("shop", &q(dual, RecordType::A))),
            [format!("{dual} A 10.134.0.5")]
        );
        assert_eq!(
            lines(n.lookup("shop", &q(dual, RecordType::AAAA))),
            [format!("{dual} AAAA fd00::5")]
        );
        let six = "six.shop.svc.cluster.local.";
        assert_eq!(
            lines(n.lookup("shop", &q(six, RecordType::AAAA))),
            [format!("{six} AAAA fd00::6")]
        );
        assert_eq!(
            n.lookup("shop", &q(six, RecordType::A)),
            Lookup::Answer(vec![])
        );
        // The short name from the Service's namespace, too.
        assert_eq!(
            lines(n.lookup("shop", &q("six.", RecordType::AAAA))),
            ["six. AAAA fd00::6"]
        );
    }

    #[test]
    fn a_headless_service_answers_its_ready_endpoints_addresses() {
        let n = names();
        assert_eq!(
            lines(n.lookup("shop", &q("db.shop.svc.cluster.local.", RecordType::A))),
            [
                "db.shop.svc.cluster.local. A 10.134.1.10",
                "db.shop.svc.cluster.local. A 10.134.1.11"
            ]
        );
        assert_eq!(
            lines(n.lookup("shop", &q("db.", RecordType::AAAA))),
            ["db. AAAA fd00::10"]
        );
    }

    #[test]
    fn everything_else_is_not_the_stores() {
        let n = names();
        for (name, t) in [
            ("example.com.", RecordType::A),
            ("nope.shop.svc.cluster.local.", RecordType::A),
            ("web.other.svc.cluster.local.", RecordType::A),
            // Other types of a Service's name go upstream too.
            ("web.shop.svc.cluster.local.", RecordType::SRV),
            ("web.shop.svc.cluster.local.", RecordType::TXT),
            (".", RecordType::A),
            // Beyond the Kubernetes forms.
            ("web.shop.svc.cluster.local.example.", RecordType::A),
            ("svc.cluster.local.", RecordType::A),
        ] {
            assert_eq!(n.lookup("shop", &q(name, t)), Lookup::NotOurs, "{name} {t}");
        }
        let mut chaos = q("web.shop.svc.cluster.local.", RecordType::A);
        chaos.set_query_class(DNSClass::CH);
        assert_eq!(n.lookup("shop", &chaos), Lookup::NotOurs);
    }

    #[test]
    fn a_publish_is_seen_by_the_next_query() {
        let store = WorkloadStore::new("cluster.local", "n");
        let n = Names::new(store.clone(), "cluster.local");
        let query = q("late.shop.svc.cluster.local.", RecordType::A);
        assert_eq!(n.lookup("shop", &query), Lookup::NotOurs);
        store.publish(WholeSet::new(vec![]).services(vec![service(
            "late",
            "shop",
            &["10.134.0.9"],
        )]));
        assert_eq!(
            lines(n.lookup("shop", &query)),
            ["late.shop.svc.cluster.local. A 10.134.0.9"]
        );
    }

    #[test]
    fn another_cluster_domain() {
        let store = WorkloadStore::new("td", "n");
        store.publish(WholeSet::new(vec![]).services(vec![service(
            "web",
            "shop",
            &["10.134.0.1"],
        )]));
        let n = Names::new(store, "corp.example");
        assert_eq!(
            lines(n.lookup("blog", &q("web.shop.svc.corp.example.", RecordType::A))),
            ["web.shop.svc.corp.example. A 10.134.0.1"]
        );
        assert_eq!(
            n.lookup("blog", &q("web.shop.svc.cluster.local.", RecordType::A)),
            Lookup::NotOurs
        );
    }
}
