//! The in-cluster validation's metrics (`validation::task`):
//!
//! - `dxdp_validation_last_success_timestamp_seconds{resource}`: when a validation of the
//!   resource last passed (Unix time; no series before the first pass);
//! - `dxdp_validation_checks{check, result}`: 1 for each check's result in the last run (none
//!   after a run without a result). Check names are the bounded list of [`KNOWN_CHECKS`]; any
//!   other name is counted as `other`; results are `dxdp validate`'s (`pass`, `fail`,
//!   `timed-out`, `absent`, `skipped`, `unknown`);
//! - `dxdp_validation_runs_total{result}`: runs, by verdict.
//!
//! Names and labels are a public interface (docs/observability.md lists them).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

/// The check names `dxdp validate` reports; others become `other` (bounded cardinality).
pub(crate) const KNOWN_CHECKS: [&str; 10] = [
    "adapters",
    "d3d12",
    "runtime-files",
    "cuda",
    "nvml",
    "opencl",
    "vulkan",
    "nvenc",
    "amf",
    "vpl",
];

/// The verdicts of a run, as `result` values.
pub(crate) const VERDICTS: [&str; 3] = ["pass", "fail", "unknown"];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabel {
    resource: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    check: String,
    result: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

/// The validation part of the daemon's metrics. Clones share the same values.
#[derive(Debug, Clone)]
pub(crate) struct ValidationMetrics {
    last_success: Family<ResourceLabel, Gauge>,
    checks: Arc<RwLock<BTreeMap<String, String>>>,
    runs: Family<ResultLabel, Counter>,
}

#[derive(Debug)]
struct ChecksCollector {
    checks: Arc<RwLock<BTreeMap<String, String>>>,
}

impl Collector for ChecksCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let checks = self
            .checks
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut family = encoder.encode_descriptor(
            "dxdp_validation_checks",
            "1 for each validation check's result in the last validation run",
            None,
            MetricType::Gauge,
        )?;
        for (check, result) in checks {
            let labels = CheckLabels { check, result };
            ConstGauge::new(1i64).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

impl ValidationMetrics {
    /// Registers the validation metrics in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let last_success = Family::<ResourceLabel, Gauge>::default();
        registry.register_with_unit(
            "dxdp_validation_last_success_timestamp",
            "When a validation Job last passed with a device of the resource (Unix time)",
            Unit::Seconds,
            last_success.clone(),
        );
        let runs = Family::<ResultLabel, Counter>::default();
        registry.register(
            "dxdp_validation_runs",
            "Validation Jobs run, by verdict (pass, fail, unknown)",
            runs.clone(),
        );
        let checks = Arc::new(RwLock::new(BTreeMap::new()));
        registry.register_collector(Box::new(ChecksCollector {
            checks: checks.clone(),
        }));
        ValidationMetrics {
            last_success,
            checks,
            runs,
        }
    }

    /// Creates the run counters at 0 (when validation is on).
    pub(crate) fn init(&self) {
        for v in VERDICTS {
            drop(self.runs.get_or_create(&ResultLabel {
                result: v.to_string(),
            }));
        }
    }

    /// Records one run: its verdict, each check's result (`(name, result)`), and for a pass the
    /// time `now` (Unix seconds) for every resource it validated.
    pub(crate) fn record(
        &self,
        verdict: &str,
        checks: &[(String, String)],
        resources: &[String],
        now: u64,
    ) {
        self.runs
            .get_or_create(&ResultLabel {
                result: verdict.to_string(),
            })
            .inc();
        let mut current = BTreeMap::new();
        for (name, result) in checks {
            let name = if KNOWN_CHECKS.contains(&name.as_str()) {
                name.clone()
            } else {
                "other".to_string()
            };
            // Of several `other`s the first failure shows.
            current.entry(name).or_insert_with(|| result.clone());
        }
        *self.checks.write().unwrap_or_else(|p| p.into_inner()) = current;
        if verdict == "pass" {
            for r in resources {
                self.last_success
                    .get_or_create(&ResourceLabel {
                        resource: r.clone(),
                    })
                    .set(i64::try_from(now).unwrap_or(i64::MAX));
            }
        }
    }

    /// The last success time of `resource` (for tests; `None` before the first pass).
    #[cfg(test)]
    pub(crate) fn last_success(&self, resource: &str) -> Option<i64> {
        let l = ResourceLabel {
            resource: resource.to_string(),
        };
        self.last_success.get(&l).map(|g| g.get())
    }

    /// The runs with `verdict` so far (for tests).
    #[cfg(test)]
    pub(crate) fn runs(&self, verdict: &str) -> u64 {
        self.runs
            .get_or_create(&ResultLabel {
                result: verdict.to_string(),
            })
            .get()
    }

    /// The last run's check results (for tests).
    #[cfg(test)]
    pub(crate) fn checks(&self) -> BTreeMap<String, String> {
        self.checks
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_exported_with_bounded_check_names() {
        let mut registry = Registry::default();
        let m = ValidationMetrics::register(&mut registry);
        m.init();
        let checks: Vec<(String, String)> = [
            ("adapters", "pass"),
            ("cuda", "fail"),
            ("vulkan", "absent"),
            ("some-new-check", "timed-out"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        m.record(
            "fail",
            &checks,
            &["directx.microsoft.com/display".to_string()],
            1764110000,
        );
        m.record(
            "pass",
            &checks[..1],
            &["directx.microsoft.com/display".to_string()],
            1764120000,
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "dxdp_validation_last_success_timestamp_seconds{resource=\"directx.microsoft.com/display\"} 1764120000",
            "dxdp_validation_runs_total{result=\"pass\"} 1",
            "dxdp_validation_runs_total{result=\"fail\"} 1",
            "dxdp_validation_runs_total{result=\"unknown\"} 0",
            "dxdp_validation_checks{check=\"adapters\",result=\"pass\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
        // The last run replaces the checks of the one before.
        assert!(!text.contains("check=\"cuda\""), "{text}");
        m.record("fail", &checks, &[], 1764130000);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("dxdp_validation_checks{check=\"other\",result=\"timed-out\"} 1"));
        assert!(text.contains("dxdp_validation_checks{check=\"cuda\",result=\"fail\"} 1"));
    }
}
