//! HTTP/2 PING keepalive: a connection whose peer stops answering is dead.

use std::time::Duration;

use h2::{Ping, PingPong};

#[derive(Debug, thiserror::Error)]
pub enum KeepaliveError {
    #[error("peer did not answer PING within {0:?}")]
    Timeout(Duration),
    #[error("ping failed: {0}")]
    Failed(h2::Error),
}

/// Sends a PING every `interval` once the previous one was answered; resolves
/// only when the peer fails to answer within `timeout` (or the connection broke).
/// The connection must be polled concurrently for PONGs to arrive.
pub async fn run(mut pp: PingPong, interval: Duration, timeout: Duration) -> KeepaliveError {
    loop {
        tokio::time::sleep(interval).await;
        match tokio::time::timeout(timeout, pp.ping(Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            Ok(Err(e)) => return KeepaliveError::Failed(e),
            Err(_) => return KeepaliveError::Timeout(timeout),
        }
    }
}
