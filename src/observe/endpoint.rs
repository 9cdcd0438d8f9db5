//! The metrics endpoint as a long-lived task: `/metrics`, `/healthz` and `/readyz` on one
//! address, guarded as configured ([`Guard`]), and the probe-only endpoint.
//!
//! A guard that cannot be set up (an invalid web configuration, `metrics.authorization:
//! kubernetes` without the API server's credentials) never stops the daemon and never opens
//! `/metrics` unguarded: the endpoint answers `503` naming the setting (and key) at fault, logs
//! the full reason once (file paths and the API server's errors stay in the log), answers the
//! probes as always, and tries again every [`GUARD_RETRY`] until the guard loads.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::access::{Access, Authorize};
use super::web::Web;
use super::Observe;
use crate::util::task::Task;

/// How often a metrics endpoint whose guard could not be set up tries again.
pub(crate) const GUARD_RETRY: Duration = Duration::from_secs(10);

/// What guards `/metrics`, as the configuration asks.
#[derive(Clone, Debug, Default)]
pub(crate) struct Guard {
    /// The web configuration file (`metrics.webConfigFile`): TLS, client certificates, basic
    /// authentication.
    pub(crate) web_config_file: Option<PathBuf>,
    /// With `metrics.authorization: kubernetes`: the token reviewer, or why it could not be
    /// built. `None`: no bearer tokens are checked.
    pub(crate) authorizer: Option<Result<Arc<dyn Authorize>, String>>,
    /// `metrics.allowPlainHttpTokens`: bearer tokens accepted without TLS.
    pub(crate) allow_plain_http_tokens: bool,
    /// A HostProcess container's sandbox mount point: the certificates the web configuration
    /// names by absolute paths are looked up in the pod's volumes first.
    pub(crate) sandbox: Option<String>,
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `address` ([`super::http::serve_guarded_forever`]: an
/// address that cannot be bound is logged once per distinct error and retried in the
/// background; device serving never waits for it), guarded by `guard`, and says it stopped
/// listening when it ends. A guard that cannot be set up is tried again every `retry` while
/// `/metrics` answers `503` with the reason.
#[derive(Clone, Debug)]
pub(crate) struct MetricsEndpoint {
    /// Where it listens (`metrics.address`).
    pub(crate) address: SocketAddr,
    /// What it serves.
    pub(crate) observe: Observe,
    /// What guards `/metrics`.
    pub(crate) guard: Guard,
    /// How often a guard that could not be set up is tried again ([`GUARD_RETRY`]).
    pub(crate) retry: Duration,
}

impl Task for MetricsEndpoint {
    async fn run(self) {
        let MetricsEndpoint {
            address,
            observe,
            guard,
            retry,
        } = self;
        let _unset = UnsetListening(observe.clone());
        let serve = |access| super::http::serve_guarded_forever(address, observe.clone(), access);
        let mut said: Option<String> = None;
        let access = loop {
            match access(&guard, &observe).await {
                Ok(access) => break access,
                Err(Unguarded { setting, why }) => {
                    if said.as_deref() != Some(why.as_str()) {
                        tracing::error!(
                            %address,
                            "the metrics endpoint cannot be guarded as configured: {why}; /metrics answers 503 until it is fixed (tried again every {} s; the devices are served as usual)",
                            retry.as_secs()
                        );
                        said = Some(why.clone());
                    }
                    observe.metrics.access().guard_failed();
                    let refusing = serve(Access::refusing(setting));
                    tokio::pin!(refusing);
                    tokio::select! {
                        _ = &mut refusing => return,
                        _ = tokio::time::sleep(retry) => {}
                    }
                }
            }
        };
        if said.is_some() {
            tracing::info!(%address, "the metrics endpoint's guard is set up now: serving /metrics as configured");
        }
        serve(access).await
    }
}

/// Serves `/healthz` and `/readyz` alone on `address` (`metrics.probeAddress`), with their own
/// connections ([`super::http::serve_probes_forever`]).
#[derive(Clone, Debug)]
pub(crate) struct ProbeEndpoint {
    /// Where it listens.
    pub(crate) address: SocketAddr,
    /// What it serves.
    pub(crate) observe: Observe,
}

impl Task for ProbeEndpoint {
    async fn run(self) {
        super::http::serve_probes_forever(self.address, self.observe).await
    }
}

/// Why the guard cannot be set up.
struct Unguarded {
    /// What is at fault, for the client: the setting and key, without paths or errors.
    setting: String,
    /// The full reason, for the log.
    why: String,
}

/// What guards the metrics endpoint: the web configuration, loaded and checked now, and the
/// Kubernetes authorizer when asked for; `Err` says why either cannot be set up (the endpoint
/// then refuses `/metrics`).
async fn access(guard: &Guard, observe: &Observe) -> Result<Access, Unguarded> {
    let mut access = Access::default();
    if let Some(path) = guard.web_config_file.clone() {
        let metrics = observe.metrics.clone();
        let sandbox = guard.sandbox.clone();
        // Once per start or retry, never per request: tokio's blocking pool is fine here.
        let loaded = tokio::task::spawn_blocking(move || {
            Web::load_in(&path, sandbox, move |r| metrics.access().web_reload(r))
        })
        .await
        .map_err(|e| Unguarded {
            setting: "metrics.webConfigFile".into(),
            why: format!("loading the web configuration failed: {e}"),
        })?
        .map_err(|e| Unguarded {
            setting: format!("metrics.webConfigFile, key {}", e.key),
            why: format!("{e} (fix or unset metrics.webConfigFile)"),
        })?;
        let current = loaded.current();
        tracing::info!(
            file = %loaded.path().display(),
            tls = current.tls().is_some(),
            client_certificates = ?current.client_auth(),
            basic_auth = current.has_users(),
            "metrics endpoint web configuration loaded"
        );
        access.web = Some(Arc::new(loaded));
    }
    if let Some(authorizer) = &guard.authorizer {
        let authorizer = authorizer.clone().map_err(|why| Unguarded {
            setting: "metrics.authorization: kubernetes".into(),
            why: format!("metrics.authorization: kubernetes: {why}"),
        })?;
        if access.web.as_ref().is_some_and(|w| w.current().has_users()) {
            let why = "metrics.authorization: kubernetes and the web configuration's basic_auth_users both ask for the Authorization header: use one of them";
            return Err(Unguarded {
                setting: why.into(),
                why: why.into(),
            });
        }
        let tls = access
            .web
            .as_ref()
            .is_some_and(|w| w.current().tls().is_some());
        if !tls && !guard.allow_plain_http_tokens {
            return Err(Unguarded {
                setting: "metrics.authorization: kubernetes without TLS (set tls_server_config in metrics.webConfigFile, or metrics.allowPlainHttpTokens: true)".into(),
                why: "metrics.authorization: kubernetes over plain HTTP: bearer tokens could be read and replayed on the way; configure TLS (tls_server_config in metrics.webConfigFile) or set metrics.allowPlainHttpTokens: true".into(),
            });
        }
        access.authorizer = Some(authorizer);
    }
    Ok(access)
}

/// Tells the probes' listeners that the endpoint stopped listening, when dropped.
struct UnsetListening(Observe);

impl Drop for UnsetListening {
    fn drop(&mut self) {
        self.0.set_listening(None);
    }
}
