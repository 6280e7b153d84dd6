//! ADD and DEL in in-pod mode (`capture: inpod`): enrolling a pod in the
//! mesh on this node.
//!
//! Only mesh members are captured. The gateway decides, by the one rule of
//! `tidegate::workloads::membership` applied to what its discovery knows
//! of the pod and its namespace (labels the plugin does not have); the
//! plugin itself only lets pods of the namespaces the rule never meshes
//! (`kube-system`, [`tidegate_netns::never_meshed`]) through without
//! asking, so the cluster's system pods start whether the gateway is up or
//! not.
//!
//! ADD, in this order (so no captured packet ever finds nobody listening):
//! 1. record the pod in the state directory (a gateway restarted during the
//!    ADD re-adopts it);
//! 2. hand its network namespace to the gateway (the descriptor over the
//!    CNI socket) and wait for its answer: "added" once its listeners are
//!    up inside the pod, or "not-member" — then the record goes and the
//!    pod starts uncaptured, with no rule of ours;
//! 3. a member: install istio-cni's capture rules inside the pod, and the
//!    node-side probe exemption.
//!
//! When the gateway cannot answer (down, slow, refusing, or the pod still
//! unknown to its discovery) ADD fails with code 11 ("try again later")
//! and the record is removed: the kubelet retries the sandbox. Fail closed:
//! the plugin cannot tell a member from a non-member without the gateway,
//! and a member must never start outside the mesh. A node's plugin is
//! therefore chained only while its gateway runs (deploy/: installed by
//! the gateway's own DaemonSet, and unchained by it before the gateway is
//! removed).
//!
//! The whole ADD is bounded by `timeout_ms` ([`add_within`]): past it, ADD
//! fails with code 11 naming the step it was at. `CNI_NETNS` is opened
//! without blocking, so a FIFO or a device there fails the namespace check
//! at once (code 4, naming what the file is) instead of hanging the open.
//!
//! DEL (after the gateway's teardown drain): the pod's own rules (both
//! families, when its namespace is still there), the node-side probe rules
//! and the record go.
//!
//! The pod's rules cover IPv4 and IPv6 together or not at all
//! ([`tidegate_netns::capture`]): a node whose kernel has IPv6 but cannot
//! install IPv6 rules (no `ip6tables-restore`, no ip6_tables support)
//! fails the ADD (code 5, naming why) with no IPv4 rule left behind; a pod
//! namespace without IPv6 gets the IPv4 rules and a line on stderr saying
//! why.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{mpsc, Arc};

use serde_json::{json, Value};
use tidegate_netns::capture::{self, CapturePorts};
use tidegate_netns::never_meshed::never_meshed_namespace;
use tidegate_netns::pod_records::PodRecord;

use crate::conf::{err, CniError, Enroll, OurKeys};
use crate::{ask_within, cni_arg};

/// The steps of an ADD, for the message when `timeout_ms` passes.
const STEPS: [&str; 5] = [
    "opening the pod's network namespace",
    "recording the pod in the state directory",
    "handing the pod to the gateway",
    "installing the capture rules inside the pod",
    "installing the node's probe exemption",
];

/// The step from which the gateway may be serving the pod: handing it
/// over (its answer may be late) and every step after.
const HANDING_OVER: u8 = 2;
/// The step after the gateway took the pod.
const HANDED_OVER: u8 = 3;

/// Whether a failed ADD keeps the pod's record. The record must name every
/// pod the gateway may be serving — a restarted gateway re-adopts what is
/// recorded and forgets the rest — so it goes only when the gateway cannot
/// have the pod: never for a pod an earlier ADD enrolled; otherwise only
/// before the hand-over, or when the gateway's answer refused it
/// (`answered`; a timeout while handing over leaves that open). A record
/// kept for a pod whose ADD failed goes with the DEL the runtime sends
/// after a failed ADD, or at re-adoption once its namespace is gone.
fn keeps_record(step: u8, enrolled: bool, answered: bool) -> bool {
    enrolled || step >= HANDED_OVER || (step == HANDING_OVER && !answered)
}

/// Whether pod `uid` has a record already (an earlier ADD enrolled it).
fn enrolled(dir: &Path, uid: &str) -> bool {
    matches!(PodRecord::read(dir, uid), Ok(Some(_)))
}

/// [`add`] on a thread of its own, bounded by `timeout_ms`: past it, ADD
/// fails (code 11, naming the step) and the pod's record is removed unless
/// the gateway may serve it ([`keeps_record`]); the thread is abandoned
/// (the process exits right after).
pub fn add_within(e: Enroll) -> Result<(), CniError> {
    let timeout = e.ours.timeout;
    let state_dir = e.ours.state_dir.clone();
    let uid = cni_arg("K8S_POD_UID");
    let was_enrolled = uid
        .as_deref()
        .is_some_and(|u| enrolled(Path::new(&state_dir), u));
    let step = Arc::new(AtomicU8::new(0));
    let (tx, rx) = mpsc::channel();
    let at = step.clone();
    std::thread::spawn(move || {
        let _ = tx.send(add(&e, &at));
    });
    match rx.recv_timeout(timeout) {
        Ok(r) => r,
        Err(_) => {
            let reached = step.load(Ordering::Relaxed);
            if let Some(uid) = uid {
                if !keeps_record(reached, was_enrolled, false) {
                    let _ = PodRecord::remove(Path::new(&state_dir), &uid);
                }
            }
            let at = STEPS[usize::from(reached).min(STEPS.len() - 1)];
            Err(err(
                11,
                "ADD did not complete within timeout_ms; the pod is not started outside the mesh (the kubelet retries)",
                format!("still {at} after {} ms (timeout_ms)", timeout.as_millis()),
            ))
        }
    }
}

fn add(e: &Enroll, step: &AtomicU8) -> Result<(), CniError> {
    let ours = &e.ours;
    let uid = cni_arg("K8S_POD_UID").ok_or_else(|| {
        err(
            4,
            "invalid environment variables",
            "K8S_POD_UID is missing from CNI_ARGS: tidegate-cni enrolls Kubernetes pods only",
        )
    })?;
    let namespace = cni_arg("K8S_POD_NAMESPACE").unwrap_or_default();
    if never_meshed_namespace(&namespace) {
        eprintln!("tidegate-cni: pod {uid} of namespace {namespace:?}, never meshed: not captured");
        return Ok(());
    }
    let name = cni_arg("K8S_POD_NAME").unwrap_or_default();
    let netns = std::env::var("CNI_NETNS")
        .ok()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| err(4, "invalid environment variables", "CNI_NETNS is not set"))?;
    let fd = open_netns(&netns)?;
    step.store(1, Ordering::Relaxed);
    let dir = Path::new(&ours.state_dir);
    // An already enrolled pod (a repeated ADD) keeps its record whatever
    // this ADD comes to: the gateway serves it either way.
    let was_enrolled = enrolled(dir, &uid);
    let record = PodRecord {
        uid: uid.clone(),
        name: name.clone(),
        namespace: namespace.clone(),
        netns: netns.clone(),
        ips: e.pod_ips.clone(),
    };
    record.write(dir).map_err(|e| {
        err(
            5,
            "cannot record the pod in the state directory",
            format!("state_dir {}: {e}", dir.display()),
        )
    })?;
    let undo = |e: CniError| {
        if !keeps_record(step.load(Ordering::Relaxed), was_enrolled, true) {
            let _ = PodRecord::remove(dir, &uid);
        }
        e
    };
    let request = json!({
        "command": "add",
        "uid": uid,
        "name": name,
        "namespace": namespace,
        "netns": netns,
        "container_id": std::env::var("CNI_CONTAINERID").unwrap_or_default(),
    });
    step.store(HANDING_OVER, Ordering::Relaxed);
    if let Answer::NotMember(reason) = hand_over(ours, &request, fd).map_err(undo)? {
        if !was_enrolled {
            let _ = PodRecord::remove(dir, &uid);
        }
        eprintln!(
            "tidegate-cni: pod {uid} ({namespace}/{name}) is not a mesh member ({reason}): not captured"
        );
        return Ok(());
    }
    step.store(HANDED_OVER, Ordering::Relaxed);
    let installed = capture::install(Path::new(&netns), CapturePorts::default()).map_err(|e| {
        undo(err(
            5,
            "cannot install the capture rules inside the pod",
            e.to_string(),
        ))
    })?;
    if let Some(why) = &installed.ipv6_skipped {
        eprintln!("tidegate-cni: pod {uid} ({namespace}/{name}): IPv4 rules only: {why}");
    }
    step.store(4, Ordering::Relaxed);
    capture::probe_snat(true, &e.pod_ips).map_err(|e| {
        undo(err(
            5,
            "cannot install the node's probe exemption for the pod",
            e.to_string(),
        ))
    })?;
    eprintln!("tidegate-cni: pod {uid} ({namespace}/{name}) enrolled in the mesh");
    Ok(())
}

/// The namespace at `path`, checked to be one: a pod whose sandbox is
/// already gone fails here, clearly, and so does a path that is no
/// namespace (opened without blocking: a FIFO never hangs the ADD).
fn open_netns(path: &str) -> Result<OwnedFd, CniError> {
    use tidegate_netns::namespace::{NetnsError, PodNetns};
    match PodNetns::open(Path::new(path)) {
        Ok(ns) => Ok(ns.into_fd()),
        Err(e @ NetnsError::NotANamespace(_)) => Err(err(
            4,
            "invalid environment variables",
            format!("CNI_NETNS {path}: {e}"),
        )),
        Err(e) => Err(err(
            3,
            "the pod's network namespace is gone (the sandbox was removed during ADD)",
            format!("CNI_NETNS {path}: {e}"),
        )),
    }
}

/// The gateway's answer to a handover.
enum Answer {
    /// A member: its listeners are up; capture it.
    Served,
    /// Not a member (why): leave it uncaptured.
    NotMember(String),
}

/// The handover: the gateway answers once the pod's listeners are up, or
/// that the pod is not a mesh member.
fn hand_over(ours: &OurKeys, request: &Value, fd: OwnedFd) -> Result<Answer, CniError> {
    let refused = |detail: String| {
        err(
            11,
            "the node's tidegate did not take the pod; it is not started outside the mesh (the kubelet retries)",
            detail,
        )
    };
    let ack = ask_within(&ours.socket, request, ours.timeout, Some(fd))
        .map_err(|e| refused(format!("{e} (socket {})", ours.socket)))?;
    let v: Value = serde_json::from_str(&ack).unwrap_or_default();
    match v.get("result").and_then(Value::as_str) {
        Some("added" | "unchanged" | "replaced") => Ok(Answer::Served),
        Some("not-member") => Ok(Answer::NotMember(
            v.get("reason")
                .and_then(Value::as_str)
                .unwrap_or("no reason given")
                .to_owned(),
        )),
        _ => Err(refused(format!(
            "the gateway answered: {}",
            v.get("error").and_then(Value::as_str).unwrap_or(&ack)
        ))),
    }
}

/// DEL: the pod's capture rules (both families, while its namespace is
/// still there), the node-side probe rules and the record go; never fails
/// (the outcome is on stderr).
pub fn forget(ours: &OurKeys) {
    let Some(uid) = cni_arg("K8S_POD_UID") else {
        return;
    };
    let dir = Path::new(&ours.state_dir);
    match PodRecord::read(dir, &uid) {
        Ok(Some(record)) => {
            // Only a pod this plugin enrolled (recorded) has rules of ours.
            // Its namespace may be gone already (its rules with it), or not
            // a namespace at all: nothing to remove then.
            let netns = std::env::var("CNI_NETNS")
                .ok()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| record.netns.clone());
            if open_netns(&netns).is_ok() {
                if let Err(e) = capture::remove(Path::new(&netns)) {
                    eprintln!("tidegate-cni: pod {uid}: capture rules not removed: {e}");
                }
            }
            if let Err(e) = capture::probe_snat(false, &record.ips) {
                eprintln!("tidegate-cni: pod {uid}: probe rules not removed: {e}");
            }
        }
        Ok(None) => {}
        Err(e) => eprintln!("tidegate-cni: pod {uid}: record unreadable: {e}"),
    }
    if let Err(e) = PodRecord::remove(dir, &uid) {
        eprintln!("tidegate-cni: pod {uid}: record not removed: {e}");
    }
}

#[cfg(test)]
mod record_tests {
    use super::*;

    #[test]
    fn a_failed_add_keeps_the_record_of_every_pod_the_gateway_may_serve() {
        // A new pod: removed before the hand-over and when the gateway
        // refused it; kept once handed over, and when the answer never came.
        assert!(!keeps_record(1, false, true));
        assert!(!keeps_record(1, false, false));
        assert!(!keeps_record(HANDING_OVER, false, true));
        assert!(keeps_record(HANDING_OVER, false, false));
        assert!(keeps_record(HANDED_OVER, false, true));
        assert!(keeps_record(4, false, true));
        // An enrolled pod's repeated ADD never removes it.
        for step in 0..=4 {
            for answered in [false, true] {
                assert!(keeps_record(step, true, answered), "{step} {answered}");
            }
        }
    }
}
