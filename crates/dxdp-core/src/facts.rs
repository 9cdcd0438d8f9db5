//! Host facts: the raw values a Windows node reports about its DirectX adapters.
//!
//! This is plain data with no behaviour. The Windows backend fills it from DXCore, CfgMgr32, D3DKMT
//! and the registry; a host snapshot file fills it from YAML or JSON. The pipeline
//! ([`crate::pipeline`]) turns it into devices. The serde derives here *are* the body of the host
//! snapshot format (see `docs/host-snapshot.md`): unknown fields and wrong types are errors.

use serde::{Deserialize, Serialize};

/// Everything dxdp knows about one host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostFacts {
    /// Operating system facts; absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<OsFacts>,
    /// One entry per DXCore adapter, hardware or software.
    #[serde(default)]
    pub adapters: Vec<AdapterFacts>,
    /// Registry keys under HKLM, as they exist on the host.
    #[serde(default)]
    pub registry: Vec<RegistryKey>,
    /// Absolute host paths of files that exist (runtime-file sources, tools).
    #[serde(default)]
    pub files: Vec<String>,
    /// Recent fault events from the Windows event log, as `EvtRender` returned them (see
    /// [`crate::health::eventlog`]); the newest last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<LogRecord>,
}

/// One event-log record, as Windows reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LogRecord {
    /// The event rendered as XML (`EvtRender` with `EvtRenderEventXml`).
    pub xml: String,
}

/// The default `%SystemRoot%` of a Windows host.
pub const DEFAULT_SYSTEM_ROOT: &str = r"C:\Windows";

/// Operating system facts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OsFacts {
    /// e.g. `Windows Server 2022 Datacenter`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product_name: Option<String>,
    /// e.g. `21H2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_version: Option<String>,
    /// e.g. `10.0.20348.1547` (major.minor.build.UBR).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<String>,
    /// `%SystemRoot%`; `C:\Windows` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_root: Option<String>,
    /// Highest supported minor per major HCS schema version, e.g. `["2.5"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hcs_schema_versions: Vec<String>,
    /// containerd version (`1.7.20`), for `dxdp doctor` on simulated hosts; a real host is probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containerd_version: Option<String>,
    /// kubelet version (`1.29.3`), for `dxdp doctor` on simulated hosts; a real host is probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_version: Option<String>,
    /// The PnP device nodes of the Display and ComputeAccelerator classes, not yet matched to
    /// adapters (the pipeline matches them, see [`crate::pipeline::matching`]). In a host
    /// snapshot they are the top-level `deviceNodes` list, not part of `os`; they live here so
    /// that [`HostFacts`] keeps its fields.
    #[serde(skip)]
    pub device_nodes: Vec<PnpFacts>,
}

impl OsFacts {
    /// `%SystemRoot%`, defaulting to `C:\Windows`.
    pub fn system_root(&self) -> &str {
        self.system_root
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_SYSTEM_ROOT)
    }
}

/// One DXCore adapter and the device node that belongs to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AdapterFacts {
    /// DXCore `InstanceLuid` as signed 64-bit (`HighPart << 32 | LowPart`). Changes on reboot.
    pub luid: i64,
    /// DXCore `HardwareID`.
    pub hardware_id: HardwareId,
    /// DXCore `DriverDescription`.
    #[serde(default)]
    pub driver_description: String,
    /// DXCore `DriverVersion`, dotted (`31.0.15.2824`).
    #[serde(default)]
    pub driver_version: String,
    /// DXCore `DedicatedAdapterMemory` in bytes.
    #[serde(default)]
    pub dedicated_adapter_memory: u64,
    /// DXCore `IsHardware`; false for software renderers (WARP, Basic Render Driver). Ignored when
    /// listed in `unsupported_properties`.
    pub is_hardware: bool,
    /// DXCore `IsIntegrated`.
    #[serde(default)]
    pub is_integrated: bool,
    /// DXCore `IsDetachable`.
    #[serde(default)]
    pub is_detachable: bool,
    /// The DXCore attributes the adapter supports.
    #[serde(default)]
    pub attributes: Vec<Attribute>,
    /// DXCore state `IsDriverUpdateInProgress`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub driver_update_in_progress: bool,
    /// D3DKMT `DRIVERSTOREPATH`, as reported (usually starting with `\SystemRoot`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_store_path: Option<String>,
    /// The PnP device node of this adapter, as matched when the facts were recorded. The Windows
    /// backend leaves it empty and records the device nodes separately (`deviceNodes`); the
    /// pipeline matches them ([`crate::pipeline::matching`]). Older snapshots set it here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pnp: Option<PnpFacts>,
    /// The adapter's PCI bus, device and function as the graphics kernel reports them
    /// (`D3DKMTQueryAdapterInfo(KMTQAITYPE_ADAPTERADDRESS)`); absent when unknown. Used to match
    /// the adapter to its device node when no node reports the adapter's LUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter_address: Option<PciLocation>,
    /// The highest Direct3D 12 feature level the adapter supports, as D3D writes it (`12_1`;
    /// 11_0 to 12_2 are asked about): `CheckFeatureSupport(D3D12_FEATURE_FEATURE_LEVELS)` on a
    /// device created at 11_0. Absent when unknown (no D3D12, a compute-only adapter, a device
    /// that could not be created).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "feature_level"
    )]
    pub d3d12_feature_level: Option<String>,
    /// DXCore properties the adapter does not support (`IsPropertySupported` said no): their
    /// fields above hold defaults (false, 0, empty) that mean "unknown", not a reported value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unsupported_properties: Vec<AdapterProperty>,
    /// Facts the backend could not read for this adapter, with the API and error code.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_errors: Vec<String>,
}

/// The DXCore adapter properties recorded in [`AdapterFacts`], named by their snapshot field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AdapterProperty {
    /// DXCore `HardwareID` (`hardwareId`).
    HardwareId,
    /// DXCore `DriverDescription` (`driverDescription`).
    DriverDescription,
    /// DXCore `DriverVersion` (`driverVersion`).
    DriverVersion,
    /// DXCore `DedicatedAdapterMemory` (`dedicatedAdapterMemory`).
    DedicatedAdapterMemory,
    /// DXCore `IsHardware` (`isHardware`).
    IsHardware,
    /// DXCore `IsIntegrated` (`isIntegrated`).
    IsIntegrated,
    /// DXCore `IsDetachable` (`isDetachable`).
    IsDetachable,
}

impl AdapterProperty {
    /// The snapshot field name (`isHardware`).
    pub fn field(self) -> &'static str {
        match self {
            AdapterProperty::HardwareId => "hardwareId",
            AdapterProperty::DriverDescription => "driverDescription",
            AdapterProperty::DriverVersion => "driverVersion",
            AdapterProperty::DedicatedAdapterMemory => "dedicatedAdapterMemory",
            AdapterProperty::IsHardware => "isHardware",
            AdapterProperty::IsIntegrated => "isIntegrated",
            AdapterProperty::IsDetachable => "isDetachable",
        }
    }
}

/// A `d3d12FeatureLevel`: a feature level name, else an error that says how to write one.
fn feature_level<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let name = String::deserialize(d)?;
    match crate::validation::parse_feature_level(&name) {
        Some(_) => Ok(Some(name)),
        None => Err(serde::de::Error::custom(format!(
            "{} is not a D3D12 feature level: write it as D3D does, e.g. 12_1",
            crate::quote::quote(&name)
        ))),
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl AdapterFacts {
    /// A hardware adapter with only a LUID and attributes, everything else empty or false.
    pub fn minimal(luid: i64, attributes: Vec<Attribute>) -> Self {
        AdapterFacts {
            luid,
            hardware_id: HardwareId::default(),
            driver_description: String::new(),
            driver_version: String::new(),
            dedicated_adapter_memory: 0,
            is_hardware: true,
            is_integrated: false,
            is_detachable: false,
            attributes,
            driver_update_in_progress: false,
            driver_store_path: None,
            pnp: None,
            adapter_address: None,
            d3d12_feature_level: None,
            unsupported_properties: Vec::new(),
            read_errors: Vec::new(),
        }
    }

    /// Whether the adapter reports `attribute`.
    pub fn has(&self, attribute: Attribute) -> bool {
        self.attributes.contains(&attribute)
    }

    /// Whether DXCore does not support `property` for this adapter.
    pub fn unsupported(&self, property: AdapterProperty) -> bool {
        self.unsupported_properties.contains(&property)
    }
}

/// DXCore `DXCoreHardwareID`. Integers; YAML accepts hex (`0x10DE`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HardwareId {
    /// PCI vendor ID, e.g. `0x10DE`.
    pub vendor_id: u32,
    /// PCI device ID.
    pub device_id: u32,
    /// PCI subsystem ID (subsystem device in the high half, vendor in the low half).
    #[serde(default)]
    pub sub_sys_id: u32,
    /// PCI revision.
    #[serde(default)]
    pub revision: u32,
}

/// DXCore adapter attributes (the `DXCORE_ADAPTER_ATTRIBUTE_*` GUIDs) dxdp knows about.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Attribute {
    /// `DXCORE_ADAPTER_ATTRIBUTE_D3D11_GRAPHICS`.
    D3D11_GRAPHICS,
    /// `DXCORE_ADAPTER_ATTRIBUTE_D3D12_GRAPHICS`.
    D3D12_GRAPHICS,
    /// `DXCORE_ADAPTER_ATTRIBUTE_D3D12_CORE_COMPUTE`.
    D3D12_CORE_COMPUTE,
    /// `DXCORE_ADAPTER_ATTRIBUTE_D3D12_GENERIC_ML` (NPUs and other ML accelerators).
    D3D12_GENERIC_ML,
    /// `DXCORE_ADAPTER_ATTRIBUTE_D3D12_GENERIC_MEDIA`.
    D3D12_GENERIC_MEDIA,
}

/// The PnP device node of an adapter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PnpFacts {
    /// Device instance ID, e.g. `PCI\VEN_10DE&DEV_1EB8&...\3&13C0B0C5&1&D8`.
    pub instance_id: String,
    /// `DEVPKEY_Device_DeviceDesc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `DEVPKEY_Device_Manufacturer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manufacturer: Option<String>,
    /// `DEVPKEY_Device_LocationPaths`, all strings in order.
    #[serde(default)]
    pub location_paths: Vec<String>,
    /// `DEVPKEY_Device_Driver`, e.g. `{4d36e968-e325-11ce-bfc1-08002be10318}\0004`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_key: Option<String>,
    /// CfgMgr problem code (`CM_Get_DevNode_Status`). Meaningful only when `status_flags` has
    /// `DN_HAS_PROBLEM`; without `status_flags` (older snapshots), non-zero means a problem.
    #[serde(default)]
    pub problem_code: u32,
    /// PCI bus, device and function (`DEVPKEY_Device_BusNumber` and `DEVPKEY_Device_Address`);
    /// absent when unknown or not a PCI device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<PciLocation>,
    /// The raw `DN_*` status flags of `CM_Get_DevNode_Status`; absent when not recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_flags: Option<u32>,
    /// Why `CM_Get_DevNode_Status` failed; the device is then treated as unhealthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_error: Option<String>,
    /// The adapter LUID property `{60B193CB-5276-4D0F-96FC-F173ABAD3EC6},2` as CfgMgr32 returned
    /// it (type and bytes); absent when the device node does not have it. Documented drivers
    /// store a `DEVPROP_TYPE_UINT64`; anything else is recorded as found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter_luid: Option<RawDeviceProperty>,
    /// Properties of this device node that could not be read, with the API and status; they
    /// become the matched adapter's read errors.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_errors: Vec<String>,
}

impl PnpFacts {
    /// Whether the device node has a problem: `DN_HAS_PROBLEM` in its status flags, or (in
    /// snapshots without status flags) a problem code other than 0. The one test for "has a
    /// problem" that health and the CUDA order share.
    pub fn has_problem(&self) -> bool {
        match self.status_flags {
            Some(flags) => flags & DN_HAS_PROBLEM != 0,
            None => self.problem_code != 0,
        }
    }
}

/// A device property as CfgMgr32 returned it: its `DEVPROPTYPE` and its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawDeviceProperty {
    /// The `DEVPROPTYPE` number (`9` is `DEVPROP_TYPE_UINT64`).
    #[serde(rename = "type")]
    pub kind: u32,
    /// The bytes as hex digit pairs, in the order returned (`"0f3a010000000000"`).
    pub data: String,
}

/// `DEVPROP_TYPE_UINT64` (`devpropdef.h`).
pub const DEVPROP_TYPE_UINT64: u32 = 0x0000_0009;

/// Where a device sits on the PCI bus. Windows reports no PCI domain (segment) through these
/// properties, so there is none here.
#[derive(
    Debug,
    Clone,
    Copy,
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
pub struct PciLocation {
    /// Bus number (`DEVPKEY_Device_BusNumber`).
    pub bus: u32,
    /// Device number: the high 16 bits of `DEVPKEY_Device_Address`.
    pub device: u32,
    /// Function number: the low 16 bits of `DEVPKEY_Device_Address`.
    pub function: u32,
}

impl PciLocation {
    /// The location from `DEVPKEY_Device_BusNumber` and a PCI device's `DEVPKEY_Device_Address`
    /// (`(device << 16) | function`).
    pub fn from_bus_and_address(bus: u32, address: u32) -> Self {
        PciLocation {
            bus,
            device: address >> 16,
            function: address & 0xFFFF,
        }
    }
}

impl std::fmt::Display for PciLocation {
    /// `bus:device.function` in hex, the way `lspci` and `nvidia-smi` show it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:02x}:{:02x}.{:x}",
            self.bus, self.device, self.function
        )
    }
}

/// `DN_HAS_PROBLEM` (`cfg.h`): the device node has a problem; the problem code says which.
pub const DN_HAS_PROBLEM: u32 = 0x0000_0400;

/// One registry key and its values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistryKey {
    /// Full key path starting with `HKLM\`.
    pub key: String,
    /// The key's values, in any order.
    #[serde(default)]
    pub values: Vec<RegistryValue>,
}

/// Registry value types, by their Win32 names.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RegType {
    /// `REG_NONE`.
    REG_NONE,
    /// `REG_SZ`.
    REG_SZ,
    /// `REG_EXPAND_SZ`.
    REG_EXPAND_SZ,
    /// `REG_BINARY`.
    REG_BINARY,
    /// `REG_DWORD`.
    REG_DWORD,
    /// `REG_DWORD_BIG_ENDIAN`.
    REG_DWORD_BIG_ENDIAN,
    /// `REG_LINK`.
    REG_LINK,
    /// `REG_MULTI_SZ`.
    REG_MULTI_SZ,
    /// `REG_RESOURCE_LIST`.
    REG_RESOURCE_LIST,
    /// `REG_FULL_RESOURCE_DESCRIPTOR`.
    REG_FULL_RESOURCE_DESCRIPTOR,
    /// `REG_RESOURCE_REQUIREMENTS_LIST`.
    REG_RESOURCE_REQUIREMENTS_LIST,
    /// `REG_QWORD`.
    REG_QWORD,
}

impl RegType {
    /// The shape of data this type carries in a snapshot.
    pub fn data_shape(self) -> DataShape {
        match self {
            RegType::REG_SZ | RegType::REG_EXPAND_SZ | RegType::REG_LINK => DataShape::String,
            RegType::REG_MULTI_SZ => DataShape::Strings,
            RegType::REG_DWORD | RegType::REG_DWORD_BIG_ENDIAN => {
                DataShape::Integer(u32::MAX.into())
            }
            RegType::REG_QWORD => DataShape::Integer(u64::MAX),
            RegType::REG_NONE
            | RegType::REG_BINARY
            | RegType::REG_RESOURCE_LIST
            | RegType::REG_FULL_RESOURCE_DESCRIPTOR
            | RegType::REG_RESOURCE_REQUIREMENTS_LIST => DataShape::Hex,
        }
    }
}

/// How a registry value's data is written in a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataShape {
    /// One string.
    String,
    /// A list of strings.
    Strings,
    /// An unsigned integer no larger than the bound.
    Integer(u64),
    /// Bytes as a string of hex digit pairs (`"0a1bff"`, empty for no bytes).
    Hex,
}

/// The data of a registry value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RegData {
    /// `REG_DWORD`, `REG_QWORD`.
    Integer(u64),
    /// `REG_SZ`, `REG_EXPAND_SZ`, `REG_LINK`; hex bytes for binary types.
    String(String),
    /// `REG_MULTI_SZ`.
    Strings(Vec<String>),
}

/// One registry value. Its data must have the shape its type calls for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawRegistryValue")]
pub struct RegistryValue {
    /// Value name; empty for the default value.
    pub name: String,
    /// Value type.
    #[serde(rename = "type")]
    pub kind: RegType,
    /// Value data.
    pub data: RegData,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRegistryValue {
    #[serde(default)]
    name: String,
    #[serde(rename = "type")]
    kind: RegType,
    data: RegData,
}

impl TryFrom<RawRegistryValue> for RegistryValue {
    type Error = String;

    fn try_from(raw: RawRegistryValue) -> Result<Self, Self::Error> {
        check_data_shape(raw.kind, &raw.data)
            .map_err(|why| format!("registry value `{}`: {why}", raw.name))?;
        Ok(RegistryValue {
            name: raw.name,
            kind: raw.kind,
            data: raw.data,
        })
    }
}

/// Checks that `data` has the shape `kind` calls for; the error says what was expected.
pub fn check_data_shape(kind: RegType, data: &RegData) -> Result<(), String> {
    let ok = match (kind.data_shape(), data) {
        (DataShape::String, RegData::String(_)) => true,
        (DataShape::Strings, RegData::Strings(_)) => true,
        (DataShape::Integer(max), RegData::Integer(n)) => *n <= max,
        (DataShape::Hex, RegData::String(s)) => {
            s.len() % 2 == 0 && s.bytes().all(|b| b.is_ascii_hexdigit())
        }
        _ => false,
    };
    if ok {
        return Ok(());
    }
    let wanted = match kind.data_shape() {
        DataShape::String => "a string".to_string(),
        DataShape::Strings => "a list of strings".to_string(),
        DataShape::Integer(max) => format!("an integer from 0 to {max}"),
        DataShape::Hex => "a string of hex digit pairs".to_string(),
    };
    Err(format!("type {kind:?} needs {wanted} as data"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_shapes_are_checked_per_type() {
        let s = || RegData::String("a.dll".into());
        let hex = || RegData::String("0aFF".into());
        let list = || RegData::Strings(vec!["a".into()]);
        let int = |n| RegData::Integer(n);
        let table: Vec<(RegType, RegData, bool)> = vec![
            (RegType::REG_SZ, s(), true),
            (RegType::REG_SZ, list(), false),
            (RegType::REG_SZ, int(1), false),
            (RegType::REG_EXPAND_SZ, s(), true),
            (RegType::REG_MULTI_SZ, list(), true),
            (RegType::REG_MULTI_SZ, s(), false),
            (RegType::REG_DWORD, int(u32::MAX.into()), true),
            (RegType::REG_DWORD, int(u64::from(u32::MAX) + 1), false),
            (RegType::REG_QWORD, int(u64::MAX), true),
            (RegType::REG_DWORD, s(), false),
            (RegType::REG_BINARY, hex(), true),
            (RegType::REG_BINARY, RegData::String("abc".into()), false),
            (RegType::REG_BINARY, RegData::String("zz".into()), false),
            (RegType::REG_NONE, RegData::String(String::new()), true),
        ];
        for (kind, data, ok) in table {
            assert_eq!(
                check_data_shape(kind, &data).is_ok(),
                ok,
                "{kind:?} {data:?}"
            );
        }
    }

    #[test]
    fn pci_location_splits_the_address_into_device_and_function() {
        // (bus, address, bus:device.function)
        let table = [
            (0, 0, "00:00.0"),
            (1, 0x0000_0000, "01:00.0"),
            (0x3b, 0x0002_0001, "3b:02.1"),
            (255, 0x001F_0007, "ff:1f.7"),
        ];
        for (bus, address, text) in table {
            assert_eq!(
                PciLocation::from_bus_and_address(bus, address).to_string(),
                text
            );
        }
    }

    #[test]
    fn system_root_defaults_to_c_windows() {
        assert_eq!(OsFacts::default().system_root(), r"C:\Windows");
        let os = OsFacts {
            system_root: Some(r"D:\Win".into()),
            ..OsFacts::default()
        };
        assert_eq!(os.system_root(), r"D:\Win");
    }
}
