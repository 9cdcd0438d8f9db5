//! The daemon's Prometheus metrics: one registry, typed record methods, and the OpenMetrics text
//! for `/metrics`.
//!
//! Names, types and labels are a public interface (dashboards and alerts depend on them):
//! `docs/observability.md` lists every one; change both together. `resource` is always the
//! served resource name (`directx.microsoft.com/display`, or a configured name or alias).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

/// The content type of [`Metrics::encode`]'s text.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds (seconds) of the Allocate duration buckets: Allocate is pure computation over
/// the inventory, normally well under a millisecond; the top buckets catch a starved process.
pub(crate) const ALLOCATE_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabel {
    resource: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeviceLabels {
    resource: String,
    health: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    resource: String,
    result: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabel {
    task: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    result: String,
}

type HistogramFamily = Family<ResourceLabel, Histogram, fn() -> Histogram>;

fn allocate_histogram() -> Histogram {
    Histogram::new(ALLOCATE_BUCKETS)
}

/// What a configuration reload did (`dxdp_config_reloads_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReloadResult {
    /// A changed, valid configuration was published.
    Applied,
    /// The files were re-read after a change event and nothing effective changed.
    Unchanged,
    /// The configuration was invalid or cannot be served; the running one stays.
    Rejected,
}

impl ReloadResult {
    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ReloadResult::Applied => "applied",
            ReloadResult::Unchanged => "unchanged",
            ReloadResult::Rejected => "rejected",
        }
    }
}

/// `dxdp_log_lines_dropped_total`: read from the log writer ([`crate::logging::lines_dropped`])
/// when the metrics are encoded, so that logging itself touches no metric.
#[derive(Debug)]
struct LogLinesDropped;

impl prometheus_client::encoding::EncodeMetric for LogLinesDropped {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(
            &crate::logging::lines_dropped(),
            None,
        )
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Counter
    }
}

/// The devices of one served name, for the device gauges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceCounts {
    /// The served resource name.
    pub(crate) resource: String,
    /// Healthy physical devices.
    pub(crate) healthy: u64,
    /// Unhealthy physical devices.
    pub(crate) unhealthy: u64,
    /// Devices the kubelet sees (physical devices times replicas).
    pub(crate) advertised: u64,
    /// `health.expectedDevices` for the resource, and how many of them are missing
    /// (`dxdp_expected_devices`, `dxdp_missing_devices`; `None`: no expectation, no series).
    pub(crate) expected: Option<(u64, u64)>,
}

struct Inner {
    registry: Registry,
    devices: Family<DeviceLabels, Gauge>,
    advertised: Family<ResourceLabel, Gauge>,
    expected: Family<ResourceLabel, Gauge>,
    missing: Family<ResourceLabel, Gauge>,
    allocations: Family<ResultLabels, Counter>,
    allocate_duration: HistogramFamily,
    registrations: Family<ResultLabels, Counter>,
    registered: Family<ResourceLabel, Gauge>,
    host_refreshes: Family<OutcomeLabel, Counter>,
    config_reloads: Family<OutcomeLabel, Counter>,
    config_rejected: Gauge,
    config_fallback: Gauge,
    task_up: Family<TaskLabel, Gauge>,
    task_restarts: Family<TaskLabel, Counter>,
    /// The names `registered` has label sets for.
    registered_names: Mutex<BTreeSet<String>>,
    /// The names `devices` and `advertised` have label sets for.
    device_names: Mutex<BTreeSet<String>>,
    /// GPU telemetry (`observe::telemetry_metrics`).
    telemetry: super::telemetry_metrics::TelemetryMetrics,
    /// The GPU isolation audit (`observe::isolation_metrics`).
    isolation: super::isolation_metrics::IsolationMetrics,
    /// GPU memory over-use (`observe::overuse_metrics`).
    overuse: super::overuse_metrics::OverUseMetrics,
    /// Who may read `/metrics` (`observe::access`).
    access: super::access::AccessMetrics,
    reviews: super::review_metrics::ReviewMetrics,
    /// Device health (`observe::device_health`).
    device_health: super::device_health::HealthMetrics,
    /// The in-cluster validation (`observe::validation`).
    validation: super::validation::ValidationMetrics,
    /// The startup taint and remediation (`observe::remediation_metrics`).
    remediation: super::remediation_metrics::RemediationMetrics,
    /// The node labels' writes (`observe::label_metrics`).
    labels: super::label_metrics::LabelMetrics,
}

/// The metrics of one daemon. Clones share the same values.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered (and `dxdp_build_info` set).
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let devices = Family::<DeviceLabels, Gauge>::default();
        registry.register(
            "dxdp_devices",
            "Physical devices of each served resource, by health",
            devices.clone(),
        );
        let advertised = Family::<ResourceLabel, Gauge>::default();
        registry.register(
            "dxdp_advertised_devices",
            "Devices advertised to the kubelet (physical devices times replicas)",
            advertised.clone(),
        );
        let expected = Family::<ResourceLabel, Gauge>::default();
        registry.register(
            "dxdp_expected_devices",
            "Physical devices the node should have per served resource (health.expectedDevices, given or from the instance type); absent without an expectation",
            expected.clone(),
        );
        let missing = Family::<ResourceLabel, Gauge>::default();
        registry.register(
            "dxdp_missing_devices",
            "Expected physical devices that are not on the host (gone, or removed while held); absent without an expectation",
            missing.clone(),
        );
        let allocations = Family::<ResultLabels, Counter>::default();
        registry.register(
            "dxdp_allocations",
            "Allocate calls answered, by result (ok or error)",
            allocations.clone(),
        );
        let allocate_duration: HistogramFamily =
            Family::new_with_constructor(allocate_histogram as fn() -> Histogram);
        registry.register_with_unit(
            "dxdp_allocate_duration",
            "Time to answer an Allocate call",
            Unit::Seconds,
            allocate_duration.clone(),
        );
        let registrations = Family::<ResultLabels, Counter>::default();
        registry.register(
            "dxdp_kubelet_registrations",
            "Register calls to the kubelet, by result (ok or error)",
            registrations.clone(),
        );
        let registered = Family::<ResourceLabel, Gauge>::default();
        registry.register(
            "dxdp_kubelet_registered",
            "1 while the resource is registered with the current kubelet, else 0",
            registered.clone(),
        );
        let host_refreshes = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "dxdp_host_refreshes",
            "Reloads of the host facts after a device event or change, by result (ok or error)",
            host_refreshes.clone(),
        );
        let config_reloads = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "dxdp_config_reloads",
            "Configuration reloads, by result (applied, unchanged or rejected)",
            config_reloads.clone(),
        );
        let config_rejected = Gauge::default();
        registry.register(
            "dxdp_config_rejected",
            "1 while the configuration as it reads now is rejected (at start or by the last reload) and an earlier one is served, else 0",
            config_rejected.clone(),
        );
        let config_fallback = Gauge::default();
        registry.register(
            "dxdp_config_fallback",
            "1 while the daemon serves the last configuration this node served, kept on the host, because the configuration was rejected at start (/readyz fails meanwhile), else 0",
            config_fallback.clone(),
        );
        let task_up = Family::<TaskLabel, Gauge>::default();
        registry.register(
            "dxdp_task_up",
            "1 while the daemon's long-lived task runs, 0 while it waits to be restarted",
            task_up.clone(),
        );
        let task_restarts = Family::<TaskLabel, Counter>::default();
        registry.register(
            "dxdp_task_restarts",
            "Times a long-lived task ended or panicked and was restarted (or, for a required task, gave up)",
            task_restarts.clone(),
        );
        registry.register(
            "dxdp_log_lines_dropped",
            "Log lines dropped because stderr was not read fast enough (the log queue was full) or failed",
            LogLinesDropped,
        );
        registry.register(
            "dxdp_build",
            "The running dxdp's version and git commit",
            Info::new(vec![
                ("version".to_string(), env!("CARGO_PKG_VERSION").to_string()),
                ("commit".to_string(), env!("DXDP_GIT_COMMIT").to_string()),
            ]),
        );
        // Series whose labels are known from the start exist from the start, at 0, so that
        // rate() and increase() see their first increment.
        for r in ["ok", "error"] {
            drop(host_refreshes.get_or_create(&outcome(r)));
        }
        for r in [
            ReloadResult::Applied,
            ReloadResult::Unchanged,
            ReloadResult::Rejected,
        ] {
            drop(config_reloads.get_or_create(&outcome(r.as_str())));
        }
        let telemetry = super::telemetry_metrics::TelemetryMetrics::register(&mut registry);
        let isolation = super::isolation_metrics::IsolationMetrics::register(&mut registry);
        let overuse = super::overuse_metrics::OverUseMetrics::register(&mut registry);
        let access = super::access::AccessMetrics::register(&mut registry);
        let reviews = super::review_metrics::ReviewMetrics::register(&mut registry);
        let device_health = super::device_health::HealthMetrics::register(&mut registry);
        let validation = super::validation::ValidationMetrics::register(&mut registry);
        let remediation = super::remediation_metrics::RemediationMetrics::register(&mut registry);
        let labels = super::label_metrics::LabelMetrics::register(&mut registry);
        Metrics {
            inner: Arc::new(Inner {
                registry,
                devices,
                advertised,
                expected,
                missing,
                allocations,
                allocate_duration,
                registrations,
                registered,
                host_refreshes,
                config_reloads,
                config_rejected,
                config_fallback,
                task_up,
                task_restarts,
                registered_names: Mutex::default(),
                device_names: Mutex::default(),
                telemetry,
                isolation,
                overuse,
                access,
                reviews,
                device_health,
                validation,
                remediation,
                labels,
            }),
        }
    }

    /// The OpenMetrics text of every metric (serve it as `CONTENT_TYPE`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.inner.registry);
        out
    }

    /// The recorder for Allocate calls of one served name. Resolve it once per service: its
    /// record method then touches only the metrics' own atomics (and the histogram's
    /// uncontended lock), never the label maps.
    pub(crate) fn allocate_recorder(&self, resource: &str) -> AllocateRecorder {
        let result = |r: &str| ResultLabels {
            resource: resource.to_string(),
            result: r.to_string(),
        };
        AllocateRecorder {
            ok: self.inner.allocations.get_or_create_owned(&result("ok")),
            error: self.inner.allocations.get_or_create_owned(&result("error")),
            duration: self
                .inner
                .allocate_duration
                .get_or_create_owned(&ResourceLabel {
                    resource: resource.to_string(),
                }),
        }
    }

    /// Creates the per-resource counters of a served name at 0 (Allocate results and
    /// registrations), so that they exist before the first event.
    pub(crate) fn init_resource(&self, resource: &str) {
        let _ = self.allocate_recorder(resource);
        for result in ["ok", "error"] {
            drop(self.inner.registrations.get_or_create(&ResultLabels {
                resource: resource.to_string(),
                result: result.to_string(),
            }));
        }
    }

    /// Counts one Register call.
    pub(crate) fn registration(&self, resource: &str, ok: bool) {
        self.inner
            .registrations
            .get_or_create(&ResultLabels {
                resource: resource.to_string(),
                result: if ok { "ok" } else { "error" }.to_string(),
            })
            .inc();
    }

    /// Sets `dxdp_kubelet_registered` for every served name (1 for those in `registered`) and
    /// drops the names no longer served.
    pub(crate) fn set_registered(&self, served: &[String], registered: &[String]) {
        for name in served {
            self.inner
                .registered
                .get_or_create(&label(name))
                .set(i64::from(registered.contains(name)));
        }
        for name in gone(&self.inner.registered_names, served) {
            self.inner.registered.remove(&label(&name));
        }
    }

    /// Sets the device gauges to `counts` (one entry per served name) and drops the names no
    /// longer served.
    pub(crate) fn set_devices(&self, counts: &[DeviceCounts]) {
        for c in counts {
            for (health, n) in [("Healthy", c.healthy), ("Unhealthy", c.unhealthy)] {
                self.inner
                    .devices
                    .get_or_create(&DeviceLabels {
                        resource: c.resource.clone(),
                        health: health.to_string(),
                    })
                    .set(gauge_value(n));
            }
            self.inner
                .advertised
                .get_or_create(&label(&c.resource))
                .set(gauge_value(c.advertised));
            match c.expected {
                Some((expected, missing)) => {
                    (self.inner.expected)
                        .get_or_create(&label(&c.resource))
                        .set(gauge_value(expected));
                    (self.inner.missing)
                        .get_or_create(&label(&c.resource))
                        .set(gauge_value(missing));
                }
                None => {
                    self.inner.expected.remove(&label(&c.resource));
                    self.inner.missing.remove(&label(&c.resource));
                }
            }
        }
        let served: Vec<String> = counts.iter().map(|c| c.resource.clone()).collect();
        for name in gone(&self.inner.device_names, &served) {
            for health in ["Healthy", "Unhealthy"] {
                self.inner.devices.remove(&DeviceLabels {
                    resource: name.clone(),
                    health: health.to_string(),
                });
            }
            self.inner.advertised.remove(&label(&name));
            self.inner.expected.remove(&label(&name));
            self.inner.missing.remove(&label(&name));
        }
    }

    /// The GPU telemetry metrics.
    pub fn telemetry(&self) -> &super::telemetry_metrics::TelemetryMetrics {
        &self.inner.telemetry
    }

    /// The access checks' metrics (denied requests, web configuration reloads).
    pub fn access(&self) -> &super::access::AccessMetrics {
        &self.inner.access
    }

    /// The token reviews' metrics (`metrics.authorization: kubernetes`).
    pub(crate) fn reviews(&self) -> &super::review_metrics::ReviewMetrics {
        &self.inner.reviews
    }

    /// The GPU isolation audit's metrics.
    pub fn isolation(&self) -> &super::isolation_metrics::IsolationMetrics {
        &self.inner.isolation
    }

    /// The GPU memory over-use metrics.
    pub fn overuse(&self) -> &super::overuse_metrics::OverUseMetrics {
        &self.inner.overuse
    }

    /// The device health metrics.
    pub fn device_health(&self) -> &super::device_health::HealthMetrics {
        &self.inner.device_health
    }

    /// The startup taint's and remediation's metrics.
    pub fn remediation(&self) -> &super::remediation_metrics::RemediationMetrics {
        &self.inner.remediation
    }

    /// The node labels' write counter.
    pub(crate) fn labels(&self) -> &super::label_metrics::LabelMetrics {
        &self.inner.labels
    }

    /// The in-cluster validation's metrics.
    pub(crate) fn validation(&self) -> &super::validation::ValidationMetrics {
        &self.inner.validation
    }

    /// Counts one reload of the host facts.
    pub(crate) fn host_refresh(&self, ok: bool) {
        self.inner
            .host_refreshes
            .get_or_create(&outcome(if ok { "ok" } else { "error" }))
            .inc();
    }

    /// Creates the series of `task` (at 0 restarts).
    pub(crate) fn init_task(&self, task: &str) {
        drop(self.inner.task_restarts.get_or_create(&task_label(task)));
    }

    /// Sets whether `task` runs.
    pub(crate) fn set_task_up(&self, task: &str, up: bool) {
        self.inner
            .task_up
            .get_or_create(&task_label(task))
            .set(i64::from(up));
    }

    /// Counts one unexpected end of `task`.
    pub(crate) fn task_restart(&self, task: &str) {
        self.inner
            .task_restarts
            .get_or_create(&task_label(task))
            .inc();
    }

    /// Sets whether the configuration as it reads now is rejected.
    pub(crate) fn set_config_rejected(&self, rejected: bool) {
        self.inner.config_rejected.set(i64::from(rejected));
    }

    /// Sets whether the last-served configuration kept on the host is served instead of the
    /// configured one.
    pub(crate) fn set_config_fallback(&self, fallback: bool) {
        self.inner.config_fallback.set(i64::from(fallback));
    }

    /// Counts one configuration reload.
    pub(crate) fn config_reload(&self, result: ReloadResult) {
        self.inner
            .config_reloads
            .get_or_create(&outcome(result.as_str()))
            .inc();
    }
}

fn label(resource: &str) -> ResourceLabel {
    ResourceLabel {
        resource: resource.to_string(),
    }
}

fn task_label(task: &str) -> TaskLabel {
    TaskLabel {
        task: task.to_string(),
    }
}

fn outcome(result: &str) -> OutcomeLabel {
    OutcomeLabel {
        result: result.to_string(),
    }
}

fn gauge_value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Replaces the names in `known` by `served` and returns the names that are gone.
fn gone(known: &Mutex<BTreeSet<String>>, served: &[String]) -> Vec<String> {
    let mut known = known.lock().unwrap_or_else(|p| p.into_inner());
    let now: BTreeSet<String> = served.iter().cloned().collect();
    let gone = known.difference(&now).cloned().collect();
    *known = now;
    gone
}

/// Records Allocate calls of one served name.
#[derive(Debug, Clone)]
pub(crate) struct AllocateRecorder {
    ok: Counter,
    error: Counter,
    duration: Histogram,
}

impl AllocateRecorder {
    /// Counts one answered Allocate call and its duration.
    pub(crate) fn record(&self, ok: bool, elapsed: Duration) {
        if ok {
            self.ok.inc();
        } else {
            self.error.inc();
        }
        self.duration.observe(elapsed.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `series -> value` of every sample line of OpenMetrics text.
    fn samples(text: &str) -> std::collections::BTreeMap<String, String> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| l.rsplit_once(' '))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const X: &str = "a.example/x";

    #[test]
    fn every_metric_has_its_name_type_and_the_text_ends_as_openmetrics_requires() {
        let m = Metrics::new();
        let s = samples(&m.encode());
        for series in [
            "dxdp_host_refreshes_total{result=\"ok\"}",
            "dxdp_host_refreshes_total{result=\"error\"}",
            "dxdp_config_reloads_total{result=\"applied\"}",
            "dxdp_config_reloads_total{result=\"unchanged\"}",
            "dxdp_config_reloads_total{result=\"rejected\"}",
            "dxdp_config_rejected",
            "dxdp_config_fallback",
        ] {
            assert_eq!(
                s.get(series).map(String::as_str),
                Some("0"),
                "{series}: {s:#?}"
            );
        }
        m.init_resource(X);
        m.set_devices(&[DeviceCounts {
            resource: X.into(),
            healthy: 1,
            unhealthy: 0,
            advertised: 1,
            expected: Some((2, 1)),
        }]);
        m.set_registered(&[X.into()], &[]);
        let text = m.encode();
        for (name, kind) in [
            ("dxdp_devices", "gauge"),
            ("dxdp_advertised_devices", "gauge"),
            ("dxdp_expected_devices", "gauge"),
            ("dxdp_missing_devices", "gauge"),
            ("dxdp_allocations", "counter"),
            ("dxdp_allocate_duration_seconds", "histogram"),
            ("dxdp_kubelet_registrations", "counter"),
            ("dxdp_kubelet_registered", "gauge"),
            ("dxdp_host_refreshes", "counter"),
            ("dxdp_config_reloads", "counter"),
            ("dxdp_config_rejected", "gauge"),
            ("dxdp_config_fallback", "gauge"),
            ("dxdp_build", "info"),
        ] {
            let line = format!("# TYPE {name} {kind}\n");
            assert!(text.contains(&line), "{line:?} missing in\n{text}");
        }
        assert!(text.contains("# UNIT dxdp_allocate_duration_seconds seconds\n"));
        assert!(text.ends_with("# EOF\n"), "{text}");
        let s = samples(&text);
        for series in [
            "dxdp_allocations_total{resource=\"a.example/x\",result=\"ok\"}",
            "dxdp_allocations_total{resource=\"a.example/x\",result=\"error\"}",
            "dxdp_allocate_duration_seconds_count{resource=\"a.example/x\"}",
            "dxdp_kubelet_registrations_total{resource=\"a.example/x\",result=\"ok\"}",
            "dxdp_kubelet_registrations_total{resource=\"a.example/x\",result=\"error\"}",
            "dxdp_kubelet_registered{resource=\"a.example/x\"}",
            "dxdp_devices{resource=\"a.example/x\",health=\"Unhealthy\"}",
        ] {
            assert_eq!(
                s.get(series).map(String::as_str),
                Some("0"),
                "{series}: {s:#?}"
            );
        }
        assert_eq!(
            s.get("dxdp_expected_devices{resource=\"a.example/x\"}")
                .map(String::as_str),
            Some("2")
        );
        assert_eq!(
            s.get("dxdp_missing_devices{resource=\"a.example/x\"}")
                .map(String::as_str),
            Some("1")
        );
        let info = format!(
            "dxdp_build_info{{version=\"{}\",commit=\"{}\"}}",
            env!("CARGO_PKG_VERSION"),
            env!("DXDP_GIT_COMMIT")
        );
        assert_eq!(s.get(&info).map(String::as_str), Some("1"), "{text}");
    }

    #[test]
    fn allocations_registrations_refreshes_and_reloads_count_by_result() {
        let m = Metrics::new();
        let rec = m.allocate_recorder(X);
        rec.record(true, Duration::from_micros(50));
        rec.record(true, Duration::from_millis(3));
        rec.record(false, Duration::from_secs(2));
        // A second recorder of the same name shares the counters.
        m.allocate_recorder(X).record(true, Duration::ZERO);
        m.registration(X, false);
        m.registration(X, false);
        m.registration(X, true);
        m.host_refresh(true);
        m.host_refresh(false);
        m.host_refresh(true);
        m.config_reload(ReloadResult::Applied);
        m.config_reload(ReloadResult::Rejected);
        m.config_reload(ReloadResult::Rejected);
        m.config_reload(ReloadResult::Unchanged);
        let s = samples(&m.encode());
        let expect = [
            (
                "dxdp_allocations_total{resource=\"a.example/x\",result=\"ok\"}",
                "3",
            ),
            (
                "dxdp_allocations_total{resource=\"a.example/x\",result=\"error\"}",
                "1",
            ),
            (
                "dxdp_allocate_duration_seconds_count{resource=\"a.example/x\"}",
                "4",
            ),
            // 0 and 50 µs fall in the first bucket (0.1 ms), 3 ms in the 5 ms one, 2 s only in +Inf.
            (
                "dxdp_allocate_duration_seconds_bucket{le=\"0.0001\",resource=\"a.example/x\"}",
                "2",
            ),
            (
                "dxdp_allocate_duration_seconds_bucket{le=\"0.0025\",resource=\"a.example/x\"}",
                "2",
            ),
            (
                "dxdp_allocate_duration_seconds_bucket{le=\"0.005\",resource=\"a.example/x\"}",
                "3",
            ),
            (
                "dxdp_allocate_duration_seconds_bucket{le=\"1.0\",resource=\"a.example/x\"}",
                "3",
            ),
            (
                "dxdp_allocate_duration_seconds_bucket{le=\"+Inf\",resource=\"a.example/x\"}",
                "4",
            ),
            (
                "dxdp_kubelet_registrations_total{resource=\"a.example/x\",result=\"error\"}",
                "2",
            ),
            (
                "dxdp_kubelet_registrations_total{resource=\"a.example/x\",result=\"ok\"}",
                "1",
            ),
            ("dxdp_host_refreshes_total{result=\"ok\"}", "2"),
            ("dxdp_host_refreshes_total{result=\"error\"}", "1"),
            ("dxdp_config_reloads_total{result=\"applied\"}", "1"),
            ("dxdp_config_reloads_total{result=\"rejected\"}", "2"),
            ("dxdp_config_reloads_total{result=\"unchanged\"}", "1"),
        ];
        for (series, value) in expect {
            assert_eq!(
                s.get(series).map(String::as_str),
                Some(value),
                "{series}: {s:#?}"
            );
        }
        let sum: f64 = s["dxdp_allocate_duration_seconds_sum{resource=\"a.example/x\"}"]
            .parse()
            .unwrap();
        assert!((sum - 2.00305).abs() < 1e-9, "{sum}");
    }

    #[test]
    fn gauges_follow_the_served_names_and_drop_names_no_longer_served() {
        let m = Metrics::new();
        let y = "a.example/y";
        m.set_devices(&[
            DeviceCounts {
                resource: X.into(),
                healthy: 2,
                unhealthy: 1,
                advertised: 6,
                expected: None,
            },
            DeviceCounts {
                resource: y.into(),
                healthy: 0,
                unhealthy: 0,
                advertised: 0,
                expected: None,
            },
        ]);
        m.set_registered(&[X.into(), y.into()], &[y.into()]);
        let s = samples(&m.encode());
        let expect = [
            (
                "dxdp_devices{resource=\"a.example/x\",health=\"Healthy\"}",
                "2",
            ),
            (
                "dxdp_devices{resource=\"a.example/x\",health=\"Unhealthy\"}",
                "1",
            ),
            (
                "dxdp_devices{resource=\"a.example/y\",health=\"Healthy\"}",
                "0",
            ),
            ("dxdp_advertised_devices{resource=\"a.example/x\"}", "6"),
            ("dxdp_advertised_devices{resource=\"a.example/y\"}", "0"),
            ("dxdp_kubelet_registered{resource=\"a.example/x\"}", "0"),
            ("dxdp_kubelet_registered{resource=\"a.example/y\"}", "1"),
        ];
        for (series, value) in expect {
            assert_eq!(
                s.get(series).map(String::as_str),
                Some(value),
                "{series}: {s:#?}"
            );
        }
        // y is no longer served: its series go, x's stay.
        m.set_devices(&[DeviceCounts {
            resource: X.into(),
            healthy: 3,
            unhealthy: 0,
            advertised: 3,
            expected: None,
        }]);
        m.set_registered(&[X.into()], &[X.into()]);
        let s = samples(&m.encode());
        assert!(!s.keys().any(|k| k.contains(y)), "{s:#?}");
        assert_eq!(
            s["dxdp_devices{resource=\"a.example/x\",health=\"Healthy\"}"],
            "3"
        );
        assert_eq!(
            s["dxdp_devices{resource=\"a.example/x\",health=\"Unhealthy\"}"],
            "0"
        );
        assert_eq!(s["dxdp_kubelet_registered{resource=\"a.example/x\"}"], "1");
    }
}
