//! Allocation: advertised device IDs (with replicas) and the container edits for an Allocate call.
//!
//! Pure functions over [`Discovery`]; the gRPC service only translates their results to the wire.
//! The contract with containerd on Windows (see `docs/allocation.md`): one
//! `vpci-location-path://<LocationPath>` device per physical device with empty container path
//! and permissions, and read-only single-file mounts of the runtime files that exist, plus the
//! container hints of [`crate::hints`]. A request for several IDs follows the resource's
//! `multiDevice` option.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::assignment::Assignment;
use crate::devices::{Device, Discovery, HealthState, Resource};
use crate::hints;
use crate::pipeline::ids;
use crate::policy::{MultiDevice, ResourcePolicy};
use crate::quote::quote;
use crate::sharing::Served;

/// The device string of the class-GUID assignment mode: every display adapter of the node.
pub const DISPLAY_CLASS_DEVICE: &str = "class/5B45201D-F2F2-4F3B-85BB-30FF1F953599";

use crate::sharing::MAX_REPLICAS;

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

/// Every advertised ID of `resource` served as `served` (a class's
/// [`Sharing`](crate::sharing::Sharing), or a
/// [`Served`]): for each GPU it holds, [`Served::shares`] IDs.
pub fn advertise(
    discovery: &Discovery,
    resource: Resource,
    served: impl Into<Served>,
) -> Vec<Advertised> {
    let served = served.into();
    discovery
        .devices_for(resource)
        .flat_map(|d| {
            (0..served.shares(d.dedicated_memory_bytes)).map(move |k| Advertised {
                id: served.share_id(&d.id, k),
                physical_id: d.id.clone(),
                health: d.health.state,
            })
        })
        .collect()
}

/// Finds the physical device of an ID advertised for `resource` served as `served`, with the
/// share's number.
pub fn resolve_share<'a>(
    discovery: &'a Discovery,
    resource: Resource,
    served: impl Into<Served>,
    id: &str,
) -> Option<(&'a Device, u32)> {
    let served = served.into();
    let (physical, k) = served.parse_share_id(id)?;
    discovery
        .devices_for(resource)
        .find(|d| d.id == physical)
        .filter(|d| k < served.shares(d.dedicated_memory_bytes))
        .map(|d| (d, k))
}

/// Finds the physical device of an advertised ID (a replica or a memory unit, as `served`
/// says).
pub fn resolve<'a>(
    discovery: &'a Discovery,
    resource: Resource,
    served: impl Into<Served>,
    id: &str,
) -> Option<&'a Device> {
    resolve_share(discovery, resource, served, id).map(|(d, _)| d)
}

/// Finds the physical device of any ID dxdp may have advertised for `resource`, whatever the
/// configuration: a replica (up to [`MAX_REPLICAS`]) or a memory unit (up to
/// [`crate::sharing::MAX_MEMORY_UNITS`]). For tools that read IDs the kubelet handed out.
pub fn resolve_any<'a>(
    discovery: &'a Discovery,
    resource: Resource,
    id: &str,
) -> Option<&'a Device> {
    if let Some((physical, k)) = crate::sharing::parse_memory_unit_id(id) {
        if k < crate::sharing::MAX_MEMORY_UNITS {
            if let Some(d) = discovery.devices_for(resource).find(|d| d.id == physical) {
                return Some(d);
            }
        }
    }
    resolve(
        discovery,
        resource,
        Served::Class(crate::sharing::Sharing::Replicas(MAX_REPLICAS)),
        id,
    )
}

/// What one container receives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerEdits {
    /// Device host paths (`vpci-location-path://...`), one per physical device, request order.
    pub devices: Vec<String>,
    /// Read-only file mounts.
    pub mounts: Vec<MountEdit>,
    /// Environment variables (the container hints).
    pub envs: BTreeMap<String, String>,
    /// Annotations (the container hints, and the multi-device warning).
    pub annotations: BTreeMap<String, String>,
    /// Things to log: mount clashes, multi-device requests, hints left out.
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
    /// More than one ID while the resource's `multiDevice` option is `fail`.
    #[error("{0}")]
    MultiDevice(String),
    /// Memory units on more than one GPU: a container's memory share must lie on one GPU.
    #[error("{0}")]
    SpansGpus(String),
}

/// The container's memory share in bytes (units x unit size), set by Allocate for a memory
/// resource. Nothing enforces it on Windows: it tells the container what it may use.
pub const MEMORY_LIMIT_VAR: &str = "DXDP_GPU_MEMORY_LIMIT_BYTES";

/// The annotation that carries the memory share (`directx.microsoft.com/<class>.memory-limit-bytes`).
pub const MEMORY_LIMIT_ANNOTATION: &str = "memory-limit-bytes";

/// The annotation that carries the multi-device warning.
pub const MULTI_DEVICE_ANNOTATION: &str = "multi-device";

/// The container edits for one container's device IDs under the resource's `policy`; errors
/// name the resource as it is served (`served`: its configured name or the alias asked for).
pub fn allocate(
    discovery: &Discovery,
    resource: Resource,
    served: &str,
    sharing: impl Into<Served>,
    assignment: Assignment,
    policy: &ResourcePolicy,
    ids_requested: &[String],
) -> Result<ContainerEdits, AllocationError> {
    let sharing = sharing.into();
    if ids_requested.is_empty() {
        return Err(AllocationError::Empty);
    }
    let mut physical: Vec<&Device> = Vec::new();
    let mut distinct_ids: HashSet<&str> = HashSet::new();
    for id in ids_requested {
        if !ids::is_valid_kubelet_id(id) {
            return Err(AllocationError::Malformed(id.clone()));
        }
        let device =
            resolve(discovery, resource, sharing, id).ok_or_else(|| AllocationError::Unknown {
                id: id.clone(),
                resource: served.to_string(),
            })?;
        distinct_ids.insert(id);
        if !physical.iter().any(|d| d.id == device.id) {
            physical.push(device);
        }
    }
    if let Some(memory) = sharing.memory() {
        return allocate_units(
            discovery,
            resource,
            (served, memory),
            assignment,
            policy,
            distinct_ids.len(),
            &physical,
        );
    }
    let multi = multi_device_note(resource, assignment, distinct_ids.len(), &physical);
    if let (Some(note), MultiDevice::Fail) = (&multi, policy.multi_device) {
        return Err(AllocationError::MultiDevice(format!(
            "{note}; multiDevice is fail for {resource}: request 1 {served} per container (one container or pod per GPU)"
        )));
    }
    let mut edits = edits_with_hints(discovery, resource, assignment, policy, &physical);
    if let Some(note) = multi {
        edits.annotations.insert(
            hints::annotation_key(resource, MULTI_DEVICE_ANNOTATION),
            note.clone(),
        );
        edits.notes.insert(0, note);
    }
    Ok(edits)
}

/// The container edits and hints for the distinct physical devices of one container.
fn edits_with_hints(
    discovery: &Discovery,
    resource: Resource,
    assignment: Assignment,
    policy: &ResourcePolicy,
    physical: &[&Device],
) -> ContainerEdits {
    let mut edits = container_edits(physical);
    if assignment == Assignment::ClassGuid {
        edits.devices = vec![DISPLAY_CLASS_DEVICE.to_string()];
    }
    let cuda = policy.cuda_visible_devices.then_some(&discovery.cuda_order);
    let hints = hints::hints(resource, physical, cuda);
    edits.envs = hints.envs;
    // The runtime files mounted, for `dxdp validate` in the container (paths joined by `;`).
    if !edits.mounts.is_empty() {
        let files: Vec<&str> = edits
            .mounts
            .iter()
            .map(|m| m.container_path.as_str())
            .collect();
        edits
            .envs
            .insert(hints::RUNTIME_FILES_VAR.to_string(), files.join(";"));
    }
    edits.annotations = hints.annotations;
    edits.notes.extend(hints.notes);
    edits
}

/// The edits for `units` distinct memory units of a memory resource (`served` as named, with
/// its memory sharing) on `physical`: refused unless they all lie on one GPU; else that GPU,
/// its runtime files, the hints and the memory share ([`MEMORY_LIMIT_VAR`]). The resource's
/// `multiDevice` option is about several GPUs, which a memory resource never gives, so it does
/// not apply.
fn allocate_units(
    discovery: &Discovery,
    resource: Resource,
    (served, memory): (&str, crate::sharing::MemorySharing),
    assignment: Assignment,
    policy: &ResourcePolicy,
    units: usize,
    physical: &[&Device],
) -> Result<ContainerEdits, AllocationError> {
    if physical.len() > 1 {
        let gpus: Vec<&str> = physical.iter().map(|d| d.location_path.as_str()).collect();
        let most = discovery
            .devices_for(resource)
            .map(|d| memory.units(d.dedicated_memory_bytes))
            .max()
            .unwrap_or(0);
        return Err(AllocationError::SpansGpus(format!(
            "the request for {units} {served} units spans {} GPUs ({}): a container's memory units must all lie on one GPU. Request at most {most} units (the most one GPU of this node has; fewer while some are in use), or split the work over several containers; the kubelet follows dxdp's preferred allocation, which keeps a request on one GPU, whenever one GPU has the units free",
            physical.len(),
            gpus.join(", ")
        )));
    }
    let mut edits = edits_with_hints(discovery, resource, assignment, policy, physical);
    let bytes = (units as u64).saturating_mul(memory.unit_bytes).to_string();
    edits.annotations.insert(
        hints::annotation_key(resource, MEMORY_LIMIT_ANNOTATION),
        bytes.clone(),
    );
    edits.envs.insert(MEMORY_LIMIT_VAR.to_string(), bytes);
    Ok(edits)
}

/// What is wrong with a request for several IDs, if it is one: several physical devices (of
/// which containerd on Windows attaches only the first; class-guid gives every GPU anyway), or
/// several replicas of one device (merged into one device).
fn multi_device_note(
    resource: Resource,
    assignment: Assignment,
    ids: usize,
    physical: &[&Device],
) -> Option<String> {
    if physical.len() > 1 && assignment == Assignment::ClassGuid {
        Some(format!(
            "the request for {ids} {resource} devices spans {} physical devices; with class-guid assignment the container is given every display adapter of the node anyway",
            physical.len()
        ))
    } else if physical.len() > 1 {
        let names: Vec<&str> = physical.iter().map(|d| d.location_path.as_str()).collect();
        Some(format!(
            "the request for {ids} {resource} devices spans {} physical devices ({}); containerd on Windows attaches only the first, because the kubelet keeps one device per container",
            physical.len(),
            names.join(", ")
        ))
    } else if ids > 1 {
        let id = physical.first().map(|d| d.id.as_str()).unwrap_or_default();
        Some(format!(
            "the request for {ids} {resource} devices names {ids} replicas of one physical device ({id}); they are merged into one device, which gives the container no more of the GPU than one replica"
        ))
    } else {
        None
    }
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
    use crate::policy::ResourcePolicy;
    use crate::sharing::{replica_id, MemorySharing, Served, Sharing};

    fn sample() -> Discovery {
        let facts = crate::sample::sample_host().unwrap();
        discover(&facts, &PipelineConfig::default())
    }

    #[test]
    fn replica_ids_keep_the_physical_prefix_and_shared_ids() {
        let d = sample();
        let one: Vec<String> = advertise(&d, Resource::Display, Sharing::Replicas(1))
            .into_iter()
            .map(|a| a.id)
            .collect();
        let three: Vec<String> = advertise(&d, Resource::Display, Sharing::Replicas(3))
            .into_iter()
            .map(|a| a.id)
            .collect();
        assert_eq!(one.len(), 2);
        assert_eq!(three.len(), 6);
        for id in &one {
            assert!(three.contains(id), "{id} must survive raising replicas");
        }
        for a in advertise(&d, Resource::Display, Sharing::Replicas(3)) {
            assert!(a.id.starts_with(&a.physical_id));
            assert!(ids::is_valid_kubelet_id(&a.id));
        }
        let max = advertise(&d, Resource::Display, Sharing::Replicas(MAX_REPLICAS));
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
                resolve(&d, Resource::Display, Sharing::Replicas(replicas), &id).is_some(),
                ok,
                "{id} {replicas}"
            );
        }
        // A display device is unknown to the compute resource.
        assert!(resolve(&d, Resource::Compute, Sharing::Replicas(1), &phys).is_none());
    }

    #[test]
    fn allocate_one_device_gives_one_spec_and_read_only_mounts_of_existing_files() {
        let d = sample();
        let dev = d.devices_for(Resource::Display).next().unwrap();
        let edits = allocate(
            &d,
            Resource::Display,
            Resource::Display.default_resource_name(),
            Sharing::Replicas(2),
            Assignment::LocationPath,
            &ResourcePolicy::default(),
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
        assert_eq!(edits.notes.len(), 1, "{:?}", edits.notes);
        assert!(edits.notes[0].contains("merged into one device"));
    }

    #[test]
    fn allocate_two_devices_warns_and_deduplicates_mounts() {
        let d = sample();
        let ids: Vec<String> = d
            .devices_for(Resource::Display)
            .map(|x| x.id.clone())
            .collect();
        let edits = allocate(
            &d,
            Resource::Display,
            Resource::Display.default_resource_name(),
            Sharing::Replicas(1),
            Assignment::LocationPath,
            &ResourcePolicy::default(),
            &ids,
        )
        .unwrap();
        assert_eq!(edits.devices.len(), 2);
        let one = allocate(
            &d,
            Resource::Display,
            Resource::Display.default_resource_name(),
            Sharing::Replicas(1),
            Assignment::LocationPath,
            &ResourcePolicy::default(),
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
            let err = allocate(
                &d,
                Resource::Display,
                Resource::Display.default_resource_name(),
                Sharing::Replicas(1),
                Assignment::LocationPath,
                &ResourcePolicy::default(),
                &ids,
            )
            .unwrap_err();
            assert!(check(&err), "{ids:?}: {err}");
        }
    }

    #[test]
    fn errors_quote_a_bounded_prefix_of_the_id() {
        let d = sample();
        for len in [crate::quote::MAX_QUOTED + 1, 100_000, 3 << 20] {
            let id = "a".repeat(len);
            let err = allocate(
                &d,
                Resource::Display,
                Resource::Display.default_resource_name(),
                Sharing::Replicas(1),
                Assignment::LocationPath,
                &ResourcePolicy::default(),
                &[id],
            )
            .unwrap_err();
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
            Resource::Display.default_resource_name(),
            Sharing::Replicas(1),
            Assignment::LocationPath,
            &ResourcePolicy::default(),
            std::slice::from_ref(&short),
        )
        .unwrap_err();
        assert!(err.to_string().contains(&format!("{short:?}")), "{err}");
        let err = allocate(
            &d,
            Resource::Display,
            Resource::Display.default_resource_name(),
            Sharing::Replicas(1),
            Assignment::LocationPath,
            &ResourcePolicy::default(),
            &["nope".to_string()],
        )
        .unwrap_err();
        assert!(err.to_string().contains("\"nope\""), "{err}");
    }

    #[test]
    fn errors_name_the_resource_as_it_is_served() {
        let d = sample();
        let err = allocate(
            &d,
            Resource::Display,
            "example.com/gpu",
            Sharing::Replicas(1),
            Assignment::LocationPath,
            &ResourcePolicy::default(),
            &["nope".to_string()],
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown device ID \"nope\" for example.com/gpu: it is not advertised (now) by this plugin"
        );
        let ids: Vec<String> = d
            .devices_for(Resource::Display)
            .map(|dev| dev.id.clone())
            .collect();
        let fail = ResourcePolicy {
            multi_device: MultiDevice::Fail,
            ..ResourcePolicy::default()
        };
        let err = allocate(
            &d,
            Resource::Display,
            "microsoft.com/directx",
            Sharing::Replicas(1),
            Assignment::LocationPath,
            &fail,
            &ids,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.ends_with(
                "request 1 microsoft.com/directx per container (one container or pod per GPU)"
            ),
            "{err}"
        );
        assert!(!err.contains("directx.microsoft.com/display"), "{err}");
    }

    #[test]
    fn class_guid_assignment_gives_the_display_class_once() {
        let d = sample();
        let ids: Vec<String> = d
            .devices_for(Resource::Display)
            .map(|x| x.id.clone())
            .collect();
        let edits = allocate(
            &d,
            Resource::Display,
            Resource::Display.default_resource_name(),
            Sharing::Replicas(1),
            Assignment::ClassGuid,
            &ResourcePolicy::default(),
            &ids,
        )
        .unwrap();
        assert_eq!(edits.devices, vec![DISPLAY_CLASS_DEVICE.to_string()]);
        assert!(!edits.mounts.is_empty());
        assert_eq!(edits.notes.len(), 1, "{:?}", edits.notes);
        assert!(edits.notes[0].contains("every display adapter of the node anyway"));
    }

    const GIB: u64 = 1 << 30;

    /// 1 GiB units, 1 GiB kept back.
    fn memory() -> Sharing {
        Sharing::Memory(MemorySharing {
            unit_bytes: GIB,
            reserve_bytes: GIB,
        })
    }

    #[test]
    fn memory_units_are_advertised_per_gpu_and_resolve_to_it() {
        let d = sample();
        let [(a, _, _), (b, _, _)] = sample_displays();
        // An A10 of the sample host has 24,146,608,128 bytes (22.49 GiB): less the 1 GiB
        // reserve, 21 whole units of 1 GiB.
        let units = advertise(&d, Resource::Display, memory());
        assert_eq!(units.len(), 42);
        assert_eq!(units[0].id, format!("{a}-m0"));
        assert_eq!(units[20].id, format!("{a}-m20"));
        assert_eq!(units[21].id, format!("{b}-m0"));
        assert_eq!(units[41].id, format!("{b}-m20"));
        assert!(units.iter().all(|u| ids::is_valid_kubelet_id(&u.id)));
        assert!(units[..21].iter().all(|u| u.physical_id == a));
        // (ID, the physical device it resolves to)
        let table = [
            (format!("{a}-m0"), Some(&a)),
            (format!("{a}-m20"), Some(&a)),
            (format!("{b}-m7"), Some(&b)),
            (format!("{a}-m21"), None),
            (format!("{a}-m01"), None),
            (a.clone(), None),
            (format!("{a}-r1"), None),
            (format!("{a}-m99999999999"), None),
        ];
        for (id, expected) in &table {
            assert_eq!(
                resolve(&d, Resource::Display, memory(), id).map(|x| &x.id),
                *expected,
                "{id}"
            );
        }
        // The class's own resource holds the GPUs with no unit: none here, and both when the
        // reserve leaves no whole unit (22.49 GiB - 22 GiB).
        assert!(advertise(&d, Resource::Display, Served::Class(memory())).is_empty());
        let big_reserve = Sharing::Memory(MemorySharing {
            unit_bytes: GIB,
            reserve_bytes: 22 * GIB,
        });
        assert!(advertise(&d, Resource::Display, big_reserve).is_empty());
        let whole: Vec<String> = advertise(&d, Resource::Display, Served::Class(big_reserve))
            .into_iter()
            .map(|x| x.id)
            .collect();
        assert_eq!(whole, vec![a.clone(), b.clone()]);
        assert!(resolve(&d, Resource::Display, Served::Class(memory()), &a).is_none());
        assert!(resolve(&d, Resource::Display, Served::Class(big_reserve), &a).is_some());
        // Tools resolve both kinds whatever the configuration.
        let table = [
            (format!("{a}-m1023"), Some(&a)),
            (format!("{a}-m1024"), None),
            (format!("{b}-r63"), Some(&b)),
            (format!("{b}-r64"), None),
            (b.clone(), Some(&b)),
            ("nope-m1".to_string(), None),
        ];
        for (id, expected) in &table {
            assert_eq!(
                resolve_any(&d, Resource::Display, id).map(|x| &x.id),
                *expected,
                "{id}"
            );
        }
    }

    #[test]
    fn units_on_one_gpu_give_that_gpu_and_the_memory_share() {
        let d = sample();
        let [(a, _, path_a), _] = sample_displays();
        let fail = ResourcePolicy {
            multi_device: MultiDevice::Fail,
            ..ResourcePolicy::default()
        };
        let ids: Vec<String> = [0, 3, 5, 3].iter().map(|k| format!("{a}-m{k}")).collect();
        let edits = allocate(
            &d,
            Resource::Display,
            "directx.microsoft.com/display-memory",
            memory(),
            Assignment::LocationPath,
            &fail,
            &ids,
        )
        .unwrap();
        assert_eq!(
            edits.devices,
            vec![format!("vpci-location-path://{path_a}")]
        );
        // Three distinct units of 1 GiB.
        assert_eq!(edits.envs["DXDP_GPU_MEMORY_LIMIT_BYTES"], "3221225472");
        assert_eq!(
            edits.annotations["directx.microsoft.com/display.memory-limit-bytes"],
            "3221225472"
        );
        assert_eq!(edits.envs["DXDP_DEVICE_IDS"], a);
        assert!(edits.notes.is_empty(), "{:?}", edits.notes);
        let whole = allocate(
            &d,
            Resource::Display,
            Resource::Display.default_resource_name(),
            Sharing::Replicas(1),
            Assignment::LocationPath,
            &ResourcePolicy::default(),
            std::slice::from_ref(&a),
        )
        .unwrap();
        assert_eq!(
            edits.mounts, whole.mounts,
            "the GPU's runtime files, as for a whole GPU"
        );
        assert!(!whole.envs.contains_key("DXDP_GPU_MEMORY_LIMIT_BYTES"));
    }

    #[test]
    fn units_on_two_gpus_are_refused_saying_what_to_do() {
        let d = sample();
        let [(a, _, _), (b, _, _)] = sample_displays();
        let err = allocate(
            &d,
            Resource::Display,
            "directx.microsoft.com/display-memory",
            memory(),
            Assignment::LocationPath,
            &ResourcePolicy::default(),
            &[format!("{a}-m0"), format!("{a}-m1"), format!("{b}-m0")],
        )
        .unwrap_err();
        assert!(matches!(err, AllocationError::SpansGpus(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            "the request for 3 directx.microsoft.com/display-memory units spans 2 GPUs \
             (PCIROOT(0)#PCI(0100)#PCI(0000), PCIROOT(0)#PCI(0200)#PCI(0000)): a container's \
             memory units must all lie on one GPU. Request at most 21 units (the most one GPU \
             of this node has; fewer while some are in use), or split the work over several \
             containers; the kubelet follows dxdp's preferred allocation, which keeps a request \
             on one GPU, whenever one GPU has the units free"
        );
    }

    /// The sample host's display devices: (ID, LUID, location path), from the sample host file.
    fn sample_displays() -> [(String, &'static str, &'static str); 2] {
        [
            (
                ids::device_id("PCIROOT(0)#PCI(0100)#PCI(0000)"),
                "55027",
                "PCIROOT(0)#PCI(0100)#PCI(0000)",
            ),
            (
                ids::device_id("PCIROOT(0)#PCI(0200)#PCI(0000)"),
                "55311",
                "PCIROOT(0)#PCI(0200)#PCI(0000)",
            ),
        ]
    }

    #[test]
    fn multi_device_requests_follow_the_option() {
        let d = sample();
        let [(a, _, _), (b, _, _)] = sample_displays();
        let key = "directx.microsoft.com/display.multi-device";
        // (case, IDs, option, Ok(note contains) or Err(message contains))
        type Expect = Result<Option<&'static str>, &'static str>;
        let table: [(&str, Vec<String>, MultiDevice, Expect); 7] = [
            ("one ID", vec![a.clone()], MultiDevice::Warn, Ok(None)),
            ("one ID under fail", vec![a.clone()], MultiDevice::Fail, Ok(None)),
            ("the same ID twice", vec![a.clone(), a.clone()], MultiDevice::Fail, Ok(None)),
            (
                "two replicas, warn",
                vec![a.clone(), replica_id(&a, 1)],
                MultiDevice::Warn,
                Ok(Some("merged into one device")),
            ),
            (
                "two replicas, fail",
                vec![a.clone(), replica_id(&a, 1)],
                MultiDevice::Fail,
                Err("multiDevice is fail for display: request 1 directx.microsoft.com/display per container"),
            ),
            (
                "two devices, warn",
                vec![a.clone(), b.clone()],
                MultiDevice::Warn,
                Ok(Some("containerd on Windows attaches only the first")),
            ),
            (
                "two devices, fail",
                vec![b.clone(), a.clone()],
                MultiDevice::Fail,
                Err("spans 2 physical devices"),
            ),
        ];
        for (case, ids, multi_device, expect) in table {
            let policy = ResourcePolicy {
                multi_device,
                ..ResourcePolicy::default()
            };
            let got = allocate(
                &d,
                Resource::Display,
                Resource::Display.default_resource_name(),
                Sharing::Replicas(2),
                Assignment::LocationPath,
                &policy,
                &ids,
            );
            match (got, expect) {
                (Ok(edits), Ok(None)) => {
                    assert!(edits.notes.is_empty(), "{case}: {:?}", edits.notes);
                    assert!(!edits.annotations.contains_key(key), "{case}");
                }
                (Ok(edits), Ok(Some(text))) => {
                    assert!(edits.notes[0].contains(text), "{case}: {:?}", edits.notes);
                    assert!(edits.annotations[key].contains(text), "{case}");
                }
                (Err(AllocationError::MultiDevice(message)), Err(text)) => {
                    assert!(message.contains(text), "{case}: {message}");
                }
                (got, expect) => panic!("{case}: got {got:?}, expected {expect:?}"),
            }
        }
    }

    #[test]
    fn hints_name_the_devices_in_request_order() {
        let d = sample();
        let [(a, luid_a, path_a), (b, luid_b, path_b)] = sample_displays();
        let edits = allocate(
            &d,
            Resource::Display,
            Resource::Display.default_resource_name(),
            Sharing::Replicas(1),
            Assignment::LocationPath,
            &ResourcePolicy::default(),
            &[b.clone(), a.clone()],
        )
        .unwrap();
        let expected = [
            ("DXDP_DEVICE_IDS", "device-ids", format!("{b},{a}")),
            (
                "DXDP_ADAPTER_LUIDS",
                "adapter-luids",
                format!("{luid_b},{luid_a}"),
            ),
            (
                "DXDP_LOCATION_PATHS",
                "location-paths",
                format!("{path_b},{path_a}"),
            ),
            ("DXDP_VENDOR", "vendor", "nvidia,nvidia".to_string()),
        ];
        for (env, annotation, value) in &expected {
            assert_eq!(edits.envs.get(*env), Some(value), "{env}");
            assert_eq!(
                edits
                    .annotations
                    .get(&format!("directx.microsoft.com/display.{annotation}")),
                Some(value),
                "{annotation}"
            );
        }
        assert_eq!(
            edits.envs.len(),
            5,
            "no CUDA hints unless asked: {:?}",
            edits.envs
        );
        let files: Vec<&str> = edits.envs["DXDP_RUNTIME_FILES"].split(';').collect();
        assert_eq!(files.len(), edits.mounts.len());
        assert!(
            files.contains(&r"C:\Windows\System32\nvcuda.dll"),
            "{files:?}"
        );
    }

    #[test]
    fn cuda_visible_devices_follow_the_pci_order_of_every_nvidia_device() {
        // The sample host's NVIDIA devices by PCI bus: A100 (0x18, compute), A10 at PCI(0100)
        // (0x3b), A10 at PCI(0200) (0x5e). CUDA counts all three, advertised or not.
        let d = sample();
        let [(a, _, _), (b, _, _)] = sample_displays();
        let policy = ResourcePolicy {
            cuda_visible_devices: true,
            ..ResourcePolicy::default()
        };
        let table: [(Vec<String>, &str); 3] = [
            (vec![a.clone()], "1"),
            (vec![b.clone()], "2"),
            (vec![b.clone(), a.clone()], "2,1"),
        ];
        for (ids, expected) in table {
            let edits = allocate(
                &d,
                Resource::Display,
                Resource::Display.default_resource_name(),
                Sharing::Replicas(1),
                Assignment::LocationPath,
                &policy,
                &ids,
            )
            .unwrap();
            assert_eq!(edits.envs["CUDA_VISIBLE_DEVICES"], expected, "{ids:?}");
            assert_eq!(edits.envs["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
            assert_eq!(
                edits.annotations["directx.microsoft.com/display.cuda-visible-devices"],
                expected
            );
        }
        let compute = d.devices_for(Resource::Compute).next().unwrap().id.clone();
        let edits = allocate(
            &d,
            Resource::Compute,
            Resource::Compute.default_resource_name(),
            Sharing::Replicas(1),
            Assignment::LocationPath,
            &policy,
            &[compute],
        )
        .unwrap();
        assert_eq!(edits.envs["CUDA_VISIBLE_DEVICES"], "0");
    }

    #[test]
    fn cuda_visible_devices_are_left_out_when_the_order_is_unknown() {
        let mut facts = crate::sample::sample_host().unwrap();
        // The A100's PCI location is unknown: the A10s' indexes are unknown too.
        let a100 = facts
            .adapters
            .iter_mut()
            .find(|x| x.driver_description.contains("A100"))
            .unwrap();
        a100.pnp.as_mut().unwrap().pci = None;
        let d = discover(&facts, &PipelineConfig::default());
        let [(a, _, _), _] = sample_displays();
        let policy = ResourcePolicy {
            cuda_visible_devices: true,
            ..ResourcePolicy::default()
        };
        let edits = allocate(
            &d,
            Resource::Display,
            Resource::Display.default_resource_name(),
            Sharing::Replicas(1),
            Assignment::LocationPath,
            &policy,
            &[a],
        )
        .unwrap();
        assert!(!edits.envs.contains_key("CUDA_VISIBLE_DEVICES"));
        assert!(!edits.envs.contains_key("CUDA_DEVICE_ORDER"));
        assert!(edits.envs.contains_key("DXDP_ADAPTER_LUIDS"));
        assert!(
            edits
                .notes
                .iter()
                .any(|n| n.contains("CUDA_VISIBLE_DEVICES is not set")
                    && n.contains("PCI location of NVIDIA device")),
            "{:?}",
            edits.notes
        );
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
        let edits = allocate(
            &d,
            Resource::Display,
            Resource::Display.default_resource_name(),
            Sharing::Replicas(1),
            Assignment::LocationPath,
            &ResourcePolicy::default(),
            &ids,
        )
        .unwrap();
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
