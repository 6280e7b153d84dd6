//! The TCP congestion control of the data path's sockets (`tcp.*`).
//!
//! The connections between the gateway and its own node's workloads (the
//! captured app connections, the deliveries to a local app) never leave the
//! node: there is no bottleneck on their path for a congestion control to
//! probe, and on a host whose default is BBR without the `fq` qdisc the
//! kernel paces every such socket with a timer per burst, which costs CPU
//! for every byte and buys nothing. They use `tcp.app_congestion_control`
//! (`cubic` by default). The HBONE tunnels between nodes cross the real
//! network and keep the host's choice unless
//! `tcp.tunnel_congestion_control` names one. Connections to destinations
//! outside the mesh (passthrough) always keep the host's choice.
//!
//! A listener's setting is inherited by the connections it accepts (the
//! kernel copies it to each child), so accepted sockets cost no call; a
//! dialed socket gets it before it connects.

use std::io;
use std::sync::Arc;

use socket2::{Domain, Protocol, SockRef, Socket, Type};

use crate::config::TcpConfig;

/// One congestion control algorithm by name, or the host's default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Congestion(Option<Arc<str>>);

impl Congestion {
    /// The host's default (nothing is set on the socket).
    pub fn host_default() -> Self {
        Congestion(None)
    }

    /// `name`, or the host's default when it is empty.
    pub fn named(name: &str) -> Self {
        Congestion((!name.is_empty()).then(|| name.into()))
    }

    pub fn name(&self) -> Option<&str> {
        self.0.as_deref()
    }

    /// Sets it on `socket` (a listener, or a socket before it connects).
    pub fn apply<'s>(&self, socket: impl Into<SockRef<'s>>) -> io::Result<()> {
        match &self.0 {
            None => Ok(()),
            Some(name) => socket.into().set_tcp_congestion(name.as_bytes()),
        }
    }

    /// [`Congestion::apply`], a failure logged (the connection still works
    /// with the host's default; the name was checked at start).
    pub fn apply_or_log<'s>(&self, socket: impl Into<SockRef<'s>>) {
        if let Err(e) = self.apply(socket) {
            tracing::debug!(congestion = ?self.name(), error = %e, "congestion control not set");
        }
    }
}

/// The data path's congestion controls, checked against the host.
#[derive(Clone, Debug, Default)]
pub struct TcpTuning {
    /// Sockets to and from this node's workloads.
    pub app: Congestion,
    /// HBONE tunnel sockets, dialed and accepted.
    pub tunnel: Congestion,
}

#[derive(Debug, thiserror::Error)]
#[error("config key `{key}`: congestion control {name:?} cannot be used on this host ({source}); it offers: {available} (\"\" keeps the host's default)")]
pub struct CongestionError {
    pub key: &'static str,
    pub name: String,
    pub source: io::Error,
    pub available: String,
}

impl TcpTuning {
    /// Each configured name, tried on a socket of our own first: a name the
    /// kernel does not know is an error at start naming the key, not a
    /// silent default on every connection.
    pub fn from_config(cfg: &TcpConfig) -> Result<Self, CongestionError> {
        let check = |key: &'static str, name: &str| {
            let cc = Congestion::named(name);
            let probe = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP));
            decide(key, cc.clone(), probe.and_then(|s| cc.apply(&s)))
        };
        Ok(TcpTuning {
            app: check("tcp.app_congestion_control", &cfg.app_congestion_control)?,
            tunnel: check(
                "tcp.tunnel_congestion_control",
                &cfg.tunnel_congestion_control,
            )?,
        })
    }
}

/// What the probe's answer means for `cc` under `key`. A name the host
/// does not know is a mistake in the configuration: an error. A name the
/// gateway may not use (no `CAP_NET_ADMIN`, and not in
/// `net.ipv4.tcp_allowed_congestion_control`) is the environment's: a
/// warning, and the host's default, so that an unprivileged gateway (the
/// demo on a laptop) still starts.
fn decide(
    key: &'static str,
    cc: Congestion,
    probe: io::Result<()>,
) -> Result<Congestion, CongestionError> {
    match probe {
        Ok(()) => Ok(cc),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            tracing::warn!(key, congestion = ?cc.name(), error = %e,
                "congestion control not permitted (needs CAP_NET_ADMIN or net.ipv4.tcp_allowed_congestion_control); the host's default is kept");
            Ok(Congestion::host_default())
        }
        Err(source) => Err(CongestionError {
            key,
            name: cc.name().unwrap_or_default().to_owned(),
            source,
            available: available(),
        }),
    }
}

fn available() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|e| format!("(cannot read the host's list: {e})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn congestion_of(s: &impl std::os::fd::AsFd) -> String {
        String::from_utf8(SockRef::from(s).tcp_congestion().unwrap())
            .unwrap()
            .trim_end_matches('\0')
            .to_owned()
    }

    /// `reno` is built into every kernel and is nobody's default: a socket
    /// reports it only if it was set.
    #[test]
    fn a_listeners_setting_reaches_the_connections_it_accepts() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = congestion_of(&listener);
        assert_ne!(
            host, "reno",
            "the test needs a host default other than reno"
        );
        Congestion::named("reno").apply(&listener).unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert_eq!(congestion_of(&accepted), "reno");
        // The other end was not touched.
        assert_eq!(congestion_of(&client), host);
    }

    #[test]
    fn an_empty_name_keeps_the_host_default_and_an_unknown_one_names_its_key() {
        let cfg = TcpConfig {
            app_congestion_control: "reno".into(),
            tunnel_congestion_control: String::new(),
        };
        let t = TcpTuning::from_config(&cfg).unwrap();
        assert_eq!(t.app.name(), Some("reno"));
        assert_eq!(t.tunnel, Congestion::host_default());

        let cfg = TcpConfig {
            app_congestion_control: "cubic".into(),
            tunnel_congestion_control: "no-such-cc".into(),
        };
        let e = TcpTuning::from_config(&cfg).unwrap_err().to_string();
        assert!(e.contains("`tcp.tunnel_congestion_control`"), "{e}");
        assert!(e.contains("\"no-such-cc\""), "{e}");
        assert!(e.contains("reno"), "the host's list: {e}");
    }

    /// Not permitted (an unprivileged gateway, a name outside the allowed
    /// list): the host's default, not an error; any other refusal is one.
    #[test]
    fn a_name_not_permitted_keeps_the_host_default() {
        let key = "tcp.app_congestion_control";
        let denied = io::Error::from(io::ErrorKind::PermissionDenied);
        let cc = decide(key, Congestion::named("cubic"), Err(denied)).unwrap();
        assert_eq!(cc, Congestion::host_default());
        let unknown = io::Error::from(io::ErrorKind::NotFound);
        assert!(decide(key, Congestion::named("cubic"), Err(unknown)).is_err());
        let cc = decide(key, Congestion::named("cubic"), Ok(())).unwrap();
        assert_eq!(cc.name(), Some("cubic"));
    }
}
