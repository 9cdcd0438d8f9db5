//! Kubernetes authorization of `/metrics` (`metrics.authorization: kubernetes`), as
//! kube-rbac-proxy does it: the request's bearer token is checked with a TokenReview
//! (authentication.k8s.io/v1), and the user it names with a SubjectAccessReview
//! (authorization.k8s.io/v1) for `get` on the non-resource URL of the request (`/metrics`).
//!
//! Decisions are cached per token and path for a short time (`ALLOWED_TTL`, `DENIED_TTL`),
//! at most `CACHE_ENTRIES` of them, keyed by a SHA-256 digest (the token itself is never
//! kept). An API server that cannot be asked (unreachable, slow past `CALL_TIMEOUT`, an
//! error answer) is never cached and makes the request answer `503`: the endpoint never opens
//! because the API server is down.
//!
//! The daemon's service account needs `create` on `tokenreviews` and `subjectaccessreviews`
//! (the chart grants it with `metrics.authorization: kubernetes`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use crate::observe::access::{Authorize, Decision, DecisionFuture};
use crate::util::errors::chain;

/// How long an allowed token and path is remembered.
pub(crate) const ALLOWED_TTL: Duration = Duration::from_secs(60);

/// How long a refused (invalid or not permitted) token and path is remembered.
pub(crate) const DENIED_TTL: Duration = Duration::from_secs(10);

/// The most decisions remembered (a full cache is emptied).
pub(crate) const CACHE_ENTRIES: usize = 1024;

/// How long one review call may take: under Prometheus' default scrape timeout, so the scrape
/// gets a `503` saying why rather than a timeout.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks `/metrics` requests with the API server.
pub struct KubernetesAuthorizer {
    client: kube::Client,
    cache: Mutex<HashMap<[u8; 32], (Decision, Instant)>>,
    timeout: Duration,
}

impl std::fmt::Debug for KubernetesAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesAuthorizer")
            .finish_non_exhaustive()
    }
}

impl KubernetesAuthorizer {
    /// Connects with the standard credentials (the pod's service account, else `KUBECONFIG`).
    pub(crate) async fn connect() -> Result<Self, super::Off> {
        let config = super::credentials().await?;
        Self::with_config(config)
    }

    /// Talks to the API server at `url` without credentials (a test stand-in).
    #[cfg(any(test, feature = "test-support"))]
    pub fn at_url(url: &str) -> Result<Self, super::Off> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| super::Off::Client(format!("{url}: {e}")))?;
        Self::with_config(kube::Config::new(uri))
    }

    fn with_config(config: kube::Config) -> Result<Self, super::Off> {
        let client = kube::Client::try_from(config).map_err(|e| super::Off::Client(chain(&e)))?;
        Ok(Self::with_client(client))
    }

    /// The daemon's token reviewer, or why there is none: on the daemon's own `client`, else
    /// (`asked` to use the API server, with no node to follow) on the standard credentials (a
    /// pod's service account, else `KUBECONFIG`); none when the daemon runs without an API
    /// server.
    pub(crate) async fn for_daemon(
        client: Option<&super::Cluster>,
        asked: bool,
    ) -> Result<std::sync::Arc<dyn crate::observe::access::Authorize>, String> {
        let authorizer = match client {
            Some(cluster) => Ok(Self::with_client(cluster.client())),
            None if asked => Self::connect().await,
            None => return Err(
                "it needs the API server, and this daemon runs without one; set metrics.authorization: none".into(),
            ),
        };
        match authorizer {
            Ok(a) => Ok(std::sync::Arc::new(a)),
            Err(e) => Err(format!(
                "dxdp cannot use the API server: {e}; give it credentials (the chart mounts the service account token with metrics.authorization=kubernetes) or set metrics.authorization: none"
            )),
        }
    }

    /// Reviews tokens with `client` (the daemon's own API server client).
    pub(crate) fn with_client(client: kube::Client) -> Self {
        KubernetesAuthorizer {
            client,
            cache: Mutex::default(),
            timeout: CALL_TIMEOUT,
        }
    }

    /// The same authorizer with another per-call timeout.
    #[cfg(any(test, feature = "test-support"))]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn cached(&self, key: &[u8; 32]) -> Option<Decision> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let (decision, at) = cache.get(key)?;
        let ttl = match decision {
            Decision::Allowed => ALLOWED_TTL,
            _ => DENIED_TTL,
        };
        (at.elapsed() < ttl).then(|| decision.clone())
    }

    fn remember(&self, key: [u8; 32], decision: &Decision) {
        if matches!(decision, Decision::Unavailable(_)) {
            return;
        }
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(key, (decision.clone(), Instant::now()));
    }

    async fn review(&self, token: &str, verb: &str, path: &str) -> Decision {
        let reviews: Api<TokenReview> = Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let answered = tokio::time::timeout(
            self.timeout,
            reviews.create(&PostParams::default(), &review),
        )
        .await;
        let status = match answered {
            Err(_) => {
                return unavailable(
                    "TokenReview",
                    &format!("no answer within {:?}", self.timeout),
                )
            }
            Ok(Err(e)) => return unavailable("TokenReview", &chain(&e)),
            Ok(Ok(r)) => r.status.unwrap_or_default(),
        };
        if status.authenticated != Some(true) {
            let why = status
                .error
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "the token is not valid".into());
            return Decision::Unauthenticated(format!(
                "the API server did not authenticate the bearer token: {why}"
            ));
        }
        let user = status.user.unwrap_or_default();
        let name = user.username.clone().unwrap_or_default();
        let access: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_string()),
                    verb: Some(verb.to_string()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answered =
            tokio::time::timeout(self.timeout, access.create(&PostParams::default(), &review))
                .await;
        let status = match answered {
            Err(_) => {
                return unavailable(
                    "SubjectAccessReview",
                    &format!("no answer within {:?}", self.timeout),
                )
            }
            Ok(Err(e)) => return unavailable("SubjectAccessReview", &chain(&e)),
            Ok(Ok(r)) => r.status.unwrap_or_default(),
        };
        if status.allowed {
            Decision::Allowed
        } else {
            let why = status
                .reason
                .filter(|r| !r.is_empty())
                .map(|r| format!(": {r}"))
                .unwrap_or_default();
            Decision::Forbidden(format!(
                "user {name:?} may not {verb} {path} (grant {verb} on the nonResourceURL {path} in a ClusterRole){why}"
            ))
        }
    }
}

fn unavailable(what: &str, why: &str) -> Decision {
    tracing::warn!("cannot check a /metrics request with a {what}: {why}; answering 503");
    Decision::Unavailable(format!("the API server's {what} failed: {why}"))
}

fn key(token: &str, verb: &str, path: &str) -> [u8; 32] {
    let mut d = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [token, verb, path] {
        d.update(&(part.len() as u64).to_le_bytes());
        d.update(part.as_bytes());
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(d.finish().as_ref());
    out
}

impl Authorize for KubernetesAuthorizer {
    fn authorize<'a>(
        &'a self,
        token: Option<&'a str>,
        verb: &'a str,
        path: &'a str,
    ) -> DecisionFuture<'a> {
        Box::pin(async move {
            let Some(token) = token else {
                return Decision::Unauthenticated(
                    "a bearer token is required (Authorization: Bearer …)".into(),
                );
            };
            let key = key(token, verb, path);
            if let Some(decision) = self.cached(&key) {
                return decision;
            }
            let decision = self.review(token, verb, path).await;
            self.remember(key, &decision);
            decision
        })
    }
}
