//! `tidegate-ca` and `certificates.source: istio-ca` over real gRPC/TLS,
//! with the API double answering TokenReview, pods, the root Secret and
//! ConfigMap.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use tidegate_base::shutdown::ShutdownTrigger;
use tidegate_ca::client::{CaClient, CaClientConfig};
use tidegate_ca::messages::IstioCertificateRequest;
use tidegate_ca::server::{start as start_ca, RunningCa};
use tidegate_e2e::kube_api::{FakeApiServer, Kind, TokenInfo};
use tidegate_e2e::{eventually, http_get, init_tracing, ip, metric, round_trip};
use tidegate_protocol::identity::SpiffeId;

use super::{pod, WAIT};

use tidegate_e2e::ca::{ca_config, gateway_pod, until_known, NS};

fn id(ns: &str, sa: &str) -> SpiffeId {
    SpiffeId::new("cluster.local", ns, sa)
}

async fn ca(
    api: &FakeApiServer,
    listen: &str,
    max_validity: Duration,
) -> (RunningCa, ShutdownTrigger) {
    init_tracing();
    let (trigger, drain) = tidegate_base::shutdown::channel();
    let running = start_ca(ca_config(api, listen.parse().unwrap(), max_validity), drain)
        .await
        .unwrap();
    (running, trigger)
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn client(ca: &RunningCa, roots: &Path, token: &Path) -> CaClient {
    CaClient::new(CaClientConfig {
        address: format!("https://{}", ca.addr),
        roots: roots.into(),
        token: Some(token.into()),
        cluster_id: "Kubernetes".into(),
        server_name: None,
        timeout: Duration::from_secs(5),
    })
    .unwrap()
}

async fn ask(
    c: &CaClient,
    who: Option<&SpiffeId>,
) -> Result<Vec<String>, tidegate_ca::client::CaClientError> {
    let asked = who.cloned().unwrap_or_else(|| id("demo", "web"));
    let csr = tidegate_ca::csr::generate(&asked).unwrap().csr_pem;
    let req = match who {
        Some(w) => IstioCertificateRequest::impersonating(csr, 3600, &w.to_string()),
        None => IstioCertificateRequest {
            csr,
            validity_duration: 3600,
            metadata: None,
        },
    };
    c.create_certificate(req).await
}

fn leaf_identity(chain: &[String]) -> SpiffeId {
    use rustls::pki_types::pem::PemObject;
    let der = rustls::pki_types::CertificateDer::from_pem_slice(chain[0].as_bytes()).unwrap();
    tidegate_protocol::tls::identity_of(&der).unwrap()
}

fn code(r: Result<Vec<String>, tidegate_ca::client::CaClientError>) -> tonic::Code {
    match r {
        Err(tidegate_ca::client::CaClientError::Status { code, .. }) => code,
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

/// Issues a local pod's identity to the trusted node agent on its node and
/// refuses everything istiod refuses, with `Unauthenticated` (a malformed
/// CSR is `InvalidArgument`). The root is created once in the Secret,
/// published in the ConfigMap, and read back by a restarted CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tidegate_ca_issues_node_local_identities_and_refuses_the_rest() {
    let api = FakeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    gateway_pod(&api, "tidegate-a", "node-a", "tok-a");
    api.apply(Kind::Pod, pod("web", "web-uid", "node-a", ip(81, 2)));
    api.apply(Kind::Pod, pod("db", "db-uid", "node-b", ip(81, 3)));
    let mut failed = pod("gone", "gone-uid", "node-a", ip(81, 4));
    failed["status"]["phase"] = json!("Failed");
    api.apply(Kind::Pod, failed);
    // The web pod's own token (pod-bound), and tokens that must not pass.
    api.add_token(
        "tok-web",
        TokenInfo {
            username: "system:serviceaccount:demo:web".into(),
            audiences: vec!["istio-ca".into()],
            pod: Some(("web".into(), "web-uid".into())),
        },
    );
    api.add_token(
        "tok-other-audience",
        TokenInfo {
            username: format!("system:serviceaccount:{NS}:tidegate"),
            audiences: vec!["kubernetes".into()],
            pod: Some(("tidegate-a".into(), "tidegate-a-uid".into())),
        },
    );
    let (ca1, stop1) = ca(&api, "127.0.0.1:0", Duration::from_secs(24 * 3600)).await;
    let secret = api
        .named("secrets", NS, "tidegate-ca-root")
        .expect("root Secret created");
    assert!(secret["data"]["ca-key.pem"].is_string(), "{secret}");
    let published = api
        .named("configmaps", NS, "tidegate-ca-root")
        .expect("root ConfigMap");
    assert_eq!(published["data"]["root-cert.pem"], json!(ca1.root_pem));
    let roots = write(dir.path(), "root-cert.pem", &ca1.root_pem);
    let tok = |t: &str| write(dir.path(), t, &format!("{t}\n"));

    let agent = client(&ca1, &roots, &tok("tok-a"));
    let chain = ask(&agent, Some(&id("demo", "web"))).await.unwrap();
    assert_eq!(chain.len(), 2, "leaf then root");
    assert_eq!(leaf_identity(&chain), id("demo", "web"));
    assert_eq!(chain[1], ca1.root_pem, "the root last");
    // The node agent's own identity without impersonation.
    let own = ask(&agent, None).await.unwrap();
    assert_eq!(leaf_identity(&own), id(NS, "tidegate"));

    // A pod on another node; a pod only in phase Failed; a foreign trust domain.
    assert_eq!(
        code(ask(&agent, Some(&id("demo", "db"))).await),
        tonic::Code::Unauthenticated
    );
    assert_eq!(
        code(ask(&agent, Some(&id("demo", "gone"))).await),
        tonic::Code::Unauthenticated
    );
    let foreign = SpiffeId::new("evil.example", "demo", "web");
    assert_eq!(
        code(ask(&agent, Some(&foreign)).await),
        tonic::Code::Unauthenticated
    );
    // An untrusted caller impersonating; it still gets its own identity.
    let web = client(&ca1, &roots, &tok("tok-web"));
    assert_eq!(
        code(ask(&web, Some(&id("demo", "web"))).await),
        tonic::Code::Unauthenticated
    );
    assert_eq!(
        leaf_identity(&ask(&web, None).await.unwrap()),
        id("demo", "web")
    );
    // A token TokenReview rejects, and one for another audience.
    let bad = client(&ca1, &roots, &tok("tok-bad"));
    assert_eq!(code(ask(&bad, None).await), tonic::Code::Unauthenticated);
    let aud = client(&ca1, &roots, &tok("tok-other-audience"));
    assert_eq!(
        code(ask(&aud, Some(&id("demo", "web"))).await),
        tonic::Code::Unauthenticated
    );
    // A malformed CSR.
    let garbage = IstioCertificateRequest::impersonating(
        "not a csr".into(),
        60,
        &id("demo", "web").to_string(),
    );
    assert_eq!(
        code(agent.create_certificate(garbage).await),
        tonic::Code::InvalidArgument
    );
    assert!(api.token_reviews() >= 9, "every request was reviewed");

    // A restart reads the same root back.
    stop1.start(Duration::from_secs(1));
    let (ca2, stop2) = ca(&api, "127.0.0.1:0", Duration::from_secs(3600)).await;
    assert_eq!(ca2.root_pem, ca1.root_pem);
    stop2.start(Duration::from_secs(1));

    // Rotation: a new root in the Secret, the old one in trusted-roots.pem.
    // The CA signs with the new one and publishes both.
    let new_root = tidegate_ca::server::root::CaRoot::generate("cluster.local").unwrap();
    let b64 = |t: &str| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(t)
    };
    let mut rotated = secret.clone();
    rotated["data"] = json!({
        "ca-cert.pem": b64(&new_root.cert_pem),
        "ca-key.pem": b64(&new_root.issuer.key().serialize_pem()),
        "trusted-roots.pem": b64(&ca1.root_pem),
    });
    api.put_named("secrets", NS, "tidegate-ca-root", rotated.clone());
    let (ca3, stop3) = ca(&api, "127.0.0.1:0", Duration::from_secs(3600)).await;
    assert_eq!(ca3.root_pem, new_root.cert_pem, "signs with the new root");
    let bundle = api.named("configmaps", NS, "tidegate-ca-root").unwrap()["data"]["root-cert.pem"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        bundle.contains(&new_root.cert_pem) && bundle.contains(&ca1.root_pem),
        "both roots published: {bundle}"
    );
    let roots = write(dir.path(), "bundle.pem", &bundle);
    let chain = ask(
        &client(&ca3, &roots, &tok("tok-a")),
        Some(&id("demo", "web")),
    )
    .await
    .unwrap();
    assert_eq!(chain[1], new_root.cert_pem);
    stop3.start(Duration::from_secs(1));
    // A trusted-roots.pem that is not PEM is refused at start, naming the key.
    rotated["data"]["trusted-roots.pem"] = json!(b64("garbage"));
    api.put_named("secrets", NS, "tidegate-ca-root", rotated);
    let (_, drain) = tidegate_base::shutdown::channel();
    let err = start_ca(
        ca_config(
            &api,
            "127.0.0.1:0".parse().unwrap(),
            Duration::from_secs(60),
        ),
        drain,
    )
    .await
    .err()
    .expect("a bad trusted-roots.pem is refused")
    .to_string();
    assert!(err.contains("trusted-roots.pem"), "{err}");
}

fn istio_ca(ca: &RunningCa, roots: &Path, token: &Path) -> String {
    format!(
        "{{source: istio-ca, address: 'https://{}', roots: {}, token: {}, first_use_wait: 3s, timeout: 2s, reload_interval: 50ms}}",
        ca.addr,
        roots.display(),
        token.display()
    )
}

/// Two gateways whose certificates both come from `tidegate-ca` carry
/// traffic; certificates renew at half-life under an open tunnel, which
/// keeps working; with the CA down the current certificates keep serving,
/// a new identity fails fast with the reason, and recovers when the CA returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_with_certificates_from_tidegate_ca_carry_traffic_and_survive_renewal_and_a_ca_outage(
) {
    use tidegate_e2e::{echo_server, gateway_config_with, workloads_yaml, Capture};
    let octet = 82;
    let api = FakeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    gateway_pod(&api, "tidegate-a", "node-a", "tok-a");
    gateway_pod(&api, "tidegate-b", "node-b", "tok-b");
    for (name, node, host) in [
        ("echo", "node-b", 2),
        ("client", "node-a", 3),
        ("other", "node-b", 4),
        ("locked", "node-b", 5),
        ("late", "node-a", 6),
    ] {
        api.apply(
            Kind::Pod,
            pod(name, &format!("{name}-uid"), node, ip(octet, host)),
        );
    }
    // Certificates live 6 s: renewal every ~3 s.
    let (ca1, stop1) = ca(&api, "127.0.0.1:0", Duration::from_secs(6)).await;
    let roots = write(dir.path(), "root-cert.pem", &ca1.root_pem);
    let wl = write(dir.path(), "workloads.yaml", &workloads_yaml(octet, "echo"));
    let echo = echo_server(ip(octet, 2)).await;
    let server = tidegate::app::build(gateway_config_with(
        "node-b",
        &istio_ca(&ca1, &roots, &write(dir.path(), "tok-b", "tok-b")),
        &wl,
        15008,
        "",
    ))
    .await
    .unwrap();
    let client = tidegate::app::build(gateway_config_with(
        "node-a",
        &istio_ca(&ca1, &roots, &write(dir.path(), "tok-a", "tok-a")),
        &wl,
        server.addrs.inbound.expect("node listeners").port(),
        "",
    ))
    .await
    .unwrap();
    let capture = Capture::start(client.outbound.clone(), echo).await;
    let mut conn = capture.connect(ip(octet, 3)).await;
    assert_eq!(round_trip(&mut conn, b"ping").await.unwrap(), b"ping");
    assert_eq!(client.pool.tunnels().len(), 1);

    // The local identities only: node-b holds echo, other, locked; node-a the client.
    let held = |app: &tidegate::app::App| -> Vec<String> {
        let dump = app.tls.source().dump();
        dump["identities"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["identity"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(held(&client), [id("demo", "client").to_string()]);
    eventually("node-b holds its three identities", WAIT, || {
        held(&server).len() == 3
    })
    .await;
    let (_, dump) = http_get(client.addrs.admin, "/config_dump").await;
    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
    let row = &dump["certificate_source"]["identities"][0];
    assert_eq!(row["state"], json!("ready"), "{dump}");
    assert!(
        row["serial"].is_string() && row["not_after"].is_string(),
        "{row}"
    );
    // ztunnel's shape of the same (istioctl ztunnel-config certificates).
    let zt = &dump["certificates"][0];
    assert_eq!(zt["identity"], row["identity"], "{dump}");
    assert_eq!(zt["state"], "Available", "{zt}");
    assert!(!zt["certChain"].as_array().unwrap().is_empty(), "{zt}");
    assert!(!zt["rootCerts"].as_array().unwrap().is_empty(), "{zt}");
    assert!(
        !dump.to_string().contains("PRIVATE KEY"),
        "no key in config_dump"
    );

    // Renewal at half-life: new serials on both sides, the tunnel untouched.
    let echo_id = id("demo", "echo");
    let client_id = id("demo", "client");
    let serial = |app: &tidegate::app::App, who: &SpiffeId| {
        let d = app.tls.source().dump();
        d["identities"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["identity"] == json!(who.to_string()))
            .and_then(|r| r["serial"].as_str().map(str::to_owned))
    };
    let (s0, c0) = (serial(&server, &echo_id), serial(&client, &client_id));
    eventually("both certificates renewed", Duration::from_secs(15), || {
        serial(&server, &echo_id) != s0 && serial(&client, &client_id) != c0
    })
    .await;
    assert_eq!(
        round_trip(&mut conn, b"after renewal").await.unwrap(),
        b"after renewal"
    );
    assert_eq!(client.pool.tunnels().len(), 1, "the open tunnel was kept");
    let text = client.metrics_text();
    assert!(
        metric(&text, r#"tidegate_ca_fetches_total{result="ok"}"#) >= 2.0,
        "{text}"
    );
    let left = metric(
        &text,
        &format!(r#"tidegate_ca_certificate_expiry_seconds{{identity="{client_id}"}}"#),
    );
    assert!(left > 0.0 && left <= 6.0, "{left}");

    // The CA goes down: a new identity fails fast, with the reason.
    let addr = ca1.addr;
    stop1.start(Duration::from_millis(100));
    let _ = ca1.task.await;
    // A pod with a new identity arrives on node-a meanwhile.
    let late = id("demo", "late");
    let mut text = workloads_yaml(octet, "echo");
    text += &format!(
        "- {{uid: late-uid, name: late, namespace: demo, service_account: late, ips: [{}], node: node-a}}\n",
        ip(octet, 6)
    );
    tidegate_e2e::write_atomically(&wl, &text);
    until_known(&client, ip(octet, 6)).await;
    let err = client
        .tls
        .source()
        .fetch(&late)
        .await
        .expect_err("no CA, no certificate")
        .to_string();
    assert!(
        err.contains("demo/sa/late") && !err.contains("first_use_wait"),
        "failed on the transport, not the wait: {err}"
    );
    // Current certificates keep serving while they are valid: a fresh
    // handshake on a new tunnel.
    let valid = client.tls.source().certified_key(&client_id).is_ok();
    assert!(valid, "the current certificate stays in use");
    // The CA returns on the same address: the new identity recovers.
    let (_ca2, _stop2) = ca(&api, &addr.to_string(), Duration::from_secs(3600)).await;
    let key = client
        .tls
        .source()
        .fetch(&late)
        .await
        .expect("recovered after the CA returned");
    assert_eq!(
        tidegate_protocol::tls::identity_of(&key.cert[0]).unwrap(),
        late
    );
    let text = client.metrics_text();
    assert!(
        metric(&text, r#"tidegate_ca_fetches_total{result="unavailable"}"#) >= 1.0,
        "{text}"
    );
    drop(conn);
    client.shutdown().await;
    server.shutdown().await;
}
