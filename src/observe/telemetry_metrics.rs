//! The GPU telemetry metrics: the figures of the latest sample (encoded at each scrape from one
//! shared, immutable view, so that series of devices and pods that are gone disappear at once),
//! and the sampler's own counters.
//!
//! Names and labels are a public interface; `docs/observability.md` lists them.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use dxdp_core::health::Hot;
use dxdp_core::telemetry::compute::{DeviceTelemetry, TelemetryView};
use dxdp_core::telemetry::sensors::{ClockFigure, Figure, SensorSource, SensorView};

use super::podinfo::PodInfo;

/// Upper bounds (seconds) of the sample duration buckets: a sample reads a few thousand counter
/// values and should take well under 10 ms.
pub(crate) const SAMPLE_BUCKETS: [f64; 10] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.0,
];

/// The `result` label of the telemetry and isolation counters.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResultLabel {
    result: String,
}

/// What one sample attempt gave (`dxdp_telemetry_samples_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleResult {
    /// The counters were read and the figures published.
    Ok,
    /// The counters could not be read (the last figures were withdrawn).
    Error,
    /// The read did not finish within its timeout.
    Timeout,
}

impl SampleResult {
    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SampleResult::Ok => "ok",
            SampleResult::Error => "error",
            SampleResult::Timeout => "timeout",
        }
    }
}

/// The telemetry part of the daemon's metrics. Clones share the same values.
#[derive(Debug, Clone)]
pub struct TelemetryMetrics {
    view: Arc<RwLock<Option<Arc<TelemetryView>>>>,
    samples: Family<ResultLabel, Counter>,
    pod_resources: Family<ResultLabel, Counter>,
    cri: Family<ResultLabel, Counter>,
    hcs: Family<ResultLabel, Counter>,
    attribution: Gauge,
    duration: Histogram,
    /// Pod containers left out of the per-pod series ([`super::cardinality`]).
    over_limit: Gauge,
    over_limit_logged: Arc<super::cardinality::LoggedOnce>,
    /// `dxdp_pod_info` of the pods last known ([`super::podinfo`]); `None`: off.
    pod_info: Arc<RwLock<Option<Arc<Vec<PodInfo>>>>>,
    label_collisions: Gauge,
    label_collisions_logged: Arc<super::cardinality::LoggedOnce>,
    /// The devices the `thermal` signal holds now (`dxdp_gpu_thermal`).
    hot: Arc<RwLock<Hot>>,
}

/// Encodes the latest view at each scrape.
#[derive(Debug)]
struct ViewCollector {
    view: Arc<RwLock<Option<Arc<TelemetryView>>>>,
    pod_info: Arc<RwLock<Option<Arc<Vec<PodInfo>>>>>,
    hot: Arc<RwLock<Hot>>,
}

impl TelemetryMetrics {
    /// Registers the sampler's counters and the figures' collector in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let samples = Family::<ResultLabel, Counter>::default();
        registry.register(
            "dxdp_telemetry_samples",
            "GPU telemetry samples, by result (ok, error or timeout)",
            samples.clone(),
        );
        let pod_resources = Family::<ResultLabel, Counter>::default();
        registry.register(
            "dxdp_telemetry_pod_resources_calls",
            "Calls of the kubelet's PodResources List API, by result (ok or error)",
            pod_resources.clone(),
        );
        let cri = Family::<ResultLabel, Counter>::default();
        registry.register(
            "dxdp_telemetry_cri_calls",
            "Calls of the container runtime's CRI API (ListContainers; ListPodSandbox with dxdp_pod_info on), by result (ok or error)",
            cri.clone(),
        );
        let attribution = Gauge::default();
        registry.register(
            "dxdp_telemetry_attribution_current",
            "1 when the last sample had current answers of every attribution source (PodResources, the containers' process lists, CRI) and was judged by the isolation audit, else 0",
            attribution.clone(),
        );
        let hcs = Family::<ResultLabel, Counter>::default();
        registry.register(
            "dxdp_telemetry_hcs_calls",
            "Reads of the containers' process lists from HCS, by result (ok; partial: some running containers could not be read and keep their last process list; error)",
            hcs.clone(),
        );
        let duration = Histogram::new(SAMPLE_BUCKETS);
        registry.register_with_unit(
            "dxdp_telemetry_sample_duration",
            "Time of one sample: reading the GPU counters (and the containers' processes and pods) and computing the figures",
            Unit::Seconds,
            duration.clone(),
        );
        let over_limit = Gauge::default();
        registry.register(
            "dxdp_telemetry_pod_containers_over_limit",
            "Pod containers left out of the per-pod series in the last sample: past the cap of pod containers per node (docs/observability.md)",
            over_limit.clone(),
        );
        let label_collisions = Gauge::default();
        registry.register(
            "dxdp_telemetry_pod_label_collisions",
            "Pod labels left out of dxdp_pod_info in the last sample: their key gives the same label name as another allowed key of the pod (the first key in sorted order is kept)",
            label_collisions.clone(),
        );
        for r in [SampleResult::Ok, SampleResult::Error, SampleResult::Timeout] {
            drop(samples.get_or_create(&result(r.as_str())));
        }
        for r in ["ok", "error"] {
            drop(pod_resources.get_or_create(&result(r)));
            drop(cri.get_or_create(&result(r)));
            drop(hcs.get_or_create(&result(r)));
        }
        drop(hcs.get_or_create(&result("partial")));
        let view = Arc::new(RwLock::new(None));
        let pod_info = Arc::new(RwLock::new(None));
        let hot: Arc<RwLock<Hot>> = Arc::default();
        registry.register_collector(Box::new(ViewCollector {
            view: view.clone(),
            pod_info: pod_info.clone(),
            hot: hot.clone(),
        }));
        TelemetryMetrics {
            view,
            samples,
            pod_resources,
            cri,
            hcs,
            attribution,
            duration,
            over_limit,
            over_limit_logged: Arc::default(),
            pod_info,
            label_collisions,
            label_collisions_logged: Arc::default(),
            hot,
        }
    }

    /// Publishes the devices the `thermal` signal holds now (`dxdp_gpu_thermal`).
    pub(crate) fn publish_hot(&self, hot: Hot) {
        *self.hot.write().unwrap_or_else(|p| p.into_inner()) = hot;
    }

    /// Publishes the `dxdp_pod_info` series of known pods (`None`: off, no series) and how
    /// many pod labels were left out for a name collision. Only the pods with per-pod series
    /// in the published view (within the cap) get a series, so they count against the same cap.
    pub fn publish_pod_info(&self, pods: Option<Vec<PodInfo>>, collisions: usize) {
        self.label_collisions.set(collisions as i64);
        if collisions > 0 {
            self.label_collisions_logged.warn(|| format!("{collisions} pod labels allowed by telemetry.podLabels are left out of dxdp_pod_info: their key gives the same Prometheus label name as another key of the pod, which is kept (the first in sorted order); dxdp_telemetry_pod_label_collisions counts them (logged once)"));
        }
        *self.pod_info.write().unwrap_or_else(|p| p.into_inner()) = pods.map(Arc::new);
    }

    /// Publishes the figures of a sample (`None`: withdraws them).
    /// Per-pod series are kept for at most [`super::cardinality::MAX_POD_CONTAINERS`] pod
    /// containers; the number left out is `dxdp_telemetry_pod_containers_over_limit`.
    pub fn publish(&self, view: Option<Arc<TelemetryView>>) {
        let cap = super::cardinality::MAX_POD_CONTAINERS;
        let (view, left_out) = match view
            .as_deref()
            .and_then(|v| super::cardinality::cap_pods(v, cap))
        {
            Some((capped, left_out)) => (Some(Arc::new(capped)), left_out),
            None => (view, 0),
        };
        self.over_limit.set(left_out as i64);
        if left_out > 0 {
            self.over_limit_logged.warn(|| format!("{left_out} pod containers using GPUs are left out of the per-pod metrics: at most {cap} per node are exported (dxdp_telemetry_pod_containers_over_limit counts them; logged once)"));
        }
        *self.view.write().unwrap_or_else(|p| p.into_inner()) = view;
    }

    /// The figures last published.
    pub fn view(&self) -> Option<Arc<TelemetryView>> {
        self.view.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Counts one sample attempt and how long it took.
    pub(crate) fn sample(&self, outcome: SampleResult, elapsed: Duration) {
        self.samples.get_or_create(&result(outcome.as_str())).inc();
        self.duration.observe(elapsed.as_secs_f64());
    }

    /// Counts one PodResources `List` call.
    pub fn pod_resources_call(&self, ok: bool) {
        self.pod_resources
            .get_or_create(&result(if ok { "ok" } else { "error" }))
            .inc();
    }

    /// Whether the last sample had current answers of every attribution source.
    pub fn attribution_current(&self, current: bool) {
        self.attribution.set(i64::from(current));
    }

    /// Counts one CRI `ListContainers` call.
    pub(crate) fn cri_call(&self, ok: bool) {
        self.cri
            .get_or_create(&result(if ok { "ok" } else { "error" }))
            .inc();
    }

    /// Counts one read of the containers' process lists (HCS): `ok`, `partial` or `error`.
    pub(crate) fn hcs_call(&self, outcome: &str) {
        self.hcs.get_or_create(&result(outcome)).inc();
    }
}

/// The `result` label with value `r`.
pub(super) fn result(r: &str) -> ResultLabel {
    ResultLabel {
        result: r.to_string(),
    }
}

/// A label value without the characters the text format would have to escape.
pub(super) fn clean(value: &str) -> String {
    value
        .chars()
        .map(|c| match c {
            '"' | '\\' => '\'',
            c if c.is_control() => ' ',
            c => c,
        })
        .collect()
}

fn gauge<'a, V: prometheus_client::encoding::EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder<'a>,
    name: &str,
    help: &str,
    series: impl Iterator<Item = (Vec<(&'static str, String)>, V)>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in series {
        metric.encode_family(&labels)?.encode_gauge(&value)?;
    }
    Ok(())
}

/// The sensor series of every device: one per figure a source reports (absent, never 0, when
/// none does), each with its `source`.
fn encode_sensors(
    encoder: &mut DescriptorEncoder<'_>,
    view: &TelemetryView,
    base: impl Fn(&DeviceTelemetry) -> Vec<(&'static str, String)> + Copy,
) -> Result<(), std::fmt::Error> {
    type Get = fn(&SensorView) -> Option<Figure>;
    let figures: [(&str, &str, Get); 6] = [
        (
            "dxdp_gpu_temperature_celsius",
            "GPU temperature, degrees Celsius, by source (nvml, d3dkmt or dxcore); absent when no source reports it.",
            |s| s.temperature_celsius,
        ),
        (
            "dxdp_gpu_temperature_margin_celsius",
            "Warning temperature (where the GPU starts to throttle) minus the current one, degrees Celsius, both from the source named; negative when over it.",
            |s| s.temperature_margin_celsius,
        ),
        (
            "dxdp_gpu_power_ratio",
            "Power draw as a share of the adapter's power limit (0 to 1; D3DKMT).",
            |s| s.power_ratio,
        ),
        (
            "dxdp_gpu_power_watts",
            "Power draw, watts (NVML).",
            |s| s.power_watts,
        ),
        (
            "dxdp_gpu_power_limit_watts",
            "The enforced power limit, watts (NVML).",
            |s| s.power_limit_watts,
        ),
        (
            "dxdp_gpu_fan_rpm",
            "Fan speed, revolutions per minute.",
            |s| s.fan_rpm,
        ),
    ];
    let with_source = |d: &DeviceTelemetry, source: SensorSource| {
        let mut labels = base(d);
        labels.push(("source", source.as_str().to_string()));
        labels
    };
    for (name, help, get) in figures {
        gauge(
            encoder,
            name,
            help,
            view.devices
                .iter()
                .filter_map(|d| get(&d.sensors).map(|f| (with_source(d, f.source), f.value))),
        )?;
    }
    let clock = |d: &DeviceTelemetry, c: &ClockFigure| {
        let mut labels = base(d);
        labels.push(("domain", clean(&c.domain)));
        labels.push(("source", c.source.as_str().to_string()));
        labels
    };
    gauge(
        encoder,
        "dxdp_gpu_clock_hertz",
        "Clock frequency by domain (graphics, memory, sm, video, ...), hertz.",
        view.devices
            .iter()
            .flat_map(|d| d.sensors.clocks.iter().map(move |c| (clock(d, c), c.hertz))),
    )?;
    gauge(
        encoder,
        "dxdp_gpu_clock_max_hertz",
        "The clock domain's highest frequency without overclocking, hertz, where the source reports it.",
        view.devices.iter().flat_map(|d| {
            d.sensors
                .clocks
                .iter()
                .filter_map(move |c| c.max_hertz.map(|m| (clock(d, c), m)))
        }),
    )?;
    gauge(
        encoder,
        "dxdp_gpu_throttled",
        "1 for every reason NVML names for holding the GPU's clocks down now (sw_power_cap, hw_slowdown, sw_thermal_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown, ...); no series while none is named.",
        view.devices.iter().flat_map(|d| {
            let source = d.sensors.throttle_source.unwrap_or(SensorSource::Nvml);
            d.sensors.throttle_reasons.iter().map(move |r| {
                let mut labels = base(d);
                labels.push(("reason", clean(r)));
                labels.push(("source", source.as_str().to_string()));
                (labels, 1_i64)
            })
        }),
    )
}

impl Collector for ViewCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(view) = self.view.read().unwrap_or_else(|p| p.into_inner()).clone() else {
            return Ok(());
        };
        let base = |d: &dxdp_core::telemetry::compute::DeviceTelemetry| {
            vec![
                ("device", d.device.clone()),
                ("resource", d.resource.clone()),
                ("luid", d.luid.clone()),
            ]
        };
        let with = |mut labels: Vec<(&'static str, String)>, k: &'static str, v: &str| {
            labels.push((k, v.to_string()));
            labels
        };
        gauge(
            &mut encoder,
            "dxdp_gpu_info",
            "1 for every device with telemetry, with its model.",
            view.devices
                .iter()
                .map(|d| (with(base(d), "model", &clean(&d.model)), 1_i64)),
        )?;
        gauge(
            &mut encoder,
            "dxdp_gpu_engine_utilization_ratio",
            "Busy share of the device's busiest engine of each type over the last sample window (0 to 1).",
            view.devices.iter().flat_map(|d| {
                d.engines
                    .iter()
                    .map(move |(engine, v)| (with(base(d), "engine", engine), *v))
            }),
        )?;
        gauge(
            &mut encoder,
            "dxdp_gpu_memory_used_bytes",
            "GPU memory in use, by segment (dedicated or shared).",
            view.devices.iter().flat_map(|d| {
                d.memory_used
                    .known()
                    .map(move |(segment, v)| (with(base(d), "segment", segment), v))
            }),
        )?;
        gauge(
            &mut encoder,
            "dxdp_gpu_memory_total_bytes",
            "GPU memory available, by segment (dedicated or shared).",
            view.devices.iter().flat_map(|d| {
                d.memory_total
                    .known()
                    .map(move |(segment, v)| (with(base(d), "segment", segment), v))
            }),
        )?;
        gauge(
            &mut encoder,
            "dxdp_gpu_processes",
            "Processes using the device.",
            view.devices.iter().map(|d| (base(d), d.processes)),
        )?;
        gauge(
            &mut encoder,
            "dxdp_gpu_allocation",
            "1 for every pod container the kubelet assigned the device to (one per replica held).",
            view.devices.iter().flat_map(|d| {
                d.holders.iter().map(move |h| {
                    (
                        vec![
                            ("device", d.device.clone()),
                            ("resource", h.resource.clone()),
                            ("namespace", h.pod.namespace.clone()),
                            ("pod", h.pod.pod.clone()),
                            ("container", h.pod.container.clone()),
                        ],
                        1_i64,
                    )
                })
            }),
        )?;
        encode_sensors(&mut encoder, &view, base)?;
        let hot = self.hot.read().unwrap_or_else(|p| p.into_inner()).clone();
        gauge(
            &mut encoder,
            "dxdp_gpu_thermal",
            "1 for every device the thermal health signal holds now: near or over its warning temperature (health.thermal.marginCelsius) or throttled for heat by NVML, whatever the signal's action (docs/health.md).",
            view.devices
                .iter()
                .filter(|d| hot.contains_key(&d.device))
                .map(|d| (base(d), 1_i64)),
        )?;
        let pod_labels = |c: &dxdp_core::telemetry::compute::ContainerTelemetry| {
            vec![
                ("namespace", c.pod.namespace.clone()),
                ("pod", c.pod.pod.clone()),
                ("container", c.pod.container.clone()),
                ("device", c.device.clone()),
            ]
        };
        gauge(
            &mut encoder,
            "dxdp_container_gpu_memory_used_bytes",
            "GPU memory the container's processes use, by segment; pod=\"\" is the host and processes dxdp cannot place.",
            view.containers.iter().flat_map(|c| {
                c.memory_used
                    .known()
                    .map(move |(segment, v)| (with(pod_labels(c), "segment", segment), v))
            }),
        )?;
        gauge(
            &mut encoder,
            "dxdp_container_gpu_memory_share_bytes",
            "The container's memory share of the device: the memory units it holds times the unit size (resources.<class>.memorySharing); only for containers with processes on a device they hold units of.",
            view.containers
                .iter()
                .filter_map(|c| c.memory_share.map(|s| (pod_labels(c), s))),
        )?;
        gauge(
            &mut encoder,
            "dxdp_container_gpu_processes",
            "The container's processes using the device; pod=\"\" is the host and processes dxdp cannot place.",
            view.containers.iter().map(|c| (pod_labels(c), c.processes)),
        )?;
        gauge(
            &mut encoder,
            "dxdp_container_gpu_engine_utilization_ratio",
            "Busy share the container's processes take of the device's busiest engine of each type (0 to 1).",
            view.containers.iter().flat_map(|c| {
                c.engines
                    .iter()
                    .map(move |(engine, v)| (with(pod_labels(c), "engine", engine), *v))
            }),
        )?;
        let info = self
            .pod_info
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let shown: std::collections::BTreeSet<(&str, &str)> = view
            .devices
            .iter()
            .flat_map(|d| d.holders.iter().map(|h| &h.pod))
            .chain(view.containers.iter().map(|c| &c.pod))
            .filter(|p| !p.pod.is_empty())
            .map(|p| (p.namespace.as_str(), p.pod.as_str()))
            .collect();
        let mut metric = encoder.encode_descriptor(
            "dxdp_pod_info",
            "1 for every pod with per-pod series, with its UID (telemetry.podUid) and the pod labels telemetry.podLabels allows as label_<key> (opt-in; join on namespace and pod).",
            None,
            MetricType::Gauge,
        )?;
        for p in info.iter().flat_map(|i| i.iter()) {
            if !shown.contains(&(p.namespace.as_str(), p.pod.as_str())) {
                continue;
            }
            let mut labels: Vec<(String, String)> = vec![
                ("namespace".into(), clean(&p.namespace)),
                ("pod".into(), clean(&p.pod)),
            ];
            if let Some(uid) = &p.uid {
                labels.push(("uid".into(), clean(uid)));
            }
            labels.extend(p.labels.iter().map(|(k, v)| (k.clone(), clean(v))));
            metric.encode_family(&labels)?.encode_gauge(&1_i64)?;
        }
        Ok(())
    }
}
