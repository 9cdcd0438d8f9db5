//! Devices: what the pipeline makes of the host facts.
//!
//! Plain data that the rest of dxdp consumes: `discover` renders it, the device plugin advertises
//! it and allocation turns it into container edits. Serialises to the `discover --json` shape.

use std::fmt;

use schemars::JsonSchema;
use serde::Serialize;

use std::collections::HashSet;

use crate::facts::{HostFacts, PciLocation};
use crate::vendor::NVIDIA;

/// The result of running the pipeline over one host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Discovery {
    /// Devices that can be advertised (or at least shown), ordered by location path.
    pub devices: Vec<Device>,
    /// Adapters that were left out, and why.
    pub excluded: Vec<Excluded>,
    /// Things an operator should know (bad registry entries, missing files, ...).
    pub warnings: Vec<Warning>,
    /// True when dxdp itself runs inside a container (driver store under `HostDriverStore`).
    pub in_container: bool,
    /// How CUDA numbers the host's NVIDIA devices (for `CUDA_VISIBLE_DEVICES`).
    #[serde(skip)]
    pub cuda_order: CudaOrder,
    /// How each adapter was matched to its device node, in the order of the facts' adapters.
    #[serde(skip)]
    pub matches: Vec<crate::pipeline::matching::AdapterMatch>,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
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
    /// The highest Direct3D 12 feature level the adapter supports (`12_1`), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub d3d12_feature_level: Option<String>,
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Health {
    /// `Healthy` or `Unhealthy`.
    pub state: HealthState,
    /// Why the device is unhealthy.
    pub reason: Option<String>,
    /// The reason's stable name (`healthy`, `problem_code`, `tdr`, ...; see [`crate::health`]).
    pub code: crate::health::reason::Reason,
}

impl Health {
    /// A healthy device.
    pub fn healthy() -> Self {
        Health {
            state: HealthState::Healthy,
            reason: None,
            code: crate::health::reason::Reason::Healthy,
        }
    }

    /// An unhealthy device: the signal that made it so and a sentence for the operator.
    pub fn unhealthy(code: crate::health::reason::Reason, reason: impl Into<String>) -> Self {
        Health {
            state: HealthState::Unhealthy,
            reason: Some(reason.into()),
            code,
        }
    }

    /// Whether the device is healthy.
    pub fn is_healthy(&self) -> bool {
        self.state == HealthState::Healthy
    }
}

/// The kubelet's two health values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
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

/// Something an operator should know about a host, an adapter or a device: a stable code (listed
/// with its meaning and remedy in docs/troubleshooting.md), what it concerns, and a message for
/// people. `Display` is the message, so logs and text output read as before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Warning {
    /// Stable machine-readable code, kebab-case.
    pub code: WarningCode,
    /// The kubelet device ID (as in `devices[].id`) of the device it concerns, when the adapter
    /// got that far; `null` for adapter-level and host-level warnings.
    pub device: Option<String>,
    /// The DXCore LUID (as in `devices[].luid` and `excluded[].luid`) of the adapter it
    /// concerns; `null` for host-level warnings.
    pub luid: Option<i64>,
    /// What happened and what it means, for people.
    pub message: String,
}

impl Warning {
    /// A warning about the host as a whole.
    pub fn host(code: WarningCode, message: impl Into<String>) -> Self {
        Warning {
            code,
            device: None,
            luid: None,
            message: message.into(),
        }
    }

    /// A warning about an adapter that has no device ID (yet).
    pub fn adapter(code: WarningCode, luid: i64, message: impl Into<String>) -> Self {
        Warning {
            code,
            device: None,
            luid: Some(luid),
            message: message.into(),
        }
    }

    /// A warning about a device with a kubelet device ID.
    pub fn device(code: WarningCode, id: &str, luid: i64, message: impl Into<String>) -> Self {
        Warning {
            code,
            device: Some(id.to_string()),
            luid: Some(luid),
            message: message.into(),
        }
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Declares [`WarningCode`] with its kebab-case names and the list of every code, so that the
/// list cannot miss a variant.
macro_rules! warning_codes {
    ($($(#[doc = $doc:literal])* $variant:ident => $name:literal,)*) => {
        /// Stable warning codes. Each is documented in docs/troubleshooting.md; a test checks that
        /// both lists agree. Codes are never renamed or reused within `dxdp/v1`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, JsonSchema)]
        pub enum WarningCode {
            $($(#[doc = $doc])* #[serde(rename = $name)] $variant,)*
        }

        impl WarningCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [WarningCode] = &[$(WarningCode::$variant,)*];

            /// The code as it appears in JSON and in the docs.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(WarningCode::$variant => $name,)*
                }
            }
        }
    };
}

warning_codes! {
    /// dxdp runs inside a container: runtime files are not enumerated.
    InContainer => "in-container",
    /// `os.systemRoot` is not an absolute local path.
    SystemRootInvalid => "system-root-invalid",
    /// Reading a property of an adapter failed.
    AdapterReadError => "adapter-read-error",
    /// DXCore does not support some adapter properties; defaults were used.
    PropertyUnsupported => "property-unsupported",
    /// DXCore does not report IsHardware; dxdp decided from the device node.
    HardwareInferred => "hardware-inferred",
    /// No device node matches a hardware adapter (by LUID or PCI location); it is skipped.
    AdapterUnmatched => "adapter-unmatched",
    /// The driver store path is not an absolute local path.
    DriverStoreInvalid => "driver-store-invalid",
    /// The driver store is outside `%SystemRoot%\System32\DriverStore`.
    DriverStoreOutside => "driver-store-outside",
    /// The driver store path is unknown.
    DriverStoreUnknown => "driver-store-unknown",
    /// The device node has no driver key.
    NoDriverKey => "no-driver-key",
    /// A `CopyToVm*` value has more than two strings.
    RegistryValueExtraStrings => "registry-value-extra-strings",
    /// A `CopyToVm*` value has a type other than REG_SZ or REG_MULTI_SZ.
    RegistryValueType => "registry-value-type",
    /// A runtime-file entry has an empty source.
    RuntimeFileEmptySource => "runtime-file-empty-source",
    /// A runtime-file source escapes the driver store or is not a relative path.
    RuntimeFileSourceRejected => "runtime-file-source-rejected",
    /// A runtime-file destination is not a plain file name.
    RuntimeFileDestinationRejected => "runtime-file-destination-rejected",
    /// Two runtime-file entries map to the same destination; the later one is dropped.
    RuntimeFileDuplicate => "runtime-file-duplicate",
    /// A runtime file the driver lists does not exist on the host.
    RuntimeFileMissing => "runtime-file-missing",
    /// Fewer devices of a resource than `health.expectedDevices` expects (a GPU of the VM size
    /// is gone).
    GpuMissing => "gpu-missing",
}

impl fmt::Display for WarningCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The order in which CUDA numbers the host's NVIDIA devices under `CUDA_DEVICE_ORDER=PCI_BUS_ID`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum CudaOrder {
    /// The PCI locations of every NVIDIA device CUDA can see, in CUDA's order.
    Known(Vec<PciLocation>),
    /// Why the order cannot be known.
    Unknown(String),
}

impl Default for CudaOrder {
    fn default() -> Self {
        CudaOrder::Known(Vec::new())
    }
}

impl CudaOrder {
    /// The order for a host: every hardware NVIDIA adapter whose device node works (no
    /// problem, by [`PnpFacts::has_problem`](crate::facts::PnpFacts::has_problem), the test
    /// health uses), advertised or not, sorted by PCI bus, device and function. Unknown when one of
    /// them has no PCI location or two share one.
    pub fn of(facts: &HostFacts) -> CudaOrder {
        let mut order = Vec::new();
        for adapter in &facts.adapters {
            if !adapter.is_hardware || adapter.hardware_id.vendor_id != NVIDIA {
                continue;
            }
            let Some(pnp) = &adapter.pnp else {
                return CudaOrder::Unknown(format!(
                    "the NVIDIA adapter with LUID {} has no device node, so its PCI location is unknown",
                    adapter.luid
                ));
            };
            if pnp.has_problem() {
                continue;
            }
            let Some(pci) = pnp.pci else {
                return CudaOrder::Unknown(format!(
                    "the PCI location of NVIDIA device {} is unknown",
                    pnp.instance_id
                ));
            };
            order.push(pci);
        }
        order.sort();
        let distinct: HashSet<&PciLocation> = order.iter().collect();
        if distinct.len() != order.len() {
            return CudaOrder::Unknown(
                "two NVIDIA devices report the same PCI bus, device and function (several PCI domains?)"
                    .into(),
            );
        }
        CudaOrder::Known(order)
    }
}

#[cfg(test)]
mod warning_tests {
    use super::*;

    #[test]
    fn codes_serialise_as_their_names_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for code in WarningCode::ALL {
            let json = serde_json::to_value(code).unwrap_or_default();
            assert_eq!(json, serde_json::Value::String(code.as_str().into()));
            assert!(seen.insert(code.as_str()), "{code} twice");
            assert!(code
                .as_str()
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '-'));
        }
    }

    #[test]
    fn display_is_the_message() {
        let w = Warning::device(WarningCode::NoDriverKey, "pci-1", 7, "device x: no key");
        assert_eq!(w.to_string(), "device x: no key");
        assert_eq!(
            serde_json::to_value(&w).unwrap_or_default(),
            serde_json::json!({"code": "no-driver-key", "device": "pci-1", "luid": 7, "message": "device x: no key"})
        );
    }
}
