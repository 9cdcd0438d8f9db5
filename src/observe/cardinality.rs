//! Bounded cardinality: one node's `/metrics` carries per-pod and per-violation series for at
//! most [`MAX_POD_CONTAINERS`] pod containers and [`MAX_VIOLATIONS`] violations, so that one
//! noisy node (thousands of short-lived pods, a runaway leak) cannot flood Prometheus.
//!
//! Past a cap the pod containers (or violations) first in sorted order are kept, the same ones
//! from one scrape to the next; the others are left out of `/metrics` only (the isolation
//! audit, its Events, its taint and `dxdp_isolation_violations_total` still see them all), the
//! number left out is a gauge (`dxdp_telemetry_pod_containers_over_limit`,
//! `dxdp_isolation_violations_over_limit`) and the first time a cap is reached it is logged
//! once per process.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};

use dxdp_core::telemetry::compute::TelemetryView;
use dxdp_core::telemetry::PodRef;

/// The most pod containers with per-pod series (`dxdp_gpu_allocation`, `dxdp_container_*`)
/// per node. The host's row (`pod=""`) is not a pod container and is always kept.
pub(crate) const MAX_POD_CONTAINERS: usize = 256;

/// The most `dxdp_isolation_violations` series per node.
pub(crate) const MAX_VIOLATIONS: usize = 64;

/// Whether a cap was logged already (per cap, per process).
#[derive(Debug, Default)]
pub(crate) struct LoggedOnce(AtomicBool);

impl LoggedOnce {
    /// Logs `what` the first time only.
    pub(crate) fn warn(&self, what: impl FnOnce() -> String) {
        if !self.0.swap(true, Ordering::SeqCst) {
            tracing::warn!("{}", what());
        }
    }
}

fn is_pod(p: &PodRef) -> bool {
    !p.pod.is_empty()
}

/// `view` with the per-pod entries of at most `max` pod containers (the first in sorted
/// order), and how many pod containers were left out; `None` when nothing is left out.
pub(crate) fn cap_pods(view: &TelemetryView, max: usize) -> Option<(TelemetryView, usize)> {
    let all: BTreeSet<&PodRef> = view
        .devices
        .iter()
        .flat_map(|d| d.holders.iter().map(|h| &h.pod))
        .chain(view.containers.iter().map(|c| &c.pod))
        .filter(|p| is_pod(p))
        .collect();
    if all.len() <= max {
        return None;
    }
    let kept: BTreeSet<PodRef> = all.iter().take(max).map(|p| (*p).clone()).collect();
    let keep = |p: &PodRef| !is_pod(p) || kept.contains(p);
    let mut capped = view.clone();
    for d in &mut capped.devices {
        d.holders.retain(|h| keep(&h.pod));
    }
    capped.containers.retain(|c| keep(&c.pod));
    Some((capped, all.len() - max))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dxdp_core::telemetry::compute::{ContainerTelemetry, Segments};

    fn pod(n: usize) -> PodRef {
        PodRef {
            namespace: "ns".into(),
            pod: format!("pod-{n:03}"),
            container: "c".into(),
        }
    }

    #[test]
    fn pods_past_the_cap_are_left_out_in_a_stable_order_and_the_host_row_stays() {
        let row = |p: PodRef| ContainerTelemetry {
            pod: p,
            device: "gpu0".into(),
            memory_used: Segments::default(),
            memory_share: None,
            engines: Default::default(),
            processes: 1,
        };
        let mut view = TelemetryView::default();
        view.containers.push(row(PodRef {
            namespace: String::new(),
            pod: String::new(),
            container: String::new(),
        }));
        for n in (0..5).rev() {
            view.containers.push(row(pod(n)));
        }
        assert!(cap_pods(&view, 5).is_none());
        let (capped, left_out) = cap_pods(&view, 3).unwrap();
        assert_eq!(left_out, 2);
        let pods: Vec<&str> = capped
            .containers
            .iter()
            .map(|c| c.pod.pod.as_str())
            .collect();
        assert_eq!(pods, ["", "pod-002", "pod-001", "pod-000"]);
    }
}

#[cfg(test)]
mod violation_tests {
    use dxdp_core::telemetry::isolation::{Adapter, Violation, ViolationKind};
    use dxdp_core::telemetry::PodRef;
    use std::sync::Arc;

    #[test]
    fn violations_past_the_cap_are_left_out_of_the_series_and_counted() {
        let metrics = crate::observe::metrics::Metrics::new();
        let violations: Vec<Violation> = (0..super::MAX_VIOLATIONS + 6)
            .map(|n| Violation {
                pod: PodRef {
                    namespace: "ns".into(),
                    pod: format!("leak-{n:03}"),
                    container: "c".into(),
                },
                used: Adapter {
                    device: "gpu0".into(),
                    luid: String::new(),
                    model: String::new(),
                },
                allocated: Vec::new(),
                processes: 1,
                kind: ViolationKind::NoAllocation,
            })
            .collect();
        metrics.isolation().set_active(Arc::new(violations));
        let text = metrics.encode();
        let series = text
            .lines()
            .filter(|l| l.starts_with("dxdp_isolation_violations{"))
            .count();
        assert_eq!(series, 64);
        assert!(
            text.contains("\ndxdp_isolation_violations_over_limit 6\n"),
            "{text}"
        );
        assert!(text.contains("pod=\"leak-063\""));
        assert!(!text.contains("pod=\"leak-064\""));
        metrics.isolation().set_active(Arc::new(Vec::new()));
        assert!(metrics
            .encode()
            .contains("\ndxdp_isolation_violations_over_limit 0\n"));
    }
}
