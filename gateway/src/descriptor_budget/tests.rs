//! The split at the limits that matter: this machine's 20,000, a node's
//! usual 1,048,576, small ones, and every share disjoint.

use super::*;

/// The defaults in in-pod mode: 1,000 pods of 8, `dns.max_in_flight` 512,
/// `dns.max_tcp_connections` 256.
fn inpod_defaults() -> PodWants {
    let mut config = Config::default();
    config.capture.mode = CaptureMode::Inpod;
    PodWants::of(&config)
}

#[test]
fn the_defaults_ask_for_a_thousand_pods_of_eight_and_the_dns_bounds() {
    assert_eq!(
        inpod_defaults(),
        PodWants {
            max_pods: 1_000,
            per_pod: 8,
            dns_forwards: 512,
            dns_tcp: 256
        }
    );
    let mut config = Config::default();
    assert_eq!(PodWants::of(&config), PodWants::default(), "node mode");
    config.capture.mode = CaptureMode::Inpod;
    config.dns.enabled = false;
    let w = PodWants::of(&config);
    assert_eq!((w.per_pod, w.dns_forwards, w.dns_tcp), (4, 0, 0));
}

#[test]
fn a_thousand_pods_fit_at_an_open_file_limit_of_20_000() {
    // The control plane's default budget with the CNI socket: 416.
    let b = DescriptorBudget::derive(20_000 - 416, 416, inpod_defaults());
    assert_eq!(
        b,
        DescriptorBudget {
            limit: 20_000,
            control_plane: 416,
            data_path: 19_584,
            per_pod: 8,
            max_pods: 1_000,
            pods: 8_000,
            dns_forwards: 512,
            dns_tcp: 256,
            inbound: 8_112,
            outbound_and_files: 2_704,
        },
        "update the module doc, README and docs/performance.md"
    );
    // Without the CNI socket (istio-cni over ZDS) the control plane holds 160.
    let b = DescriptorBudget::derive(20_000 - 160, 160, inpod_defaults());
    assert_eq!((b.max_pods, b.inbound), (1_000, 8_304));
}

#[test]
fn a_limit_too_small_for_max_pods_serves_fewer_and_keeps_the_dns_a_quarter() {
    // 2,048: half of the 1,632 left is 816; the DNS part keeps 204 (its
    // bounds in proportion, 136 and 68), the pods 612: 76 of them.
    let b = DescriptorBudget::derive(2_048 - 416, 416, inpod_defaults());
    assert_eq!(
        (b.max_pods, b.pods, b.dns_forwards, b.dns_tcp),
        (76, 608, 136, 68)
    );
    assert_eq!(b.pods_share(), 812);
    assert_eq!((b.inbound, b.outbound_and_files), (615, 205));
    // A small max_pods leaves the DNS what it asks, within the half.
    let few = PodWants {
        max_pods: 2,
        ..inpod_defaults()
    };
    let b = DescriptorBudget::derive(1_632, 416, few);
    assert_eq!((b.max_pods, b.dns_forwards + b.dns_tcp), (2, 768));
    // DNS bounds far above the limit take no pod's place the pods ask.
    let greedy_dns = PodWants {
        max_pods: 10,
        dns_forwards: 1_000_000,
        dns_tcp: 1_000_000,
        ..inpod_defaults()
    };
    let b = DescriptorBudget::derive(1_632, 416, greedy_dns);
    assert_eq!(b.max_pods, 10);
    assert_eq!(b.pods_share(), 816);
    assert!(b.dns_forwards >= 1 && b.dns_tcp >= 1);
}

#[test]
fn node_mode_leaves_the_inbound_caps_three_quarters() {
    let b = DescriptorBudget::derive(20_000 - 160, 160, PodWants::default());
    assert_eq!((b.max_pods, b.pods_share()), (0, 0));
    assert_eq!((b.inbound, b.outbound_and_files), (14_880, 4_960));
}

#[test]
fn the_shares_never_overlap_and_never_exceed_the_data_path() {
    let wants = [
        inpod_defaults(),
        PodWants::default(),
        PodWants {
            max_pods: 100_000,
            ..inpod_defaults()
        },
        PodWants {
            max_pods: 1,
            per_pod: 4,
            dns_forwards: 0,
            dns_tcp: 0,
        },
        PodWants {
            max_pods: 100_000,
            per_pod: 8,
            dns_forwards: 1_000_000,
            dns_tcp: 1,
        },
    ];
    for d in [
        0,
        1,
        2,
        7,
        608,
        1_632,
        19_584,
        1_048_160,
        u64::from(u32::MAX),
    ] {
        for w in wants {
            let b = DescriptorBudget::derive(d, 416, w);
            assert!(b.pods_share() <= d / 2, "{d} {w:?}: {b:?}");
            assert_eq!(
                b.pods_share() + b.inbound + b.outbound_and_files,
                d,
                "{d} {w:?}"
            );
            assert!(b.max_pods <= w.max_pods);
            assert!(b.dns_forwards <= w.dns_forwards && b.dns_tcp <= w.dns_tcp);
            // The inbound caps keep at least three eighths of D.
            assert!(b.inbound >= d / 8 * 3, "{d} {w:?}: {b:?}");
        }
    }
    // A node's usual limit holds the defaults many times over.
    let b = DescriptorBudget::derive(1_048_576 - 416, 416, inpod_defaults());
    assert_eq!(b.max_pods, 1_000);
    assert_eq!(b.inbound, 779_544);
}
