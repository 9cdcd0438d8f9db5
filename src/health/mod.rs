//! Device health, the daemon's side: what an operator sees of a device that faults.
//!
//! The rules (judging the devices' health from the host facts, the faults and the
//! configuration) are pure and live in `dxdp_core::health`; serving applies them to the devices
//! the kubelet sees (`plugin::refresher`). This feature adds:
//!
//! - `faults`: the live GPU fault events of the Windows event log, fed into the host facts
//!   (`live_faults`, wrapped around the host-facts source before serving starts);
//! - [`events`]: `GPUUnhealthy` Events on the pods holding an Unhealthy device (`health.events`);
//! - [`conditions`]: the `DirectXGPUHealthy` and `DirectXGPUIsolation` node conditions
//!   (`health.nodeConditions`);
//! - [`capacity`]: `/readyz` waits for the Node to show the served resources as allocatable;
//! - [`lifecycle`]: the startup taint's removal, and `health.remediation` (evicting the pods
//!   holding a device Unhealthy past a grace period, cordoning a node none of whose GPUs is
//!   Healthy).
//!
//! Its metrics are `observe::device_health`'s (serving records there too); its configuration
//! section is `config::health`. Every task is optional; without an API server client device
//! health is logged and counted only, said once (`tasks`).

pub mod capacity;
pub mod conditions;
pub mod events;
pub(crate) mod faults;
pub mod lifecycle;

use std::sync::Arc;

use tokio::sync::watch;

use crate::backend::eventlog::EventLog;
use crate::backend::HostFactsSource;
use crate::cluster::{events::EVENT_LIMITS, API_BACKOFF};
use crate::config::Config;
use crate::context::Context;
use crate::observe::state::Capacity;
use crate::supervisor::{Role, TaskSpec};
use dxdp_core::telemetry::isolation::Active;

/// Wraps `source` so that its facts carry the live fault events of `log` (the task that follows
/// the log is pushed onto `specs`). Without `log`, the machine's own event log is followed
/// (Windows' `wevtapi.dll`; where there is none, that is said once), and none for a source that
/// brings its own recorded faults (a host snapshot, the sample host).
pub(crate) fn live_faults(
    source: Arc<dyn HostFactsSource>,
    log: Option<Arc<dyn EventLog>>,
    config: watch::Receiver<Arc<Config>>,
    observe: &crate::observe::Observe,
    specs: &mut Vec<TaskSpec>,
) -> Arc<dyn HostFactsSource> {
    let log = match log {
        Some(log) => log,
        None if source.is_simulated() => return source,
        None => match crate::backend::native_event_log() {
            Ok(log) => log,
            Err(why) => {
                tracing::info!("live GPU fault events are off: {why}");
                return source;
            }
        },
    };
    let (wrapped, task) =
        faults::live_faults(source, log, config, observe.metrics.clone(), API_BACKOFF);
    specs.push(task);
    wrapped
}

/// The `GPUUnhealthy` Events, the node conditions and the readiness capacity gate (optional
/// tasks, with the API server and the Node watch); without them, says once what device health
/// cannot do and tells `/readyz` that the Node's capacity is not checked.
pub(crate) fn tasks(ctx: &Context, active: &watch::Sender<Active>) -> Vec<TaskSpec> {
    let (Some(cluster), Some(node)) = (&ctx.cluster, &ctx.node) else {
        // Without a client by choice (`dxdp demo`, tests) there is nothing to say.
        if ctx.cluster_asked {
            say_without_cluster(ctx);
        }
        return Vec::new();
    };
    let metrics = ctx.observe.metrics.device_health().clone();
    let events = events::HealthEvents {
        cluster: cluster.clone(),
        inventory: ctx.inventory.clone(),
        config: ctx.config.clone(),
        kubelet_dir: ctx.kubelet_dir.clone(),
        metrics: metrics.clone(),
        limits: EVENT_LIMITS,
        backoff: API_BACKOFF,
        clock: events::now_ms,
    };
    let conditions = conditions::NodeConditions {
        cluster: cluster.clone(),
        inventory: ctx.inventory.clone(),
        active: active.subscribe(),
        config: ctx.config.clone(),
        metrics,
        backoff: API_BACKOFF,
        resync: conditions::RESYNC,
    };
    let gate = capacity::CapacityGate {
        node: node.clone(),
        inventory: ctx.inventory.clone(),
        readiness: ctx.observe.readiness.clone(),
        first_read_grace: capacity::FIRST_READ_GRACE,
    };
    let mut specs = vec![
        TaskSpec::task("health-events", Role::Optional, events),
        TaskSpec::task("node-conditions", Role::Optional, conditions),
        TaskSpec::task("readiness-capacity", Role::Optional, gate),
    ];
    specs.extend(lifecycle::tasks(ctx, cluster, node));
    specs
}

/// Says once, at start, what device health cannot do without the API server, and tells
/// `/readyz` that the Node's capacity is not checked.
fn say_without_cluster(ctx: &Context) {
    let c = ctx.config.borrow().clone();
    if c.health_reports.events || c.health_reports.node_conditions {
        tracing::info!("GPUUnhealthy Events and node conditions are off: dxdp has no API server client (no NODE_NAME or credentials; the chart needs nodeApi.enabled); device health is logged and counted only");
    }
    if c.startup_taint.is_some() || c.remediation.evict_pods || c.remediation.cordon {
        tracing::warn!("startupTaint or health.remediation is set, but dxdp has no API server client: it removes no taint, evicts no pod and cordons nothing");
    }
    tracing::info!(
        "/readyz does not check the Node's allocatable capacity: dxdp has no API server client"
    );
    ctx.observe
        .readiness
        .set_capacity(Capacity::NotChecked(capacity::NO_CLIENT.into()));
}
