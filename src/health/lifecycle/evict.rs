//! `health.remediation.evictPods`: evicts the pods holding a served device that stayed
//! Unhealthy longer than `health.remediation.gracePeriod`, with the Eviction API (`Api<Pod>::
//! evict`, which respects PodDisruptionBudgets), and a Warning Event `GPUUnhealthyEviction` on the
//! pod naming the device and the reason.
//!
//! Which pod holds which device comes from the kubelet's PodResources `List`, as for the
//! `GPUUnhealthy` Events (`health::events::holders`), asked when a device's grace period ends
//! and again every `RELIST` while one stays past it. Bounded
//! (`dxdp_core::lifecycle::EvictionBound`): no pod twice within `EVICTED_MEMORY` (it stays
//! listed while it terminates), at most `EVICTIONS_PER_WINDOW` attempts a minute on the node.
//! A PodDisruptionBudget's refusal (429) is counted `refused`, said once per pod in the log and
//! in a `REFUSED_REASON` Event, and tried again after [`REFUSED_RETRY`]; other failures
//! with backoff. A device that recovers forgets its pending evictions.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, EvictParams};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cluster::events::{container_ref, node_ref, warning, Warning};
use crate::cluster::Cluster;
use crate::config::Config;
use crate::health::events::{holders, unhealthy_served, Report, RELIST};
use crate::inventory::InventoryRx;
use crate::kubelet::podresources;
use crate::observe::remediation_metrics::{EvictionResult, RemediationMetrics};
use crate::transport::Endpoint;
use crate::util::errors::chain;
use crate::util::retry::{random, Backoff};
use crate::util::sleep_until;
use crate::util::task::Task;
use dxdp_core::health::eventlog::format_time;
use dxdp_core::health::reason::Reason;
use dxdp_core::lifecycle::{evict_due, EvictionBound};

/// The reason of the Event on an evicted pod.
pub(crate) const EVENT_REASON: &str = "GPUUnhealthyEviction";

/// The reason of the Event on a pod whose eviction a PodDisruptionBudget refused.
pub(crate) const REFUSED_REASON: &str = "GPUUnhealthyEvictionRefused";

/// How long after a PodDisruptionBudget's refusal (429) the pod is tried again.
pub const REFUSED_RETRY: Duration = Duration::from_secs(30);

/// How long one PodResources `List` may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// What grants `create` on `pods/eviction`.
const GRANT: &str =
    "grant create on pods/eviction: the chart does with health.remediation.evictPods";

/// A pod: namespace and name.
type PodKey = (String, String);

/// The Event on the pod of `r`: evicted (`refused: false`) or refused by a
/// PodDisruptionBudget.
fn event(
    r: &Report,
    grace: Duration,
    refused: Option<(&str, Duration)>,
    node: &str,
    now: Time,
) -> Event {
    let why = match &r.device.detail {
        Some(d) => format!("{}: {d}", r.device.reason),
        None => r.device.reason.to_string(),
    };
    let what = format!(
        "GPU {} ({}), allocated to container {} as {}, is Unhealthy since {} ({why}), longer than health.remediation.gracePeriod ({} s)",
        r.device.device,
        r.device.description,
        r.pod.container,
        r.resource,
        format_time(r.since_ms),
        grace.as_secs_f64(),
    );
    let (reason, message) = match refused {
        None => (EVENT_REASON, format!("{what}: dxdp evicted the pod (health.remediation.evictPods)")),
        Some((m, retry)) => (
            REFUSED_REASON,
            format!("{what}: the eviction was refused ({m}), most likely by a PodDisruptionBudget; dxdp tries again every {} s", retry.as_secs_f64()),
        ),
    };
    warning(
        Warning {
            namespace: r.pod.namespace.clone(),
            involved: container_ref(&r.pod.namespace, &r.pod.pod, &r.pod.container),
            related: Some(node_ref(node)),
            reason,
            action: "EvictPod",
            message,
        },
        node,
        now,
    )
}

/// How one eviction went.
enum Outcome {
    Evicted,
    /// Gone already (404): nothing to evict.
    Gone,
    /// 429: a PodDisruptionBudget (or the API server's rate limit) refused it.
    Refused(String),
    Failed(String),
}

async fn evict(cluster: &Cluster, namespace: &str, pod: &str) -> Outcome {
    // Without kube-rs's own retries: a 429 is the PodDisruptionBudget's answer.
    let api: Api<Pod> = Api::namespaced(cluster.answer_client.clone(), namespace);
    match tokio::time::timeout(cluster.timeout, api.evict(pod, &EvictParams::default())).await {
        Ok(Ok(_)) => Outcome::Evicted,
        Ok(Err(kube::Error::Api(s))) if s.code == 404 => Outcome::Gone,
        Ok(Err(kube::Error::Api(s))) if s.code == 429 => Outcome::Refused(s.message.clone()),
        Ok(Err(kube::Error::Api(s))) if s.code == 403 => Outcome::Failed(format!(
            "cannot evict pod {namespace}/{pod}: {} ({GRANT})",
            s.message
        )),
        Ok(Err(e)) => Outcome::Failed(format!("cannot evict pod {namespace}/{pod}: {}", chain(&e))),
        Err(_) => Outcome::Failed(format!(
            "the API server did not answer the eviction of pod {namespace}/{pod} within {} s",
            cluster.timeout.as_secs_f64()
        )),
    }
}

/// Evicts the holders of devices Unhealthy past the grace period: its inputs, cloned for every
/// (re)start.
#[derive(Debug, Clone)]
pub struct EvictHolders {
    /// The API server.
    pub cluster: Cluster,
    /// The served inventory.
    pub inventory: InventoryRx,
    /// The configuration (`health.remediation`, `telemetry.podResourcesEndpoint`).
    pub config: watch::Receiver<Arc<Config>>,
    /// The kubelet's device-plugin directory (PodResources' default endpoint is beside it).
    pub kubelet_dir: PathBuf,
    /// Where evictions are counted.
    pub metrics: RemediationMetrics,
    /// Retries of failed calls.
    pub backoff: Backoff,
    /// The clock of "since when" (ms since the epoch; tests give a fixed one).
    pub clock: fn() -> u64,
    /// How long after a refusal (429) a pod is tried again ([`REFUSED_RETRY`]).
    pub refused_retry: Duration,
}

/// Milliseconds of the monotonic clock the eviction bound counts in.
fn mono_ms(start: Instant) -> u64 {
    Instant::now().saturating_duration_since(start).as_millis() as u64
}

impl Task for EvictHolders {
    async fn run(self) {
        let EvictHolders {
            cluster,
            mut inventory,
            mut config,
            kubelet_dir,
            metrics,
            backoff,
            clock,
            refused_retry,
        } = self;
        let start = Instant::now();
        let mut bound: EvictionBound<PodKey> = EvictionBound::new();
        // Each Unhealthy device: since when, whatever its reasons (monotonic, and ms since the
        // epoch).
        let mut since: BTreeMap<String, (Instant, u64)> = BTreeMap::new();
        let mut list_at: Option<Instant> = None;
        let mut failures = 0u32;
        let mut last_error: Option<String> = None;
        let mut refusal_said: BTreeSet<PodKey> = BTreeSet::new();
        let mut last_due: BTreeSet<String> = BTreeSet::new();
        let (mut inventory_open, mut config_open) = (true, true);
        loop {
            let c = config.borrow_and_update().clone();
            let inv = inventory.borrow_and_update().clone();
            let settings = c.remediation;
            let sick = unhealthy_served(&inv);
            let now = Instant::now();
            since.retain(|id, _| sick.iter().any(|s| &s.device == id));
            for s in &sick {
                since.entry(s.device.clone()).or_insert((now, clock()));
            }
            let mut wake = None;
            if !settings.evict_pods || sick.is_empty() {
                bound.keep_only(|_| false);
                refusal_said.clear();
                list_at = None;
            } else {
                let due: Vec<_> = sick
                    .iter()
                    .filter(|s| {
                        since.get(&s.device).is_some_and(|(t, _)| {
                            evict_due(now.saturating_duration_since(*t), settings.grace_period)
                        })
                    })
                    .cloned()
                    .collect();
                let next_due = (since.values())
                    .map(|(t, _)| *t + settings.grace_period)
                    .filter(|t| *t > now)
                    .min();
                let due_ids: BTreeSet<String> = due.iter().map(|s| s.device.clone()).collect();
                if due.is_empty() {
                    list_at = None;
                } else if list_at.is_none() || due_ids != last_due {
                    // A device's grace period just ended: ask PodResources at once.
                    list_at = Some(now);
                }
                last_due = due_ids;
                if list_at.is_some_and(|t| now >= t) {
                    let configured = c.telemetry.pod_resources_endpoint.clone();
                    let endpoint =
                        configured.unwrap_or_else(|| Endpoint::default_for(&kubelet_dir));
                    match podresources::list(&endpoint, LIST_TIMEOUT).await {
                        Ok(allocations) => {
                            let ms: BTreeMap<String, (Reason, u64)> = due
                                .iter()
                                .filter_map(|s| {
                                    since
                                        .get(&s.device)
                                        .map(|(_, m)| (s.device.clone(), (s.reason, *m)))
                                })
                                .collect();
                            let reports = holders(&inv, &allocations, &due, &ms);
                            let pods: BTreeSet<PodKey> = reports
                                .iter()
                                .map(|r| (r.pod.namespace.clone(), r.pod.pod.clone()))
                                .collect();
                            bound.keep_only(|k| pods.contains(k));
                            refusal_said.retain(|k| pods.contains(k));
                            let mut done: BTreeSet<PodKey> = BTreeSet::new();
                            for r in &reports {
                                let key = (r.pod.namespace.clone(), r.pod.pod.clone());
                                if done.contains(&key) || !bound.try_take(&key, mono_ms(start)) {
                                    continue;
                                }
                                done.insert(key.clone());
                                let node = cluster.node().to_string();
                                let stamp = Time(k8s_openapi::jiff::Timestamp::now());
                                match evict(&cluster, &key.0, &key.1).await {
                                    Outcome::Evicted => {
                                        metrics.eviction(EvictionResult::Evicted);
                                        bound.evicted(key.clone(), mono_ms(start));
                                        failures = 0;
                                        tracing::warn!(pod = %format!("{}/{}", key.0, key.1), device = %r.device.device, reason = %r.device.reason, "pod evicted (health.remediation.evictPods): it holds a GPU Unhealthy for longer than the grace period");
                                        let e = event(r, settings.grace_period, None, &node, stamp);
                                        if let Err(why) = cluster.post_event(&e, GRANT).await {
                                            tracing::debug!("no Event for the eviction: {why:?}");
                                        }
                                    }
                                    Outcome::Gone => bound.evicted(key.clone(), mono_ms(start)),
                                    Outcome::Refused(m) => {
                                        metrics.eviction(EvictionResult::Refused);
                                        bound.refused(
                                            key.clone(),
                                            mono_ms(start) + refused_retry.as_millis() as u64,
                                        );
                                        if refusal_said.insert(key.clone()) {
                                            tracing::warn!(pod = %format!("{}/{}", key.0, key.1), device = %r.device.device, "the eviction of a pod holding an Unhealthy GPU was refused ({m}), most likely by a PodDisruptionBudget; trying again every {} s", refused_retry.as_secs_f64());
                                            let e = event(
                                                r,
                                                settings.grace_period,
                                                Some((&m, refused_retry)),
                                                &node,
                                                stamp,
                                            );
                                            if let Err(why) = cluster.post_event(&e, GRANT).await {
                                                tracing::debug!(
                                                    "no Event for the refused eviction: {why:?}"
                                                );
                                            }
                                        }
                                    }
                                    Outcome::Failed(why) => {
                                        metrics.eviction(EvictionResult::Error);
                                        failures = failures.saturating_add(1);
                                        let delay = backoff.delay(failures, random());
                                        bound.refused(
                                            key.clone(),
                                            mono_ms(start) + delay.as_millis() as u64,
                                        );
                                        crate::cluster::say_once(
                                            &mut last_error,
                                            why,
                                            "cannot evict a pod holding an Unhealthy GPU",
                                        );
                                    }
                                }
                            }
                            // Again after RELIST, or when a refused pod may be tried again.
                            let retry = bound.next_at().map(|ms| start + Duration::from_millis(ms));
                            let relist = Instant::now() + RELIST;
                            list_at = Some(retry.map_or(relist, |r| r.min(relist)));
                        }
                        Err(e) => {
                            failures = failures.saturating_add(1);
                            crate::cluster::say_once(
                                &mut last_error,
                                e.to_string(),
                                "GPUs are Unhealthy past the grace period, but PodResources cannot tell which pods hold them, so none is evicted",
                            );
                            list_at = Some(Instant::now() + backoff.delay(failures, random()));
                        }
                    }
                }
                wake = [next_due, list_at].into_iter().flatten().min();
            }
            if !inventory_open && !config_open && wake.is_none() {
                std::future::pending::<()>().await;
            }
            tokio::select! {
                changed = inventory.changed(), if inventory_open => inventory_open = changed.is_ok(),
                changed = config.changed(), if config_open => config_open = changed.is_ok(),
                () = sleep_until(wake) => {}
            }
        }
    }
}
