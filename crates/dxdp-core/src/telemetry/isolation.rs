//! The GPU isolation audit: which pod containers use an adapter the kubelet did not allocate to
//! them, from one telemetry view and the kubelet's allocations.
//!
//! Windows cannot confine a process-isolated container to the GPU it was assigned: it may see
//! and use every GPU of the node. This module only judges what the figures show:
//!
//! - a container **uses** a device when its processes show a busy share above 0 on one of the
//!   device's engines over the last window, or dedicated or shared memory above 0 in the last
//!   sample (a process that only enumerates adapters uses nothing);
//! - a container's **allocated** devices are the physical devices of the IDs the kubelet gave it
//!   for any resource dxdp serves; a replica ID (`<id>-r<k>`) or a memory unit ID (`<id>-m<k>`)
//!   counts for its physical device, so several pods sharing one GPU through replicas or memory
//!   units are each allocated that GPU;
//! - a container with no dxdp allocation of its own in a pod whose other containers hold dxdp
//!   devices (a regular init container: the kubelet's PodResources does not list those) is
//!   allocated the union of its pod's devices;
//! - a **violation** is a container using a device it was not allocated, or a container with no
//!   dxdp allocation at all (nor its pod) using a GPU;
//! - processes dxdp cannot place (the host's, and those of containers whose pod is unknown: the
//!   view's empty pod) are never violations; they are counted apart.
//!
//! The same rules hold in every assignment mode: with `class-guid` a container sees every GPU on
//! purpose, but the scheduler still accounted it only the GPUs it requested (see
//! `docs/isolation.md`).
//!
//! [`container_check`] is the check a container runs on itself: the adapters it can enumerate
//! against the LUIDs it was given (`DXDP_ADAPTER_LUIDS`).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::compute::{ContainerTelemetry, DeviceTelemetry, TelemetryView};
use super::instance::luid_label;
use super::{PodAllocation, PodRef};

/// The violations that last now, as the daemon's tracker publishes them to the Kubernetes side
/// (Events, the node taint, the node condition): `None` until the first audit (or until dxdp
/// knows that none can be made), then the current set, sorted. The one definition of the
/// channel's value between the tracker and the cluster side.
pub type Active = Option<std::sync::Arc<Vec<Violation>>>;

/// An adapter as the audit names it.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct Adapter {
    /// The physical dxdp device ID (the ID as the kubelet gave it when no device of the view
    /// has it).
    pub device: String,
    /// The adapter LUID as the GPU counters write it (`0x00000000_0x0000D1A6`); empty when the
    /// device is unknown.
    pub luid: String,
    /// The model; empty when unknown.
    pub model: String,
}

/// A device the kubelet allocated to a container.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Allocated {
    /// The adapter.
    #[serde(flatten)]
    pub adapter: Adapter,
    /// The resource name it was requested as.
    pub resource: String,
    /// The ID the kubelet gave (the physical ID or a replica ID; empty when not known, as when
    /// the figures were read back from `/metrics`).
    pub device_id: String,
}

/// A device a container's processes use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Used {
    /// The adapter.
    #[serde(flatten)]
    pub adapter: Adapter,
    /// The container's processes with a counter on it.
    pub processes: u64,
    /// Whether it is one of the container's allocated devices.
    pub allocated: bool,
    /// The dedicated memory its processes use on it, bytes; given only with a memory share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used: Option<u64>,
    /// Its memory share of the device (memory units held x unit size), bytes; left out
    /// without memory units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_share: Option<u64>,
}

/// What a container's use says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ContainerVerdict {
    /// It uses only devices it was allocated.
    Ok,
    /// It was allocated devices and uses none.
    Idle,
    /// It uses a device it was not allocated (or it has no dxdp allocation and uses a GPU).
    Violation,
}

impl ContainerVerdict {
    /// `ok`, `idle` or `violation`.
    pub fn as_str(self) -> &'static str {
        match self {
            ContainerVerdict::Ok => "ok",
            ContainerVerdict::Idle => "idle",
            ContainerVerdict::Violation => "violation",
        }
    }
}

/// One pod container: what it was allocated, what it uses, and the verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerAudit {
    /// The pod container.
    #[serde(flatten)]
    pub pod: PodRef,
    /// The devices the kubelet allocated to it (dxdp's resources only), sorted.
    pub allocated: Vec<Allocated>,
    /// The devices its processes use, sorted.
    pub used: Vec<Used>,
    /// The verdict.
    pub verdict: ContainerVerdict,
}

/// Which rule a violation breaks.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum ViolationKind {
    /// The container uses a device it was not allocated (it holds other dxdp devices).
    OtherDevice,
    /// The container has no dxdp allocation and uses a GPU.
    NoAllocation,
}

impl ViolationKind {
    /// `other-device` or `no-allocation`.
    pub fn as_str(self) -> &'static str {
        match self {
            ViolationKind::OtherDevice => "other-device",
            ViolationKind::NoAllocation => "no-allocation",
        }
    }
}

/// A pod container using a device it was not allocated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Violation {
    /// The pod container.
    #[serde(flatten)]
    pub pod: PodRef,
    /// The device it uses without having it.
    pub used: Adapter,
    /// The devices it was allocated (empty: none of dxdp's).
    pub allocated: Vec<Adapter>,
    /// Its processes with a counter on the used device.
    pub processes: u64,
    /// Which rule it breaks.
    pub kind: ViolationKind,
}

impl Violation {
    /// What identifies a violation while it lasts: the pod container and the used device.
    pub fn key(&self) -> (PodRef, String) {
        (self.pod.clone(), self.used.device.clone())
    }

    /// One sentence for people (logs and the Kubernetes Event): the adapter used and the ones
    /// allocated.
    pub fn message(&self) -> String {
        let used = describe(&self.used);
        let processes = match self.processes {
            1 => "1 process".to_string(),
            n => format!("{n} processes"),
        };
        match self.kind {
            ViolationKind::NoAllocation => format!(
                "container {} has no GPU allocated by dxdp but uses GPU {used} ({processes})",
                self.pod.container
            ),
            ViolationKind::OtherDevice => format!(
                "container {} uses GPU {used}, which was not allocated to it ({processes}); it was allocated {}",
                self.pod.container,
                self.allocated
                    .iter()
                    .map(describe)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// `<device> (<model>, LUID <luid>)`, leaving out what is unknown.
fn describe(a: &Adapter) -> String {
    let details: Vec<String> = [
        (!a.model.is_empty()).then(|| a.model.clone()),
        (!a.luid.is_empty()).then(|| format!("LUID {}", a.luid)),
    ]
    .into_iter()
    .flatten()
    .collect();
    if details.is_empty() {
        a.device.clone()
    } else {
        format!("{} ({})", a.device, details.join(", "))
    }
}

/// Processes dxdp cannot place on one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Unplaced {
    /// The dxdp device ID.
    pub device: String,
    /// Processes with a counter on it that belong to the host or to a container whose pod is
    /// unknown.
    pub processes: u64,
}

/// Everything one audit gives.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IsolationReport {
    /// Every pod container that holds a dxdp device or has processes on one, sorted.
    pub containers: Vec<ContainerAudit>,
    /// The violations, sorted by pod container and device.
    pub violations: Vec<Violation>,
    /// Processes dxdp cannot place, per device with any (not violations).
    pub unplaced: Vec<Unplaced>,
    /// Their sum.
    pub unplaced_processes: u64,
    /// Why the figures cannot tell whether containers stay on their devices, when they cannot:
    /// pods hold devices and GPUs are in use, but no process could be attributed to any pod
    /// container.
    pub undetermined: Option<String>,
}

/// Whether a container's figures on a device show use.
pub fn uses(c: &ContainerTelemetry) -> bool {
    c.engines.values().any(|v| *v > 0.0)
        || c.memory_used.dedicated.is_some_and(|b| b > 0)
        || c.memory_used.shared.is_some_and(|b| b > 0)
}

/// Whether `id` is `device`, a replica of it (`<device>-r<k>`) or one of its memory units
/// (`<device>-m<k>`).
fn names(id: &str, device: &str) -> bool {
    id == device
        || crate::sharing::parse_memory_unit_id(id).is_some_and(|(physical, _)| physical == device)
        || id
            .strip_prefix(device)
            .and_then(|rest| rest.strip_prefix("-r"))
            .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
}

fn adapter_of(devices: &[DeviceTelemetry], id: &str) -> Adapter {
    match devices.iter().find(|d| names(id, &d.device)) {
        Some(d) => Adapter {
            device: d.device.clone(),
            luid: d.luid.clone(),
            model: d.model.clone(),
        },
        None => Adapter {
            device: id.to_string(),
            ..Adapter::default()
        },
    }
}

/// The allocations the view's holders stand for (one device ID each), for figures that carry
/// the holders but not the kubelet's answer (a daemon's `/metrics`).
pub fn held(view: &TelemetryView) -> Vec<PodAllocation> {
    view.devices
        .iter()
        .flat_map(|d| {
            d.holders.iter().map(move |h| PodAllocation {
                namespace: h.pod.namespace.clone(),
                pod: h.pod.pod.clone(),
                container: h.pod.container.clone(),
                resource: h.resource.clone(),
                device_ids: vec![if h.device_id.is_empty() {
                    d.device.clone()
                } else {
                    h.device_id.clone()
                }],
            })
        })
        .collect()
}

/// Audits one view against the kubelet's allocations (of the resources dxdp serves).
pub fn audit(view: &TelemetryView, allocations: &[PodAllocation]) -> IsolationReport {
    let mut allocated: BTreeMap<PodRef, BTreeSet<Allocated>> = BTreeMap::new();
    for a in allocations {
        let pod = a.holder();
        if pod.is_host() {
            continue;
        }
        let set = allocated.entry(pod).or_default();
        for id in &a.device_ids {
            set.insert(Allocated {
                adapter: adapter_of(&view.devices, id),
                resource: a.resource.clone(),
                device_id: id.clone(),
            });
        }
    }
    // A container with no dxdp allocation of its own in a pod that holds dxdp devices (a
    // regular init container, which PodResources does not list) is judged against the union
    // of its pod's devices.
    let mut of_pod: BTreeMap<(String, String), BTreeSet<Allocated>> = BTreeMap::new();
    for (pod, set) in &allocated {
        of_pod
            .entry((pod.namespace.clone(), pod.pod.clone()))
            .or_default()
            .extend(set.iter().cloned());
    }
    let given_to = |pod: &PodRef| -> Option<&BTreeSet<Allocated>> {
        allocated
            .get(pod)
            .or_else(|| of_pod.get(&(pod.namespace.clone(), pod.pod.clone())))
    };
    let mut used: BTreeMap<PodRef, Vec<Used>> = BTreeMap::new();
    let mut unplaced: BTreeMap<String, u64> = BTreeMap::new();
    for c in &view.containers {
        if c.pod.is_host() {
            if c.processes > 0 {
                *unplaced.entry(c.device.clone()).or_insert(0) += c.processes;
            }
            continue;
        }
        if !uses(c) {
            continue;
        }
        let adapter = adapter_of(&view.devices, &c.device);
        let mine = given_to(&c.pod)
            .is_some_and(|set| set.iter().any(|a| a.adapter.device == adapter.device));
        used.entry(c.pod.clone()).or_default().push(Used {
            adapter,
            processes: c.processes,
            allocated: mine,
            memory_used: c.memory_share.and(c.memory_used.dedicated),
            memory_share: c.memory_share,
        });
    }

    let mut report = IsolationReport::default();
    let pods: BTreeSet<&PodRef> = allocated.keys().chain(used.keys()).collect();
    for pod in pods {
        let given: Vec<Allocated> = given_to(pod)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        let mut uses_now = used.get(pod).cloned().unwrap_or_default();
        uses_now.sort_by(|a, b| a.adapter.cmp(&b.adapter));
        let mut adapters: Vec<Adapter> = given.iter().map(|a| a.adapter.clone()).collect();
        adapters.dedup();
        for u in uses_now.iter().filter(|u| !u.allocated) {
            report.violations.push(Violation {
                pod: pod.clone(),
                used: u.adapter.clone(),
                allocated: adapters.clone(),
                processes: u.processes,
                kind: if given.is_empty() {
                    ViolationKind::NoAllocation
                } else {
                    ViolationKind::OtherDevice
                },
            });
        }
        let verdict = if uses_now.iter().any(|u| !u.allocated) {
            ContainerVerdict::Violation
        } else if uses_now.is_empty() {
            ContainerVerdict::Idle
        } else {
            ContainerVerdict::Ok
        };
        report.containers.push(ContainerAudit {
            pod: pod.clone(),
            allocated: given,
            used: uses_now,
            verdict,
        });
    }
    report.unplaced_processes = unplaced.values().sum();
    // GPU use on a held device all under the host, and not one process placed in a pod
    // container: the container process lists are missing, not the leaks.
    let held_devices: BTreeSet<&str> = allocated
        .values()
        .flatten()
        .map(|a| a.adapter.device.as_str())
        .collect();
    let placed = view.containers.iter().any(|c| !c.pod.is_host());
    let host_use_on_held = view
        .containers
        .iter()
        .any(|c| c.pod.is_host() && uses(c) && held_devices.contains(c.device.as_str()));
    if !placed && host_use_on_held {
        report.undetermined = Some(
            "pods hold GPUs that are in use, but no process could be attributed to a pod container (the containers' process lists or their pods are not available here: HCS or the CRI API): all GPU use is counted as the host's".into(),
        );
    }
    report.unplaced = unplaced
        .into_iter()
        .map(|(device, processes)| Unplaced { device, processes })
        .collect();
    report
}

/// An adapter a container can enumerate, or was given.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SeenAdapter {
    /// The LUID as `DXDP_ADAPTER_LUIDS` writes it (signed 64-bit decimal).
    pub luid: i64,
    /// The LUID as the GPU counters write it.
    pub luid_label: String,
    /// The adapter's description; empty when not visible here.
    pub model: String,
}

/// What a container can see against what it was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerCheck {
    /// The adapters in `DXDP_ADAPTER_LUIDS`.
    pub allocated: Vec<SeenAdapter>,
    /// The hardware adapters DXCore enumerates here.
    pub visible: Vec<SeenAdapter>,
    /// Visible but not allocated: the node leaks them into this container.
    pub extra: Vec<SeenAdapter>,
    /// Allocated but not visible.
    pub missing: Vec<SeenAdapter>,
}

impl ContainerCheck {
    /// Whether the container sees adapters it was not given.
    pub fn leaks(&self) -> bool {
        !self.extra.is_empty()
    }
}

/// Parses `DXDP_ADAPTER_LUIDS`: signed 64-bit decimal LUIDs, comma separated.
pub fn parse_luids(text: &str) -> Result<Vec<i64>, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let luid = part.parse::<i64>().map_err(|_| {
            format!("{part:?} is not a LUID: DXDP_ADAPTER_LUIDS lists signed 64-bit decimal numbers, comma separated")
        })?;
        if !out.contains(&luid) {
            out.push(luid);
        }
    }
    if out.is_empty() {
        return Err("DXDP_ADAPTER_LUIDS is empty".into());
    }
    Ok(out)
}

/// Compares the LUIDs a container was given with the hardware adapters it can enumerate
/// (`(luid, description)`).
pub fn container_check(allocated: &[i64], visible: &[(i64, String)]) -> ContainerCheck {
    let seen = |luid: i64| SeenAdapter {
        luid,
        luid_label: luid_label(luid),
        model: visible
            .iter()
            .find(|(l, _)| *l == luid)
            .map(|(_, d)| d.clone())
            .unwrap_or_default(),
    };
    let mut visible_luids: Vec<i64> = visible.iter().map(|(l, _)| *l).collect();
    visible_luids.sort_unstable();
    visible_luids.dedup();
    let mut given: Vec<i64> = allocated.to_vec();
    given.sort_unstable();
    given.dedup();
    ContainerCheck {
        allocated: given.iter().map(|&l| seen(l)).collect(),
        visible: visible_luids.iter().map(|&l| seen(l)).collect(),
        extra: visible_luids
            .iter()
            .filter(|l| !given.contains(l))
            .map(|&l| seen(l))
            .collect(),
        missing: given
            .iter()
            .filter(|l| !visible_luids.contains(l))
            .map(|&l| seen(l))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::compute::{Holder, Segments};

    fn pod(ns: &str, name: &str, c: &str) -> PodRef {
        PodRef {
            namespace: ns.into(),
            pod: name.into(),
            container: c.into(),
        }
    }

    fn device(id: &str, luid: &str) -> DeviceTelemetry {
        DeviceTelemetry {
            device: id.into(),
            resource: "r".into(),
            luid: luid.into(),
            model: "M".into(),
            engines: BTreeMap::new(),
            memory_used: Segments::default(),
            memory_total: Segments::default(),
            processes: 0,
            holders: Vec::new(),
            health: String::new(),
            sensors: Default::default(),
        }
    }

    /// A container entry using the device (3d 10 %) or not (all zero).
    fn on(p: PodRef, device: &str, busy: bool, processes: u64) -> ContainerTelemetry {
        ContainerTelemetry {
            pod: p,
            device: device.into(),
            memory_used: Segments {
                dedicated: Some(0),
                shared: Some(0),
            },
            memory_share: None,
            engines: BTreeMap::from([("3d".to_string(), if busy { 0.1 } else { 0.0 })]),
            processes,
        }
    }

    fn alloc(p: &PodRef, ids: &[&str]) -> PodAllocation {
        PodAllocation {
            namespace: p.namespace.clone(),
            pod: p.pod.clone(),
            container: p.container.clone(),
            resource: "r".into(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn view(containers: Vec<ContainerTelemetry>) -> TelemetryView {
        TelemetryView {
            window_seconds: 10.0,
            devices: vec![device("a", "0x0_0x1"), device("b", "0x0_0x2")],
            containers,
            unparsed_instances: 0,
        }
    }

    #[test]
    fn replicas_of_one_device_in_several_pods_are_no_violation() {
        let (p, q) = (pod("n", "p", "c"), pod("n", "q", "c"));
        let v = view(vec![
            on(p.clone(), "a", true, 1),
            on(q.clone(), "a", true, 2),
        ]);
        let r = audit(&v, &[alloc(&p, &["a-r0"]), alloc(&q, &["a-r1"])]);
        assert!(r.violations.is_empty(), "{r:?}");
        assert_eq!(
            r.containers.iter().map(|c| c.verdict).collect::<Vec<_>>(),
            [ContainerVerdict::Ok, ContainerVerdict::Ok]
        );
        assert_eq!(r.containers[1].allocated[0].device_id, "a-r1");
        assert_eq!(r.containers[1].allocated[0].adapter.device, "a");
    }

    #[test]
    fn memory_units_of_one_device_in_several_pods_are_no_violation() {
        let (p, q) = (pod("n", "p", "c"), pod("n", "q", "c"));
        let v = view(vec![
            on(p.clone(), "a", true, 1),
            on(q.clone(), "b", true, 2),
        ]);
        // p holds two units of a; q holds a unit of a but uses b.
        let r = audit(&v, &[alloc(&p, &["a-m0", "a-m1"]), alloc(&q, &["a-m2"])]);
        assert_eq!(
            r.containers.iter().map(|c| c.verdict).collect::<Vec<_>>(),
            [ContainerVerdict::Ok, ContainerVerdict::Violation]
        );
        assert_eq!(r.containers[0].allocated[1].device_id, "a-m1");
        assert_eq!(r.containers[0].allocated[1].adapter.device, "a");
        assert_eq!(r.violations.len(), 1);
        assert_eq!(r.violations[0].used.device, "b");
    }

    #[test]
    fn use_of_another_device_or_without_allocation_is_a_violation_and_idle_use_is_not() {
        let (p, q, idle) = (pod("n", "p", "c"), pod("n", "q", "c"), pod("n", "i", "c"));
        let v = view(vec![
            on(p.clone(), "a", true, 1),
            on(p.clone(), "b", true, 3),
            on(q.clone(), "b", true, 1),
            // An instance without use on another device: not a violation.
            on(idle.clone(), "a", false, 1),
            on(PodRef::host(), "a", true, 4),
        ]);
        let r = audit(&v, &[alloc(&p, &["a"]), alloc(&idle, &["b"])]);
        let got: Vec<(PodRef, &str, Vec<&str>, u64, ViolationKind)> = r
            .violations
            .iter()
            .map(|v| {
                (
                    v.pod.clone(),
                    v.used.device.as_str(),
                    v.allocated.iter().map(|a| a.device.as_str()).collect(),
                    v.processes,
                    v.kind,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (p.clone(), "b", vec!["a"], 3, ViolationKind::OtherDevice),
                (q.clone(), "b", vec![], 1, ViolationKind::NoAllocation),
            ]
        );
        let verdicts: Vec<(PodRef, ContainerVerdict)> = r
            .containers
            .iter()
            .map(|c| (c.pod.clone(), c.verdict))
            .collect();
        assert_eq!(
            verdicts,
            [
                (idle, ContainerVerdict::Idle),
                (p, ContainerVerdict::Violation),
                (q, ContainerVerdict::Violation),
            ]
        );
        assert_eq!(r.unplaced_processes, 4);
        assert_eq!(r.undetermined, None);
    }

    #[test]
    fn all_use_under_the_host_while_pods_hold_devices_cannot_be_judged() {
        let p = pod("n", "p", "c");
        let v = view(vec![on(PodRef::host(), "a", true, 2)]);
        let r = audit(&v, &[alloc(&p, &["a"])]);
        assert!(r.violations.is_empty());
        assert!(r.undetermined.is_some());
        // Nobody holds a device: the host's use is just the host's.
        assert_eq!(audit(&v, &[]).undetermined, None);
    }

    #[test]
    fn a_container_the_kubelet_does_not_list_is_judged_by_its_pods_devices() {
        let (main, init) = (pod("n", "p", "main"), pod("n", "p", "init"));
        let other = pod("n", "q", "c");
        let v = view(vec![
            // The init container uses the pod's GPU a: no violation.
            on(init.clone(), "a", true, 1),
            // It also uses b, which its pod does not hold: a violation against a.
            on(init.clone(), "b", true, 2),
            // Another pod without any allocation: still no-allocation.
            on(other.clone(), "a", true, 1),
        ]);
        let r = audit(&v, &[alloc(&main, &["a-r1"])]);
        let got: Vec<(PodRef, &str, Vec<&str>, ViolationKind)> = r
            .violations
            .iter()
            .map(|v| {
                (
                    v.pod.clone(),
                    v.used.device.as_str(),
                    v.allocated.iter().map(|a| a.device.as_str()).collect(),
                    v.kind,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (init.clone(), "b", vec!["a"], ViolationKind::OtherDevice),
                (other.clone(), "a", vec![], ViolationKind::NoAllocation),
            ]
        );
        let init_audit = r.containers.iter().find(|c| c.pod == init).unwrap();
        assert_eq!(init_audit.allocated[0].device_id, "a-r1");
        assert_eq!(
            init_audit
                .used
                .iter()
                .map(|u| (u.adapter.device.as_str(), u.allocated))
                .collect::<Vec<_>>(),
            [("a", true), ("b", false)]
        );
    }

    #[test]
    fn holders_stand_for_allocations() {
        let mut v = view(vec![]);
        v.devices[0].holders.push(Holder {
            pod: pod("n", "p", "c"),
            resource: "r".into(),
            device_id: "a-r3".into(),
        });
        v.devices[1].holders.push(Holder {
            pod: pod("n", "q", "c"),
            resource: "r".into(),
            device_id: String::new(),
        });
        let held = held(&v);
        assert_eq!(held[0].device_ids, ["a-r3"]);
        assert_eq!(held[1].device_ids, ["b"]);
    }

    #[test]
    fn messages_name_the_adapter_used_and_the_ones_allocated() {
        let a = |d: &str, l: &str| Adapter {
            device: d.into(),
            luid: l.into(),
            model: "T4".into(),
        };
        let mut v = Violation {
            pod: pod("n", "p", "app"),
            used: a("b", "0x0_0x2"),
            allocated: vec![a("a", "0x0_0x1")],
            processes: 2,
            kind: ViolationKind::OtherDevice,
        };
        assert_eq!(
            v.message(),
            "container app uses GPU b (T4, LUID 0x0_0x2), which was not allocated to it (2 processes); it was allocated a (T4, LUID 0x0_0x1)"
        );
        v.kind = ViolationKind::NoAllocation;
        v.allocated.clear();
        v.processes = 1;
        assert_eq!(
            v.message(),
            "container app has no GPU allocated by dxdp but uses GPU b (T4, LUID 0x0_0x2) (1 process)"
        );
    }

    #[test]
    fn a_container_sees_what_it_was_given_or_more() {
        assert_eq!(parse_luids(" 7048070, -5,7048070").unwrap(), [7048070, -5]);
        assert!(parse_luids("0x6B8B86").unwrap_err().contains("decimal"));
        assert!(parse_luids(" , ").is_err());
        let visible = [(1, "A".to_string()), (2, "B".to_string())];
        let c = container_check(&[2], &visible);
        assert!(c.leaks());
        assert_eq!(c.extra.len(), 1);
        assert_eq!((c.extra[0].luid, c.extra[0].model.as_str()), (1, "A"));
        assert_eq!(c.extra[0].luid_label, "0x00000000_0x00000001");
        let c = container_check(&[1, 2, 3], &visible);
        assert!(!c.leaks());
        assert_eq!(c.missing.len(), 1);
        assert_eq!((c.missing[0].luid, c.missing[0].model.as_str()), (3, ""));
    }
}
