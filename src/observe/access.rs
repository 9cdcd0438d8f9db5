//! Who may read `/metrics`: the web configuration's basic authentication ([`super::web`]) and,
//! opt-in, Kubernetes authorization (a bearer token checked with TokenReview, the request with
//! SubjectAccessReview, as kube-rbac-proxy does) through an [`Authorize`] implementation the
//! daemon hands in (`cluster::metrics_authz`, which talks to the API server).
//!
//! Nothing here ever answers open when it cannot decide: an authorizer that cannot reach the
//! API server makes `/metrics` answer `503`. `/healthz` and `/readyz` on a guarded listener
//! answer every client, with the status code and a one-word body only (`ok`, `unavailable`);
//! their reasons are on the probe listener and for authenticated clients.
//!
//! An answer that refuses says what the client must do, never why inside: file paths, the API
//! server's errors and the guard's set-up errors go to the log (once per distinct text), not
//! to the client.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::web::{BasicAuth, Reloaded, Web, WebConfig};

/// What the authorizer says of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The token is valid and its user may `get` the path.
    Allowed,
    /// No token, or the API server says it is not valid (401).
    Unauthenticated(String),
    /// A valid token whose user may not `get` the path (403).
    Forbidden(String),
    /// The API server could not be asked (503; never answered open).
    Unavailable(String),
    /// Too many new tokens to ask the API server about now: not asked (429, `Retry-After`).
    Limited(String),
}

/// A future an [`Authorize`] returns.
pub(crate) type DecisionFuture<'a> = Pin<Box<dyn Future<Output = Decision> + Send + 'a>>;

/// Checks a bearer token's right to `verb` the non-resource URL `path`.
pub trait Authorize: Send + Sync + std::fmt::Debug {
    /// The decision for `token` (`None`: the request had none).
    fn authorize<'a>(
        &'a self,
        token: Option<&'a str>,
        verb: &'a str,
        path: &'a str,
    ) -> DecisionFuture<'a>;
}

/// Why a request was refused (`dxdp_metrics_requests_denied_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Denied {
    /// 401: no or wrong credentials.
    Unauthenticated,
    /// 403: valid credentials without the right.
    Forbidden,
    /// 503: the authorizer could not decide.
    Unavailable,
    /// 429: the password verifier's queue is full (no hash was computed).
    Busy,
    /// 429: `rate_limit` of the web configuration.
    RateLimited,
}

impl Denied {
    /// Every reason.
    pub(crate) const ALL: [Denied; 5] = [
        Denied::Unauthenticated,
        Denied::Forbidden,
        Denied::Unavailable,
        Denied::Busy,
        Denied::RateLimited,
    ];

    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Denied::Unauthenticated => "unauthenticated",
            Denied::Forbidden => "forbidden",
            Denied::Unavailable => "unavailable",
            Denied::Busy => "busy",
            Denied::RateLimited => "rate_limited",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

/// The metrics of the access checks.
#[derive(Debug, Clone)]
pub struct AccessMetrics {
    denied: Family<ReasonLabel, Counter>,
    web_reloads: Family<ResultLabel, Counter>,
    guard_failures: Counter,
}

impl AccessMetrics {
    /// Registers them in `registry`, every series at 0.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let denied = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "dxdp_metrics_requests_denied",
            "Requests to the metrics endpoint refused, by reason (unauthenticated, forbidden, unavailable, busy: too many password checks waiting, rate_limited: rate_limit of the web configuration)",
            denied.clone(),
        );
        let web_reloads = Family::<ResultLabel, Counter>::default();
        registry.register(
            "dxdp_web_config_reloads",
            "Loads of a changed web configuration file (metrics.webConfigFile), by result (applied or rejected)",
            web_reloads.clone(),
        );
        let guard_failures = Counter::default();
        registry.register(
            "dxdp_metrics_guard_failures",
            "Attempts to set up the metrics endpoint's guard (web configuration, Kubernetes authorizer) that failed; /metrics answers 503 meanwhile",
            guard_failures.clone(),
        );
        for d in Denied::ALL {
            drop(denied.get_or_create(&ReasonLabel {
                reason: d.as_str().into(),
            }));
        }
        for r in ["applied", "rejected"] {
            drop(web_reloads.get_or_create(&ResultLabel { result: r.into() }));
        }
        AccessMetrics {
            denied,
            web_reloads,
            guard_failures,
        }
    }

    /// A request was refused.
    pub(crate) fn denied(&self, why: Denied) {
        self.denied
            .get_or_create(&ReasonLabel {
                reason: why.as_str().into(),
            })
            .inc();
    }

    /// The endpoint's guard could not be set up (it refuses `/metrics` until it can).
    pub(crate) fn guard_failed(&self) {
        self.guard_failures.inc();
    }

    /// The web configuration was loaded again.
    pub fn web_reload(&self, what: Reloaded) {
        let result = match what {
            Reloaded::Applied => "applied",
            Reloaded::Rejected => "rejected",
        };
        self.web_reloads
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }
}

/// What guards a listener: the web configuration and the authorizer, each optional.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// `metrics.webConfigFile`, loaded.
    pub web: Option<Arc<Web>>,
    /// `metrics.authorization: kubernetes`.
    pub authorizer: Option<Arc<dyn Authorize>>,
    /// Set when the guard the configuration asks for could not be set up: every request but
    /// the probes is refused with `503` and this reason (what is wrong, by setting and key:
    /// the full error is in the log).
    pub refusing: Option<Arc<str>>,
}

/// The outcome of [`Access::check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Serve it.
    Allowed,
    /// Refuse it, saying this.
    Denied(Denied, String),
}

impl Access {
    /// Refuses every request but the probes with `503`, saying `why` (a guard the
    /// configuration asks for that could not be set up).
    pub(crate) fn refusing(why: impl Into<Arc<str>>) -> Self {
        Access {
            refusing: Some(why.into()),
            ..Access::default()
        }
    }

    /// No web configuration and no authorizer: every request is served as before.
    pub(crate) fn is_open(&self) -> bool {
        self.web.is_none() && self.authorizer.is_none() && self.refusing.is_none()
    }

    /// Whether a request must show credentials (basic authentication or a bearer token), or is
    /// refused whatever it shows.
    pub(crate) fn needs_credentials(&self, web: Option<&WebConfig>) -> bool {
        self.refusing.is_some()
            || self.authorizer.is_some()
            || web.is_some_and(WebConfig::has_users)
    }

    /// Whether the request with `authorization` (the header's value) may `verb` `path`.
    pub(crate) async fn check(
        &self,
        web: Option<Arc<WebConfig>>,
        authorization: Option<&[u8]>,
        verb: &str,
        path: &str,
    ) -> Verdict {
        if let Some(why) = &self.refusing {
            return Verdict::Denied(
                Denied::Unavailable,
                format!("unavailable: the metrics endpoint is not set up as configured ({why}); the daemon's log says what to fix, and it tries again on its own\n"),
            );
        }
        if let Some(web) = web.filter(|w| w.has_users()) {
            let outcome = match &self.web {
                Some(w) => web.check_basic(authorization, w.verifier()).await,
                None => BasicAuth::Failed,
            };
            match outcome {
                BasicAuth::Passed => {}
                BasicAuth::Busy => {
                    return Verdict::Denied(
                        Denied::Busy,
                        "too many requests: too many password checks are waiting; try again in a second\n".into(),
                    )
                }
                BasicAuth::NotConfigured | BasicAuth::Failed => {
                    return Verdict::Denied(
                        Denied::Unauthenticated,
                        "unauthorized: give the user and password of basic_auth_users\n".into(),
                    )
                }
            }
        }
        if let Some(authorizer) = &self.authorizer {
            let token = authorization
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(|v| {
                    let (scheme, token) = v.trim().split_once(' ')?;
                    scheme
                        .eq_ignore_ascii_case("bearer")
                        .then(|| token.trim())
                        .filter(|t| !t.is_empty())
                });
            return match authorizer.authorize(token, verb, path).await {
                Decision::Allowed => Verdict::Allowed,
                // The authorizer's own words for the client (cluster::metrics_authz).
                Decision::Unauthenticated(why) => {
                    Verdict::Denied(Denied::Unauthenticated, format!("unauthorized: {why}\n"))
                }
                Decision::Forbidden(why) => {
                    Verdict::Denied(Denied::Forbidden, format!("forbidden: {why}\n"))
                }
                Decision::Limited(why) => {
                    Verdict::Denied(Denied::RateLimited, format!("too many requests: {why}\n"))
                }
                Decision::Unavailable(why) => {
                    say_once(&why);
                    Verdict::Denied(
                        Denied::Unavailable,
                        "unavailable: the request's authorization cannot be checked now; try again later\n".into(),
                    )
                }
            };
        }
        Verdict::Allowed
    }
}

/// Logs why the authorizer could not decide, once per distinct reason (the client is told to
/// try again, not why).
fn say_once(why: &str) {
    static SAID: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    if said.as_deref() != Some(why) {
        tracing::warn!(
            "cannot check a metrics request's authorization: {why}; /metrics answers 503 meanwhile"
        );
        *said = Some(why.to_string());
    }
}
