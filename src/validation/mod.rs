//! In-cluster validation: a Job on this node that runs `dxdp validate` against one device of
//! each served resource, after registration, after a driver change and on a schedule
//! (`validation.enabled`; docs/validation.md, "In the cluster").
//!
//! The verdict rules are pure and live in `dxdp_core::validation`; `dxdp validate` itself is
//! `tools::validate`. This feature adds:
//!
//! - [`job`]: the Job's manifest, what its Job and pod status mean, the node labels of a result,
//!   which old Jobs to delete;
//! - `exe`: the daemon's own `dxdp.exe`, placed on the host for the Job to mount;
//! - [`run`]: running one Job and publishing its result as node labels;
//! - `task`: the daemon's task that decides when, runs one Job at a time and reports (labels,
//!   metrics, a Node Event on failure).
//!
//! Its metrics are `observe::validation`'s; its configuration section is `config::validation`.

pub(crate) mod exe;
pub mod job;
pub mod run;
pub(crate) mod task;

use crate::cluster::API_BACKOFF;
use crate::context::Context;
use crate::supervisor::{Role, TaskSpec};

/// The validation task (optional; it does nothing while `validation.enabled` is off), or, with
/// no API server client, none (said once when validation is enabled).
pub(crate) fn tasks(ctx: &Context) -> Vec<TaskSpec> {
    let Some(cluster) = &ctx.cluster else {
        if ctx.config.borrow().validation.enabled {
            tracing::warn!("validation.enabled is true, but dxdp has no API server client (no NODE_NAME or credentials, see above; the chart needs nodeApi.enabled): no validation Jobs");
        }
        return Vec::new();
    };
    let validation = task::ValidationTask {
        cluster: cluster.clone(),
        namespace: (ctx.env.get(task::NAMESPACE_VAR).cloned()).filter(|n| !n.trim().is_empty()),
        inventory: ctx.inventory.clone(),
        config: ctx.config.clone(),
        readiness: ctx.observe.readiness.clone(),
        metrics: ctx.observe.metrics.validation().clone(),
        exe: std::env::current_exe().unwrap_or_default(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        backoff: API_BACKOFF,
        timing: task::TIMING,
        done: None,
    };
    vec![TaskSpec::task("validation", Role::Optional, validation)]
}
