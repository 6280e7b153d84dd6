//! Who tidegate is to OCI: the key that signs its requests.
//!
//! - API key: key id `<tenancy>/<user>/<fingerprint>`, the user's RSA private
//!   key from a PEM file. The fingerprint is the one the console shows for the
//!   uploaded public key (MD5 of its DER, colon-separated).

use std::path::Path;
use std::sync::Arc;

use super::sign::{parse_private_key, SignError, Signer};

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("oci.auth.key_file {path}: {source}")]
    ReadKey {
        path: String,
        source: std::io::Error,
    },
    #[error("oci.auth.key_file {path}: {source}")]
    Key { path: String, source: SignError },
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
