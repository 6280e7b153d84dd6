//! The OCI Load Balancing double as a program, for the demo and manual runs.
//!
//! ```text
//! cargo run -p tidegate-e2e --bin oci-double -- \
//!     --listen 127.0.0.1:18443 --key-id <tenancy>/<user>/<fingerprint> \
//!     --public-key key.pub.pem --ca-out /tmp/oci-ca.pem \
//!     --load-balancer ocid1.loadbalancer.oc1..demo \
//!     --backend web=10.1.0.5:8080 [--backend web=10.1.0.6:8080 ...] \
//!     [--foreign-controller] [--fault-rate 0.1] [--delay-ms 200]
//! ```
//! Point the gateway at it with `oci.endpoint: https://127.0.0.1:18443` and
//! `oci.ca_file: /tmp/oci-ca.pem`. Every request is logged on stdout.

use std::collections::HashMap;
use std::time::Duration;

use tidegate_e2e::oci_double::{public_key_der, DoubleConfig, FaultRates, OciDouble};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut listen = "127.0.0.1:18443".to_owned();
    let (mut key_id, mut public_key, mut ca_out) = (None, None, None);
    let mut lb = "ocid1.loadbalancer.oc1..demo".to_owned();
    let mut backends = Vec::new();
    let mut cfg = DoubleConfig::default();
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| anyhow::anyhow!("{a} needs a value"))
        };
        match a.as_str() {
            "--listen" => listen = value()?,
            "--key-id" => key_id = Some(value()?),
            "--public-key" => public_key = Some(value()?),
            "--ca-out" => ca_out = Some(value()?),
            "--load-balancer" => lb = value()?,
            "--backend" => backends.push(value()?),
            "--foreign-controller" => cfg.foreign_controller = true,
            "--fault-rate" => {
                let r: f64 = value()?.parse()?;
                cfg.faults = FaultRates {
                    conflict: r / 3.0,
                    throttle: r / 3.0,
                    server_error: r / 3.0,
                };
            }
            "--delay-ms" => {
                let d = Duration::from_millis(value()?.parse()?);
                (cfg.accepted_delay, cfg.progress_delay) = (d / 2, d / 2);
            }
            other => anyhow::bail!("unknown argument {other:?} (see the module docs)"),
        }
    }
    let key_id = key_id.ok_or_else(|| anyhow::anyhow!("--key-id is required"))?;
    let pem =
        std::fs::read(public_key.ok_or_else(|| anyhow::anyhow!("--public-key is required"))?)?;
    cfg.keys = HashMap::from([(key_id, public_key_der(&pem).map_err(anyhow::Error::msg)?)]);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async move {
            let double = OciDouble::start_on(listen.parse()?, cfg).await;
            double.add_load_balancer(&lb);
            for b in &backends {
                let (set, addr) = b
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("--backend is set=ip:port"))?;
                let (ip, port) = addr
                    .rsplit_once(':')
                    .ok_or_else(|| anyhow::anyhow!("--backend is set=ip:port"))?;
                double
                    .add_backend(&lb, set, ip, port.parse()?)
                    .map_err(anyhow::Error::msg)?;
            }
            // The CA the gateway is pointed at: the --ca-out copy (the
            // temporary original goes away with the double).
            let ca = match ca_out {
                Some(out) => {
                    std::fs::copy(double.ca_file(), &out)?;
                    std::path::PathBuf::from(out)
                }
                None => double.ca_file(),
            };
            println!(
                "oci-double listening on {} (CA {})",
                double.endpoint(),
                ca.display()
            );
            let mut seen = 0;
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let calls = double.calls();
                for c in &calls[seen..] {
                    println!("{} {} {} → {}", c.method, c.operation, c.path, c.status);
                }
                seen = calls.len();
            }
        })
}
