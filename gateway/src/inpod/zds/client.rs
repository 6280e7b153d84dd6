//! The reconnecting ZDS client: connects to istio-cni's node agent socket,
//! serves one [`Session`] per connection and reconnects with backoff when it
//! ends.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tracing::Instrument;

use super::error::ZdsError;
use super::metrics::ZdsMetrics;
use super::session::{End, Session, Shared};
use super::sink::PodSink;
use super::socket::SeqPacket;
use crate::shutdown::ShutdownWatch;

/// istio-cni's default socket (its `ztunnel-uds-address`; ztunnel's `INPOD_UDS`).
pub const DEFAULT_SOCKET: &str = "/var/run/ztunnel/ztunnel.sock";

/// Where to connect and how to back off.
#[derive(Clone, Debug)]
pub struct ZdsConfig {
    pub socket: PathBuf,
    /// Wait before the first retry; doubled after each failed connect, back
    /// to this after a connection that was established.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for ZdsConfig {
    fn default() -> Self {
        ZdsConfig {
            socket: PathBuf::from(DEFAULT_SOCKET),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(15),
        }
    }
}

/// The client. Build it with [`ZdsClient::new`], keep [`ZdsClient::ready`],
/// then spawn [`ZdsClient::run`].
pub struct ZdsClient<S> {
    config: ZdsConfig,
    shared: Shared<S>,
}

impl<S: PodSink> ZdsClient<S> {
    /// Registers the `zds_*` metrics in `registry`.
    pub fn new(config: ZdsConfig, sink: Arc<S>, registry: &mut Registry) -> Self {
        ZdsClient {
            config,
            shared: Shared {
                sink,
                known: Default::default(),
                metrics: ZdsMetrics::register(registry),
                ready: watch::channel(false).0,
            },
        }
    }

    /// Becomes `true` once the first snapshot was received and the sink
    /// accepted it, and stays `true` across reconnects (the pods served
    /// keep being served while the client reconnects).
    pub fn ready(&self) -> watch::Receiver<bool> {
        self.shared.ready.subscribe()
    }

    /// Connects, serves and reconnects until `shutdown` fires.
    ///
    /// On shutdown the connection is closed between two requests (a sink
    /// call in progress finishes and is acked first); istio-cni then sees
    /// the connection end. The pods already handed to the sink stay there:
    /// draining them is the gateway's shutdown's job, not this client's.
    pub async fn run(mut self, mut shutdown: ShutdownWatch) {
        let mut backoff = self.config.initial_backoff;
        for attempt in 0u64.. {
            if attempt > 0 {
                self.shared.metrics.reconnects.inc();
            }
            let span = tracing::info_span!("zds", socket = %self.config.socket.display(), attempt);
            let result = self.connect_and_serve(&mut shutdown).instrument(span).await;
            match result {
                Ok(End::Shutdown) => return,
                Ok(End::Closed) => {
                    tracing::info!("the node agent closed the ZDS connection; reconnecting");
                    backoff = self.config.initial_backoff;
                }
                Err(e @ ZdsError::Connect { .. }) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "ZDS connect failed");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "ZDS connection ended");
                    backoff = self.config.initial_backoff;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = shutdown.signaled() => return,
            }
            backoff = (backoff * 2).min(self.config.max_backoff);
        }
    }

    async fn connect_and_serve(&mut self, shutdown: &mut ShutdownWatch) -> Result<End, ZdsError> {
        let sock = SeqPacket::connect(&self.config.socket).map_err(|source| ZdsError::Connect {
            path: self.config.socket.clone(),
            source,
        })?;
        tracing::info!("connected to the node agent");
        self.shared.metrics.connected.set(1);
        let end = Session::new(sock, &mut self.shared).run(shutdown).await;
        self.shared.metrics.connected.set(0);
        end
    }
}
