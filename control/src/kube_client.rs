//! A Kubernetes client from an API server URL, a kubeconfig file, or what
//! `kube` infers (`KUBECONFIG`, `~/.kube/config`, the in-cluster service
//! account) — as the gateway's `workloads.kubernetes` and `tidegate-ca`'s
//! flags ask for one. Errors name the setting the caller read.

use std::path::{Path, PathBuf};

use kube::Client;

/// The names of the two settings, for the errors.
#[derive(Clone, Copy, Debug)]
pub struct Settings<'a> {
    /// An API server URL without credentials (`kubectl proxy`, tests).
    pub api_server: Option<&'a str>,
    pub api_server_key: &'static str,
    /// A kubeconfig file, read when no URL is set.
    pub kubeconfig: Option<&'a Path>,
    pub kubeconfig_key: &'static str,
}

#[derive(Debug, thiserror::Error)]
pub enum KubeClientError {
    #[error("{key} {url:?} is not a valid URL: {message}")]
    BadUrl {
        key: &'static str,
        url: String,
        message: String,
    },
    #[error(
        "no Kubernetes credentials found (KUBECONFIG, ~/.kube/config, or the in-cluster \
         service account; or set {key}): {source}"
    )]
    Infer {
        key: &'static str,
        source: kube::config::InferConfigError,
    },
    #[error("{key} {path}: {source}")]
    Kubeconfig {
        key: &'static str,
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("cannot build the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// The client the settings ask for.
pub async fn client(s: Settings<'_>) -> Result<Client, KubeClientError> {
    let config = match (s.api_server, s.kubeconfig) {
        (Some(url), _) => {
            let uri = url
                .parse()
                .map_err(|e: http::uri::InvalidUri| KubeClientError::BadUrl {
                    key: s.api_server_key,
                    url: url.to_owned(),
                    message: e.to_string(),
                })?;
            kube::Config::new(uri)
        }
        (None, Some(path)) => {
            let bad = |source| KubeClientError::Kubeconfig {
                key: s.kubeconfig_key,
                path: path.to_owned(),
                source,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(bad)?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(bad)?
        }
        (None, None) => kube::Config::infer()
            .await
            .map_err(|source| KubeClientError::Infer {
                key: s.api_server_key,
                source,
            })?,
    };
    Ok(Client::try_from(config)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_bad_setting_is_named_in_the_error() {
        let settings = |api_server, kubeconfig| Settings {
            api_server,
            api_server_key: "--api-server",
            kubeconfig,
            kubeconfig_key: "--kubeconfig",
        };
        let e = client(settings(Some("http://exa mple"), None))
            .await
            .err()
            .expect("a URL with a space is refused");
        assert!(
            e.to_string()
                .starts_with("--api-server \"http://exa mple\" is not a valid URL"),
            "{e}"
        );
        let missing = Path::new("/nonexistent/kubeconfig");
        let e = client(settings(None, Some(missing)))
            .await
            .err()
            .expect("a missing kubeconfig is refused");
        assert!(
            e.to_string()
                .starts_with("--kubeconfig /nonexistent/kubeconfig: "),
            "{e}"
        );
        assert!(client(settings(Some("http://127.0.0.1:1"), None))
            .await
            .is_ok());
    }
}
