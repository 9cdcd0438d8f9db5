//! Keeps dxdp's labels on its Node in step with the devices and the configuration: the complete
//! set (from `dxdp_core::labels`) is applied whenever it changes, and again when the Node shows
//! one of dxdp's labels with another value (someone edited it). Failed applies are retried with
//! backoff; the daemon never stops for them.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;

use super::Cluster;
use crate::config::{Config, NodeInfo};
use crate::plugin::inventory::Inventory;
use crate::plugin::register::{random, Backoff};
use dxdp_core::devices::{PerResource, Resource};
use dxdp_core::labels::{node_labels, LabelSettings};

/// The labels for an inventory (empty when labels are off in its configuration).
pub fn desired(inventory: &Inventory) -> BTreeMap<String, String> {
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

/// Whether the node shows every label of `want` with its value.
fn node_has(node: &NodeInfo, want: &BTreeMap<String, String>) -> bool {
    want.iter().all(|(k, v)| node.labels.get(k) == Some(v))
}

/// Applies the labels of every inventory published on `inventory` until both channels close.
/// Labels are only applied once an inventory has labels on (`nodeLabels.enabled`); turning them
/// off later applies the empty set once, which removes dxdp's labels.
pub async fn keep(
    cluster: Cluster,
    mut inventory: watch::Receiver<Option<Arc<Inventory>>>,
    mut node: watch::Receiver<Option<NodeInfo>>,
    backoff: Backoff,
) {
    let mut applied: Option<BTreeMap<String, String>> = None;
    let mut failures = 0u32;
    let mut last_error: Option<String> = None;
    loop {
        let want = inventory.borrow_and_update().as_deref().map(desired);
        let on_node = node.borrow_and_update().clone();
        let needed = match (&want, &applied) {
            (None, _) => false,
            // Never applied and nothing to apply (labels off): leave the Node alone.
            (Some(w), None) => !w.is_empty(),
            (Some(w), Some(a)) => w != a || on_node.as_ref().is_some_and(|n| !node_has(n, w)),
        };
        if needed {
            let Some(w) = want else { continue };
            match cluster.apply_labels(&w).await {
                Ok(_) => {
                    if failures > 0 || last_error.is_some() {
                        tracing::info!(node = %cluster.node(), "node labels applied after {failures} failed attempts");
                    }
                    tracing::info!(node = %cluster.node(), labels = w.len(), "node labels applied");
                    tracing::debug!(node = %cluster.node(), labels = ?w, "node labels");
                    applied = Some(w);
                    failures = 0;
                    last_error = None;
                    continue;
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    let why = e.to_string();
                    if last_error.as_deref() != Some(why.as_str()) {
                        tracing::warn!(
                            "cannot update the node labels, retrying with backoff: {why}"
                        );
                        last_error = Some(why);
                    }
                    let delay = backoff.delay(failures, random());
                    // Retry after the delay, or at once when something changes.
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
            r = node.changed() => if r.is_err() {
                // No node updates any more: follow the inventory alone.
                if inventory.changed().await.is_err() { return }
            },
        }
    }
}
