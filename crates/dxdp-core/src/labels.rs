//! Node labels: what the node has, as Kubernetes labels, so that pods can be scheduled by GPU
//! model, memory, vendor or runtime API.
//!
//! Pure: the devices and a few settings in, the complete label set out. The daemon applies the
//! set with server-side apply (or writes it into a NodeFeature object for Node Feature
//! Discovery), so a key missing from the set is removed from the Node.
//!
//! Two groups: [`node_labels`], the original set (counts, and vendor, product, memory, driver
//! version and replicas of the largest device), and [`model_labels`], the GPU Feature
//! Discovery-style set: per GPU class (`<class>.product` with a `-SHARED` suffix when shared,
//! `<class>.family`, `<class>.memory`, `<class>.sharing-strategy`, ...), per model on a node with
//! several models (`<class>.<vendor>-<device>.<name>`, e.g. `display.10de-2236.count`), and the
//! machine type. [`all_labels`] is both. The timestamp label ([`TIMESTAMP`]) is the daemon's: it
//! is set when the rest of the set changes.

use std::collections::BTreeMap;

use crate::devices::{Device, Discovery, PerResource, Resource};
use crate::families::{self, ModelId};
use crate::sharing::{Sharing, Strategy};
use crate::validation::parse_feature_level;

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
    /// Replicas per resource (the `replicas` label).
    pub replicas: PerResource<u32>,
    /// How each resource's GPUs are shared (the `sharing-strategy` labels and the `-SHARED`
    /// product suffix).
    pub sharing: PerResource<Sharing>,
    /// The user's families (`nodeLabels.families`), consulted before the built-in table.
    pub families: BTreeMap<ModelId, String>,
    /// The machine type: the Node's `node.kubernetes.io/instance-type` label, when it has one.
    pub machine: Option<String>,
}

/// The label (under the prefix) with the time, in Unix seconds, at which the rest of the set last
/// changed (GPU Feature Discovery's `gfd.timestamp`). The daemon sets it, not [`all_labels`].
pub const TIMESTAMP: &str = "timestamp";

/// The name (after `<class>.` or `<class>.<vendor>-<device>.`) of the D3D12 feature level labels.
pub const FEATURE_LEVEL: &str = "d3d12-feature-level";

/// The suffix of the product labels of a shared GPU class, as GPU Feature Discovery writes it.
pub const SHARED_SUFFIX: &str = "-SHARED";

/// The Node label that names the machine type.
pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";

/// [`node_labels`] and [`model_labels`] together: the set the daemon keeps (besides the
/// timestamp).
pub fn all_labels(discovery: &Discovery, settings: &LabelSettings) -> BTreeMap<String, String> {
    let mut labels = node_labels(discovery, settings);
    labels.extend(model_labels(discovery, settings));
    labels
}

/// The WDDM version a display driver implements, from its version number: Windows display
/// drivers number themselves `<WDDM major><WDDM minor>.x.y.z` from WDDM 2.0 on (`31.0.15.2824`
/// is a WDDM 3.1 driver; "Version numbers for display drivers",
/// <https://learn.microsoft.com/en-us/windows-hardware/drivers/display/version-numbers-for-display-drivers>).
/// `None` for other numbers (older or non-display drivers: the label is then absent).
pub fn wddm_version(driver_version: &str) -> Option<String> {
    let first = driver_version.split('.').next()?;
    let n: u32 = first.parse().ok()?;
    (first.len() == 2 && (20..=39).contains(&n)).then(|| format!("{}.{}", n / 10, n % 10))
}

/// The GPU Feature Discovery-style labels (see the module's documentation): per served GPU
/// class with devices, the largest device's product (with [`SHARED_SUFFIX`] when the class is
/// shared), family, memory in MiB and WDDM version, and the class's sharing strategy (and
/// replicas when time-sliced), and the lowest D3D12 feature level of its devices; node-wide the
/// same of the largest device, and the machine type; on a node whose served GPUs are of more than
/// one model (PCI vendor and device ID), per class and model its count, product, family, smallest
/// memory, WDDM version and lowest D3D12 feature level. A fact that is unknown gives no label
/// (a feature level only when every device of the class or model reports one).
pub fn model_labels(discovery: &Discovery, settings: &LabelSettings) -> BTreeMap<String, String> {
    let key = |name: &str| format!("{}{name}", settings.prefix);
    let mut labels = BTreeMap::new();
    let mut advertised: Vec<&Device> = Vec::new();
    for r in Resource::ALL {
        if settings.enabled.get(r) {
            advertised.extend(discovery.devices_for(r));
        }
    }
    let model = |d: &Device| -> ModelId { (d.vendor_id, d.device_id) };
    let several_models = advertised.iter().any(|d| model(d) != model(advertised[0]));
    // One device's description, under `name.` (empty: node-wide).
    let describe =
        |labels: &mut BTreeMap<String, String>, name: &str, d: &Device, sharing: Sharing| {
            let shared = sharing.strategy() != Strategy::None;
            if let Some(p) = product_value(&d.description, shared) {
                labels.insert(key(&format!("{name}product")), p);
            }
            if let Some(f) = families::family(&settings.families, model(d)).and_then(label_value) {
                labels.insert(key(&format!("{name}family")), f);
            }
            if let Some(w) = wddm_version(&d.driver_version) {
                labels.insert(key(&format!("{name}wddm-version")), w);
            }
        };
    let mut node_largest: Option<&Device> = None;
    for r in Resource::ALL {
        if !settings.enabled.get(r) {
            continue;
        }
        let devices: Vec<&Device> = discovery.devices_for(r).collect();
        let Some(largest) = largest(&devices) else {
            continue;
        };
        if node_largest.is_none_or(|b| b.dedicated_memory_bytes < largest.dedicated_memory_bytes) {
            node_largest = Some(largest);
        }
        let class = r.as_str();
        let sharing = settings.sharing.get(r);
        describe(&mut labels, &format!("{class}."), largest, sharing);
        labels.insert(
            key(&format!("{class}.memory")),
            mib(largest.dedicated_memory_bytes),
        );
        if let Some(l) = lowest_feature_level(&devices) {
            labels.insert(key(&format!("{class}.{FEATURE_LEVEL}")), l);
        }
        labels.insert(
            key(&format!("{class}.sharing-strategy")),
            sharing.strategy().as_str().into(),
        );
        if let Sharing::Replicas(_) = sharing {
            labels.insert(
                key(&format!("{class}.replicas")),
                sharing.shares(0).to_string(),
            );
        }
        if !several_models {
            continue;
        }
        let mut models: BTreeMap<ModelId, Vec<&Device>> = BTreeMap::new();
        for d in &devices {
            models.entry(model(d)).or_default().push(d);
        }
        for (m, of_model) in models {
            let name = format!("{class}.{}.", families::model_key(m));
            labels.insert(key(&format!("{name}count")), of_model.len().to_string());
            // The smallest: what every GPU of the model has at least.
            let smallest = of_model
                .iter()
                .map(|d| d.dedicated_memory_bytes)
                .min()
                .unwrap_or(0);
            labels.insert(key(&format!("{name}memory")), mib(smallest));
            if let Some(l) = lowest_feature_level(&of_model) {
                labels.insert(key(&format!("{name}{FEATURE_LEVEL}")), l);
            }
            if let Some(first) = of_model.first() {
                describe(&mut labels, &name, first, sharing);
            }
        }
    }
    if let Some(d) = node_largest {
        let sharing = d
            .resource
            .map_or(Sharing::Replicas(1), |r| settings.sharing.get(r));
        if let Some(f) = families::family(&settings.families, model(d)).and_then(label_value) {
            labels.insert(key("family"), f);
        }
        if let Some(w) = wddm_version(&d.driver_version) {
            labels.insert(key("wddm-version"), w);
        }
        labels.insert(key("sharing-strategy"), sharing.strategy().as_str().into());
    }
    if let Some(m) = settings.machine.as_deref().and_then(label_value) {
        labels.insert(key("machine"), m);
    }
    labels
}

/// The device with the most dedicated memory; on a tie the first.
fn largest<'a>(devices: &[&'a Device]) -> Option<&'a Device> {
    devices.iter().copied().fold(None, |best, d| match best {
        Some(b) if b.dedicated_memory_bytes >= d.dedicated_memory_bytes => Some(b),
        _ => Some(d),
    })
}

/// The lowest D3D12 feature level of `devices` (so that a selector on it never lands on a device
/// below it); `None` when one of them has none (it may be below every other) or there are none.
fn lowest_feature_level(devices: &[&Device]) -> Option<String> {
    let mut lowest: Option<(u32, u32)> = None;
    for d in devices {
        let level = parse_feature_level(d.d3d12_feature_level.as_deref()?)?;
        lowest = Some(lowest.map_or(level, |l| l.min(level)));
    }
    lowest.map(|(major, minor)| format!("{major}_{minor}"))
}

fn mib(bytes: u64) -> String {
    (bytes / (1024 * 1024)).to_string()
}

/// A product label value: the description as a label value, with [`SHARED_SUFFIX`] when shared
/// (the description shortened so that the suffix fits).
fn product_value(description: &str, shared: bool) -> Option<String> {
    let base = label_value(description)?;
    if !shared {
        return Some(base);
    }
    let room = MAX_VALUE - SHARED_SUFFIX.len();
    let cut = match base.get(..room) {
        Some(head) if base.len() > room => label_value(head).unwrap_or_default(),
        _ => base,
    };
    Some(format!("{cut}{SHARED_SUFFIX}"))
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
    // The longest name dxdp puts after the prefix (a per-model label).
    let longest = "compute.10de-2236.d3d12-feature-level".len();
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
            d3d12_feature_level: None,
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
            sharing: PerResource {
                display: Sharing::Replicas(4),
                compute: Sharing::Replicas(1),
            },
            families: BTreeMap::new(),
            machine: None,
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
        // 63 characters minus the longest name, compute.10de-2236.d3d12-feature-level (37).
        assert!(check_prefix(&format!("a.com/{}", "x".repeat(26))).is_ok());
        assert!(check_prefix(&format!("a.com/{}", "x".repeat(27))).is_err());
    }

    fn with_model(mut d: Device, vendor_id: u32, device_id: u32, description: &str) -> Device {
        d.vendor_id = vendor_id;
        d.device_id = device_id;
        d.description = description.into();
        d
    }

    #[test]
    fn one_model_gets_class_labels_and_a_shared_product_suffix() {
        // Two A10 (10de:2236, ampere in the built-in table), time-sliced 4 ways.
        let discovery = Discovery {
            devices: vec![
                with_model(
                    device("0001", Resource::Display, 23028, &[]),
                    0x10de,
                    0x2236,
                    "NVIDIA A10",
                ),
                with_model(
                    device("0002", Resource::Display, 23028, &[]),
                    0x10de,
                    0x2236,
                    "NVIDIA A10",
                ),
            ],
            ..Default::default()
        };
        let mut s = settings();
        s.machine = Some("Standard_NV36ads_A10_v5".into());
        let want = labels(&[
            ("display.product", "NVIDIA-A10-SHARED"),
            ("display.family", "ampere"),
            ("display.memory", "23028"),
            ("display.wddm-version", "3.1"),
            ("display.sharing-strategy", "time-slicing"),
            ("display.replicas", "4"),
            ("family", "ampere"),
            ("wddm-version", "3.1"),
            ("sharing-strategy", "time-slicing"),
            ("machine", "Standard_NV36ads_A10_v5"),
        ]);
        assert_eq!(model_labels(&discovery, &s), want);
        // The original labels are unchanged beside them.
        let all = all_labels(&discovery, &s);
        assert_eq!(
            all.get("directx.microsoft.com/product").map(String::as_str),
            Some("NVIDIA-A10")
        );
        assert_eq!(
            all.get("directx.microsoft.com/replicas")
                .map(String::as_str),
            Some("4")
        );
        assert_eq!(all.len(), want.len() + node_labels(&discovery, &s).len());
    }

    #[test]
    fn several_models_get_labels_per_class_and_model() {
        // An A100 80GB PCIe (10de:20b5) and an A10 (10de:2236) for display, an unknown
        // compute device (1234:0001) with memory sharing, and a user family for 1234:0001.
        let discovery = Discovery {
            devices: vec![
                with_model(
                    device("0001", Resource::Display, 81920, &[]),
                    0x10de,
                    0x20b5,
                    "NVIDIA A100 80GB PCIe",
                ),
                with_model(
                    device("0002", Resource::Display, 23028, &[]),
                    0x10de,
                    0x2236,
                    "NVIDIA A10",
                ),
                with_model(
                    device("0003", Resource::Display, 23000, &[]),
                    0x10de,
                    0x2236,
                    "NVIDIA A10",
                ),
                with_model(
                    device("0004", Resource::Compute, 4096, &[]),
                    0x1234,
                    0x0001,
                    "Example NPU",
                ),
            ],
            ..Default::default()
        };
        let mut s = settings();
        s.sharing.display = Sharing::Replicas(1);
        s.sharing.compute = Sharing::Memory(crate::sharing::MemorySharing {
            unit_bytes: 1 << 30,
            reserve_bytes: 1 << 30,
        });
        s.families.insert((0x1234, 0x0001), "Example NPU v1".into());
        let want = labels(&[
            ("display.product", "NVIDIA-A100-80GB-PCIe"),
            ("display.family", "ampere"),
            ("display.memory", "81920"),
            ("display.wddm-version", "3.1"),
            ("display.sharing-strategy", "none"),
            ("display.replicas", "1"),
            ("display.10de-20b5.count", "1"),
            ("display.10de-20b5.product", "NVIDIA-A100-80GB-PCIe"),
            ("display.10de-20b5.family", "ampere"),
            ("display.10de-20b5.memory", "81920"),
            ("display.10de-20b5.wddm-version", "3.1"),
            ("display.10de-2236.count", "2"),
            ("display.10de-2236.product", "NVIDIA-A10"),
            ("display.10de-2236.family", "ampere"),
            ("display.10de-2236.memory", "23000"),
            ("display.10de-2236.wddm-version", "3.1"),
            ("compute.product", "Example-NPU-SHARED"),
            ("compute.family", "Example-NPU-v1"),
            ("compute.memory", "4096"),
            ("compute.wddm-version", "3.1"),
            ("compute.sharing-strategy", "memory"),
            ("compute.1234-0001.count", "1"),
            ("compute.1234-0001.product", "Example-NPU-SHARED"),
            ("compute.1234-0001.family", "Example-NPU-v1"),
            ("compute.1234-0001.memory", "4096"),
            ("compute.1234-0001.wddm-version", "3.1"),
            ("family", "ampere"),
            ("wddm-version", "3.1"),
            ("sharing-strategy", "none"),
        ]);
        assert_eq!(model_labels(&discovery, &s), want);
    }

    #[test]
    fn the_feature_level_labels_are_the_lowest_of_the_class_and_of_each_model() {
        let level = |mut d: Device, l: Option<&str>| {
            d.d3d12_feature_level = l.map(str::to_string);
            d
        };
        let a100 = with_model(
            device("0001", Resource::Display, 81920, &[]),
            0x10de,
            0x20b5,
            "A100",
        );
        let a10 = with_model(
            device("0002", Resource::Display, 23028, &[]),
            0x10de,
            0x2236,
            "A10",
        );
        let npu = with_model(
            device("0004", Resource::Compute, 4096, &[]),
            0x1234,
            0x0001,
            "NPU",
        );
        let discovery = Discovery {
            devices: vec![
                level(a100.clone(), Some("12_1")),
                level(a10.clone(), Some("12_2")),
                level(with_model(a10.clone(), 0x10de, 0x2236, "A10"), Some("12_0")),
                level(npu.clone(), None),
            ],
            ..Default::default()
        };
        let feature_levels = |labels: BTreeMap<String, String>| -> BTreeMap<String, String> {
            labels
                .into_iter()
                .filter(|(k, _)| k.contains("d3d12"))
                .collect()
        };
        assert_eq!(
            feature_levels(model_labels(&discovery, &settings())),
            labels(&[
                ("display.d3d12-feature-level", "12_0"),
                ("display.10de-20b5.d3d12-feature-level", "12_1"),
                ("display.10de-2236.d3d12-feature-level", "12_0"),
            ])
        );
        // One A10 whose level is unknown: neither the class nor the A10s have the label.
        let discovery = Discovery {
            devices: vec![
                level(a100, Some("12_1")),
                level(a10.clone(), Some("12_2")),
                level(a10, None),
                level(npu, Some("11_0")),
            ],
            ..Default::default()
        };
        assert_eq!(
            feature_levels(model_labels(&discovery, &settings())),
            labels(&[
                ("display.10de-20b5.d3d12-feature-level", "12_1"),
                ("compute.d3d12-feature-level", "11_0"),
                ("compute.1234-0001.d3d12-feature-level", "11_0"),
            ])
        );
    }

    #[test]
    fn unknown_facts_give_no_label() {
        // An unknown model, a driver version that names no WDDM version, no machine type.
        let mut d = with_model(
            device("0001", Resource::Display, 1024, &[]),
            0x1414,
            0x008c,
            "(((",
        );
        d.driver_version = "10.0.20348.1".into();
        let discovery = Discovery {
            devices: vec![d],
            ..Default::default()
        };
        let mut s = settings();
        s.sharing.display = Sharing::Replicas(1);
        let want = labels(&[
            ("display.memory", "1024"),
            ("display.sharing-strategy", "none"),
            ("display.replicas", "1"),
            ("sharing-strategy", "none"),
        ]);
        assert_eq!(model_labels(&discovery, &s), want);
        assert_eq!(model_labels(&Discovery::default(), &s), BTreeMap::new());
    }

    #[test]
    fn wddm_versions_and_shared_products() {
        for (driver, want) in [
            ("31.0.15.2824", Some("3.1")),
            ("27.21.14.5671", Some("2.7")),
            ("32.0.101.5768", Some("3.2")),
            ("30.0.31.250", Some("3.0")),
            ("10.0.20348.1", None),
            ("1.0.0.0", None),
            ("9.18.13.4192", None),
            ("031.0.1.1", None),
            ("", None),
        ] {
            assert_eq!(wddm_version(driver).as_deref(), want, "{driver}");
        }
        let long = "B".repeat(70);
        assert_eq!(
            product_value(&long, true),
            Some(format!("{}-SHARED", "B".repeat(56)))
        );
        assert_eq!(product_value(&long, false), Some("B".repeat(63)));
        assert_eq!(product_value("___", true), None);
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
            d.d3d12_feature_level = Some("12_2".into());
            let mut other = d.clone();
            other.id = "0003".into();
            other.device_id = 0xffff;
            let discovery = Discovery { devices: vec![d.clone(), { d.id = "0002".into(); d }, other], ..Default::default() };
            let s = LabelSettings { prefix: prefix.clone(), ..settings() };
            for (k, v) in all_labels(&discovery, &s) {
                let name = k.strip_prefix(&format!("{domain}/")).unwrap_or_default();
                prop_assert!(!name.is_empty() && name.len() <= 63 && is_label_value(name), "key {:?}", k);
                prop_assert!(is_label_value(&v), "value {:?}", v);
            }
        }
    }
}
