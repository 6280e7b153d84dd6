//! The ZDS node agent double (istio-cni's side) as a program: drives any
//! ZDS client — tidegate with `capture.zds_socket`, or ztunnel — by hand.
//!
//! ```text
//! cargo run -p tidegate-e2e --bin zds-double -- --socket /tmp/ztunnel.sock \
//!     --pod <uid>:<name>:<namespace>:<service-account>:/var/run/netns/<ns> [--pod ...] \
//!     [--keep <uid> ...]
//! ```
//! It accepts one client, checks its hello (V1), sends the snapshot (one
//! `AddWorkload` per `--pod`, with the namespace as `SCM_RIGHTS`, one
//! `KeepWorkload` per `--keep`, then `SnapshotSent`), printing each ack;
//! then reads commands on stdin, one per line: `del <uid>`, `add <pod spec
//! as above>`, `keep <uid>` (after the snapshot a protocol error, which a
//! client NACKs — ztunnel then exits), `quit`. Keepalive probes run every
//! 5 s between requests, as istio-cni's do.
//!
//! Checked against ztunnel built from its public source (commit 62d82653):
//! hello, the snapshot's adds, HBONE traffic between the two pods, and
//! `DelWorkload` all ACKed (README, "Capture").

use std::io::BufRead;
use std::os::fd::OwnedFd;

use anyhow::{bail, Context};
use tidegate_e2e::zds_double::{PodSpec, ZdsDouble};

/// `uid:name:namespace:sa:/path/to/netns`.
fn pod(spec: &str) -> anyhow::Result<(PodSpec, OwnedFd)> {
    let parts: Vec<&str> = spec.splitn(5, ':').collect();
    let [uid, name, namespace, sa, netns] = parts[..] else {
        bail!("--pod {spec:?}: expected uid:name:namespace:service-account:/netns/path");
    };
    let fd = std::fs::File::open(netns).with_context(|| format!("open {netns}"))?;
    let pod = PodSpec {
        uid: uid.into(),
        name: name.into(),
        namespace: namespace.into(),
        service_account: sa.into(),
    };
    Ok((pod, fd.into()))
}

fn show(ack: &str) -> &str {
    if ack.is_empty() {
        "ACK"
    } else {
        ack
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut socket = None;
    let mut pods = Vec::new();
    let mut keeps = Vec::new();
    while let Some(a) = args.next() {
        if a == "--help" || a == "-h" {
            println!("zds-double --socket PATH [--pod uid:name:namespace:sa:/netns/path ...] [--keep uid ...]");
            return Ok(());
        }
        let value = args.next().with_context(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--socket" => socket = Some(std::path::PathBuf::from(value)),
            "--pod" => pods.push(pod(&value)?),
            "--keep" => keeps.push(value),
            other => bail!("unknown argument {other:?} (try --help)"),
        }
    }
    let socket = socket.context("--socket is required")?;
    let double = ZdsDouble::bind(&socket)?;
    println!("listening on {}", socket.display());
    let conn = double.accept().await?;
    println!("hello V1 from the client ({} bytes)", conn.hello.len());
    for (spec, fd) in pods {
        let uid = spec.uid.clone();
        println!("add {uid}: {}", show(&conn.add(spec, fd).await?));
    }
    for uid in keeps {
        println!("keep {uid}: {}", show(&conn.keep(&uid).await?));
    }
    println!("snapshot_sent: {}", show(&conn.snapshot_sent().await?));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    while let Some(line) = rx.recv().await {
        let (cmd, arg) = line.trim().split_once(' ').unwrap_or((line.trim(), ""));
        let ack = match cmd {
            "del" => conn.del(arg).await?,
            "keep" => conn.keep(arg).await?,
            "add" => {
                let (spec, fd) = pod(arg)?;
                conn.add(spec, fd).await?
            }
            "quit" => break,
            "" => continue,
            other => {
                println!("unknown command {other:?}: del <uid> | keep <uid> | add <pod> | quit");
                continue;
            }
        };
        println!("{line}: {} (probes so far: {})", show(&ack), conn.probes());
    }
    Ok(())
}
