//! Who tidegate is to OCI: the key that signs its requests.
//!
//! - API key: key id `<tenancy>/<user>/<fingerprint>`, the user's RSA private
//!   key from a PEM file. The fingerprint is the one the console shows for the
//!   uploaded public key (MD5 of its DER, colon-separated).
//! - OKE workload identity: the pod's Kubernetes service-account token is
//!   exchanged for a resource-principal session token. tidegate generates an
//!   ephemeral RSA key pair (2048 bits, with the `rsa` crate since ring cannot
//!   generate RSA keys; signing stays with ring), POSTs
//!   `{"podKey": "<base64 DER SubjectPublicKeyInfo>"}` with
//!   `Authorization: Bearer <service-account token>` to the cluster's
//!   proxymux, `https://<KUBERNETES_SERVICE_HOST>:12250/resourcePrincipalSessionTokens`
//!   (TLS verified against the service-account CA; like the OCI SDKs, the
//!   certificate's name is not checked), and gets a JSON string holding
//!   base64 of `{"token": "ST$<jwt>"}`. Requests are then signed with the
//!   ephemeral key under key id `ST$<jwt>`. The session is renewed (new key,
//!   new token) when less than a fifth of its lifetime, or 5 minutes, is left,
//!   and once after a 401 from the API.
//!
//! The `rsa` crate only generates the key here: its known timing
//! side-channel (RUSTSEC-2023-0071, Marvin) concerns private-key operations,
//! which ring performs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use tokio::sync::Mutex;

use crate::sign::{parse_private_key, SignError, Signer};
use crate::transport;

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("oci.auth.key_file {path}: {source}")]
    ReadKey {
        path: String,
        source: std::io::Error,
    },
    #[error("oci.auth.key_file {path}: {source}")]
    Key { path: String, source: SignError },
    #[error("oci.auth.{key} {path}: {source}")]
    ReadFile {
        key: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("oci.auth.proxymux_endpoint / oci.auth.ca_file: {0}")]
    Endpoint(transport::EndpointError),
    #[error("workload identity: cannot generate the session key: {0}")]
    KeyGen(String),
    #[error("workload identity: token exchange with {endpoint} failed: {message}")]
    Exchange { endpoint: String, message: String },
}

/// The signer for an API key.
pub fn api_key(
    tenancy: &str,
    user: &str,
    fingerprint: &str,
    key_file: &Path,
) -> Result<Arc<Signer>, AuthError> {
    let path = key_file.display().to_string();
    let pem = std::fs::read(key_file).map_err(|source| AuthError::ReadKey {
        path: path.clone(),
        source,
    })?;
    let key = parse_private_key(&pem).map_err(|source| AuthError::Key { path, source })?;
    Ok(Arc::new(Signer::new(
        format!("{tenancy}/{user}/{fingerprint}"),
        key,
    )))
}

/// Where signers come from.
pub enum Credentials {
    Static(Arc<Signer>),
    WorkloadIdentity(Box<WorkloadIdentity>),
}

impl Credentials {
    /// The signer to use now (renewing a session first if it is about to expire).
    pub async fn signer(&self) -> Result<Arc<Signer>, AuthError> {
        match self {
            Credentials::Static(s) => Ok(s.clone()),
            Credentials::WorkloadIdentity(w) => w.signer().await,
        }
    }

    /// Drops the current session so the next call obtains a new one; false
    /// when there is nothing to renew (an API key).
    pub async fn renew(&self) -> bool {
        match self {
            Credentials::Static(_) => false,
            Credentials::WorkloadIdentity(w) => {
                tracing::info!("OCI answered 401 to the session token: renewing the session");
                *w.session.lock().await = None;
                true
            }
        }
    }
}

/// OKE workload identity (see the module docs).
pub struct WorkloadIdentity {
    endpoint: transport::Endpoint,
    token_file: PathBuf,
    timeout: Duration,
    session: Mutex<Option<(Arc<Signer>, SystemTime, SystemTime)>>,
}

impl WorkloadIdentity {
    pub fn new(
        proxymux_endpoint: &str,
        token_file: &Path,
        ca_file: &Path,
        timeout: Duration,
    ) -> Result<Self, AuthError> {
        let ca = std::fs::read(ca_file).map_err(|source| AuthError::ReadFile {
            key: "ca_file",
            path: ca_file.display().to_string(),
            source,
        })?;
        let endpoint =
            transport::Endpoint::new(proxymux_endpoint, &ca, false).map_err(AuthError::Endpoint)?;
        Ok(WorkloadIdentity {
            endpoint,
            token_file: token_file.to_owned(),
            timeout,
            session: Mutex::new(None),
        })
    }

    async fn signer(&self) -> Result<Arc<Signer>, AuthError> {
        let mut session = self.session.lock().await;
        let now = SystemTime::now();
        if let Some((signer, issued, expires)) = session.as_ref() {
            let lifetime = expires.duration_since(*issued).unwrap_or_default();
            let margin = (lifetime / 5).min(Duration::from_secs(300));
            if now + margin < *expires {
                return Ok(signer.clone());
            }
        }
        let (signer, expires) = self.exchange().await?;
        tracing::info!(
            expires_in_s = expires.duration_since(now).unwrap_or_default().as_secs(),
            "OCI resource-principal session token obtained"
        );
        *session = Some((signer.clone(), now, expires));
        Ok(signer)
    }

    async fn exchange(&self) -> Result<(Arc<Signer>, SystemTime), AuthError> {
        let fail = |message: String| AuthError::Exchange {
            endpoint: self.endpoint.url(),
            message,
        };
        let sa_token =
            std::fs::read_to_string(&self.token_file).map_err(|source| AuthError::ReadFile {
                key: "token_file",
                path: self.token_file.display().to_string(),
                source,
            })?;
        let (pkcs8, spki) = tokio::task::spawn_blocking(generate_key)
            .await
            .map_err(|e| AuthError::KeyGen(e.to_string()))??;
        let b64 = base64::engine::general_purpose::STANDARD;
        let body = serde_json::to_vec(&serde_json::json!({ "podKey": b64.encode(&spki) }))
            .expect("a JSON object of strings");
        let headers = [
            ("authorization", format!("Bearer {}", sa_token.trim())),
            ("content-type", "application/json".to_owned()),
        ];
        let r = tokio::time::timeout(
            self.timeout,
            self.endpoint
                .send("POST", "/resourcePrincipalSessionTokens", &headers, body),
        )
        .await
        .map_err(|_| fail(format!("no answer within {:?}", self.timeout)))?
        .map_err(fail)?;
        if r.status != 200 {
            return Err(fail(format!(
                "HTTP {}: {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            )));
        }
        let token = session_token(&r.body).map_err(fail)?;
        let expires = jwt_expiry(&token).map_err(fail)?;
        let key = ring::signature::RsaKeyPair::from_pkcs8(&pkcs8)
            .map_err(|e| AuthError::KeyGen(e.to_string()))?;
        Ok((Arc::new(Signer::new(format!("ST${token}"), key)), expires))
    }
}

/// A fresh RSA key pair: (PKCS#8 private key DER, SubjectPublicKeyInfo DER).
fn generate_key() -> Result<(Vec<u8>, Vec<u8>), AuthError> {
    use rsa::pkcs8::{EncodePrivateKey as _, EncodePublicKey as _};
    let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048)
        .map_err(|e| AuthError::KeyGen(e.to_string()))?;
    let pkcs8 = key
        .to_pkcs8_der()
        .map_err(|e| AuthError::KeyGen(e.to_string()))?;
    let spki = key
        .to_public_key()
        .to_public_key_der()
        .map_err(|e| AuthError::KeyGen(e.to_string()))?;
    Ok((pkcs8.as_bytes().to_vec(), spki.as_bytes().to_vec()))
}

/// The proxymux answer: a JSON string of base64 of `{"token": "ST$<jwt>"}`.
/// Returns the JWT (without the `ST$` prefix).
fn session_token(body: &[u8]) -> Result<String, String> {
    let text = String::from_utf8_lossy(body);
    let inner = text.trim().trim_matches('"');
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(inner)
        .map_err(|e| format!("answer is not base64: {e}"))?;
    let v: serde_json::Value =
        serde_json::from_slice(&decoded).map_err(|e| format!("answer is not JSON: {e}"))?;
    let token = v["token"].as_str().ok_or("answer has no \"token\"")?;
    Ok(token.strip_prefix("ST$").unwrap_or(token).to_owned())
}

/// The `exp` claim of a JWT.
fn jwt_expiry(jwt: &str) -> Result<SystemTime, String> {
    let payload = jwt.split('.').nth(1).ok_or("session token is not a JWT")?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .map_err(|e| format!("session token payload: {e}"))?;
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("session token payload: {e}"))?;
    let exp = v["exp"].as_u64().ok_or("session token has no exp")?;
    Ok(UNIX_EPOCH + Duration::from_secs(exp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxymux_answer_and_its_expiry_parse() {
        let b64 = base64::engine::general_purpose::STANDARD;
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let jwt = format!(
            "{}.{}.sig",
            url.encode("{}"),
            url.encode(r#"{"exp":2000000000}"#)
        );
        let body = format!("\"{}\"", b64.encode(format!(r#"{{"token":"ST${jwt}"}}"#)));
        let token = session_token(body.as_bytes()).unwrap();
        assert_eq!(token, jwt);
        assert_eq!(
            jwt_expiry(&token).unwrap(),
            UNIX_EPOCH + Duration::from_secs(2_000_000_000)
        );
        assert!(session_token(b"\"not base64!\"").is_err());
    }

    #[test]
    fn a_generated_key_signs_with_ring() {
        let (pkcs8, spki) = generate_key().unwrap();
        let key = ring::signature::RsaKeyPair::from_pkcs8(&pkcs8).unwrap();
        assert_eq!(key.public().modulus_len(), 256);
        assert!(spki.len() > 256);
    }
}
