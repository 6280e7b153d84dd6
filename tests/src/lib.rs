//! Test harness for tidegate's end-to-end tests and benchmarks: in-process
//! gateways on port 0, echo backends, a test-side capture that stands in for
//! iptables REDIRECT, metric readers and a bounded `eventually`.

pub mod ca;
pub mod ca_double;
pub mod cilium_double;
pub mod cni;
pub mod dns_double;
pub mod inpod;
pub mod kube_api;
pub mod lab;
pub mod measure;
pub mod netns;
pub mod oci_double;
pub mod procfs;
pub mod rerun;
pub mod synthetic_cluster;
pub mod xds_double;
pub mod zds_double;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tidegate::app::App;
use tidegate::config::Config;
use tidegate::proxy::outbound::Outbound;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// `127.<octet>.0.<host>`: each test uses its own octet so logs stay readable.
pub fn ip(octet: u8, host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, octet, 0, host))
}

/// Raises the open-file soft limit to the hard limit (1,000-stream tests need ~4,000 fds).
pub fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit only read/write the local `rlimit` passed by pointer.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// Sets the open-file soft limit to `soft` (at most the hard limit);
/// returns the previous soft limit. Process-wide: only for a test binary
/// that runs one test.
pub fn set_fd_soft_limit(soft: u64) -> u64 {
    // SAFETY: getrlimit/setrlimit only read/write the local `rlimit` passed by pointer.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        let before = r.rlim_cur;
        r.rlim_cur = soft.min(r.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &r), 0);
        before
    }
}

/// Descriptors this process has open.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// A bench program's count from the environment: `default` when `name` is
/// unset, else a number from 1 to `max`; anything else is refused with a
/// message naming the variable.
pub fn env_count(name: &str, default: usize, max: usize) -> Result<usize, String> {
    count_from(name, std::env::var_os(name), default, max)
}

/// [`env_count`] for a value already read (`None`: unset).
fn count_from(
    name: &str,
    value: Option<std::ffi::OsString>,
    default: usize,
    max: usize,
) -> Result<usize, String> {
    let Some(v) = value else {
        return Ok(default);
    };
    let text = v.to_string_lossy();
    match text.trim().parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ if max == usize::MAX => Err(format!("{name}={text:?} is not a count (1 or more)")),
        _ => Err(format!("{name}={text:?}: a count from 1 to {max}")),
    }
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TIDEGATE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// An echo server: echoes every byte and half-closes when the client does.
pub async fn echo_server(ip: IpAddr) -> SocketAddr {
    let l = TcpListener::bind(SocketAddr::new(ip, 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    serve_echo(l);
    addr
}

/// An echo backend on `addr` that counts the connections it accepted and
/// holds its first answer on each back by `delay` (a slow endpoint).
pub async fn counting_echo(
    addr: SocketAddr,
    delay: Duration,
) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let l = TcpListener::bind(addr).await.unwrap();
    let bound = l.local_addr().unwrap();
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut r, mut w) = tcp.into_split();
                let mut first = vec![0u8; 16 * 1024];
                let n = match r.read(&mut first).await {
                    Ok(n) if n > 0 => n,
                    _ => return,
                };
                tokio::time::sleep(delay).await;
                if w.write_all(&first[..n]).await.is_ok() {
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                }
                let _ = w.shutdown().await;
            });
        }
    });
    (bound, count)
}

/// Echoes on an already bound listener (e.g. inside a network namespace).
pub fn serve_echo(l: TcpListener) {
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (mut r, mut w) = tcp.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
}

/// Stands in for iptables REDIRECT: accepts application connections and hands
/// them to the gateway's outbound with a fixed original destination.
pub struct Capture {
    pub addr: SocketAddr,
}

impl Capture {
    pub async fn start(outbound: Arc<Outbound>, original_dst: SocketAddr) -> Capture {
        Self::start_at(
            outbound,
            original_dst,
            SocketAddr::from(([127, 0, 0, 1], 0)),
        )
        .await
    }

    /// Like [`Capture::start`], listening on `listen` (`[::1]:0` for
    /// clients with IPv6 addresses).
    pub async fn start_at(
        outbound: Arc<Outbound>,
        original_dst: SocketAddr,
        listen: SocketAddr,
    ) -> Capture {
        let l = TcpListener::bind(listen).await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, src)) = l.accept().await else {
                    return;
                };
                let ob = outbound.clone();
                tokio::spawn(async move { ob.proxy(tcp, src, original_dst).await });
            }
        });
        Capture { addr }
    }

    /// An application connection from `src_ip` (the source workload's IP).
    pub async fn connect(&self, src_ip: IpAddr) -> TcpStream {
        self.try_connect(src_ip).await.unwrap()
    }

    /// Like [`Capture::connect`], for connections the gateway may refuse
    /// (and reset) before the connect completes.
    pub async fn try_connect(&self, src_ip: IpAddr) -> std::io::Result<TcpStream> {
        let s = match self.addr {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        s.bind(SocketAddr::new(src_ip, 0))?;
        let tcp = s.connect(self.addr).await?;
        let _ = tcp.set_nodelay(true);
        Ok(tcp)
    }
}

/// Writes `data`, reads until `data.len()` bytes came back.
pub async fn round_trip(tcp: &mut TcpStream, data: &[u8]) -> std::io::Result<Vec<u8>> {
    tcp.write_all(data).await?;
    let mut back = vec![0; data.len()];
    tcp.read_exact(&mut back).await?;
    Ok(back)
}

/// The value of the sample `series` (name with labels, exactly as encoded).
/// Panics when the series is absent: a renamed metric or label must fail the
/// test, not read as 0.
pub fn metric(text: &str, series: &str) -> f64 {
    find_metric(text, series)
        .unwrap_or_else(|| panic!("no metric series `{series}` in the exposition:\n{text}"))
}

/// [`metric`], but 0 when the series is absent. Only for a *labelled*
/// series polled before its first increment: prometheus-client encodes a
/// label set only once it has been used, so absence is that series' zero.
/// Pair it with a positive expectation (an [`eventually`] that waits for a
/// value above 0) so that a rename still fails — by timing out.
pub fn metric_or_zero(text: &str, series: &str) -> f64 {
    assert!(
        series.contains('{'),
        "metric_or_zero is for labelled series; `{series}` is always encoded, use metric"
    );
    find_metric(text, series).unwrap_or(0.0)
}

/// The sum of every sample of `name` (all label sets); 0 when absent.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

fn find_metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}

/// Polls `poll` every few milliseconds until it yields a value, and returns
/// it; `None` once `within` has passed. The one poll loop of the tests (use
/// [`wait_for`] unless the caller has more to say on a timeout).
pub async fn poll_within<T, F, Fut>(within: Duration, mut poll: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = poll().await {
            return Some(v);
        }
        if tokio::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Polls `poll` every few milliseconds until it yields a value, and returns
/// it; panics after `within` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, within: Duration, poll: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    match poll_within(within, poll).await {
        Some(v) => v,
        None => panic!("timed out after {within:?} waiting for: {what}"),
    }
}

/// Polls `check` every few milliseconds until it holds; panics after `within`.
pub async fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    wait_for(what, within, || std::future::ready(check().then_some(()))).await
}

/// Replaces `path` atomically (writes a sibling, renames it over), as a
/// ConfigMap volume swaps its files: a watcher polling the file never reads
/// it truncated — an empty workload file is a valid, empty set, which would
/// read as every workload deleted.
pub fn write_atomically(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Identities used by [`TwoNodes`].
pub const TRUST_DOMAIN: &str = "cluster.local";

/// A two-node mesh in one process: `server` (node-b) hosts the `echo`
/// workload and its backend; `client` (node-a) hosts the `client` workload
/// whose application connections enter through [`TwoNodes::capture`].
pub struct TwoNodes {
    pub dir: tempfile::TempDir,
    pub octet: u8,
    pub server: App,
    pub client: App,
    /// The echo workload's backend (authority of CONNECTs).
    pub echo: SocketAddr,
    pub client_ip: IpAddr,
    pub capture: Capture,
}

pub struct Options {
    /// Extra YAML merged into both gateways' config (e.g. pool settings).
    pub client_yaml: String,
    pub server_yaml: String,
    /// Service account the *client* gateway believes the echo workload has
    /// (to test a server presenting the wrong identity).
    pub client_view_of_echo_sa: String,
    /// Replaces the shared development CA (YAML of the `certificates` key's value).
    pub certificates: Option<String>,
    /// Replaces both gateways' workload file (Services, more endpoints).
    pub workloads: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            client_yaml: String::new(),
            server_yaml: String::new(),
            client_view_of_echo_sa: "echo".into(),
            certificates: None,
            workloads: None,
        }
    }
}

pub fn workloads_yaml(octet: u8, echo_sa: &str) -> String {
    workloads_yaml_at(
        [ip(octet, 2), ip(octet, 3), ip(octet, 4), ip(octet, 5)],
        echo_sa,
    )
}

/// [`workloads_yaml`] with the addresses given: echo, client, other, locked.
pub fn workloads_yaml_at(ips: [IpAddr; 4], echo_sa: &str) -> String {
    // IPv6 quoted: a YAML plain scalar must not end in `:` before `]`.
    let [echo, client, other, locked] = ips.map(|ip| match ip {
        IpAddr::V4(_) => ip.to_string(),
        IpAddr::V6(_) => format!("'{ip}'"),
    });
    format!(
        r#"workloads:
- {{uid: echo-uid, name: echo, namespace: demo, service_account: {echo_sa}, ips: [{echo}], node: node-b}}
- {{uid: other-uid, name: other, namespace: demo, service_account: other, ips: [{other}], node: node-b}}
- {{uid: locked-uid, name: locked, namespace: demo, service_account: locked, ips: [{locked}], node: node-b, allow: ["spiffe://cluster.local/ns/demo/sa/nobody"]}}
- {{uid: client-uid, name: client, namespace: demo, service_account: client, ips: [{client}], node: node-a}}
"#,
    )
}

/// A gateway config on port 0 sharing the dev CA in `ca_dir`.
pub fn gateway_config(
    node: &str,
    ca_dir: &std::path::Path,
    workloads: &std::path::Path,
    hbone_port: u16,
    extra: &str,
) -> Config {
    let certs = format!("{{source: dev-ca, state_dir: {}}}", ca_dir.display());
    gateway_config_with(node, &certs, workloads, hbone_port, extra)
}

/// Like [`gateway_config`] with an explicit `certificates` value (flow-style YAML).
/// `extra` follows the `hbone:` section: lines indented by two spaces extend it.
pub fn gateway_config_with(
    node: &str,
    certificates: &str,
    workloads: &std::path::Path,
    hbone_port: u16,
    extra: &str,
) -> Config {
    let yaml = format!(
        r#"node_name: {node}
trust_domain: {TRUST_DOMAIN}
listeners:
  outbound: 127.0.0.1:0
  inbound: 0.0.0.0:0
  admin: 127.0.0.1:0
  metrics: 127.0.0.1:0
  readiness: 127.0.0.1:0
certificates: {certificates}
workloads:
  file: {workloads}
  reload_interval: 50ms
hbone:
  port: {hbone_port}
{extra}
"#,
        workloads = workloads.display(),
    );
    Config::from_yaml(&yaml).unwrap_or_else(|e| panic!("test config: {e}\n{yaml}"))
}

impl TwoNodes {
    pub async fn start(octet: u8) -> TwoNodes {
        Self::with(octet, Options::default()).await
    }

    pub async fn with(octet: u8, opts: Options) -> TwoNodes {
        let ips = [ip(octet, 2), ip(octet, 3), ip(octet, 4), ip(octet, 5)];
        let mut nodes = Self::with_ips(ips, opts).await;
        nodes.octet = octet;
        nodes
    }

    /// [`TwoNodes::with`] on the addresses given (echo, client, other,
    /// locked; IPv6 ones must be this namespace's own): an IPv6 echo
    /// address puts node B's HBONE listener on `[::]`, the capture on `[::1]`.
    pub async fn with_ips(ips: [IpAddr; 4], opts: Options) -> TwoNodes {
        init_tracing();
        raise_fd_limit();
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca");
        let server_wl = dir.path().join("server-workloads.yaml");
        let client_wl = dir.path().join("client-workloads.yaml");
        let (server_text, client_text) = match &opts.workloads {
            Some(text) => (text.clone(), text.clone()),
            None => (
                workloads_yaml_at(ips, "echo"),
                workloads_yaml_at(ips, &opts.client_view_of_echo_sa),
            ),
        };
        std::fs::write(&server_wl, server_text).unwrap();
        std::fs::write(&client_wl, client_text).unwrap();
        let [echo_ip, client_ip, ..] = ips;
        let echo = echo_server(echo_ip).await;
        let certs = opts
            .certificates
            .clone()
            .unwrap_or_else(|| format!("{{source: dev-ca, state_dir: {}}}", ca.display()));
        let mut server_cfg =
            gateway_config_with("node-b", &certs, &server_wl, 15008, &opts.server_yaml);
        if echo_ip.is_ipv6() {
            server_cfg.listeners.inbound = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0));
        }
        let server = tidegate::app::build(server_cfg).await.unwrap();
        let port = server.addrs.inbound.expect("node listeners").port();
        let client = tidegate::app::build(gateway_config_with(
            "node-a",
            &certs,
            &client_wl,
            port,
            &opts.client_yaml,
        ))
        .await
        .unwrap();
        let listen = match client_ip {
            IpAddr::V4(_) => SocketAddr::from(([127, 0, 0, 1], 0)),
            IpAddr::V6(_) => SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 0)),
        };
        let capture = Capture::start_at(client.outbound.clone(), echo, listen).await;
        TwoNodes {
            dir,
            octet: 0,
            server,
            client,
            echo,
            client_ip,
            capture,
        }
    }

    pub async fn app_conn(&self) -> TcpStream {
        self.capture.connect(self.client_ip).await
    }

    pub fn ca_dir(&self) -> PathBuf {
        self.dir.path().join("ca")
    }
}

/// A plain HTTP/1.1 GET (admin and readiness endpoints): status and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    http(addr, "GET", path, "", &[]).await
}

/// A plain HTTP/1.1 request with `headers` (each `name: value\r\n`) and
/// `body` (admin `PUT`s and `DELETE`s): status and body.
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &[u8],
) -> (u16, String) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {}\r\n{headers}\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(body).await.unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A reference policy or fixture built by `cargo xtask plugins`
/// (`target/plugins/<name>.wasm`), as an absolute path.
pub fn plugin(name: &str) -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/plugins")
        .join(format!("{name}.wasm"));
    assert!(
        p.exists(),
        "{} missing: run `cargo xtask plugins`",
        p.display()
    );
    p.canonicalize().unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read from the value, not the process environment: setting a
    /// variable while other test threads read theirs is a data race.
    #[test]
    fn env_counts_are_refused_outside_their_range() {
        let var = "TIDEGATE_E2E_ENV_COUNT_TEST";
        let count = |v: Option<&str>, max| count_from(var, v.map(Into::into), 3, max);
        assert_eq!(count(None, 50), Ok(3));
        for (v, ok) in [
            ("7", Some(7)),
            (" 50 ", Some(50)),
            ("0", None),
            ("51", None),
            ("x", None),
        ] {
            let got = count(Some(v), 50);
            match ok {
                Some(n) => assert_eq!(got, Ok(n), "{v:?}"),
                None => assert!(got.unwrap_err().contains(var), "{v:?}"),
            }
        }
        assert!(count(Some("0"), usize::MAX)
            .unwrap_err()
            .contains("1 or more"));
    }

    const TEXT: &str = "# TYPE x counter\nx_total 0\ny_total{reason=\"a\"} 2\n";

    #[test]
    fn metric_reads_present_series() {
        assert_eq!(metric(TEXT, "x_total"), 0.0);
        assert_eq!(metric(TEXT, r#"y_total{reason="a"}"#), 2.0);
        assert_eq!(metric_or_zero(TEXT, r#"y_total{reason="b"}"#), 0.0);
    }

    #[test]
    #[should_panic(expected = "no metric series `x_renamed_total`")]
    fn a_missing_series_fails() {
        metric(TEXT, "x_renamed_total");
    }

    #[test]
    #[should_panic(expected = "is always encoded")]
    fn metric_or_zero_refuses_unlabelled_series() {
        metric_or_zero(TEXT, "x_total");
    }

    #[tokio::test]
    async fn wait_for_returns_the_first_value_and_times_out_naming_what() {
        let mut n = 0;
        let got = wait_for("n to reach 3", Duration::from_secs(5), || {
            n += 1;
            std::future::ready((n >= 3).then_some(n))
        })
        .await;
        assert_eq!(got, 3);
        let e = tokio::spawn(wait_for("never", Duration::from_millis(20), || {
            std::future::ready(None::<()>)
        }))
        .await
        .unwrap_err();
        let msg = e.into_panic();
        let msg = msg.downcast_ref::<String>().unwrap();
        assert!(msg.contains("waiting for: never"), "{msg}");
    }
}
