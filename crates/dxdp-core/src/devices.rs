//! Devices: what the pipeline makes of the host facts.
//!
//! Plain data that the rest of dxdp consumes: `discover` renders it, the device plugin advertises
//! it and allocation turns it into container edits. Serialises to the `discover --json` shape.

use std::fmt;

use serde::Serialize;

use crate::facts::PciLocation;
use crate::hints::CudaOrder;

/// The result of running the pipeline over one host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Discovery {
    /// Devices that can be advertised (or at least shown), ordered by location path.
    pub devices: Vec<Device>,
    /// Adapters that were left out, and why.
    pub excluded: Vec<Excluded>,
    /// Things an operator should know (bad registry entries, missing files, ...).
    pub warnings: Vec<String>,
    /// True when dxdp itself runs inside a container (driver store under `HostDriverStore`).
    pub in_container: bool,
    /// How CUDA numbers the host's NVIDIA devices (for `CUDA_VISIBLE_DEVICES`).
    #[serde(skip)]
    pub cuda_order: CudaOrder,
}

impl Discovery {
    /// The devices that belong to `resource`.
    pub fn devices_for(&self, resource: Resource) -> impl Iterator<Item = &Device> {
        self.devices
            .iter()
            .filter(move |d| d.resource == Some(resource))
    }

    /// Looks a device up by its ID.
    pub fn device(&self, id: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.id == id)
    }
}

/// The two kinds of resource dxdp serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Resource {
    /// Full WDDM GPUs (D3D12 graphics): `directx.microsoft.com/display`.
    Display,
    /// Compute-only MCDM devices and NPUs: `directx.microsoft.com/compute`.
    Compute,
}

impl Resource {
    /// Every resource, in a fixed order.
    pub const ALL: [Resource; 2] = [Resource::Display, Resource::Compute];

    /// The short name (`display`, `compute`).
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Display => "display",
            Resource::Compute => "compute",
        }
    }

    /// The default extended resource name advertised to the kubelet.
    pub fn default_resource_name(self) -> &'static str {
        match self {
            Resource::Display => "directx.microsoft.com/display",
            Resource::Compute => "directx.microsoft.com/compute",
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One value per resource (a setting that the reference plugins kept per plugin).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PerResource<T> {
    /// The value for `display`.
    pub display: T,
    /// The value for `compute`.
    pub compute: T,
}

impl<T: Copy> PerResource<T> {
    /// The same value for both resources.
    pub fn both(value: T) -> Self {
        PerResource {
            display: value,
            compute: value,
        }
    }

    /// The value for `r`.
    pub fn get(&self, r: Resource) -> T {
        match r {
            Resource::Display => self.display,
            Resource::Compute => self.compute,
        }
    }

    /// The value for `r`, to change.
    pub fn get_mut(&mut self, r: Resource) -> &mut T {
        match r {
            Resource::Display => &mut self.display,
            Resource::Compute => &mut self.compute,
        }
    }
}

/// One physical DirectX device that can be assigned to a container by location path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Stable ID derived from the location path (`[A-Za-z0-9._-]`, at most 56 characters).
    pub id: String,
    /// DXCore adapter LUID of this boot.
    pub luid: i64,
    /// Human description (DXCore driver description, else the device node's).
    pub description: String,
    /// Vendor name from the PCI vendor ID (`nvidia`, `amd`, `intel`, ... or `pci-XXXX`).
    pub vendor: String,
    /// PCI vendor ID.
    pub vendor_id: u32,
    /// PCI device ID.
    pub device_id: u32,
    /// PCI subsystem ID.
    pub sub_sys_id: u32,
    /// PCI revision.
    pub revision: u32,
    /// The manufacturer the device node names, if any.
    pub manufacturer: Option<String>,
    /// First location path of the device node: what containerd assigns.
    pub location_path: String,
    /// PCI bus, device and function, when the device node reports them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci: Option<PciLocation>,
    /// PnP device instance ID.
    pub instance_id: String,
    /// Driver key below `HKLM\SYSTEM\CurrentControlSet\Control\Class`.
    pub driver_key: Option<String>,
    /// Driver version.
    pub driver_version: String,
    /// Driver store directory with `\SystemRoot` expanded.
    pub driver_store_path: Option<String>,
    /// Dedicated adapter memory in bytes.
    pub dedicated_memory_bytes: u64,
    /// Integrated adapter.
    pub is_integrated: bool,
    /// Detachable adapter.
    pub is_detachable: bool,
    /// D3D11 or D3D12 graphics.
    pub supports_display: bool,
    /// D3D12 core compute or generic ML.
    pub supports_compute: bool,
    /// The resource that advertises this device; `None` when it fits neither.
    pub resource: Option<Resource>,
    /// Health as advertised to the kubelet.
    pub health: Health,
    /// Runtime files (non-DirectX API DLLs and tools) mounted into containers.
    pub runtime_files: RuntimeFiles,
}

impl Device {
    /// The containerd device string: `vpci-location-path://<location path>`.
    pub fn host_path(&self) -> String {
        format!("vpci-location-path://{}", self.location_path)
    }
}

/// Device health.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Health {
    /// `Healthy` or `Unhealthy`.
    pub state: HealthState,
    /// Why the device is unhealthy.
    pub reason: Option<String>,
}

impl Health {
    /// A healthy device.
    pub fn healthy() -> Self {
        Health {
            state: HealthState::Healthy,
            reason: None,
        }
    }

    /// An unhealthy device with a reason.
    pub fn unhealthy(reason: impl Into<String>) -> Self {
        Health {
            state: HealthState::Unhealthy,
            reason: Some(reason.into()),
        }
    }

    /// Whether the device is healthy.
    pub fn is_healthy(&self) -> bool {
        self.state == HealthState::Healthy
    }
}

/// The kubelet's two health values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum HealthState {
    /// `Healthy`.
    Healthy,
    /// `Unhealthy`.
    Unhealthy,
}

impl HealthState {
    /// The kubelet's string for this state.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Healthy => "Healthy",
            HealthState::Unhealthy => "Unhealthy",
        }
    }
}

/// Runtime files by target directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RuntimeFiles {
    /// Files for `C:\Windows\System32`.
    pub system32: Vec<RuntimeFile>,
    /// Files for `C:\Windows\SysWOW64`.
    pub syswow64: Vec<RuntimeFile>,
}

impl RuntimeFiles {
    /// All files with their target directory.
    pub fn iter(&self) -> impl Iterator<Item = (TargetDir, &RuntimeFile)> {
        self.system32
            .iter()
            .map(|f| (TargetDir::System32, f))
            .chain(self.syswow64.iter().map(|f| (TargetDir::SysWow64, f)))
    }

    /// Number of files in both directories.
    pub fn len(&self) -> usize {
        self.system32.len() + self.syswow64.len()
    }

    /// True when there are no files.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where in the container a runtime file goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum TargetDir {
    /// `C:\Windows\System32` (64-bit).
    System32,
    /// `C:\Windows\SysWOW64` (32-bit).
    SysWow64,
}

impl TargetDir {
    /// The directory in the container.
    pub fn container_dir(self) -> &'static str {
        match self {
            TargetDir::System32 => r"C:\Windows\System32",
            TargetDir::SysWow64 => r"C:\Windows\SysWOW64",
        }
    }

    /// The directory's name.
    pub fn name(self) -> &'static str {
        match self {
            TargetDir::System32 => "System32",
            TargetDir::SysWow64 => "SysWOW64",
        }
    }
}

/// One file from the driver store to mount into the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeFile {
    /// Path relative to the driver store directory (normalised to `\`).
    pub source: String,
    /// Bare file name in the target directory.
    pub destination: String,
    /// Where the entry came from.
    pub origin: Origin,
    /// The registry value (`CopyToVmOverwrite\nvcuda`) for registry entries.
    pub registry_value: Option<String>,
    /// Absolute host path of the source.
    pub host_path: String,
    /// Whether the source exists on the host; missing files are never mounted.
    pub exists: bool,
}

/// Where a runtime file entry came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    /// A `CopyToVm*` registry value of the driver.
    Registry,
    /// dxdp's built-in per-vendor additions.
    VendorDefault,
    /// `runtimeFiles.additional` in the configuration.
    Config,
}

impl Origin {
    /// The JSON name of the origin.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Registry => "registry",
            Origin::VendorDefault => "vendor-default",
            Origin::Config => "config",
        }
    }
}

/// An adapter that was left out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Excluded {
    /// DXCore adapter LUID.
    pub luid: i64,
    /// Description of the adapter.
    pub description: String,
    /// PnP instance ID, when a device node matched.
    pub instance_id: Option<String>,
    /// Location path, when known.
    pub location_path: Option<String>,
    /// Machine-readable reason.
    pub code: ExclusionCode,
    /// Human reason, with what to do about it where there is something to do.
    pub reason: String,
}

/// Machine-readable exclusion reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExclusionCode {
    /// `isHardware: false`.
    SoftwareAdapter,
    /// Integrated adapter while integrated devices are not included.
    Integrated,
    /// Detachable adapter while detachable devices are not included.
    Detachable,
    /// No PnP device node matched the adapter LUID.
    NoDeviceNode,
    /// The device node has no location path.
    NoLocationPath,
    /// Another adapter already has the same location path.
    DuplicateLocationPath,
    /// `devices.include` is set and matches no field of the device.
    NotIncluded,
    /// A `devices.exclude` selector matches the device.
    ExcludedByConfig,
}
