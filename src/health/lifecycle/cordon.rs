//! `health.remediation.cordon`: cordons the node (`spec.unschedulable: true`) once every served
//! device has been Unhealthy for `health.remediation.gracePeriod` (the node-level fatal signal,
//! `dxdp_core::lifecycle::node_fatal`), marks that cordon as its own with the annotation
//! [`CORDON_MARK`], and lifts only a cordon so marked once a served device is Healthy again.
//!
//! A cordon an operator placed is never marked nor lifted; an operator who uncordons dxdp's
//! cordon is respected (the mark is removed, and dxdp does not cordon again until the signal
//! clears and comes back: `dxdp_core::lifecycle::cordon_want`). Running pods are not touched
//! (that is `health.remediation.evictPods`). Turned off, dxdp leaves the node as it is (a cordon
//! it placed stays until `kubectl uncordon`). Every change is a read-modify-write conditional on
//! the Node's `resourceVersion`; a failure is logged once, counted and retried with backoff.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cluster::{say_once, Cluster};
use crate::config::{Config, NodeInfo};
use crate::health::events::served_devices;
use crate::inventory::InventoryRx;
use crate::observe::remediation_metrics::{NodeChange, RemediationMetrics};
use crate::util::retry::{random, Backoff};
use crate::util::sleep_until;
use crate::util::task::Task;
use dxdp_core::lifecycle::{cordon_want, node_fatal, CordonFacts, CordonWant};

/// The annotation that marks a cordon as dxdp's (its value says why and since when).
pub const CORDON_MARK: &str = "directx.microsoft.com/cordoned-by-dxdp";

/// What a 403 or an admission refusal asks for.
const GRANT: &str = "grant patch on nodes (the chart does with health.remediation.cordon) and, with the chart's own-node admission policy, set health.remediation.cordon in the chart's values so that the policy allows the cordon";

fn marked(node: &Node) -> bool {
    (node.metadata.annotations.as_ref()).is_some_and(|a| a.contains_key(CORDON_MARK))
}

fn unschedulable(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

/// The patch of `want` for `node` as it is now (`None`: nothing to do any more).
fn patch(node: &Node, want: CordonWant, why: &str) -> Option<(serde_json::Value, ())> {
    let body = match want {
        CordonWant::Cordon if !unschedulable(node) => serde_json::json!({
            "metadata": {"annotations": {CORDON_MARK: why}},
            "spec": {"unschedulable": true},
        }),
        CordonWant::Uncordon if unschedulable(node) && marked(node) => serde_json::json!({
            "metadata": {"annotations": {CORDON_MARK: null}},
            "spec": {"unschedulable": null},
        }),
        CordonWant::ClearMark if !unschedulable(node) && marked(node) => {
            serde_json::json!({"metadata": {"annotations": {CORDON_MARK: null}}})
        }
        _ => return None,
    };
    Some((body, ()))
}

/// Keeps dxdp's cordon: its inputs, cloned for every (re)start.
#[derive(Debug, Clone)]
pub struct KeepCordon {
    /// The API server.
    pub cluster: Cluster,
    /// The Node as followed (`None` until it was read).
    pub node: watch::Receiver<Option<NodeInfo>>,
    /// The served inventory.
    pub inventory: InventoryRx,
    /// The configuration (`health.remediation`).
    pub config: watch::Receiver<Arc<Config>>,
    /// Where cordons are counted.
    pub metrics: RemediationMetrics,
    /// Retries of failed changes.
    pub backoff: Backoff,
}

impl Task for KeepCordon {
    async fn run(self) {
        let KeepCordon {
            cluster,
            mut node,
            mut inventory,
            mut config,
            metrics,
            backoff,
        } = self;
        let mut fatal_since: Option<(Instant, u64)> = None;
        let mut acted = false;
        let mut failures = 0u32;
        let mut last_error: Option<String> = None;
        let mut retry_at: Option<Instant> = None;
        let (mut node_open, mut inventory_open, mut config_open) = (true, true, true);
        loop {
            let settings = config.borrow_and_update().remediation;
            let info = node.borrow_and_update().clone();
            let inv = inventory.borrow_and_update().clone();
            let now = Instant::now();
            let mut wake = None;
            let served = served_devices(&inv).count();
            let unhealthy = served_devices(&inv)
                .filter(|d| !d.health.is_healthy())
                .count();
            if settings.cordon && node_fatal(served, unhealthy) {
                fatal_since.get_or_insert((now, crate::inventory::now_ms()));
            } else {
                fatal_since = None;
                acted = false;
            }
            if let Some(info) = info.as_ref() {
                let mark = info.annotations.contains_key(CORDON_MARK);
                metrics.set_cordoned(info.unschedulable && mark);
                let want = if settings.cordon {
                    cordon_want(CordonFacts {
                        fatal_for: fatal_since.map(|(t, _)| now.saturating_duration_since(t)),
                        grace: settings.grace_period,
                        unschedulable: info.unschedulable,
                        marked: mark,
                        acted_this_episode: acted,
                    })
                } else {
                    CordonWant::Leave
                };
                if want == CordonWant::Leave {
                    if let Some((t, _)) = fatal_since.filter(|_| !acted && !info.unschedulable) {
                        let due = t + settings.grace_period;
                        if due > now {
                            wake = Some(due);
                        }
                    }
                } else if retry_at.is_some_and(|t| now < t) {
                    wake = retry_at;
                } else {
                    let since = fatal_since
                        .map(|(_, ms)| dxdp_core::health::eventlog::format_time(ms))
                        .unwrap_or_default();
                    let why = format!("every served GPU ({served}) Unhealthy since {since}, longer than health.remediation.gracePeriod");
                    match cluster.update_node(GRANT, |n| patch(n, want, &why)).await {
                        Ok(done) => {
                            failures = 0;
                            last_error = None;
                            retry_at = None;
                            match (want, done) {
                                (CordonWant::Cordon, Some(())) => {
                                    acted = true;
                                    metrics.cordon(NodeChange::Cordoned);
                                    metrics.set_cordoned(true);
                                    tracing::warn!(node = %cluster.node(), "node cordoned (health.remediation.cordon): {why}; dxdp lifts this cordon once a served GPU is Healthy again");
                                }
                                (CordonWant::Cordon, None) => {
                                    // Someone cordoned it meanwhile: theirs, not dxdp's.
                                    acted = true;
                                }
                                (CordonWant::Uncordon, Some(())) => {
                                    metrics.cordon(NodeChange::Uncordoned);
                                    metrics.set_cordoned(false);
                                    tracing::info!(node = %cluster.node(), "dxdp's cordon lifted: a served GPU is Healthy again");
                                }
                                (CordonWant::ClearMark, _) => {
                                    acted = true;
                                    metrics.set_cordoned(false);
                                    tracing::info!(node = %cluster.node(), "the node was uncordoned by someone else: dxdp's cordon mark is removed, and dxdp does not cordon it again until its GPUs recover and fail again");
                                }
                                _ => {}
                            }
                        }
                        Err(e) => {
                            metrics.cordon(NodeChange::Error);
                            failures = failures.saturating_add(1);
                            say_once(
                                &mut last_error,
                                e,
                                match want {
                                    CordonWant::Cordon => {
                                        "cannot cordon the node (health.remediation.cordon)"
                                    }
                                    _ => "cannot lift dxdp's cordon of the node",
                                },
                            );
                            retry_at = Some(Instant::now() + backoff.delay(failures, random()));
                            wake = retry_at;
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
