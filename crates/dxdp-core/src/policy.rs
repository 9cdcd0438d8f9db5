//! Allocation policy settings of one resource: how preferred allocations choose devices, what
//! happens to a request for several devices, and which container hints are added.
//!
//! Plain data with their configuration spellings; the rules live in [`crate::preferred`],
//! [`crate::allocation`] and [`crate::hints`].

use serde::{Deserialize, Serialize};

/// How `GetPreferredAllocation` picks among physical devices shared by replicas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AllocationPolicy {
    /// The physical device with the fewest replicas in use: pods spread over the GPUs.
    #[default]
    Spread,
    /// The physical device with the most replicas in use that still has one free: fill one GPU
    /// before the next.
    Pack,
}

impl AllocationPolicy {
    /// Every policy, in the order the docs list them.
    pub const ALL: [AllocationPolicy; 2] = [AllocationPolicy::Spread, AllocationPolicy::Pack];

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            AllocationPolicy::Spread => "spread",
            AllocationPolicy::Pack => "pack",
        }
    }

    /// Parses the configuration spelling.
    pub fn parse(text: &str) -> Option<AllocationPolicy> {
        Self::ALL.into_iter().find(|p| p.as_str() == text.trim())
    }
}

/// What `Allocate` does with a request for more than one device ID.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MultiDevice {
    /// Allocate, log a warning and say so in an annotation.
    #[default]
    Warn,
    /// Refuse the request, saying why and what to request instead.
    Fail,
}

impl MultiDevice {
    /// Every option, in the order the docs list them.
    pub const ALL: [MultiDevice; 2] = [MultiDevice::Warn, MultiDevice::Fail];

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            MultiDevice::Warn => "warn",
            MultiDevice::Fail => "fail",
        }
    }

    /// Parses the configuration spelling.
    pub fn parse(text: &str) -> Option<MultiDevice> {
        Self::ALL.into_iter().find(|p| p.as_str() == text.trim())
    }
}

/// The allocation settings of one resource.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ResourcePolicy {
    /// `allocationPolicy`.
    pub allocation: AllocationPolicy,
    /// `multiDevice`.
    pub multi_device: MultiDevice,
    /// `cudaVisibleDevices`: set `CUDA_VISIBLE_DEVICES` for NVIDIA devices.
    pub cuda_visible_devices: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip_and_defaults_are_spread_and_warn() {
        for p in AllocationPolicy::ALL {
            assert_eq!(AllocationPolicy::parse(p.as_str()), Some(p));
        }
        for m in MultiDevice::ALL {
            assert_eq!(MultiDevice::parse(m.as_str()), Some(m));
        }
        assert_eq!(AllocationPolicy::parse("Spread"), None);
        assert_eq!(MultiDevice::parse("error"), None);
        let d = ResourcePolicy::default();
        assert_eq!(
            (d.allocation, d.multi_device, d.cuda_visible_devices),
            (AllocationPolicy::Spread, MultiDevice::Warn, false)
        );
    }
}
