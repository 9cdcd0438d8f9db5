//! GPU isolation violations as Events on the pod (`isolation.events`): a Warning Event
//! `EVENT_REASON` on the pod container when a violation starts ([`ReportEvents`], following
//! the violations the telemetry task publishes, `telemetry::audit`, through the daemon's
//! wiring).
//!
//! One Event per start of a violation (a pod container using one GPU it was not allocated),
//! deduplicated (no second Event for the same container and GPU within [`EventLimits::dedup`])
//! and rate-limited (a bucket of [`EventLimits::burst`] Events, refilled by one every
//! [`EventLimits::every`]; a violation held back gets its Event later if it still lasts). Every
//! outcome is counted in `dxdp_isolation_events_total{result}`; every failure is logged once per
//! distinct error and retried with backoff; device serving never waits for any of it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::watch;
use tokio::time::Instant;

use super::events::{container_ref, node_ref, warning, EventLimits, EventSender, Voice, Warning};
use super::Cluster;
use crate::config::Config;
use crate::observe::isolation_metrics::IsolationMetrics;
use crate::util::retry::Backoff;
use crate::util::sleep_until;
use crate::util::task::Task;
use dxdp_core::telemetry::isolation::{Active, Violation};

/// The reason of the Events.
pub(crate) const EVENT_REASON: &str = "GPUIsolationViolation";

/// The Event for a violation on `node` at `now` (a new object each time: dxdp only creates).
pub(crate) fn event(v: &Violation, node: &str, now: Time) -> Event {
    warning(
        Warning {
            namespace: v.pod.namespace.clone(),
            involved: container_ref(&v.pod.namespace, &v.pod.pod, &v.pod.container),
            related: Some(node_ref(node)),
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

/// How these Events are named in the log.
const VOICE: Voice = Voice {
    failing: "cannot report a GPU isolation violation as an Event",
    resumed: "Events about GPU isolation violations",
    grant: super::events::POD_EVENTS_GRANT,
};

/// Sends an Event when a violation starts, deduplicated and rate-limited by `limits`, until
/// `active` closes. With `isolation.events: false` in `config`, nothing is sent.
#[derive(Clone)]
pub struct ReportEvents {
    pub cluster: Cluster,
    pub active: watch::Receiver<Active>,
    pub config: watch::Receiver<Arc<Config>>,
    pub metrics: IsolationMetrics,
    pub limits: EventLimits,
    pub backoff: Backoff,
}

impl Task for ReportEvents {
    async fn run(self) {
        let ReportEvents {
            cluster,
            mut active,
            config,
            metrics,
            limits,
            backoff,
        } = self;
        let mut sender = EventSender::new(cluster, limits, backoff, VOICE, event, move |r| {
            metrics.event(r)
        });
        loop {
            let current: Vec<Violation> = active
                .borrow_and_update()
                .as_deref()
                .cloned()
                .unwrap_or_default();
            let on = config.borrow().isolation.events;
            sender.update(
                current.into_iter().map(|v| (v.key(), v)),
                on,
                Instant::now(),
            );
            let wake = sender.send().await;
            tokio::select! {
                changed = active.changed() => if changed.is_err() {
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
    use dxdp_core::telemetry::isolation::{Adapter, ViolationKind};
    use dxdp_core::telemetry::PodRef;

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
