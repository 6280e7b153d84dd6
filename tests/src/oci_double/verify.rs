//! Verifies OCI HTTP signatures the way the service does.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use ring::signature::{UnparsedPublicKey, RSA_PKCS1_2048_8192_SHA256};

/// Why a request is not authenticated (the 401 message).
pub type Reject = String;

/// The public key (DER `RSAPublicKey`) of a PEM RSA private key, or the key
/// of a PEM `PUBLIC KEY` (SubjectPublicKeyInfo, as `openssl rsa -pubout` writes).
pub fn public_key_der(pem: &[u8]) -> Result<Vec<u8>, String> {
    use rustls_pki_types::pem::{PemObject as _, SectionKind};
    use rustls_pki_types::PrivateKeyDer;
    if let Ok(key) = PrivateKeyDer::from_pem_slice(pem) {
        let pair = match &key {
            PrivateKeyDer::Pkcs1(k) => ring::signature::RsaKeyPair::from_der(k.secret_pkcs1_der()),
            PrivateKeyDer::Pkcs8(k) => {
                ring::signature::RsaKeyPair::from_pkcs8(k.secret_pkcs8_der())
            }
            _ => return Err("not an RSA key".into()),
        }
        .map_err(|e| e.to_string())?;
        return Ok(pair.public().as_ref().to_vec());
    }
    let (kind, der) = <(SectionKind, Vec<u8>)>::from_pem_slice(pem).map_err(|e| e.to_string())?;
    match kind {
        SectionKind::PublicKey => spki_key(&der).ok_or_else(|| "bad SubjectPublicKeyInfo".into()),
        _ => Err("no RSA key in the PEM".into()),
    }
}

/// One DER element: (tag, contents, rest).
fn der(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&len0, rest) = rest.split_first()?;
    let (len, rest) = if len0 < 0x80 {
        (len0 as usize, rest)
    } else {
        let n = (len0 & 0x7f) as usize;
        if n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |a, &b| (a << 8) | b as usize);
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// SubjectPublicKeyInfo → the BIT STRING's key bytes.
pub(crate) fn spki_key(spki: &[u8]) -> Option<Vec<u8>> {
    let (0x30, seq, _) = der(spki)? else {
        return None;
    };
    let (0x30, _alg, rest) = der(seq)? else {
        return None;
    };
    let (0x03, bits, _) = der(rest)? else {
        return None;
    };
    bits.split_first().map(|(_, key)| key.to_vec())
}

/// `key="value"` pairs of a `Signature ...` Authorization header.
fn params(auth: &str) -> Option<HashMap<&str, &str>> {
    let mut rest = auth.strip_prefix("Signature ")?;
    let mut out = HashMap::new();
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let (value, after) = after.split_once('"')?;
        out.insert(key.trim(), value);
        rest = after.trim_start_matches(',').trim_start();
    }
    Some(out)
}

/// A request as the verifier needs it.
pub struct Seen<'a> {
    pub method: &'a str,
    pub target: &'a str,
    pub header: &'a dyn Fn(&str) -> Option<String>,
    pub body: &'a [u8],
}

/// Checks the signature of `req` against `keys`; the key id on success.
pub fn verify(
    req: &Seen<'_>,
    keys: &HashMap<String, Vec<u8>>,
    max_skew: Duration,
) -> Result<String, Reject> {
    let auth = (req.header)("authorization").ok_or("no Authorization header")?;
    let p = params(&auth).ok_or("Authorization is not an OCI Signature")?;
    if p.get("version") != Some(&"1") || p.get("algorithm") != Some(&"rsa-sha256") {
        return Err("signature version must be 1 and algorithm rsa-sha256".into());
    }
    let key_id = *p.get("keyId").ok_or("no keyId")?;
    let key = keys
        .get(key_id)
        .ok_or_else(|| format!("unknown keyId {key_id:?}"))?;
    let headers: Vec<&str> = p.get("headers").ok_or("no headers")?.split(' ').collect();
    let mut required = vec!["date", "(request-target)", "host"];
    if matches!(req.method, "PUT" | "POST") {
        required.extend(["content-length", "content-type", "x-content-sha256"]);
    }
    if let Some(missing) = required.iter().find(|h| !headers.contains(h)) {
        return Err(format!("header {missing} is not signed"));
    }
    let date = (req.header)("date").ok_or("no date header")?;
    let at = httpdate::parse_http_date(&date).map_err(|_| "bad date header")?;
    let now = SystemTime::now();
    let skew = now
        .duration_since(at)
        .or_else(|_| at.duration_since(now))
        .unwrap_or_default();
    if skew > max_skew {
        return Err(format!("date {date} is more than 5 minutes off"));
    }
    if matches!(req.method, "PUT" | "POST") {
        let sha = base64::engine::general_purpose::STANDARD
            .encode(ring::digest::digest(&ring::digest::SHA256, req.body));
        if (req.header)("x-content-sha256").as_deref() != Some(&sha) {
            return Err("x-content-sha256 does not match the body".into());
        }
        if (req.header)("content-length") != Some(req.body.len().to_string()) {
            return Err("content-length does not match the body".into());
        }
    }
    let mut lines = Vec::new();
    for h in &headers {
        let value = if *h == "(request-target)" {
            format!("{} {}", req.method.to_ascii_lowercase(), req.target)
        } else {
            (req.header)(h).ok_or_else(|| format!("signed header {h} is missing"))?
        };
        lines.push(format!("{h}: {value}"));
    }
    let sig = base64::engine::general_purpose::STANDARD
        .decode(p.get("signature").ok_or("no signature")?)
        .map_err(|_| "signature is not base64")?;
    UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, key)
        .verify(lines.join("\n").as_bytes(), &sig)
        .map_err(|_| "signature does not verify".to_string())?;
    Ok(key_id.to_owned())
}
