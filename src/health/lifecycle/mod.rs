//! The node's lifecycle around its GPUs (optional tasks, with the API server and the Node
//! watch; docs/health.md#remediation, docs/install.md#startup-taint):
//!
//! - [`startup_taint`]: removes the startup taint (`startupTaint`, e.g.
//!   `directx.microsoft.com/gpu-not-ready:NoSchedule`) once the Node's allocatable shows every
//!   served resource with its healthy devices, and with `validation.gate` once validation passed;
//! - [`evict`]: evicts the pods holding a device Unhealthy for longer than
//!   `health.remediation.gracePeriod` (`health.remediation.evictPods`);
//! - [`cordon`]: cordons the node while every served device has been Unhealthy for the grace
//!   period, and lifts only a cordon it placed (`health.remediation.cordon`).
//!
//! The rules are pure and live in `dxdp_core::lifecycle`; the metrics are
//! `observe::remediation_metrics`'. Each task does nothing while its key is off, reads the
//! configuration in force (a reload applies at once), logs an API failure once, counts it and
//! retries with backoff; device serving never waits for any of it.

pub mod cordon;
pub mod evict;
pub mod startup_taint;

use crate::cluster::{Cluster, API_BACKOFF};
use crate::config::NodeInfo;
use crate::context::Context;
use crate::supervisor::{Role, TaskSpec};
use tokio::sync::watch;

/// The three tasks, for the daemon with an API server client and the Node watch.
pub(crate) fn tasks(
    ctx: &Context,
    cluster: &Cluster,
    node: &watch::Receiver<Option<NodeInfo>>,
) -> Vec<TaskSpec> {
    let metrics = ctx.observe.metrics.remediation().clone();
    let taint = startup_taint::RemoveStartupTaint {
        cluster: cluster.clone(),
        node: node.clone(),
        inventory: ctx.inventory.clone(),
        config: ctx.config.clone(),
        metrics: metrics.clone(),
        backoff: API_BACKOFF,
    };
    let evict = evict::EvictHolders {
        cluster: cluster.clone(),
        inventory: ctx.inventory.clone(),
        config: ctx.config.clone(),
        kubelet_dir: ctx.kubelet_dir.clone(),
        metrics: metrics.clone(),
        backoff: API_BACKOFF,
        clock: crate::inventory::now_ms,
        refused_retry: evict::REFUSED_RETRY,
    };
    let cordon = cordon::KeepCordon {
        cluster: cluster.clone(),
        node: node.clone(),
        inventory: ctx.inventory.clone(),
        config: ctx.config.clone(),
        metrics,
        backoff: API_BACKOFF,
    };
    vec![
        TaskSpec::task("startup-taint", Role::Optional, taint),
        TaskSpec::task("evict-holders", Role::Optional, evict),
        TaskSpec::task("cordon", Role::Optional, cordon),
    ]
}
