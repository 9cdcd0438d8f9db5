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
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds (seconds) of the Allocate duration buckets: Allocate is pure computation over
/// the inventory, normally well under a millisecond; the top buckets catch a starved process.
pub const ALLOCATE_BUCKETS: [f64; 12] = [
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
struct OutcomeLabel {
    result: String,
}

type HistogramFamily = Family<ResourceLabel, Histogram, fn() -> Histogram>;

fn allocate_histogram() -> Histogram {
    Histogram::new(ALLOCATE_BUCKETS)
}

/// What a configuration reload did (`dxdp_config_reloads_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadResult {
    /// A changed, valid configuration was published.
    Applied,
    /// The files were re-read after a change event and nothing effective changed.
    Unchanged,
    /// The configuration was invalid or cannot be served; the running one stays.
    Rejected,
}

impl ReloadResult {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ReloadResult::Applied => "applied",
            ReloadResult::Unchanged => "unchanged",
            ReloadResult::Rejected => "rejected",
        }
    }
}

/// The devices of one served name, for the device gauges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceCounts {
    /// The served resource name.
    pub resource: String,
    /// Healthy physical devices.
    pub healthy: u64,
    /// Unhealthy physical devices.
    pub unhealthy: u64,
    /// Devices the kubelet sees (physical devices times replicas).
    pub advertised: u64,
}

struct Inner {
    registry: Registry,
    devices: Family<DeviceLabels, Gauge>,
    advertised: Family<ResourceLabel, Gauge>,
    allocations: Family<ResultLabels, Counter>,
    allocate_duration: HistogramFamily,
    registrations: Family<ResultLabels, Counter>,
    registered: Family<ResourceLabel, Gauge>,
    host_refreshes: Family<OutcomeLabel, Counter>,
    config_reloads: Family<OutcomeLabel, Counter>,
    /// The names `registered` has label sets for.
    registered_names: Mutex<BTreeSet<String>>,
    /// The names `devices` and `advertised` have label sets for.
    device_names: Mutex<BTreeSet<String>>,
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
        registry.register(
            "dxdp_build",
            "The running dxdp's version and git commit",
            Info::new(vec![
                ("version".to_string(), env!("CARGO_PKG_VERSION").to_string()),
                ("commit".to_string(), env!("DXDP_GIT_COMMIT").to_string()),
            ]),
        );
        Metrics {
            inner: Arc::new(Inner {
                registry,
                devices,
                advertised,
                allocations,
                allocate_duration,
                registrations,
                registered,
                host_refreshes,
                config_reloads,
                registered_names: Mutex::default(),
                device_names: Mutex::default(),
            }),
        }
    }

    /// The OpenMetrics text of every metric (serve it as [`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.inner.registry);
        out
    }

    /// The recorder for Allocate calls of one served name. Resolve it once per service: its
    /// record method then touches only the metrics' own atomics (and the histogram's
    /// uncontended lock), never the label maps.
    pub fn allocate_recorder(&self, resource: &str) -> AllocateRecorder {
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

    /// Counts one Register call.
    pub fn registration(&self, resource: &str, ok: bool) {
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
    pub fn set_registered(&self, served: &[String], registered: &[String]) {
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
    pub fn set_devices(&self, counts: &[DeviceCounts]) {
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
        }
    }

    /// Counts one reload of the host facts.
    pub fn host_refresh(&self, ok: bool) {
        self.inner
            .host_refreshes
            .get_or_create(&outcome(if ok { "ok" } else { "error" }))
            .inc();
    }

    /// Counts one configuration reload.
    pub fn config_reload(&self, result: ReloadResult) {
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
pub struct AllocateRecorder {
    ok: Counter,
    error: Counter,
    duration: Histogram,
}

impl AllocateRecorder {
    /// Counts one answered Allocate call and its duration.
    pub fn record(&self, ok: bool, elapsed: Duration) {
        if ok {
            self.ok.inc();
        } else {
            self.error.inc();
        }
        self.duration.observe(elapsed.as_secs_f64());
    }
}
