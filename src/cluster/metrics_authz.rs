//! Kubernetes authorization of `/metrics` (`metrics.authorization: kubernetes`), as
//! kube-rbac-proxy does it: the request's bearer token is checked with a TokenReview
//! (authentication.k8s.io/v1), and the user it names with a SubjectAccessReview
//! (authorization.k8s.io/v1) for `get` on the non-resource URL of the request (`/metrics`).
//! With `metrics.tokenAudiences` the TokenReview asks for those audiences and the token is
//! accepted only when the API server answers with one of them (an audience-unaware answer is
//! refused).
//!
//! Decisions are cached per token and path for a short time (`ALLOWED_TTL`, `DENIED_TTL`),
//! at most `CACHE_ENTRIES` of them, keyed by a SHA-256 digest (the token itself is never
//! kept). An API server that cannot be asked (unreachable, slow past `CALL_TIMEOUT`, an
//! error answer) is never cached and makes the request answer `503`: the endpoint never opens
//! because the API server is down.
//!
//! Whoever reaches the port cannot make dxdp flood the API server (each review is a call that
//! every dxdp on every node shares the API server's limits with):
//! - a bearer token that is not token-shaped (`token_shape`) or longer than
//!   `MAX_TOKEN_BYTES` (8 KiB) is refused (`401`) without asking;
//! - one review per token and path is in flight at a time: concurrent requests with the same
//!   token wait for its answer (the review runs on its own task, so a client that goes away
//!   wastes nothing and its answer is cached for the next);
//! - new reviews are limited by a token bucket (`REVIEWS_PER_SECOND`, `REVIEW_BURST`: 5 a
//!   second, bursts of 10); past it a request is answered `503` locally ("retry later")
//!   without asking. Cached decisions are not charged: a scraper whose token was reviewed is
//!   not slowed by a flood of new tokens until its entry expires.
//!
//! The daemon's service account needs `create` on `tokenreviews` and `subjectaccessreviews`
//! (the chart grants it with `metrics.authorization: kubernetes`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use tokio::sync::watch;

use crate::observe::access::{Authorize, Decision, DecisionFuture};
use crate::observe::review_metrics::{ReviewMetrics, ReviewResult};
use crate::util::errors::chain;

/// How long an allowed token and path is remembered.
pub(crate) const ALLOWED_TTL: Duration = Duration::from_secs(60);

/// How long a refused (invalid or not permitted) token and path is remembered.
pub(crate) const DENIED_TTL: Duration = Duration::from_secs(10);

/// The most decisions remembered (when full, expired ones are dropped first; a cache full of
/// live decisions is emptied).
pub(crate) const CACHE_ENTRIES: usize = 1024;

/// How long one review call may take: under Prometheus' default scrape timeout, so the scrape
/// gets a `503` saying why rather than a timeout.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// New reviews (a TokenReview, and a SubjectAccessReview for a valid token) started per
/// second in the long run: a handful of scrapers with a few tokens each need far less (each
/// token and path is reviewed once a minute, [`ALLOWED_TTL`]), and at most twice this many
/// calls a second reach the API server from one node however many tokens arrive.
pub(crate) const REVIEWS_PER_SECOND: f64 = 5.0;

/// New reviews that may start at once after a quiet time (the token bucket's size): a
/// restart with several scrapers arriving together is not refused.
pub(crate) const REVIEW_BURST: u32 = 10;

/// The longest bearer token reviewed (bytes). Service account tokens are about 1 KiB, and
/// OIDC tokens with many groups a few; the API server itself limits request headers.
pub(crate) const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// The digest a decision is kept and shared under.
type Key = [u8; 32];

/// A token bucket: `rate` a second, at most `burst`.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
    rate: f64,
    burst: f64,
}

impl Bucket {
    fn new(rate: f64, burst: u32) -> Self {
        Bucket {
            tokens: f64::from(burst),
            at: Instant::now(),
            rate,
            burst: f64::from(burst),
        }
    }

    /// Takes one, when there is one.
    fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Checks `/metrics` requests with the API server.
pub struct KubernetesAuthorizer {
    inner: Arc<Inner>,
}

struct Inner {
    client: kube::Client,
    cache: Mutex<HashMap<Key, (Decision, Instant)>>,
    /// The reviews in flight: their answer, once there is one.
    inflight: Mutex<HashMap<Key, watch::Receiver<Option<Decision>>>>,
    bucket: Mutex<Bucket>,
    timeout: Duration,
    /// `metrics.tokenAudiences` (empty: the API server's own audience).
    audiences: Vec<String>,
    metrics: ReviewMetrics,
}

impl std::fmt::Debug for KubernetesAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesAuthorizer")
            .field("audiences", &self.inner.audiences)
            .finish_non_exhaustive()
    }
}

/// Takes a lock, also one a panicking thread left (the maps stay consistent: each change is
/// one insert or remove).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
    /// server. It asks for `audiences` (`metrics.tokenAudiences`) and counts in `metrics`.
    pub(crate) async fn for_daemon(
        client: Option<&super::Cluster>,
        asked: bool,
        audiences: &[String],
        metrics: &ReviewMetrics,
    ) -> Result<std::sync::Arc<dyn crate::observe::access::Authorize>, String> {
        let authorizer = match client {
            Some(cluster) => Ok(Self::with_client(cluster.client())),
            None if asked => Self::connect().await,
            None => return Err(
                "it needs the API server, and this daemon runs without one; set metrics.authorization: none".into(),
            ),
        };
        match authorizer {
            Ok(a) => Ok(std::sync::Arc::new(
                a.with_audiences(audiences.to_vec())
                    .with_metrics(metrics.clone()),
            )),
            Err(e) => Err(format!(
                "dxdp cannot use the API server: {e}; give it credentials (the chart mounts the service account token with metrics.authorization=kubernetes) or set metrics.authorization: none"
            )),
        }
    }

    /// Reviews tokens with `client` (the daemon's own API server client).
    pub(crate) fn with_client(client: kube::Client) -> Self {
        KubernetesAuthorizer {
            inner: Arc::new(Inner {
                client,
                cache: Mutex::default(),
                inflight: Mutex::default(),
                bucket: Mutex::new(Bucket::new(REVIEWS_PER_SECOND, REVIEW_BURST)),
                timeout: CALL_TIMEOUT,
                audiences: Vec::new(),
                metrics: ReviewMetrics::default(),
            }),
        }
    }

    /// Changes a setting of an authorizer not yet used (the only time its state is not
    /// shared).
    fn set(mut self, change: impl FnOnce(&mut Inner)) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            change(inner);
        }
        self
    }

    /// The same authorizer asking for these token audiences (`metrics.tokenAudiences`; empty:
    /// the API server's own).
    pub(crate) fn with_audiences(self, audiences: Vec<String>) -> Self {
        self.set(|i| i.audiences = audiences)
    }

    /// The same authorizer counting in `metrics`.
    pub(crate) fn with_metrics(self, metrics: ReviewMetrics) -> Self {
        self.set(|i| i.metrics = metrics)
    }

    /// The same authorizer with another per-call timeout.
    #[cfg(any(test, feature = "test-support"))]
    pub fn with_timeout(self, timeout: Duration) -> Self {
        self.set(|i| i.timeout = timeout)
    }

    /// The same authorizer starting at most `burst` reviews, then `per_second` (0: never
    /// again).
    #[cfg(test)]
    fn with_review_rate(self, per_second: f64, burst: u32) -> Self {
        self.set(|i| *lock(&i.bucket) = Bucket::new(per_second, burst))
    }
}

impl Inner {
    fn cached(&self, key: &Key) -> Option<Decision> {
        let cache = lock(&self.cache);
        let (decision, at) = cache.get(key)?;
        (at.elapsed() < ttl(decision)).then(|| decision.clone())
    }

    fn remember(&self, key: Key, decision: &Decision) {
        if matches!(decision, Decision::Unavailable(_) | Decision::Limited(_)) {
            return;
        }
        let mut cache = lock(&self.cache);
        if cache.len() >= CACHE_ENTRIES {
            cache.retain(|_, (d, at)| at.elapsed() < ttl(d));
            if cache.len() >= CACHE_ENTRIES {
                cache.clear();
            }
        }
        cache.insert(key, (decision.clone(), Instant::now()));
    }

    /// The answer for `key`: cached, else the review in flight's, else a new review's when
    /// the bucket allows one.
    async fn decide(self: &Arc<Self>, key: Key, token: &str, verb: &str, path: &str) -> Decision {
        let mut answer = {
            let mut inflight = lock(&self.inflight);
            // Checked again under the lock: a review that ended since is cached before it
            // leaves `inflight`.
            if let Some(decision) = self.cached(&key) {
                return decision;
            }
            if let Some(answer) = inflight.get(&key) {
                self.metrics.count(ReviewResult::Shared);
                answer.clone()
            } else {
                if !lock(&self.bucket).take(Instant::now()) {
                    self.metrics.count(ReviewResult::Limited);
                    tracing::debug!("a /metrics bearer token over the review rate: answering 429 without asking the API server");
                    return Decision::Limited(format!(
                        "too many new bearer tokens (more than {REVIEWS_PER_SECOND} reviews a second): retry later"
                    ));
                }
                self.metrics.count(ReviewResult::Asked);
                let (send, answer) = watch::channel(None);
                inflight.insert(key, answer.clone());
                let inner = Arc::clone(self);
                let (token, verb, path) = (token.to_string(), verb.to_string(), path.to_string());
                tokio::spawn(async move {
                    // Leaves `inflight` also when the review panics (the waiters then see the
                    // channel closed).
                    let _leave = Leave(&inner, key);
                    let decision = inner.review(&token, &verb, &path).await;
                    inner.remember(key, &decision);
                    send.send_replace(Some(decision));
                });
                answer
            }
        };
        let decision = match answer.wait_for(Option::is_some).await {
            Ok(decision) => decision.clone(),
            Err(_) => None,
        };
        decision.unwrap_or_else(unreachable_answer)
    }

    async fn review(&self, token: &str, verb: &str, path: &str) -> Decision {
        let reviews: Api<TokenReview> = Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: (!self.audiences.is_empty()).then(|| self.audiences.clone()),
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
            // The authenticator's own words stay in the log: the client learns only that the
            // token was not accepted.
            if let Some(why) = status.error.filter(|e| !e.is_empty()) {
                tracing::debug!("a /metrics bearer token was not authenticated: {why}");
            }
            return Decision::Unauthenticated(
                "the API server did not authenticate the bearer token: use a valid token".into(),
            );
        }
        if let Err(why) = audience_check(&self.audiences, status.audiences.as_deref()) {
            return Decision::Unauthenticated(why);
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
            // The authorizer's reason (which roles exist, which not) stays in the log.
            if let Some(why) = status.reason.filter(|r| !r.is_empty()) {
                tracing::debug!("/metrics refused to {name:?}: {why}");
            }
            Decision::Forbidden(format!(
                "user {name:?} may not {verb} {path} (grant {verb} on the nonResourceURL {path} in a ClusterRole)"
            ))
        }
    }
}

/// Takes a review's key out of the reviews in flight when dropped.
struct Leave<'a>(&'a Inner, Key);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        lock(&self.0.inflight).remove(&self.1);
    }
}

/// The answer of a review that ended without one (its task panicked or was stopped with the
/// runtime): never open.
fn unreachable_answer() -> Decision {
    Decision::Unavailable("the token review ended without an answer: retry".into())
}

fn ttl(decision: &Decision) -> Duration {
    match decision {
        Decision::Allowed => ALLOWED_TTL,
        _ => DENIED_TTL,
    }
}

/// Whether an authenticated TokenReview's `answered` audiences fit the `wanted` ones
/// (`metrics.tokenAudiences`): with none wanted any answer does (the API server checked its
/// own audience); else the answer must name one of them. An answer without audiences comes
/// from an authenticator that ignored the request's: refused, as the TokenReview API asks of
/// its clients.
pub(crate) fn audience_check(wanted: &[String], answered: Option<&[String]>) -> Result<(), String> {
    if wanted.is_empty() {
        return Ok(());
    }
    let answered = answered.unwrap_or_default();
    if answered.iter().any(|a| wanted.contains(a)) {
        return Ok(());
    }
    Err(if answered.is_empty() {
        format!(
            "the API server authenticated the bearer token without checking its audience (metrics.tokenAudiences: {}): use a token requested for one of them",
            wanted.join(", ")
        )
    } else {
        format!(
            "the bearer token is meant for {}, not for dxdp (metrics.tokenAudiences: {}): use a token requested for one of them",
            answered.join(", "),
            wanted.join(", ")
        )
    })
}

/// Whether `token` can be a bearer token at all, checked before anything is asked: at most
/// [`MAX_TOKEN_BYTES`], in RFC 6750's `b64token` syntax (letters, digits, `-._~+/`, then `=`
/// padding only), and when it has JWT's form (three parts between two dots: service account
/// and OIDC tokens) three non-empty base64url parts. Kubernetes' other tokens (bootstrap
/// tokens `abcdef.0123456789abcdef`, static and webhook tokens) pass as `b64token`s.
pub(crate) fn token_shape(token: &str) -> Result<(), String> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(format!(
            "the bearer token is longer than {MAX_TOKEN_BYTES} bytes: not a Kubernetes token"
        ));
    }
    let body = token.trim_end_matches('=');
    if body.is_empty()
        || !body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b))
    {
        return Err(
            "the bearer token is not a token (RFC 6750: letters, digits, -._~+/ and = padding)"
                .into(),
        );
    }
    let parts: Vec<&str> = token.split('.').collect();
    if parts.len() == 3
        && !parts.iter().all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
    {
        return Err(
            "the bearer token has a JWT's three parts but they are not base64url: not a Kubernetes token"
                .into(),
        );
    }
    Ok(())
}

fn unavailable(what: &str, why: &str) -> Decision {
    tracing::warn!("cannot check a /metrics request with a {what}: {why}; answering 503");
    Decision::Unavailable(format!("the API server's {what} failed: {why}"))
}

fn key(token: &str, verb: &str, path: &str) -> Key {
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
            if let Err(why) = token_shape(token) {
                self.inner.metrics.count(ReviewResult::Malformed);
                return Decision::Unauthenticated(why);
            }
            let key = key(token, verb, path);
            if let Some(decision) = self.inner.cached(&key) {
                return decision;
            }
            self.inner.decide(key, token, verb, path).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use tokio::sync::Semaphore;

    type BoxError = Box<dyn std::error::Error + Send + Sync>;

    /// A service-account-shaped token (three base64url parts).
    const JWT: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6bW9uaXRvcmluZzpwcm9tZXRoZXVzIn0.c2lnbmF0dXJl";

    /// The API server's review endpoints, counting their calls; TokenReviews wait for a
    /// permit of `gate` before they answer.
    struct Fake {
        /// Known tokens: their audiences (`None`: an authenticator that ignores audiences).
        tokens: BTreeMap<String, Option<Vec<String>>>,
        token_reviews: AtomicUsize,
        access_reviews: AtomicUsize,
        gate: Semaphore,
        /// The `spec.audiences` of the last TokenReview.
        asked_audiences: Mutex<Option<serde_json::Value>>,
    }

    impl Fake {
        fn open(tokens: &[(&str, Option<&[&str]>)]) -> Arc<Fake> {
            let fake = Fake {
                tokens: tokens
                    .iter()
                    .map(|(t, a)| {
                        let a = a.map(|a| a.iter().map(|s| s.to_string()).collect());
                        (t.to_string(), a)
                    })
                    .collect(),
                token_reviews: AtomicUsize::new(0),
                access_reviews: AtomicUsize::new(0),
                gate: Semaphore::new(0),
                asked_audiences: Mutex::new(None),
            };
            fake.gate.add_permits(Semaphore::MAX_PERMITS);
            Arc::new(fake)
        }

        async fn answer(
            self: Arc<Self>,
            req: http::Request<kube::client::Body>,
        ) -> Result<http::Response<kube::client::Body>, BoxError> {
            let path = req.uri().path().to_string();
            let body = req.into_body().collect().await?.to_bytes();
            let mut doc: serde_json::Value = serde_json::from_slice(&body)?;
            if path == "/apis/authentication.k8s.io/v1/tokenreviews" {
                self.token_reviews.fetch_add(1, Ordering::SeqCst);
                let _permit = self.gate.acquire().await?;
                let wanted: Vec<String> = serde_json::from_value(
                    doc.pointer("/spec/audiences").cloned().unwrap_or_default(),
                )
                .unwrap_or_default();
                *lock(&self.asked_audiences) = doc.pointer("/spec/audiences").cloned();
                let token = doc
                    .pointer("/spec/token")
                    .and_then(|t| t.as_str())
                    .unwrap_or_default();
                let user =
                    serde_json::json!({"username": "system:serviceaccount:monitoring:prometheus"});
                doc["status"] = match self.tokens.get(token) {
                    None => {
                        serde_json::json!({"authenticated": false, "error": "invalid bearer token"})
                    }
                    Some(None) => serde_json::json!({"authenticated": true, "user": user}),
                    Some(Some(own)) => {
                        let both: Vec<&String> = if wanted.is_empty() {
                            own.iter().collect()
                        } else {
                            own.iter().filter(|a| wanted.contains(a)).collect()
                        };
                        if both.is_empty() {
                            serde_json::json!({"authenticated": false, "error": "token audiences are invalid"})
                        } else {
                            serde_json::json!({"authenticated": true, "user": user, "audiences": both})
                        }
                    }
                };
            } else {
                self.access_reviews.fetch_add(1, Ordering::SeqCst);
                doc["status"] = serde_json::json!({"allowed": true});
            }
            Ok(http::Response::builder()
                .status(201)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(serde_json::to_vec(&doc)?))?)
        }

        fn authorizer(self: &Arc<Self>) -> (Arc<KubernetesAuthorizer>, ReviewMetrics) {
            let fake = Arc::clone(self);
            let service = tower::service_fn(move |req| Arc::clone(&fake).answer(req));
            let metrics = ReviewMetrics::default();
            let a = KubernetesAuthorizer::with_client(kube::Client::new(service, "default"))
                .with_metrics(metrics.clone());
            (Arc::new(a), metrics)
        }
    }

    /// Waits until `done` holds, letting the other tasks run meanwhile.
    async fn until(what: &str, done: impl Fn() -> bool) {
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            while !done() {
                tokio::task::yield_now().await;
            }
        })
        .await;
        assert!(waited.is_ok(), "timed out waiting for {what}");
    }

    #[tokio::test]
    async fn concurrent_requests_with_one_new_token_share_one_review() {
        let fake = Fake::open(&[(JWT, None)]);
        fake.gate.forget_permits(Semaphore::MAX_PERMITS);
        let (authorizer, metrics) = fake.authorizer();
        let requests: Vec<_> = (0..8)
            .map(|_| {
                let a = Arc::clone(&authorizer);
                tokio::spawn(async move { a.authorize(Some(JWT), "get", "/metrics").await })
            })
            .collect();
        until("7 requests waiting for the first one's review", || {
            metrics.get(ReviewResult::Shared) == 7 && fake.token_reviews.load(Ordering::SeqCst) == 1
        })
        .await;
        fake.gate.add_permits(1);
        for r in requests {
            assert_eq!(r.await.unwrap(), Decision::Allowed);
        }
        assert_eq!(fake.token_reviews.load(Ordering::SeqCst), 1);
        assert_eq!(fake.access_reviews.load(Ordering::SeqCst), 1);
        assert_eq!(metrics.get(ReviewResult::Asked), 1);
        // Cached now: asked again, nothing is sent.
        assert_eq!(
            authorizer.authorize(Some(JWT), "get", "/metrics").await,
            Decision::Allowed
        );
        assert_eq!(fake.token_reviews.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_review_whose_client_left_still_answers_the_next_request() {
        let fake = Fake::open(&[(JWT, None)]);
        fake.gate.forget_permits(Semaphore::MAX_PERMITS);
        let (authorizer, metrics) = fake.authorizer();
        let a = Arc::clone(&authorizer);
        let first = tokio::spawn(async move { a.authorize(Some(JWT), "get", "/metrics").await });
        until("the first review", || {
            fake.token_reviews.load(Ordering::SeqCst) == 1
        })
        .await;
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        fake.gate.add_permits(1);
        assert_eq!(
            authorizer.authorize(Some(JWT), "get", "/metrics").await,
            Decision::Allowed
        );
        assert_eq!(fake.token_reviews.load(Ordering::SeqCst), 1);
        assert_eq!(metrics.get(ReviewResult::Asked), 1);
    }

    #[tokio::test]
    async fn junk_tokens_are_refused_without_asking() {
        let fake = Fake::open(&[]);
        let (authorizer, metrics) = fake.authorizer();
        let long = "a".repeat(MAX_TOKEN_BYTES + 1);
        let mut junk = vec![long];
        for i in 0..50 {
            junk.push(format!("not a token {i}"));
            junk.push(format!("{i}<script>"));
            junk.push(format!("eyJh.{i}.c2ln~"));
            junk.push(format!("eyJh..{i}"));
            junk.push(format!("é{i}"));
        }
        for token in &junk {
            match authorizer.authorize(Some(token), "get", "/metrics").await {
                Decision::Unauthenticated(_) => {}
                other => panic!("{token:?}: {other:?}"),
            }
        }
        assert_eq!(fake.token_reviews.load(Ordering::SeqCst), 0);
        assert_eq!(metrics.get(ReviewResult::Malformed), 251);
        assert_eq!(metrics.get(ReviewResult::Asked), 0);
    }

    #[tokio::test]
    async fn new_tokens_past_the_bucket_are_answered_429_without_asking() {
        let fake = Fake::open(&[]);
        let (authorizer, metrics) = fake.authorizer();
        let authorizer = Arc::new(
            Arc::into_inner(authorizer)
                .unwrap()
                .with_review_rate(0.0, 3),
        );
        let mut limited = 0;
        for i in 0..20 {
            let token = format!("{JWT}{i}");
            match authorizer.authorize(Some(&token), "get", "/metrics").await {
                Decision::Unauthenticated(why) => {
                    assert_eq!(
                        why,
                        "the API server did not authenticate the bearer token: use a valid token"
                    )
                }
                Decision::Limited(why) => {
                    assert!(why.contains("too many new bearer tokens"), "{why}");
                    limited += 1;
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(limited, 17);
        assert_eq!(fake.token_reviews.load(Ordering::SeqCst), 3);
        assert_eq!(metrics.get(ReviewResult::Asked), 3);
        assert_eq!(metrics.get(ReviewResult::Limited), 17);
        // A token reviewed before is answered from the cache, bucket or not.
        let first = format!("{JWT}0");
        assert!(matches!(
            authorizer.authorize(Some(&first), "get", "/metrics").await,
            Decision::Unauthenticated(_)
        ));
        assert_eq!(fake.token_reviews.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn the_bucket_refills_at_its_rate_up_to_its_size() {
        let start = Instant::now();
        let mut b = Bucket::new(5.0, 10);
        b.at = start;
        assert_eq!((0..12).filter(|_| b.take(start)).count(), 10);
        // 1 s later: 5 more, not 10.
        let later = start + Duration::from_secs(1);
        assert_eq!((0..12).filter(|_| b.take(later)).count(), 5);
        // A long quiet time refills to the burst, no further.
        let much_later = later + Duration::from_secs(3600);
        assert_eq!((0..30).filter(|_| b.take(much_later)).count(), 10);
    }

    #[tokio::test]
    async fn audiences_are_asked_for_and_must_be_answered() {
        let fake = Fake::open(&[
            ("for-dxdp", Some(&["dxdp", "vault"][..])),
            ("for-vault", Some(&["vault"][..])),
            ("unaware", None),
        ]);
        let (authorizer, _) = fake.authorizer();
        let authorizer = Arc::into_inner(authorizer)
            .unwrap()
            .with_audiences(vec!["dxdp".into()]);
        assert_eq!(
            authorizer
                .authorize(Some("for-dxdp"), "get", "/metrics")
                .await,
            Decision::Allowed
        );
        assert_eq!(
            *lock(&fake.asked_audiences),
            Some(serde_json::json!(["dxdp"]))
        );
        match authorizer
            .authorize(Some("for-vault"), "get", "/metrics")
            .await
        {
            // The API server's "token audiences are invalid" stays in the log.
            Decision::Unauthenticated(why) => assert_eq!(
                why,
                "the API server did not authenticate the bearer token: use a valid token"
            ),
            other => panic!("{other:?}"),
        }
        match authorizer.authorize(Some("unaware"), "get", "/metrics").await {
            Decision::Unauthenticated(why) => assert_eq!(why, "the API server authenticated the bearer token without checking its audience (metrics.tokenAudiences: dxdp): use a token requested for one of them"),
            other => panic!("{other:?}"),
        }
        assert_eq!(fake.access_reviews.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn without_audiences_none_are_asked_for() {
        let fake = Fake::open(&[("unaware", None)]);
        let (authorizer, _) = fake.authorizer();
        assert_eq!(
            authorizer
                .authorize(Some("unaware"), "get", "/metrics")
                .await,
            Decision::Allowed
        );
        assert_eq!(*lock(&fake.asked_audiences), None);
    }

    #[test]
    fn audience_answers_are_checked() {
        let dxdp = ["dxdp".to_string()];
        assert_eq!(audience_check(&[], None), Ok(()));
        assert_eq!(
            audience_check(&dxdp, Some(&["a".into(), "dxdp".into()])),
            Ok(())
        );
        assert_eq!(
            audience_check(&dxdp, Some(&["https://kubernetes.default.svc".into()])),
            Err("the bearer token is meant for https://kubernetes.default.svc, not for dxdp (metrics.tokenAudiences: dxdp): use a token requested for one of them".into())
        );
        assert!(audience_check(&dxdp, Some(&[])).is_err());
        assert!(audience_check(&dxdp, None).is_err());
    }

    #[test]
    fn token_shapes() {
        for good in [
            JWT,
            "abcdef.0123456789abcdef",
            "k8s-aws-v1.aHR0cHM6Ly9zdHMuYW1hem9uYXdzLmNvbQ",
            "c3RhdGljLXRva2Vu==",
            "prometheus-token",
        ] {
            assert_eq!(token_shape(good), Ok(()), "{good}");
        }
        assert_eq!(token_shape(&"a".repeat(MAX_TOKEN_BYTES)), Ok(()));
        assert_eq!(
            token_shape(&"a".repeat(MAX_TOKEN_BYTES + 1)),
            Err("the bearer token is longer than 8192 bytes: not a Kubernetes token".into())
        );
        for bad in [
            "", "=", "a b", "a=b", "a\u{0}", "tökén", "a,b", "x.y.z+", "x..z", ".y.z",
        ] {
            assert!(token_shape(bad).is_err(), "{bad:?}");
        }
    }
}
