//! The GPU isolation audit's metrics: the violations that last now (one series each, encoded
//! at each scrape from the current set, so that an ended violation's series disappears at once),
//! how many started (`dxdp_isolation_violations_total`), the processes dxdp cannot place, and what the Kubernetes side (Events, the node
//! taint) did.
//!
//! Names and labels are a public interface; `docs/observability.md` lists them.

use std::sync::{Arc, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use dxdp_core::telemetry::isolation::Violation;

use super::event_metrics::EventResult;
use super::telemetry_metrics::{clean, result as label, ResultLabel};

/// What one change of the node's taint gave (`dxdp_isolation_taint_changes_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaintResult {
    /// dxdp's taint was put on the node.
    Added,
    /// dxdp's taint was taken off the node.
    Removed,
    /// The node could not be read or patched (retried with backoff).
    Error,
}

impl TaintResult {
    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TaintResult::Added => "added",
            TaintResult::Removed => "removed",
            TaintResult::Error => "error",
        }
    }

    const ALL: [TaintResult; 3] = [TaintResult::Added, TaintResult::Removed, TaintResult::Error];
}

/// The isolation part of the daemon's metrics. Clones share the same values.
#[derive(Debug, Clone)]
pub struct IsolationMetrics {
    active: Arc<RwLock<Arc<Vec<Violation>>>>,
    started: Counter,
    unplaced: Gauge,
    events: Family<ResultLabel, Counter>,
    taint_changes: Family<ResultLabel, Counter>,
    tainted: Gauge,
    /// Violations left out of `dxdp_isolation_violations` ([`super::cardinality`]).
    over_limit: Gauge,
    over_limit_logged: Arc<super::cardinality::LoggedOnce>,
}

/// Encodes the violations that last now at each scrape.
#[derive(Debug)]
struct ActiveCollector {
    active: Arc<RwLock<Arc<Vec<Violation>>>>,
    started: Counter,
}

impl IsolationMetrics {
    /// Registers the isolation metrics in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        // Not registered as a counter: OpenMetrics would name its family
        // `dxdp_isolation_violations`, the gauge's name; the collector writes it.
        let started = Counter::default();
        let unplaced = Gauge::default();
        registry.register(
            "dxdp_isolation_unplaced_processes",
            "Processes using a GPU that dxdp cannot attribute to a pod container (the host's, or of containers whose pod is unknown) in the last sample; never violations",
            unplaced.clone(),
        );
        let events = Family::<ResultLabel, Counter>::default();
        registry.register(
            "dxdp_isolation_events",
            "Kubernetes Events about isolation violations, by result (sent, error, deduplicated, rate_limited, disabled)",
            events.clone(),
        );
        let taint_changes = Family::<ResultLabel, Counter>::default();
        registry.register(
            "dxdp_isolation_taint_changes",
            "Changes of dxdp's isolation taint on the node, by result (added, removed, error)",
            taint_changes.clone(),
        );
        let tainted = Gauge::default();
        registry.register(
            "dxdp_isolation_node_tainted",
            "1 while dxdp's isolation taint is on the node (as last written or read by dxdp)",
            tainted.clone(),
        );
        let over_limit = Gauge::default();
        registry.register(
            "dxdp_isolation_violations_over_limit",
            "Violations left out of dxdp_isolation_violations now: past the cap of violation series per node (docs/observability.md)",
            over_limit.clone(),
        );
        for r in EventResult::ALL {
            drop(events.get_or_create(&label(r.as_str())));
        }
        for r in TaintResult::ALL {
            drop(taint_changes.get_or_create(&label(r.as_str())));
        }
        let active = Arc::new(RwLock::new(Arc::new(Vec::new())));
        registry.register_collector(Box::new(ActiveCollector {
            active: active.clone(),
            started: started.clone(),
        }));
        IsolationMetrics {
            active,
            started,
            unplaced,
            events,
            taint_changes,
            tainted,
            over_limit,
            over_limit_logged: Arc::default(),
        }
    }

    /// Sets the violations that last now.
    /// At most [`super::cardinality::MAX_VIOLATIONS`] are exported; the number left out is
    /// `dxdp_isolation_violations_over_limit`.
    pub(crate) fn set_active(&self, violations: Arc<Vec<Violation>>) {
        let cap = super::cardinality::MAX_VIOLATIONS;
        let left_out = violations.len().saturating_sub(cap);
        let violations = if left_out > 0 {
            self.over_limit_logged.warn(|| format!("{left_out} GPU isolation violations are left out of dxdp_isolation_violations: at most {cap} per node are exported (dxdp_isolation_violations_over_limit counts them; the audit, its Events and taint see them all; logged once)"));
            Arc::new(violations.iter().take(cap).cloned().collect())
        } else {
            violations
        };
        self.over_limit.set(left_out as i64);
        *self.active.write().unwrap_or_else(|p| p.into_inner()) = violations;
    }

    /// Counts violations that started.
    pub(crate) fn started(&self, n: u64) {
        self.started.inc_by(n);
    }

    /// Sets the processes dxdp cannot place.
    pub(crate) fn unplaced(&self, processes: u64) {
        self.unplaced
            .set(i64::try_from(processes).unwrap_or(i64::MAX));
    }

    /// Counts one Event outcome.
    pub(crate) fn event(&self, result: EventResult) {
        self.events.get_or_create(&label(result.as_str())).inc();
    }

    /// Counts one taint outcome.
    pub(crate) fn taint_change(&self, result: TaintResult) {
        self.taint_changes
            .get_or_create(&label(result.as_str()))
            .inc();
    }

    /// Sets whether dxdp's taint is on the node.
    pub(crate) fn tainted(&self, on: bool) {
        self.tainted.set(i64::from(on));
    }

    /// How many Events had `result` so far.
    #[cfg(any(test, feature = "test-support"))]
    pub fn events(&self, result: EventResult) -> u64 {
        self.events.get_or_create(&label(result.as_str())).get()
    }

    /// How many taint changes had `result` so far.
    #[cfg(any(test, feature = "test-support"))]
    pub fn taint_changes(&self, result: TaintResult) -> u64 {
        self.taint_changes
            .get_or_create(&label(result.as_str()))
            .get()
    }

    /// Whether dxdp's taint is on the node, as dxdp last wrote or read it.
    #[cfg(any(test, feature = "test-support"))]
    pub fn node_tainted(&self) -> bool {
        self.tainted.get() == 1
    }

    /// How many violations started so far.
    #[cfg(any(test, feature = "test-support"))]
    pub fn violations_started(&self) -> u64 {
        self.started.get()
    }
}

impl Collector for ActiveCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let active = self
            .active
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut metric = encoder.encode_descriptor(
            "dxdp_isolation_violations",
            "1 for every pod container that uses a GPU it was not allocated, while it lasts; device is the GPU used",
            None,
            MetricType::Gauge,
        )?;
        for v in active.iter() {
            let labels = [
                ("namespace", clean(&v.pod.namespace)),
                ("pod", clean(&v.pod.pod)),
                ("container", clean(&v.pod.container)),
                ("device", clean(&v.used.device)),
            ];
            let gauge = Gauge::<i64>::default();
            gauge.set(1);
            gauge.encode(metric.encode_family(&labels)?)?;
        }
        // The count of starts under its conventional name. OpenMetrics reserves a counter's
        // family name without `_total` (here the gauge's), so it is written as `unknown`, whose
        // sample carries the family name as is; PromQL's rate() and increase() work the same.
        let total = encoder.encode_descriptor(
            "dxdp_isolation_violations_total",
            "GPU isolation violations that started (a counter)",
            None,
            MetricType::Unknown,
        )?;
        let value = Gauge::<i64>::default();
        value.set(i64::try_from(self.started.get()).unwrap_or(i64::MAX));
        value.encode(total)?;
        Ok(())
    }
}
