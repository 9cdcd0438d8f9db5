//! GPU isolation violations as Events on the pod (`isolation.events`): a Warning Event
//! [`EVENT_REASON`] on the pod container when a violation starts ([`report_events`], following
//! the violations the telemetry task publishes, `telemetry::isolation`, through the daemon's
//! wiring).
//!
//! One Event per start of a violation (a pod container using one GPU it was not allocated),
//! deduplicated (no second Event for the same container and GPU within [`EventLimits::dedup`])
//! and rate-limited (a bucket of [`EventLimits::burst`] Events, refilled by one every
//! [`EventLimits::every`]; a violation held back gets its Event later if it still lasts). Every
//! outcome is counted in `dxdp_isolation_events_total{result}`; every failure is logged once per
//! distinct error and retried with backoff; device serving never waits for any of it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::watch;
use tokio::time::Instant;

use super::events::{EventError, EventGate, EventLimits};
use super::{say_once, sleep_until, Cluster};
use crate::config::Config;
use crate::observe::isolation_metrics::{EventResult, IsolationMetrics};
use crate::util::retry::{random, Backoff};
use dxdp_core::telemetry::isolation::{Active, Violation};
use dxdp_core::telemetry::PodRef;

/// The reason of the Events.
pub const EVENT_REASON: &str = "GPUIsolationViolation";

/// What identifies a violation: the pod container and the GPU it uses.
type Key = (PodRef, String);

/// The Event for a violation on `node` at `now` (a new object each time: dxdp only creates).
pub fn event(v: &Violation, node: &str, now: Time) -> Event {
    super::events::warning(
        super::events::Warning {
            namespace: v.pod.namespace.clone(),
            involved: super::events::container_ref(&v.pod.namespace, &v.pod.pod, &v.pod.container),
            related: Some(super::events::node_ref(node)),
            reason: EVENT_REASON,
            action: "UseUnallocatedGPU",
            message: format!(
                "{}. Windows does not confine a process-isolated container to its GPU; see dxdp's docs/isolation.md",
                v.message()
            ),
        },
        node,
        now,
    )
}

impl Cluster {
    /// Creates the Event for `v` in its pod's namespace.
    async fn create_event(&self, v: &Violation) -> Result<(), EventError> {
        let e = event(v, &self.node, Time(k8s_openapi::jiff::Timestamp::now()));
        self.post_event(&v.pod.namespace, &e).await
    }
}

/// Sends an Event when a violation starts, deduplicated and rate-limited by `limits`, until
/// `active` closes. With `isolation.events: false` in `config`, nothing is sent.
pub async fn report_events(
    cluster: Cluster,
    mut active: watch::Receiver<Active>,
    config: watch::Receiver<Arc<Config>>,
    metrics: IsolationMetrics,
    limits: EventLimits,
    backoff: Backoff,
) {
    let mut gate = EventGate::new(limits, Instant::now());
    let mut seen: BTreeSet<Key> = BTreeSet::new();
    let mut pending: BTreeMap<Key, Violation> = BTreeMap::new();
    let mut held_back: BTreeSet<Key> = BTreeSet::new();
    let mut failures = 0u32;
    let mut retry_at: Option<Instant> = None;
    let mut last_error: Option<String> = None;
    let mut dropped_said: BTreeSet<String> = BTreeSet::new();
    loop {
        let now = Instant::now();
        let current: Vec<Violation> = active
            .borrow_and_update()
            .as_deref()
            .cloned()
            .unwrap_or_default();
        let keys: BTreeSet<Key> = current.iter().map(Violation::key).collect();
        pending.retain(|k, _| keys.contains(k));
        held_back.retain(|k| keys.contains(k));
        let send = config.borrow().isolation.events;
        for v in current {
            let key = v.key();
            if seen.contains(&key) {
                if let Some(p) = pending.get_mut(&key) {
                    *p = v;
                }
            } else if !send {
                metrics.event(EventResult::Disabled);
            } else if gate.is_duplicate(&key, now) {
                metrics.event(EventResult::Deduplicated);
            } else {
                pending.insert(key, v);
            }
        }
        seen = keys;
        if !send {
            pending.clear();
            held_back.clear();
        }
        let mut wake = retry_at;
        if retry_at.is_none_or(|t| now >= t) {
            retry_at = None;
            wake = None;
            while let Some((key, v)) = pending
                .first_key_value()
                .map(|(k, v)| (k.clone(), v.clone()))
            {
                if !gate.take(Instant::now()) {
                    for k in pending.keys() {
                        if held_back.insert(k.clone()) {
                            metrics.event(EventResult::RateLimited);
                        }
                    }
                    wake = Some(gate.next_token());
                    break;
                }
                match cluster.create_event(&v).await {
                    Ok(()) => {
                        metrics.event(EventResult::Sent);
                        if failures > 0 {
                            tracing::info!("Events about GPU isolation violations are created again after {failures} failed attempts");
                        }
                        failures = 0;
                        last_error = None;
                        gate.sent(key.clone(), Instant::now());
                        pending.remove(&key);
                        held_back.remove(&key);
                    }
                    Err(EventError::Drop { kind, why }) => {
                        // Refused for good: counted, said once per kind, and the next one goes.
                        metrics.event(EventResult::Error);
                        if dropped_said.insert(kind) {
                            tracing::warn!("cannot report a GPU isolation violation as an Event: {why} (said once; device serving is not affected)");
                        } else {
                            tracing::debug!(
                                "cannot report a GPU isolation violation as an Event: {why}"
                            );
                        }
                        pending.remove(&key);
                        held_back.remove(&key);
                    }
                    Err(EventError::Retry(why)) => {
                        metrics.event(EventResult::Error);
                        failures = failures.saturating_add(1);
                        say_once(
                            &mut last_error,
                            why,
                            "cannot report a GPU isolation violation as an Event",
                        );
                        retry_at = Some(Instant::now() + backoff.delay(failures, random()));
                        wake = retry_at;
                        break;
                    }
                }
            }
        }
        tokio::select! {
            changed = active.changed() => if changed.is_err() {
                // The telemetry side is gone (the daemon is stopping): wait to be stopped.
                std::future::pending::<()>().await;
            },
            () = sleep_until(wake) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dxdp_core::telemetry::isolation::{Adapter, ViolationKind};

    #[test]
    fn the_event_names_the_pod_container_and_both_adapters() {
        let v = Violation {
            pod: PodRef {
                namespace: "vision".into(),
                pod: "detect-0".into(),
                container: "worker".into(),
            },
            used: Adapter {
                device: "gpu-1".into(),
                luid: "0x00000000_0x00000002".into(),
                model: "T4".into(),
            },
            allocated: vec![Adapter {
                device: "gpu-0".into(),
                luid: "0x00000000_0x00000001".into(),
                model: "T4".into(),
            }],
            processes: 1,
            kind: ViolationKind::OtherDevice,
        };
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap());
        let e = serde_json::to_value(event(&v, "node-1", now)).unwrap();
        // 1_700_000_000 s = 0x17979CFE362A0000 ns.
        assert_eq!(e["metadata"]["name"], "detect-0.17979cfe362a0000");
        assert_eq!(e["metadata"]["namespace"], "vision");
        assert_eq!(
            e["involvedObject"],
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "name": "detect-0", "namespace": "vision", "fieldPath": "spec.containers{worker}"})
        );
        assert_eq!(e["reason"], "GPUIsolationViolation");
        assert_eq!(e["type"], "Warning");
        assert_eq!(
            e["source"],
            serde_json::json!({"component": "dxdp", "host": "node-1"})
        );
        assert_eq!(e["related"]["kind"], "Node");
        assert_eq!(e["count"], 1);
        assert_eq!(
            e["message"],
            "container worker uses GPU gpu-1 (T4, LUID 0x00000000_0x00000002), which was not allocated to it (1 process); it was allocated gpu-0 (T4, LUID 0x00000000_0x00000001). Windows does not confine a process-isolated container to its GPU; see dxdp's docs/isolation.md"
        );
        // A long pod name is cut so that the Event's name stays within 253 characters.
        let mut long = v.clone();
        long.pod.pod = "p".repeat(253);
        let e = event(
            &long,
            "node-1",
            Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        );
        assert_eq!(e.metadata.name.as_deref().map(str::len), Some(253));
    }
}
