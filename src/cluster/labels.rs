//! Keeps dxdp's labels on its Node in step with the devices and the configuration: the complete
//! set (from `dxdp_core::labels`) is applied whenever it changes, and again when the Node shows
//! one of dxdp's labels with another value or without it (someone edited or removed it: pods
//! select nodes by these labels, so they are kept true). A `dxdp cleanup` while dxdp runs is
//! therefore undone at once; an uninstall stops the DaemonSet first (`super::cleanup`). Failed
//! applies are retried with backoff; the daemon never stops for them.
//!
//! With `nodeLabels.mode: nodefeature` the set goes into this node's NodeFeature object
//! (`super::nodefeature`) instead, for Node Feature Discovery to apply; the labels dxdp applied
//! to the Node before are removed then (an empty apply), and the Node is not watched for edits;
//! moving back to `node` mode in the same run deletes the object first. Every write is counted
//! in `dxdp_node_labels_writes_total{target, result}` (`observe::label_metrics`).
//!
//! The timestamp label (`<prefix>timestamp`, Unix seconds) is set when the rest of the set
//! changes, so that a refresh that changes nothing writes nothing; after a restart the old
//! timestamp is kept when the labels the Node (or the NodeFeature object) shows are the same.

use std::collections::BTreeMap;

use tokio::sync::watch;

use super::Cluster;
use crate::config::file::LabelMode;
use crate::config::{Config, NodeInfo};
use crate::inventory::{Inventory, InventoryRx};
use crate::observe::label_metrics::{LabelMetrics, WriteResult, WriteTarget};
use crate::util::retry::{random, Backoff};
use crate::util::task::Task;
use dxdp_core::devices::{PerResource, Resource};
use dxdp_core::labels::{all_labels, LabelSettings, INSTANCE_TYPE_LABEL, TIMESTAMP};
use dxdp_core::sharing::Sharing;

/// The labels for an inventory (empty when labels are off in its configuration), without the
/// timestamp; `node` is the Node as last seen (its instance type is the machine label).
pub(crate) fn desired(inventory: &Inventory, node: Option<&NodeInfo>) -> BTreeMap<String, String> {
    let config: &Config = &inventory.config;
    if !config.node_labels.enabled {
        return BTreeMap::new();
    }
    let mut enabled = PerResource::both(false);
    let mut replicas = PerResource::both(1);
    let mut sharing = PerResource::both(Sharing::Replicas(1));
    for r in Resource::ALL {
        *enabled.get_mut(r) = config.resources.get(&r).is_some_and(|s| s.enabled);
        *replicas.get_mut(r) = config.replicas(r);
        *sharing.get_mut(r) = config.sharing(r);
    }
    let settings = LabelSettings {
        prefix: config.node_labels.prefix.clone(),
        enabled,
        replicas,
        sharing,
        families: config.node_labels.families.clone(),
        machine: node.and_then(|n| n.labels.get(INSTANCE_TYPE_LABEL).cloned()),
    };
    all_labels(&inventory.discovery, &settings)
}

/// Where the labels go.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// On the Node.
    Node,
    /// Into the NodeFeature object in this namespace.
    NodeFeature(String),
}

/// The target an inventory's configuration asks for. Labels off in nodefeature mode empty the
/// object (and the Node), so that Node Feature Discovery removes what it applied.
fn target(inventory: &Inventory, namespace: Option<&str>) -> Result<Target, String> {
    let labels = &inventory.config.node_labels;
    match (labels.enabled, labels.mode, namespace) {
        (_, LabelMode::Nodefeature, Some(ns)) => Ok(Target::NodeFeature(ns.to_string())),
        (true, LabelMode::Nodefeature, None) => Err(
            "nodeLabels.mode is nodefeature, but POD_NAMESPACE is not set (the chart sets it from metadata.namespace): no NodeFeature object is written".into(),
        ),
        _ => Ok(Target::Node),
    }
}

/// `w` with the timestamp label `stamp` (none for an empty set: labels off).
fn stamped(w: &BTreeMap<String, String>, key: &str, stamp: &str) -> BTreeMap<String, String> {
    let mut full = w.clone();
    if !w.is_empty() {
        full.insert(key.to_string(), stamp.to_string());
    }
    full
}

/// The timestamp `shown` carries when it shows every label of `w` with its value (after a
/// restart: the set did not change, so neither does its timestamp).
fn kept_stamp(
    shown: &BTreeMap<String, String>,
    w: &BTreeMap<String, String>,
    key: &str,
) -> Option<String> {
    let stamp = shown.get(key)?;
    w.iter()
        .all(|(k, v)| shown.get(k) == Some(v))
        .then(|| stamp.clone())
}

fn now_seconds() -> String {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
        .to_string()
}

/// Whether the node shows every label of `want` with its value (a label missing or changed:
/// not).
fn node_has(node: &NodeInfo, want: &BTreeMap<String, String>) -> bool {
    want.iter().all(|(k, v)| node.labels.get(k) == Some(v))
}

/// Applies the labels of every inventory published on `inventory` until the inventory channel
/// closes. The first inventory is always applied, also with labels off (the empty set removes
/// the labels a previous run left); after that only a changed set is applied, or the same set
/// again when the Node (as `node` reports it) shows one of dxdp's labels with another value or
/// not at all (node mode only).
/// An apply that fails, or whose answer does not show the labels (a webhook or policy rewrote
/// them), is retried with backoff.
#[derive(Clone)]
pub(crate) struct KeepLabels {
    pub(crate) cluster: Cluster,
    pub(crate) inventory: InventoryRx,
    pub(crate) node: watch::Receiver<Option<NodeInfo>>,
    pub(crate) backoff: Backoff,
    /// The daemon's namespace (`POD_NAMESPACE`): where the NodeFeature object goes.
    pub(crate) namespace: Option<String>,
    /// Counts every write (`dxdp_node_labels_writes_total`).
    pub(crate) metrics: LabelMetrics,
}

impl KeepLabels {
    /// Applies `full` to `target`; `Ok` when the target shows it afterwards. Moving to a
    /// NodeFeature object first removes the labels dxdp applied to the Node (once: `cleared`);
    /// moving back to the Node first deletes the NodeFeature object written in the namespace
    /// `left` (once). Every write is counted (`dxdp_node_labels_writes_total`).
    async fn apply(
        &self,
        target: &Target,
        cleared: &mut bool,
        left: &mut Option<String>,
        full: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        let cluster = &self.cluster;
        let node = |result| self.metrics.count(WriteTarget::Node, result);
        let feature = |result| self.metrics.count(WriteTarget::NodeFeature, result);
        match target {
            Target::Node => {
                if let Some(ns) = left.clone() {
                    match cluster.delete_node_feature(&ns).await {
                        Ok(deleted) => {
                            feature(WriteResult::Ok);
                            if deleted {
                                tracing::info!(node = %cluster.node(), "nodeLabels.mode is node again: deleted the NodeFeature object {ns}/{}", super::nodefeature::object_name(cluster.node()));
                            }
                        }
                        // No right to delete it (the chart grants it in nodefeature mode only):
                        // not retried; `dxdp cleanup --namespace` deletes it.
                        Err(e) if e.status == Some(403) => {
                            feature(WriteResult::Forbidden);
                            tracing::warn!("nodeLabels.mode is node again, but the NodeFeature object stays (Node Feature Discovery keeps applying its labels): {}; delete it with `dxdp cleanup --node {} --namespace {ns}`", e.message, cluster.node());
                        }
                        Err(e) => {
                            feature(result_of(e.status, WriteTarget::NodeFeature));
                            return Err(e.message);
                        }
                    }
                    *left = None;
                }
                match cluster.apply_labels(full).await {
                    Ok(after) if node_has(&after, full) => {
                        node(WriteResult::Ok);
                        *cleared = full.is_empty();
                        Ok(())
                    }
                    Ok(_) => {
                        node(WriteResult::Error);
                        Err(format!(
                            "the API server accepted dxdp's labels for node {} but the Node does not show them (a mutating webhook or policy changed them?)",
                            cluster.node()
                        ))
                    }
                    Err(e) => {
                        node(result_of(e.status, WriteTarget::Node));
                        Err(e.to_string())
                    }
                }
            }
            Target::NodeFeature(ns) => {
                if !*cleared {
                    match cluster.apply_labels(&BTreeMap::new()).await {
                        Ok(_) => node(WriteResult::Ok),
                        Err(e) => {
                            node(result_of(e.status, WriteTarget::Node));
                            return Err(e.to_string());
                        }
                    }
                    *cleared = true;
                }
                let after = match cluster.apply_node_feature(ns, full).await {
                    Ok(after) => after,
                    Err(e) => {
                        feature(result_of(e.status, WriteTarget::NodeFeature));
                        return Err(e.message);
                    }
                };
                *left = Some(ns.clone());
                if &after == full {
                    feature(WriteResult::Ok);
                    Ok(())
                } else {
                    feature(WriteResult::Error);
                    Err(format!(
                        "the API server accepted the NodeFeature object of node {} but its spec.labels differ (a mutating webhook or policy changed them?)",
                        cluster.node()
                    ))
                }
            }
        }
    }

    /// What the target shows now, for keeping an old timestamp after a restart.
    async fn shown(&self, target: &Target) -> Option<BTreeMap<String, String>> {
        match target {
            Target::Node => {
                let seen = self.node.borrow().as_ref().map(|n| n.labels.clone());
                match seen {
                    Some(labels) => Some(labels),
                    // Not followed yet (at start): read it.
                    None => self.cluster.get().await.ok().map(|n| n.labels),
                }
            }
            Target::NodeFeature(ns) => self.cluster.node_feature_labels(ns).await.ok().flatten(),
        }
    }
}

/// The result label of a failed write answered with `status` (a 404 from NodeFeature: its CRD
/// is missing; from the Node: an error like any other).
fn result_of(status: Option<u16>, target: WriteTarget) -> WriteResult {
    match (status, target) {
        (Some(403), _) => WriteResult::Forbidden,
        (Some(404), WriteTarget::NodeFeature) => WriteResult::CrdMissing,
        _ => WriteResult::Error,
    }
}

/// What was applied last.
struct Applied {
    target: Target,
    /// The set without the timestamp.
    set: BTreeMap<String, String>,
    stamp: String,
    /// The set with the timestamp, as applied.
    full: BTreeMap<String, String>,
}

impl Task for KeepLabels {
    async fn run(self) {
        let mut inventory = self.inventory.clone();
        let mut node = self.node.clone();
        let backoff = self.backoff;
        let cluster = self.cluster.clone();
        let mut applied: Option<Applied> = None;
        // The Node carries none of dxdp's labels (an empty set was applied to it).
        let mut cleared = false;
        // The namespace of the NodeFeature object this run wrote (deleted on a move back to the
        // Node).
        let mut left: Option<String> = None;
        // The Node showed one of the applied labels with another value.
        let mut drifted = false;
        let mut node_open = true;
        let mut failures = 0u32;
        let mut last_error: Option<String> = None;
        loop {
            let (w, target, stamp_key) = {
                let inv = inventory.borrow_and_update();
                let shown = node.borrow().clone();
                let key = format!("{}{TIMESTAMP}", inv.config.node_labels.prefix);
                (
                    desired(&inv, shown.as_ref()),
                    target(&inv, self.namespace.as_deref()),
                    key,
                )
            };
            let outcome: Result<Option<Applied>, String> = match target {
                Err(why) => Err(why),
                Ok(target) => {
                    let same = applied
                        .as_ref()
                        .filter(|a| a.target == target && a.set == w)
                        .map(|a| a.stamp.clone());
                    if same.is_some() && !drifted {
                        Ok(None)
                    } else {
                        // The same set keeps its timestamp; a new set gets a new one, unless
                        // (after a restart) the target already shows it with one.
                        let stamp = match (same, &applied) {
                            (Some(stamp), _) => Some(stamp),
                            (None, None) => self
                                .shown(&target)
                                .await
                                .and_then(|s| kept_stamp(&s, &w, &stamp_key)),
                            (None, Some(_)) => None,
                        }
                        .unwrap_or_else(now_seconds);
                        let full = stamped(&w, &stamp_key, &stamp);
                        self.apply(&target, &mut cleared, &mut left, &full)
                            .await
                            .map(|()| {
                                Some(Applied {
                                    target,
                                    set: w,
                                    stamp,
                                    full,
                                })
                            })
                    }
                }
            };
            match outcome {
                Ok(None) => {}
                Ok(Some(done)) => {
                    if failures > 0 {
                        tracing::info!(node = %cluster.node(), "node labels applied after {failures} failed attempts");
                    }
                    let to = match &done.target {
                        Target::Node => "node".to_string(),
                        Target::NodeFeature(ns) => format!(
                            "NodeFeature {ns}/{}",
                            super::nodefeature::object_name(cluster.node())
                        ),
                    };
                    tracing::info!(node = %cluster.node(), labels = done.full.len(), to = %to, "node labels applied");
                    tracing::debug!(node = %cluster.node(), labels = ?done.full, "node labels");
                    applied = Some(done);
                    drifted = false;
                    failures = 0;
                    last_error = None;
                }
                Err(why) => {
                    failures = failures.saturating_add(1);
                    if last_error.as_deref() != Some(why.as_str()) {
                        tracing::warn!(
                            "cannot update the node labels, retrying with backoff: {why}"
                        );
                        last_error = Some(why);
                    }
                    let delay = backoff.delay(failures, random());
                    // Retry after the delay, or at once when the inventory changes.
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        r = inventory.changed() => if r.is_err() { return },
                    }
                    continue;
                }
            }
            tokio::select! {
                r = inventory.changed() => if r.is_err() { return },
                r = node.changed(), if node_open => match r {
                    Ok(()) => {
                        let shown = node.borrow_and_update().clone();
                        drifted = match (&shown, &applied) {
                            (Some(n), Some(a)) if a.target == Target::Node => !node_has(n, &a.full),
                            _ => false,
                        };
                    }
                    // No node updates any more: follow the inventory alone.
                    Err(_) => node_open = false,
                },
            }
        }
    }
}
