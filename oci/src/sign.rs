//! OCI request signing: the HTTP Signatures draft (version 1, `rsa-sha256`)
//! as OCI profiles it.
//!
//! Every request signs `date (request-target) host`; a PUT or POST also signs
//! `content-length content-type x-content-sha256`, where `x-content-sha256`
//! is the base64 SHA-256 of the body. The signing string is the lowercase
//! header names with their values, `name: value`, joined by `\n`; the
//! `(request-target)` is `<lowercase method> <path?query>`. The result goes in
//! `Authorization: Signature version="1",keyId="...",algorithm="rsa-sha256",headers="...",signature="..."`.

use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};

/// Content type of every request body tidegate sends.
pub const CONTENT_TYPE: &str = "application/json";

#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("the private key is not an RSA key in PEM (PKCS#1 or PKCS#8): {0}")]
    Key(String),
    #[error("signing failed")]
    Sign,
}

/// A request as far as the signature covers it.
#[derive(Debug)]
pub struct ToSign<'a> {
    pub method: &'a str,
    /// Path and query, e.g. `/20170115/loadBalancers/ocid1...`.
    pub target: &'a str,
    pub host: &'a str,
    /// An RFC 7231 date, e.g. `Thu, 05 Jan 2014 21:31:40 GMT`.
    pub date: &'a str,
    /// The body of a PUT or POST.
    pub body: Option<&'a [u8]>,
}

/// The headers a signed request carries besides its own.
#[derive(Debug, PartialEq, Eq)]
pub struct Signed {
    pub authorization: String,
    /// `x-content-sha256` (PUT and POST only).
    pub content_sha256: Option<String>,
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Base64 SHA-256 of a body (the `x-content-sha256` header).
pub fn content_sha256(body: &[u8]) -> String {
    b64(ring::digest::digest(&ring::digest::SHA256, body).as_ref())
}

/// The header list and the signing string for `req`.
pub fn signing_string(req: &ToSign<'_>) -> (&'static str, String) {
    let mut s = format!(
        "date: {}\n(request-target): {} {}\nhost: {}",
        req.date,
        req.method.to_ascii_lowercase(),
        req.target,
        req.host
    );
    match req.body {
        Some(body) => {
            s.push_str(&format!(
                "\ncontent-length: {}\ncontent-type: {CONTENT_TYPE}\nx-content-sha256: {}",
                body.len(),
                content_sha256(body)
            ));
            (
                "date (request-target) host content-length content-type x-content-sha256",
                s,
            )
        }
        None => ("date (request-target) host", s),
    }
}

/// Parses an RSA private key from PEM (`RSA PRIVATE KEY` or `PRIVATE KEY`).
pub fn parse_private_key(pem: &[u8]) -> Result<RsaKeyPair, SignError> {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::PrivateKeyDer;
    let der = PrivateKeyDer::from_pem_slice(pem).map_err(|e| SignError::Key(e.to_string()))?;
    match &der {
        PrivateKeyDer::Pkcs1(k) => RsaKeyPair::from_der(k.secret_pkcs1_der()),
        PrivateKeyDer::Pkcs8(k) => RsaKeyPair::from_pkcs8(k.secret_pkcs8_der()),
        _ => return Err(SignError::Key("not an RSA key".into())),
    }
    .map_err(|e| SignError::Key(e.to_string()))
}

/// Signs requests with one key under one key id.
pub struct Signer {
    key_id: String,
    key: RsaKeyPair,
    rng: SystemRandom,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("key_id", &self.key_id)
            .finish()
    }
}

impl Signer {
    pub fn new(key_id: String, key: RsaKeyPair) -> Self {
        Signer {
            key_id,
            key,
            rng: SystemRandom::new(),
        }
    }

    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    pub fn sign(&self, req: &ToSign<'_>) -> Result<Signed, SignError> {
        let (headers, text) = signing_string(req);
        let mut sig = vec![0; self.key.public().modulus_len()];
        self.key
            .sign(&RSA_PKCS1_SHA256, &self.rng, text.as_bytes(), &mut sig)
            .map_err(|_| SignError::Sign)?;
        Ok(Signed {
            authorization: format!(
                "Signature version=\"1\",keyId=\"{}\",algorithm=\"rsa-sha256\",headers=\"{headers}\",signature=\"{}\"",
                self.key_id,
                b64(&sig)
            ),
            content_sha256: req.body.map(content_sha256),
        })
    }
}

#[cfg(test)]
#[path = "sign_tests.rs"]
mod tests;
