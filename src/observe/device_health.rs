//! Device health metrics: `dxdp_device_health{device, resource, reason}` (1 for each device's
//! current reason; `healthy` when healthy), `dxdp_gpu_faults_total{device, kind}` (fault
//! events seen, by device; `device="unmatched"` for events that matched none), what the
//! Kubernetes side made of health: `dxdp_health_events_total{result}` (`GPUUnhealthy` Events)
//! and `dxdp_node_condition_updates_total{condition, result}`; and the live event-log feed's own
//! state: `dxdp_eventlog_subscribed` (1 while dxdp follows the Windows event log),
//! `dxdp_eventlog_errors_total{stage}` and `dxdp_eventlog_dropped_total`.
//!
//! Names and labels are a public interface (alert rules are written against them);
//! `docs/observability.md` and `docs/health.md` list them.

use std::sync::{Arc, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The `device` label of fault events that matched no device.
pub(crate) const UNMATCHED: &str = "unmatched";

/// One device's health as the gauge shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealth {
    /// The device ID (as the kubelet knows it, without replica suffix).
    pub(crate) device: String,
    /// The served resource name, or `none` when the device is not served.
    pub(crate) resource: String,
    /// The reason's stable name (`healthy`, `problem_code`, ...).
    pub(crate) reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HealthLabels {
    device: String,
    resource: String,
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabel {
    stage: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FaultLabels {
    device: String,
    kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConditionLabels {
    condition: String,
    result: String,
}

/// What one write of a node condition gave (`dxdp_node_condition_updates_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionResult {
    /// The condition was set (created or changed).
    Set,
    /// dxdp's condition was taken off the node (`health.nodeConditions` turned off).
    Removed,
    /// The node could not be read or patched (retried with backoff).
    Error,
}

impl ConditionResult {
    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ConditionResult::Set => "set",
            ConditionResult::Removed => "removed",
            ConditionResult::Error => "error",
        }
    }
}

/// The health part of the daemon's metrics. Clones share the same values.
#[derive(Debug, Clone)]
pub struct HealthMetrics {
    current: Arc<RwLock<Arc<Vec<DeviceHealth>>>>,
    faults: Family<FaultLabels, Counter>,
    events: Family<super::telemetry_metrics::ResultLabel, Counter>,
    conditions: Family<ConditionLabels, Counter>,
    eventlog: EventLogMetrics,
}

/// The live event-log feed's metrics (`health::faults`).
#[derive(Debug, Clone, Default)]
struct EventLogMetrics {
    subscribed: Gauge,
    errors: Family<StageLabel, Counter>,
    dropped: Counter,
}

/// Encodes the current health of every device at each scrape (a device that left has no
/// series).
#[derive(Debug)]
struct CurrentCollector {
    current: Arc<RwLock<Arc<Vec<DeviceHealth>>>>,
}

impl Collector for CurrentCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let current = self
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut family = encoder.encode_descriptor(
            "dxdp_device_health",
            "1 for each device's current health reason (reason=\"healthy\" when Healthy; docs/health.md lists the reasons)",
            None,
            MetricType::Gauge,
        )?;
        for d in current.iter() {
            let labels = HealthLabels {
                device: d.device.clone(),
                resource: d.resource.clone(),
                reason: d.reason.clone(),
            };
            let gauge = ConstGauge::new(1i64);
            gauge.encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

impl HealthMetrics {
    /// Registers the health metrics in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let faults = Family::<FaultLabels, Counter>::default();
        registry.register(
            "dxdp_gpu_faults",
            "GPU fault events seen (kind: tdr, live_kernel_event; thermal: each episode of a hot GPU), by device (\"unmatched\" when the event names no served device)",
            faults.clone(),
        );
        let events = Family::<super::telemetry_metrics::ResultLabel, Counter>::default();
        registry.register(
            "dxdp_health_events",
            "Kubernetes GPUUnhealthy Events on pods holding an Unhealthy device, by result (sent, error, deduplicated, rate_limited, disabled)",
            events.clone(),
        );
        for r in super::event_metrics::EventResult::ALL {
            drop(events.get_or_create(&super::telemetry_metrics::result(r.as_str())));
        }
        let conditions = Family::<ConditionLabels, Counter>::default();
        registry.register(
            "dxdp_node_condition_updates",
            "Writes of dxdp's node conditions (DirectXGPUHealthy, DirectXGPUIsolation), by result (set, removed, error)",
            conditions.clone(),
        );
        let current = Arc::new(RwLock::new(Arc::new(Vec::new())));
        registry.register_collector(Box::new(CurrentCollector {
            current: current.clone(),
        }));
        let eventlog = EventLogMetrics::default();
        registry.register(
            "dxdp_eventlog_subscribed",
            "1 while dxdp follows the Windows event log for GPU fault events; 0 while it cannot, or lost its subscription and has not made it again (faults logged meanwhile are read when it does; docs/health.md)",
            eventlog.subscribed.clone(),
        );
        registry.register(
            "dxdp_eventlog_errors",
            "Errors of the event-log feed (stage: subscribe, a failed subscribe attempt; delivery, an error the subscription reported, which ends it; service, the Event Log service restarted or stopped under a subscription; record, a record that could not be rendered or read)",
            eventlog.errors.clone(),
        );
        registry.register(
            "dxdp_eventlog_dropped",
            "Event-log records dropped because the feed's bounded queue was full (a flood)",
            eventlog.dropped.clone(),
        );
        for stage in ["subscribe", "delivery", "service", "record"] {
            let _ = eventlog.errors.get_or_create(&StageLabel {
                stage: stage.into(),
            });
        }
        HealthMetrics {
            current,
            faults,
            events,
            conditions,
            eventlog,
        }
    }

    /// Counts one `GPUUnhealthy` Event outcome.
    pub(crate) fn event(&self, result: super::event_metrics::EventResult) {
        self.events
            .get_or_create(&super::telemetry_metrics::result(result.as_str()))
            .inc();
    }

    /// How many `GPUUnhealthy` Events had `result` so far.
    #[cfg(any(test, feature = "test-support"))]
    pub fn events(&self, result: super::event_metrics::EventResult) -> u64 {
        self.events
            .get_or_create(&super::telemetry_metrics::result(result.as_str()))
            .get()
    }

    /// Counts one write of the node condition `condition`.
    pub(crate) fn condition(&self, condition: &str, result: ConditionResult) {
        self.conditions
            .get_or_create(&ConditionLabels {
                condition: condition.to_string(),
                result: result.as_str().to_string(),
            })
            .inc();
    }

    /// Whether dxdp follows the event log now.
    pub(crate) fn eventlog_subscribed(&self, on: bool) {
        self.eventlog.subscribed.set(i64::from(on));
    }

    /// Counts an error of the event-log feed at `stage` (`subscribe`, `delivery`, `service`,
    /// `record`).
    pub(crate) fn eventlog_error(&self, stage: &str) {
        self.eventlog
            .errors
            .get_or_create(&StageLabel {
                stage: stage.to_string(),
            })
            .inc();
    }

    /// How many writes of `condition` had `result` so far.
    #[cfg(any(test, feature = "test-support"))]
    pub fn conditions(&self, condition: &str, result: ConditionResult) -> u64 {
        self.conditions
            .get_or_create(&ConditionLabels {
                condition: condition.to_string(),
                result: result.as_str().to_string(),
            })
            .get()
    }

    /// Counts `n` records dropped by the feed's full queue.
    pub(crate) fn eventlog_dropped(&self, n: u64) {
        self.eventlog.dropped.inc_by(n);
    }

    /// The event-log feed's errors at `stage`, its dropped records and whether it is
    /// subscribed.
    #[cfg(any(test, feature = "test-support"))]
    pub fn eventlog(&self, stage: &str) -> (u64, u64, bool) {
        let errors = self
            .eventlog
            .errors
            .get_or_create(&StageLabel {
                stage: stage.to_string(),
            })
            .get();
        (
            errors,
            self.eventlog.dropped.get(),
            self.eventlog.subscribed.get() == 1,
        )
    }

    /// Sets every device's current health.
    pub fn set_current(&self, devices: Vec<DeviceHealth>) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(devices);
    }

    /// Counts one fault event of `kind` on `device` ([`UNMATCHED`] when it matched none).
    pub(crate) fn fault(&self, device: &str, kind: &str) {
        self.faults
            .get_or_create(&FaultLabels {
                device: device.to_string(),
                kind: kind.to_string(),
            })
            .inc();
    }
}
