//! What dxdp did to the node's lifecycle and about Unhealthy devices: the startup taint
//! (`dxdp_startup_taint_removals_total{result}`, `dxdp_startup_taint_present`), evictions
//! (`dxdp_remediation_evictions_total{result}`) and the cordon
//! (`dxdp_remediation_cordons_total{result}`, `dxdp_node_cordoned_by_dxdp`).
//!
//! Names and labels are a public interface; docs/observability.md and docs/health.md list them.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::telemetry_metrics::{result, ResultLabel};

/// What one eviction attempt gave (`dxdp_remediation_evictions_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionResult {
    /// The API server accepted the eviction.
    Evicted,
    /// A PodDisruptionBudget refused it (429): tried again later.
    Refused,
    /// Any other failure (RBAC, the API server): tried again with backoff.
    Error,
}

impl EvictionResult {
    const ALL: [EvictionResult; 3] = [
        EvictionResult::Evicted,
        EvictionResult::Refused,
        EvictionResult::Error,
    ];

    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EvictionResult::Evicted => "evicted",
            EvictionResult::Refused => "refused",
            EvictionResult::Error => "error",
        }
    }
}

/// What one change of the node gave (`dxdp_remediation_cordons_total{result}`,
/// `dxdp_startup_taint_removals_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeChange {
    /// The node was cordoned (with dxdp's mark).
    Cordoned,
    /// dxdp's own cordon was lifted.
    Uncordoned,
    /// The startup taint was removed.
    Removed,
    /// The node could not be read or patched (retried with backoff).
    Error,
}

impl NodeChange {
    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            NodeChange::Cordoned => "cordoned",
            NodeChange::Uncordoned => "uncordoned",
            NodeChange::Removed => "removed",
            NodeChange::Error => "error",
        }
    }
}

/// The node-lifecycle metrics. Clones share the same values.
#[derive(Debug, Clone)]
pub struct RemediationMetrics {
    evictions: Family<ResultLabel, Counter>,
    cordons: Family<ResultLabel, Counter>,
    cordoned: Gauge,
    taint_removals: Family<ResultLabel, Counter>,
    taint_present: Gauge,
}

impl RemediationMetrics {
    /// Registers the metrics in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let evictions = Family::<ResultLabel, Counter>::default();
        registry.register(
            "dxdp_remediation_evictions",
            "Evictions of pods holding a GPU Unhealthy for longer than health.remediation.gracePeriod, by result (evicted; refused: a PodDisruptionBudget said 429, tried again later; error)",
            evictions.clone(),
        );
        for r in EvictionResult::ALL {
            drop(evictions.get_or_create(&result(r.as_str())));
        }
        let cordons = Family::<ResultLabel, Counter>::default();
        registry.register(
            "dxdp_remediation_cordons",
            "Cordons dxdp placed and lifted (health.remediation.cordon), by result (cordoned, uncordoned, error)",
            cordons.clone(),
        );
        for r in [
            NodeChange::Cordoned,
            NodeChange::Uncordoned,
            NodeChange::Error,
        ] {
            drop(cordons.get_or_create(&result(r.as_str())));
        }
        let cordoned = Gauge::default();
        registry.register(
            "dxdp_node_cordoned_by_dxdp",
            "1 while the node carries a cordon dxdp placed (health.remediation.cordon); an operator's cordon is not counted",
            cordoned.clone(),
        );
        let taint_removals = Family::<ResultLabel, Counter>::default();
        registry.register(
            "dxdp_startup_taint_removals",
            "Removals of the startup taint (startupTaint), by result (removed, error)",
            taint_removals.clone(),
        );
        for r in [NodeChange::Removed, NodeChange::Error] {
            drop(taint_removals.get_or_create(&result(r.as_str())));
        }
        let taint_present = Gauge::default();
        registry.register(
            "dxdp_startup_taint_present",
            "1 while the node carries the startup taint dxdp manages (startupTaint), 0 once it is off or when none is configured",
            taint_present.clone(),
        );
        RemediationMetrics {
            evictions,
            cordons,
            cordoned,
            taint_removals,
            taint_present,
        }
    }

    /// Counts one eviction attempt.
    pub(crate) fn eviction(&self, r: EvictionResult) {
        self.evictions.get_or_create(&result(r.as_str())).inc();
    }

    /// Counts one change (or failed change) of the cordon.
    pub(crate) fn cordon(&self, r: NodeChange) {
        self.cordons.get_or_create(&result(r.as_str())).inc();
    }

    /// Whether the node carries dxdp's cordon now.
    pub(crate) fn set_cordoned(&self, on: bool) {
        self.cordoned.set(i64::from(on));
    }

    /// Counts one removal (or failed removal) of the startup taint.
    pub(crate) fn taint_removal(&self, r: NodeChange) {
        self.taint_removals.get_or_create(&result(r.as_str())).inc();
    }

    /// Whether the node carries the startup taint now.
    pub(crate) fn set_taint_present(&self, on: bool) {
        self.taint_present.set(i64::from(on));
    }

    /// How many eviction attempts had `r` so far.
    #[cfg(any(test, feature = "test-support"))]
    pub fn evictions(&self, r: EvictionResult) -> u64 {
        self.evictions.get_or_create(&result(r.as_str())).get()
    }

    /// How many cordon changes had `r` so far.
    #[cfg(any(test, feature = "test-support"))]
    pub fn cordons(&self, r: NodeChange) -> u64 {
        self.cordons.get_or_create(&result(r.as_str())).get()
    }

    /// Whether the node carries the startup taint, as dxdp last saw it.
    #[cfg(any(test, feature = "test-support"))]
    pub fn taint_present(&self) -> bool {
        self.taint_present.get() == 1
    }

    /// How many startup-taint removals had `r` so far.
    #[cfg(any(test, feature = "test-support"))]
    pub fn taint_removals(&self, r: NodeChange) -> u64 {
        self.taint_removals.get_or_create(&result(r.as_str())).get()
    }
}
