//! GPU telemetry: the facts (raw performance counter samples, the processes of each container,
//! what the kubelet's PodResources API said) and the pure computation that turns them into
//! per-device and per-container figures.
//!
//! - this module: the telemetry facts, plain data as Windows reports it. Like
//!   [`crate::facts`], the serde derives are the body of the `telemetry` section of the host
//!   snapshot format (`docs/host-snapshot.md`): unknown fields and wrong types are errors.
//! - [`instance`]: parsing of the PDH counter instance names (`pid_…_luid_…_engtype_…`).
//! - [`compute`]: utilisation from running-time counters, memory per segment, per-process to
//!   per-container sums and the join with the kubelet's allocations.
//! - [`isolation`]: the isolation audit: containers using a GPU the kubelet did not allocate to
//!   them.
//! - [`overuse`]: memory shares per container and GPU, and the over-use rule (a container above
//!   its memory share for longer than a grace period).
//! - [`sensors`]: temperature, power, clocks, fan and throttle reasons per adapter and source.

pub mod compute;
pub mod instance;
pub mod isolation;
pub mod overuse;
pub mod sensors;

use serde::{Deserialize, Serialize};

/// Everything the telemetry computation needs besides the devices.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TelemetryFacts {
    /// Reads of the GPU performance counters, oldest first. Utilisation needs two; with one,
    /// only memory and process counts are known.
    #[serde(default)]
    pub samples: Vec<CounterSample>,
    /// The containers (HCS compute systems) of the node and their processes, at the last sample.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<ContainerProcesses>,
    /// The shared system memory each adapter may use (DXCore `SharedSystemMemory`), by LUID.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_memory_limits: Vec<SharedMemoryLimit>,
    /// What the kubelet's PodResources `List` answered, for the resources dxdp serves; the kubelet
    /// stand-in serves it in replays.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_resources: Vec<PodAllocation>,
}

/// One read of the GPU performance counters (PDH, raw values).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CounterSample {
    /// When the counters were read, in 100 ns units (the PDH raw counter time stamp, a
    /// FILETIME). Only differences between samples matter.
    pub time100ns: u64,
    /// `\GPU Engine(*)\Running Time`: 100 ns units the engine ran the process's work, since the
    /// process started using it.
    #[serde(default)]
    pub engines: Vec<EngineCounter>,
    /// `\GPU Process Memory(*)\Dedicated Usage` and `Shared Usage`, bytes.
    #[serde(default)]
    pub process_memory: Vec<MemoryCounter>,
    /// `\GPU Adapter Memory(*)\Dedicated Usage` and `Shared Usage`, bytes.
    #[serde(default)]
    pub adapter_memory: Vec<MemoryCounter>,
    /// The adapters' sensors (temperature, power, clocks, fan) read with the counters, one entry
    /// per adapter and source.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sensors: Vec<sensors::AdapterSensors>,
}

/// One `GPU Engine` instance's running time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EngineCounter {
    /// The instance name, e.g. `pid_1234_luid_0x00000000_0x0000D1A6_phys_0_eng_0_engtype_3D`.
    pub instance: String,
    /// `Running Time`, 100 ns units.
    pub running_time: u64,
}

/// One memory counter instance (`GPU Process Memory` or `GPU Adapter Memory`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemoryCounter {
    /// The instance name, e.g. `pid_1234_luid_0x00000000_0x0000D1A6_phys_0` or
    /// `luid_0x00000000_0x0000D1A6_phys_0`.
    pub instance: String,
    /// `Dedicated Usage`, bytes.
    #[serde(default)]
    pub dedicated: u64,
    /// `Shared Usage`, bytes.
    #[serde(default)]
    pub shared: u64,
}

/// The processes of one container (an HCS compute system).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerProcesses {
    /// The compute system ID, which is the container ID the runtime reports in the pod's status
    /// (`containerd://<id>` without the scheme) and in its CRI `ListContainers`.
    pub id: String,
    /// Process IDs of the container's processes (HCS `ProcessList`).
    #[serde(default)]
    pub pids: Vec<u32>,
    /// The pod container this is, when known (recorded from the container runtime's CRI
    /// `ListContainers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
}

/// A container of a pod.
#[derive(
    Debug,
    Clone,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodRef {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
}

impl PodRef {
    /// The empty reference: the host, or a process dxdp cannot place.
    pub fn host() -> Self {
        PodRef::default()
    }

    /// Whether this is [`PodRef::host`].
    pub fn is_host(&self) -> bool {
        self.pod.is_empty()
    }
}

/// The shared system memory limit of one adapter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SharedMemoryLimit {
    /// The adapter's LUID (as in `adapters[].luid`).
    pub luid: i64,
    /// DXCore `SharedSystemMemory`, bytes.
    pub bytes: u64,
}

/// The devices of one resource that the kubelet assigned to one pod container (one
/// `ContainerDevices` entry of a PodResources `List` answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodAllocation {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
    /// The extended resource name (`directx.microsoft.com/display`, or a configured name).
    pub resource: String,
    /// The device IDs as advertised (replica IDs included).
    pub device_ids: Vec<String>,
}

impl PodAllocation {
    /// The pod container that holds the devices.
    pub fn holder(&self) -> PodRef {
        PodRef {
            namespace: self.namespace.clone(),
            pod: self.pod.clone(),
            container: self.container.clone(),
        }
    }
}
