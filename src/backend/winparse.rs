//! Byte-level parsing of what the Windows APIs return, kept free of FFI so it is tested on every
//! target from recorded buffers: UTF-16 strings and multi-strings, registry value data, device
//! property buffers (checked against their `DEVPROPTYPE`), device node status, DXCore property
//! reads (supported, unsupported or failed), driver versions and LUIDs, the D3DKMT
//! registry-query struct, the HCS JSON documents (service properties, compute systems, process
//! lists), PDH's answers (which statuses mean an empty counter set, and the sample's time) and
//! the GPU sensor readings (the D3DKMT performance data structs, NVML's answers).

// The Windows backend uses these; elsewhere only the tests and the fuzz crate do (the Windows
// build, `.ci/windows.sh clippy`, checks for dead code here).
#![cfg_attr(not(windows), allow(dead_code))]

use std::collections::BTreeMap;

use dxdp_core::facts::{AdapterProperty, PciLocation, RegData, RegType};
use dxdp_core::telemetry::sensors::{nonzero, AdapterSensors, ClockReading, SensorSource};

/// UTF-16 code units from little-endian bytes (a trailing odd byte is ignored).
pub fn u16s_from_bytes(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// A string up to the first NUL (or the end), with invalid UTF-16 replaced.
pub fn utf16_to_string(units: &[u16]) -> String {
    let end = units.iter().position(|&u| u == 0).unwrap_or(units.len());
    String::from_utf16_lossy(&units[..end])
}

/// A `REG_MULTI_SZ`/`DEVPROP_TYPE_STRING_LIST`: strings separated by NUL, ended by an empty
/// string. Tolerates a missing final terminator; an empty list is `[]`.
pub fn parse_multi_sz(units: &[u16]) -> Vec<String> {
    let mut out = Vec::new();
    for part in units.split(|&u| u == 0) {
        if part.is_empty() {
            break;
        }
        out.push(String::from_utf16_lossy(part));
    }
    out
}

/// Encodes a string as NUL-terminated UTF-16.
pub(crate) fn wide(s: &str) -> Vec<u16> {
    s.encode_utf16().chain(std::iter::once(0)).collect()
}

/// Registry type numbers (`winnt.h`).
pub mod reg_type {
    /// `REG_NONE`.
    pub(crate) const NONE: u32 = 0;
    /// `REG_SZ`.
    pub(crate) const SZ: u32 = 1;
    /// `REG_EXPAND_SZ`.
    pub(crate) const EXPAND_SZ: u32 = 2;
    /// `REG_DWORD`.
    pub(crate) const DWORD: u32 = 4;
    /// `REG_DWORD_BIG_ENDIAN`.
    pub(crate) const DWORD_BIG_ENDIAN: u32 = 5;
    /// `REG_LINK`.
    pub(crate) const LINK: u32 = 6;
    /// `REG_MULTI_SZ`.
    pub const MULTI_SZ: u32 = 7;
    /// `REG_RESOURCE_LIST`.
    pub(crate) const RESOURCE_LIST: u32 = 8;
    /// `REG_FULL_RESOURCE_DESCRIPTOR`.
    pub(crate) const FULL_RESOURCE_DESCRIPTOR: u32 = 9;
    /// `REG_RESOURCE_REQUIREMENTS_LIST`.
    pub(crate) const RESOURCE_REQUIREMENTS_LIST: u32 = 10;
    /// `REG_QWORD`.
    pub(crate) const QWORD: u32 = 11;
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A device property recorded as returned (type and hex bytes), for the adapter LUID property,
/// whose type the pipeline checks ([`dxdp_core::pipeline::matching::node_luid`]).
pub(crate) fn raw_device_property(kind: u32, bytes: &[u8]) -> dxdp_core::facts::RawDeviceProperty {
    dxdp_core::facts::RawDeviceProperty {
        kind,
        data: hex(bytes),
    }
}

/// Turns raw registry value data into the snapshot model, recording every type as it is.
/// Integer types with the wrong length, and unknown type numbers, become `REG_BINARY` hex.
pub fn reg_value(kind: u32, data: &[u8]) -> (RegType, RegData) {
    let text = || utf16_to_string(&u16s_from_bytes(data));
    match kind {
        reg_type::SZ => (RegType::REG_SZ, RegData::String(text())),
        reg_type::EXPAND_SZ => (RegType::REG_EXPAND_SZ, RegData::String(text())),
        reg_type::LINK => (RegType::REG_LINK, RegData::String(text())),
        reg_type::MULTI_SZ => (
            RegType::REG_MULTI_SZ,
            RegData::Strings(parse_multi_sz(&u16s_from_bytes(data))),
        ),
        reg_type::DWORD if data.len() == 4 => (
            RegType::REG_DWORD,
            RegData::Integer(u32::from_le_bytes([data[0], data[1], data[2], data[3]]).into()),
        ),
        reg_type::DWORD_BIG_ENDIAN if data.len() == 4 => (
            RegType::REG_DWORD_BIG_ENDIAN,
            RegData::Integer(u32::from_be_bytes([data[0], data[1], data[2], data[3]]).into()),
        ),
        reg_type::QWORD if data.len() == 8 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(data);
            (RegType::REG_QWORD, RegData::Integer(u64::from_le_bytes(b)))
        }
        reg_type::NONE => (RegType::REG_NONE, RegData::String(hex(data))),
        reg_type::RESOURCE_LIST => (RegType::REG_RESOURCE_LIST, RegData::String(hex(data))),
        reg_type::FULL_RESOURCE_DESCRIPTOR => (
            RegType::REG_FULL_RESOURCE_DESCRIPTOR,
            RegData::String(hex(data)),
        ),
        reg_type::RESOURCE_REQUIREMENTS_LIST => (
            RegType::REG_RESOURCE_REQUIREMENTS_LIST,
            RegData::String(hex(data)),
        ),
        _ => (RegType::REG_BINARY, RegData::String(hex(data))),
    }
}

/// Device property types (`devpropdef.h`) that dxdp reads.
pub(crate) mod devprop_type {
    /// `DEVPROP_TYPE_INT32`.
    pub(crate) const INT32: u32 = 0x0000_0005;
    /// `DEVPROP_TYPE_UINT32`.
    pub(crate) const UINT32: u32 = 0x0000_0007;
    /// `DEVPROP_TYPE_UINT64`.
    pub(crate) const UINT64: u32 = 0x0000_0009;
    /// `DEVPROP_TYPE_STRING`.
    pub(crate) const STRING: u32 = 0x0000_0012;
    /// `DEVPROP_TYPE_STRING_LIST` (`DEVPROP_TYPEMOD_LIST | DEVPROP_TYPE_STRING`).
    pub(crate) const STRING_LIST: u32 = 0x0000_2012;

    /// The `DEVPROP_TYPE_*` name of a type, or its number.
    pub(crate) fn name(kind: u32) -> String {
        match kind {
            0x0000_0000 => "DEVPROP_TYPE_EMPTY".into(),
            0x0000_0001 => "DEVPROP_TYPE_NULL".into(),
            INT32 => "DEVPROP_TYPE_INT32".into(),
            UINT32 => "DEVPROP_TYPE_UINT32".into(),
            0x0000_0008 => "DEVPROP_TYPE_INT64".into(),
            UINT64 => "DEVPROP_TYPE_UINT64".into(),
            0x0000_000D => "DEVPROP_TYPE_GUID".into(),
            0x0000_0011 => "DEVPROP_TYPE_BOOLEAN".into(),
            STRING => "DEVPROP_TYPE_STRING".into(),
            0x0000_0019 => "DEVPROP_TYPE_STRING_INDIRECT".into(),
            0x0000_1003 => "DEVPROP_TYPE_BINARY".into(),
            STRING_LIST => "DEVPROP_TYPE_STRING_LIST".into(),
            other => format!("DEVPROPTYPE 0x{other:08X}"),
        }
    }
}

/// Checks a device property's type and size before it is decoded; the error says what was found.
fn devprop_check(
    kind: u32,
    expected: u32,
    bytes: &[u8],
    size: Option<usize>,
) -> Result<(), String> {
    if kind != expected {
        return Err(format!(
            "has type {}, expected {}",
            devprop_type::name(kind),
            devprop_type::name(expected)
        ));
    }
    match size {
        Some(size) if bytes.len() != size => Err(format!(
            "{} value has {} bytes, expected {size}",
            devprop_type::name(kind),
            bytes.len()
        )),
        _ => Ok(()),
    }
}

/// A `DEVPROP_TYPE_UINT64` property (the adapter LUID).
#[cfg(test)]
pub(crate) fn devprop_u64(kind: u32, bytes: &[u8]) -> Result<u64, String> {
    devprop_check(kind, devprop_type::UINT64, bytes, Some(8))?;
    u64_le(bytes).ok_or_else(|| "UINT64 value is truncated".into())
}

/// A `DEVPROP_TYPE_UINT32` property (bus numbers, addresses).
pub(crate) fn devprop_u32(kind: u32, bytes: &[u8]) -> Result<u32, String> {
    devprop_check(kind, devprop_type::UINT32, bytes, Some(4))?;
    u32_le(bytes).ok_or_else(|| "UINT32 value is truncated".into())
}

/// `DEVPKEY_Device_Address`: `None` for `0xFFFFFFFF`, which means "no address". Microsoft Learn
/// documents the property as `DEVPROP_TYPE_INT32` and `devpkey.h` as `DEVPROP_TYPE_UINT32`:
/// both are accepted (4 bytes either way, read as the same bits).
pub(crate) fn devprop_address(kind: u32, bytes: &[u8]) -> Result<Option<u32>, String> {
    let expected = if kind == devprop_type::INT32 {
        devprop_type::INT32
    } else {
        devprop_type::UINT32
    };
    devprop_check(kind, expected, bytes, Some(4))?;
    let address = u32_le(bytes).ok_or("the address value is truncated")?;
    Ok(Some(address).filter(|a| *a != NO_ADDRESS))
}

/// The `DEVPKEY_Device_Address` value of a device without an address.
pub(crate) const NO_ADDRESS: u32 = 0xFFFF_FFFF;

/// A `DEVPROP_TYPE_STRING` property; `None` when empty.
pub(crate) fn devprop_string(kind: u32, bytes: &[u8]) -> Result<Option<String>, String> {
    devprop_check(kind, devprop_type::STRING, bytes, None)?;
    let s = utf16_to_string(&u16s_from_bytes(bytes));
    Ok(Some(s).filter(|s| !s.is_empty()))
}

/// A `DEVPROP_TYPE_STRING_LIST` property (location paths).
pub(crate) fn devprop_string_list(kind: u32, bytes: &[u8]) -> Result<Vec<String>, String> {
    devprop_check(kind, devprop_type::STRING_LIST, bytes, None)?;
    Ok(parse_multi_sz(&u16s_from_bytes(bytes)))
}

/// The device node status as the snapshot records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DevNodeStatus {
    /// The problem number as returned (meaningful only with `DN_HAS_PROBLEM`).
    pub(crate) problem_code: u32,
    /// The `DN_*` flags, when the call succeeded.
    pub(crate) status_flags: Option<u32>,
    /// Why the call failed.
    pub(crate) status_error: Option<String>,
}

/// What `CM_Get_DevNode_Status` returned: its `CONFIGRET` and out values. A failed call records
/// the error and no flags or problem (whatever the out values hold), so the device is never taken
/// for healthy.
pub(crate) fn devnode_status(configret: u32, flags: u32, problem: u32) -> DevNodeStatus {
    if configret != 0 {
        return DevNodeStatus {
            problem_code: 0,
            status_flags: None,
            status_error: Some(format!(
                "CM_Get_DevNode_Status failed: CONFIGRET {configret}"
            )),
        };
    }
    DevNodeStatus {
        problem_code: problem,
        status_flags: Some(flags),
        status_error: None,
    }
}

/// The outcome of reading one DXCore adapter property.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PropertyRead<T> {
    /// The value.
    Value(T),
    /// `IsPropertySupported` said no; nothing was read.
    Unsupported,
    /// `GetProperty` failed (the API and status code).
    Failed(String),
}

impl<T> PropertyRead<T> {
    /// Records an unsupported property or a failure on the adapter, and gives the value if any.
    pub(crate) fn record(
        self,
        property: AdapterProperty,
        unsupported: &mut Vec<AdapterProperty>,
        errors: &mut Vec<String>,
    ) -> Option<T> {
        match self {
            PropertyRead::Value(v) => Some(v),
            PropertyRead::Unsupported => {
                if !unsupported.contains(&property) {
                    unsupported.push(property);
                }
                None
            }
            PropertyRead::Failed(e) => {
                errors.push(e);
                None
            }
        }
    }
}

/// A DXCore `bool` property (1 byte, as `IsHardware` is) from its recorded bytes.
pub(crate) fn dxcore_bool(bytes: &[u8]) -> Result<bool, String> {
    match bytes {
        [b] => Ok(*b != 0),
        other => Err(format!(
            "a bool property has {} bytes, expected 1",
            other.len()
        )),
    }
}

/// A `u64` from the first 8 little-endian bytes, if there are 8.
pub fn u64_le(bytes: &[u8]) -> Option<u64> {
    let b: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    Some(u64::from_le_bytes(b))
}

/// A `u32` from exactly 4 little-endian bytes (a `DEVPROP_TYPE_UINT32` property buffer).
pub(crate) fn u32_le(bytes: &[u8]) -> Option<u32> {
    let b: [u8; 4] = bytes.try_into().ok()?;
    Some(u32::from_le_bytes(b))
}

/// The PCI location of a device node from its decoded `DEVPKEY_Device_BusNumber`
/// ([`devprop_u32`]) and `DEVPKEY_Device_Address` ([`devprop_address`]; `None` also for "no
/// address"); `None` unless the node is a PCI device (instance ID `PCI\...`, where the address is
/// `(device << 16) | function`) and both are known.
pub(crate) fn pci_location(
    instance_id: &str,
    bus_number: Option<u32>,
    address: Option<u32>,
) -> Option<PciLocation> {
    let is_pci = instance_id
        .get(..4)
        .is_some_and(|p| p.eq_ignore_ascii_case("PCI\\"));
    if !is_pci {
        return None;
    }
    Some(PciLocation::from_bus_and_address(bus_number?, address?))
}

/// DXCore `DriverVersion` (four 16-bit parts, most significant first) as `a.b.c.d`.
pub fn driver_version(raw: u64) -> String {
    format!(
        "{}.{}.{}.{}",
        raw >> 48,
        (raw >> 32) & 0xFFFF,
        (raw >> 16) & 0xFFFF,
        raw & 0xFFFF
    )
}

/// A LUID as the snapshot's signed 64-bit value (`HighPart << 32 | LowPart`).
pub fn luid_to_i64(low: u32, high: i32) -> i64 {
    (i64::from(high) << 32) | i64::from(low)
}

/// The LUID parts of a snapshot value.
pub fn luid_from_i64(luid: i64) -> (u32, i32) {
    ((luid & 0xFFFF_FFFF) as u32, (luid >> 32) as i32)
}

/// `D3DDDI_QUERYREGISTRY_INFO` layout: the union holding the output starts at byte 544.
pub(crate) mod query_registry {
    /// Offset of `QueryType`.
    #[cfg(test)]
    pub(crate) const QUERY_TYPE: usize = 0;
    /// Offset of `OutputValueSize`.
    pub(crate) const OUTPUT_VALUE_SIZE: usize = 536;
    /// Offset of `Status`.
    pub(crate) const STATUS: usize = 540;
    /// Offset of the output union.
    pub(crate) const OUTPUT: usize = 544;
    /// `sizeof(D3DDDI_QUERYREGISTRY_INFO)`.
    pub(crate) const SIZE: usize = 552;
    /// `D3DDDI_QUERYREGISTRY_DRIVERSTOREPATH`.
    pub(crate) const DRIVER_STORE_PATH: u32 = 2;
    /// `D3DDDI_QUERYREGISTRY_STATUS_SUCCESS`.
    pub(crate) const SUCCESS: u32 = 0;
    /// `D3DDDI_QUERYREGISTRY_STATUS_BUFFER_OVERFLOW`.
    pub(crate) const BUFFER_OVERFLOW: u32 = 1;
    /// `D3DDDI_QUERYREGISTRY_STATUS_FAIL`.
    pub(crate) const FAIL: u32 = 2;
}

/// A zeroed `D3DDDI_QUERYREGISTRY_INFO` asking for the driver store path, with `extra` bytes of
/// room for the output string beyond the struct. 8-byte aligned storage.
pub(crate) fn driver_store_query(extra: usize) -> Vec<u64> {
    let bytes = query_registry::SIZE + extra;
    let mut buf = vec![0u64; bytes.div_ceil(8)];
    buf[0] = u64::from(query_registry::DRIVER_STORE_PATH); // QueryType (low half), QueryFlags 0
    buf
}

/// The outcome of a registry query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryRegistry {
    /// The value.
    Value(String),
    /// The buffer was too small: `needed` bytes of output are required.
    Overflow {
        /// Output bytes needed.
        needed: u32,
    },
    /// The driver reported failure.
    Fail,
    /// A status this code does not know.
    Unknown(u32),
}

/// Reads the status and string output of a `D3DDDI_QUERYREGISTRY_INFO` buffer.
pub fn parse_query_registry(bytes: &[u8]) -> QueryRegistry {
    let u32_at = |at: usize| -> Option<u32> {
        let b: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
        Some(u32::from_le_bytes(b))
    };
    let (Some(status), Some(size)) = (
        u32_at(query_registry::STATUS),
        u32_at(query_registry::OUTPUT_VALUE_SIZE),
    ) else {
        return QueryRegistry::Unknown(u32::MAX);
    };
    match status {
        query_registry::SUCCESS => {
            let start = query_registry::OUTPUT;
            let end = start
                .saturating_add(size as usize)
                .min(bytes.len())
                .max(start);
            let text = bytes.get(start..end).unwrap_or_default();
            QueryRegistry::Value(utf16_to_string(&u16s_from_bytes(text)))
        }
        query_registry::BUFFER_OVERFLOW => QueryRegistry::Overflow { needed: size },
        query_registry::FAIL => QueryRegistry::Fail,
        other => QueryRegistry::Unknown(other),
    }
}

/// The query JSON for `HcsGetServiceProperties`.
pub(crate) const HCS_BASIC_QUERY: &str = r#"{"PropertyTypes":["Basic"]}"#;

/// The highest minor version per major from an `HcsGetServiceProperties` `Basic` answer, e.g.
/// `["2.5"]`.
pub fn hcs_schema_versions(json: &str) -> Result<Vec<String>, String> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("HCS answered with invalid JSON: {e}"))?;
    let versions = value
        .get("Properties")
        .and_then(|p| p.as_array())
        .and_then(|props| {
            props
                .iter()
                .find_map(|p| p.get("SupportedSchemaVersions").and_then(|v| v.as_array()))
        })
        .ok_or("HCS answer has no Properties[].SupportedSchemaVersions")?;
    let mut highest: BTreeMap<u64, u64> = BTreeMap::new();
    for v in versions {
        let (Some(major), Some(minor)) = (
            v.get("Major").and_then(|m| m.as_u64()),
            v.get("Minor").and_then(|m| m.as_u64()),
        ) else {
            return Err(format!("HCS schema version without Major/Minor: {v}"));
        };
        let entry = highest.entry(major).or_insert(minor);
        *entry = (*entry).max(minor);
    }
    Ok(highest
        .into_iter()
        .map(|(major, minor)| format!("{major}.{minor}"))
        .collect())
}

/// The `SystemQuery` for `HcsEnumerateComputeSystems`: containers only.
pub(crate) const HCS_CONTAINERS_QUERY: &str = r#"{"Types":["Container"]}"#;

/// The `System_PropertyQuery` for `HcsGetComputeSystemProperties`: the process list.
pub(crate) const HCS_PROCESS_LIST_QUERY: &str = r#"{"PropertyTypes":["ProcessList"]}"#;

/// The IDs of the running containers in an `HcsEnumerateComputeSystems` answer (an array of
/// compute system summaries: `Id`, `SystemType`, `State`, `Owner`, …). Virtual machines, and
/// containers in another state than `Running`, are left out (HCS may ignore the query's filter);
/// a summary without a `State` counts as running, one without an `Id` is skipped (it cannot be
/// queried, and the others still can). `null` is no compute system.
pub(crate) fn hcs_running_containers(json: &str) -> Result<Vec<String>, String> {
    let value: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| format!("HCS listed its compute systems in invalid JSON: {e}"))?;
    let systems = match &value {
        serde_json::Value::Null => return Ok(Vec::new()),
        serde_json::Value::Array(a) => a,
        other => {
            return Err(format!(
                "HCS listed its compute systems as {}, not an array",
                json_kind(other)
            ))
        }
    };
    let mut out = Vec::new();
    for system in systems {
        let text = |k: &str| system.get(k).and_then(|v| v.as_str());
        // A summary without an Id cannot be queried; the others still can.
        let Some(id) = text("Id").filter(|id| !id.is_empty()) else {
            continue;
        };
        if text("SystemType") != Some("Container") {
            continue;
        }
        if text("State").is_some_and(|s| s != "Running") {
            continue;
        }
        out.push(id.to_string());
    }
    Ok(out)
}

/// The process IDs in an `HcsGetComputeSystemProperties` answer to the `ProcessList` query (a
/// `Properties` document whose `ProcessList` holds `ProcessDetails`: `ProcessId`, `ImageName`,
/// …), in the order listed, without duplicates. For a process-isolated container these are host
/// process IDs, as in the GPU counters' `pid_…` instance names.
pub(crate) fn hcs_process_ids(json: &str) -> Result<Vec<u32>, String> {
    let value: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| format!("HCS answered the ProcessList query with invalid JSON: {e}"))?;
    let list = match value.get("ProcessList") {
        Some(serde_json::Value::Array(list)) => list,
        Some(serde_json::Value::Null) => return Ok(Vec::new()),
        Some(other) => {
            return Err(format!(
                "HCS ProcessList is {}, not an array",
                json_kind(other)
            ))
        }
        None => return Err("HCS answer has no ProcessList".into()),
    };
    let mut out = Vec::with_capacity(list.len());
    for p in list {
        let pid = p
            .get("ProcessId")
            .and_then(|v| v.as_u64())
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| format!("HCS process without a valid ProcessId: {p}"))?;
        if !out.contains(&pid) {
            out.push(pid);
        }
    }
    Ok(out)
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// `major.minor.build.UBR`, leaving out what is unknown.
pub fn os_build(
    major: Option<u64>,
    minor: Option<u64>,
    build: Option<&str>,
    ubr: Option<u64>,
) -> Option<String> {
    let build = build.filter(|b| !b.is_empty())?;
    let mut out = format!("{}.{}.{build}", major.unwrap_or(10), minor.unwrap_or(0));
    if let Some(ubr) = ubr {
        out.push_str(&format!(".{ubr}"));
    }
    Some(out)
}

/// PDH status codes (`pdhmsg.h`) that dxdp tells apart.
pub(crate) mod pdh_status {
    /// `PDH_CSTATUS_VALID_DATA`: the value is usable.
    pub(crate) const VALID_DATA: u32 = 0x0000_0000;
    /// `PDH_CSTATUS_NEW_DATA`: the value is usable (and new).
    pub(crate) const NEW_DATA: u32 = 0x0000_0001;
    /// `PDH_CSTATUS_NO_INSTANCE`: the (wildcard) counter has no instance now.
    pub(crate) const NO_INSTANCE: u32 = 0x8000_07D1;
    /// `PDH_MORE_DATA`: the buffer is too small (the size was asked for).
    pub(crate) const MORE_DATA: u32 = 0x8000_07D2;
    /// `PDH_NO_DATA`: no data for the counter or the query (no instance to collect).
    pub(crate) const NO_DATA: u32 = 0x8000_07D5;
    /// `PDH_CSTATUS_NO_OBJECT`: the counter set does not exist on this machine.
    pub(crate) const NO_OBJECT: u32 = 0xC000_0BB8;
    /// `PDH_CSTATUS_NO_COUNTER`: the counter does not exist in its set.
    pub(crate) const NO_COUNTER: u32 = 0xC000_0BB9;
    /// `PDH_CSTATUS_INVALID_DATA`: the counter has no valid value (a wildcard counter whose set
    /// has no instance yet answers this too).
    pub(crate) const INVALID_DATA: u32 = 0xC000_0BBA;
}

/// A PDH call's failure as text: the call, the status in hex and, where the status means the GPU
/// counters do not exist, where they come from.
pub(crate) fn pdh_error(api: &str, code: u32) -> String {
    let hint = match code {
        pdh_status::NO_OBJECT | pdh_status::NO_COUNTER => {
            " (the GPU performance counters do not exist here: they come with Windows 10 1709 / Server 2019 and a WDDM 2.4 or later driver)"
        }
        _ => "",
    };
    format!("PDH {api}: status 0x{code:08X}{hint}")
}

/// What the status of `PdhGetRawCounterArrayW` (asked for the size, with no buffer) means for a
/// wildcard counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PdhArrayStatus {
    /// Items to read (`PDH_MORE_DATA`: read them into a buffer of the size given).
    Items,
    /// No instance: an empty set, not an error. `ERROR_SUCCESS` with no buffer, `PDH_NO_DATA`,
    /// `PDH_CSTATUS_NO_INSTANCE` and `PDH_CSTATUS_INVALID_DATA` all mean this: an idle GPU has
    /// no `GPU Engine` or `GPU Process Memory` instance until a process uses it.
    Empty,
    /// The read failed (the call and status, as text).
    Failed(String),
}

/// Decides what a `PdhGetRawCounterArrayW` status means (see [`PdhArrayStatus`]).
pub(crate) fn pdh_array_status(code: u32) -> PdhArrayStatus {
    match code {
        pdh_status::MORE_DATA => PdhArrayStatus::Items,
        pdh_status::VALID_DATA
        | pdh_status::NO_DATA
        | pdh_status::NO_INSTANCE
        | pdh_status::INVALID_DATA => PdhArrayStatus::Empty,
        other => PdhArrayStatus::Failed(pdh_error("PdhGetRawCounterArrayW", other)),
    }
}

/// What the status of `PdhCollectQueryDataWithTime` means: `Ok` when the counters can be read
/// (`ERROR_SUCCESS`, or `PDH_NO_DATA`: no counter of the query has an instance now, so every set
/// reads empty), else the error.
pub(crate) fn pdh_collect_status(code: u32) -> Result<(), String> {
    match code {
        pdh_status::VALID_DATA | pdh_status::NO_DATA => Ok(()),
        other => Err(pdh_error("PdhCollectQueryDataWithTime", other)),
    }
}

/// One item of a `PdhGetRawCounterArrayW` answer: the instance, the item's `CStatus`, its raw
/// `TimeStamp` (a FILETIME) and `FirstValue`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PdhRawItem {
    /// The instance name.
    pub(crate) instance: String,
    /// `PDH_RAW_COUNTER::CStatus`.
    pub(crate) status: u32,
    /// `PDH_RAW_COUNTER::TimeStamp`, 100 ns units since 1601.
    pub(crate) time_stamp: u64,
    /// `PDH_RAW_COUNTER::FirstValue`.
    pub(crate) value: i64,
}

/// One counter's answer: the status of `PdhGetRawCounterArrayW` and, when it had items, the
/// items (the status of the read of the items is [`pdh_status::VALID_DATA`] or the failure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PdhCounterAnswer {
    /// The status of the first call (asked for the size).
    pub(crate) status: u32,
    /// The status of the second call (the items), when there was one.
    pub(crate) read_status: u32,
    /// The items read.
    pub(crate) items: Vec<PdhRawItem>,
}

impl PdhCounterAnswer {
    /// A counter whose set has instances: `PDH_MORE_DATA`, then the items.
    #[cfg(test)]
    pub(crate) fn items(items: Vec<PdhRawItem>) -> Self {
        PdhCounterAnswer {
            status: pdh_status::MORE_DATA,
            read_status: pdh_status::VALID_DATA,
            items,
        }
    }

    /// A counter that answered `status` when asked for its size (nothing read after it).
    pub(crate) fn status(status: u32) -> Self {
        PdhCounterAnswer {
            status,
            read_status: pdh_status::VALID_DATA,
            items: Vec::new(),
        }
    }
}

/// What one collection of the GPU counters answered: `PdhCollectQueryDataWithTime`'s status and
/// time stamp, and each counter's answer in the order `\GPU Engine(*)\Running Time`, `\GPU
/// Process Memory(*)\Dedicated Usage`, `Shared Usage`, `\GPU Adapter Memory(*)\Dedicated Usage`,
/// `Shared Usage`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PdhAnswer {
    /// The status of `PdhCollectQueryDataWithTime`.
    pub(crate) collect_status: u32,
    /// Its time stamp (a FILETIME; 0 when it gave none).
    pub(crate) collect_time: i64,
    /// The five counters' answers.
    pub(crate) counters: Vec<PdhCounterAnswer>,
}

/// The usable items of one counter: those whose status is `PDH_CSTATUS_VALID_DATA` or
/// `NEW_DATA`; an empty set is empty, a failed read is the error.
pub(crate) fn pdh_counter_values(answer: &PdhCounterAnswer) -> Result<Vec<&PdhRawItem>, String> {
    match pdh_array_status(answer.status) {
        PdhArrayStatus::Empty => return Ok(Vec::new()),
        PdhArrayStatus::Failed(e) => return Err(e),
        PdhArrayStatus::Items => {}
    }
    // The set can empty itself between the two calls.
    match pdh_array_status(answer.read_status) {
        PdhArrayStatus::Empty => {}
        PdhArrayStatus::Items => {
            return Err(pdh_error("PdhGetRawCounterArrayW", answer.read_status));
        }
        PdhArrayStatus::Failed(e) => return Err(e),
    }
    Ok(answer
        .items
        .iter()
        .filter(|i| matches!(i.status, pdh_status::VALID_DATA | pdh_status::NEW_DATA))
        .collect())
}

/// The counter sample of one collection, timed by PDH itself: `PdhCollectQueryDataWithTime`'s
/// time stamp, else the newest time stamp of a valid item, else `previous` (the last sample's
/// time: a sample with no time and no item restarts the utilisation window rather than invent a
/// time), else no sample at all. Never the wall clock around the call, which includes however
/// long the call took. Empty sets are empty; any other failure is the error.
pub(crate) fn pdh_sample(
    answer: &PdhAnswer,
    previous: Option<u64>,
) -> Result<Option<dxdp_core::telemetry::CounterSample>, String> {
    use dxdp_core::telemetry::{CounterSample, EngineCounter};
    pdh_collect_status(answer.collect_status)?;
    if answer.counters.len() != 5 {
        return Err(format!(
            "PDH answered {} counters, expected 5",
            answer.counters.len()
        ));
    }
    let mut sets = Vec::with_capacity(5);
    for counter in &answer.counters {
        sets.push(pdh_counter_values(counter)?);
    }
    let time = u64::try_from(answer.collect_time)
        .ok()
        .filter(|t| *t > 0)
        .or_else(|| {
            sets.iter()
                .flatten()
                .map(|i| i.time_stamp)
                .filter(|t| *t > 0)
                .max()
        })
        .or(previous);
    let Some(time100ns) = time else {
        return Ok(None);
    };
    let positive = |v: i64| u64::try_from(v).unwrap_or(0);
    let values = |set: &[&PdhRawItem]| -> Vec<(String, u64)> {
        set.iter()
            .map(|i| (i.instance.clone(), positive(i.value)))
            .collect()
    };
    let memory = memory_counters;
    Ok(Some(CounterSample {
        time100ns,
        engines: sets[0]
            .iter()
            .map(|i| EngineCounter {
                instance: i.instance.clone(),
                running_time: positive(i.value),
            })
            .collect(),
        process_memory: memory(&values(&sets[1]), &values(&sets[2])),
        adapter_memory: memory(&values(&sets[3]), &values(&sets[4])),
        sensors: Vec::new(),
    }))
}

/// One memory counter per instance from the `Dedicated Usage` and `Shared Usage` values of a
/// counter set (an instance missing from one list has 0 there), in the order instances first
/// appear.
pub(crate) fn memory_counters(
    dedicated: &[(String, u64)],
    shared: &[(String, u64)],
) -> Vec<dxdp_core::telemetry::MemoryCounter> {
    let mut out: Vec<dxdp_core::telemetry::MemoryCounter> = Vec::with_capacity(dedicated.len());
    let mut index = std::collections::HashMap::with_capacity(dedicated.len());
    for (name, v) in dedicated {
        index.entry(name.clone()).or_insert_with(|| {
            out.push(dxdp_core::telemetry::MemoryCounter {
                instance: name.clone(),
                dedicated: 0,
                shared: 0,
            });
            out.len() - 1
        });
        out[index[name]].dedicated = *v;
    }
    for (name, v) in shared {
        let i = *index.entry(name.clone()).or_insert_with(|| {
            out.push(dxdp_core::telemetry::MemoryCounter {
                instance: name.clone(),
                dedicated: 0,
                shared: 0,
            });
            out.len() - 1
        });
        out[i].shared = *v;
    }
    out
}

// ---- GPU sensors: D3DKMT performance data and NVML readings ----

/// Byte layouts of the D3DKMT performance-data structs (d3dkmthk.h, x64: the `ULONGLONG` fields
/// are 8-byte aligned, `D3DKMT_NODEMETADATA` is packed). The Windows build checks them against
/// the `windows` crate's structs.
pub(crate) mod perfdata {
    /// `sizeof(D3DKMT_ADAPTER_PERFDATA)`.
    pub(crate) const ADAPTER_SIZE: usize = 64;
    /// `MemoryFrequency`, hertz (u64).
    pub(crate) const MEMORY_FREQUENCY: usize = 8;
    /// `MaxMemoryFrequency`, hertz (u64).
    pub(crate) const MAX_MEMORY_FREQUENCY: usize = 16;
    /// `FanRPM` (u32).
    pub(crate) const FAN_RPM: usize = 48;
    /// `Power`, tenths of a percent (u32).
    pub(crate) const POWER: usize = 52;
    /// `Temperature`, tenths of a degree Celsius (u32).
    pub(crate) const TEMPERATURE: usize = 56;
    /// `sizeof(D3DKMT_ADAPTER_PERFDATACAPS)`.
    pub(crate) const CAPS_SIZE: usize = 40;
    /// `TemperatureMax`, tenths of a degree Celsius (u32).
    pub(crate) const TEMPERATURE_MAX: usize = 28;
    /// `TemperatureWarning`, tenths of a degree Celsius (u32).
    pub(crate) const TEMPERATURE_WARNING: usize = 32;
    /// `sizeof(D3DKMT_NODE_PERFDATA)`.
    pub(crate) const NODE_SIZE: usize = 56;
    /// `Frequency`, hertz (u64).
    pub(crate) const NODE_FREQUENCY: usize = 8;
    /// `MaxFrequency`, hertz (u64).
    pub(crate) const NODE_MAX_FREQUENCY: usize = 16;
    /// `sizeof(D3DKMT_NODEMETADATA)` (packed).
    pub(crate) const METADATA_SIZE: usize = 78;
    /// `NodeData.EngineType` (`DXGK_ENGINE_TYPE`, u32).
    pub(crate) const ENGINE_TYPE: usize = 4;
    /// `NodeData.FriendlyName` (32 UTF-16 units).
    pub(crate) const FRIENDLY_NAME: usize = 8;
    /// `DXGK_ENGINE_TYPE_OTHER`: compute engines report this, named "Compute".
    pub(crate) const ENGINE_OTHER: u32 = 0;
    /// `DXGK_ENGINE_TYPE_3D`.
    pub(crate) const ENGINE_3D: u32 = 1;
    /// `DXGK_ENGINE_TYPE_VIDEO_DECODE`.
    pub(crate) const ENGINE_VIDEO_DECODE: u32 = 2;
    /// `DXGK_ENGINE_TYPE_VIDEO_ENCODE`.
    pub(crate) const ENGINE_VIDEO_ENCODE: u32 = 3;
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    u32_le(bytes.get(at..at + 4)?)
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    u64_le(bytes.get(at..at + 8)?)
}

/// The clock domain of an engine node from its `D3DKMT_NODEMETADATA` bytes: the 3D engine is
/// `graphics`, video decode and encode are `video`, an engine of type "other" whose friendly name
/// starts with "Compute" (how compute engines present themselves; the PDH `engtype_Compute`
/// comes from that name) is `compute`; copy, overlay and the rest have no domain (`None`).
pub(crate) fn node_clock_domain(metadata: &[u8]) -> Option<&'static str> {
    match u32_at(metadata, perfdata::ENGINE_TYPE)? {
        perfdata::ENGINE_3D => Some("graphics"),
        perfdata::ENGINE_VIDEO_DECODE | perfdata::ENGINE_VIDEO_ENCODE => Some("video"),
        perfdata::ENGINE_OTHER => {
            let name = metadata.get(perfdata::FRIENDLY_NAME..perfdata::FRIENDLY_NAME + 64)?;
            let name = utf16_to_string(&u16s_from_bytes(name));
            name.to_ascii_lowercase()
                .starts_with("compute")
                .then_some("compute")
        }
        _ => None,
    }
}

/// Adds a clock reading unless its current frequency is zero (not reported); of several engine
/// nodes in one domain, the fastest one stands for the domain.
fn add_clock(clocks: &mut Vec<ClockReading>, domain: &str, hertz: u64, max_hertz: u64) {
    if hertz == 0 {
        return;
    }
    let reading = ClockReading {
        domain: domain.to_string(),
        hertz,
        max_hertz: nonzero(max_hertz),
    };
    match clocks.iter_mut().find(|c| c.domain == domain) {
        Some(c) if c.hertz >= hertz => {}
        Some(c) => *c = reading,
        None => clocks.push(reading),
    }
}

/// Whether a reading holds any value (a source that reports nothing for an adapter gives no
/// entry).
fn has_values(s: &AdapterSensors) -> bool {
    s.temperature_decidegrees.is_some()
        || s.temperature_warning_decidegrees.is_some()
        || s.temperature_max_decidegrees.is_some()
        || s.power_permille.is_some()
        || s.power_milliwatts.is_some()
        || s.power_limit_milliwatts.is_some()
        || s.fan_rpm.is_some()
        || !s.clocks.is_empty()
        || !s.throttle_reasons.is_empty()
}

/// One adapter's D3DKMT readings from the bytes the graphics kernel filled:
/// `D3DKMT_ADAPTER_PERFDATA` (`perf`), `D3DKMT_ADAPTER_PERFDATACAPS` (`caps`) and, per engine
/// node with a clock domain ([`node_clock_domain`]), its `D3DKMT_NODE_PERFDATA`. A query that
/// failed is `None`; a short buffer counts as failed. Zero is "not reported". `None` when
/// nothing at all was reported.
pub(crate) fn d3dkmt_sensors(
    luid: i64,
    perf: Option<&[u8]>,
    caps: Option<&[u8]>,
    nodes: &[(&str, &[u8])],
) -> Option<AdapterSensors> {
    let mut s = AdapterSensors::new(luid, SensorSource::D3dkmt);
    if let Some(perf) = perf.filter(|p| p.len() >= perfdata::ADAPTER_SIZE) {
        s.temperature_decidegrees = u32_at(perf, perfdata::TEMPERATURE).and_then(nonzero);
        s.power_permille = u32_at(perf, perfdata::POWER).and_then(nonzero);
        s.fan_rpm = u32_at(perf, perfdata::FAN_RPM).and_then(nonzero);
        add_clock(
            &mut s.clocks,
            "memory",
            u64_at(perf, perfdata::MEMORY_FREQUENCY).unwrap_or(0),
            u64_at(perf, perfdata::MAX_MEMORY_FREQUENCY).unwrap_or(0),
        );
    }
    if let Some(caps) = caps.filter(|c| c.len() >= perfdata::CAPS_SIZE) {
        s.temperature_max_decidegrees = u32_at(caps, perfdata::TEMPERATURE_MAX).and_then(nonzero);
        s.temperature_warning_decidegrees =
            u32_at(caps, perfdata::TEMPERATURE_WARNING).and_then(nonzero);
    }
    for (domain, node) in nodes {
        if node.len() < perfdata::NODE_SIZE {
            continue;
        }
        add_clock(
            &mut s.clocks,
            domain,
            u64_at(node, perfdata::NODE_FREQUENCY).unwrap_or(0),
            u64_at(node, perfdata::NODE_MAX_FREQUENCY).unwrap_or(0),
        );
    }
    s.clocks.sort_by(|a, b| a.domain.cmp(&b.domain));
    has_values(&s).then_some(s)
}

/// `nvmlPciInfo_t` layout: `busIdLegacy[16]`, then `domain`, `bus`, `device`, `pciDeviceId`,
/// `pciSubSystemId` (u32 each), then `busId[32]`.
pub(crate) mod nvml_pci {
    /// `sizeof(nvmlPciInfo_t)`.
    pub(crate) const SIZE: usize = 68;
    /// `domain` (u32).
    pub(crate) const DOMAIN: usize = 16;
    /// `bus` (u32).
    pub(crate) const BUS: usize = 20;
    /// `device` (u32).
    pub(crate) const DEVICE: usize = 24;
    /// `busId`, `domain:bus:device.function` in hexadecimal, NUL-terminated.
    pub(crate) const BUS_ID: usize = 36;
}

/// An NVML device's PCI domain and location from its `nvmlPciInfo_t` bytes. The function number
/// is only in the `busId` text (`00000000:65:00.0`); where that does not parse, the numeric
/// fields give domain, bus and device, with function 0. `None` for a short buffer.
pub(crate) fn nvml_pci_location(info: &[u8]) -> Option<(u32, PciLocation)> {
    if info.len() < nvml_pci::SIZE {
        return None;
    }
    let text = &info[nvml_pci::BUS_ID..nvml_pci::BUS_ID + 32];
    let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
    let parsed = std::str::from_utf8(&text[..end]).ok().and_then(|t| {
        let (domain, rest) = t.split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (device, function) = rest.split_once('.')?;
        let hex = |s: &str| u32::from_str_radix(s, 16).ok();
        Some((
            hex(domain)?,
            PciLocation {
                bus: hex(bus)?,
                device: hex(device)?,
                function: hex(function)?,
            },
        ))
    });
    parsed.or_else(|| {
        Some((
            u32_at(info, nvml_pci::DOMAIN)?,
            PciLocation {
                bus: u32_at(info, nvml_pci::BUS)?,
                device: u32_at(info, nvml_pci::DEVICE)?,
                function: 0,
            },
        ))
    })
}

/// Which adapter (LUID) each NVML device is, by PCI location: `devices` in NVML's index order
/// (`None` where NVML gave no location), `adapters` as the graphics kernel lists them with their
/// `KMTQAITYPE_ADAPTERADDRESS`. A device is matched only when exactly one adapter has its bus,
/// device and function (the adapter address carries no PCI domain), so a doubt never puts one
/// GPU's readings on another.
pub(crate) fn nvml_luids(
    devices: &[Option<PciLocation>],
    adapters: &[(i64, PciLocation)],
) -> Vec<Option<i64>> {
    devices
        .iter()
        .map(|device| {
            let device = device.as_ref()?;
            let mut found = adapters.iter().filter(|(_, at)| at == device);
            match (found.next(), found.next()) {
                (Some((luid, _)), None) => Some(*luid),
                _ => None,
            }
        })
        .collect()
}

/// NVML's clock event (throttle) reason bits (`nvmlClocksEventReason*`) that mean the clocks are
/// held down, with their names. `GpuIdle` (0x1), `ApplicationsClocksSetting` (0x2) and
/// `DisplayClockSetting` (0x100) are settings or idleness, not throttling, and are not named;
/// nor are bits NVML may add later.
pub(crate) const NVML_THROTTLE_REASONS: [(u64, &str); 6] = [
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
];

/// The names of the throttling reasons set in NVML's clock event reason bitmask.
pub(crate) fn nvml_throttle_reasons(bits: u64) -> Vec<String> {
    NVML_THROTTLE_REASONS
        .iter()
        .filter(|(bit, _)| bits & bit != 0)
        .map(|(_, name)| name.to_string())
        .collect()
}

/// What NVML answered for one device, in its own units; `None` where the call failed or is not
/// supported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NvmlReadings {
    /// `nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)`, °C.
    pub(crate) temperature_c: Option<u32>,
    /// `nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)`, °C.
    pub(crate) slowdown_c: Option<u32>,
    /// `nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)`, °C.
    pub(crate) shutdown_c: Option<u32>,
    /// `nvmlDeviceGetPowerUsage`, mW.
    pub(crate) power_mw: Option<u32>,
    /// `nvmlDeviceGetEnforcedPowerLimit`, mW.
    pub(crate) power_limit_mw: Option<u32>,
    /// `nvmlDeviceGetClockInfo` and `nvmlDeviceGetMaxClockInfo` per [`NVML_CLOCKS`] entry, MHz.
    pub(crate) clocks_mhz: [(Option<u32>, Option<u32>); 4],
    /// `nvmlDeviceGetCurrentClocksEventReasons` (or the older `...ThrottleReasons`).
    pub(crate) clock_event_reasons: Option<u64>,
    /// `nvmlDeviceGetFanSpeedRPM` of fan 0.
    pub(crate) fan_rpm: Option<u32>,
}

/// NVML's clock types (`nvmlClockType_t`) in the order of [`NvmlReadings::clocks_mhz`], with
/// their domain.
pub(crate) const NVML_CLOCKS: [(u32, &str); 4] =
    [(0, "graphics"), (1, "sm"), (2, "memory"), (3, "video")];

/// One NVIDIA adapter's readings from what NVML answered: degrees to tenths, MHz to hertz, the
/// reason bits to names. Zero is "not reported". `None` when nothing was reported.
pub(crate) fn nvml_sensors(luid: i64, r: &NvmlReadings) -> Option<AdapterSensors> {
    let deci = |c: Option<u32>| c.and_then(nonzero).map(|c| c.saturating_mul(10));
    let mut s = AdapterSensors::new(luid, SensorSource::Nvml);
    s.temperature_decidegrees = deci(r.temperature_c);
    s.temperature_warning_decidegrees = deci(r.slowdown_c);
    s.temperature_max_decidegrees = deci(r.shutdown_c);
    s.power_milliwatts = r.power_mw.and_then(nonzero).map(u64::from);
    s.power_limit_milliwatts = r.power_limit_mw.and_then(nonzero).map(u64::from);
    s.fan_rpm = r.fan_rpm.and_then(nonzero);
    for ((_, domain), (current, max)) in NVML_CLOCKS.iter().zip(r.clocks_mhz) {
        let hz = |mhz: Option<u32>| u64::from(mhz.unwrap_or(0)) * 1_000_000;
        add_clock(&mut s.clocks, domain, hz(current), hz(max));
    }
    s.clocks.sort_by(|a, b| a.domain.cmp(&b.domain));
    s.throttle_reasons = r
        .clock_event_reasons
        .map(nvml_throttle_reasons)
        .unwrap_or_default();
    has_values(&s).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utf16le(s: &str) -> Vec<u8> {
        s.encode_utf16().flat_map(|u| u.to_le_bytes()).collect()
    }

    #[test]
    fn pci_locations_from_recorded_property_buffers() {
        use devprop_type::{INT32, STRING, UINT32, UINT64};
        let gpu = r"PCI\VEN_10DE&DEV_2236&SUBSYS_148210DE&REV_A1\4&2B7E6F3C&0&0008";
        let loc = |bus, device, function| {
            Some(PciLocation {
                bus,
                device,
                function,
            })
        };
        // What the backend does with the two properties as CM_Get_DevNode_PropertyW returned
        // them (type and bytes, `None` when the node has no such property): a read error is
        // recorded against the node and the location is unknown.
        let locate = |id: &str, bus: Option<(u32, &[u8])>, address: Option<(u32, &[u8])>| {
            let bus = bus.map(|(k, b)| devprop_u32(k, b)).transpose();
            let address = address.map(|(k, b)| devprop_address(k, b)).transpose();
            match (bus, address) {
                (Ok(bus), Ok(address)) => Ok(pci_location(id, bus, address.flatten())),
                (Err(e), _) | (_, Err(e)) => Err(e),
            }
        };
        // (instance ID, bus property, address property, expected)
        type Case<'a> = (
            &'a str,
            Option<(u32, &'a [u8])>,
            Option<(u32, &'a [u8])>,
            Result<Option<PciLocation>, &'a str>,
        );
        let table: [Case; 14] = [
            (
                gpu,
                Some((UINT32, &[0x3b, 0, 0, 0])),
                Some((UINT32, &[0, 0, 0, 0])),
                Ok(loc(0x3b, 0, 0)),
            ),
            (
                gpu,
                Some((UINT32, &[1, 0, 0, 0])),
                Some((UINT32, &[1, 0, 2, 0])),
                Ok(loc(1, 2, 1)),
            ),
            // DEVPROP_TYPE_INT32, as Microsoft Learn documents the address: the same bits.
            (
                gpu,
                Some((UINT32, &[1, 0, 0, 0])),
                Some((INT32, &[1, 0, 2, 0])),
                Ok(loc(1, 2, 1)),
            ),
            (
                gpu,
                Some((UINT32, &[0x65, 0, 0, 0])),
                Some((INT32, &[7, 0, 0x1f, 0])),
                Ok(loc(0x65, 0x1f, 7)),
            ),
            // 0xFFFFFFFF: no address, whichever type says so.
            (
                gpu,
                Some((UINT32, &[1, 0, 0, 0])),
                Some((UINT32, &[0xff, 0xff, 0xff, 0xff])),
                Ok(None),
            ),
            (
                gpu,
                Some((UINT32, &[1, 0, 0, 0])),
                Some((INT32, &[0xff, 0xff, 0xff, 0xff])),
                Ok(None),
            ),
            (
                "pci\\ven_8086",
                Some((UINT32, &[0, 0, 0, 0])),
                Some((UINT32, &[0, 0, 0x1f, 0])),
                Ok(loc(0, 0x1f, 0)),
            ),
            // Not PCI: the address means something else.
            (
                r"ACPI\MSFT0101\0",
                Some((UINT32, &[1, 0, 0, 0])),
                Some((UINT32, &[0, 0, 0, 0])),
                Ok(None),
            ),
            (
                r"ROOT\DISPLAY\0000",
                Some((UINT32, &[0, 0, 0, 0])),
                Some((UINT32, &[0, 0, 0, 0])),
                Ok(None),
            ),
            // Missing properties.
            (gpu, None, Some((UINT32, &[0, 0, 0, 0])), Ok(None)),
            (gpu, Some((UINT32, &[1, 0, 0, 0])), None, Ok(None)),
            // Wrongly sized or typed buffers are errors that say what was found.
            (
                gpu,
                Some((UINT32, &[1, 0, 0])),
                Some((UINT32, &[0, 0, 0, 0])),
                Err("DEVPROP_TYPE_UINT32 value has 3 bytes, expected 4"),
            ),
            (
                gpu,
                Some((UINT32, &[1, 0, 0, 0])),
                Some((INT32, &[0, 0, 0, 0, 0])),
                Err("DEVPROP_TYPE_INT32 value has 5 bytes, expected 4"),
            ),
            (
                gpu,
                Some((UINT32, &[1, 0, 0, 0])),
                Some((UINT64, &[0, 0, 0, 0, 0, 0, 0, 0])),
                Err("has type DEVPROP_TYPE_UINT64, expected DEVPROP_TYPE_UINT32"),
            ),
        ];
        for (id, bus, address, expected) in table {
            assert_eq!(
                locate(id, bus, address),
                expected.map_err(str::to_string),
                "{id} {bus:?} {address:?}"
            );
        }
        assert_eq!(
            devprop_address(STRING, &[0, 0, 0, 0]),
            Err("has type DEVPROP_TYPE_STRING, expected DEVPROP_TYPE_UINT32".into())
        );
        assert_eq!(devprop_address(INT32, &[0, 0, 3, 0]), Ok(Some(0x0003_0000)));
    }

    /// Recorded PDH answers: a FILETIME of 2026-11-25 (local time, as PDH gives it) and the
    /// instance names of one adapter (LUID 0x0000D1A6).
    mod pdh_answers {
        use super::super::{pdh_status as st, PdhAnswer, PdhCounterAnswer, PdhRawItem};

        pub(crate) const T0: i64 = 134_086_400_000_000_000;
        pub(crate) const ENGINE: &str =
            "pid_4242_luid_0x00000000_0x0000D1A6_phys_0_eng_0_engtype_3D";
        pub(crate) const ADAPTER: &str = "luid_0x00000000_0x0000D1A6_phys_0";

        pub(crate) fn item(instance: &str, status: u32, time_stamp: i64, value: i64) -> PdhRawItem {
            PdhRawItem {
                instance: instance.into(),
                status,
                time_stamp: time_stamp as u64,
                value,
            }
        }

        /// An idle node: no process uses the GPU, so `GPU Engine` and `GPU Process Memory` have
        /// no instance (three ways PDH says so), and the adapter's memory counters read.
        pub(crate) fn idle(collect_time: i64) -> PdhAnswer {
            PdhAnswer {
                collect_status: st::VALID_DATA,
                collect_time,
                counters: vec![
                    PdhCounterAnswer::status(st::NO_INSTANCE),
                    PdhCounterAnswer::status(st::NO_DATA),
                    PdhCounterAnswer::status(st::INVALID_DATA),
                    PdhCounterAnswer::items(vec![item(ADAPTER, st::VALID_DATA, T0, 1_048_576)]),
                    PdhCounterAnswer::items(vec![item(ADAPTER, st::NEW_DATA, T0, 65_536)]),
                ],
            }
        }

        /// One process on the 3D engine: `running` (100 ns units) at `time`.
        pub(crate) fn busy(time: i64, running: i64) -> PdhAnswer {
            PdhAnswer {
                collect_status: st::VALID_DATA,
                collect_time: time,
                counters: vec![
                    PdhCounterAnswer::items(vec![item(ENGINE, st::VALID_DATA, time, running)]),
                    PdhCounterAnswer::status(st::VALID_DATA),
                    PdhCounterAnswer::status(st::VALID_DATA),
                    PdhCounterAnswer::status(st::NO_DATA),
                    PdhCounterAnswer::status(st::NO_DATA),
                ],
            }
        }
    }

    #[test]
    fn pdh_empty_sets_are_empty_and_other_statuses_are_errors() {
        use pdh_answers::*;
        use pdh_status as st;
        let sample = pdh_sample(&idle(T0), None)
            .expect("an idle node reads")
            .expect("a sample");
        assert_eq!(sample.time100ns, 134_086_400_000_000_000);
        assert!(sample.engines.is_empty());
        assert!(sample.process_memory.is_empty());
        assert_eq!(
            sample.adapter_memory,
            vec![dxdp_core::telemetry::MemoryCounter {
                instance: "luid_0x00000000_0x0000D1A6_phys_0".into(),
                dedicated: 1_048_576,
                shared: 65_536,
            }]
        );
        // Every counter empty, and the query itself saying PDH_NO_DATA: an empty sample.
        let nothing = PdhAnswer {
            collect_status: st::NO_DATA,
            collect_time: T0,
            counters: vec![PdhCounterAnswer::status(st::NO_DATA); 5],
        };
        let sample = pdh_sample(&nothing, None).unwrap().unwrap();
        assert_eq!(sample.time100ns, 134_086_400_000_000_000);
        assert!(sample.engines.is_empty() && sample.adapter_memory.is_empty());
        // Items PDH marks invalid are left out, the others kept.
        let mut mixed = busy(T0, 5);
        mixed.counters[0].items.push(item(
            "pid_1_luid_0x0_0x1_phys_0_eng_0_engtype_3D",
            st::INVALID_DATA,
            T0,
            9,
        ));
        assert_eq!(
            pdh_sample(&mixed, None).unwrap().unwrap().engines,
            vec![dxdp_core::telemetry::EngineCounter {
                instance: "pid_4242_luid_0x00000000_0x0000D1A6_phys_0_eng_0_engtype_3D".into(),
                running_time: 5,
            }]
        );
        // Real failures stay failures, naming the call and the status.
        let mut gone = idle(T0);
        gone.counters[3] = PdhCounterAnswer::status(st::NO_OBJECT);
        let e = pdh_sample(&gone, None).unwrap_err();
        assert!(
            e.starts_with("PDH PdhGetRawCounterArrayW: status 0xC0000BB8 (the GPU performance counters do not exist here"),
            "{e}"
        );
        let mut handle = idle(T0);
        handle.collect_status = 0xC000_0BBC; // PDH_INVALID_HANDLE
        assert_eq!(
            pdh_sample(&handle, None).unwrap_err(),
            "PDH PdhCollectQueryDataWithTime: status 0xC0000BBC"
        );
        let mut grew = busy(T0, 5);
        grew.counters[0].read_status = st::MORE_DATA;
        assert_eq!(
            pdh_sample(&grew, None).unwrap_err(),
            "PDH PdhGetRawCounterArrayW: status 0x800007D2"
        );
        // The statuses one by one.
        for (code, expected) in [
            (st::MORE_DATA, PdhArrayStatus::Items),
            (st::VALID_DATA, PdhArrayStatus::Empty),
            (st::NO_DATA, PdhArrayStatus::Empty),
            (st::NO_INSTANCE, PdhArrayStatus::Empty),
            (st::INVALID_DATA, PdhArrayStatus::Empty),
            (
                0xC000_0BBD,
                PdhArrayStatus::Failed("PDH PdhGetRawCounterArrayW: status 0xC0000BBD".into()),
            ),
        ] {
            assert_eq!(pdh_array_status(code), expected, "0x{code:08X}");
        }
    }

    #[test]
    fn pdh_samples_are_timed_by_pdh_and_utilisation_follows_that_time() {
        use dxdp_core::telemetry::compute::{compute, push_sample, DeviceRef};
        use pdh_answers::*;
        // PDH's time: the query's time stamp, else the newest item's, else the last sample's
        // (the window restarts), else no sample yet.
        let mut no_query_time = busy(0, 7);
        no_query_time.counters[0].items[0].time_stamp = (T0 + 30) as u64;
        assert_eq!(
            pdh_sample(&no_query_time, None).unwrap().unwrap().time100ns,
            134_086_400_000_000_030
        );
        let mut timeless = idle(0);
        for c in &mut timeless.counters {
            for i in &mut c.items {
                i.time_stamp = 0;
            }
        }
        assert_eq!(
            pdh_sample(&timeless, Some(77)).unwrap().unwrap().time100ns,
            77
        );
        assert_eq!(pdh_sample(&timeless, None).unwrap(), None);

        // Two collections 2 s apart by PDH's clock, the engine busy 0.5 s in between: 25 %,
        // whatever the wall clock did around the calls.
        let mut window = Vec::new();
        let first = pdh_sample(&busy(T0, 10_000_000), None).unwrap().unwrap();
        let second = pdh_sample(&busy(T0 + 20_000_000, 15_000_000), Some(first.time100ns))
            .unwrap()
            .unwrap();
        push_sample(&mut window, first);
        push_sample(&mut window, second);
        let facts = dxdp_core::telemetry::TelemetryFacts {
            samples: window,
            ..Default::default()
        };
        let device = DeviceRef {
            id: "gpu0".into(),
            resource: "directx.microsoft.com/display".into(),
            luid: 0xD1A6,
            model: "m".into(),
            dedicated_total: 0,
        };
        let view = compute(&[device], &facts, &Default::default(), &[]);
        assert_eq!(view.window_seconds, 2.0);
        assert_eq!(
            view.devices[0].engines,
            BTreeMap::from([("3d".to_string(), 0.25)])
        );
    }

    #[test]
    fn multi_strings() {
        let table: [(&str, Vec<&str>); 6] = [
            ("a\0b\0\0", vec!["a", "b"]),
            ("a\0b\0", vec!["a", "b"]),
            ("a\0b", vec!["a", "b"]),
            ("\0", vec![]),
            ("", vec![]),
            (
                "nvcuda_loader64.dll\0nvcuda.dll\0\0garbage\0",
                vec!["nvcuda_loader64.dll", "nvcuda.dll"],
            ),
        ];
        for (raw, expected) in table {
            let units: Vec<u16> = raw.encode_utf16().collect();
            assert_eq!(parse_multi_sz(&units), expected, "{raw:?}");
        }
    }

    #[test]
    fn registry_values_from_recorded_bytes() {
        let mut dword = 7u32.to_le_bytes().to_vec();
        let table: Vec<(u32, Vec<u8>, RegType, RegData)> = vec![
            (
                1,
                utf16le("OpenCL64.dll\0"),
                RegType::REG_SZ,
                RegData::String("OpenCL64.dll".into()),
            ),
            (
                1,
                utf16le("no-terminator"),
                RegType::REG_SZ,
                RegData::String("no-terminator".into()),
            ),
            (
                2,
                utf16le("%SystemRoot%\\x\0"),
                RegType::REG_EXPAND_SZ,
                RegData::String("%SystemRoot%\\x".into()),
            ),
            (
                7,
                utf16le("nvcuda_loader64.dll\0nvcuda.dll\0\0"),
                RegType::REG_MULTI_SZ,
                RegData::Strings(vec!["nvcuda_loader64.dll".into(), "nvcuda.dll".into()]),
            ),
            (7, vec![], RegType::REG_MULTI_SZ, RegData::Strings(vec![])),
            (4, dword.clone(), RegType::REG_DWORD, RegData::Integer(7)),
            (
                5,
                vec![0, 0, 1, 0],
                RegType::REG_DWORD_BIG_ENDIAN,
                RegData::Integer(256),
            ),
            (
                11,
                u64::MAX.to_le_bytes().to_vec(),
                RegType::REG_QWORD,
                RegData::Integer(u64::MAX),
            ),
            (
                3,
                vec![0xde, 0xad],
                RegType::REG_BINARY,
                RegData::String("dead".into()),
            ),
            (0, vec![], RegType::REG_NONE, RegData::String(String::new())),
            (
                4,
                vec![1, 2],
                RegType::REG_BINARY,
                RegData::String("0102".into()),
            ),
            (
                99,
                vec![0xff],
                RegType::REG_BINARY,
                RegData::String("ff".into()),
            ),
            (
                1,
                vec![0x41, 0x00, 0x42],
                RegType::REG_SZ,
                RegData::String("A".into()),
            ),
        ];
        dword.clear();
        for (kind, bytes, want_type, want_data) in table {
            let (t, d) = reg_value(kind, &bytes);
            assert_eq!((t, &d), (want_type, &want_data), "type {kind} {bytes:?}");
            assert!(
                dxdp_core::facts::check_data_shape(t, &d).is_ok(),
                "{t:?} {d:?} must be a valid snapshot value"
            );
        }
    }

    #[test]
    fn device_properties_are_checked_against_their_type() {
        use devprop_type::*;
        let luid = 0x0000_0001_006B_8B86u64.to_le_bytes().to_vec();
        // The adapter LUID: UINT64 of 8 bytes only.
        let table: Vec<(u32, Vec<u8>, Result<u64, &str>)> = vec![
            (UINT64, luid.clone(), Ok(0x0000_0001_006B_8B86)),
            (
                UINT32,
                luid[..4].to_vec(),
                Err("has type DEVPROP_TYPE_UINT32, expected DEVPROP_TYPE_UINT64"),
            ),
            (
                0x0000_1003,
                luid.clone(),
                Err("has type DEVPROP_TYPE_BINARY, expected DEVPROP_TYPE_UINT64"),
            ),
            (
                UINT64,
                luid[..7].to_vec(),
                Err("DEVPROP_TYPE_UINT64 value has 7 bytes, expected 8"),
            ),
            (UINT64, [luid.clone(), vec![0]].concat(), Err("has 9 bytes")),
            (0xBEEF, vec![], Err("DEVPROPTYPE 0x0000BEEF")),
        ];
        for (kind, bytes, want) in table {
            match (devprop_u64(kind, &bytes), want) {
                (Ok(v), Ok(w)) => assert_eq!(v, w),
                (Err(e), Err(w)) => assert!(e.contains(w), "{e} lacks {w}"),
                (got, want) => panic!("{kind:#x} {bytes:?}: got {got:?}, want {want:?}"),
            }
        }
        assert_eq!(devprop_u32(UINT32, &[1, 2, 0, 0]), Ok(0x0201));
        assert!(devprop_u32(UINT64, &[1, 2, 0, 0]).is_err());
        assert!(devprop_u32(UINT32, &[1, 2]).is_err());

        // Location paths: STRING_LIST; a plain STRING is refused, not read as one path.
        let paths = utf16le("PCIROOT(0)#PCI(1B00)\0ACPI(_SB_)#ACPI(PCI0)#ACPI(S1B_)\0\0");
        assert_eq!(
            devprop_string_list(STRING_LIST, &paths).unwrap(),
            ["PCIROOT(0)#PCI(1B00)", "ACPI(_SB_)#ACPI(PCI0)#ACPI(S1B_)"]
        );
        assert_eq!(
            devprop_string_list(STRING_LIST, &[]).unwrap(),
            Vec::<String>::new()
        );
        let err = devprop_string_list(STRING, &utf16le("PCIROOT(0)\0")).unwrap_err();
        assert_eq!(
            err,
            "has type DEVPROP_TYPE_STRING, expected DEVPROP_TYPE_STRING_LIST"
        );

        // Descriptions, manufacturers, driver keys: STRING.
        assert_eq!(
            devprop_string(STRING, &utf16le("NVIDIA Tesla T4\0"))
                .unwrap()
                .as_deref(),
            Some("NVIDIA Tesla T4")
        );
        assert_eq!(devprop_string(STRING, &utf16le("\0")).unwrap(), None);
        assert!(devprop_string(0x19, &utf16le("@oem3.inf,%desc%\0"))
            .unwrap_err()
            .contains("DEVPROP_TYPE_STRING_INDIRECT"));
        assert!(devprop_string(STRING_LIST, &utf16le("a\0\0")).is_err());
    }

    #[test]
    fn device_node_status_from_recorded_calls() {
        // (CONFIGRET, DN_* flags, problem) as CM_Get_DevNode_Status left them.
        let table = [
            // A started GPU: DN_DRIVER_LOADED | DN_STARTED | DN_DISABLEABLE | DN_NT_ENUMERATOR | DN_NT_DRIVER.
            ((0, 0x0180_200A, 0), (0, Some(0x0180_200A), None)),
            // Code 43 with DN_HAS_PROBLEM.
            ((0, 0x0180_2402, 43), (43, Some(0x0180_2402), None)),
            // A problem number without DN_HAS_PROBLEM is recorded as returned; the pipeline ignores it.
            ((0, 0x0180_200A, 28), (28, Some(0x0180_200A), None)),
            // CR_NO_SUCH_DEVNODE: out values are garbage and must not be used.
            (
                (0x0D, 0xFFFF_FFFF, 0),
                (0, None, Some("CM_Get_DevNode_Status failed: CONFIGRET 13")),
            ),
            ((0x01, 0, 7), (0, None, Some("CONFIGRET 1"))),
        ];
        for ((cr, flags, problem), (code, want_flags, error)) in table {
            let s = devnode_status(cr, flags, problem);
            assert_eq!(
                (s.problem_code, s.status_flags),
                (code, want_flags),
                "{cr} {flags:#x}"
            );
            match error {
                Some(e) => assert!(s.status_error.as_deref().unwrap_or("").contains(e), "{s:?}"),
                None => assert_eq!(s.status_error, None),
            }
            // The status as a snapshot records it, through the pipeline's health rule.
            let pnp = dxdp_core::facts::PnpFacts {
                problem_code: s.problem_code,
                status_flags: s.status_flags,
                status_error: s.status_error.clone(),
                ..Default::default()
            };
            let healthy =
                dxdp_core::pipeline::classify::health(&pnp, false, &[], &Default::default())
                    .is_healthy();
            let expected = cr == 0 && flags & 0x400 == 0;
            assert_eq!(healthy, expected, "{cr} {flags:#x} {problem}");
        }
    }

    #[test]
    fn the_recorded_luid_property_decodes_to_the_adapter_luid_only_as_uint64() {
        use dxdp_core::pipeline::matching::node_luid;
        let luid = luid_to_i64(0x0000_D6F3, 1); // LUID 0x00000001:0x0000D6F3
        let node = |kind, bytes: &[u8]| dxdp_core::facts::PnpFacts {
            adapter_luid: Some(raw_device_property(kind, bytes)),
            ..Default::default()
        };
        let le = (luid as u64).to_le_bytes();
        assert_eq!(raw_device_property(9, &le).data, "f3d6000001000000");
        assert_eq!(
            node_luid(&node(devprop_type::UINT64, &le)),
            Ok(4_295_022_323)
        );
        assert!(
            node_luid(&node(0x8, &le)).is_err(),
            "INT64 is not the documented type"
        );
        assert!(node_luid(&node(devprop_type::UINT64, &le[..4])).is_err());
    }

    #[test]
    fn dxcore_reads_record_unsupported_and_failed_properties() {
        use AdapterProperty::*;
        let mut unsupported = Vec::new();
        let mut errors = Vec::new();
        let reads = [
            (IsHardware, PropertyRead::Unsupported),
            (IsIntegrated, PropertyRead::Value(true)),
            (
                IsDetachable,
                PropertyRead::Failed(
                    "IDXCoreAdapter::GetProperty(IsDetachable) failed: HRESULT 0x80070057".into(),
                ),
            ),
            (IsHardware, PropertyRead::Unsupported),
        ];
        let values: Vec<Option<bool>> = reads
            .into_iter()
            .map(|(p, r)| r.record(p, &mut unsupported, &mut errors))
            .collect();
        assert_eq!(values, [None, Some(true), None, None]);
        assert_eq!(unsupported, [IsHardware]);
        assert_eq!(errors.len(), 1);
        assert!(errors[0].contains("IsDetachable"));

        assert_eq!(dxcore_bool(&[1]), Ok(true));
        assert_eq!(dxcore_bool(&[0]), Ok(false));
        assert_eq!(dxcore_bool(&[0xFF]), Ok(true));
        assert!(dxcore_bool(&[]).is_err());
        assert!(dxcore_bool(&[1, 0, 0, 0]).is_err());
    }

    #[test]
    fn invalid_utf16_is_replaced_not_fatal() {
        let units = [0xD800u16, 0x41, 0];
        assert_eq!(utf16_to_string(&units), "\u{FFFD}A");
    }

    #[test]
    fn driver_versions_and_luids() {
        assert_eq!(driver_version(0x001F_0000_000F_0B08), "31.0.15.2824");
        assert_eq!(driver_version(0), "0.0.0.0");
        assert_eq!(luid_to_i64(0x006B_8B86, 0), 7048070);
        assert_eq!(luid_to_i64(0, 1), 1 << 32);
        assert_eq!(luid_to_i64(0xFFFF_FFFF, -1), -1);
        for luid in [0i64, 7048070, -1, i64::MIN, i64::MAX, 1 << 32] {
            let (low, high) = luid_from_i64(luid);
            assert_eq!(luid_to_i64(low, high), luid);
        }
    }

    fn recorded_query(status: u32, size: u32, output: &str) -> Vec<u8> {
        let mut buf = vec![0u8; query_registry::SIZE];
        buf[query_registry::QUERY_TYPE..4].copy_from_slice(&2u32.to_le_bytes());
        buf[query_registry::OUTPUT_VALUE_SIZE..query_registry::OUTPUT_VALUE_SIZE + 4]
            .copy_from_slice(&size.to_le_bytes());
        buf[query_registry::STATUS..query_registry::STATUS + 4]
            .copy_from_slice(&status.to_le_bytes());
        buf.truncate(query_registry::OUTPUT);
        buf.extend(utf16le(output));
        buf.resize(buf.len().max(query_registry::SIZE), 0);
        buf
    }

    #[test]
    fn driver_store_query_buffers() {
        let path = r"\SystemRoot\System32\DriverStore\FileRepository\nv.inf_amd64_1b50ef32b191cff1";
        let bytes = utf16le(path).len() as u32 + 2;
        let table = [
            (
                recorded_query(0, bytes, &format!("{path}\0")),
                QueryRegistry::Value(path.into()),
            ),
            (
                recorded_query(1, 180, ""),
                QueryRegistry::Overflow { needed: 180 },
            ),
            (recorded_query(2, 0, ""), QueryRegistry::Fail),
            (recorded_query(7, 0, ""), QueryRegistry::Unknown(7)),
            // A size larger than the buffer is clamped, never a panic.
            (
                recorded_query(0, 10_000, "abc\0"),
                QueryRegistry::Value("abc".into()),
            ),
            (vec![0u8; 10], QueryRegistry::Unknown(u32::MAX)),
        ];
        for (buf, expected) in table {
            assert_eq!(parse_query_registry(&buf), expected);
        }
        let q = driver_store_query(100);
        assert!(q.len() * 8 >= query_registry::SIZE + 100);
        assert_eq!(q[0] as u32, query_registry::DRIVER_STORE_PATH);
    }

    #[test]
    fn hcs_answers() {
        let ws2022 = r#"{"Properties":[{"SupportedSchemaVersions":[{"Major":2,"Minor":1},{"Major":2,"Minor":5},{"Major":1,"Minor":0},{"Major":2,"Minor":3}]}]}"#;
        assert_eq!(hcs_schema_versions(ws2022).unwrap(), ["1.0", "2.5"]);
        assert_eq!(
            hcs_schema_versions(r#"{"Properties":[{"SupportedSchemaVersions":[]}]}"#).unwrap(),
            Vec::<String>::new()
        );
        for bad in [
            "",
            "{",
            "[]",
            r#"{"Properties":[]}"#,
            r#"{"Properties":[{"SupportedSchemaVersions":[{"Major":"2"}]}]}"#,
        ] {
            assert!(hcs_schema_versions(bad).is_err(), "{bad}");
        }
    }

    /// `HcsEnumerateComputeSystems` on a Windows Server 2022 node with containerd: two
    /// process-isolated containers of pods, a pod's sandbox, a Hyper-V isolated pod's utility VM
    /// and a stopped container. Written from the published `Properties` schema (the fields of a
    /// compute system summary).
    const HCS_ENUMERATION: &str = r#"[
      {"Id":"5e0055c814a6005b8e57ac59f9a522066e0af12b48b3c26a9416e23907e24a4d","SystemType":"Container","Name":"5e0055c814a6005b8e57ac59f9a522066e0af12b48b3c26a9416e23907e24a4d","Owner":"containerd-shim-runhcs-v1.exe","RuntimeId":"00000000-0000-0000-0000-000000000000","RuntimeOsType":"Windows","State":"Running"},
      {"Id":"9b1c2a6f0e4d4f4e8a7b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f","SystemType":"Container","Owner":"containerd-shim-runhcs-v1.exe","State":"Running","IsDummy":false},
      {"Id":"0c7e5b8a2f1d4c3b9a8e7f6d5c4b3a2918f7e6d5c4b3a29180f7e6d5c4b3a291","SystemType":"Container","Owner":"containerd-shim-runhcs-v1.exe","State":"Running"},
      {"Id":"4f3e2d1c-vm@vm","SystemType":"VirtualMachine","Owner":"containerd-shim-runhcs-v1.exe","RuntimeId":"1d6f2c3e-8a9b-4c5d-9e0f-1a2b3c4d5e6f","State":"Running"},
      {"Id":"7a6b5c4d3e2f1a0b","SystemType":"Container","Owner":"docker","State":"Stopped"}
    ]"#;

    /// `HcsGetComputeSystemProperties({"PropertyTypes":["ProcessList"]})` for the first
    /// container: its entry point and a worker (written from the `ProcessDetails` schema).
    const HCS_PROCESS_LIST: &str = r#"{
      "Id":"5e0055c814a6005b8e57ac59f9a522066e0af12b48b3c26a9416e23907e24a4d",
      "SystemType":"Container",
      "ProcessList":[
        {"ProcessId":4100,"ImageName":"python.exe","CreateTimestamp":"2024-05-02T10:00:01.1234567Z","UserTime100ns":81250000,"KernelTime100ns":3125000,"MemoryCommitBytes":2147483648,"MemoryWorkingSetPrivateBytes":1073741824,"MemoryWorkingSetSharedBytes":52428800},
        {"ProcessId":4101,"ImageName":"worker.exe","CreateTimestamp":"2024-05-02T10:00:02.5Z","UserTime100ns":0,"KernelTime100ns":0,"MemoryCommitBytes":0,"MemoryWorkingSetPrivateBytes":0,"MemoryWorkingSetSharedBytes":0},
        {"ProcessId":4100,"ImageName":"python.exe"}
      ]
    }"#;

    #[test]
    fn hcs_lists_the_running_containers_only() {
        assert_eq!(
            hcs_running_containers(HCS_ENUMERATION).unwrap(),
            [
                "5e0055c814a6005b8e57ac59f9a522066e0af12b48b3c26a9416e23907e24a4d",
                "9b1c2a6f0e4d4f4e8a7b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f",
                "0c7e5b8a2f1d4c3b9a8e7f6d5c4b3a2918f7e6d5c4b3a29180f7e6d5c4b3a291",
            ]
        );
        assert!(hcs_running_containers("[]").unwrap().is_empty());
        assert!(hcs_running_containers("null").unwrap().is_empty());
        // A summary without an Id is skipped; the others are listed.
        assert_eq!(
            hcs_running_containers(
                r#"[{"SystemType":"Container"},{"Id":"","SystemType":"Container"},{"Id":"a1","SystemType":"Container","State":"Running"}]"#
            )
            .unwrap(),
            ["a1"]
        );
        for (bad, part) in [("", "invalid JSON"), ("{}", "an object, not an array")] {
            let err = hcs_running_containers(bad).unwrap_err();
            assert!(err.contains(part), "{bad}: {err}");
        }
    }

    #[test]
    fn hcs_process_lists_give_host_process_ids() {
        assert_eq!(hcs_process_ids(HCS_PROCESS_LIST).unwrap(), [4100, 4101]);
        assert!(hcs_process_ids(r#"{"Id":"x","ProcessList":[]}"#)
            .unwrap()
            .is_empty());
        assert!(hcs_process_ids(r#"{"Id":"x","ProcessList":null}"#)
            .unwrap()
            .is_empty());
        for (bad, part) in [
            ("[", "invalid JSON"),
            (r#"{"Id":"x","SystemType":"Container"}"#, "no ProcessList"),
            (r#"{"ProcessList":{}}"#, "an object, not an array"),
            (
                r#"{"ProcessList":[{"ImageName":"a.exe"}]}"#,
                "without a valid ProcessId",
            ),
            (
                r#"{"ProcessList":[{"ProcessId":-1}]}"#,
                "without a valid ProcessId",
            ),
            (
                r#"{"ProcessList":[{"ProcessId":4294967296}]}"#,
                "without a valid ProcessId",
            ),
        ] {
            let err = hcs_process_ids(bad).unwrap_err();
            assert!(err.contains(part), "{bad}: {err}");
        }
    }

    #[test]
    fn os_builds() {
        assert_eq!(
            os_build(Some(10), Some(0), Some("20348"), Some(1547)).as_deref(),
            Some("10.0.20348.1547")
        );
        assert_eq!(
            os_build(None, None, Some("17763"), None).as_deref(),
            Some("10.0.17763")
        );
        assert_eq!(os_build(Some(10), Some(0), None, Some(1)), None);
    }

    #[test]
    fn wide_strings_round_trip() {
        assert_eq!(utf16_to_string(&wide("Ünïcødé 日本")), "Ünïcødé 日本");
        assert_eq!(wide("").len(), 1);
    }

    /// `D3DKMT_ADAPTER_PERFDATA` as a driver filled it: memory at 7 GHz of 8 GHz, 1450 RPM,
    /// 65.3 % power, 65.5 °C.
    const ADAPTER_PERFDATA: [u8; 64] = [
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x86, 0x3B, 0xA1, 0x01, 0x00, 0x00,
        0x00, 0x00, 0x50, 0xD6, 0xDC, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x78, 0x56, 0x34, 0x12, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00,
        0x00, 0x00, 0x00, 0xAA, 0x05, 0x00, 0x00, 0x8D, 0x02, 0x00, 0x00, 0x8F, 0x02, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];
    /// `D3DKMT_ADAPTER_PERFDATACAPS`: fan up to 3000 RPM, maximum 100.0 °C, warning 87.0 °C.
    const ADAPTER_PERFDATACAPS: [u8; 40] = [
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xB8, 0x0B, 0x00, 0x00, 0xE8, 0x03,
        0x00, 0x00, 0x66, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    /// `D3DKMT_NODE_PERFDATA` of node 2: 1755 MHz of 2100 MHz, 850 of 1050 mV.
    const NODE_PERFDATA: [u8; 56] = [
        0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xC0, 0x2C, 0x9B, 0x68, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x75, 0x2B, 0x7D, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x52, 0x03, 0x00, 0x00, 0x1A, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    /// `D3DKMT_NODEMETADATA` of a 3D engine named "3D" (GPU MMU supported).
    const NODE_METADATA_3D: [u8; 78] = [
        0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x33, 0x00, 0x44, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x01, 0x00,
    ];

    /// A `D3DKMT_NODEMETADATA` of engine type `engine` named `name`.
    fn node_metadata(engine: u32, name: &str) -> Vec<u8> {
        let mut m = vec![0u8; 78];
        m[4..8].copy_from_slice(&engine.to_le_bytes());
        let name = utf16le(name);
        m[8..8 + name.len()].copy_from_slice(&name);
        m
    }

    #[test]
    fn engine_nodes_map_to_clock_domains() {
        assert_eq!(node_clock_domain(&NODE_METADATA_3D), Some("graphics"));
        assert_eq!(
            node_clock_domain(&node_metadata(0, "Compute_0")),
            Some("compute")
        );
        assert_eq!(
            node_clock_domain(&node_metadata(0, "compute")),
            Some("compute")
        );
        assert_eq!(
            node_clock_domain(&node_metadata(2, "VideoDecode")),
            Some("video")
        );
        assert_eq!(
            node_clock_domain(&node_metadata(3, "VideoEncode")),
            Some("video")
        );
        // Copy, video processing, an "other" engine that is not compute: no domain.
        assert_eq!(node_clock_domain(&node_metadata(6, "Copy")), None);
        assert_eq!(
            node_clock_domain(&node_metadata(4, "VideoProcessing")),
            None
        );
        assert_eq!(node_clock_domain(&node_metadata(0, "Security")), None);
        // A short buffer is no answer, not a panic.
        assert_eq!(node_clock_domain(&NODE_METADATA_3D[..6]), None);
        assert_eq!(node_clock_domain(&node_metadata(0, "Compute")[..20]), None);
    }

    #[test]
    fn d3dkmt_perf_data_becomes_sensor_readings() {
        let s = d3dkmt_sensors(
            53670,
            Some(&ADAPTER_PERFDATA),
            Some(&ADAPTER_PERFDATACAPS),
            &[("graphics", &NODE_PERFDATA)],
        )
        .unwrap();
        let mut want = AdapterSensors::new(53670, SensorSource::D3dkmt);
        want.temperature_decidegrees = Some(655);
        want.temperature_warning_decidegrees = Some(870);
        want.temperature_max_decidegrees = Some(1000);
        want.power_permille = Some(653);
        want.fan_rpm = Some(1450);
        want.clocks = vec![
            ClockReading {
                domain: "graphics".into(),
                hertz: 1_755_000_000,
                max_hertz: Some(2_100_000_000),
            },
            ClockReading {
                domain: "memory".into(),
                hertz: 7_000_000_000,
                max_hertz: Some(8_000_000_000),
            },
        ];
        assert_eq!(s, want);
    }

    #[test]
    fn d3dkmt_fields_left_at_zero_are_not_readings() {
        // A driver that fills nothing (zeros everywhere) reports nothing: no entry at all.
        assert_eq!(
            d3dkmt_sensors(
                1,
                Some(&[0u8; 64]),
                Some(&[0u8; 40]),
                &[("graphics", &[0u8; 56])]
            ),
            None
        );
        // Failed queries and short buffers: nothing either.
        assert_eq!(d3dkmt_sensors(1, None, None, &[]), None);
        assert_eq!(
            d3dkmt_sensors(
                1,
                Some(&ADAPTER_PERFDATA[..60]),
                Some(&ADAPTER_PERFDATACAPS[..36]),
                &[("graphics", &NODE_PERFDATA[..50])]
            ),
            None
        );
        // Only the caps answered: the thresholds alone.
        let mut want = AdapterSensors::new(1, SensorSource::D3dkmt);
        want.temperature_warning_decidegrees = Some(870);
        want.temperature_max_decidegrees = Some(1000);
        assert_eq!(
            d3dkmt_sensors(1, None, Some(&ADAPTER_PERFDATACAPS), &[]),
            Some(want)
        );
        // A node whose maximum is 0 has a current frequency only; a node at 0 Hz none.
        let mut node = NODE_PERFDATA;
        node[16..24].fill(0);
        let s =
            d3dkmt_sensors(1, None, None, &[("compute", &node), ("video", &[0u8; 56])]).unwrap();
        assert_eq!(
            s.clocks,
            vec![ClockReading {
                domain: "compute".into(),
                hertz: 1_755_000_000,
                max_hertz: None
            }]
        );
    }

    #[test]
    fn of_several_nodes_in_a_domain_the_fastest_stands_for_it() {
        let mut slow = NODE_PERFDATA;
        // 300 MHz (0x11E1A300), maximum 3000 MHz (0xB2D05E00).
        slow[8..16].copy_from_slice(&[0x00, 0xA3, 0xE1, 0x11, 0, 0, 0, 0]);
        slow[16..24].copy_from_slice(&[0x00, 0x5E, 0xD0, 0xB2, 0, 0, 0, 0]);
        let s = d3dkmt_sensors(
            1,
            None,
            None,
            &[("video", &slow), ("video", &NODE_PERFDATA)],
        )
        .unwrap();
        assert_eq!(
            s.clocks,
            vec![ClockReading {
                domain: "video".into(),
                hertz: 1_755_000_000,
                max_hertz: Some(2_100_000_000)
            }]
        );
        let s = d3dkmt_sensors(
            1,
            None,
            None,
            &[("video", &NODE_PERFDATA), ("video", &slow)],
        )
        .unwrap();
        assert_eq!(s.clocks[0].hertz, 1_755_000_000);
    }

    /// `nvmlPciInfo_t` of a GPU at 0000:65:00.1 (busIdLegacy says .0: only busId is trusted).
    const NVML_PCI_INFO: [u8; 68] = [
        0x30, 0x30, 0x30, 0x30, 0x3A, 0x36, 0x35, 0x3A, 0x30, 0x30, 0x2E, 0x30, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x65, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xDE, 0x10,
        0xB5, 0x20, 0xDE, 0x10, 0x1F, 0x15, 0x30, 0x30, 0x30, 0x30, 0x30, 0x30, 0x30, 0x30, 0x3A,
        0x36, 0x35, 0x3A, 0x30, 0x30, 0x2E, 0x31, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn nvml_pci_info_gives_the_location_with_its_function() {
        let loc = |bus, device, function| PciLocation {
            bus,
            device,
            function,
        };
        assert_eq!(
            nvml_pci_location(&NVML_PCI_INFO),
            Some((0, loc(0x65, 0, 1)))
        );
        // A busId that does not parse: the numeric fields, function 0.
        let mut info = NVML_PCI_INFO;
        info[36..52].copy_from_slice(b"not a bus id....");
        assert_eq!(nvml_pci_location(&info), Some((0, loc(0x65, 0, 0))));
        // Domain 1, bus 0xC1, device 0x1F, function 7.
        let mut info = NVML_PCI_INFO;
        info[36..68].copy_from_slice(b"00000001:C1:1F.7\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0");
        assert_eq!(nvml_pci_location(&info), Some((1, loc(0xC1, 0x1F, 7))));
        // No NUL before the buffer's end, and a function that does not fit: the numeric fields.
        info[36..68].copy_from_slice(b"00000001:C1:1F.70000000000000000");
        assert_eq!(nvml_pci_location(&info), Some((0, loc(0x65, 0, 0))));
        assert_eq!(nvml_pci_location(&NVML_PCI_INFO[..67]), None);
    }

    #[test]
    fn nvml_clock_event_bits_name_the_throttling_only() {
        assert_eq!(nvml_throttle_reasons(0), Vec::<String>::new());
        // Idle, applications clocks setting, display clock setting: not throttling.
        assert_eq!(
            nvml_throttle_reasons(0x1 | 0x2 | 0x100),
            Vec::<String>::new()
        );
        assert_eq!(nvml_throttle_reasons(0x4), vec!["sw_power_cap"]);
        assert_eq!(
            nvml_throttle_reasons(0x1 | 0x8 | 0x20 | 0x40 | 0x80),
            vec![
                "hw_slowdown",
                "sw_thermal_slowdown",
                "hw_thermal_slowdown",
                "hw_power_brake_slowdown"
            ]
        );
        assert_eq!(nvml_throttle_reasons(0x10), vec!["sync_boost"]);
        // A bit NVML may add later is not named.
        assert_eq!(nvml_throttle_reasons(0x200 | 0x4), vec!["sw_power_cap"]);
    }

    #[test]
    fn nvml_answers_become_sensor_readings() {
        let r = NvmlReadings {
            temperature_c: Some(71),
            slowdown_c: Some(90),
            shutdown_c: Some(95),
            power_mw: Some(212_345),
            power_limit_mw: Some(300_000),
            clocks_mhz: [
                (Some(1695), Some(2100)),
                (Some(1695), None),
                (Some(9501), Some(9751)),
                (Some(0), Some(1950)),
            ],
            clock_event_reasons: Some(0x1 | 0x4),
            fan_rpm: Some(1830),
        };
        let mut want = AdapterSensors::new(-7, SensorSource::Nvml);
        want.temperature_decidegrees = Some(710);
        want.temperature_warning_decidegrees = Some(900);
        want.temperature_max_decidegrees = Some(950);
        want.power_milliwatts = Some(212_345);
        want.power_limit_milliwatts = Some(300_000);
        want.fan_rpm = Some(1830);
        want.clocks = vec![
            ClockReading {
                domain: "graphics".into(),
                hertz: 1_695_000_000,
                max_hertz: Some(2_100_000_000),
            },
            ClockReading {
                domain: "memory".into(),
                hertz: 9_501_000_000,
                max_hertz: Some(9_751_000_000),
            },
            ClockReading {
                domain: "sm".into(),
                hertz: 1_695_000_000,
                max_hertz: None,
            },
        ];
        want.throttle_reasons = vec!["sw_power_cap".into()];
        assert_eq!(nvml_sensors(-7, &r), Some(want));
        // Every call failed, or answered 0: no entry.
        assert_eq!(nvml_sensors(1, &NvmlReadings::default()), None);
        let zeros = NvmlReadings {
            temperature_c: Some(0),
            power_mw: Some(0),
            clocks_mhz: [(Some(0), Some(0)); 4],
            clock_event_reasons: Some(0x1),
            ..NvmlReadings::default()
        };
        assert_eq!(nvml_sensors(1, &zeros), None);
    }

    #[test]
    fn nvml_devices_are_matched_to_adapters_by_pci_location_only_when_unambiguous() {
        let loc = |bus, device, function| PciLocation {
            bus,
            device,
            function,
        };
        let adapters = [
            (0x1_0000_d1a6_i64, loc(0x65, 0, 0)),
            (0xd2b0, loc(0x17, 0, 0)),
            // Two adapters at 0xB3:00.0 (different PCI domains): neither is matched.
            (0xe001, loc(0xB3, 0, 0)),
            (0xe002, loc(0xB3, 0, 0)),
        ];
        assert_eq!(
            nvml_luids(
                &[
                    Some(loc(0x17, 0, 0)),
                    None,
                    Some(loc(0x65, 0, 0)),
                    Some(loc(0x65, 0, 1)),
                    Some(loc(0xB3, 0, 0)),
                ],
                &adapters
            ),
            vec![Some(0xd2b0), None, Some(0x1_0000_d1a6), None, None]
        );
        assert_eq!(nvml_luids(&[], &adapters), Vec::<Option<i64>>::new());
    }
}
