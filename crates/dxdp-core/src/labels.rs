//! Node labels: what the node has, as Kubernetes labels, so that pods can be scheduled by GPU
//! model, memory, vendor or runtime API.
//!
//! Pure: the devices and a few settings in, the complete label set out. The daemon applies the
//! set with server-side apply, so a key missing from the set is removed from the Node.

use std::collections::BTreeMap;

use crate::devices::{Device, Discovery, PerResource, Resource};

/// The default label key prefix.
pub const DEFAULT_PREFIX: &str = "directx.microsoft.com/";

/// The label (under the prefix) that selects a named configuration for the node.
pub const CONFIG_SELECTOR: &str = "device-plugin.config";

/// Runtime APIs and the container file names (lower case) that provide them. A label
/// `<prefix>api.<name>: "true"` is set when an advertised device's driver provides one of the
/// files and the file exists.
pub const RUNTIME_APIS: &[(&str, &[&str])] = &[
    ("cuda", &["nvcuda.dll"]),
    ("nvml", &["nvml.dll"]),
    ("nvenc", &["nvencodeapi64.dll", "nvencodeapi.dll"]),
    ("nvdec", &["nvcuvid.dll"]),
    (
        "opencl",
        &[
            "opencl.dll",
            "opencl64.dll",
            "opencl32.dll",
            "nvopencl64.dll",
            "amdocl64.dll",
            "amdocl.dll",
            "igdrcl64.dll",
            "intelocl64.dll",
        ],
    ),
    (
        "vulkan",
        &["vulkan-1.dll", "nv-vk64.json", "amdvlk64.dll", "igvk64.dll"],
    ),
    ("amf", &["amfrt64.dll", "amfrt32.dll"]),
    ("level-zero", &["ze_loader.dll", "ze_intel_gpu64.dll"]),
    (
        "vpl",
        &["intel_gfx_api-x64.dll", "libmfxhw64.dll", "libvpl.dll"],
    ),
];

/// What the labels are made of besides the devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelSettings {
    /// The key prefix, e.g. `directx.microsoft.com/`.
    pub prefix: String,
    /// Which resources are served (devices of a resource that is not served are not counted).
    pub enabled: PerResource<bool>,
    /// Replicas per resource.
    pub replicas: PerResource<u32>,
}

/// The labels for `discovery` under `settings`: every key dxdp owns that has a value now.
pub fn node_labels(discovery: &Discovery, settings: &LabelSettings) -> BTreeMap<String, String> {
    let key = |name: &str| format!("{}{name}", settings.prefix);
    let mut labels = BTreeMap::new();
    let mut advertised: Vec<&Device> = Vec::new();
    for r in Resource::ALL {
        if !settings.enabled.get(r) {
            continue;
        }
        let devices: Vec<&Device> = discovery.devices_for(r).collect();
        labels.insert(
            key(&format!("{}.count", r.as_str())),
            devices.len().to_string(),
        );
        advertised.extend(devices);
    }
    // The largest device: most dedicated memory; on a tie the first seen (display devices
    // before compute devices, each in location-path order).
    let largest = advertised
        .iter()
        .copied()
        .fold(None::<&Device>, |best, d| match best {
            Some(b) if b.dedicated_memory_bytes >= d.dedicated_memory_bytes => Some(b),
            _ => Some(d),
        });
    if let Some(d) = largest {
        for (name, value) in [
            ("vendor", d.vendor.as_str()),
            ("product", d.description.as_str()),
            ("driver-version", d.driver_version.as_str()),
        ] {
            if let Some(v) = label_value(value) {
                labels.insert(key(name), v);
            }
        }
        labels.insert(
            key("memory"),
            (d.dedicated_memory_bytes / (1024 * 1024)).to_string(),
        );
        if let Some(r) = d.resource {
            labels.insert(key("replicas"), settings.replicas.get(r).to_string());
        }
    }
    if advertised.len() > 1 {
        labels.insert(key("multi-gpu-visibility"), "shared".into());
    }
    for (api, files) in RUNTIME_APIS {
        let provided = advertised.iter().any(|d| {
            d.runtime_files.iter().any(|(_, f)| {
                f.exists && files.contains(&f.destination.to_ascii_lowercase().as_str())
            })
        });
        if provided {
            labels.insert(key(&format!("api.{api}")), "true".into());
        }
    }
    labels
}

/// The longest label value Kubernetes accepts.
const MAX_VALUE: usize = 63;

/// `text` as a valid label value: runs of characters other than letters, digits, `-`, `_` and
/// `.` become one `-`, the value starts and ends with a letter or digit and is at most 63
/// characters. `None` when nothing is left.
pub fn label_value(text: &str) -> Option<String> {
    let mut out = String::new();
    let mut pending_dash = false;
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
            if pending_dash && !out.is_empty() {
                out.push('-');
            }
            pending_dash = false;
            out.push(c);
        } else {
            pending_dash = true;
        }
        if out.len() >= MAX_VALUE {
            break;
        }
    }
    out.truncate(MAX_VALUE);
    let trimmed = out
        .trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
        .trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    (!trimmed.is_empty()).then(|| trimmed.to_string())
}

/// Whether `value` is a valid label value (empty, or up to 63 characters of letters, digits,
/// `-`, `_`, `.` that start and end with a letter or digit).
pub fn is_label_value(value: &str) -> bool {
    value.is_empty()
        || (value.len() <= MAX_VALUE
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
            && value.starts_with(|c: char| c.is_ascii_alphanumeric())
            && value.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// Checks a label key prefix: a DNS subdomain (lower-case letters, digits, `-` and `.`, at most
/// 253 characters) followed by `/`, optionally followed by the start of a name
/// (`example.com/gpu-`). Every key dxdp sets must stay a valid label key.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    let allowed =
        "a DNS subdomain followed by '/', e.g. directx.microsoft.com/ or example.com/gpu-";
    let Some((domain, name_start)) = prefix.split_once('/') else {
        return Err(format!("the prefix must contain '/': use {allowed}"));
    };
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if domain.is_empty() || domain.len() > 253 || !domain.split('.').all(label_ok) {
        return Err(format!("{domain:?} is not a DNS subdomain: use {allowed}"));
    }
    let ok_start = name_start.is_empty()
        || (name_start.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name_start
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'));
    // The longest name dxdp puts after the prefix.
    let longest = "multi-gpu-visibility".len();
    if !ok_start || name_start.len() + longest > 63 {
        return Err(format!(
            "{name_start:?} after the '/' must be letters, digits, '-', '_' or '.', start with a letter or digit, and leave room for {longest} more characters: use {allowed}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::Origin;
    use crate::devices::{Health, RuntimeFile, RuntimeFiles};
    use proptest::prelude::*;

    fn device(id: &str, r: Resource, mib: u64, files: &[(&str, bool)]) -> Device {
        Device {
            id: id.into(),
            luid: 0,
            description: format!("Vendor GPU {id} (R) 16GB"),
            vendor: "nvidia".into(),
            vendor_id: 0x10de,
            device_id: 0,
            sub_sys_id: 0,
            revision: 0,
            manufacturer: None,
            location_path: format!("PCIROOT(0)#PCI({id})"),
            pci: None,
            instance_id: String::new(),
            driver_key: None,
            driver_version: "31.0.15.5222".into(),
            driver_store_path: None,
            dedicated_memory_bytes: mib * 1024 * 1024,
            is_integrated: false,
            is_detachable: false,
            supports_display: r == Resource::Display,
            supports_compute: true,
            resource: Some(r),
            health: Health::healthy(),
            runtime_files: RuntimeFiles {
                system32: files
                    .iter()
                    .map(|(name, exists)| RuntimeFile {
                        source: name.to_string(),
                        destination: name.to_string(),
                        origin: Origin::Registry,
                        registry_value: None,
                        host_path: format!(r"C:\store\{name}"),
                        exists: *exists,
                    })
                    .collect(),
                syswow64: Vec::new(),
            },
        }
    }

    fn settings() -> LabelSettings {
        LabelSettings {
            prefix: DEFAULT_PREFIX.into(),
            enabled: PerResource::both(true),
            replicas: PerResource {
                display: 4,
                compute: 1,
            },
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (format!("directx.microsoft.com/{k}"), v.to_string()))
            .collect()
    }

    #[test]
    fn labels_describe_the_largest_device_and_count_each_resource() {
        let discovery = Discovery {
            devices: vec![
                device("0001", Resource::Display, 8192, &[("nvcuda.dll", true)]),
                device(
                    "0002",
                    Resource::Display,
                    24576,
                    &[("nvEncodeAPI64.dll", true), ("OpenCL64.dll", false)],
                ),
                device("0003", Resource::Compute, 4096, &[]),
            ],
            ..Default::default()
        };
        let want = labels(&[
            ("display.count", "2"),
            ("compute.count", "1"),
            ("vendor", "nvidia"),
            ("product", "Vendor-GPU-0002-R-16GB"),
            ("driver-version", "31.0.15.5222"),
            ("memory", "24576"),
            ("replicas", "4"),
            ("multi-gpu-visibility", "shared"),
            ("api.cuda", "true"),
            ("api.nvenc", "true"),
        ]);
        assert_eq!(node_labels(&discovery, &settings()), want);
    }

    #[test]
    fn a_node_without_devices_has_only_counts_and_disabled_resources_have_none() {
        let mut s = settings();
        s.enabled.compute = false;
        let want = labels(&[("display.count", "0")]);
        assert_eq!(node_labels(&Discovery::default(), &s), want);
    }

    #[test]
    fn one_device_has_no_visibility_label_and_a_disabled_resource_is_not_counted() {
        let discovery = Discovery {
            devices: vec![
                device("0001", Resource::Display, 100, &[]),
                device("0002", Resource::Compute, 200, &[("nvcuda.dll", true)]),
            ],
            ..Default::default()
        };
        let mut s = settings();
        s.enabled.compute = false;
        let got = node_labels(&discovery, &s);
        assert_eq!(
            got.get("directx.microsoft.com/memory").map(String::as_str),
            Some("100")
        );
        assert!(!got.contains_key("directx.microsoft.com/multi-gpu-visibility"));
        assert!(!got.contains_key("directx.microsoft.com/compute.count"));
        assert!(!got.contains_key("directx.microsoft.com/api.cuda"));
    }

    #[test]
    fn label_values_are_sanitised() {
        let table = [
            ("NVIDIA GeForce RTX 4090", Some("NVIDIA-GeForce-RTX-4090")),
            (
                "  AMD Radeon(TM) Graphics  ",
                Some("AMD-Radeon-TM-Graphics"),
            ),
            ("Intel(R) Arc(TM) A770", Some("Intel-R-Arc-TM-A770")),
            ("31.0.15.5222", Some("31.0.15.5222")),
            ("___", None),
            ("", None),
            ("(((", None),
            ("Ünïcødé GPU", Some("n-c-d-GPU")),
        ];
        for (input, want) in table {
            assert_eq!(label_value(input).as_deref(), want, "{input:?}");
        }
        let long = "A".repeat(100);
        assert_eq!(label_value(&long), Some("A".repeat(63)));
        let long_dots = format!("{}.{}", "a".repeat(62), "b".repeat(5));
        assert_eq!(label_value(&long_dots), Some("a".repeat(62)));
    }

    #[test]
    fn prefixes() {
        for ok in [
            "directx.microsoft.com/",
            "example.com/gpu-",
            "a/",
            "gpu.example.com/x.",
        ] {
            assert_eq!(check_prefix(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "directx.microsoft.com",
            "/",
            "Example.com/",
            "-a.com/",
            "a..b/",
            "a.com/-x",
            "a.com/x y",
            "a.com/b/",
        ] {
            assert!(check_prefix(bad).is_err(), "{bad}");
        }
        assert!(check_prefix(&format!("a.com/{}", "x".repeat(43))).is_ok());
        assert!(check_prefix(&format!("a.com/{}", "x".repeat(44))).is_err());
    }

    proptest! {
        #[test]
        fn sanitised_values_are_always_valid(text in "\\PC{0,100}") {
            if let Some(v) = label_value(&text) {
                prop_assert!(is_label_value(&v), "{:?} -> {:?}", text, v);
            }
        }

        #[test]
        fn every_key_is_a_valid_label_key_for_any_valid_prefix(
            domain in "[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?(\\.[a-z0-9]{1,5}){0,3}",
            start in "([A-Za-z0-9][A-Za-z0-9._-]{0,20})?",
            mib in 0u64..100_000,
            description in "\\PC{0,80}",
        ) {
            let prefix = format!("{domain}/{start}");
            prop_assume!(check_prefix(&prefix).is_ok());
            let mut d = device("0001", Resource::Display, mib, &[("nvcuda.dll", true)]);
            d.description = description;
            let discovery = Discovery { devices: vec![d.clone(), { d.id = "0002".into(); d }], ..Default::default() };
            let s = LabelSettings { prefix: prefix.clone(), ..settings() };
            for (k, v) in node_labels(&discovery, &s) {
                let name = k.strip_prefix(&format!("{domain}/")).unwrap_or_default();
                prop_assert!(!name.is_empty() && name.len() <= 63 && is_label_value(name), "key {:?}", k);
                prop_assert!(is_label_value(&v), "value {:?}", v);
            }
        }
    }
}
