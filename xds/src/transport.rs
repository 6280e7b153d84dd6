//! Where the xDS stream connects: istiod's TLS channel (`https://`, the
//! channel of `tidegate-channel`), or a plaintext gRPC server on a Unix
//! socket — Cilium's agent (`unix:///var/run/cilium/xds.sock`; the form
//! ztunnel's Cilium fork reads from `XDS_ADDRESS`). Plaintext over TCP is
//! refused: only a socket the node's file permissions guard is trusted
//! without TLS.
//!
//! Cilium's server sends GOAWAY to a client that pings more often than
//! every 15 s, so the Unix channel's keepalive interval is at least
//! [`MIN_UNIX_KEEPALIVE`] whatever the pulse asks.

use std::path::PathBuf;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tidegate_channel::{self as channel, AddressError, Target};
use tonic::transport::{Channel, Endpoint, Uri};

/// The shortest keepalive interval on a Unix-socket channel: Cilium's
/// server enforces a minimum of 15 s between a client's pings.
pub const MIN_UNIX_KEEPALIVE: Duration = Duration::from_secs(15);

/// The accepted forms of a Unix-socket address, for errors.
pub const UNIX_FORMS: &str = "unix:///path, unix:/path or unix://localhost/path";

/// The socket path of a `unix:` address: `None` when `address` is not one,
/// `Some(Err)` when it is one without an absolute path or with a host
/// other than `localhost`.
pub fn unix_path(address: &str) -> Option<Result<PathBuf, String>> {
    let rest = address.strip_prefix("unix:")?;
    let path = match rest.strip_prefix("//") {
        Some(authority_and_path) if authority_and_path.starts_with('/') => authority_and_path,
        Some(authority_and_path) => match authority_and_path.strip_prefix("localhost") {
            Some(path) => path,
            None => {
                return Some(Err(format!(
                    "a unix:// address names no host but localhost ({UNIX_FORMS})"
                )))
            }
        },
        None => rest,
    };
    if !path.starts_with('/') || path.len() < 2 {
        return Some(Err(format!(
            "a unix: address names an absolute socket path ({UNIX_FORMS})"
        )));
    }
    Some(Ok(PathBuf::from(path)))
}

/// The keepalive interval of a Unix-socket channel: the pulse's, but
/// never under [`MIN_UNIX_KEEPALIVE`].
pub fn unix_keepalive(pulse: &channel::Pulse) -> Duration {
    pulse.keepalive_interval.max(MIN_UNIX_KEEPALIVE)
}

/// A lazily connected channel to `target`: TLS for `https://`, plaintext
/// for a Unix socket, refused otherwise.
pub fn connect_lazy(target: &Target) -> Result<Channel, AddressError> {
    let path = match unix_path(&target.address) {
        None => return channel::connect_lazy(target),
        Some(Err(message)) => {
            return Err(AddressError {
                address: target.address.clone(),
                message,
            })
        }
        Some(Ok(path)) => path,
    };
    let pulse = target.pulse;
    // The URI only names the `:authority` the requests carry.
    let endpoint = Endpoint::from_static("http://localhost")
        .http2_keep_alive_interval(unix_keepalive(&pulse))
        .keep_alive_timeout(pulse.keepalive_timeout)
        .keep_alive_while_idle(true);
    let timeout = target.connect_timeout;
    let connector = tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move {
            let stream = tokio::time::timeout(timeout, tokio::net::UnixStream::connect(&path))
                .await
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            Ok::<_, std::io::Error>(TokioIo::new(stream))
        }
    });
    Ok(endpoint.connect_with_connector_lazy(connector))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_unix_forms_name_the_same_path_and_others_are_refused() {
        for form in [
            "unix:///var/run/cilium/xds.sock",
            "unix:/var/run/cilium/xds.sock",
            "unix://localhost/var/run/cilium/xds.sock",
        ] {
            assert_eq!(
                unix_path(form),
                Some(Ok(PathBuf::from("/var/run/cilium/xds.sock"))),
                "{form}"
            );
        }
        assert_eq!(unix_path("https://127.0.0.1:15012"), None);
        assert_eq!(unix_path("http://127.0.0.1:15010"), None);
        for bad in [
            "unix:relative.sock",
            "unix://cilium/xds.sock",
            "unix://",
            "unix:/",
        ] {
            assert!(matches!(unix_path(bad), Some(Err(_))), "{bad}");
        }
    }

    #[tokio::test]
    async fn plaintext_over_tcp_stays_refused() {
        let target = Target {
            address: "http://127.0.0.1:15010".into(),
            roots: "/nonexistent".into(),
            server_name: None,
            connect_timeout: Duration::from_secs(1),
            pulse: channel::Pulse::default(),
        };
        let e = connect_lazy(&target).unwrap_err();
        assert!(e.message.contains("https"), "{e}");
        let unix = Target {
            address: "unix://cilium/xds.sock".into(),
            ..target
        };
        let e = connect_lazy(&unix).unwrap_err();
        assert!(e.message.contains("localhost"), "{e}");
    }
}
