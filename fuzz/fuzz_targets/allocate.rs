//! Allocate request handling: device IDs of any bytes (decoded as the kubelet's protobuf strings
//! would be) against the sample host, with any replica count and assignment. Never a panic; an
//! answer names only advertised devices; malformed IDs are refused as such.
#![no_main]

use std::sync::OnceLock;

use dxdp_core::allocation::{self, AllocationError};
use dxdp_core::assignment::Assignment;
use dxdp_core::devices::{Discovery, Resource};
use dxdp_core::pipeline::{discover, ids, PipelineConfig};
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
    let replicas = u32::from(head >> 3) * 3; // 0..=93: below, at and above the limit
    let ids: Vec<String> = rest
        .split(|&b| b == b'\n')
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect();
    let d = discovery();
    for id in &ids {
        let _ = allocation::resolve(d, resource, replicas, id);
    }
    match allocation::allocate(d, resource, replicas, assignment, &ids) {
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
    }
});
