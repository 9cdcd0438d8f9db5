//! GPU telemetry: reads the GPU performance counters on an interval, joins them with the
//! containers' processes (HCS), their pods (the runtime's CRI) and the kubelet's PodResources
//! answer, and publishes per-device and per-pod figures on `/metrics`.
//!
//! - the counter source: where counter samples come from (a host snapshot's recorded samples, or PDH on
//!   Windows): the backend's [`crate::backend::counters`];
//! - [`sampler`]: the sampling task ([`sampler::run`]: runs until cancelled, never fails, retries
//!   with backoff) and one sampling step for `dxdp top`;
//! - [`top`]: the table `dxdp top` prints, and the figures read back from a daemon's `/metrics`;
//! - [`scrape`]: reading a daemon's `/metrics` for `top` and `audit`, over HTTP or HTTPS, with
//!   a CA, a client certificate, a bearer token or basic-auth credentials;
//! - [`audit`]: the isolation audit's tracker (starts and ends of violations, logged once,
//!   counted and published for the Kubernetes side) and `dxdp audit`'s table;
//! - `overuse`: GPU memory over-use (a container above its memory share): the tracker the
//!   sampler feeds, and its Events (`overuse::tasks`, the feature's entry point);
//! - `podinfo`: the `dxdp_pod_info` series (opt-in pod UID and labels, from CRI).
//!
//! The computation itself is pure and lives in `dxdp_core::telemetry`. The daemon starts the
//! feature from `tasks`: the sampler, and with the API server the isolation audit's Events
//! (`cluster::isolation_events`) and node taint (`cluster::taint`).

pub mod audit;
pub(crate) mod overuse;
pub(crate) mod podinfo;
pub mod sampler;
pub mod scrape;
pub(crate) mod thermal;
pub mod top;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::cluster::{events::EVENT_LIMITS, isolation_events, taint, API_BACKOFF};
use crate::config::file::IsolationPolicy;
use crate::context::Context;
use crate::supervisor::{Role, TaskSpec};
use crate::util::task::Task;
use audit::{ActiveTx, Tracker};
use thermal::{HotTx, ThermalTracker};

/// The channels the telemetry task feeds: the isolation violations, and the devices the
/// `thermal` signal holds.
pub(crate) struct Feeds {
    /// The isolation audit's violations.
    pub(crate) active: ActiveTx,
    /// The hot devices ([`thermal`]).
    pub(crate) hot: HotTx,
    /// The confirmed GPU memory over-use episodes (`overuse`).
    pub(crate) overuse: overuse::ConfirmedTx,
}

/// The GPU telemetry task (when telemetry can be built) and, with the API server, the isolation
/// Events and the node taint; returns them with the channel of the isolation violations the
/// telemetry finds (and of the devices it finds hot). Without telemetry none can be known, which
/// the channel says at once (the node taint needs to hear it).
pub(crate) fn tasks(ctx: &Context, host_snapshot: Option<PathBuf>) -> (Vec<TaskSpec>, Feeds) {
    let mut specs = Vec::new();
    let task = Telemetry {
        inventory: ctx.inventory.clone(),
        config: ctx.config.clone(),
        host_snapshot,
        kubelet_dir: ctx.kubelet_dir.clone(),
        metrics: ctx.observe.metrics.clone(),
        active: Arc::new(watch::Sender::new(None)),
        hot: Arc::new(watch::Sender::new(Arc::default())),
        overuse: overuse::OverUseTracker::new(
            ctx.observe.metrics.overuse().clone(),
            Arc::new(watch::Sender::new(Arc::default())),
        ),
        first: Arc::default(),
    };
    let first = task.build();
    let telemetry_on = first.is_some();
    // Without telemetry no violation can be known, which the channel says at once.
    let active = task.active.clone();
    let feeds = Feeds {
        active: active.clone(),
        hot: task.hot.clone(),
        overuse: task.overuse.sender(),
    };
    if telemetry_on {
        *task.first.lock().unwrap_or_else(|e| e.into_inner()) = first;
        specs.push(TaskSpec::task("telemetry", Role::Optional, task));
    } else {
        active.send_replace(Some(Arc::new(Vec::new())));
    }
    let Some(cluster) = &ctx.cluster else {
        say_isolation_without_cluster(&ctx.config, telemetry_on);
        return (specs, feeds);
    };
    let metrics = ctx.observe.metrics.isolation().clone();
    specs.push(TaskSpec::task(
        "isolation-events",
        Role::Optional,
        isolation_events::ReportEvents {
            cluster: cluster.clone(),
            active: active.subscribe(),
            config: ctx.config.clone(),
            metrics: metrics.clone(),
            limits: EVENT_LIMITS,
            backoff: API_BACKOFF,
        },
    ));
    specs.push(TaskSpec::task(
        "isolation-taint",
        Role::Optional,
        taint::KeepTaint {
            cluster: cluster.clone(),
            active: active.subscribe(),
            config: ctx.config.clone(),
            metrics,
            backoff: API_BACKOFF,
            start_grace: taint::TAINT_START_GRACE,
            min_hold: taint::TAINT_MIN_HOLD,
        },
    ));
    (specs, feeds)
}

/// The GPU telemetry task: samples until it ends (it is then restarted, with a sampler built
/// again: a sampler holds its source's state), and tracks the isolation violations it finds on
/// `active`.
#[derive(Clone)]
struct Telemetry {
    inventory: crate::inventory::InventoryRx,
    config: watch::Receiver<Arc<crate::config::Config>>,
    host_snapshot: Option<PathBuf>,
    kubelet_dir: PathBuf,
    metrics: crate::observe::metrics::Metrics,
    active: ActiveTx,
    hot: HotTx,
    /// The over-use episodes (kept across restarts).
    overuse: overuse::OverUseTracker,
    /// The sampler built at start (to know whether telemetry can run), taken by the first run.
    first: Arc<Mutex<Option<sampler::Sampler>>>,
}

impl Telemetry {
    fn build(&self) -> Option<sampler::Sampler> {
        sampler::build(
            sampler::Devices::Daemon(self.inventory.clone()),
            self.config.clone(),
            self.host_snapshot.as_deref(),
            &self.kubelet_dir,
            self.metrics.telemetry().clone(),
        )
    }
}

impl Task for Telemetry {
    async fn run(self) {
        let first = (self.first.lock().unwrap_or_else(|e| e.into_inner())).take();
        let sampler = first.or_else(|| self.build());
        let tracker = Tracker::new(self.metrics.isolation().clone(), self.active.clone());
        let thermal = ThermalTracker::new(self.metrics.clone(), self.hot.clone());
        if let Some(sampler) = sampler {
            let trackers = sampler::Trackers {
                isolation: Some(tracker),
                thermal: Some(thermal),
                overuse: Some(self.overuse.clone()),
            };
            sampler::run_with(sampler, trackers, std::future::pending::<()>()).await;
        } else {
            // No sample can be judged: the violations it took over end when they are stale
            // (no taint stays for what is unknown).
            tracker.expire_when_stale(self.config).await;
        }
        // Ended (or could not be built again): the supervisor restarts it.
    }
}

/// Says once, at start, what the isolation audit cannot do without the API server.
fn say_isolation_without_cluster(
    config: &watch::Receiver<Arc<crate::config::Config>>,
    telemetry_on: bool,
) {
    let c = config.borrow().clone();
    if c.isolation.policy == IsolationPolicy::Taint {
        tracing::warn!("isolation.policy is taint, but dxdp has no API server client (no NODE_NAME or credentials, see the line above; the chart needs nodeApi.enabled): the node is never tainted, violations are only logged and counted");
    } else if c.isolation.events && telemetry_on {
        tracing::info!("GPU isolation Events are off: dxdp has no API server client (no NODE_NAME or credentials; the chart needs nodeApi.enabled); violations are logged and counted only");
    }
}
