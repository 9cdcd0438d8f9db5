//! Per-adapter rules: capabilities, resource, vendor name and health.

use crate::devices::{Health, Resource};
use crate::facts::{AdapterFacts, Attribute};

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

/// Vendor name from the PCI vendor ID.
pub fn vendor_name(vendor_id: u32) -> String {
    match vendor_id {
        0x10DE => "nvidia".into(),
        0x1002 => "amd".into(),
        0x8086 => "intel".into(),
        0x1414 => "microsoft".into(),
        0x5143 => "qualcomm".into(),
        other => format!("pci-{other:04x}"),
    }
}

/// Health from the device node's problem code and the driver-update state.
pub fn health(problem_code: u32, driver_update_in_progress: bool) -> Health {
    if problem_code != 0 {
        let meaning = problem_meaning(problem_code)
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        return Health::unhealthy(format!(
            "device node has problem code {problem_code}{meaning}"
        ));
    }
    if driver_update_in_progress {
        return Health::unhealthy("driver update in progress");
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
            let h = health(code, updating);
            assert_eq!(h.state, state, "{code} {updating}");
            match reason {
                Some(r) => assert!(h.reason.as_deref().unwrap_or("").contains(r), "{h:?}"),
                None => assert_eq!(h.reason, None),
            }
        }
    }
}
