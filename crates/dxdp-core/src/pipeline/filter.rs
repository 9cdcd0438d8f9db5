//! Device selection by configuration (`devices.include` / `devices.exclude`): by vendor, PCI
//! device ID, location path or description glob. A selector matches when all its fields match.

use serde::{Deserialize, Serialize};

use super::winpath::compare_key;
use crate::devices::Device;

/// One configured selector.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    rename_all = "camelCase",
    deny_unknown_fields,
    try_from = "RawSelector"
)]
pub struct DeviceSelector {
    /// PCI vendor ID (configured as a name such as `nvidia` or an ID such as `0x10DE`).
    pub vendor: Option<u32>,
    /// PCI device ID.
    pub device_id: Option<u32>,
    /// Location path (case-insensitive).
    pub location_path: Option<String>,
    /// Glob over the description (`*` and `?`, case-insensitive).
    pub description: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawSelector {
    vendor: Option<VendorSpec>,
    device_id: Option<u32>,
    location_path: Option<String>,
    description: Option<String>,
}

impl TryFrom<RawSelector> for DeviceSelector {
    type Error = String;

    fn try_from(raw: RawSelector) -> Result<Self, Self::Error> {
        if raw.vendor.is_none()
            && raw.device_id.is_none()
            && raw.location_path.is_none()
            && raw.description.is_none()
        {
            return Err("a device selector needs at least one of vendor, deviceId, locationPath, description".into());
        }
        Ok(DeviceSelector {
            vendor: raw.vendor.map(|v| v.0),
            device_id: raw.device_id,
            location_path: raw.location_path,
            description: raw.description,
        })
    }
}

/// A vendor given by name (`nvidia`, `amd`, `intel`, `microsoft`, `qualcomm`, `pci-XXXX`), by
/// the manufacturer as Windows reports it (the reference plugin's vendor keys, such as
/// `Advanced Micro Devices, Inc.`; see [`MANUFACTURERS`](crate::vendor::MANUFACTURERS)), or by PCI vendor ID (`0x10DE` as a
/// string or integer). Names are case-insensitive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "VendorText")]
pub struct VendorSpec(pub u32);

#[derive(Deserialize)]
#[serde(untagged)]
enum VendorText {
    Id(u32),
    Text(String),
}

impl TryFrom<VendorText> for VendorSpec {
    type Error = String;

    fn try_from(v: VendorText) -> Result<Self, Self::Error> {
        match v {
            VendorText::Id(id) => Ok(VendorSpec(id)),
            VendorText::Text(t) => VendorSpec::parse(&t),
        }
    }
}

impl VendorSpec {
    /// Parses a vendor name, a Windows manufacturer name or a hex PCI vendor ID
    /// ([`crate::vendor::parse`]).
    pub fn parse(text: &str) -> Result<VendorSpec, String> {
        crate::vendor::parse(text).map(VendorSpec).ok_or_else(|| {
            format!("unknown vendor {}: use nvidia, amd, intel, microsoft, qualcomm, a manufacturer as Windows reports it (such as \"Advanced Micro Devices, Inc.\"), pci-XXXX or a PCI vendor ID such as 0x10DE", crate::quote::quote(text))
        })
    }
}

/// Case-insensitive glob with `*` (any run) and `?` (one character).
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.to_lowercase().chars().collect();
    let t: Vec<char> = text.to_lowercase().chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

impl DeviceSelector {
    /// Whether the device matches every given field.
    pub fn matches(&self, device: &Device) -> bool {
        self.vendor.is_none_or(|v| v == device.vendor_id)
            && self.device_id.is_none_or(|id| id == device.device_id)
            && self
                .location_path
                .as_deref()
                .is_none_or(|p| compare_key(p) == compare_key(&device.location_path))
            && self
                .description
                .as_deref()
                .is_none_or(|g| glob_match(g, &device.description))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        let table = [
            ("NVIDIA A*", "NVIDIA A10", true),
            ("nvidia a*", "NVIDIA A100 80GB PCIe", true),
            ("*T4", "NVIDIA Tesla T4", true),
            ("*T4", "NVIDIA Tesla T40", false),
            ("NVIDIA A???", "NVIDIA A10", false),
            ("NVIDIA A?0", "NVIDIA A10", true),
            ("*", "", true),
            ("", "x", false),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
        ];
        for (p, t, ok) in table {
            assert_eq!(glob_match(p, t), ok, "{p} {t}");
        }
    }

    #[test]
    fn vendors() {
        let table = [
            ("nvidia", Some(0x10DE)),
            ("NVIDIA", Some(0x10DE)),
            ("0x1002", Some(0x1002)),
            ("8086", Some(0x8086)),
            ("pci-1af4", Some(0x1AF4)),
            ("acme", None),
        ];
        for (text, id) in table {
            assert_eq!(VendorSpec::parse(text).ok().map(|v| v.0), id, "{text}");
        }
    }

    #[test]
    fn selectors_match_all_given_fields() {
        let facts = crate::sample::sample_host().unwrap();
        let d = crate::pipeline::discover(&facts, &crate::pipeline::PipelineConfig::default());
        let a10 = &d.devices[0];
        let sel =
            |v: Option<u32>, id: Option<u32>, p: Option<&str>, g: Option<&str>| DeviceSelector {
                vendor: v,
                device_id: id,
                location_path: p.map(str::to_string),
                description: g.map(str::to_string),
            };
        assert!(sel(Some(0x10DE), None, None, None).matches(a10));
        assert!(sel(Some(0x10DE), Some(0x2236), None, Some("*A10")).matches(a10));
        assert!(!sel(Some(0x10DE), Some(0x20B5), None, None).matches(a10));
        assert!(sel(None, None, Some("pciroot(0)#pci(0100)#pci(0000)"), None).matches(a10));
        assert!(!sel(Some(0x1002), None, None, None).matches(a10));
    }
}
