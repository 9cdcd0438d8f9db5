//! The GPU memory over-use metrics: the excess of every confirmed over-use episode (a container
//! above its memory share for longer than `health.memoryOverUse.gracePeriod`; one series each,
//! encoded at each scrape from the current set, so that an ended episode's series disappears at
//! once), how many episodes were confirmed, and what became of their Events.
//!
//! Names and labels are a public interface; `docs/observability.md` lists them.

use std::sync::{Arc, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use dxdp_core::telemetry::overuse::OverUse;

use super::event_metrics::EventResult;
use super::telemetry_metrics::{clean, result as label, ResultLabel};

/// The over-use part of the daemon's metrics. Clones share the same values.
#[derive(Debug, Clone)]
pub struct OverUseMetrics {
    confirmed: Arc<RwLock<Arc<Vec<OverUse>>>>,
    episodes: Counter,
    events: Family<ResultLabel, Counter>,
}

/// Encodes the confirmed episodes at each scrape.
#[derive(Debug)]
struct ExcessCollector {
    confirmed: Arc<RwLock<Arc<Vec<OverUse>>>>,
}

impl OverUseMetrics {
    /// Registers the over-use metrics in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let episodes = Counter::default();
        registry.register(
            "dxdp_memory_overuse_episodes",
            "Episodes of a container using more dedicated GPU memory than its memory share for longer than health.memoryOverUse.gracePeriod (counted when confirmed)",
            episodes.clone(),
        );
        let events = Family::<ResultLabel, Counter>::default();
        registry.register(
            "dxdp_memory_overuse_events",
            "Kubernetes Events about GPU memory over-use (GPUMemoryOverUse), by result (sent, error, deduplicated, rate_limited, disabled)",
            events.clone(),
        );
        for r in EventResult::ALL {
            drop(events.get_or_create(&label(r.as_str())));
        }
        let confirmed = Arc::new(RwLock::new(Arc::new(Vec::new())));
        registry.register_collector(Box::new(ExcessCollector {
            confirmed: confirmed.clone(),
        }));
        OverUseMetrics {
            confirmed,
            episodes,
            events,
        }
    }

    /// Sets the confirmed episodes of the last sample (empty: none, or none known). At most
    /// [`super::cardinality::MAX_POD_CONTAINERS`] are exported, like the per-pod figures.
    pub(crate) fn set_confirmed(&self, confirmed: Arc<Vec<OverUse>>) {
        let cap = super::cardinality::MAX_POD_CONTAINERS;
        let confirmed = if confirmed.len() > cap {
            Arc::new(confirmed.iter().take(cap).cloned().collect())
        } else {
            confirmed
        };
        *self.confirmed.write().unwrap_or_else(|p| p.into_inner()) = confirmed;
    }

    /// Counts episodes that were confirmed.
    pub(crate) fn started(&self, n: u64) {
        self.episodes.inc_by(n);
    }

    /// Counts one Event outcome.
    pub(crate) fn event(&self, result: EventResult) {
        self.events.get_or_create(&label(result.as_str())).inc();
    }

    /// How many Events had `result` so far.
    #[cfg(any(test, feature = "test-support"))]
    pub fn events(&self, result: EventResult) -> u64 {
        self.events.get_or_create(&label(result.as_str())).get()
    }

    /// How many episodes were confirmed so far.
    #[cfg(any(test, feature = "test-support"))]
    pub fn episodes(&self) -> u64 {
        self.episodes.get()
    }
}

impl Collector for ExcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let confirmed = self
            .confirmed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut metric = encoder.encode_descriptor(
            "dxdp_container_gpu_memory_overuse_bytes",
            "Dedicated GPU memory the container uses above its memory share, bytes, while it has lasted longer than health.memoryOverUse.gracePeriod; no series within the share",
            None,
            MetricType::Gauge,
        )?;
        for o in confirmed.iter() {
            let labels = [
                ("namespace", clean(&o.pod.namespace)),
                ("pod", clean(&o.pod.pod)),
                ("container", clean(&o.pod.container)),
                ("device", clean(&o.device)),
            ];
            metric
                .encode_family(&labels)?
                .encode_gauge(&i64::try_from(o.excess()).unwrap_or(i64::MAX))?;
        }
        Ok(())
    }
}
