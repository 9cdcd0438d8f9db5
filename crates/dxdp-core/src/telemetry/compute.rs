//! From counter samples to figures: per-device utilisation, memory and processes, the same per
//! container, and which pod containers hold which device.
//!
//! **Utilisation.** `\GPU Engine(*)\Running Time` counts, per process and engine, the 100 ns
//! units the engine spent on the process's work. Between two samples, an engine's busy share is
//! the sum over its processes of the running-time increase, divided by the wall time between the
//! samples (the samples' time stamps), capped at 1. A device's utilisation of an engine type is
//! its busiest engine of that type (a GPU with two copy engines, one busy, is "copy 100 %"), as
//! Task Manager shows it. A container's is the same, summed over the container's processes only.
//! A process whose counter is new in the later sample, or went down (a reused process ID), adds
//! nothing until the next pair of samples. With fewer than two samples there is no utilisation.
//!
//! **Memory.** A device's used memory is `\GPU Adapter Memory(*)\Dedicated Usage` and
//! `Shared Usage` of the last sample, summed over the physical GPUs of the adapter; a
//! container's is `\GPU Process Memory(*)` summed over its processes. The dedicated total is
//! DXCore `DedicatedAdapterMemory`, the shared total DXCore `SharedSystemMemory` (when recorded).
//!
//! **Processes.** The distinct process IDs with a `GPU Engine` or `GPU Process Memory` instance
//! on the adapter in the last sample.
//!
//! **Sensors.** Temperature, power, clocks, fan and throttle reasons are the last sample's
//! readings of the device's LUID, one value per figure from the first source by precedence
//! ([`super::sensors::view`]).
//!
//! **Attribution.** A process belongs to the container whose process list has its ID; the
//! container to the pod container given for its ID (from the container runtime's CRI labels).
//! Processes of no known container, or of a container dxdp cannot place, are summed under the
//! empty pod (the host). A PodResources device ID names its physical device directly, a replica of it
//! (`<id>-r<k>`) or one of its memory units (`<id>-m<k>`).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::devices::{Discovery, Resource};

use super::sensors::SensorView;

use super::instance::{luid_label, parse_adapter, parse_engine, parse_process};
use super::{CounterSample, PodAllocation, PodRef, TelemetryFacts};

/// A device the figures are for (a physical device dxdp serves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRef {
    /// The dxdp device ID.
    pub id: String,
    /// The served resource name.
    pub resource: String,
    /// The adapter LUID.
    pub luid: i64,
    /// The model (driver description).
    pub model: String,
    /// DXCore `DedicatedAdapterMemory`, bytes (0: unknown).
    pub dedicated_total: u64,
}

/// Bytes per memory segment; `None` where unknown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Segments {
    /// The adapter's own memory (VRAM).
    pub dedicated: Option<u64>,
    /// System memory the adapter uses.
    pub shared: Option<u64>,
}

impl Segments {
    /// `(segment label, value)` of the known segments.
    pub fn known(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [("dedicated", self.dedicated), ("shared", self.shared)]
            .into_iter()
            .filter_map(|(s, v)| v.map(|v| (s, v)))
    }
}

/// The figures of one device.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceTelemetry {
    /// The dxdp device ID.
    pub device: String,
    /// The served resource name.
    pub resource: String,
    /// The adapter LUID as the counters write it (`0x00000000_0x0000D1A6`).
    pub luid: String,
    /// The model.
    pub model: String,
    /// Busy share (0 to 1) per engine type; empty without two samples.
    pub engines: BTreeMap<String, f64>,
    /// Memory in use.
    pub memory_used: Segments,
    /// Memory available.
    pub memory_total: Segments,
    /// Processes using the adapter.
    pub processes: u64,
    /// The pod containers the kubelet assigned the device to (one per replica held).
    pub holders: Vec<Holder>,
    /// The device's health reason (`healthy`, `tdr`, ...; see `health::reason::Reason`), when known
    /// (from a daemon's `dxdp_device_health`); empty otherwise.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub health: String,
    /// Temperature, power, clocks, fan and throttle reasons of the last sample
    /// ([`super::sensors::view`]); left out when no source reports any.
    #[serde(default, skip_serializing_if = "SensorView::is_empty")]
    pub sensors: SensorView,
}

/// A pod container holding a device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    /// The pod container.
    #[serde(flatten)]
    pub pod: PodRef,
    /// The resource name it requested.
    pub resource: String,
    /// The device ID it was given (the physical ID or a replica ID).
    pub device_id: String,
}

/// The figures of one container's processes on one device.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerTelemetry {
    /// The pod container; empty for the host and processes dxdp cannot place.
    #[serde(flatten)]
    pub pod: PodRef,
    /// The dxdp device ID.
    pub device: String,
    /// Memory its processes use.
    pub memory_used: Segments,
    /// Its memory share of the device, bytes: the memory units of the device it holds times the
    /// unit size ([`super::overuse::annotate_shares`]); left out without memory units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_share: Option<u64>,
    /// Busy share (0 to 1) of its processes per engine type.
    pub engines: BTreeMap<String, f64>,
    /// Its processes using the device.
    pub processes: u64,
}

/// Everything one computation gives.
#[derive(Debug, Clone, Default, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TelemetryView {
    /// Seconds between the two samples utilisation was computed from (0: none).
    pub window_seconds: f64,
    /// One entry per device, in the order given.
    pub devices: Vec<DeviceTelemetry>,
    /// One entry per (pod container, device) with processes on the device, sorted.
    pub containers: Vec<ContainerTelemetry>,
    /// Counter instance names that could not be parsed (skipped).
    pub unparsed_instances: u64,
}

/// Engine key: (luid, phys, eng).
type EngineKey = (i64, u32, u32);

/// A multiply-rotate hasher for small integer keys (the FxHash scheme): several times faster
/// than the default SipHash for the per-instance bookkeeping of a sample. Not resistant to
/// chosen keys, which is fine for process IDs and LUIDs.
#[derive(Default, Clone, Copy)]
struct FastHasher(u64);

impl std::hash::Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_i64(&mut self, n: i64) {
        self.write_u64(n as u64);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<FastHasher>>;
type FastSet<K> = std::collections::HashSet<K, std::hash::BuildHasherDefault<FastHasher>>;

/// Computes the figures of `devices` from `facts`. `pods` maps container IDs to pod containers
/// (from the container runtime's CRI `ListContainers`) and wins over the pod recorded in
/// `facts.containers`; `allocations` is the PodResources answer.
pub fn compute(
    devices: &[DeviceRef],
    facts: &TelemetryFacts,
    pods: &HashMap<String, PodRef>,
    allocations: &[PodAllocation],
) -> TelemetryView {
    let mut view = TelemetryView::default();
    let by_luid: FastMap<i64, usize> = devices
        .iter()
        .enumerate()
        .map(|(i, d)| (d.luid, i))
        .collect();
    // Which pod container each process belongs to.
    let mut owners: Vec<PodRef> = vec![PodRef::host()];
    let mut owner_of_pid: FastMap<u32, usize> = FastMap::default();
    for c in &facts.containers {
        let pod = pods
            .get(&c.id)
            .or(c.pod.as_ref())
            .cloned()
            .unwrap_or_default();
        let index = owners.iter().position(|o| *o == pod).unwrap_or_else(|| {
            owners.push(pod);
            owners.len() - 1
        });
        for &pid in &c.pids {
            owner_of_pid.insert(pid, index);
        }
    }
    let owner = |pid: u32| owner_of_pid.get(&pid).copied().unwrap_or(0);

    let last = facts.samples.last();
    let previous = match facts.samples.len() {
        n if n >= 2 => Some(&facts.samples[n - 2]),
        _ => None,
    }
    .filter(|p| last.is_some_and(|l| l.time100ns > p.time100ns));

    // Per device: engine busy time (with the engine's label), processes, memory. The maps are
    // keyed by small integers and use a multiply-rotate hash (the keys come from the OS, not from
    // a network peer).
    let n = devices.len();
    let mut engines: FastMap<EngineKey, (usize, u64)> = FastMap::default();
    let mut labels: Vec<String> = Vec::new();
    let mut label_index: HashMap<String, usize> = HashMap::new();
    let mut device_pids: FastSet<(usize, u32)> = FastSet::default();
    let mut used: Vec<Segments> = vec![Segments::default(); n];
    // Per (owner, device, engine): busy; per (owner, device): memory and processes.
    let mut c_busy: FastMap<(usize, usize, EngineKey), u64> = FastMap::default();
    let mut c_memory: FastMap<(usize, usize), (u64, u64)> = FastMap::default();
    let mut c_pids: FastSet<(usize, usize, u32)> = FastSet::default();

    if let Some(last) = last {
        // The previous value of each instance: by position when the instance lists are in the
        // same order (PDH keeps its order between reads), else by name.
        let before_list = previous.map(|p| p.engines.as_slice()).unwrap_or(&[]);
        let mut before_map: Option<HashMap<&str, u64>> = None;
        // The last process seen, to skip repeated lookups for its consecutive instances.
        let mut current: Option<(u32, usize, usize)> = None;
        for (i, e) in last.engines.iter().enumerate() {
            let Some(inst) = parse_engine(&e.instance) else {
                view.unparsed_instances += 1;
                continue;
            };
            let Some(&d) = by_luid.get(&inst.luid) else {
                continue;
            };
            let earlier = match before_list.get(i) {
                Some(b) if b.instance == e.instance => Some(b.running_time),
                _ if before_list.is_empty() => None,
                _ => before_map
                    .get_or_insert_with(|| {
                        before_list
                            .iter()
                            .map(|b| (b.instance.as_str(), b.running_time))
                            .collect()
                    })
                    .get(e.instance.as_str())
                    .copied(),
            };
            let delta = earlier
                .and_then(|b| e.running_time.checked_sub(b))
                .unwrap_or(0);
            let key = (inst.luid, inst.phys, inst.eng);
            let slot = engines.entry(key).or_insert_with(|| {
                let label = super::instance::engine_label(inst.engtype);
                let index = *label_index.entry(label.clone()).or_insert_with(|| {
                    labels.push(label);
                    labels.len() - 1
                });
                (index, 0)
            });
            slot.1 += delta;
            let o = match current {
                Some((pid, dev, o)) if pid == inst.pid && dev == d => o,
                _ => {
                    let o = owner(inst.pid);
                    device_pids.insert((d, inst.pid));
                    c_pids.insert((o, d, inst.pid));
                    current = Some((inst.pid, d, o));
                    o
                }
            };
            *c_busy.entry((o, d, key)).or_insert(0) += delta;
        }
        for m in &last.process_memory {
            let Some(inst) = parse_process(&m.instance) else {
                view.unparsed_instances += 1;
                continue;
            };
            let Some(&d) = by_luid.get(&inst.luid) else {
                continue;
            };
            device_pids.insert((d, inst.pid));
            let o = owner(inst.pid);
            let entry = c_memory.entry((o, d)).or_insert((0, 0));
            entry.0 = entry.0.saturating_add(m.dedicated);
            entry.1 = entry.1.saturating_add(m.shared);
            c_pids.insert((o, d, inst.pid));
        }
        for m in &last.adapter_memory {
            let Some(inst) = parse_adapter(&m.instance) else {
                view.unparsed_instances += 1;
                continue;
            };
            let Some(&d) = by_luid.get(&inst.luid) else {
                continue;
            };
            let u = &mut used[d];
            u.dedicated = Some(u.dedicated.unwrap_or(0).saturating_add(m.dedicated));
            u.shared = Some(u.shared.unwrap_or(0).saturating_add(m.shared));
        }
    }
    let window = match (previous, last) {
        (Some(p), Some(l)) => l.time100ns - p.time100ns,
        _ => 0,
    };
    view.window_seconds = window as f64 / 1e7;
    let share = |busy: u64| (busy as f64 / window as f64).min(1.0);
    let raise = |map: &mut BTreeMap<String, f64>, label: usize, value: f64| {
        let slot = map.entry(labels[label].clone()).or_insert(0.0);
        if value > *slot {
            *slot = value;
        }
    };
    let mut device_engines: Vec<BTreeMap<String, f64>> = vec![BTreeMap::new(); n];
    let mut container_engines: FastMap<(usize, usize), BTreeMap<String, f64>> = FastMap::default();
    if window > 0 {
        for (key, &(label, busy)) in &engines {
            if let Some(&d) = by_luid.get(&key.0) {
                raise(&mut device_engines[d], label, share(busy));
            }
        }
        for (&(o, d, key), &busy) in &c_busy {
            let label = engines.get(&key).map_or(0, |e| e.0);
            raise(
                container_engines.entry((o, d)).or_default(),
                label,
                share(busy),
            );
        }
    }
    let mut device_processes = vec![0u64; n];
    for &(d, _) in &device_pids {
        device_processes[d] += 1;
    }
    let mut container_processes: FastMap<(usize, usize), u64> = FastMap::default();
    for &(o, d, _) in &c_pids {
        *container_processes.entry((o, d)).or_insert(0) += 1;
    }

    // Holders per device.
    let mut holders: Vec<Vec<Holder>> = vec![Vec::new(); n];
    for a in allocations {
        for id in &a.device_ids {
            if let Some(d) = physical(devices, id) {
                holders[d].push(Holder {
                    pod: a.holder(),
                    resource: a.resource.clone(),
                    device_id: id.clone(),
                });
            }
        }
    }

    let shared_limit: HashMap<i64, u64> = facts
        .shared_memory_limits
        .iter()
        .map(|l| (l.luid, l.bytes))
        .collect();
    for (d, dev) in devices.iter().enumerate() {
        let mut h = std::mem::take(&mut holders[d]);
        h.sort();
        h.dedup();
        view.devices.push(DeviceTelemetry {
            device: dev.id.clone(),
            resource: dev.resource.clone(),
            luid: luid_label(dev.luid),
            model: dev.model.clone(),
            engines: std::mem::take(&mut device_engines[d]),
            memory_used: used[d],
            memory_total: Segments {
                dedicated: (dev.dedicated_total > 0).then_some(dev.dedicated_total),
                shared: shared_limit.get(&dev.luid).copied(),
            },
            processes: device_processes[d],
            holders: h,
            health: String::new(),
            sensors: last
                .map(|l| super::sensors::view(l.sensors.iter().filter(|s| s.luid == dev.luid)))
                .unwrap_or_default(),
        });
    }
    for (&(o, d), &processes) in &container_processes {
        let memory = c_memory.get(&(o, d)).copied().unwrap_or((0, 0));
        view.containers.push(ContainerTelemetry {
            pod: owners[o].clone(),
            device: devices[d].id.clone(),
            memory_used: Segments {
                dedicated: Some(memory.0),
                shared: Some(memory.1),
            },
            memory_share: None,
            engines: container_engines.remove(&(o, d)).unwrap_or_default(),
            processes,
        });
    }
    view.containers
        .sort_by(|a, b| (&a.pod, &a.device).cmp(&(&b.pod, &b.device)));
    view
}

/// The devices of `discovery` that a resource serves, with `name` giving the served resource name
/// of each resource (`None`: not served, left out).
pub fn device_refs(
    discovery: &Discovery,
    name: impl Fn(Resource) -> Option<String>,
) -> Vec<DeviceRef> {
    discovery
        .devices
        .iter()
        .filter_map(|d| {
            let resource = name(d.resource?)?;
            Some(DeviceRef {
                id: d.id.clone(),
                resource,
                luid: d.luid,
                model: d.description.clone(),
                dedicated_total: d.dedicated_memory_bytes,
            })
        })
        .collect()
}

/// The index of the device an advertised ID names: the ID itself, a replica `<id>-r<k>` or a
/// memory unit `<id>-m<k>`.
fn physical(devices: &[DeviceRef], id: &str) -> Option<usize> {
    let unit = crate::sharing::parse_memory_unit_id(id).map(|(p, _)| p);
    devices.iter().position(|d| {
        id == d.id
            || unit == Some(d.id.as_str())
            || id
                .strip_prefix(d.id.as_str())
                .and_then(|rest| rest.strip_prefix("-r"))
                .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// The sample a fresh read adds to a window of at most two samples (the previous one and the new
/// one), for a live source that reads the counters once per interval.
pub fn push_sample(window: &mut Vec<CounterSample>, sample: CounterSample) {
    if window
        .last()
        .is_some_and(|l| sample.time100ns <= l.time100ns)
    {
        // The clock went back (or the same read twice): start over.
        window.clear();
    }
    window.push(sample);
    while window.len() > 2 {
        window.remove(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::{ContainerProcesses, EngineCounter, MemoryCounter};

    fn device(id: &str, luid: i64) -> DeviceRef {
        DeviceRef {
            id: id.into(),
            resource: "r".into(),
            luid,
            model: "m".into(),
            dedicated_total: 0,
        }
    }

    fn engine(pid: u32, eng: u32, engtype: &str, running_time: u64) -> EngineCounter {
        EngineCounter {
            instance: format!(
                "pid_{pid}_luid_0x00000000_0x00000010_phys_0_eng_{eng}_engtype_{engtype}"
            ),
            running_time,
        }
    }

    fn sample(time100ns: u64, engines: Vec<EngineCounter>) -> CounterSample {
        CounterSample {
            time100ns,
            engines,
            ..CounterSample::default()
        }
    }

    #[test]
    fn one_sample_gives_memory_and_processes_but_no_utilisation() {
        let facts = TelemetryFacts {
            samples: vec![CounterSample {
                process_memory: vec![MemoryCounter {
                    instance: "pid_9_luid_0x00000000_0x00000010_phys_0".into(),
                    dedicated: 100,
                    shared: 7,
                }],
                ..sample(5, vec![engine(8, 0, "3D", 50)])
            }],
            ..TelemetryFacts::default()
        };
        let view = compute(&[device("d", 0x10)], &facts, &HashMap::new(), &[]);
        let d = &view.devices[0];
        assert!(d.engines.is_empty());
        assert_eq!(d.processes, 2);
        assert_eq!(
            d.memory_used,
            Segments::default(),
            "no adapter counter: unknown"
        );
        assert_eq!(view.window_seconds, 0.0);
        // Both processes are the host's.
        assert_eq!(view.containers.len(), 1);
        assert_eq!(view.containers[0].pod, PodRef::host());
        assert_eq!(view.containers[0].memory_used.dedicated, Some(100));
        assert_eq!(view.containers[0].memory_used.shared, Some(7));
    }

    #[test]
    fn a_clock_that_goes_back_gives_no_utilisation() {
        let facts = TelemetryFacts {
            samples: vec![
                sample(20, vec![engine(8, 0, "3D", 0)]),
                sample(10, vec![engine(8, 0, "3D", 5)]),
            ],
            ..TelemetryFacts::default()
        };
        let view = compute(&[device("d", 0x10)], &facts, &HashMap::new(), &[]);
        assert!(view.devices[0].engines.is_empty());
    }

    #[test]
    fn busy_shares_add_up_per_engine_and_the_busiest_engine_of_a_type_counts() {
        // 1000 ticks apart: pid 1 and 2 share engine 0 (300 + 200), pid 1 alone on engine 1 (600).
        let facts = TelemetryFacts {
            samples: vec![
                sample(
                    1000,
                    vec![
                        engine(1, 0, "Copy", 0),
                        engine(2, 0, "Copy", 0),
                        engine(1, 1, "Copy", 0),
                    ],
                ),
                sample(
                    2000,
                    vec![
                        engine(1, 0, "Copy", 300),
                        engine(2, 0, "Copy", 200),
                        engine(1, 1, "Copy", 600),
                    ],
                ),
            ],
            containers: vec![ContainerProcesses {
                id: "c".into(),
                pids: vec![1],
                pod: None,
            }],
            ..TelemetryFacts::default()
        };
        let pod = PodRef {
            namespace: "n".into(),
            pod: "p".into(),
            container: "c".into(),
        };
        let pods = HashMap::from([("c".to_string(), pod.clone())]);
        let view = compute(&[device("d", 0x10)], &facts, &pods, &[]);
        assert_eq!(view.devices[0].engines["copy"], 0.6);
        assert_eq!(view.window_seconds, 0.0001);
        let by_pod: BTreeMap<_, _> = view
            .containers
            .iter()
            .map(|c| (c.pod.clone(), c.engines["copy"]))
            .collect();
        // pid 1 (the pod): max(300, 600) / 1000; pid 2 (the host): 200 / 1000.
        assert_eq!(by_pod[&pod], 0.6);
        assert_eq!(by_pod[&PodRef::host()], 0.2);
    }

    #[test]
    fn replica_and_memory_unit_ids_name_their_physical_device() {
        let devices = [device("gpu-a", 1), device("gpu-a-2", 2)];
        let table = [
            ("gpu-a", Some(0)),
            ("gpu-a-r1", Some(0)),
            ("gpu-a-r12", Some(0)),
            ("gpu-a-2", Some(1)),
            ("gpu-a-2-r3", Some(1)),
            ("gpu-a-r", None),
            ("gpu-a-rx", None),
            ("gpu-b", None),
            // Memory units: all of them, from 0.
            ("gpu-a-m0", Some(0)),
            ("gpu-a-m15", Some(0)),
            ("gpu-a-2-m3", Some(1)),
            ("gpu-a-m", None),
            ("gpu-a-m01", None),
        ];
        for (id, want) in table {
            assert_eq!(physical(&devices, id), want, "{id}");
        }
    }

    #[test]
    fn the_window_keeps_the_last_two_samples_and_restarts_when_time_goes_back() {
        let mut w = Vec::new();
        for t in [1, 2, 3] {
            push_sample(&mut w, sample(t, vec![]));
        }
        assert_eq!(w.iter().map(|s| s.time100ns).collect::<Vec<_>>(), [2, 3]);
        push_sample(&mut w, sample(3, vec![]));
        assert_eq!(w.iter().map(|s| s.time100ns).collect::<Vec<_>>(), [3]);
    }
}
