//! Rendering of discovery results for people (`dxdp discover`) and machines (`--json`).

use std::fmt::Write;

use dxdp_core::devices::{Device, Discovery, HealthState, RuntimeFile};
use dxdp_core::facts::OsFacts;

/// The `discover --json` document.
pub fn discovery_json(discovery: &Discovery) -> String {
    crate::output::to_json(&discovery_doc(discovery))
}

/// The `discover -o json|yaml` document.
pub fn discovery_doc(discovery: &Discovery) -> crate::output::DiscoveryDoc<'_> {
    crate::output::DiscoveryDoc {
        api_version: crate::output::ApiVersion,
        kind: crate::output::DiscoveryKind,
        devices: &discovery.devices,
        excluded: &discovery.excluded,
        warnings: &discovery.warnings,
        in_container: discovery.in_container,
    }
}

/// The human report: host, a table of the devices (with the index `mounts --index` takes),
/// the unhealthy devices and why, excluded adapters, warnings; with `details`, every device's
/// properties and runtime files after the table.
pub fn discovery_text(discovery: &Discovery, os: Option<&OsFacts>, details: bool) -> String {
    let mut out = String::new();
    if let Some(os) = os {
        let _ = writeln!(out, "Host: {}", clean(&os_line(os)));
    }
    // The total counts what the plugin advertises; devices that fit neither resource are shown
    // but counted apart.
    let advertised = discovery
        .devices
        .iter()
        .filter(|d| d.resource.is_some())
        .count();
    let shown_only = discovery.devices.len() - advertised;
    let _ = writeln!(
        out,
        "{advertised} device{}{}, {} excluded, {} warning{}",
        plural(advertised),
        if shown_only > 0 {
            format!(" (and {shown_only} not advertised)")
        } else {
            String::new()
        },
        discovery.excluded.len(),
        discovery.warnings.len(),
        plural(discovery.warnings.len()),
    );
    if discovery.in_container {
        out.push_str("Running inside a container: runtime files are not enumerated from here.\n");
    }
    if advertised == 0 {
        out.push_str("\nNo assignable DirectX devices were found on this host.\n");
    }
    if !discovery.devices.is_empty() {
        out.push('\n');
        out.push_str(&device_table(discovery));
    }
    let unhealthy: Vec<String> = discovery
        .devices
        .iter()
        .enumerate()
        .filter(|(_, d)| d.health.state != HealthState::Healthy)
        .map(|(i, d)| {
            let reason = d.health.reason.as_deref().unwrap_or("no reason given");
            clean(&format!("  - {i} {}: {reason}", d.id))
        })
        .collect();
    if !unhealthy.is_empty() {
        out.push_str("\nUnhealthy devices (advertised, not allocated until healthy):\n");
        for line in unhealthy {
            let _ = writeln!(out, "{line}");
        }
    }
    if details {
        for (i, device) in discovery.devices.iter().enumerate() {
            out.push('\n');
            device_text(&mut out, i, device);
        }
    }
    if !discovery.excluded.is_empty() {
        out.push_str("\nExcluded adapters:\n");
        for e in &discovery.excluded {
            let _ = writeln!(
                out,
                "  - {} (LUID {}): {}",
                e.description,
                luid_text(e.luid),
                e.reason
            );
        }
    }
    if !discovery.warnings.is_empty() {
        out.push_str("\nWarnings:\n");
        for w in &discovery.warnings {
            let _ = writeln!(out, "  - {} [{}]", clean(&w.message), w.code);
        }
    }
    if !details && !discovery.devices.is_empty() {
        out.push_str(
            "\nEvery property and runtime file: dxdp discover --details; flags for one device: dxdp mounts --index N\n",
        );
    }
    out
}

/// One line per device, numbered as `mounts --index` counts.
fn device_table(discovery: &Discovery) -> String {
    let mut rows = vec![[
        "INDEX",
        "ID",
        "RESOURCE",
        "HEALTH",
        "LUID",
        "MEMORY",
        "DESCRIPTION",
    ]
    .map(String::from)
    .to_vec()];
    for (i, d) in discovery.devices.iter().enumerate() {
        let memory = if d.dedicated_memory_bytes == 0 {
            "-".to_string()
        } else {
            memory_text(d.dedicated_memory_bytes).replace(" dedicated", "")
        };
        rows.push(vec![
            i.to_string(),
            clean(&d.id),
            d.resource.map_or("none".into(), |r| r.as_str().to_string()),
            d.health.state.as_str().to_string(),
            luid_text(d.luid),
            memory,
            clean(&d.description),
        ]);
    }
    crate::output::table(&rows)
}

fn device_text(out: &mut String, index: usize, d: &Device) {
    let resource = d
        .resource
        .map(|r| r.default_resource_name().to_string())
        .unwrap_or_else(|| "none (fits neither resource; not advertised)".into());
    let health = match &d.health.reason {
        Some(reason) => format!("{} ({}: {reason})", d.health.state.as_str(), d.health.code),
        None => d.health.state.as_str().to_string(),
    };
    let mut supports = Vec::new();
    if d.supports_display {
        supports.push("display");
    }
    if d.supports_compute {
        supports.push("compute");
    }
    let rows: Vec<(&str, String)> = vec![
        ("Description", d.description.clone()),
        (
            "Vendor",
            format!(
                "{} (vendor 0x{:04X}, device 0x{:04X}, subsystem 0x{:08X}, revision 0x{:02X})",
                d.vendor, d.vendor_id, d.device_id, d.sub_sys_id, d.revision
            ),
        ),
        ("LUID", luid_text(d.luid)),
        ("Location path", d.location_path.clone()),
        ("Instance ID", d.instance_id.clone()),
        (
            "Driver key",
            d.driver_key.clone().unwrap_or_else(|| "(none)".into()),
        ),
        ("Driver version", non_empty(&d.driver_version)),
        (
            "Driver store",
            d.driver_store_path
                .clone()
                .unwrap_or_else(|| "(unknown)".into()),
        ),
        ("Memory", memory_text(d.dedicated_memory_bytes)),
        (
            "D3D12 level",
            d.d3d12_feature_level
                .clone()
                .unwrap_or_else(|| "(unknown)".into()),
        ),
        ("Integrated", yes_no(d.is_integrated).into()),
        ("Detachable", yes_no(d.is_detachable).into()),
        (
            "Supports",
            if supports.is_empty() {
                "neither display nor compute".into()
            } else {
                supports.join(", ")
            },
        ),
        ("Resource", resource),
        ("Health", health),
    ];
    let _ = writeln!(out, "Device {index}: {}", clean(&d.id));
    for (label, value) in rows {
        let _ = writeln!(out, "  {:<16}{}", format!("{label}:"), clean(&value));
    }
    for (name, files) in [
        ("System32", &d.runtime_files.system32),
        ("SysWOW64", &d.runtime_files.syswow64),
    ] {
        let _ = writeln!(out, "  {name} runtime files ({}):", files.len());
        for f in files {
            let _ = writeln!(out, "    {}", clean(&runtime_file_text(f)));
        }
    }
}

fn runtime_file_text(f: &RuntimeFile) -> String {
    let mut notes = vec![f.origin.as_str()];
    if !f.exists {
        notes.push("missing on host, not mounted");
    }
    format!("{} => {}  [{}]", f.source, f.destination, notes.join(", "))
}

use dxdp_core::quote::clean;

/// One line describing the OS.
pub(crate) fn os_line(os: &OsFacts) -> String {
    let mut parts = Vec::new();
    parts.push(
        os.product_name
            .clone()
            .unwrap_or_else(|| "Windows (product unknown)".into()),
    );
    if let Some(v) = &os.display_version {
        parts.push(v.clone());
    }
    if let Some(b) = &os.build {
        parts.push(format!("build {b}"));
    }
    let mut line = parts.join(" ");
    if !os.hcs_schema_versions.is_empty() {
        let _ = write!(line, ", HCS schema {}", os.hcs_schema_versions.join(", "));
    }
    line
}

/// A LUID as every text of dxdp writes it (`0x00000000_0x006B8B86`, [`dxdp_core::luid`]).
pub(crate) fn luid_text(luid: i64) -> String {
    dxdp_core::luid::label(luid)
}

/// Bytes as GiB or MiB.
pub(crate) fn memory_text(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    if bytes == 0 {
        "no dedicated memory".into()
    } else if bytes >= GIB {
        format!("{:.1} GiB dedicated", bytes as f64 / GIB as f64)
    } else {
        format!("{:.1} MiB dedicated", bytes as f64 / MIB as f64)
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn non_empty(s: &str) -> String {
    if s.is_empty() {
        "(unknown)".into()
    } else {
        s.to_string()
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_escapes_control_and_bidi_characters() {
        let table = [
            ("plain Ünï 日本", "plain Ünï 日本"),
            ("a\nb", "a\\u{000a}b"),
            ("tab\there", "tab\\u{0009}here"),
            ("\u{202E}evil", "\\u{202e}evil"),
            ("\u{1b}[31mred", "\\u{001b}[31mred"),
        ];
        for (input, expected) in table {
            assert_eq!(clean(input), expected);
        }
    }

    #[test]
    fn luids_and_memory() {
        assert_eq!(luid_text(7048070), "0x00000000_0x006B8B86");
        assert_eq!(luid_text(-1), "0xFFFFFFFF_0xFFFFFFFF");
        assert_eq!(luid_text(1 << 32), "0x00000001_0x00000000");
        assert_eq!(memory_text(0), "no dedicated memory");
        assert_eq!(memory_text(512 << 20), "512.0 MiB dedicated");
        assert_eq!(memory_text(16106127360), "15.0 GiB dedicated");
    }
}
