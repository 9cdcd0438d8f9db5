//! The pipeline: a pure function from host facts (and configuration) to devices.
//!
//! No I/O happens here, so every rule is tested on any OS, and the Windows backend and host
//! snapshots give identical results for identical facts.

pub mod classify;
pub mod filter;
pub mod ids;
pub mod matching;
pub mod runtime_files;
pub mod winpath;

use std::collections::HashMap;

use crate::devices::CudaOrder;
use crate::devices::{
    Device, Discovery, Excluded, ExclusionCode, PerResource, RuntimeFiles, Warning, WarningCode,
};
use crate::facts::{AdapterFacts, AdapterProperty, HostFacts, DEFAULT_SYSTEM_ROOT};
use crate::quote;
use filter::DeviceSelector;
use runtime_files::{AdditionalFile, DeviceContext, FileIndex, RegistryIndex};

/// The settings the pipeline takes. The configuration file and environment fill it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineConfig {
    /// Advertise integrated adapters, per resource.
    pub include_integrated: PerResource<bool>,
    /// Advertise detachable adapters, per resource.
    pub include_detachable: PerResource<bool>,
    /// Enumerate `CopyToVm*` runtime files.
    pub runtime_files: bool,
    /// When not empty, only devices matching one of these are kept.
    pub include: Vec<DeviceSelector>,
    /// Devices matching one of these are left out.
    pub exclude: Vec<DeviceSelector>,
    /// Runtime-file destinations never mounted (case-insensitive).
    pub runtime_exclude: Vec<String>,
    /// Runtime files added by configuration.
    pub additional_files: Vec<AdditionalFile>,
    /// Which device-node conditions make a device Unhealthy.
    pub health: HealthChecks,
}

/// Health checks (`health` in the configuration), as users of the NVIDIA plugin needed: some
/// problem codes are benign on some hosts, and some operators want no checks at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthChecks {
    /// Check health at all; when off, every device is Healthy.
    pub enabled: bool,
    /// Problem codes that do not make a device Unhealthy.
    pub ignore_problem_codes: Vec<u32>,
    /// Per-signal actions and ignored signals (`health.signals`, `health.ignore`).
    pub policy: crate::health::HealthPolicy,
}

impl Default for HealthChecks {
    fn default() -> Self {
        HealthChecks {
            enabled: true,
            ignore_problem_codes: Vec::new(),
            policy: crate::health::HealthPolicy::default(),
        }
    }
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            include_integrated: PerResource::both(false),
            include_detachable: PerResource::both(false),
            runtime_files: true,
            include: Vec::new(),
            exclude: Vec::new(),
            runtime_exclude: Vec::new(),
            additional_files: Vec::new(),
            health: HealthChecks::default(),
        }
    }
}

/// Runs every rule over `facts`.
pub fn discover(facts: &HostFacts, config: &PipelineConfig) -> Discovery {
    let mut out = Discovery::default();
    let (facts, matches) = matching::attach(facts);
    let facts = facts.as_ref();
    let system_root = checked_system_root(facts, &mut out.warnings);
    let registry = RegistryIndex::new(&facts.registry);
    let files = FileIndex::new(&facts.files);
    // compare key of location path -> device ID
    let mut seen_paths: HashMap<String, String> = HashMap::new();
    let mut seen_ids: HashMap<String, String> = HashMap::new();

    for (adapter, matched) in facts.adapters.iter().zip(&matches) {
        let description = describe(adapter);
        for error in &adapter.read_errors {
            out.warnings.push(Warning::adapter(
                WarningCode::AdapterReadError,
                adapter.luid,
                format!(
                    "adapter {} (LUID {}): {}",
                    quote::bounded(&description),
                    crate::luid::label(adapter.luid),
                    quote::bounded_prefix(error, 400)
                ),
            ));
        }
        let exclude =
            |code: ExclusionCode, reason: String, location_path: Option<String>| Excluded {
                luid: adapter.luid,
                description: description.clone(),
                instance_id: adapter.pnp.as_ref().map(|p| p.instance_id.clone()),
                location_path,
                code,
                reason,
            };
        let unsupported: Vec<&str> = adapter
            .unsupported_properties
            .iter()
            .filter(|p| **p != AdapterProperty::IsHardware)
            .map(|p| p.field())
            .collect();
        if !unsupported.is_empty() {
            out.warnings.push(Warning::adapter(WarningCode::PropertyUnsupported, adapter.luid, format!(
                "adapter {description} (LUID {}): DXCore does not support {} for it; dxdp uses false, 0 or empty instead",
                crate::luid::label(adapter.luid),
                unsupported.join(", ")
            )));
        }
        let hardware = classify::hardware(adapter);
        if let Some(why) = &hardware.inferred {
            out.warnings.push(Warning::adapter(
                WarningCode::HardwareInferred,
                adapter.luid,
                format!(
                    "adapter {description} (LUID {}): {why}",
                    crate::luid::label(adapter.luid)
                ),
            ));
        }
        if !hardware.hardware {
            out.excluded.push(exclude(
                ExclusionCode::SoftwareAdapter,
                match hardware.inferred {
                    Some(_) => "treated as a software adapter: DXCore does not support IsHardware and no PCI device node matches; it cannot be assigned to a container".into(),
                    None => "software adapter (not hardware); it cannot be assigned to a container".into(),
                },
                None,
            ));
            continue;
        }
        // The switches are per resource; an adapter that fits neither resource is never
        // advertised, so either switch lets it through to its real exclusion reason.
        let resource = classify::resource(adapter);
        let included = |switch: &PerResource<bool>| match resource {
            Some(r) => switch.get(r),
            None => switch.display || switch.compute,
        };
        if adapter.is_integrated && !included(&config.include_integrated) {
            out.excluded.push(exclude(
                ExclusionCode::Integrated,
                "integrated adapter; integrated devices are not included (includeIntegrated is off)"
                    .into(),
                None,
            ));
            continue;
        }
        if adapter.is_detachable && !included(&config.include_detachable) {
            out.excluded.push(exclude(
                ExclusionCode::Detachable,
                "detachable adapter; detachable devices are not included (includeDetachable is off)"
                    .into(),
                None,
            ));
            continue;
        }
        let Some(pnp) = &adapter.pnp else {
            out.warnings.push(Warning::adapter(
                WarningCode::AdapterUnmatched,
                adapter.luid,
                format!(
                    "adapter {} (LUID {}): {}; the adapter is skipped, the other devices are not affected",
                    quote::bounded(&description),
                    crate::luid::label(adapter.luid),
                    matched.detail
                ),
            ));
            out.excluded.push(exclude(
                ExclusionCode::NoDeviceNode,
                "no device node: none reports this adapter's LUID or sits at its PCI location"
                    .into(),
                None,
            ));
            continue;
        };
        let location_path = pnp
            .location_paths
            .first()
            .map(|p| p.trim())
            .unwrap_or_default();
        if location_path.is_empty() {
            out.excluded.push(exclude(
                ExclusionCode::NoLocationPath,
                "the device node has no location path, so the device cannot be assigned individually"
                    .into(),
                None,
            ));
            continue;
        }
        let path_key = winpath::compare_key(location_path);
        let id = ids::device_id(location_path);
        if let Some(other) = seen_paths.get(&path_key) {
            out.excluded.push(exclude(
                ExclusionCode::DuplicateLocationPath,
                format!(
                    "device {other} already has location path {}",
                    quote::bounded(location_path)
                ),
                Some(location_path.to_string()),
            ));
            continue;
        }
        if let Some(other_path) = seen_ids.get(&id) {
            out.excluded.push(exclude(
                ExclusionCode::DuplicateLocationPath,
                format!(
                    "its device ID {id} collides with location path {}",
                    quote::bounded(other_path)
                ),
                Some(location_path.to_string()),
            ));
            continue;
        }
        seen_paths.insert(path_key, id.clone());
        seen_ids.insert(id.clone(), location_path.to_string());

        let label = format!(
            "{} ({})",
            quote::bounded(&description),
            quote::bounded(location_path)
        );
        let label = label.as_str();
        let raw_store = adapter
            .driver_store_path
            .as_deref()
            .filter(|p| !p.is_empty());
        let checked_store = raw_store.map(|p| driver_store(p, &system_root));
        let driver_store_path = match &checked_store {
            Some(Ok(p)) => Some(p.clone()),
            Some(Err(_)) => raw_store.map(str::to_string),
            None => None,
        };
        let in_container = matches!(&checked_store, Some(Ok(p)) if p.to_ascii_lowercase().contains("hostdriverstore"));
        out.in_container |= in_container;

        let mut device = Device {
            id,
            luid: adapter.luid,
            description: description.clone(),
            vendor: classify::vendor_name(adapter.hardware_id.vendor_id),
            vendor_id: adapter.hardware_id.vendor_id,
            device_id: adapter.hardware_id.device_id,
            sub_sys_id: adapter.hardware_id.sub_sys_id,
            revision: adapter.hardware_id.revision,
            manufacturer: pnp.manufacturer.clone(),
            location_path: location_path.to_string(),
            pci: pnp.pci,
            instance_id: pnp.instance_id.clone(),
            driver_key: pnp.driver_key.clone().filter(|k| !k.is_empty()),
            driver_version: adapter.driver_version.clone(),
            driver_store_path: driver_store_path.clone(),
            dedicated_memory_bytes: adapter.dedicated_adapter_memory,
            d3d12_feature_level: adapter.d3d12_feature_level.clone(),
            is_integrated: adapter.is_integrated,
            is_detachable: adapter.is_detachable,
            supports_display: classify::supports_display(adapter),
            supports_compute: classify::supports_compute(adapter),
            resource,
            health: if config.health.enabled {
                classify::health(
                    pnp,
                    adapter.driver_update_in_progress,
                    &config.health.ignore_problem_codes,
                    &config.health.policy,
                )
            } else {
                crate::devices::Health::healthy()
            },
            runtime_files: RuntimeFiles::default(),
        };
        if !config.include.is_empty() && !config.include.iter().any(|s| s.matches(&device)) {
            out.excluded.push(exclude(
                ExclusionCode::NotIncluded,
                "no devices.include selector of the configuration matches it".into(),
                Some(location_path.to_string()),
            ));
            continue;
        }
        if let Some(i) = config.exclude.iter().position(|s| s.matches(&device)) {
            out.excluded.push(exclude(
                ExclusionCode::ExcludedByConfig,
                format!("excluded by devices.exclude[{i}] of the configuration"),
                Some(location_path.to_string()),
            ));
            continue;
        }
        let device_warning =
            |code, message| Warning::device(code, &device.id, adapter.luid, message);
        device.runtime_files = match (&checked_store, &pnp.driver_key) {
            _ if !config.runtime_files || in_container => RuntimeFiles::default(),
            (Some(Err(why)), _) => {
                out.warnings.push(device_warning(WarningCode::DriverStoreInvalid, format!(
                    "device {label}: driver store path {} {why}, so no runtime files (CUDA, OpenCL, Vulkan, ...) are mounted",
                    quote::quote(raw_store.unwrap_or_default())
                )));
                RuntimeFiles::default()
            }
            (Some(Ok(store)), Some(driver_key)) if !driver_key.is_empty() => {
                if let Ok(root) = &system_root {
                    let system_store = winpath::join(root, r"System32\DriverStore");
                    if !winpath::is_within(store, &system_store) {
                        out.warnings.push(device_warning(WarningCode::DriverStoreOutside, format!(
                            "device {label}: driver store {} is outside {system_store}; its runtime files are mounted from there anyway, check that this is the driver's own store",
                            quote::bounded(store)
                        )));
                    }
                }
                runtime_files::resolve(
                    &DeviceContext {
                        label,
                        device_id: &device.id,
                        luid: adapter.luid,
                        driver_key,
                        driver_store: store,
                        vendor_id: adapter.hardware_id.vendor_id,
                        additional: &config.additional_files,
                        exclude: &config.runtime_exclude,
                    },
                    &registry,
                    &files,
                    &mut out.warnings,
                )
            }
            (None, _) => {
                out.warnings.push(device_warning(WarningCode::DriverStoreUnknown, format!(
                    "device {label}: the driver store path is unknown, so no runtime files (CUDA, OpenCL, Vulkan, ...) are mounted"
                )));
                RuntimeFiles::default()
            }
            (Some(_), _) => {
                out.warnings.push(device_warning(WarningCode::NoDriverKey, format!(
                    "device {label}: the device node has no driver key, so no runtime files (CUDA, OpenCL, Vulkan, ...) are mounted"
                )));
                RuntimeFiles::default()
            }
        };

        out.devices.push(device);
    }
    if out.in_container {
        out.warnings.insert(
            0,
            Warning::host(
                WarningCode::InContainer,
                "dxdp is running inside a container (the driver store is under HostDriverStore): runtime files are not enumerated",
            ),
        );
    }
    out.devices
        .sort_by_cached_key(|d| winpath::compare_key(&d.location_path));
    out.cuda_order = CudaOrder::of(facts);
    out.matches = matches;
    out
}

/// `%SystemRoot%` from the facts (`C:\Windows` when absent), or why it cannot be used: it must be
/// an absolute local path like every other host directory. An invalid one is warned about once.
fn checked_system_root<'a>(
    facts: &'a HostFacts,
    warnings: &mut Vec<Warning>,
) -> Result<&'a str, String> {
    let root = facts
        .os
        .as_ref()
        .map(|os| os.system_root())
        .unwrap_or(DEFAULT_SYSTEM_ROOT);
    winpath::check_local_absolute(root).map(|()| root).map_err(|why| {
        let quoted = quote::quote(root);
        warnings.push(Warning::host(WarningCode::SystemRootInvalid, format!(
            "os.systemRoot {quoted} {why}; driver store paths relative to %SystemRoot% cannot be resolved, so those devices get no runtime files"
        )));
        format!("is relative to %SystemRoot%, which is not usable ({quoted} {why})")
    })
}

/// The driver store directory of an adapter: `raw` with `\SystemRoot` expanded, checked to be an
/// absolute local path (see [`winpath::check_local_absolute`]); else why not.
fn driver_store(raw: &str, system_root: &Result<&str, String>) -> Result<String, String> {
    let expanded = match (winpath::system_root_relative(raw), system_root) {
        (Some(_), Err(why)) => return Err(why.clone()),
        (Some(_), Ok(root)) => winpath::expand_system_root(raw, root),
        (None, _) => raw.to_string(),
    };
    winpath::check_local_absolute(&expanded)
        .map(|()| expanded)
        .map_err(str::to_string)
}

/// The adapter's description: DXCore's, else the device node's, else its LUID.
fn describe(adapter: &AdapterFacts) -> String {
    let dxcore = adapter.driver_description.trim();
    if !dxcore.is_empty() {
        return dxcore.to_string();
    }
    adapter
        .pnp
        .as_ref()
        .and_then(|p| p.description.as_deref())
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| format!("adapter with LUID {}", crate::luid::label(adapter.luid)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::{HealthState, Resource};
    use crate::facts::{Attribute, HardwareId, PnpFacts};

    fn gpu(luid: i64, location: &str) -> AdapterFacts {
        AdapterFacts {
            luid,
            hardware_id: HardwareId {
                vendor_id: 0x10DE,
                device_id: 0x1EB8,
                sub_sys_id: 0,
                revision: 0,
            },
            driver_description: format!("GPU {luid}"),
            driver_version: "1.2.3.4".into(),
            dedicated_adapter_memory: 1 << 30,
            is_hardware: true,
            is_integrated: false,
            is_detachable: false,
            attributes: vec![Attribute::D3D12_GRAPHICS, Attribute::D3D12_CORE_COMPUTE],
            driver_update_in_progress: false,
            driver_store_path: Some(r"\SystemRoot\System32\DriverStore\FileRepository\x".into()),
            pnp: Some(PnpFacts {
                instance_id: format!("PCI\\X\\{luid}"),
                description: None,
                manufacturer: None,
                location_paths: vec![location.into()],
                driver_key: Some(r"{4d36e968-e325-11ce-bfc1-08002be10318}\0000".into()),
                problem_code: 0,
                pci: None,
                status_flags: None,
                status_error: None,
                adapter_luid: None,
                read_errors: Vec::new(),
            }),
            adapter_address: None,
            d3d12_feature_level: None,
            unsupported_properties: Vec::new(),
            read_errors: Vec::new(),
        }
    }

    fn host(adapters: Vec<AdapterFacts>) -> HostFacts {
        HostFacts {
            adapters,
            ..HostFacts::default()
        }
    }

    #[test]
    fn exclusion_rules() {
        type Edit = fn(&mut AdapterFacts);
        let table: Vec<(&str, Edit, PipelineConfig, Option<ExclusionCode>)> = vec![
            ("plain", |_| {}, PipelineConfig::default(), None),
            (
                "software",
                |a| a.is_hardware = false,
                PipelineConfig::default(),
                Some(ExclusionCode::SoftwareAdapter),
            ),
            (
                "integrated",
                |a| a.is_integrated = true,
                PipelineConfig::default(),
                Some(ExclusionCode::Integrated),
            ),
            (
                "integrated included",
                |a| a.is_integrated = true,
                PipelineConfig {
                    include_integrated: PerResource::both(true),
                    ..PipelineConfig::default()
                },
                None,
            ),
            (
                "detachable",
                |a| a.is_detachable = true,
                PipelineConfig::default(),
                Some(ExclusionCode::Detachable),
            ),
            (
                "detachable included",
                |a| a.is_detachable = true,
                PipelineConfig {
                    include_detachable: PerResource::both(true),
                    ..PipelineConfig::default()
                },
                None,
            ),
            (
                "no pnp",
                |a| a.pnp = None,
                PipelineConfig::default(),
                Some(ExclusionCode::NoDeviceNode),
            ),
            (
                "no location",
                |a| {
                    a.pnp
                        .as_mut()
                        .into_iter()
                        .for_each(|p| p.location_paths.clear())
                },
                PipelineConfig::default(),
                Some(ExclusionCode::NoLocationPath),
            ),
            (
                "blank location",
                |a| {
                    a.pnp
                        .as_mut()
                        .into_iter()
                        .for_each(|p| p.location_paths = vec![" ".into(), "PCIROOT(0)".into()])
                },
                PipelineConfig::default(),
                Some(ExclusionCode::NoLocationPath),
            ),
        ];
        for (name, edit, config, expected) in table {
            let mut a = gpu(1, "PCIROOT(0)#PCI(0100)");
            edit(&mut a);
            let d = discover(&host(vec![a]), &config);
            match expected {
                None => assert_eq!((d.devices.len(), d.excluded.len()), (1, 0), "{name}"),
                Some(code) => {
                    assert!(d.devices.is_empty(), "{name}");
                    assert_eq!(d.excluded[0].code, code, "{name}");
                }
            }
        }
    }

    #[test]
    fn duplicate_location_paths_keep_the_first() {
        let d = discover(
            &host(vec![
                gpu(1, "PCIROOT(0)#PCI(0100)"),
                gpu(2, "pciroot(0)#pci(0100)"),
            ]),
            &PipelineConfig::default(),
        );
        assert_eq!(d.devices.len(), 1);
        assert_eq!(d.devices[0].luid, 1);
        assert_eq!(d.excluded[0].code, ExclusionCode::DuplicateLocationPath);
    }

    #[test]
    fn unsupported_properties_are_never_dropped_silently() {
        use crate::facts::AdapterProperty::*;
        let mut pci = gpu(1, "PCIROOT(0)#PCI(0100)");
        pci.is_hardware = false;
        pci.unsupported_properties = vec![IsHardware, IsDetachable];
        let mut acpi = gpu(2, "ACPI(_SB_)#ACPI(GPU0)");
        acpi.is_hardware = false;
        acpi.unsupported_properties = vec![IsHardware];
        let d = discover(&host(vec![pci, acpi]), &PipelineConfig::default());
        assert_eq!(d.devices.len(), 1);
        assert_eq!(d.devices[0].luid, 1);
        assert_eq!(d.excluded.len(), 1);
        assert_eq!(d.excluded[0].luid, 2);
        assert_eq!(d.excluded[0].code, ExclusionCode::SoftwareAdapter);
        assert!(d.excluded[0].reason.contains("does not support IsHardware"));
        let warnings = d
            .warnings
            .iter()
            .map(|w| w.message.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        for fragment in [
            "GPU 1 (LUID 0x00000000_0x00000001): DXCore does not support isDetachable for it",
            "GPU 1 (LUID 0x00000000_0x00000001): DXCore does not support IsHardware for this adapter; treated as hardware because its device node has the PCI location path PCIROOT(0)#PCI(0100)",
            "GPU 2 (LUID 0x00000000_0x00000002): DXCore does not support IsHardware for this adapter and no device node with a PCI location path matches it",
        ] {
            assert!(warnings.contains(fragment), "{fragment} not in {warnings}");
        }
    }

    #[test]
    fn problem_codes_count_only_with_dn_has_problem() {
        let mut stale = gpu(1, "PCIROOT(0)#PCI(0100)");
        let pnp = stale.pnp.as_mut().unwrap();
        pnp.problem_code = 43;
        pnp.status_flags = Some(0x0180_200A);
        let mut failed = gpu(2, "PCIROOT(0)#PCI(0200)");
        failed.pnp.as_mut().unwrap().status_error = Some("CR_FAILURE".into());
        let d = discover(&host(vec![stale, failed]), &PipelineConfig::default());
        assert_eq!(d.devices[0].health.state, HealthState::Healthy);
        assert_eq!(d.devices[1].health.state, HealthState::Unhealthy);
    }

    #[test]
    fn devices_are_sorted_by_location_path_and_fields_are_filled() {
        let mut b = gpu(2, "PCIROOT(0)#PCI(0200)");
        b.pnp.as_mut().unwrap().problem_code = 43;
        let d = discover(
            &host(vec![b, gpu(1, "PCIROOT(0)#PCI(0100)")]),
            &PipelineConfig::default(),
        );
        let paths: Vec<_> = d.devices.iter().map(|d| d.location_path.as_str()).collect();
        assert_eq!(paths, ["PCIROOT(0)#PCI(0100)", "PCIROOT(0)#PCI(0200)"]);
        let first = &d.devices[0];
        assert_eq!(first.vendor, "nvidia");
        assert_eq!(first.resource, Some(Resource::Display));
        assert_eq!(
            first.driver_store_path.as_deref(),
            Some(r"C:\Windows\System32\DriverStore\FileRepository\x")
        );
        assert_eq!(
            first.host_path(),
            "vpci-location-path://PCIROOT(0)#PCI(0100)"
        );
        assert_eq!(d.devices[1].health.state, HealthState::Unhealthy);
    }

    #[test]
    fn host_driver_store_means_in_container() {
        let mut a = gpu(1, "PCIROOT(0)#PCI(0100)");
        a.driver_store_path = Some(r"C:\Windows\System32\HostDriverStore\FileRepository\x".into());
        let d = discover(&host(vec![a]), &PipelineConfig::default());
        assert!(d.in_container);
        assert!(d.devices[0].runtime_files.is_empty());
        assert!(d.warnings[0].message.contains("inside a container"));
    }

    #[test]
    fn missing_driver_store_or_key_warns() {
        let mut a = gpu(1, "PCIROOT(0)#PCI(0100)");
        a.driver_store_path = None;
        let mut b = gpu(2, "PCIROOT(0)#PCI(0200)");
        b.pnp.as_mut().unwrap().driver_key = None;
        let d = discover(&host(vec![a, b]), &PipelineConfig::default());
        assert_eq!(d.devices.len(), 2);
        let (a_id, b_id) = (d.devices[0].id.as_str(), d.devices[1].id.as_str());
        assert!(d
            .warnings
            .iter()
            .any(|w| w.code == WarningCode::DriverStoreUnknown
                && w.device.as_deref() == Some(a_id)
                && w.luid == Some(1)
                && w.message.contains("driver store path is unknown")));
        assert!(d.warnings.iter().any(|w| w.code == WarningCode::NoDriverKey
            && w.device.as_deref() == Some(b_id)
            && w.luid == Some(2)
            && w.message.contains("no driver key")));
    }

    /// A GPU whose driver lists one runtime file, and a host where that file exists in `store`.
    fn host_with_store(store: &str, system_root: Option<&str>) -> HostFacts {
        use crate::facts::{OsFacts, RegData, RegType, RegistryKey, RegistryValue};
        let mut a = gpu(1, "PCIROOT(0)#PCI(0100)");
        a.driver_store_path = Some(store.into());
        let driver_key = a.pnp.as_ref().unwrap().driver_key.clone().unwrap();
        let root = system_root.unwrap_or(DEFAULT_SYSTEM_ROOT);
        HostFacts {
            os: system_root.map(|r| OsFacts {
                system_root: Some(r.into()),
                ..OsFacts::default()
            }),
            adapters: vec![a],
            registry: vec![RegistryKey {
                key: format!(
                    r"{}\{driver_key}\CopyToVmOverwrite",
                    runtime_files::CLASS_ROOT
                ),
                values: vec![RegistryValue {
                    name: "cuda".into(),
                    kind: RegType::REG_SZ,
                    data: RegData::String("nvcuda.dll".into()),
                }],
            }],
            files: vec![format!(
                r"{}\nvcuda.dll",
                winpath::expand_system_root(store, root)
            )],
            faults: Vec::new(),
        }
    }

    #[test]
    fn driver_store_paths_must_be_local_and_absolute() {
        // (store, system root, runtime files mounted, warning fragment)
        let table: [(&str, Option<&str>, bool, Option<&str>); 16] = [
            (
                r"\SystemRoot\System32\DriverStore\FileRepository\x",
                None,
                true,
                None,
            ),
            (
                r"C:\Windows\System32\DriverStore\FileRepository\x",
                None,
                true,
                None,
            ),
            (
                r"\SystemRoot\System32\DriverStore\FileRepository\x",
                Some(r"D:\WIN\"),
                true,
                None,
            ),
            (
                r"D:\Drivers\x",
                None,
                true,
                Some("outside C:\\Windows\\System32\\DriverStore"),
            ),
            (
                r"C:\Windows\System32\DriverStore",
                None,
                true,
                Some("outside"),
            ),
            (r"\\host\share\store", None, false, Some("UNC")),
            (
                r"\\?\C:\Windows\System32\DriverStore\FileRepository\x",
                None,
                false,
                Some("UNC or device"),
            ),
            (
                r"\??\C:\Windows\System32\DriverStore\FileRepository\x",
                None,
                false,
                Some(r"\??\"),
            ),
            (
                r"System32\DriverStore\FileRepository\x",
                None,
                false,
                Some("is relative"),
            ),
            (
                r"\Windows\System32\DriverStore\FileRepository\x",
                None,
                false,
                Some("current drive"),
            ),
            ("C:", None, false, Some("bare drive")),
            (
                r"C:\Windows\System32\DriverStore\..\..\x",
                None,
                false,
                Some("`..`"),
            ),
            (r"\SystemRoot\..\x", None, false, Some("`..`")),
            (
                r"\SystemRoot\System32\DriverStore\FileRepository\x",
                Some(r"\\host\share"),
                false,
                Some("os.systemRoot"),
            ),
            (
                r"\SystemRoot\System32\DriverStore\FileRepository\x",
                Some("Windows"),
                false,
                Some("not usable"),
            ),
            // A drive-qualified store does not need the (invalid) system root.
            (
                r"C:\Windows\System32\DriverStore\FileRepository\x",
                Some("C:"),
                true,
                Some("os.systemRoot"),
            ),
        ];
        for (store, root, mounted, warning) in table {
            let d = discover(&host_with_store(store, root), &PipelineConfig::default());
            let files = &d.devices[0].runtime_files;
            assert_eq!(
                !files.is_empty(),
                mounted,
                "{store} {root:?}: {:?}",
                d.warnings
            );
            match warning {
                None => assert!(d.warnings.is_empty(), "{store}: {:?}", d.warnings),
                Some(fragment) => assert!(
                    d.warnings.iter().any(|w| w.message.contains(fragment)),
                    "{store} {root:?}: want {fragment:?} in {:?}",
                    d.warnings
                ),
            }
            if !mounted && warning.is_none_or(|w| w != "os.systemRoot") {
                assert!(
                    d.warnings
                        .iter()
                        .any(|w| w.message.contains("GPU 1 (PCIROOT(0)#PCI(0100))")
                            && w.message.contains("no runtime files")),
                    "{store}: the warning names the device: {:?}",
                    d.warnings
                );
            }
        }
    }

    #[test]
    fn read_errors_become_warnings_naming_the_adapter() {
        let mut a = gpu(5, "PCIROOT(0)#PCI(0100)");
        a.read_errors = vec!["D3DKMTQueryAdapterInfo failed: NTSTATUS 0xC0000001".into()];
        let d = discover(&host(vec![a]), &PipelineConfig::default());
        assert!(
            d.warnings
                .iter()
                .any(|w| w.message.contains("GPU 5") && w.message.contains("0xC0000001")),
            "{:?}",
            d.warnings
        );
    }

    #[test]
    fn description_falls_back_to_device_node_then_luid() {
        let mut a = gpu(7, "PCIROOT(0)#PCI(0100)");
        a.driver_description = " ".into();
        a.pnp.as_mut().unwrap().description = Some("Node desc".into());
        let mut b = gpu(8, "PCIROOT(0)#PCI(0200)");
        b.driver_description.clear();
        let d = discover(&host(vec![a, b]), &PipelineConfig::default());
        assert_eq!(d.devices[0].description, "Node desc");
        assert_eq!(
            d.devices[1].description,
            "adapter with LUID 0x00000000_0x00000008"
        );
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use crate::facts::{Attribute, HardwareId, PnpFacts};
    use proptest::prelude::*;

    fn adapter(luid: i64, location: String) -> AdapterFacts {
        AdapterFacts {
            hardware_id: HardwareId {
                vendor_id: 0x10DE,
                device_id: 1,
                sub_sys_id: 0,
                revision: 0,
            },
            pnp: Some(PnpFacts {
                instance_id: format!("PCI\\{luid}"),
                location_paths: vec![location],
                ..PnpFacts::default()
            }),
            ..AdapterFacts::minimal(luid, vec![Attribute::D3D12_GRAPHICS])
        }
    }

    fn ids_by_path(d: &Discovery) -> HashMap<String, String> {
        d.devices
            .iter()
            .map(|dev| (dev.location_path.clone(), dev.id.clone()))
            .collect()
    }

    proptest! {
        #[test]
        fn runtime_files_come_only_from_local_absolute_stores(
            store in "(\\\\SystemRoot|%SystemRoot%|[A-Za-z]:|[\\\\/?.]{0,4}|\\\\\\?\\?|)([\\\\/]([a-zA-Z. ]{0,5}|\\.\\.|[a-z]:)){0,4}",
            root in prop::option::of("([A-Za-z]:|[\\\\/]{0,2}[a-z]{0,3}|)([\\\\/]([a-zA-Z]{0,5}|\\.\\.)){0,2}"),
        ) {
            let mut a = adapter(1, "PCIROOT(0)".into());
            a.driver_store_path = Some(store.clone());
            a.pnp.as_mut().unwrap().driver_key = Some("k".into());
            let facts = HostFacts {
                os: Some(crate::facts::OsFacts { system_root: root.clone(), ..Default::default() }),
                adapters: vec![a],
                registry: vec![crate::facts::RegistryKey {
                    key: format!(r"{}\k\CopyToVmOverwrite", runtime_files::CLASS_ROOT),
                    values: vec![crate::facts::RegistryValue {
                        name: "v".into(),
                        kind: crate::facts::RegType::REG_SZ,
                        data: crate::facts::RegData::String("x.dll".into()),
                    }],
                }],
                files: Vec::new(),
                faults: Vec::new(),
            };
            let d = discover(&facts, &PipelineConfig::default());
            for (_, file) in d.devices[0].runtime_files.iter() {
                prop_assert!(winpath::check_local_absolute(&file.host_path).is_ok(), "{} from {:?} {:?}", file.host_path, store, root);
            }
            if d.devices[0].runtime_files.is_empty() && !store.is_empty() {
                prop_assert!(d.warnings.iter().any(|w| w.message.contains("no runtime files")), "{:?}", d.warnings);
            }
        }

        #[test]
        fn device_ids_are_unique_and_independent_of_order(
            paths in prop::collection::vec("(PCIROOT\\([0-9]\\)(#PCI\\([0-9A-F]{2}00\\)){1,3}|ACPI\\(_SB_\\)#ACPI\\([A-Z]{4}\\)|\\PC{0,20})", 0..12),
            rotate in 0usize..12,
        ) {
            let adapters: Vec<AdapterFacts> = paths
                .iter()
                .enumerate()
                .map(|(i, p)| adapter(i as i64, p.clone()))
                .collect();
            let mut rotated = adapters.clone();
            if !rotated.is_empty() {
                let n = rotate % rotated.len();
                rotated.rotate_left(n);
            }
            let config = PipelineConfig::default();
            let a = discover(&HostFacts { adapters, ..HostFacts::default() }, &config);
            let b = discover(&HostFacts { adapters: rotated, ..HostFacts::default() }, &config);
            let ids: std::collections::HashSet<_> = a.devices.iter().map(|d| d.id.as_str()).collect();
            prop_assert_eq!(ids.len(), a.devices.len());
            prop_assert_eq!(a.devices.len() + a.excluded.len(), paths.len());
            for dev in &a.devices {
                prop_assert!(ids::is_valid_kubelet_id(&dev.id));
            }
            // The same location path gets the same ID whatever the adapter order.
            let (ia, ib) = (ids_by_path(&a), ids_by_path(&b));
            for (path, id) in &ia {
                if let Some(other) = ib.get(path) {
                    prop_assert_eq!(id, other);
                }
            }
            prop_assert_eq!(ia.len(), ib.len());
        }
    }
}
