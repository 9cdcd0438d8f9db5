//! GPU memory over-use, the daemon's side: after every sample the telemetry task judges each
//! container's dedicated memory against its memory share ([`dxdp_core::telemetry::overuse`]);
//! an episode that lasts `health.memoryOverUse.gracePeriod` is logged once, counted in
//! `dxdp_memory_overuse_episodes_total`, shown in `dxdp_container_gpu_memory_overuse_bytes`
//! while it lasts, and reported as a `GPUMemoryOverUse` Warning Event on the pod
//! ([`ReportEvents`], with `health.events`). Nothing is evicted or tainted: Windows cannot cap a
//! container's GPU memory, and dxdp only tells.
//!
//! The entry point is [`tasks`]: the Events task, fed by the episodes the telemetry task
//! publishes ([`OverUseTracker`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cluster::events::{
    container_ref, node_ref, warning, EventLimits, EventSender, Voice, Warning, EVENT_LIMITS,
};
use crate::cluster::{Cluster, API_BACKOFF};
use crate::config::Config;
use crate::context::Context;
use crate::observe::overuse_metrics::OverUseMetrics;
use crate::supervisor::{Role, TaskSpec};
use crate::util::retry::Backoff;
use crate::util::sleep_until;
use crate::util::task::Task;
use dxdp_core::telemetry::compute::TelemetryView;
use dxdp_core::telemetry::overuse::{Episodes, OverUse};

/// The reason of the Events.
pub(crate) const EVENT_REASON: &str = "GPUMemoryOverUse";

/// The confirmed over-use episodes the telemetry task publishes (sorted), for the Events.
pub(crate) type Confirmed = Arc<Vec<OverUse>>;

/// The sending side of [`Confirmed`], shared by the restarts of the telemetry task.
pub(crate) type ConfirmedTx = Arc<watch::Sender<Confirmed>>;

/// The memory resources' names and unit sizes, bytes, under `config`: the resources with
/// `memorySharing` on.
pub(crate) fn unit_sizes(config: &Config) -> BTreeMap<String, u64> {
    config
        .resources
        .keys()
        .filter_map(|&r| {
            let name = config.memory_resource_name(r)?;
            Some((name.to_string(), config.sharing(r).share_bytes()?))
        })
        .collect()
}

/// Follows the over-use episodes of the samples and publishes them. Its episodes outlive a
/// restart of the telemetry task (an episode is not reported twice for a restart).
#[derive(Clone)]
pub(crate) struct OverUseTracker {
    episodes: Arc<Mutex<Episodes>>,
    metrics: OverUseMetrics,
    tx: ConfirmedTx,
    /// The origin of the episodes' clock.
    origin: Instant,
}

impl OverUseTracker {
    /// A tracker publishing on `tx`, counting in `metrics`.
    pub(crate) fn new(metrics: OverUseMetrics, tx: ConfirmedTx) -> Self {
        OverUseTracker {
            episodes: Arc::default(),
            metrics,
            tx,
            origin: Instant::now(),
        }
    }

    /// The sending side of the confirmed episodes.
    pub(crate) fn sender(&self) -> ConfirmedTx {
        self.tx.clone()
    }

    /// Judges the figures of a sample (their containers carry their memory shares) under
    /// `config`; `current`: whether the sample's attribution was current (an old PodResources
    /// or process list could put memory in the wrong container, so such a sample changes
    /// nothing).
    pub(crate) fn sample(&self, view: &TelemetryView, config: &Config, current: bool) {
        if !current {
            return;
        }
        let grace = config.health_memory_over_use.grace_period;
        let now = self.origin.elapsed();
        let judged = self
            .episodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .judge(view, grace, now);
        for o in &judged.started {
            tracing::warn!(
                namespace = %o.pod.namespace,
                pod = %o.pod.pod,
                device = %o.device,
                "GPU memory over-use: {} (health.memoryOverUse.gracePeriod {}s; logged once per episode)",
                o.message(),
                grace.as_secs()
            );
        }
        for (pod, device) in &judged.ended {
            tracing::info!(namespace = %pod.namespace, pod = %pod.pod, container = %pod.container, device = %device, "GPU memory over-use ended: the container is within its memory share again (or no longer uses the GPU)");
        }
        self.metrics.started(judged.started.len() as u64);
        let confirmed = Arc::new(judged.confirmed);
        self.metrics.set_confirmed(confirmed.clone());
        self.tx.send_replace(confirmed);
    }

    /// The sample failed: the excess is no longer known (its series are withdrawn), but the
    /// episodes stand until a sample judges them again.
    pub(crate) fn unknown(&self) {
        self.metrics.set_confirmed(Arc::default());
    }

    /// Telemetry is off: every episode ends.
    pub(crate) fn off(&self) {
        let ended = self
            .episodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        if !ended.is_empty() {
            tracing::info!(
                episodes = ended.len(),
                "GPU memory over-use is no longer judged (telemetry.enabled is false)"
            );
        }
        self.metrics.set_confirmed(Arc::default());
        self.tx.send_if_modified(|c| {
            let changed = !c.is_empty();
            *c = Arc::default();
            changed
        });
    }
}

/// The Event for an over-use on `node` at `now`.
pub(crate) fn event(o: &OverUse, node: &str, now: Time) -> Event {
    warning(
        Warning {
            namespace: o.pod.namespace.clone(),
            involved: container_ref(&o.pod.namespace, &o.pod.pod, &o.pod.container),
            related: Some(node_ref(node)),
            reason: EVENT_REASON,
            action: "UseGPUMemoryAboveShare",
            message: format!("{}; see dxdp's docs/health.md#memory-over-use", o.message()),
        },
        node,
        now,
    )
}

/// How these Events are named in the log.
const VOICE: Voice = Voice {
    failing: "cannot report a GPU memory over-use as an Event",
    resumed: "Events about GPU memory over-use",
    grant: crate::cluster::events::POD_EVENTS_GRANT,
};

/// The over-use Events (when there is an API server): dxdp's entry point of the feature.
pub(crate) fn tasks(ctx: &Context, confirmed: &ConfirmedTx) -> Vec<TaskSpec> {
    let Some(cluster) = &ctx.cluster else {
        return Vec::new();
    };
    vec![TaskSpec::task(
        "memory-overuse-events",
        Role::Optional,
        ReportEvents {
            cluster: cluster.clone(),
            confirmed: confirmed.subscribe(),
            config: ctx.config.clone(),
            metrics: ctx.observe.metrics.overuse().clone(),
            limits: EVENT_LIMITS,
            backoff: API_BACKOFF,
        },
    )]
}

/// Sends an Event when an over-use episode is confirmed (once per episode, deduplicated and
/// rate-limited by `limits`), until `confirmed` closes. With `health.events: false`, nothing is
/// sent.
#[derive(Clone)]
pub(crate) struct ReportEvents {
    pub(crate) cluster: Cluster,
    pub(crate) confirmed: watch::Receiver<Confirmed>,
    pub(crate) config: watch::Receiver<Arc<Config>>,
    pub(crate) metrics: OverUseMetrics,
    pub(crate) limits: EventLimits,
    pub(crate) backoff: Backoff,
}

impl Task for ReportEvents {
    async fn run(self) {
        let ReportEvents {
            cluster,
            mut confirmed,
            config,
            metrics,
            limits,
            backoff,
        } = self;
        let mut sender = EventSender::new(cluster, limits, backoff, VOICE, event, move |r| {
            metrics.event(r)
        });
        loop {
            let current: Vec<OverUse> = confirmed.borrow_and_update().as_ref().clone();
            let on = config.borrow().health_reports.events;
            sender.update(
                current.into_iter().map(|o| (o.key(), o)),
                on,
                Instant::now(),
            );
            let wake = sender.send().await;
            tokio::select! {
                changed = confirmed.changed() => if changed.is_err() {
                    // The telemetry side is gone (the daemon is stopping): wait to be stopped.
                    std::future::pending::<()>().await;
                },
                () = sleep_until(wake) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dxdp_core::telemetry::PodRef;

    #[test]
    fn the_unit_sizes_are_those_of_the_resources_shared_by_memory() {
        use dxdp_core::devices::Resource;
        assert!(unit_sizes(&Config::default()).is_empty());
        let c = Config::default().with_memory_sharing(Resource::Display, 1 << 30, 1 << 30);
        assert_eq!(
            unit_sizes(&c),
            BTreeMap::from([("directx.microsoft.com/display-memory".to_string(), 1 << 30)])
        );
    }

    #[test]
    fn the_event_names_the_pod_container_use_share_and_what_to_do() {
        let o = OverUse {
            pod: PodRef {
                namespace: "vision".into(),
                pod: "detect-0".into(),
                container: "worker".into(),
            },
            device: "gpu-0".into(),
            model: "T4".into(),
            used: 3 << 30,
            share: 2 << 30,
            lasted: std::time::Duration::from_secs(125),
        };
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap());
        let e = serde_json::to_value(event(&o, "node-1", now)).unwrap();
        assert_eq!(e["metadata"]["name"], "detect-0.17979cfe362a0000");
        assert_eq!(e["metadata"]["namespace"], "vision");
        assert_eq!(
            e["involvedObject"],
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "name": "detect-0", "namespace": "vision", "fieldPath": "spec.containers{worker}"})
        );
        assert_eq!(e["reason"], "GPUMemoryOverUse");
        assert_eq!(e["type"], "Warning");
        assert_eq!(e["action"], "UseGPUMemoryAboveShare");
        assert_eq!(
            e["message"],
            "container worker uses 3 GiB of dedicated memory on GPU gpu-0 (T4), above its share of 2 GiB by 1 GiB for 125s. Nothing enforces the share: the GPU's other containers may run out of memory. Request more memory units (the container's memory resource) or make the workload use less; its share is in DXDP_GPU_MEMORY_LIMIT_BYTES; see dxdp's docs/health.md#memory-over-use"
        );
    }
}
