//! `tidegate connect`: nc over HBONE. Dials a workload's gateway with mTLS,
//! opens one CONNECT stream and pipes stdin/stdout through it.

use std::future::poll_fn;

use anyhow::{bail, Context as _};
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::ConnectArgs;
use crate::config::Config;
use crate::workloads::WorkloadStore;
use tidegate_protocol::identity::SpiffeId;
use tidegate_protocol::tls::{TlsContext, TlsMetrics};

pub async fn run(config: Config, args: ConnectArgs) -> anyhow::Result<()> {
    let store = WorkloadStore::new(&config.trust_domain, &config.node_name);
    crate::app::load_workloads(&config, &store)?;
    let snapshot = store.snapshot();
    // A Service VIP:port: one of its ready endpoints (any, if none is ready).
    let (to, endpoint_identity) = match snapshot.service_by_vip(args.to.ip(), args.to.port()) {
        Some(svc) => {
            let all = svc
                .endpoints
                .get(&args.to.port())
                .unwrap_or(crate::workloads::endpoint_list::EndpointList::EMPTY);
            let ready: Vec<_> = all.iter().filter(|e| e.conditions.ready).collect();
            let from: Vec<_> = if ready.is_empty() {
                all.iter().collect()
            } else {
                ready
            };
            let Some(e) = from.get(fastrand::usize(..from.len().max(1))) else {
                bail!(
                    "Service {} has no endpoint for port {}",
                    svc.key(),
                    args.to.port()
                );
            };
            let to = std::net::SocketAddr::new(e.ip_for(args.to.ip()), e.target_port);
            eprintln!(
                "tidegate connect: {} is Service {}; endpoint {} ({}, {} of {})",
                args.to,
                svc.key(),
                to,
                e.workload.spec.name,
                from.len(),
                all.len()
            );
            (to, Some(e.workload.identity.clone()))
        }
        None => (args.to, None),
    };
    let server_identity = match args.server_identity.clone().or(endpoint_identity) {
        Some(id) => id,
        None => snapshot
            .by_ip(to.ip())
            .map(|w| w.identity.clone())
            .with_context(|| {
                format!(
                    "{} is not a known workload or Service; pass --server-identity spiffe://... or add it to the workload file",
                    to.ip()
                )
            })?,
    };
    let args = ConnectArgs { to, ..args };
    let me = args
        .as_identity
        .unwrap_or_else(|| SpiffeId::new(&config.trust_domain, "default", "tidegate-connect"));
    let via = args
        .via
        .unwrap_or_else(|| std::net::SocketAddr::new(args.to.ip(), config.hbone.port));
    let source = crate::app::cert_source(&config)?;
    let tls = TlsContext::new(source, &config.trust_domain, TlsMetrics::default());
    let (send, conn) = tidegate_protocol::hbone::client::dial(
        &tls,
        &config.hbone.settings(),
        &me,
        &server_identity,
        via,
    )
    .await
    .with_context(|| format!("dialing {via} as {me}"))?;
    let driver = tokio::spawn(conn);
    let (tx, rx) = tidegate_protocol::hbone::client::connect_stream(
        send,
        args.to,
        config.hbone.connect_timeout,
    )
    .await
    .with_context(|| format!("CONNECT {}", args.to))?;

    let result = pipe_stdio(tx, rx, args.to).await;
    driver.abort();
    result
}

/// Pipes stdin into the stream and the stream into stdout until either ends.
async fn pipe_stdio(
    mut tx: h2::SendStream<bytes::Bytes>,
    mut rx: h2::RecvStream,
    to: std::net::SocketAddr,
) -> anyhow::Result<()> {
    let upload = async {
        let mut stdin = tokio::io::stdin();
        loop {
            let mut buf = BytesMut::with_capacity(16 * 1024);
            let n = stdin.read_buf(&mut buf).await?;
            if n == 0 {
                tx.send_data(bytes::Bytes::new(), true)?;
                return anyhow::Ok(());
            }
            let mut data = buf.freeze();
            while !data.is_empty() {
                tx.reserve_capacity(data.len());
                let Some(cap) = poll_fn(|cx| tx.poll_capacity(cx)).await else {
                    bail!("stream closed by the peer");
                };
                let n = cap?.min(data.len());
                tx.send_data(data.split_to(n), false)?;
            }
        }
    };
    let download = async {
        let mut stdout = tokio::io::stdout();
        while let Some(chunk) = rx.data().await {
            let chunk = chunk?;
            stdout.write_all(&chunk).await?;
            stdout.flush().await?;
            rx.flow_control().release_capacity(chunk.len())?;
        }
        anyhow::Ok(())
    };
    // The stream can end from either side. Our side ends when stdin does;
    // the gateway's when it resets the stream, closes the connection or the
    // destination closes. Then stop at once instead of waiting for stdin.
    tokio::pin!(upload, download);
    let result = tokio::select! {
        biased;
        up = &mut upload => match up {
            Ok(()) => download.await.context("receiving"),
            Err(e) => Err(e.context("sending")),
        },
        down = &mut download => match down {
            Ok(()) => Err(anyhow::anyhow!(
                "the peer closed the stream before stdin ended (CONNECT {})",
                to
            )),
            Err(e) => Err(e.context(format!("the stream to {} ended", to))),
        },
    };
    result
}
