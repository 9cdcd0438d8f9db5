//! Allocation: advertised device IDs (with replicas) and the container edits for an Allocate call.
//!
//! Pure functions over [`Discovery`]; the gRPC service only translates their results to the wire.
//! The contract with containerd on Windows (see `docs/allocation.md`): one
//! `vpci-location-path://<LocationPath>` device per physical device with empty container path
//! and permissions, and read-only single-file mounts of the runtime files that exist.

use std::collections::HashMap;

use crate::assignment::Assignment;
use crate::devices::{Device, Discovery, HealthState, Resource};
use crate::pipeline::ids;
use crate::quote::quote;

/// The device string of the class-GUID assignment mode: every display adapter of the node.
pub const DISPLAY_CLASS_DEVICE: &str = "class/5B45201D-F2F2-4F3B-85BB-30FF1F953599";

/// The most replicas (time-sliced shares) one physical device can be advertised as.
pub const MAX_REPLICAS: u32 = 64;

/// One device ID as advertised to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advertised {
    /// The kubelet device ID.
    pub id: String,
    /// The ID of the physical device it shares.
    pub physical_id: String,
    /// Health, inherited from the physical device.
    pub health: HealthState,
}

/// The ID of replica `k` of a physical device: the physical ID itself for replica 0, else
/// `<physical>-r<k>`. Raising or lowering the replica count keeps the IDs both counts share.
pub fn replica_id(physical_id: &str, k: u32) -> String {
    if k == 0 {
        physical_id.to_string()
    } else {
        format!("{physical_id}-r{k}")
    }
}

/// Every advertised ID of `resource`, `replicas` per physical device (at least 1).
pub fn advertise(discovery: &Discovery, resource: Resource, replicas: u32) -> Vec<Advertised> {
    let replicas = replicas.clamp(1, MAX_REPLICAS);
    discovery
        .devices_for(resource)
        .flat_map(|d| {
            (0..replicas).map(move |k| Advertised {
                id: replica_id(&d.id, k),
                physical_id: d.id.clone(),
                health: d.health.state,
            })
        })
        .collect()
}

/// Finds the physical device of an advertised ID.
pub fn resolve<'a>(
    discovery: &'a Discovery,
    resource: Resource,
    replicas: u32,
    id: &str,
) -> Option<&'a Device> {
    let replicas = replicas.clamp(1, MAX_REPLICAS);
    discovery.devices_for(resource).find(|d| {
        if id == d.id {
            return true;
        }
        id.strip_prefix(d.id.as_str())
            .and_then(|rest| rest.strip_prefix("-r"))
            .filter(|k| !k.starts_with('0') && k.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|k| k.parse::<u32>().ok())
            .is_some_and(|k| k >= 1 && k < replicas)
    })
}

/// What one container receives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerEdits {
    /// Device host paths (`vpci-location-path://...`), one per physical device, request order.
    pub devices: Vec<String>,
    /// Read-only file mounts.
    pub mounts: Vec<MountEdit>,
    /// Things to log: mount clashes, multi-device requests.
    pub notes: Vec<String>,
}

/// One read-only bind mount of a single file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEdit {
    /// `C:\Windows\System32\<file>` or `C:\Windows\SysWOW64\<file>`.
    pub container_path: String,
    /// The file in the host's driver store.
    pub host_path: String,
}

/// Why an Allocate request cannot be answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocationError {
    /// The request names no devices.
    #[error("the request names no devices")]
    Empty,
    /// An ID that can never be a device ID.
    #[error(
        "malformed device ID {}: device IDs are 1 to 63 characters of [A-Za-z0-9._-]",
        quote(.0)
    )]
    Malformed(String),
    /// An ID this resource does not advertise.
    #[error(
        "unknown device ID {} for {resource}: it is not advertised (now) by this plugin",
        quote(.id)
    )]
    Unknown {
        /// The ID.
        id: String,
        /// The resource name.
        resource: String,
    },
}

/// The container edits for one container's device IDs.
pub fn allocate(
    discovery: &Discovery,
    resource: Resource,
    replicas: u32,
    assignment: Assignment,
    ids_requested: &[String],
) -> Result<ContainerEdits, AllocationError> {
    if ids_requested.is_empty() {
        return Err(AllocationError::Empty);
    }
    let mut physical: Vec<&Device> = Vec::new();
    for id in ids_requested {
        if !ids::is_valid_kubelet_id(id) {
            return Err(AllocationError::Malformed(id.clone()));
        }
        let device =
            resolve(discovery, resource, replicas, id).ok_or_else(|| AllocationError::Unknown {
                id: id.clone(),
                resource: resource.default_resource_name().to_string(),
            })?;
        if !physical.iter().any(|d| d.id == device.id) {
            physical.push(device);
        }
    }
    let mut edits = container_edits(&physical);
    if assignment == Assignment::ClassGuid {
        edits.devices = vec![DISPLAY_CLASS_DEVICE.to_string()];
    } else if physical.len() > 1 {
        let names: Vec<&str> = physical.iter().map(|d| d.location_path.as_str()).collect();
        edits.notes.insert(0, format!(
            "the request spans {} physical devices ({}); containerd on Windows attaches only the first, because the kubelet keeps one device per container",
            physical.len(),
            names.join(", ")
        ));
    }
    Ok(edits)
}

/// The container edits for a set of distinct physical devices, in order: one device string each,
/// and read-only mounts of their existing runtime files, deduplicated by container path (first
/// device wins; clashes are noted).
pub fn container_edits(physical: &[&Device]) -> ContainerEdits {
    let mut edits = ContainerEdits::default();
    // lower-cased container path -> (index in mounts, device ID)
    let mut taken: HashMap<String, (usize, &str)> = HashMap::new();
    for device in physical {
        edits.devices.push(device.host_path());
        for (target, file) in device.runtime_files.iter() {
            if !file.exists {
                continue;
            }
            let container_path = format!(r"{}\{}", target.container_dir(), file.destination);
            let key = container_path.to_lowercase();
            if let Some((index, owner)) = taken.get(&key) {
                if edits.mounts[*index].host_path != file.host_path {
                    edits.notes.push(format!(
                        "mount clash at {container_path}: keeping {} from device {owner}, dropping {} from device {}",
                        edits.mounts[*index].host_path, file.host_path, device.id
                    ));
                }
                continue;
            }
            taken.insert(key, (edits.mounts.len(), device.id.as_str()));
            edits.mounts.push(MountEdit {
                container_path,
                host_path: file.host_path.clone(),
            });
        }
    }
    edits
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::{discover, PipelineConfig};

    fn sample() -> Discovery {
        let facts = crate::sample::sample_host().unwrap();
        discover(&facts, &PipelineConfig::default())
    }

    #[test]
    fn replica_ids_keep_the_physical_prefix_and_shared_ids() {
        let d = sample();
        let one: Vec<String> = advertise(&d, Resource::Display, 1)
            .into_iter()
            .map(|a| a.id)
            .collect();
        let three: Vec<String> = advertise(&d, Resource::Display, 3)
            .into_iter()
            .map(|a| a.id)
            .collect();
        assert_eq!(one.len(), 2);
        assert_eq!(three.len(), 6);
        for id in &one {
            assert!(three.contains(id), "{id} must survive raising replicas");
        }
        for a in advertise(&d, Resource::Display, 3) {
            assert!(a.id.starts_with(&a.physical_id));
            assert!(ids::is_valid_kubelet_id(&a.id));
        }
        let max = advertise(&d, Resource::Display, MAX_REPLICAS);
        assert!(max.iter().all(|a| a.id.len() <= 63));
    }

    #[test]
    fn resolve_accepts_only_advertised_replicas() {
        let d = sample();
        let phys = d.devices_for(Resource::Display).next().unwrap().id.clone();
        // (id, replicas, resolves)
        let table = [
            (phys.clone(), 1, true),
            (format!("{phys}-r1"), 1, false),
            (format!("{phys}-r1"), 2, true),
            (format!("{phys}-r2"), 2, false),
            (format!("{phys}-r01"), 4, false),
            (format!("{phys}-r"), 4, false),
            (format!("{phys}-rx"), 4, false),
            (format!("{phys}-r99999999999"), 4, false),
            ("nope".to_string(), 4, false),
        ];
        for (id, replicas, ok) in table {
            assert_eq!(
                resolve(&d, Resource::Display, replicas, &id).is_some(),
                ok,
                "{id} {replicas}"
            );
        }
        // A display device is unknown to the compute resource.
        assert!(resolve(&d, Resource::Compute, 1, &phys).is_none());
    }

    #[test]
    fn allocate_one_device_gives_one_spec_and_read_only_mounts_of_existing_files() {
        let d = sample();
        let dev = d.devices_for(Resource::Display).next().unwrap();
        let edits = allocate(
            &d,
            Resource::Display,
            2,
            Assignment::LocationPath,
            &[dev.id.clone(), replica_id(&dev.id, 1)],
        )
        .unwrap();
        assert_eq!(
            edits.devices,
            vec![format!("vpci-location-path://{}", dev.location_path)]
        );
        let existing = dev.runtime_files.iter().filter(|(_, f)| f.exists).count();
        assert_eq!(edits.mounts.len(), existing);
        assert!(edits
            .mounts
            .iter()
            .any(|m| m.container_path == r"C:\Windows\System32\nvcuda.dll"
                && m.host_path.ends_with(r"\nvcuda_loader64.dll")));
        assert!(edits
            .mounts
            .iter()
            .any(|m| m.container_path == r"C:\Windows\SysWOW64\nvcuda.dll"));
        assert!(edits.notes.is_empty(), "{:?}", edits.notes);
    }

    #[test]
    fn allocate_two_devices_warns_and_deduplicates_mounts() {
        let d = sample();
        let ids: Vec<String> = d
            .devices_for(Resource::Display)
            .map(|x| x.id.clone())
            .collect();
        let edits = allocate(&d, Resource::Display, 1, Assignment::LocationPath, &ids).unwrap();
        assert_eq!(edits.devices.len(), 2);
        let one = allocate(
            &d,
            Resource::Display,
            1,
            Assignment::LocationPath,
            &ids[..1],
        )
        .unwrap();
        assert_eq!(
            edits.mounts.len(),
            one.mounts.len(),
            "same files, first device wins"
        );
        assert!(edits
            .notes
            .iter()
            .any(|n| n.contains("attaches only the first")));
        // Same driver store: identical host paths are not a clash.
        assert!(!edits.notes.iter().any(|n| n.contains("clash")));
    }

    #[test]
    fn allocate_rejects_bad_ids() {
        let d = sample();
        type Check = fn(&AllocationError) -> bool;
        let table: [(&[&str], Check); 3] = [
            (&[], |e| *e == AllocationError::Empty),
            (&["has/slash"], |e| {
                matches!(e, AllocationError::Malformed(_))
            }),
            (&["pciroot-0-pci-9999-0000000000000000"], |e| {
                matches!(e, AllocationError::Unknown { .. })
            }),
        ];
        for (ids, check) in table {
            let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
            let err =
                allocate(&d, Resource::Display, 1, Assignment::LocationPath, &ids).unwrap_err();
            assert!(check(&err), "{ids:?}: {err}");
        }
    }

    #[test]
    fn errors_quote_a_bounded_prefix_of_the_id() {
        let d = sample();
        for len in [crate::quote::MAX_QUOTED + 1, 100_000, 3 << 20] {
            let id = "a".repeat(len);
            let err =
                allocate(&d, Resource::Display, 1, Assignment::LocationPath, &[id]).unwrap_err();
            assert!(matches!(err, AllocationError::Malformed(_)));
            let message = err.to_string();
            assert!(message.len() < 300, "{len}: {} bytes", message.len());
            assert!(message.contains(&format!("({len} bytes)")), "{message}");
        }
        // A short malformed ID and a well-formed but unknown ID are quoted whole.
        let short = "a".repeat(64);
        let err = allocate(
            &d,
            Resource::Display,
            1,
            Assignment::LocationPath,
            std::slice::from_ref(&short),
        )
        .unwrap_err();
        assert!(err.to_string().contains(&format!("{short:?}")), "{err}");
        let err = allocate(
            &d,
            Resource::Display,
            1,
            Assignment::LocationPath,
            &["nope".to_string()],
        )
        .unwrap_err();
        assert!(err.to_string().contains("\"nope\""), "{err}");
    }

    #[test]
    fn class_guid_assignment_gives_the_display_class_once() {
        let d = sample();
        let ids: Vec<String> = d
            .devices_for(Resource::Display)
            .map(|x| x.id.clone())
            .collect();
        let edits = allocate(&d, Resource::Display, 1, Assignment::ClassGuid, &ids).unwrap();
        assert_eq!(edits.devices, vec![DISPLAY_CLASS_DEVICE.to_string()]);
        assert!(!edits.mounts.is_empty());
        assert!(edits.notes.is_empty(), "{:?}", edits.notes);
    }

    #[test]
    fn clashing_mounts_keep_the_first_device_and_are_noted() {
        let mut d = sample();
        let mut other = d.devices[0].clone();
        other.id = "other-device".into();
        other.location_path = "PCIROOT(9)".into();
        for f in other.runtime_files.system32.iter_mut() {
            f.host_path = format!(r"D:\other\{}", f.source);
        }
        d.devices.push(other);
        let ids = vec![d.devices[0].id.clone(), "other-device".to_string()];
        let edits = allocate(&d, Resource::Display, 1, Assignment::LocationPath, &ids).unwrap();
        let cuda = edits
            .mounts
            .iter()
            .find(|m| m.container_path.ends_with(r"System32\nvcuda.dll"))
            .unwrap();
        assert!(!cuda.host_path.starts_with(r"D:\other"));
        assert!(edits
            .notes
            .iter()
            .any(|n| n.contains("mount clash") && n.contains("other-device")));
    }
}
