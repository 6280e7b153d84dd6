//! `certificates` of `/config_dump`, as ztunnel writes it and `istioctl
//! ztunnel-config certificates` reads it: one entry per identity — the
//! local workloads' and those the certificate source holds — with its
//! state (`Available`, `Initializing`, `Unavailable: <why>`), its chain
//! and the trust bundle, each certificate with its PEM (base64, as
//! ztunnel writes it), decimal serial and RFC 3339 validity. Never a key.
//!
//! What the source itself says (istio-ca: attempts, next retry, last
//! error) is `certificate_source`.

use std::collections::BTreeSet;

use base64::Engine as _;
use rustls_pki_types::CertificateDer;
use serde_json::{json, Value};
use tidegate_protocol::identity::SpiffeId;
use tidegate_protocol::tls::{CertError, CertSource};

/// What the CA source answers while a first certificate is on its way.
const BEING_FETCHED: &str = "being fetched";

/// One entry per identity in `ids`, in identity order.
pub(super) fn certificates(source: &dyn CertSource, ids: BTreeSet<SpiffeId>) -> Vec<Value> {
    let roots: Vec<Value> = source.roots().certs.iter().map(cert).collect();
    ids.into_iter()
        .map(|id| {
            let (state, chain) = match source.certified_key(&id) {
                Ok(k) => ("Available".to_owned(), k.cert.iter().map(cert).collect()),
                Err(CertError::Unavailable { reason, .. }) if reason == BEING_FETCHED => {
                    ("Initializing".to_owned(), Vec::new())
                }
                Err(e) => (format!("Unavailable: {e}"), Vec::new()),
            };
            let available = !chain.is_empty();
            json!({
                "identity": id,
                "state": state,
                "certChain": chain,
                "rootCerts": if available { roots.clone() } else { Vec::new() },
            })
        })
        .collect()
}

/// The identities `certificate_source` lists (istio-ca's `identities`).
pub(super) fn held_by_source(dump: &Value) -> impl Iterator<Item = SpiffeId> + '_ {
    dump["identities"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|row| row["identity"].as_str()?.parse().ok())
}

/// One certificate as ztunnel's `CertDump`; an unparsable one keeps its
/// PEM and says so in place of its serial.
fn cert(der: &CertificateDer<'_>) -> Value {
    let pem = base64::engine::general_purpose::STANDARD.encode(pem(der));
    match x509_parser::parse_x509_certificate(der) {
        Ok((_, c)) => json!({
            "pem": pem,
            "serialNumber": c.tbs_certificate.serial.to_string(),
            "validFrom": rfc3339(c.validity().not_before),
            "expirationTime": rfc3339(c.validity().not_after),
        }),
        Err(e) => json!({
            "pem": pem,
            "serialNumber": format!("unparsable: {e}"),
            "validFrom": "",
            "expirationTime": "",
        }),
    }
}

fn pem(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// `2026-03-11T12:57:26Z`, as ztunnel writes a certificate's dates.
fn rfc3339(t: x509_parser::time::ASN1Time) -> String {
    let d = t.to_datetime().to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        d.year(),
        u8::from(d.month()),
        d.day(),
        d.hour(),
        d.minute(),
        d.second()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_as_ztunnel_writes_it() {
        let mut p = rcgen::CertificateParams::new(vec!["a.example".into()]).unwrap();
        p.serial_number = Some(rcgen::SerialNumber::from_slice(&[0x01, 0x00]));
        p.not_before = rcgen::date_time_ymd(2026, 3, 11);
        p.not_after = rcgen::date_time_ymd(2027, 1, 2);
        let key = rcgen::KeyPair::generate().unwrap();
        let c = p.self_signed(&key).unwrap();
        let got = cert(c.der());
        assert_eq!(got["serialNumber"], "256");
        assert_eq!(got["validFrom"], "2026-03-11T00:00:00Z");
        assert_eq!(got["expirationTime"], "2027-01-02T00:00:00Z");
        let pem = base64::engine::general_purpose::STANDARD
            .decode(got["pem"].as_str().unwrap())
            .unwrap();
        assert_eq!(
            String::from_utf8(pem).unwrap(),
            c.pem().replace("\r\n", "\n")
        );
        let bad = cert(&CertificateDer::from(vec![1, 2, 3]));
        assert!(bad["serialNumber"]
            .as_str()
            .unwrap()
            .starts_with("unparsable"));
    }
}
