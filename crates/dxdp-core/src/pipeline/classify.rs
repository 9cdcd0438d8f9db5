//! Per-adapter rules: hardware or software, capabilities, resource, vendor name and health.

use crate::devices::{Health, Resource};
use crate::facts::{AdapterFacts, AdapterProperty, Attribute, PnpFacts};
use crate::health::reason::Reason;
use crate::health::HealthPolicy;

/// Whether an adapter is treated as hardware, and why when DXCore did not say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HardwareVerdict {
    /// Treated as a hardware adapter.
    pub hardware: bool,
    /// Set when DXCore does not support `IsHardware` and the verdict is dxdp's inference.
    pub inferred: Option<String>,
}

/// DXCore's `IsHardware` when supported. When it is not, an adapter whose device node has a PCI
/// location path (`PCIROOT(…)`) is treated as hardware, anything else as software; either way
/// the verdict says it was inferred, so the pipeline warns instead of dropping it silently.
pub fn hardware(adapter: &AdapterFacts) -> HardwareVerdict {
    if !adapter.unsupported(AdapterProperty::IsHardware) {
        return HardwareVerdict {
            hardware: adapter.is_hardware,
            inferred: None,
        };
    }
    let pci = adapter.pnp.as_ref().and_then(|p| {
        p.location_paths
            .iter()
            .map(|l| l.trim())
            .find(|l| l.len() >= 8 && l[..8].eq_ignore_ascii_case("PCIROOT("))
    });
    match pci {
        Some(path) => HardwareVerdict {
            hardware: true,
            inferred: Some(format!(
                "DXCore does not support IsHardware for this adapter; treated as hardware because its device node has the PCI location path {path}"
            )),
        },
        None => HardwareVerdict {
            hardware: false,
            inferred: Some(
                "DXCore does not support IsHardware for this adapter and no device node with a PCI location path matches it; treated as a software adapter"
                    .into(),
            ),
        },
    }
}

/// D3D11 or D3D12 graphics.
pub fn supports_display(adapter: &AdapterFacts) -> bool {
    adapter.has(Attribute::D3D11_GRAPHICS) || adapter.has(Attribute::D3D12_GRAPHICS)
}

/// D3D12 core compute or generic ML. (The reference plugin tested D3D12_GRAPHICS here.)
pub fn supports_compute(adapter: &AdapterFacts) -> bool {
    adapter.has(Attribute::D3D12_CORE_COMPUTE) || adapter.has(Attribute::D3D12_GENERIC_ML)
}

/// `display` for D3D12 graphics adapters; `compute` for compute-capable adapters without any
/// graphics attribute (MCDM devices, NPUs); `None` otherwise.
pub fn resource(adapter: &AdapterFacts) -> Option<Resource> {
    if adapter.has(Attribute::D3D12_GRAPHICS) {
        Some(Resource::Display)
    } else if supports_compute(adapter) && !supports_display(adapter) {
        Some(Resource::Compute)
    } else {
        None
    }
}

/// Vendor name from the PCI vendor ID ([`crate::vendor::name`]).
pub fn vendor_name(vendor_id: u32) -> String {
    crate::vendor::name(vendor_id)
}

/// Health from the device node's status and the driver-update state. A status that could not be
/// read is unhealthy; the problem code counts only with `DN_HAS_PROBLEM` (or, in snapshots
/// without status flags, when it is not 0).
pub fn health(
    pnp: &PnpFacts,
    driver_update_in_progress: bool,
    ignore_codes: &[u32],
    policy: &HealthPolicy,
) -> Health {
    if let Some(error) = &pnp.status_error {
        if policy.condition_counts(Reason::StatusUnreadable) {
            return Health::unhealthy(
                Reason::StatusUnreadable,
                format!(
                    "the device node status cannot be read ({error}), so the device is not trusted"
                ),
            );
        }
    }
    let has_problem = pnp.has_problem();
    let ignored = pnp.problem_code != 0 && ignore_codes.contains(&pnp.problem_code);
    if has_problem && !ignored && policy.condition_counts(Reason::ProblemCode) {
        let code = pnp.problem_code;
        if code == 0 {
            return Health::unhealthy(
                Reason::ProblemCode,
                "device node reports a problem (DN_HAS_PROBLEM) without a problem code",
            );
        }
        let meaning = problem_meaning(code)
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        return Health::unhealthy(
            Reason::ProblemCode,
            format!("device node has problem code {code}{meaning}"),
        );
    }
    if driver_update_in_progress && policy.condition_counts(Reason::DriverUpdate) {
        return Health::unhealthy(Reason::DriverUpdate, "driver update in progress");
    }
    Health::healthy()
}

/// Short meanings of the CfgMgr problem codes seen on GPUs.
fn problem_meaning(code: u32) -> Option<&'static str> {
    Some(match code {
        1 => "CM_PROB_NOT_CONFIGURED (no driver configured)",
        3 => "CM_PROB_OUT_OF_MEMORY",
        10 => "CM_PROB_FAILED_START (the device cannot start)",
        12 => "CM_PROB_NORMAL_CONFLICT (not enough free resources)",
        14 => "CM_PROB_NEED_RESTART (restart the node)",
        18 => "CM_PROB_REINSTALL (reinstall the driver)",
        21 => "CM_PROB_WILL_BE_REMOVED",
        22 => "CM_PROB_DISABLED (the device is disabled)",
        24 => "CM_PROB_DEVICE_NOT_THERE",
        28 => "CM_PROB_FAILED_INSTALL (no driver installed)",
        31 => "CM_PROB_FAILED_ADD",
        43 => "CM_PROB_FAILED_POST_START (the driver reported a failure, often a crashed GPU)",
        45 => "CM_PROB_PHANTOM (not connected)",
        47 => "CM_PROB_HELD_FOR_EJECT",
        52 => "CM_PROB_UNSIGNED_DRIVER",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::HealthState;
    use Attribute::*;

    fn adapter(attributes: &[Attribute]) -> AdapterFacts {
        AdapterFacts::minimal(1, attributes.to_vec())
    }

    #[test]
    fn capabilities_and_resource() {
        // attributes, supportsDisplay, supportsCompute, resource
        let table: &[(&[Attribute], bool, bool, Option<Resource>)] = &[
            (
                &[D3D11_GRAPHICS, D3D12_GRAPHICS, D3D12_CORE_COMPUTE],
                true,
                true,
                Some(Resource::Display),
            ),
            (&[D3D12_GRAPHICS], true, false, Some(Resource::Display)),
            (&[D3D11_GRAPHICS], true, false, None),
            (&[D3D11_GRAPHICS, D3D12_CORE_COMPUTE], true, true, None),
            (&[D3D12_CORE_COMPUTE], false, true, Some(Resource::Compute)),
            (&[D3D12_GENERIC_ML], false, true, Some(Resource::Compute)),
            (
                &[D3D12_GENERIC_ML, D3D12_GENERIC_MEDIA],
                false,
                true,
                Some(Resource::Compute),
            ),
            (&[D3D12_GENERIC_MEDIA], false, false, None),
            (&[], false, false, None),
        ];
        for (attrs, display, compute, res) in table {
            let a = adapter(attrs);
            assert_eq!(supports_display(&a), *display, "{attrs:?}");
            assert_eq!(supports_compute(&a), *compute, "{attrs:?}");
            assert_eq!(resource(&a), *res, "{attrs:?}");
        }
    }

    #[test]
    fn vendor_names() {
        let table = [
            (0x10DE, "nvidia"),
            (0x1002, "amd"),
            (0x8086, "intel"),
            (0x1414, "microsoft"),
            (0x5143, "qualcomm"),
            (0x1AF4, "pci-1af4"),
            (0x12345, "pci-12345"),
        ];
        for (id, name) in table {
            assert_eq!(vendor_name(id), name);
        }
    }

    #[test]
    fn health_rules() {
        // (problem code, status flags, status error, driver update, state, reason fragment)
        let started = 0x0180_600A; // DN_DRIVER_LOADED | DN_STARTED | DN_DISABLEABLE | DN_NT_* (no DN_HAS_PROBLEM)
        let problem = 0x0180_240A; // DN_HAS_PROBLEM (0x400) set, DN_STARTED clear
        type Row<'a> = (
            u32,
            Option<u32>,
            Option<&'a str>,
            bool,
            HealthState,
            Option<&'a str>,
        );
        let table: &[Row] = &[
            (0, Some(started), None, false, HealthState::Healthy, None),
            // Stale problem numbers without DN_HAS_PROBLEM mean nothing.
            (43, Some(started), None, false, HealthState::Healthy, None),
            (43, Some(problem), None, false, HealthState::Unhealthy, Some("problem code 43: CM_PROB_FAILED_POST_START")),
            (0, Some(problem), None, false, HealthState::Unhealthy, Some("(DN_HAS_PROBLEM) without a problem code")),
            // A failed status call is never healthy, whatever else was recorded.
            (0, None, Some("CM_Get_DevNode_Status failed: CR_NO_SUCH_DEVINST (0xd)"), false, HealthState::Unhealthy, Some("status cannot be read (CM_Get_DevNode_Status failed: CR_NO_SUCH_DEVINST (0xd))")),
            (0, Some(started), Some("x"), false, HealthState::Unhealthy, Some("status cannot be read")),
            (0, Some(started), None, true, HealthState::Unhealthy, Some("driver update in progress")),
            // Older snapshots without status flags: a non-zero code is a problem.
            (22, None, None, false, HealthState::Unhealthy, Some("problem code 22")),
            (0, None, None, false, HealthState::Healthy, None),
        ];
        for (code, flags, error, updating, state, reason) in table {
            let pnp = PnpFacts {
                problem_code: *code,
                status_flags: *flags,
                status_error: error.map(str::to_string),
                ..PnpFacts::default()
            };
            let h = health(&pnp, *updating, &[], &HealthPolicy::default());
            assert_eq!(h.state, *state, "{code} {flags:?} {error:?}");
            match reason {
                Some(r) => assert!(h.reason.as_deref().unwrap_or("").contains(r), "{h:?}"),
                None => assert_eq!(h.reason, None),
            }
        }
    }

    #[test]
    fn hardware_when_is_hardware_is_unsupported() {
        let node = |paths: &[&str]| PnpFacts {
            instance_id: "PCI\\X".into(),
            location_paths: paths.iter().map(|p| p.to_string()).collect(),
            ..PnpFacts::default()
        };
        // (isHardware value, unsupported?, device node, hardware, inferred)
        let table: Vec<(bool, bool, Option<PnpFacts>, bool, bool)> = vec![
            (true, false, None, true, false),
            (
                false,
                false,
                Some(node(&["PCIROOT(0)#PCI(0100)"])),
                false,
                false,
            ),
            (
                false,
                true,
                Some(node(&["PCIROOT(0)#PCI(0100)"])),
                true,
                true,
            ),
            (
                false,
                true,
                Some(node(&["ACPI(_SB_)#ACPI(GPU0)", "pciroot(0)#pci(0200)"])),
                true,
                true,
            ),
            (
                true,
                true,
                Some(node(&["ACPI(_SB_)#ACPI(GPU0)"])),
                false,
                true,
            ),
            (true, true, Some(node(&[])), false, true),
            (false, true, None, false, true),
        ];
        for (value, unsupported, pnp, hw, inferred) in table {
            let mut a = AdapterFacts::minimal(1, vec![]);
            a.is_hardware = value;
            a.pnp = pnp.clone();
            if unsupported {
                a.unsupported_properties = vec![AdapterProperty::IsHardware];
            }
            let v = hardware(&a);
            assert_eq!(
                (v.hardware, v.inferred.is_some()),
                (hw, inferred),
                "{value} {unsupported} {pnp:?}"
            );
        }
    }

    #[test]
    fn old_health_table() {
        let table = [
            (0, false, HealthState::Healthy, None),
            (
                43,
                false,
                HealthState::Unhealthy,
                Some("problem code 43: CM_PROB_FAILED_POST_START"),
            ),
            (22, false, HealthState::Unhealthy, Some("problem code 22")),
            (999, false, HealthState::Unhealthy, Some("problem code 999")),
            (
                0,
                true,
                HealthState::Unhealthy,
                Some("driver update in progress"),
            ),
            (43, true, HealthState::Unhealthy, Some("problem code 43")),
        ];
        for (code, updating, state, reason) in table {
            let pnp = PnpFacts {
                problem_code: code,
                ..PnpFacts::default()
            };
            let h = health(&pnp, updating, &[], &HealthPolicy::default());
            assert_eq!(h.state, state, "{code} {updating}");
            match reason {
                Some(r) => assert!(h.reason.as_deref().unwrap_or("").contains(r), "{h:?}"),
                None => assert_eq!(h.reason, None),
            }
        }
    }

    #[test]
    fn ignored_problem_codes_do_not_make_a_device_unhealthy_but_other_conditions_still_do() {
        let problem = 0x0180_240A; // DN_HAS_PROBLEM set
                                   // (problem code, status error, driver update, ignored codes, healthy?)
        type Row<'a> = (u32, Option<&'a str>, bool, &'a [u32], bool);
        let table: [Row; 6] = [
            (43, None, false, &[43], true),
            (43, None, false, &[22], false),
            (22, None, false, &[22, 43], true),
            // Ignoring a code never hides a status that cannot be read or a driver update.
            (
                43,
                Some("CM_Get_DevNode_Status failed"),
                false,
                &[43],
                false,
            ),
            (43, None, true, &[43], false),
            (0, None, false, &[0], false),
        ];
        for (code, error, updating, ignore, healthy) in table {
            let pnp = PnpFacts {
                problem_code: code,
                status_flags: Some(problem),
                status_error: error.map(str::to_string),
                ..PnpFacts::default()
            };
            assert_eq!(
                health(&pnp, updating, ignore, &HealthPolicy::default()).is_healthy(),
                healthy,
                "{code} {error:?} {updating} {ignore:?}"
            );
        }
    }
}
