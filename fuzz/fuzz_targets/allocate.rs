//! Allocate and GetPreferredAllocation request handling: device IDs of any bytes (decoded as the
//! kubelet's protobuf strings would be) against the sample host, with any replica count,
//! assignment, policy and allocation size. Never a panic; an answer names only advertised devices;
//! malformed IDs are refused as such; a preferred allocation is drawn from the available IDs.
#![no_main]

use std::sync::OnceLock;

use dxdp_core::allocation::{self, AllocationError};
use dxdp_core::assignment::Assignment;
use dxdp_core::devices::{Discovery, Resource};
use dxdp_core::pipeline::{discover, ids, PipelineConfig};
use dxdp_core::policy::{AllocationPolicy, MultiDevice, ResourcePolicy};
use dxdp_core::preferred;
use dxdp_core::sharing::{MemorySharing, Sharing};
use libfuzzer_sys::fuzz_target;

fn discovery() -> &'static Discovery {
    static D: OnceLock<Discovery> = OnceLock::new();
    D.get_or_init(|| {
        let facts = dxdp_core::sample::sample_host().expect("the built-in sample host parses");
        discover(&facts, &PipelineConfig::default())
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let resource = if head & 1 == 0 {
        Resource::Display
    } else {
        Resource::Compute
    };
    let assignment = match (head >> 1) % 3 {
        0 => Assignment::LocationPath,
        1 => Assignment::ClassGuid,
        _ => Assignment::Auto,
    };
    // Replicas 0..=93 (below, at and above the limit), or memory units of 64 MiB to 2 GiB with
    // up to 1 GiB kept back.
    let replicas = Sharing::Replicas(u32::from(head >> 3) * 3);
    let memory = Sharing::Memory(MemorySharing {
        unit_bytes: (64 << 20) << (head >> 3 & 7).min(5),
        reserve_bytes: u64::from(head >> 6) << 28,
    });
    let replicas = if head >> 3 & 1 == 1 { memory } else { replicas };
    let (&flags, rest) = rest.split_first().unwrap_or((&0, &[]));
    let policy = ResourcePolicy {
        allocation: AllocationPolicy::ALL[usize::from(flags & 1)],
        multi_device: MultiDevice::ALL[usize::from(flags >> 1 & 1)],
        cuda_visible_devices: flags & 4 == 4,
    };
    let size = i32::from(flags >> 3) - 4; // -4..=27
    let ids: Vec<String> = rest
        .split(|&b| b == b'\n')
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect();
    let d = discovery();
    for id in &ids {
        let _ = allocation::resolve(d, resource, replicas, id);
    }
    // The kubelet's preferred-allocation request: the first half available, the rest must-include.
    let (available, must_include) = ids.split_at(ids.len() / 2);
    let preferred = preferred::preferred_allocation(
        d,
        resource,
        replicas,
        policy.allocation,
        available,
        must_include,
        size,
    );
    for id in &preferred {
        assert!(
            available.contains(id) || must_include.contains(id),
            "preferred {id:?} was not offered"
        );
    }
    match allocation::allocate(
        d,
        resource,
        resource.default_resource_name(),
        replicas,
        assignment,
        &policy,
        &ids,
    ) {
        Ok(edits) => {
            assert!(!edits.devices.is_empty());
            for id in &ids {
                assert!(ids::is_valid_kubelet_id(id), "{id:?} accepted");
                assert!(allocation::resolve(d, resource, replicas, id).is_some());
            }
        }
        Err(AllocationError::Malformed(id)) => assert!(!ids::is_valid_kubelet_id(&id)),
        Err(AllocationError::Unknown { id, .. }) => {
            assert!(allocation::resolve(d, resource, replicas, &id).is_none())
        }
        Err(AllocationError::Empty) => assert!(ids.is_empty()),
        Err(AllocationError::MultiDevice(_)) => {
            assert_eq!(policy.multi_device, MultiDevice::Fail);
            assert!(ids.len() > 1);
        }
        Err(AllocationError::SpansGpus(_)) => {
            assert!(matches!(replicas, Sharing::Memory(_)));
            assert!(ids.len() > 1);
        }
    }
});
