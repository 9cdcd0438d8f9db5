//! The `thermal` health signal's feed: after every sample, which devices are near or over their
//! warning temperature or throttled for heat ([`dxdp_core::health::thermal`]). Each episode
//! (a device becoming hot until it cools) is logged once and counted in
//! `dxdp_gpu_faults_total{kind="thermal"}`; the hot devices are published for the refresher,
//! which makes them Unhealthy when `health.signals.thermal` says so.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;

use crate::config::Config;
use crate::observe::metrics::Metrics;
use dxdp_core::health::reason::Reason;
use dxdp_core::health::{thermal, Action, Hot};
use dxdp_core::telemetry::compute::TelemetryView;

/// The sending side of [`Hot`], shared by the restarts of the telemetry task.
pub(crate) type HotTx = Arc<watch::Sender<Hot>>;

/// Follows the episodes of the `thermal` signal and publishes the hot devices.
pub(crate) struct ThermalTracker {
    metrics: Metrics,
    tx: HotTx,
}

impl ThermalTracker {
    /// A tracker publishing on `tx`; a restarted telemetry task takes over the episodes
    /// published (they are not logged or counted again).
    pub(crate) fn new(metrics: Metrics, tx: HotTx) -> Self {
        ThermalTracker { metrics, tx }
    }

    /// Judges the figures of a sample under `config` (`health.signals.thermal`,
    /// `health.thermal.marginCelsius`).
    pub(crate) fn sample(&mut self, view: &TelemetryView, config: &Config) {
        let health = &config.pipeline.health;
        let action = health.policy.of(Reason::Thermal).action;
        if !health.enabled || action == Action::Ignore {
            self.publish(BTreeMap::new(), None);
            return;
        }
        let margin = config.health_thermal.margin_celsius;
        let now: BTreeMap<String, String> = view
            .devices
            .iter()
            .filter_map(|d| thermal(&d.sensors, margin).map(|why| (d.device.clone(), why)))
            .collect();
        self.publish(now, Some(action));
    }

    /// Nothing can be judged (the sample failed, or telemetry is off): the episodes end (a
    /// device is not held for readings that cannot be seen).
    pub(crate) fn unknown(&mut self) {
        self.publish(BTreeMap::new(), None);
    }

    /// Logs and counts the episodes that start, logs those that end, and publishes the hot
    /// devices (each with the sentence its episode started with) when they changed.
    fn publish(&mut self, now: BTreeMap<String, String>, action: Option<Action>) {
        let before = self.tx.borrow().clone();
        let mut next = BTreeMap::new();
        for (device, why) in now {
            match before.get(&device) {
                Some(first) => {
                    next.insert(device, first.clone());
                }
                None => {
                    let action = action.map_or("event_only", Action::as_str);
                    tracing::warn!(
                        device = %device,
                        "GPU is hot: {why} (health.signals.thermal: {action}; logged once until it cools)"
                    );
                    self.metrics
                        .device_health()
                        .fault(&device, Reason::Thermal.as_str());
                    next.insert(device, why);
                }
            }
        }
        for device in before.keys().filter(|d| !next.contains_key(*d)) {
            tracing::info!(device = %device, "GPU is no longer hot (thermal signal cleared)");
        }
        self.tx.send_if_modified(|current| {
            if **current == next {
                false
            } else {
                *current = Arc::new(next);
                true
            }
        });
        self.metrics
            .telemetry()
            .publish_hot(self.tx.borrow().clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dxdp_core::telemetry::compute::DeviceTelemetry;
    use dxdp_core::telemetry::sensors::{Figure, SensorSource, SensorView};

    fn device(id: &str, margin: Option<f64>) -> DeviceTelemetry {
        DeviceTelemetry {
            device: id.into(),
            resource: "r".into(),
            luid: "l".into(),
            model: "m".into(),
            engines: Default::default(),
            memory_used: Default::default(),
            memory_total: Default::default(),
            processes: 0,
            holders: Vec::new(),
            health: String::new(),
            sensors: SensorView {
                temperature_margin_celsius: margin.map(|value| Figure {
                    value,
                    source: SensorSource::D3dkmt,
                }),
                ..SensorView::default()
            },
        }
    }

    fn view(devices: Vec<DeviceTelemetry>) -> TelemetryView {
        TelemetryView {
            devices,
            ..TelemetryView::default()
        }
    }

    #[test]
    fn an_episode_is_counted_once_keeps_its_first_sentence_and_ends_when_it_cools() {
        let metrics = Metrics::new();
        let tx: HotTx = Arc::new(watch::Sender::new(Arc::default()));
        let mut rx = tx.subscribe();
        let mut t = ThermalTracker::new(metrics.clone(), tx.clone());
        let config = Config::default();
        t.sample(
            &view(vec![device("a", Some(3.0)), device("b", None)]),
            &config,
        );
        assert!(rx.has_changed().unwrap());
        assert_eq!(
            rx.borrow_and_update().get("a").map(String::as_str),
            Some("temperature 3.0 °C below the warning temperature, within health.thermal.marginCelsius 5 (d3dkmt)")
        );
        // Hotter, same episode: nothing new is published (the refresher is not woken).
        t.sample(
            &view(vec![device("a", Some(1.0)), device("b", None)]),
            &config,
        );
        assert!(!rx.has_changed().unwrap());
        // Cooled: cleared.
        t.sample(&view(vec![device("a", Some(9.0))]), &config);
        assert!(rx.borrow_and_update().is_empty());
        // Hot again, then the sample fails: a second episode, ended by the unknown.
        t.sample(&view(vec![device("a", Some(-1.0))]), &config);
        assert_eq!(rx.borrow_and_update().len(), 1);
        t.unknown();
        assert!(rx.borrow_and_update().is_empty());
        let text = metrics.encode();
        assert!(
            text.contains("dxdp_gpu_faults_total{device=\"a\",kind=\"thermal\"} 2"),
            "{text}"
        );
    }
}
