//! What authorization costs a new connection, and what a policy change
//! costs the live ones: `cargo bench -p tidegate-authz --bench decide`.
//!
//! - The decision for one connection with 0, 10 and 1,000 policies in
//!   scope (none matching until the last, the worst case), p50 and p99 of
//!   single calls, beside a loopback TCP connect and accept measured in the
//!   same run (the cheapest a connection gets).
//! - The decision with 10 policies in scope, as the cluster around them
//!   grows from those 10 to 10,000 (the rest in 2,000 other namespaces
//!   and a selector-scoped policy per other workload): a decision reads
//!   its namespace's, the global ones and those its workload names, never
//!   the cluster's.
//! - Re-checking 10,000 live connections after a change that refuses half
//!   of them: every decision, as the gateway runs them at each change.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use tidegate_authz::{
    Action, Clause, Connection, Destination, Identity, Match, Policy, PolicyStore, Rule, Scope,
    StringMatch,
};

fn policy(i: usize, action: Action, m: Match) -> Policy {
    Policy {
        name: format!("p{i}"),
        namespace: "shop".into(),
        scope: Scope::Namespace,
        action,
        rules: vec![Rule {
            clauses: vec![Clause { matches: vec![m] }],
        }],
        dry_run: false,
    }
}

/// `n` policies in the namespace: DENYs on ports nobody uses, and ALLOWs
/// naming other principals, the last naming the caller.
fn store(n: usize) -> PolicyStore {
    let mut s = PolicyStore::default();
    for i in 0..n {
        let p = if i % 2 == 0 && i + 1 < n {
            policy(
                i,
                Action::Deny,
                Match {
                    destination_ports: vec![10_000 + i as u16],
                    ..Match::default()
                },
            )
        } else {
            let who = if i + 1 == n {
                "caller".to_owned()
            } else {
                format!("other-{i}")
            };
            policy(
                i,
                Action::Allow,
                Match {
                    principals: vec![StringMatch::Exact(format!(
                        "cluster.local/ns/shop/sa/{who}"
                    ))],
                    ..Match::default()
                },
            )
        };
        s.insert(format!("shop/p{i}"), p);
    }
    s
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

fn timed(samples: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    let mut t: Vec<Duration> = (0..samples)
        .map(|_| {
            let at = Instant::now();
            f();
            at.elapsed()
        })
        .collect();
    t.sort();
    (percentile(&t, 0.5), percentile(&t, 0.99))
}

fn main() {
    let caller = Identity::new("cluster.local", "shop", "caller");
    let conn = Connection {
        src: "10.0.0.1:40000".parse().unwrap(),
        dst: "10.0.1.1:8080".parse().unwrap(),
        identity: Some(&caller),
    };
    let dest = Destination {
        namespace: "shop",
        policies: &[],
    };

    // The baseline: a loopback TCP connection, connected and accepted.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let (tcp50, tcp99) = timed(2_000, || {
        let c = TcpStream::connect(addr).unwrap();
        let (s, _) = listener.accept().unwrap();
        drop((c, s));
    });
    println!("Authorization decision per new connection (p50 / p99 of single calls)");
    println!("  loopback TCP connect + accept (baseline): {tcp50:>9.2?} / {tcp99:>9.2?}");
    for n in [0usize, 10, 1_000] {
        let s = store(n);
        assert!(s.decide(&dest, &conn).is_allow(), "the caller is allowed");
        let samples = if n >= 1_000 { 5_000 } else { 100_000 };
        let (p50, p99) = timed(samples, || {
            std::hint::black_box(s.decide(&dest, &conn));
        });
        println!(
            "  {n:>5} policies in scope: {p50:>9.2?} / {p99:>9.2?}   ({:.3} / {:.3} of the baseline)",
            p50.as_secs_f64() / tcp50.as_secs_f64(),
            p99.as_secs_f64() / tcp99.as_secs_f64(),
        );
    }

    // 10 in scope, the cluster around them growing.
    let mut base = None;
    for cluster in [10usize, 1_000, 10_000] {
        let mut s = store(10);
        for i in 10..cluster {
            let mut p = policy(
                i,
                Action::Deny,
                Match {
                    destination_ports: vec![8080],
                    ..Match::default()
                },
            );
            p.namespace = format!("ns-{}", i % 2_000);
            if i % 2 == 0 {
                p.scope = Scope::WorkloadSelector;
            }
            s.insert(format!("{}/p{i}", p.namespace), p);
        }
        assert_eq!(s.len(), cluster);
        assert!(s.decide(&dest, &conn).is_allow(), "the others never apply");
        let (p50, p99) = timed(100_000, || {
            std::hint::black_box(s.decide(&dest, &conn));
        });
        let (b50, b99) = *base.get_or_insert((p50, p99));
        println!(
            "  10 in scope of {cluster:>6} in the cluster: {p50:>9.2?} / {p99:>9.2?}   ({:.2} / {:.2} of 10 of 10)",
            p50.as_secs_f64() / b50.as_secs_f64(),
            p99.as_secs_f64() / b99.as_secs_f64(),
        );
    }

    // 10,000 live connections from 100 identities; a DENY arrives for half.
    let ids: Vec<Identity> = (0..100)
        .map(|i| Identity::new("cluster.local", "shop", &format!("sa-{i}")))
        .collect();
    let live: Vec<Connection<'_>> = (0..10_000)
        .map(|i| Connection {
            src: SocketAddr::new([10, 0, (i / 250) as u8, (i % 250) as u8].into(), 40000),
            dst: "10.0.1.1:8080".parse().unwrap(),
            identity: Some(&ids[i % 100]),
        })
        .collect();
    // Ten DENYs that refuse nobody here, and the new one.
    let mut changed = PolicyStore::default();
    for i in 0..10 {
        let m = Match {
            destination_ports: vec![10_000 + i as u16],
            ..Match::default()
        };
        changed.insert(format!("shop/p{i}"), policy(i, Action::Deny, m));
    }
    changed.insert(
        "shop/half".into(),
        policy(
            99,
            Action::Deny,
            Match {
                principals: (0..50)
                    .map(|i| StringMatch::Exact(format!("cluster.local/ns/shop/sa/sa-{i}")))
                    .collect(),
                ..Match::default()
            },
        ),
    );
    let mut runs: Vec<(Duration, usize)> = (0..20)
        .map(|_| {
            let at = Instant::now();
            let refused = live
                .iter()
                .filter(|c| !changed.decide(&dest, c).is_allow())
                .count();
            (at.elapsed(), refused)
        })
        .collect();
    runs.sort();
    let (median, refused) = runs[runs.len() / 2];
    println!("Re-check of 10,000 live connections after a change (11 policies in scope)");
    println!(
        "  {refused} refused, every decision in {median:.2?} (median of 20; {:.0} ns per connection)",
        median.as_nanos() as f64 / 10_000.0
    );
}
