//! The pipeline over every fixture host: snapshot-tested output plus the facts each fixture exists
//! to show, and snapshot round trips.

use dxdp::render;
use dxdp_core::devices::{Discovery, ExclusionCode, HealthState, Origin, Resource};
use dxdp_core::facts::HostFacts;
use dxdp_core::pipeline::{discover, PipelineConfig};
use dxdp_core::snapshot;

use crate::common;

use common::FIXTURES;

fn load(name: &str) -> HostFacts {
    common::facts(name)
}

fn run(name: &str) -> Discovery {
    discover(&load(name), &PipelineConfig::default())
}

#[test]
fn every_fixture_renders_as_recorded() {
    for name in FIXTURES {
        let facts = load(name);
        let d = discover(&facts, &PipelineConfig::default());
        insta::assert_snapshot!(
            format!("{name}-text"),
            render::discovery_text(&d, facts.os.as_ref(), true)
        );
        insta::assert_snapshot!(format!("{name}-json"), render::discovery_json(&d));
    }
}

#[test]
fn sample_host_renders_as_recorded() {
    let facts = dxdp_core::sample::sample_host().unwrap();
    let d = discover(&facts, &PipelineConfig::default());
    insta::assert_snapshot!("sample-host-json", render::discovery_json(&d));
}

#[test]
fn snapshots_round_trip_through_yaml_and_json() {
    let mut hosts: Vec<(String, HostFacts)> =
        FIXTURES.iter().map(|n| (n.to_string(), load(n))).collect();
    hosts.push(("sample".into(), dxdp_core::sample::sample_host().unwrap()));
    for (name, facts) in hosts {
        for format in [snapshot::Format::Yaml, snapshot::Format::Json] {
            let text = snapshot::write(&facts, format).unwrap();
            let back = snapshot::parse(&text, "round trip")
                .unwrap_or_else(|e| panic!("{name} {format}: {e}\n{text}"));
            assert_eq!(back, facts, "{name} {format}");
        }
    }
}

#[test]
fn nvidia_multi_gpu_advertises_four_display_gpus_and_overwrite_beats_when_newer() {
    let d = run("nvidia-multi-gpu");
    assert_eq!(d.devices_for(Resource::Display).count(), 4);
    assert_eq!(d.devices_for(Resource::Compute).count(), 0);
    assert_eq!(d.excluded[0].code, ExclusionCode::SoftwareAdapter);
    for dev in &d.devices {
        let cuda = dev
            .runtime_files
            .system32
            .iter()
            .find(|f| f.destination == "nvcuda.dll")
            .unwrap();
        assert_eq!(cuda.source, "nvcuda_loader64.dll");
        assert!(dev
            .runtime_files
            .system32
            .iter()
            .any(|f| f.destination == "nvidia-smi.exe"
                && f.origin == Origin::VendorDefault
                && f.exists));
        assert!(dev
            .driver_store_path
            .as_deref()
            .unwrap()
            .starts_with(r"C:\Windows\System32\DriverStore\FileRepository\"));
    }
}

#[test]
fn amd_reads_reg_sz_subdirectories_and_flags_missing_files() {
    let d = run("amd-radeon");
    let dev = &d.devices[0];
    assert_eq!(dev.vendor, "amd");
    let ocl = dev
        .runtime_files
        .system32
        .iter()
        .find(|f| f.destination == "amdocl64.dll")
        .unwrap();
    assert_eq!(ocl.source, r"B381544\amdocl64.dll");
    assert!(ocl.exists);
    let vk = dev
        .runtime_files
        .system32
        .iter()
        .find(|f| f.destination == "amdvlk64.dll")
        .unwrap();
    assert!(!vk.exists);
    assert!(d
        .warnings
        .iter()
        .any(|w| w.message.contains("amdvlk64.dll") && w.message.contains("Radeon Pro V520")));
}

#[test]
fn intel_integrated_is_left_out_unless_included() {
    let d = run("intel-igpu");
    assert_eq!(d.devices.len(), 1);
    assert_eq!(d.excluded[0].code, ExclusionCode::Integrated);
    let config = PipelineConfig {
        include_integrated: dxdp_core::devices::PerResource::both(true),
        ..PipelineConfig::default()
    };
    let d = discover(&load("intel-igpu"), &config);
    assert_eq!(d.devices.len(), 2);
    assert!(d.devices.iter().any(|dev| dev.is_integrated));
}

#[test]
fn compute_only_devices_go_to_the_compute_resource() {
    let d = run("compute-only");
    let compute: Vec<&str> = d
        .devices_for(Resource::Compute)
        .map(|dev| dev.vendor.as_str())
        .collect();
    assert_eq!(compute.len(), 3, "{compute:?}");
    assert!(compute.contains(&"qualcomm"));
    let media = d
        .devices
        .iter()
        .find(|dev| dev.description.contains("Media"))
        .unwrap();
    assert_eq!(media.resource, None);
    assert!(!media.supports_compute && !media.supports_display);
    let npu = d
        .devices
        .iter()
        .find(|dev| dev.location_path.starts_with("ACPI"))
        .unwrap();
    assert_eq!(
        npu.host_path(),
        "vpci-location-path://ACPI(_SB_)#ACPI(NSP0)"
    );
}

#[test]
fn broken_drivers_become_unhealthy_or_excluded_with_reasons() {
    let d = run("broken-drivers");
    let health = |path: &str| {
        d.devices
            .iter()
            .find(|dev| dev.location_path == path)
            .unwrap()
            .health
            .clone()
    };
    let h = health("PCIROOT(0)#PCI(1B00)");
    assert_eq!(h.state, HealthState::Unhealthy);
    assert!(h.reason.unwrap().contains("43"));
    assert_eq!(
        health("PCIROOT(0)#PCI(1C00)").reason.as_deref(),
        Some("driver update in progress")
    );
    assert_eq!(health("PCIROOT(0)#PCI(1D00)").state, HealthState::Healthy);
    let codes: Vec<ExclusionCode> = d.excluded.iter().map(|e| e.code).collect();
    assert_eq!(
        codes,
        [
            ExclusionCode::NoDeviceNode,
            ExclusionCode::NoLocationPath,
            ExclusionCode::Detachable
        ]
    );
    assert!(d
        .warnings
        .iter()
        .any(|w| w.message.contains("driver store path is unknown")));
    assert!(d
        .warnings
        .iter()
        .any(|w| w.message.contains("no driver key")));
    assert!(
        d.warnings
            .iter()
            .any(|w| w.message.contains("nvcuda_loader64.dll")
                && w.message.contains("does not exist"))
    );
}

#[test]
fn hostile_registry_keeps_only_safe_entries() {
    let d = run("hostile-registry");
    let dev = &d.devices[0];
    let store = r"D:\WINDOWS\System32\DriverStore\FileRepository\evil.inf_amd64_0000";
    assert_eq!(dev.driver_store_path.as_deref(), Some(store));
    let kept: Vec<(&str, &str)> = dev
        .runtime_files
        .system32
        .iter()
        .map(|f| (f.source.as_str(), f.destination.as_str()))
        .collect();
    assert_eq!(kept.len(), 5, "{kept:?}");
    assert!(kept.contains(&("three.dll", "three-dest.dll")));
    assert!(kept.contains(&(r"sub\dir\ok.dll", "ok.dll")));
    for (_, f) in dev.runtime_files.iter() {
        assert!(f.host_path.starts_with(&format!("{store}\\")));
        assert!(!f.host_path[store.len()..].split('\\').any(|c| c == ".."));
    }
    // 21 rejected or dropped registry values plus missing files.
    assert!(d.warnings.len() >= 21, "{}", d.warnings.len());
    assert!(dxdp_core::pipeline::ids::is_valid_kubelet_id(&dev.id));
}

#[test]
fn hostile_paths_mount_only_from_local_stores_and_never_over_device_names() {
    let d = run("hostile-paths");
    assert_eq!(d.devices.len(), 9);
    let with_files: Vec<&str> = d
        .devices
        .iter()
        .filter(|dev| !dev.runtime_files.is_empty())
        .map(|dev| dev.description.as_str())
        .collect();
    assert_eq!(
        with_files,
        ["Good GPU (reserved destinations)", "Outside store"]
    );
    for dev in &d.devices {
        for (_, f) in dev.runtime_files.iter() {
            assert!(["good.dll", "COM10.dll", "outside.dll"].contains(&f.destination.as_str()));
            let b = f.host_path.as_bytes();
            assert!(
                b[0].is_ascii_alphabetic() && &b[1..3] == b":\\",
                "{}",
                f.host_path
            );
        }
        if dev.runtime_files.is_empty() {
            let name = format!("device {} ({})", dev.description, dev.location_path);
            assert!(
                d.warnings.iter().any(
                    |w| w.message.starts_with(&name) && w.message.contains("driver store path")
                ),
                "no warning names {name}: {:#?}",
                d.warnings
            );
        }
    }
    // 11 device-name destinations, for each of the two devices with a usable store.
    let reserved = d
        .warnings
        .iter()
        .filter(|w| w.message.contains("is a Windows device name"))
        .count();
    assert_eq!(reserved, 22);
    assert_eq!(
        d.warnings
            .iter()
            .filter(|w| w
                .message
                .contains(r"is outside C:\Windows\System32\DriverStore"))
            .count(),
        1
    );
}

#[test]
fn an_unusable_system_root_drops_only_stores_relative_to_it() {
    let d = run("hostile-system-root");
    assert!(
        d.warnings[0]
            .message
            .starts_with(r#"os.systemRoot "\\\\fileserver"#),
        "{:?}",
        d.warnings
    );
    assert!(d.devices[0].runtime_files.is_empty());
    let mounted: Vec<&str> = d.devices[1]
        .runtime_files
        .iter()
        .filter(|(_, f)| f.exists)
        .map(|(_, f)| f.host_path.as_str())
        .collect();
    assert_eq!(
        mounted,
        [r"C:\Windows\System32\DriverStore\FileRepository\nv.inf_amd64_1\nvcuda_loader64.dll"]
    );
    assert!(d.warnings[1]
        .message
        .starts_with("device SystemRoot-relative store"));
    assert_eq!(d.warnings.len(), 2, "{:?}", d.warnings);
}

#[test]
fn in_container_skips_runtime_files() {
    let d = run("in-container");
    assert!(d.in_container);
    assert!(d.devices[0].runtime_files.is_empty());
    let json: serde_json::Value = serde_json::from_str(&render::discovery_json(&d)).unwrap();
    assert_eq!(json["inContainer"], true);
}

#[test]
fn json_has_the_documented_device_fields() {
    let d = run("nvidia-multi-gpu");
    let json: serde_json::Value = serde_json::from_str(&render::discovery_json(&d)).unwrap();
    let device = &json["devices"][0];
    for key in [
        "id",
        "luid",
        "description",
        "vendor",
        "vendorId",
        "deviceId",
        "locationPath",
        "instanceId",
        "driverVersion",
        "driverStorePath",
        "dedicatedMemoryBytes",
        "isIntegrated",
        "isDetachable",
        "supportsDisplay",
        "supportsCompute",
        "resource",
        "health",
        "runtimeFiles",
    ] {
        assert!(device.get(key).is_some(), "missing {key}");
    }
    assert_eq!(device["resource"], "display");
    assert_eq!(device["health"]["state"], "Healthy");
    let file = &device["runtimeFiles"]["system32"][0];
    for key in ["source", "destination", "origin"] {
        assert!(file.get(key).is_some(), "missing runtime file {key}");
    }
    assert!(json["excluded"].is_array() && json["warnings"].is_array());
}

#[test]
fn status_flags_and_unsupported_properties_decide_health_and_hardware() {
    let d = run("status-and-unsupported");
    let health = |luid: i64| {
        d.devices
            .iter()
            .find(|dev| dev.luid == luid)
            .map(|dev| dev.health.state)
    };
    // Problem code 28 without DN_HAS_PROBLEM is stale: healthy.
    assert_eq!(health(2001), Some(HealthState::Healthy));
    assert_eq!(health(2002), Some(HealthState::Unhealthy));
    // An unreadable status is never healthy.
    assert_eq!(health(2003), Some(HealthState::Unhealthy));
    // IsHardware unsupported, PCI device node: a device, with a warning.
    assert_eq!(health(2004), Some(HealthState::Healthy));
    let software: Vec<_> = d
        .excluded
        .iter()
        .filter(|e| e.code == ExclusionCode::SoftwareAdapter)
        .map(|e| e.luid)
        .collect();
    assert_eq!(software, [2005]);
    let warnings = d
        .warnings
        .iter()
        .map(|w| w.message.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(warnings.contains("(LUID 0x00000000_0x000007D4): DXCore does not support IsHardware"));
    assert!(warnings.contains("(LUID 0x00000000_0x000007D5): DXCore does not support IsHardware"));
    assert!(warnings.contains("does not support driverVersion, dedicatedAdapterMemory"));
}

#[test]
fn health_checks_can_ignore_problem_codes_or_be_switched_off() {
    use dxdp_core::pipeline::HealthChecks;
    let facts = load("broken-drivers");
    let unhealthy = |d: &Discovery| {
        d.devices
            .iter()
            .filter(|d| d.health.state == HealthState::Unhealthy)
            .count()
    };
    let default = discover(&facts, &PipelineConfig::default());
    // The fixture has a Code 43 device; the expected count comes from the fixture's own facts.
    let code43 = facts
        .adapters
        .iter()
        .filter(|a| a.pnp.as_ref().is_some_and(|p| p.problem_code == 43))
        .count();
    assert!(code43 >= 1 && unhealthy(&default) >= code43);
    let ignoring = PipelineConfig {
        health: HealthChecks {
            enabled: true,
            ignore_problem_codes: vec![43],
            ..HealthChecks::default()
        },
        ..PipelineConfig::default()
    };
    assert_eq!(
        unhealthy(&discover(&facts, &ignoring)),
        unhealthy(&default) - code43
    );
    let off = PipelineConfig {
        health: HealthChecks {
            enabled: false,
            ..HealthChecks::default()
        },
        ..PipelineConfig::default()
    };
    assert_eq!(unhealthy(&discover(&facts, &off)), 0);
}

#[test]
fn adapters_match_device_nodes_by_luid_then_by_pci_location_and_an_unmatched_one_is_skipped() {
    let d = run("adapter-match");
    // (LUID, instance ID of the device) for each device, written from the fixture.
    let got: Vec<(i64, &str)> = d
        .devices
        .iter()
        .map(|dev| (dev.luid, dev.instance_id.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (
                3001,
                r"PCI\VEN_10DE&DEV_2236&SUBSYS_148210DE&REV_A1\4&2B8AAE0E&0&0010"
            ),
            (
                3002,
                r"PCI\VEN_10DE&DEV_2236&SUBSYS_148210DE&REV_A1\4&1F0C3A58&0&0010"
            ),
            (
                3003,
                r"PCI\VEN_10DE&DEV_20B5&SUBSYS_153310DE&REV_A1\4&3A21D0B9&0&0010"
            ),
        ]
    );
    use dxdp_core::pipeline::matching::MatchedBy;
    let by: Vec<(i64, Option<MatchedBy>)> =
        d.matches.iter().map(|m| (m.luid, m.matched_by)).collect();
    assert_eq!(
        by,
        [
            (3001, Some(MatchedBy::Luid)),
            (3002, Some(MatchedBy::PciLocation)),
            (3003, Some(MatchedBy::PciLocation)),
            (3004, None),
            (3005, None),
        ]
    );
    let unmatched: Vec<(i64, ExclusionCode)> =
        d.excluded.iter().map(|e| (e.luid, e.code)).collect();
    assert_eq!(
        unmatched,
        [
            (3004, ExclusionCode::NoDeviceNode),
            (3005, ExclusionCode::SoftwareAdapter)
        ]
    );
    let warned: Vec<&dxdp_core::devices::Warning> = d
        .warnings
        .iter()
        .filter(|w| w.code == dxdp_core::devices::WarningCode::AdapterUnmatched)
        .collect();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].message.contains("LUID 0x00000000_0x00000BBC")
            && warned[0]
                .message
                .contains("no free device node is at its PCI location af:00.0"),
        "{}",
        warned[0].message
    );
}
