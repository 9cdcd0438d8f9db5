//! Container hints: environment variables and annotations that tell a container which devices it
//! was given, so an application can pick its adapter even though Windows may show a container
//! every GPU of the host.
//!
//! The variables (one entry per allocated physical device, request order, comma separated):
//! `DXDP_DEVICE_IDS`, `DXDP_ADAPTER_LUIDS` (decimal, see [`luid_decimal`]),
//! `DXDP_LOCATION_PATHS`, `DXDP_VENDOR`; opt-in `CUDA_VISIBLE_DEVICES` with
//! `CUDA_DEVICE_ORDER=PCI_BUS_ID`. The annotations carry the same lists under
//! `directx.microsoft.com/<resource>.<name>` (see `docs/allocation.md`).

use std::collections::BTreeMap;

use crate::devices::{Device, Resource};

use crate::vendor::NVIDIA;

/// The runtime files mounted into the container (container paths joined by `;`), set by
/// Allocate beside the hints so that `dxdp validate` can check each is there and loads.
pub const RUNTIME_FILES_VAR: &str = "DXDP_RUNTIME_FILES";

/// The domain of dxdp's annotation keys.
pub const ANNOTATION_DOMAIN: &str = "directx.microsoft.com";

/// The annotation key `directx.microsoft.com/<resource>.<name>`.
pub fn annotation_key(resource: Resource, name: &str) -> String {
    format!("{ANNOTATION_DOMAIN}/{}.{name}", resource.as_str())
}

/// A LUID as an application rebuilds it: the signed 64-bit `(HighPart << 32) | LowPart`, in
/// decimal. `LowPart` is the low 32 bits, `HighPart` the high 32 bits as a signed number.
pub fn luid_decimal(luid: i64) -> String {
    luid.to_string()
}

use crate::devices::CudaOrder;

impl CudaOrder {
    /// CUDA's index of a device, or why there is none.
    pub fn index(&self, device: &Device) -> Result<usize, String> {
        match self {
            CudaOrder::Unknown(why) => Err(why.clone()),
            CudaOrder::Known(order) => {
                let pci = device.pci.ok_or_else(|| {
                    format!("the PCI location of device {} is unknown", device.id)
                })?;
                order.iter().position(|p| *p == pci).ok_or_else(|| {
                    format!(
                        "device {} at PCI {pci} is not among the NVIDIA devices CUDA can see",
                        device.id
                    )
                })
            }
        }
    }
}

/// What the hints add to a container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hints {
    /// Environment variables.
    pub envs: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// Why an opt-in hint was left out.
    pub notes: Vec<String>,
}

/// The hints for the distinct physical devices of one container, in request order. With
/// `cuda` (the host's order, when `cudaVisibleDevices` is on) and NVIDIA devices among them,
/// `CUDA_VISIBLE_DEVICES` lists their CUDA indexes; it is left out (with a note) when any index is
/// unknown, because a wrong index would give the container someone else's GPU.
pub fn hints(resource: Resource, physical: &[&Device], cuda: Option<&CudaOrder>) -> Hints {
    let join =
        |f: &dyn Fn(&Device) -> String| physical.iter().map(|d| f(d)).collect::<Vec<_>>().join(",");
    let lists = [
        ("DXDP_DEVICE_IDS", "device-ids", join(&|d| d.id.clone())),
        (
            "DXDP_ADAPTER_LUIDS",
            "adapter-luids",
            join(&|d| luid_decimal(d.luid)),
        ),
        (
            "DXDP_LOCATION_PATHS",
            "location-paths",
            join(&|d| d.location_path.clone()),
        ),
        ("DXDP_VENDOR", "vendor", join(&|d| d.vendor.clone())),
    ];
    let mut out = Hints::default();
    for (env, annotation, value) in lists {
        out.envs.insert(env.to_string(), value.clone());
        out.annotations
            .insert(annotation_key(resource, annotation), value);
    }
    let Some(cuda) = cuda else {
        return out;
    };
    let nvidia: Vec<&Device> = physical
        .iter()
        .copied()
        .filter(|d| d.vendor_id == NVIDIA)
        .collect();
    if nvidia.is_empty() {
        return out;
    }
    match nvidia
        .iter()
        .map(|d| cuda.index(d))
        .collect::<Result<Vec<usize>, String>>()
    {
        Ok(indexes) => {
            let value = indexes
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(",");
            out.envs.insert("CUDA_VISIBLE_DEVICES".into(), value.clone());
            out.envs
                .insert("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into());
            out.annotations
                .insert(annotation_key(resource, "cuda-visible-devices"), value);
        }
        Err(why) => out.notes.push(format!(
            "CUDA_VISIBLE_DEVICES is not set: {why}; CUDA applications in this container may use any GPU of the node"
        )),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{AdapterFacts, Attribute, HardwareId, HostFacts, PciLocation, PnpFacts};

    /// An adapter of `vendor` with a device node at `bus` (none for `None`) and `problem`.
    fn adapter(vendor: u32, bus: Option<u32>, problem: u32, hardware: bool) -> AdapterFacts {
        AdapterFacts {
            hardware_id: HardwareId {
                vendor_id: vendor,
                ..HardwareId::default()
            },
            is_hardware: hardware,
            pnp: Some(PnpFacts {
                instance_id: format!("PCI\\VEN_{vendor:04X}\\{bus:?}"),
                problem_code: problem,
                pci: bus.map(|b| PciLocation::from_bus_and_address(b, 0)),
                ..PnpFacts::default()
            }),
            ..AdapterFacts::minimal(1, vec![Attribute::D3D12_CORE_COMPUTE])
        }
    }

    #[test]
    fn cuda_order_counts_working_nvidia_hardware_by_pci_bus() {
        let loc = |bus| PciLocation::from_bus_and_address(bus, 0);
        // (case, adapters, expected order or part of the reason)
        type Case = (
            &'static str,
            Vec<AdapterFacts>,
            Result<Vec<PciLocation>, &'static str>,
        );
        // DN_DRIVER_LOADED | DN_STARTED, and the same with DN_HAS_PROBLEM.
        let flags = |mut a: AdapterFacts, flags: u32| {
            if let Some(pnp) = a.pnp.as_mut() {
                pnp.status_flags = Some(flags);
            }
            a
        };
        let table: [Case; 7] = [
            ("no adapters", vec![], Ok(vec![])),
            (
                "sorted by bus, other vendors ignored",
                vec![
                    adapter(NVIDIA, Some(9), 0, true),
                    adapter(0x1002, Some(1), 0, true),
                    adapter(NVIDIA, Some(3), 0, true),
                ],
                Ok(vec![loc(3), loc(9)]),
            ),
            (
                "a device with a problem and a software adapter are not counted",
                vec![
                    adapter(NVIDIA, Some(9), 0, true),
                    adapter(NVIDIA, Some(3), 43, true),
                    adapter(NVIDIA, None, 0, false),
                ],
                Ok(vec![loc(9)]),
            ),
            (
                "a stale problem code without DN_HAS_PROBLEM is no problem; with it, it is",
                vec![
                    flags(adapter(NVIDIA, Some(9), 43, true), 0x0000_000A),
                    flags(adapter(NVIDIA, Some(3), 43, true), 0x0000_040A),
                    flags(adapter(NVIDIA, Some(5), 0, true), 0x0000_000A),
                ],
                Ok(vec![loc(5), loc(9)]),
            ),
            (
                "an unknown location makes the order unknown",
                vec![
                    adapter(NVIDIA, Some(9), 0, true),
                    adapter(NVIDIA, None, 0, true),
                ],
                Err("PCI location of NVIDIA device"),
            ),
            (
                "no device node",
                vec![AdapterFacts {
                    pnp: None,
                    ..adapter(NVIDIA, Some(1), 0, true)
                }],
                Err("has no device node"),
            ),
            (
                "two devices at one location",
                vec![
                    adapter(NVIDIA, Some(4), 0, true),
                    adapter(NVIDIA, Some(4), 0, true),
                ],
                Err("same PCI bus"),
            ),
        ];
        for (case, adapters, expected) in table {
            let facts = HostFacts {
                adapters,
                ..HostFacts::default()
            };
            match (CudaOrder::of(&facts), expected) {
                (CudaOrder::Known(got), Ok(want)) => assert_eq!(got, want, "{case}"),
                (CudaOrder::Unknown(why), Err(text)) => {
                    assert!(why.contains(text), "{case}: {why}")
                }
                (got, want) => panic!("{case}: got {got:?}, expected {want:?}"),
            }
        }
    }

    #[test]
    fn luids_are_the_signed_64_bit_value_in_decimal() {
        // (LowPart, HighPart, decimal)
        let table: [(u32, i32, &str); 4] = [
            (55027, 0, "55027"),
            (0xFFFF_FFFF, 0, "4294967295"),
            (0, 1, "4294967296"),
            (5, -1, "-4294967291"),
        ];
        for (low, high, text) in table {
            let luid = (i64::from(high) << 32) | i64::from(low);
            assert_eq!(luid_decimal(luid), text);
        }
    }
}
