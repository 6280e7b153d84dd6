//! `certificates.source: istio-ca` against a CA double whose answers the
//! client must refuse: a leaf for another key, a chain to a root outside
//! `certificates.roots`, an expired leaf, no answer at all. The certificate
//! held stays, the trust anchors stay, the refusal is counted by reason and
//! retried with backoff, and a good answer is installed again afterwards.
//! And Cilium's agent, whose answer ends with a root the roots file does
//! not hold: trusted only with `trust_answer_root`.

use std::time::Duration;

use prometheus_client::registry::Registry;
use serde_json::Value;
use tidegate_ca::certs::{IstioCaCerts, IstioCaSettings};
use tidegate_ca::client::CaClientConfig;
use tidegate_ca::metrics::CaMetrics;
use tidegate_e2e::ca_double::{Answer, CaDouble};
use tidegate_e2e::{eventually, init_tracing, metric, metric_or_zero};
use tidegate_protocol::identity::SpiffeId;
use tidegate_protocol::tls::CertSource;

use super::WAIT;

struct Client {
    certs: IstioCaCerts,
    registry: Registry,
    _dir: tempfile::TempDir,
}

impl Client {
    fn new(ca: &CaDouble, timeout: Duration) -> Client {
        Client::trusting(ca, &ca.root_pem, timeout, false)
    }

    /// A client whose roots file holds `roots_pem`.
    fn trusting(
        ca: &CaDouble,
        roots_pem: &str,
        timeout: Duration,
        trust_answer_root: bool,
    ) -> Client {
        init_tracing();
        let dir = tempfile::tempdir().unwrap();
        let roots = dir.path().join("root-cert.pem");
        std::fs::write(&roots, roots_pem).unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "tok").unwrap();
        let mut registry = Registry::with_prefix("tidegate");
        let settings = IstioCaSettings {
            client: CaClientConfig {
                address: format!("https://{}", ca.addr),
                roots,
                token: Some(token),
                cluster_id: "Kubernetes".into(),
                server_name: None,
                timeout,
            },
            validity: Duration::from_secs(3600),
            first_use_wait: Duration::from_secs(5),
            reload_interval: Duration::from_secs(60),
            trust_answer_root,
        };
        let certs = IstioCaCerts::new(settings, CaMetrics::register(&mut registry)).unwrap();
        Client {
            certs,
            registry,
            _dir: dir,
        }
    }

    fn row(&self, id: &SpiffeId) -> Value {
        let dump = self.certs.dump();
        dump["identities"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["identity"] == Value::String(id.to_string()))
            .cloned()
            .unwrap_or(Value::Null)
    }

    fn metrics(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).unwrap();
        out
    }

    fn anchors(&self) -> Vec<Vec<u8>> {
        let roots = self.certs.roots();
        roots.certs.iter().map(|c| c.to_vec()).collect()
    }
}

fn web() -> SpiffeId {
    SpiffeId::new("cluster.local", "demo", "web")
}

fn der(pem: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

/// Cilium's agent: its TLS certificate (the bootstrap, `CA_ROOT_CA`) is not
/// the root that signs workloads. Without `trust_answer_root` its answer is
/// refused as a chain to no configured root; with it the answer (a leaf
/// without key usage or EKU, 30 days, from an RSA root) is installed and
/// the root it ends with becomes a trust anchor beside the roots file's.
#[tokio::test]
async fn ciliums_answer_is_trusted_only_with_trust_answer_root() {
    let ca = CaDouble::start_cilium([127, 0, 0, 1].into()).await;
    let bootstrap = ca.bootstrap_pem.clone().unwrap();
    let id = web();
    let refused = Client::trusting(&ca, &bootstrap, Duration::from_secs(5), false);
    assert!(refused.certs.fetch(&id).await.is_err());
    eventually("the refusal counted", WAIT, || {
        metric_or_zero(
            &refused.metrics(),
            r#"tidegate_ca_fetches_total{result="untrusted_chain"}"#,
        ) >= 1.0
    })
    .await;
    assert_eq!(refused.anchors(), [der(&bootstrap)], "nothing learned");

    let trusted = Client::trusting(&ca, &bootstrap, Duration::from_secs(5), true);
    trusted
        .certs
        .fetch(&id)
        .await
        .expect("Cilium's answer installed");
    assert_eq!(
        trusted.anchors(),
        [der(&bootstrap), der(&ca.root_pem)],
        "the answer's root learned"
    );
    let row = trusted.row(&id);
    assert_eq!(row["state"], "ready", "{row}");
}

/// Gets a good certificate, then has the double answer `bad` from the next
/// renewal on; checks what must hold after `refusals` refusals in a row,
/// and that a good answer is installed again. Returns the last row.
async fn refused_at_renewal(bad: Answer, reason: &str, message: &str) -> Value {
    let ca = CaDouble::start(Answer::Good).await;
    let client = Client::new(&ca, Duration::from_secs(5));
    let id = web();
    client.certs.fetch(&id).await.expect("a good first answer");
    let serial = client.certs.serial(&id).expect("installed");
    let anchors = client.anchors();
    assert_eq!(anchors, [der(&ca.root_pem)], "the roots file alone");

    ca.answer(bad);
    // Renewal comes at half-life (about a second); then two more refusals.
    let refusals = 3;
    eventually("three refusals in a row", WAIT, || {
        client.row(&id)["attempts"].as_u64().unwrap() > refusals
    })
    .await;
    let row = client.row(&id);
    let attempts = row["attempts"].as_u64().unwrap();
    assert_eq!(
        client.certs.serial(&id),
        Some(serial.clone()),
        "kept: {row}"
    );
    assert_eq!(row["serial"], Value::String(serial), "{row}");
    assert_eq!(client.anchors(), anchors, "the trust anchors are unchanged");
    // Retrying; the certificate held (valid 2 s) may have expired meanwhile.
    let state = row["state"].as_str().unwrap();
    assert!(matches!(state, "retrying" | "expired"), "{row}");
    let error = row["last_error"].as_str().unwrap();
    assert!(error.contains(message), "{error}");
    let text = client.metrics();
    let series = format!(r#"tidegate_ca_fetches_total{{result="{reason}"}}"#);
    assert!(metric(&text, &series) >= refusals as f64, "{text}");
    // Backoff: the wait scheduled after the n-th refusal in a row is the
    // n-th step of 500 ms doubling (±20 %), and the double saw exactly one
    // request per attempt (one more at most, under way).
    let n = attempts - 1;
    let wait = row["next_attempt_in_ms"].as_u64().unwrap();
    let step = 500 * (1 << (n - 1));
    assert!(
        wait * 10 >= step * 8,
        "after {n} refusals: {wait} ms: {row}"
    );
    let requests = ca.requests() as u64;
    assert!(
        requests == attempts || requests == attempts + 1,
        "{requests} requests for {attempts} attempts"
    );

    // A good answer again: installed, with a new serial.
    ca.answer(Answer::Good);
    let key = client
        .certs
        .fetch(&id)
        .await
        .expect("recovered after a good answer");
    assert_eq!(
        tidegate_protocol::tls::identity_of(&key.cert[0]).unwrap(),
        id
    );
    assert_eq!(client.row(&id)["state"], "ready");
    row
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaf_for_another_key_than_the_csrs_is_refused_and_the_current_one_kept() {
    refused_at_renewal(Answer::OtherKey, "key_mismatch", "another public key").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_to_a_root_outside_the_roots_file_is_refused_and_never_trusted() {
    refused_at_renewal(
        Answer::UnconfiguredRoot,
        "untrusted_chain",
        "certificates.roots",
    )
    .await;
}

/// An expired leaf used to replace the good one; renewal, timed from its
/// dates, then re-requested at once, in a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_leaf_is_refused_and_retried_with_backoff_not_in_a_loop() {
    refused_at_renewal(Answer::Expired, "expired", "expired at").await;
}

/// A first answer that must be refused: nothing is installed, peers'
/// trust is unchanged, the handshake waiting for it gets the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_first_answer_installs_nothing_and_the_handshake_gets_the_reason() {
    let ca = CaDouble::start(Answer::UnconfiguredRoot).await;
    let client = Client::new(&ca, Duration::from_secs(5));
    let err = client
        .certs
        .fetch(&web())
        .await
        .expect_err("refused")
        .to_string();
    assert!(err.contains("certificates.roots"), "{err}");
    assert_eq!(client.certs.serial(&web()), None);
    assert_eq!(client.anchors(), [der(&ca.root_pem)]);
    assert!(!client.anchors().contains(&der(&ca.other_root_pem)));
}

/// A CA that never answers: `result="timeout"`, not `error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_that_does_not_answer_is_counted_as_a_timeout() {
    let ca = CaDouble::start(Answer::Hang).await;
    let client = Client::new(&ca, Duration::from_millis(300));
    let err = client
        .certs
        .fetch(&web())
        .await
        .expect_err("no answer")
        .to_string();
    assert!(err.contains("certificates.timeout"), "{err}");
    let text = client.metrics();
    assert!(
        metric(&text, r#"tidegate_ca_fetches_total{result="timeout"}"#) >= 1.0,
        "{text}"
    );
    assert_eq!(
        metric_or_zero(&text, r#"tidegate_ca_fetches_total{result="error"}"#),
        0.0,
        "{text}"
    );
    assert!(ca.requests() >= 1, "the request reached the double");
}
