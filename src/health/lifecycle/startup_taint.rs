//! The startup taint (`startupTaint`): a taint the node registers with (kubelet
//! `--register-with-taints`, an AKS or EKS node-pool taint; docs/install.md#startup-taint) so
//! that no GPU pod lands before its GPUs are schedulable. dxdp removes it once the Node's
//! `status.allocatable` shows every served resource with its healthy devices (the same reading
//! as `/readyz`, `health::capacity`), at least one served device is Healthy, and, with
//! `validation.gate`, the node's `directx.microsoft.com/validated` label is `true`
//! (`dxdp_core::lifecycle::startup_taint`).
//!
//! Only the configured key with the configured effect is ever removed (its value is not
//! compared); with `startupTaint` empty dxdp touches no taint. dxdp never puts it back: a
//! driver change reruns validation, whose result shows in the `validated` label and
//! `GPUValidationFailed` Events, and device health keeps Unhealthy GPUs out of allocation.
//! The removal is a read-modify-write of `spec.taints` conditional on the Node's
//! `resourceVersion` (`cluster::node_update`); a failure is logged once, counted and retried
//! with backoff.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Taint};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cluster::{say_once, Cluster};
use crate::config::{Config, NodeInfo};
use crate::health::capacity;
use crate::health::events::served_devices;
use crate::inventory::InventoryRx;
use crate::observe::remediation_metrics::{NodeChange, RemediationMetrics};
use crate::util::retry::{random, Backoff};
use crate::util::sleep_until;
use crate::util::task::Task;
use dxdp_core::lifecycle::{startup_taint, ManagedTaint, StartupFacts, StartupTaint};

/// The validation label the gate reads.
const VALIDATED_LABEL: &str = "directx.microsoft.com/validated";

/// What a 403 or an admission refusal of the removal asks for.
const GRANT: &str = "grant patch on nodes (the chart does with nodeApi.enabled) and, with the chart's own-node admission policy, set startupTaint in the chart's values so that the policy allows its removal";

/// The patch that removes `taint` from `node` (`None`: the node does not have it).
fn removal(node: &Node, taint: &ManagedTaint) -> Option<(serde_json::Value, ())> {
    let taints: Vec<Taint> =
        (node.spec.as_ref().and_then(|s| s.taints.clone())).unwrap_or_default();
    if !taints.iter().any(|t| taint.matches(&t.key, &t.effect)) {
        return None;
    }
    let rest: Vec<&Taint> = taints
        .iter()
        .filter(|t| !taint.matches(&t.key, &t.effect))
        .collect();
    Some((serde_json::json!({"spec": {"taints": rest}}), ()))
}

/// Removes the startup taint when its time comes: its inputs, cloned for every (re)start.
#[derive(Debug, Clone)]
pub struct RemoveStartupTaint {
    /// The API server.
    pub cluster: Cluster,
    /// The Node as followed (`None` until it was read).
    pub node: watch::Receiver<Option<NodeInfo>>,
    /// The served inventory.
    pub inventory: InventoryRx,
    /// The configuration (`startupTaint`, `validation.gate`, `validation.enabled`).
    pub config: watch::Receiver<Arc<Config>>,
    /// Where removals are counted.
    pub metrics: RemediationMetrics,
    /// Retries of failed removals.
    pub backoff: Backoff,
}

impl Task for RemoveStartupTaint {
    async fn run(self) {
        let RemoveStartupTaint {
            cluster,
            mut node,
            mut inventory,
            mut config,
            metrics,
            backoff,
        } = self;
        let mut failures = 0u32;
        let mut last_error: Option<String> = None;
        let mut said: Option<String> = None;
        let mut retry_at: Option<Instant> = None;
        let (mut node_open, mut inventory_open, mut config_open) = (true, true, true);
        loop {
            let c = config.borrow_and_update().clone();
            let info = node.borrow_and_update().clone();
            let inv = inventory.borrow_and_update().clone();
            let mut wake = None;
            match (&c.startup_taint, &info) {
                (None, _) => metrics.set_taint_present(false),
                (Some(_), None) => {}
                (Some(taint), Some(info)) => {
                    let present = info.taints.iter().any(|(k, e)| taint.matches(k, e));
                    metrics.set_taint_present(present);
                    let gaps = capacity::gaps(&inv, &info.allocatable);
                    let healthy = served_devices(&inv)
                        .filter(|d| d.health.is_healthy())
                        .count();
                    let facts = StartupFacts {
                        healthy_served: healthy,
                        capacity_gaps: &gaps,
                        gate: c.validation.gate,
                        validation_enabled: c.validation.enabled,
                        validated: info.labels.get(VALIDATED_LABEL).map(String::as_str),
                    };
                    match (present, startup_taint(&facts)) {
                        (false, _) => said = None,
                        (true, StartupTaint::Keep(why)) => {
                            if said.as_deref() != Some(why.as_str()) {
                                tracing::info!(taint = %taint, "the startup taint stays: {why}");
                                said = Some(why);
                            }
                        }
                        (true, StartupTaint::Remove)
                            if retry_at.is_some_and(|t| Instant::now() < t) =>
                        {
                            wake = retry_at;
                        }
                        (true, StartupTaint::Remove) => {
                            match cluster.update_node(GRANT, |n| removal(n, taint)).await {
                                Ok(done) => {
                                    if done.is_some() {
                                        metrics.taint_removal(NodeChange::Removed);
                                        tracing::info!(node = %cluster.node(), taint = %taint, "startup taint removed: the Node shows every served resource with its healthy GPUs{}", if c.validation.gate { ", and validation passed" } else { "" });
                                    }
                                    metrics.set_taint_present(false);
                                    failures = 0;
                                    last_error = None;
                                    retry_at = None;
                                }
                                Err(why) => {
                                    metrics.taint_removal(NodeChange::Error);
                                    failures = failures.saturating_add(1);
                                    say_once(
                                        &mut last_error,
                                        why,
                                        "cannot remove the startup taint from the node",
                                    );
                                    retry_at =
                                        Some(Instant::now() + backoff.delay(failures, random()));
                                    wake = retry_at;
                                }
                            }
                        }
                    }
                }
            }
            if !node_open && !inventory_open && !config_open && wake.is_none() {
                std::future::pending::<()>().await;
            }
            tokio::select! {
                changed = node.changed(), if node_open => node_open = changed.is_ok(),
                changed = inventory.changed(), if inventory_open => inventory_open = changed.is_ok(),
                changed = config.changed(), if config_open => config_open = changed.is_ok(),
                () = sleep_until(wake) => {}
            }
        }
    }
}
