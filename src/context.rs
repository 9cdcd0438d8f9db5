//! What every feature of the running daemon reads: the [`Context`] the composition root
//! (`daemon`) builds once and hands to each feature's entry point (`plugin::serve`,
//! `telemetry`, `health`, `validation`), which returns its tasks for the supervisor.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;

use crate::cluster::Cluster;
use crate::config::{Config, NodeInfo};
use crate::inventory::InventoryRx;
use crate::observe::Observe;

/// The running daemon's shared state, built once by the composition root.
#[derive(Debug, Clone)]
pub(crate) struct Context {
    /// The configuration in force: only what passed the serving check (at start and on every
    /// update); a rejected configuration never reaches a feature.
    pub(crate) config: watch::Receiver<Arc<Config>>,
    /// The inventory served (devices and the configuration they were made with).
    pub(crate) inventory: InventoryRx,
    /// Metrics, health and readiness.
    pub(crate) observe: Observe,
    /// The API server client, when there is one (built once: the node's labels, the cluster
    /// features and the metrics authorizer all use it).
    pub(crate) cluster: Option<Cluster>,
    /// Whether an API server client was asked for (`dxdp plugin`), so that a feature without
    /// one says why; `false` when the daemon runs without one by choice (`dxdp demo`, tests).
    pub(crate) cluster_asked: bool,
    /// The node's labels, followed when there is an API server client.
    pub(crate) node: Option<watch::Receiver<Option<NodeInfo>>>,
    /// The kubelet's device-plugin directory.
    pub(crate) kubelet_dir: PathBuf,
    /// The variables that are inputs of the daemon (`NODE_NAME`, `POD_NAMESPACE`), as the
    /// configuration's environment has them.
    pub(crate) env: crate::config::Env,
}
