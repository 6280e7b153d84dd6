//! Callers authenticated by TokenReview (istiod's Kube JWT authenticator,
//! `security/pkg/k8s/tokenreview/k8sauthn.go`): the token must be valid for
//! the configured audience and belong to a service account; a pod-bound
//! token also names its pod.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;
use kube::Api;

use crate::impersonation::Caller;

const POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const POD_UID: &str = "authentication.kubernetes.io/pod-uid";

#[derive(Debug, thiserror::Error)]
pub enum AuthnError {
    #[error("no bearer token in the authorization header")]
    NoToken,
    #[error("TokenReview failed: {0}")]
    Api(#[from] kube::Error),
    #[error("token not authenticated: {0}")]
    Rejected(String),
    #[error("token not valid for audience {0:?}")]
    Audience(String),
    #[error("token of {0:?}, not a service account")]
    NotServiceAccount(String),
}

impl AuthnError {
    /// Whether the failure is ours (the API server), not the caller's.
    pub fn is_internal(&self) -> bool {
        matches!(self, AuthnError::Api(_))
    }
}

pub struct Authenticator {
    reviews: Api<TokenReview>,
    audience: String,
}

impl Authenticator {
    pub fn new(client: kube::Client, audience: &str) -> Self {
        Authenticator {
            reviews: Api::all(client),
            audience: audience.to_owned(),
        }
    }

    /// `authorization: Bearer <token>` → the caller.
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Caller, AuthnError> {
        let token = authorization
            .and_then(|a| a.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(AuthnError::NoToken)?;
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..Default::default()
        };
        let status = self
            .reviews
            .create(&PostParams::default(), &review)
            .await?
            .status
            .unwrap_or_default();
        if status.authenticated != Some(true) {
            return Err(AuthnError::Rejected(
                status.error.unwrap_or_else(|| "no reason given".into()),
            ));
        }
        if !status
            .audiences
            .as_ref()
            .is_some_and(|a| a.contains(&self.audience))
        {
            return Err(AuthnError::Audience(self.audience.clone()));
        }
        let user = status.user.unwrap_or_default();
        let username = user.username.unwrap_or_default();
        let Some((namespace, service_account)) = username
            .strip_prefix("system:serviceaccount:")
            .and_then(|r| r.split_once(':'))
        else {
            return Err(AuthnError::NotServiceAccount(username));
        };
        let extra = |k: &str| {
            user.extra
                .as_ref()
                .and_then(|e| e.get(k))
                .and_then(|v| v.first())
                .cloned()
        };
        Ok(Caller {
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
            pod_name: extra(POD_NAME),
            pod_uid: extra(POD_UID),
        })
    }
}
