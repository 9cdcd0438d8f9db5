//! Device health on the pods (`health.events`): a Warning Event `EVENT_REASON` on each pod
//! container that holds an Unhealthy device, naming the device, the reason and since when
//! ([`HealthEvents`]).
//!
//! Which pod container holds which device comes from the kubelet's PodResources `List` (replica
//! IDs resolve to their physical device), asked whenever the served devices change while one is
//! Unhealthy, and again every `RELIST` while one stays Unhealthy. One Event per start of
//! (pod container, device, reason): a device that stays Unhealthy gets no second Event, a new
//! reason does. Sent, deduplicated and rate-limited exactly like the isolation Events (the same
//! `EventSender` and [`EVENT_LIMITS`](crate::cluster::events::EVENT_LIMITS)): no second Event for the
//! same key within the window, a burst then one a minute, a held-back Event sent later if the
//! device is still Unhealthy and held. `health.events: false` sends none (counted `disabled`); every outcome is counted in
//! `dxdp_health_events_total{result}`. API and PodResources failures are logged once per
//! distinct error and retried with backoff; device serving never waits for any of it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cluster::events::{
    container_ref, node_ref, warning, EventLimits, EventSender, Voice, Warning,
};
use crate::cluster::Cluster;
use crate::config::Config;
use crate::inventory::{Inventory, InventoryRx};
use crate::kubelet::podresources;
use crate::observe::device_health::HealthMetrics;
use crate::transport::Endpoint;
use crate::util::retry::{random, Backoff};
use crate::util::sleep_until;
use crate::util::task::Task;
use dxdp_core::allocation;
use dxdp_core::health::eventlog::format_time;
use dxdp_core::health::reason::Reason;
use dxdp_core::telemetry::{PodAllocation, PodRef};

/// The reason of the Events.
pub(crate) const EVENT_REASON: &str = "GPUUnhealthy";

/// How often PodResources is asked again while a device stays Unhealthy (a pod the kubelet had
/// admitted but not yet listed is found then).
pub(crate) const RELIST: Duration = Duration::from_secs(60);

/// How long one PodResources `List` may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// A served device that is Unhealthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sick {
    /// The device ID (without replica suffix).
    pub(crate) device: String,
    /// The adapter's description (`NVIDIA Tesla T4`).
    pub(crate) description: String,
    /// Why.
    pub(crate) reason: Reason,
    /// The reason's sentence, when there is one.
    pub(crate) detail: Option<String>,
}

/// Every served device (its resource enabled), in inventory order.
pub(crate) fn served_devices(
    inventory: &Inventory,
) -> impl Iterator<Item = &dxdp_core::devices::Device> {
    let served: BTreeSet<_> = inventory
        .config
        .endpoints()
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    (inventory.discovery.devices.iter())
        .filter(move |d| d.resource.is_some_and(|r| served.contains(&r)))
}

/// Every served device (its resource enabled) that is Unhealthy, in inventory order.
pub(crate) fn unhealthy_served(inventory: &Inventory) -> Vec<Sick> {
    served_devices(inventory)
        .filter(|d| !d.health.is_healthy())
        .map(|d| Sick {
            device: d.id.clone(),
            description: d.description.clone(),
            reason: d.health.code,
            detail: d.health.reason.clone(),
        })
        .collect()
}

/// One pod container holding an Unhealthy device, and since when the device is Unhealthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Report {
    /// The pod container.
    pub(crate) pod: PodRef,
    /// The resource name it was allocated under (`directx.microsoft.com/display`).
    pub(crate) resource: String,
    /// The device.
    pub(crate) device: Sick,
    /// Since when the device is Unhealthy with this reason (ms since the epoch), as dxdp saw it.
    pub(crate) since_ms: u64,
}

/// What identifies a report: the pod container, the device and the reason.
pub(crate) type ReportKey = (PodRef, String, Reason);

impl Report {
    /// Its key for deduplication.
    pub(crate) fn key(&self) -> ReportKey {
        (
            self.pod.clone(),
            self.device.device.clone(),
            self.device.reason,
        )
    }
}

/// The pod containers of `allocations` (PodResources' answer) holding a device of `sick`, one
/// report per (container, device), sorted by key. `since` gives each device's start (ms).
pub(crate) fn holders(
    inventory: &Inventory,
    allocations: &[PodAllocation],
    sick: &[Sick],
    since: &BTreeMap<String, (Reason, u64)>,
) -> Vec<Report> {
    let endpoints = crate::inventory::endpoints(&inventory.config);
    let mut out: BTreeMap<ReportKey, Report> = BTreeMap::new();
    for a in allocations {
        let Some((r, _)) = endpoints.iter().find(|(_, n)| *n == a.resource) else {
            continue;
        };
        for id in &a.device_ids {
            // A replica or a memory unit: either leads back to its GPU.
            let Some(d) = allocation::resolve_any(&inventory.discovery, *r, id) else {
                continue;
            };
            let Some(s) = sick.iter().find(|s| s.device == d.id) else {
                continue;
            };
            let report = Report {
                pod: a.holder(),
                resource: a.resource.clone(),
                device: s.clone(),
                since_ms: since.get(&s.device).map(|(_, t)| *t).unwrap_or(0),
            };
            out.entry(report.key()).or_insert(report);
        }
    }
    out.into_values().collect()
}

/// The Event for `r` on `node` at `now` (a new object each time: dxdp only creates).
pub(crate) fn event(r: &Report, node: &str, now: Time) -> Event {
    let why = match &r.device.detail {
        Some(d) => format!("{}: {d}", r.device.reason),
        None => r.device.reason.to_string(),
    };
    let message = format!(
        "GPU {} ({}), allocated to container {} as {}, is Unhealthy since {} ({why}). It is allocated to no new pod; this container keeps it (see dxdp's docs/health.md)",
        r.device.device,
        r.device.description,
        r.pod.container,
        r.resource,
        format_time(r.since_ms),
    );
    warning(
        Warning {
            namespace: r.pod.namespace.clone(),
            involved: container_ref(&r.pod.namespace, &r.pod.pod, &r.pod.container),
            related: Some(node_ref(node)),
            reason: EVENT_REASON,
            action: "ReportDeviceHealth",
            message,
        },
        node,
        now,
    )
}

/// How these Events are named in the log.
const VOICE: Voice = Voice {
    failing: "cannot report an Unhealthy GPU to the pod holding it as an Event",
    resumed: "GPUUnhealthy Events",
    grant: crate::cluster::events::POD_EVENTS_GRANT,
};

/// Milliseconds since the Unix epoch now.
pub(crate) fn now_ms() -> u64 {
    crate::inventory::now_ms()
}

/// The `GPUUnhealthy` Events task: its inputs, cloned for every (re)start by the supervisor.
#[derive(Debug, Clone)]
pub struct HealthEvents {
    /// The API server.
    pub cluster: Cluster,
    /// The served inventory.
    pub inventory: InventoryRx,
    /// The configuration (`health.events`, `telemetry.podResourcesEndpoint`).
    pub config: watch::Receiver<Arc<Config>>,
    /// The kubelet's device-plugin directory (PodResources' default endpoint is beside it).
    pub kubelet_dir: PathBuf,
    /// Where outcomes are counted.
    pub metrics: HealthMetrics,
    /// Deduplication and rate limit.
    pub limits: EventLimits,
    /// Retries of failed calls.
    pub backoff: Backoff,
    /// The clock of "since when" (ms since the epoch; tests give a fixed one).
    pub clock: fn() -> u64,
}

impl Task for HealthEvents {
    /// Sends the Events until the inventory's sender is gone (then waits to be stopped).
    async fn run(self) {
        let HealthEvents {
            cluster,
            mut inventory,
            config,
            kubelet_dir,
            metrics,
            limits,
            backoff,
            clock,
        } = self;
        let mut sender = EventSender::new(cluster, limits, backoff, VOICE, event, move |r| {
            metrics.event(r)
        });
        let mut since: BTreeMap<String, (Reason, u64)> = BTreeMap::new();
        let mut list_failures = 0u32;
        let mut list_at: Option<Instant> = Some(Instant::now());
        let mut list_error: Option<String> = None;
        let mut inventory_open = true;
        loop {
            let current = inventory.borrow_and_update().clone();
            let sick = unhealthy_served(&current);
            let now = clock();
            since.retain(|id, (reason, _)| {
                sick.iter().any(|s| &s.device == id && s.reason == *reason)
            });
            for s in &sick {
                since.entry(s.device.clone()).or_insert((s.reason, now));
            }
            if sick.is_empty() {
                // Nothing is held: every queued Event is forgotten.
                sender.update(Vec::new(), true, Instant::now());
                list_at = None;
            } else if list_at.is_some_and(|t| Instant::now() >= t) {
                let configured = config.borrow().telemetry.pod_resources_endpoint.clone();
                let endpoint = configured.unwrap_or_else(|| Endpoint::default_for(&kubelet_dir));
                match podresources::list(&endpoint, LIST_TIMEOUT).await {
                    Ok(allocations) => {
                        if list_error.take().is_some() {
                            tracing::info!(
                                "PodResources answers again: GPUUnhealthy Events resume"
                            );
                        }
                        list_failures = 0;
                        list_at = Some(Instant::now() + RELIST);
                        let reports = holders(&current, &allocations, &sick, &since);
                        let on = config.borrow().health_reports.events;
                        sender.update(
                            reports.into_iter().map(|r| (r.key(), r)),
                            on,
                            Instant::now(),
                        );
                    }
                    Err(e) => {
                        list_failures = list_failures.saturating_add(1);
                        let why = e.to_string();
                        if list_error.as_deref() != Some(why.as_str()) {
                            tracing::warn!(devices = ?sick.iter().map(|s| &s.device).collect::<Vec<_>>(), "devices are Unhealthy, but PodResources cannot tell which pods hold them ({why}): no GPUUnhealthy Event until it answers; retrying with backoff (device serving is not affected)");
                            list_error = Some(why);
                        }
                        list_at = Some(Instant::now() + backoff.delay(list_failures, random()));
                    }
                }
            }
            let wake = sender.send().await;
            let wake = match (wake, list_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if !inventory_open && wake.is_none() {
                std::future::pending::<()>().await;
            }
            tokio::select! {
                changed = inventory.changed(), if inventory_open => {
                    if changed.is_err() {
                        inventory_open = false;
                    } else {
                        // The devices changed: ask PodResources again at once.
                        list_at = Some(Instant::now());
                    }
                }
                () = sleep_until(wake) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(pod: &str, detail: Option<&str>) -> Report {
        Report {
            pod: PodRef {
                namespace: "ml".into(),
                pod: pod.into(),
                container: "train".into(),
            },
            resource: "directx.microsoft.com/display".into(),
            device: Sick {
                device: "pciroot-0-pci-1c00-ba6abfb666f4630a".into(),
                description: "NVIDIA Tesla T4".into(),
                reason: Reason::ProblemCode,
                detail: detail.map(str::to_string),
            },
            // 2026-11-25T21:49:12.512Z
            since_ms: 1_795_643_352_512,
        }
    }

    #[test]
    fn the_event_names_the_device_the_reason_and_since_when() {
        let r = report("train-0", Some("device node has problem code 43"));
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap());
        let e = serde_json::to_value(event(&r, "node-1", now)).unwrap();
        assert_eq!(e["metadata"]["name"], "train-0.17979cfe362a0000");
        assert_eq!(e["metadata"]["namespace"], "ml");
        assert_eq!(
            e["involvedObject"],
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "name": "train-0", "namespace": "ml", "fieldPath": "spec.containers{train}"})
        );
        assert_eq!(e["reason"], "GPUUnhealthy");
        assert_eq!(e["type"], "Warning");
        assert_eq!(e["related"]["name"], "node-1");
        assert_eq!(
            e["message"],
            "GPU pciroot-0-pci-1c00-ba6abfb666f4630a (NVIDIA Tesla T4), allocated to container train as directx.microsoft.com/display, is Unhealthy since 2026-11-25T21:49:12Z (problem_code: device node has problem code 43). It is allocated to no new pod; this container keeps it (see dxdp's docs/health.md)"
        );
        let long = report("p", Some(&"x".repeat(2000)));
        let e = event(&long, "n", Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(e.message.map(|m| m.len()), Some(1024));
    }
}
