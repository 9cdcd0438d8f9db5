//! Missing devices: the devices an operator expects per resource (`health.expectedDevices`,
//! or a row of the instance-type table) against the devices the host shows.
//!
//! A device counts as present when the pipeline found it for the resource and it did not leave
//! the host: one that vanished while a pod held it (health reason [`Reason::Removed`], kept
//! only so its holder is told) is missing. An Unhealthy device that is still there (a problem
//! code, a TDR) is present: it is reported as Unhealthy, not twice.

use std::collections::BTreeMap;

use serde::Serialize;

use super::reason::Reason;
use crate::devices::{Discovery, Resource, Warning, WarningCode};

/// One resource's expectation against what the host shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Count {
    /// The resource.
    pub resource: Resource,
    /// Devices expected.
    pub expected: u32,
    /// Devices present (found for the resource and not removed).
    pub found: u32,
}

impl Count {
    /// Devices missing: expected minus found, never below 0 (more than expected is no fault).
    pub fn missing(&self) -> u32 {
        self.expected.saturating_sub(self.found)
    }
}

/// The devices of `resource` in `discovery` that are present (not [`Reason::Removed`]).
pub fn present(discovery: &Discovery, resource: Resource) -> u32 {
    let n = discovery
        .devices_for(resource)
        .filter(|d| d.health.code != Reason::Removed)
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Every resource with an expectation, in resource order, with the devices found.
pub fn judge(discovery: &Discovery, expected: &BTreeMap<Resource, u32>) -> Vec<Count> {
    expected
        .iter()
        .map(|(&resource, &expected)| Count {
            resource,
            expected,
            found: present(discovery, resource),
        })
        .collect()
}

/// The message naming expected against found for the counts with devices missing (`None`:
/// none is missing), e.g. `display: 1 of 2 expected GPU(s) found`.
pub fn missing_message(counts: &[Count]) -> Option<String> {
    let each: Vec<String> = counts
        .iter()
        .filter(|c| c.missing() > 0)
        .map(|c| {
            format!(
                "{}: {} of {} expected GPU(s) found",
                c.resource, c.found, c.expected
            )
        })
        .collect();
    (!each.is_empty()).then(|| each.join("; "))
}

/// Adds a `gpu-missing` warning to `discovery` for each resource with devices missing (what
/// `dxdp discover` and `dxdp doctor` show).
pub fn warn_missing(discovery: &mut Discovery, expected: &BTreeMap<Resource, u32>) {
    for c in judge(discovery, expected) {
        if c.missing() > 0 {
            discovery.warnings.push(Warning::host(
                WarningCode::GpuMissing,
                format!(
                    "{} GPU(s) missing: {} of {} expected {} device(s) found (health.expectedDevices); a GPU the VM size should have is gone: see docs/alerts.md#dxdpgpumissing",
                    c.missing(),
                    c.found,
                    c.expected,
                    c.resource
                ),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::{Device, Health};

    fn device(id: &str, resource: Resource, code: Reason) -> Device {
        let facts = crate::sample::sample_host().unwrap();
        let d = crate::pipeline::discover(&facts, &crate::pipeline::PipelineConfig::default());
        let mut device = d.devices[0].clone();
        device.id = id.into();
        device.resource = Some(resource);
        device.health = if code == Reason::Healthy {
            Health::healthy()
        } else {
            Health::unhealthy(code, "test")
        };
        device
    }

    #[test]
    fn removed_devices_are_missing_unhealthy_ones_are_present() {
        let discovery = Discovery {
            devices: vec![
                device("a", Resource::Display, Reason::Healthy),
                device("b", Resource::Display, Reason::Removed),
                device("c", Resource::Display, Reason::ProblemCode),
                device("d", Resource::Compute, Reason::Healthy),
            ],
            ..Discovery::default()
        };
        let expected = BTreeMap::from([(Resource::Display, 3), (Resource::Compute, 0)]);
        let counts = judge(&discovery, &expected);
        assert_eq!(
            counts,
            vec![
                Count {
                    resource: Resource::Display,
                    expected: 3,
                    found: 2
                },
                Count {
                    resource: Resource::Compute,
                    expected: 0,
                    found: 1
                },
            ]
        );
        assert_eq!(counts[0].missing(), 1);
        assert_eq!(counts[1].missing(), 0, "more than expected is no fault");
        assert_eq!(
            missing_message(&counts).as_deref(),
            Some("display: 2 of 3 expected GPU(s) found")
        );
        let mut d = discovery.clone();
        warn_missing(&mut d, &expected);
        assert_eq!(d.warnings.len(), 1);
        assert_eq!(d.warnings[0].code, WarningCode::GpuMissing);
        assert!(d.warnings[0]
            .message
            .starts_with("1 GPU(s) missing: 2 of 3 expected display device(s) found"));
    }

    #[test]
    fn no_expectation_no_verdict() {
        let d = Discovery::default();
        assert!(judge(&d, &BTreeMap::new()).is_empty());
        assert_eq!(missing_message(&[]), None);
    }
}
