//! Which pods get a `dxdp_pod_info` series, and with what: every pod with per-pod series in a
//! sample (a holder of a device or a container using one), its UID and allowlisted labels from
//! the container runtime's last `ListPodSandbox` answer. A pod the runtime has not named (yet)
//! gets a series with its namespace and name only, so that a PromQL join keeps it.

use std::collections::{BTreeSet, HashMap};

use dxdp_core::telemetry::compute::TelemetryView;

use crate::config::Telemetry;
use crate::kubelet::cri::PodSandboxInfo;
use crate::observe::podinfo::{select_labels, PodInfo};

/// The `dxdp_pod_info` series of the pods of `view` and the number of pod labels left out for a
/// name collision; `None` when `telemetry.podLabels` and `telemetry.podUid` are both unset.
pub(crate) fn pod_info(
    view: &TelemetryView,
    sandboxes: &HashMap<(String, String), PodSandboxInfo>,
    telemetry: &Telemetry,
) -> Option<(Vec<PodInfo>, usize)> {
    if !telemetry.pod_info() {
        return None;
    }
    let pods: BTreeSet<(String, String)> = view
        .devices
        .iter()
        .flat_map(|d| d.holders.iter().map(|h| &h.pod))
        .chain(view.containers.iter().map(|c| &c.pod))
        .filter(|p| !p.pod.is_empty())
        .map(|p| (p.namespace.clone(), p.pod.clone()))
        .collect();
    let mut collisions = 0;
    let out = pods
        .into_iter()
        .map(|key| {
            let known = sandboxes.get(&key);
            let (labels, lost) = known.map_or((Vec::new(), 0), |s| {
                select_labels(&s.labels, |k| telemetry.pod_labels.allows(k))
            });
            collisions += lost;
            PodInfo {
                uid: known
                    .filter(|s| telemetry.pod_uid && !s.uid.is_empty())
                    .map(|s| s.uid.clone()),
                namespace: key.0,
                pod: key.1,
                labels,
            }
        })
        .collect();
    Some((out, collisions))
}
