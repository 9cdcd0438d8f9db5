//! The node's own Kubernetes object: who this node is (`NODE_NAME`), the API server connection
//! (in-cluster service account or `KUBECONFIG`, rustls), reading the Node, and applying dxdp's
//! labels to it with server-side apply.
//!
//! - `labels`: keeps the Node's labels in step with the devices and the configuration;
//! - [`node`]: follows the Node (its labels select a named configuration);
//! - [`events`]: what every Event dxdp creates shares (the Warning builder, the deduplication
//!   and rate limit, creating one and classifying a refusal, the one sender of a feature's
//!   Events);
//! - [`isolation_events`]: `GPUIsolationViolation` Events on the pod using a GPU it was not
//!   allocated (`isolation.events`);
//! - [`taint`]: the node taint of `isolation.policy: taint` while a violation lasts;
//! - `node_update`: a read-modify-write of the Node conditional on its `resourceVersion` (the
//!   startup taint, the cordon of `health.remediation`);
//! - `cleanup`: takes dxdp's labels, taint and conditions off a node, after stopping its
//!   DaemonSet and deleting its validation Jobs (`dxdp cleanup`);
//! - [`metrics_authz`]: TokenReview and SubjectAccessReview of `/metrics` requests
//!   (`metrics.authorization: kubernetes`; unlike the rest, required once asked for);
//!
//! Device health (`GPUUnhealthy` Events, node conditions, the capacity gate) and the validation
//! Jobs are features of their own (`health/`, `validation/`) built on this client.
//!
//! Everything here is optional: without `NODE_NAME` or credentials the daemon serves devices
//! as before and says once why the cluster features are off. API errors are retried with
//! backoff and never stop the daemon.

pub(crate) mod cleanup;
pub mod events;
pub mod isolation_events;
pub(crate) mod labels;
pub mod metrics_authz;
pub mod node;
pub(crate) mod node_update;
pub(crate) mod nodefeature;
pub mod taint;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};

use tokio::sync::watch;

use crate::config::NodeInfo;
use crate::inventory::InventoryRx;
use crate::supervisor::{Role, TaskSpec};
use crate::util::errors::chain;
use crate::util::host_process::{under_sandbox, SANDBOX_VAR};
use crate::util::retry::Backoff;

/// The field manager of dxdp's server-side applies: the labels it sets are owned by it, so a
/// label it stops setting is removed and labels it never set are untouched.
pub(crate) const FIELD_MANAGER: &str = "dxdp";

/// The field manager of the validation's labels: separate from dxdp's other labels, so that the
/// two sets never remove each other's keys.
pub(crate) const VALIDATION_FIELD_MANAGER: &str = "dxdp-validation";

/// The environment variable naming this node (the chart sets it from `spec.nodeName`).
pub const NODE_NAME_VAR: &str = "NODE_NAME";

/// Retries of API server calls (node labels, following the node, Events, taint, conditions,
/// validation labels): 1 s doubling to 60 s, with jitter.
pub(crate) const API_BACKOFF: Backoff = Backoff {
    initial: Duration::from_secs(1),
    max: Duration::from_secs(60),
    timeout: Duration::from_secs(30),
};

/// The node labels and the node watch (optional tasks): the Node's labels follow the served
/// inventory, and `node` follows the Node's labels (re-read every `safety_poll` when watching
/// is forbidden).
pub(crate) fn node_tasks(
    cluster: &Cluster,
    inventory: &InventoryRx,
    node: watch::Sender<Option<NodeInfo>>,
    safety_poll: Duration,
    namespace: Option<String>,
    metrics: crate::observe::label_metrics::LabelMetrics,
) -> Vec<TaskSpec> {
    let labels = labels::KeepLabels {
        cluster: cluster.clone(),
        inventory: inventory.clone(),
        node: node.subscribe(),
        backoff: API_BACKOFF,
        namespace,
        metrics,
    };
    let follow = node::FollowNode {
        cluster: cluster.clone(),
        tx: node,
        backoff: API_BACKOFF,
        poll: safety_poll,
    };
    vec![
        TaskSpec::task("node-labels", Role::Optional, labels),
        TaskSpec::task("node-watch", Role::Optional, follow),
    ]
}

/// Why the cluster features are off.
#[derive(Debug, thiserror::Error)]
pub enum Off {
    /// `NODE_NAME` is unset or empty.
    #[error("NODE_NAME is not set (the chart sets it from spec.nodeName)")]
    NoNodeName,
    /// No in-cluster service account and no usable kubeconfig.
    #[error("no Kubernetes credentials found (no in-cluster service account, no usable KUBECONFIG or ~/.kube/config): {0}")]
    NoCredentials(String),
    /// The client could not be built from the credentials.
    #[error("cannot build a Kubernetes client: {0}")]
    Client(String),
}

/// An API call failed.
#[derive(Debug, thiserror::Error)]
#[error("{what} node {node}: {reason}")]
pub struct ApiError {
    /// What was attempted (`get`, `apply labels to`, `watch`).
    pub(crate) what: &'static str,
    /// The node.
    pub(crate) node: String,
    /// The error and its causes, each once.
    pub(crate) reason: String,
    /// The HTTP status the API server answered with, when it answered (`None`: no answer, a
    /// timeout, a connection or decoding error). Code decides on this, never on `reason`.
    pub(crate) status: Option<u16>,
}

/// How long one API call (not a watch) may take before it counts as failed and is retried:
/// a half-open connection must not stall labels or the configuration selection for ever.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// This node's object on the API server.
#[derive(Clone)]
pub struct Cluster {
    pub(crate) client: kube::Client,
    /// The same API server without kube-rs's own retries of 429, 503 and 504 (which it makes
    /// with backoff up to 15 times): for evictions, where a 429 is a PodDisruptionBudget's
    /// answer that dxdp counts and retries itself (`health::lifecycle::evict`).
    pub(crate) answer_client: kube::Client,
    pub(crate) api: Api<Node>,
    pub(crate) node: String,
    pub(crate) timeout: Duration,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("node", &self.node).finish()
    }
}

impl Cluster {
    /// Connects the standard way (see `credentials`). `node_name` is `NODE_NAME`'s value.
    pub async fn connect(node_name: Option<&str>) -> Result<Cluster, Off> {
        let node = node_name
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .ok_or(Off::NoNodeName)?;
        let config = credentials().await?;
        Cluster::with_config(config, node)
    }

    /// A client for the API server at `url` without credentials (a local stand-in or
    /// `kubectl proxy`).
    #[cfg(any(test, feature = "test-support"))]
    pub fn at_url(url: &str, node: &str) -> Result<Cluster, Off> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| Off::Client(format!("{url}: {e}")))?;
        Cluster::with_config(kube::Config::new(uri), node)
    }

    fn with_config(config: kube::Config, node: &str) -> Result<Cluster, Off> {
        let mut single = config.clone();
        single.default_retry = false;
        let client = kube::Client::try_from(config).map_err(|e| Off::Client(chain(&e)))?;
        let answer_client = kube::Client::try_from(single).map_err(|e| Off::Client(chain(&e)))?;
        Ok(Cluster {
            answer_client,
            api: Api::all(client.clone()),
            client,
            node: node.to_string(),
            timeout: CALL_TIMEOUT,
        })
    }

    /// The API server client (shared: a clone is a handle to the same connection pool).
    pub(crate) fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// Runs one API call within the call timeout.
    pub(crate) async fn call<T>(
        &self,
        what: &'static str,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ApiError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result.map_err(|e| self.error(what, &e)),
            Err(_) => Err(ApiError {
                what,
                node: self.node.clone(),
                reason: format!(
                    "the API server did not answer within {} s",
                    self.timeout.as_secs_f64()
                ),
                status: None,
            }),
        }
    }

    /// The node's name.
    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// The node's name and labels now.
    pub async fn get(&self) -> Result<NodeInfo, ApiError> {
        let node = self.get_node().await?;
        Ok(node_info(&node, &self.node))
    }

    /// The node object now (within the call timeout).
    pub(crate) async fn get_node(&self) -> Result<Node, ApiError> {
        self.call("get", self.api.get(&self.node)).await
    }

    /// Applies `labels` as dxdp's complete set (server-side apply, field manager
    /// `FIELD_MANAGER`, forced): keys dxdp applied before and not now are removed.
    pub async fn apply_labels(
        &self,
        labels: &BTreeMap<String, String>,
    ) -> Result<NodeInfo, ApiError> {
        self.apply_labels_as(FIELD_MANAGER, labels).await
    }

    /// Applies `labels` as field manager `manager` (forced): the labels `manager` applied before
    /// and no longer sets are removed, everyone else's are left alone.
    pub(crate) async fn apply_labels_as(
        &self,
        manager: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<NodeInfo, ApiError> {
        let body = apply_body(&self.node, labels);
        let params = PatchParams::apply(manager).force();
        let node = self
            .call(
                "apply labels to",
                self.api.patch(&self.node, &params, &Patch::Apply(&body)),
            )
            .await?;
        Ok(node_info(&node, &self.node))
    }

    fn error(&self, what: &'static str, e: &kube::Error) -> ApiError {
        ApiError {
            what,
            node: self.node.clone(),
            reason: chain(e),
            status: match e {
                kube::Error::Api(status) => Some(status.code),
                _ => None,
            },
        }
    }
}

/// Finds credentials: in a pod (`KUBERNETES_SERVICE_HOST` set) the pod's service account only
/// (at the standard path, else where containerd 1.6 mounts it in a HostProcess container): a
/// HostProcess container also sees the host's files, and a kubeconfig there is not the pod's, so
/// a pod without its service account has no credentials rather than the host's. Outside a pod,
/// `KUBECONFIG` or `~/.kube/config`. Which credentials are used is said once per process.
async fn credentials() -> Result<kube::Config, Off> {
    let in_pod = std::env::var("KUBERNETES_SERVICE_HOST").is_ok_and(|h| !h.is_empty());
    let (config, used) = if in_pod {
        let env = |name: &str| std::env::var(name).ok();
        match kube::Config::incluster() {
            Ok(config) => (config, CredentialSource::ServiceAccount),
            Err(standard) => {
                let Some(kubeconfig) =
                    sandbox_kubeconfig(env, |p| std::path::Path::new(p).exists())
                else {
                    return Err(Off::NoCredentials(format!(
                        "in a pod (KUBERNETES_SERVICE_HOST is set) without its service account ({}; none under CONTAINER_SANDBOX_MOUNT_POINT either); dxdp does not fall back to the host's kubeconfig in a pod: mount the service account token (automountServiceAccountToken: true, as the chart does)",
                        chain(&standard)
                    )));
                };
                let kubeconfig: kube::config::Kubeconfig = serde_json::from_value(kubeconfig)
                    .map_err(|e| Off::NoCredentials(e.to_string()))?;
                let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                    .await
                    .map_err(|e| Off::NoCredentials(chain(&e)))?;
                (config, CredentialSource::SandboxServiceAccount)
            }
        }
    } else {
        let config = kube::Config::infer()
            .await
            .map_err(|e| Off::NoCredentials(chain(&e)))?;
        (config, CredentialSource::Kubeconfig)
    };
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        tracing::info!(server = %config.cluster_url, "Kubernetes credentials: {}", used.describe());
    });
    Ok(config)
}

/// Where the API server credentials came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CredentialSource {
    /// The pod's service account at the standard path.
    ServiceAccount,
    /// The pod's service account under `CONTAINER_SANDBOX_MOUNT_POINT` (containerd 1.6
    /// HostProcess containers).
    SandboxServiceAccount,
    /// Outside a pod: `KUBECONFIG` or `~/.kube/config`.
    Kubeconfig,
}

impl CredentialSource {
    fn describe(self) -> &'static str {
        match self {
            CredentialSource::ServiceAccount => "the pod's service account",
            CredentialSource::SandboxServiceAccount => {
                "the pod's service account under CONTAINER_SANDBOX_MOUNT_POINT (containerd 1.6 HostProcess container)"
            }
            CredentialSource::Kubeconfig => "KUBECONFIG or ~/.kube/config (not in a pod)",
        }
    }
}

/// The service account of a HostProcess container on containerd 1.6, which mounts it under
/// `%CONTAINER_SANDBOX_MOUNT_POINT%` rather than at `C:\var\run\secrets\...` (where the
/// standard in-cluster configuration looks), as a kubeconfig document. `None` outside such a
/// container or without a token there.
pub(crate) fn sandbox_kubeconfig(
    env: impl Fn(&str) -> Option<String>,
    exists: impl Fn(&str) -> bool,
) -> Option<serde_json::Value> {
    let host = env("KUBERNETES_SERVICE_HOST").filter(|h| !h.is_empty())?;
    let port = env("KUBERNETES_SERVICE_PORT").filter(|p| !p.is_empty())?;
    let root = env(SANDBOX_VAR).filter(|r| !r.is_empty())?;
    let dir = under_sandbox(&root, r"\var\run\secrets\kubernetes.io\serviceaccount")?;
    let token = format!("{dir}\\token");
    if !exists(&token) {
        return None;
    }
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    Some(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "in-cluster", "cluster": {
            "server": format!("https://{host}:{port}"),
            "certificate-authority": format!("{dir}\\ca.crt"),
        }}],
        "users": [{"name": "service-account", "user": {"tokenFile": token}}],
        "contexts": [{"name": "in-cluster", "context": {"cluster": "in-cluster", "user": "service-account"}}],
        "current-context": "in-cluster",
    }))
}

/// The server-side apply body for `labels` on `node`.
pub(crate) fn apply_body(node: &str, labels: &BTreeMap<String, String>) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node, "labels": labels},
    })
}

fn node_info(node: &Node, name: &str) -> NodeInfo {
    NodeInfo {
        name: node
            .metadata
            .name
            .clone()
            .unwrap_or_else(|| name.to_string()),
        labels: node.metadata.labels.clone().unwrap_or_default(),
        allocatable: node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .map(|a| a.iter().map(|(k, q)| (k.clone(), q.0.clone())).collect())
            .unwrap_or_default(),
        taints: (node.spec.as_ref().and_then(|s| s.taints.as_ref()))
            .into_iter()
            .flatten()
            .map(|t| (t.key.clone(), t.effect.clone()))
            .collect(),
        unschedulable: node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false),
        annotations: (node.metadata.annotations.iter().flatten())
            .filter(|(k, _)| k.starts_with(DXDP_ANNOTATION_PREFIX))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    }
}

/// The prefix of the Node annotations dxdp reads (its cordon mark).
pub(crate) const DXDP_ANNOTATION_PREFIX: &str = "directx.microsoft.com/";

/// Logs a failure of a cluster task the first time it is seen (debug after), so that an outage
/// is said once.
pub(crate) fn say_once(last: &mut Option<String>, why: String, what: &str) {
    if last.as_deref() != Some(why.as_str()) {
        tracing::warn!("{what}: {why}; retrying with backoff (device serving is not affected)");
        *last = Some(why);
    } else {
        tracing::debug!("{what}: {why}");
    }
}

#[cfg(test)]
pub(crate) mod tests;
