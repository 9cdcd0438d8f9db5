//! Keeps dxdp's labels on its Node in step with the devices and the configuration: the complete
//! set (from `dxdp_core::labels`) is applied whenever it changes, and again when the Node shows
//! one of dxdp's labels with another value or without it (someone edited or removed it: pods
//! select nodes by these labels, so they are kept true). A `dxdp cleanup` while dxdp runs is
//! therefore undone at once; an uninstall stops the DaemonSet first (`super::cleanup`). Failed
//! applies are retried with backoff; the daemon never stops for them.

use std::collections::BTreeMap;

use tokio::sync::watch;

use super::Cluster;
use crate::config::{Config, NodeInfo};
use crate::inventory::{Inventory, InventoryRx};
use crate::util::retry::{random, Backoff};
use crate::util::task::Task;
use dxdp_core::devices::{PerResource, Resource};
use dxdp_core::labels::{node_labels, LabelSettings};

/// The labels for an inventory (empty when labels are off in its configuration).
pub(crate) fn desired(inventory: &Inventory) -> BTreeMap<String, String> {
    let config: &Config = &inventory.config;
    if !config.node_labels.enabled {
        return BTreeMap::new();
    }
    let mut enabled = PerResource::both(false);
    let mut replicas = PerResource::both(1);
    for r in Resource::ALL {
        *enabled.get_mut(r) = config.resources.get(&r).is_some_and(|s| s.enabled);
        *replicas.get_mut(r) = config.replicas(r);
    }
    let settings = LabelSettings {
        prefix: config.node_labels.prefix.clone(),
        enabled,
        replicas,
    };
    node_labels(&inventory.discovery, &settings)
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
/// not at all.
/// An apply that fails, or whose answer does not show the labels (a webhook or policy rewrote
/// them), is retried with backoff.
#[derive(Clone)]
pub(crate) struct KeepLabels {
    pub(crate) cluster: Cluster,
    pub(crate) inventory: InventoryRx,
    pub(crate) node: watch::Receiver<Option<NodeInfo>>,
    pub(crate) backoff: Backoff,
}

impl Task for KeepLabels {
    async fn run(self) {
        let KeepLabels {
            cluster,
            mut inventory,
            mut node,
            backoff,
        } = self;
        let mut applied: Option<BTreeMap<String, String>> = None;
        // The Node showed one of the applied labels with another value.
        let mut drifted = false;
        let mut node_open = true;
        let mut failures = 0u32;
        let mut last_error: Option<String> = None;
        loop {
            let w = desired(&inventory.borrow_and_update());
            let needed = match &applied {
                None => true,
                Some(a) => &w != a || drifted,
            };
            if needed {
                let outcome = match cluster.apply_labels(&w).await {
                    Ok(after) if node_has(&after, &w) => Ok(()),
                    Ok(_) => Err(format!(
                        "the API server accepted dxdp's labels for node {} but the Node does not show them (a mutating webhook or policy changed them?)",
                        cluster.node()
                    )),
                    Err(e) => Err(e.to_string()),
                };
                match outcome {
                    Ok(()) => {
                        if failures > 0 {
                            tracing::info!(node = %cluster.node(), "node labels applied after {failures} failed attempts");
                        }
                        tracing::info!(node = %cluster.node(), labels = w.len(), "node labels applied");
                        tracing::debug!(node = %cluster.node(), labels = ?w, "node labels");
                        applied = Some(w);
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
            }
            tokio::select! {
                r = inventory.changed() => if r.is_err() { return },
                r = node.changed(), if node_open => match r {
                    Ok(()) => {
                        let shown = node.borrow_and_update().clone();
                        drifted = match (&shown, &applied) {
                            (Some(n), Some(a)) => !node_has(n, a),
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
