//! The demo echo backend of the embedded default: echoes every byte back and
//! half-closes when the client does.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use tidegate_base::shutdown::ShutdownWatch;

/// Binds an echo backend's listener; `key` (`demo.echo`, …) names it in the
/// error, with the port's holder when the port is in use.
pub async fn bind_echo(key: &str, addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                crate::proxy::listener::in_use_hint(addr, &format!("`{key}`"))
            }
            _ => String::new(),
        };
        anyhow::anyhow!("cannot listen on {addr} for {key}: {e}{hint}")
    })
}

pub async fn run_echo(listener: TcpListener, mut drain: ShutdownWatch) {
    loop {
        let (mut tcp, _) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(_) => continue,
            },
            _ = drain.signaled() => return,
        };
        tokio::spawn(async move {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match tcp.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tcp.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = tcp.shutdown().await;
        });
    }
}
