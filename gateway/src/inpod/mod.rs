//! In-pod capture: the gateway serves each meshed pod from listeners opened
//! inside the pod's own network namespace (as Istio ambient's ztunnel does).
//!
//! - [`pods`]: the per-pod proxies (15001, 15006, 15008 inside each pod).
//! - [`intake`]: how pods come in — the one [`intake::PodIntake`] the
//!   per-pod proxies implement, and its adapters: `tidegate-cni`'s CNI
//!   socket, istio-cni's ZDS, the state directory.
//! - [`admission`]: which pods are taken (one namespace, one pod; never the
//!   gateway's own; `capture.max_pods`; descriptors to spare).
//!
//! The pods come from istio-cni's node agent over ZDS (the `tidegate-zds`
//! crate's client, which hands over each pod's namespace as a file
//! descriptor; [`intake::zds`] is its sink), from `tidegate-cni`'s CNI
//! socket ([`intake::cni_socket`]), or from the node state directory at
//! start ([`intake::state_dir`]).
//!
//! Shared with `tidegate-cni` (the `tidegate-netns` crate): [`capture`],
//! istio-cni's in-pod capture rules installed inside a pod's namespace
//! (what `tidegate-cni` ADD does in standalone mode), and
//! [`tidegate_netns::pod_records`], the node state directory
//! `tidegate-cni` records pods in, re-adopted by a restarted gateway.
//! Sockets inside a namespace are made by [`netns`].

pub mod admission;
pub mod intake;
pub mod netns;
pub mod pods;
