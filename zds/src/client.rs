//! The reconnecting ZDS client: connects to istio-cni's node agent socket,
//! serves one [`Session`] per connection and reconnects with backoff when it
//! ends.
//!
//! The backoff is ztunnel's: 10 ms, doubled after each connection that
//! failed or ended before the agent's snapshot, at most 15 s; back to 10 ms
//! after a connection that delivered its snapshot. An agent that accepts and
//! closes at once is retried less and less often, never every 10 ms.

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
use tidegate_base::shutdown::ShutdownWatch;

/// istio-cni's default socket (its `ztunnel-uds-address`; ztunnel's `INPOD_UDS`).
pub const DEFAULT_SOCKET: &str = "/var/run/ztunnel/ztunnel.sock";

/// Where to connect and how to back off.
#[derive(Clone, Debug)]
pub struct ZdsConfig {
    pub socket: PathBuf,
    /// Wait before the first retry; doubled after each connection that
    /// failed or ended before a snapshot, back to this after one that
    /// delivered its snapshot.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for ZdsConfig {
    fn default() -> Self {
        ZdsConfig {
            socket: PathBuf::from(DEFAULT_SOCKET),
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_secs(15),
        }
    }
}

/// The waits between connection attempts: `initial`, doubling to `max`.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max,
            next: initial.min(max),
        }
    }

    /// The wait before the next attempt; the one after is twice as long.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// A connection worked: the next wait is the initial one again.
    pub fn reset(&mut self) {
        self.next = self.initial.min(self.max);
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
        let mut backoff = Backoff::new(self.config.initial_backoff, self.config.max_backoff);
        for attempt in 0u64.. {
            if attempt > 0 {
                self.shared.metrics.reconnects.inc();
            }
            let span = tracing::info_span!("zds", socket = %self.config.socket.display(), attempt);
            let (result, snapshot) = self.connect_and_serve(&mut shutdown).instrument(span).await;
            if snapshot {
                backoff.reset();
            }
            let delay = backoff.next_delay();
            self.shared.metrics.reconnect_delay.set(delay.as_secs_f64());
            match result {
                Ok(End::Shutdown) => return,
                Ok(End::Closed) if snapshot => {
                    tracing::info!(retry_in = ?delay, "the node agent closed the ZDS connection; reconnecting");
                }
                Ok(End::Closed) => {
                    tracing::warn!(retry_in = ?delay, "the node agent closed the ZDS connection before its snapshot");
                }
                Err(e) => tracing::warn!(error = %e, retry_in = ?delay, "ZDS connection failed"),
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.signaled() => return,
            }
        }
    }

    /// One connection: how it ended, and whether it delivered a snapshot.
    async fn connect_and_serve(
        &mut self,
        shutdown: &mut ShutdownWatch,
    ) -> (Result<End, ZdsError>, bool) {
        let sock = match SeqPacket::connect(&self.config.socket) {
            Ok(sock) => sock,
            Err(source) => {
                let path = self.config.socket.clone();
                return (Err(ZdsError::Connect { path, source }), false);
            }
        };
        tracing::info!("connected to the node agent");
        self.shared.metrics.connected.set(1);
        let mut session = Session::new(sock, &mut self.shared);
        let end = session.run(shutdown).await;
        let snapshot = session.got_snapshot();
        self.shared.metrics.connected.set(0);
        (end, snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_to_its_maximum_and_resets() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(10), ms(15_000));
        let waits: Vec<u64> = (0..13).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(
            waits,
            [10, 20, 40, 80, 160, 320, 640, 1280, 2560, 5120, 10240, 15000, 15000]
        );
        b.reset();
        assert_eq!(b.next_delay(), ms(10));
        assert_eq!(b.next_delay(), ms(20));
        // The defaults are ztunnel's.
        let d = ZdsConfig::default();
        assert_eq!((d.initial_backoff, d.max_backoff), (ms(10), ms(15_000)));
    }
}
