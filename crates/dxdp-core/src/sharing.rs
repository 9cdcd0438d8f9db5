//! GPU sharing: how one physical GPU becomes several kubelet device IDs ("shares").
//!
//! Time-slicing (replicas) and memory units are one model: a share is a replica with a size.
//! A GPU shared by replicas has `replicas` shares of no stated size; a GPU shared by memory has
//! `floor((dedicated memory - reserve) / unit)` shares of `unit` bytes each. Every share ID names
//! its physical device as a prefix, so a share ID always leads back to one GPU:
//!
//! - replica `k`: the physical ID for `k = 0`, else `<physical>-r<k>` ([`replica_id`]);
//! - memory unit `k`: `<physical>-m<k>` for every `k`, from 0 (a GPU shared by memory is never
//!   advertised whole, so no share is the bare physical ID).
//!
//! Physical IDs end in 16 hexadecimal digits ([`crate::pipeline::ids`]), so neither suffix can be
//! mistaken for part of one.

use std::collections::BTreeMap;

/// The most replicas (time-sliced shares) one physical device can be advertised as.
pub const MAX_REPLICAS: u32 = 64;

/// The ID of replica `k` of a physical device: the physical ID itself for replica 0, else
/// `<physical>-r<k>`. Raising or lowering the replica count keeps the IDs both counts share.
pub fn replica_id(physical_id: &str, k: u32) -> String {
    if k == 0 {
        physical_id.to_string()
    } else {
        format!("{physical_id}-r{k}")
    }
}

/// The most memory units one GPU is advertised as: at 1,024 a unit ID is at most 62 characters
/// (a 56-character physical ID, `-m`, 4 digits), and 8 such GPUs fit a ListAndWatch message of
/// well under a megabyte. Memory beyond `MAX_MEMORY_UNITS` units is not advertised.
pub const MAX_MEMORY_UNITS: u32 = 1024;

/// The smallest memory unit: 64 MiB.
pub const MIN_MEMORY_UNIT_BYTES: u64 = 64 << 20;

/// How a GPU class is shared: the sharing-strategy label's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Strategy {
    /// One container per GPU.
    None,
    /// Replicas: several containers take turns on the GPU, none with a stated memory share.
    TimeSlicing,
    /// Memory units: a container asks for memory, and its units all lie on one GPU.
    Memory,
}

impl Strategy {
    /// The label value: `none`, `time-slicing` or `memory`.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::None => "none",
            Strategy::TimeSlicing => "time-slicing",
            Strategy::Memory => "memory",
        }
    }
}

/// Memory sharing of one GPU class: units of `unit_bytes`, `reserve_bytes` kept back per GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemorySharing {
    /// The size of one unit (one device ID), at least [`MIN_MEMORY_UNIT_BYTES`].
    pub unit_bytes: u64,
    /// Dedicated memory kept back on every GPU (for the driver and the host).
    pub reserve_bytes: u64,
}

impl MemorySharing {
    /// The units of a GPU with `dedicated_bytes` of dedicated memory:
    /// `floor((dedicated - reserve) / unit)`, at most [`MAX_MEMORY_UNITS`]; 0 when the memory is
    /// unknown (0) or not more than the reserve.
    pub fn units(&self, dedicated_bytes: u64) -> u32 {
        if self.unit_bytes == 0 {
            return 0;
        }
        let units = dedicated_bytes.saturating_sub(self.reserve_bytes) / self.unit_bytes;
        u32::try_from(units)
            .unwrap_or(u32::MAX)
            .min(MAX_MEMORY_UNITS)
    }
}

/// How the GPUs of one class are shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sharing {
    /// Replicas per GPU (1 is not shared). Clamped to 1..=[`MAX_REPLICAS`].
    Replicas(u32),
    /// Memory units.
    Memory(MemorySharing),
}

impl Sharing {
    /// The strategy, for labels.
    pub fn strategy(&self) -> Strategy {
        match *self {
            Sharing::Replicas(n) if n.clamp(1, MAX_REPLICAS) == 1 => Strategy::None,
            Sharing::Replicas(_) => Strategy::TimeSlicing,
            Sharing::Memory(_) => Strategy::Memory,
        }
    }

    /// How many shares a GPU with `dedicated_bytes` of dedicated memory has.
    pub fn shares(&self, dedicated_bytes: u64) -> u32 {
        match *self {
            Sharing::Replicas(n) => n.clamp(1, MAX_REPLICAS),
            Sharing::Memory(m) => m.units(dedicated_bytes),
        }
    }

    /// The ID of share `k` of the physical device `physical_id`.
    pub fn share_id(&self, physical_id: &str, k: u32) -> String {
        match self {
            Sharing::Replicas(_) => replica_id(physical_id, k),
            Sharing::Memory(_) => memory_unit_id(physical_id, k),
        }
    }

    /// The bytes one share stands for: the unit for memory sharing, none for replicas.
    pub fn share_bytes(&self) -> Option<u64> {
        match self {
            Sharing::Replicas(_) => None,
            Sharing::Memory(m) => Some(m.unit_bytes),
        }
    }
}

/// What one served resource of a GPU class holds, and how it shares each of its GPUs.
///
/// A class shared by replicas is served as one resource (its name and aliases) with every GPU.
/// A class shared by memory is served as two: its memory resource, with every GPU that has at
/// least one unit, one ID per unit; and its own resource, with the GPUs that have no unit (too
/// little memory, or memory unknown), whole. No GPU is in both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Served {
    /// The class's own resource, the class shared as given.
    Class(Sharing),
    /// The class's memory resource.
    Memory(MemorySharing),
}

impl From<Sharing> for Served {
    /// A class's sharing as the resource that carries its shares: replicas on the class's own
    /// resource, memory units on the memory resource.
    fn from(sharing: Sharing) -> Self {
        match sharing {
            Sharing::Replicas(_) => Served::Class(sharing),
            Sharing::Memory(m) => Served::Memory(m),
        }
    }
}

impl Served {
    /// How many IDs a GPU with `dedicated_bytes` of dedicated memory has here (0: not served
    /// here).
    pub fn shares(&self, dedicated_bytes: u64) -> u32 {
        match *self {
            Served::Class(Sharing::Replicas(n)) => n.clamp(1, MAX_REPLICAS),
            Served::Class(Sharing::Memory(m)) => u32::from(m.units(dedicated_bytes) == 0),
            Served::Memory(m) => m.units(dedicated_bytes),
        }
    }

    /// The ID of share `k` of the physical device `physical_id`.
    pub fn share_id(&self, physical_id: &str, k: u32) -> String {
        match self {
            Served::Class(_) => replica_id(physical_id, k),
            Served::Memory(_) => memory_unit_id(physical_id, k),
        }
    }

    /// The share `id` names: its physical device ID and its number, if `id` has this
    /// resource's form (whether that GPU has share `k` is for the caller to check).
    pub fn parse_share_id<'a>(&self, id: &'a str) -> Option<(&'a str, u32)> {
        match self {
            Served::Memory(_) => parse_memory_unit_id(id),
            Served::Class(_) => match id.rsplit_once("-r") {
                Some((physical, k))
                    if !physical.is_empty()
                        && !k.is_empty()
                        && !k.starts_with('0')
                        && k.bytes().all(|b| b.is_ascii_digit()) =>
                {
                    Some((physical, k.parse().ok()?))
                }
                _ => Some((id, 0)),
            },
        }
    }

    /// The memory sharing, for the memory resource.
    pub fn memory(&self) -> Option<MemorySharing> {
        match self {
            Served::Memory(m) => Some(*m),
            Served::Class(_) => None,
        }
    }
}

/// The ID of memory unit `k` of a physical device: `<physical>-m<k>`.
pub fn memory_unit_id(physical_id: &str, k: u32) -> String {
    format!("{physical_id}-m{k}")
}

/// The physical device ID a memory unit ID names, with the unit's number; `None` for an ID that
/// is not `<physical>-m<k>` (`k` decimal, no leading zero unless 0).
pub fn parse_memory_unit_id(id: &str) -> Option<(&str, u32)> {
    let (physical, k) = id.rsplit_once("-m")?;
    if physical.is_empty()
        || k.is_empty()
        || (k.len() > 1 && k.starts_with('0'))
        || !k.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    Some((physical, k.parse().ok()?))
}

/// A container's memory share per physical device: the units among `ids` (memory unit IDs; any
/// other ID is ignored) counted per GPU, times `unit_bytes`. Duplicate IDs count once.
pub fn memory_share<'a>(
    ids: impl IntoIterator<Item = &'a str>,
    unit_bytes: u64,
) -> BTreeMap<String, u64> {
    let mut units: BTreeMap<String, std::collections::BTreeSet<u32>> = BTreeMap::new();
    for id in ids {
        if let Some((physical, k)) = parse_memory_unit_id(id) {
            units.entry(physical.to_string()).or_default().insert(k);
        }
    }
    units
        .into_iter()
        .map(|(physical, ks)| (physical, (ks.len() as u64).saturating_mul(unit_bytes)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const PHYS: &str = "pciroot-0-pci-0000-0000-0123456789abcdef";

    #[test]
    fn units_are_the_memory_above_the_reserve_in_whole_units() {
        let m = MemorySharing {
            unit_bytes: GIB,
            reserve_bytes: GIB,
        };
        assert_eq!(m.units(16 * GIB), 15);
        assert_eq!(m.units(16 * GIB + GIB / 2), 15);
        assert_eq!(m.units(GIB), 0);
        assert_eq!(m.units(0), 0);
        let fine = MemorySharing {
            unit_bytes: 64 << 20,
            reserve_bytes: 0,
        };
        // 80 GiB in 64 MiB units is 1,280: capped.
        assert_eq!(fine.units(80 * GIB), 1024);
        let quarter = MemorySharing {
            unit_bytes: 256 << 20,
            reserve_bytes: 0,
        };
        assert_eq!(quarter.units(80 * GIB), 320);
    }

    #[test]
    fn strategies_and_share_ids() {
        let mem = Sharing::Memory(MemorySharing {
            unit_bytes: GIB,
            reserve_bytes: 0,
        });
        assert_eq!(Sharing::Replicas(1).strategy().as_str(), "none");
        assert_eq!(Sharing::Replicas(0).strategy().as_str(), "none");
        assert_eq!(Sharing::Replicas(4).strategy().as_str(), "time-slicing");
        assert_eq!(mem.strategy().as_str(), "memory");
        assert_eq!(Sharing::Replicas(4).share_id(PHYS, 0), PHYS);
        assert_eq!(
            Sharing::Replicas(4).share_id(PHYS, 2),
            "pciroot-0-pci-0000-0000-0123456789abcdef-r2"
        );
        assert_eq!(
            mem.share_id(PHYS, 0),
            "pciroot-0-pci-0000-0000-0123456789abcdef-m0"
        );
        assert_eq!(mem.share_bytes(), Some(GIB));
        assert_eq!(Sharing::Replicas(4).share_bytes(), None);
        assert_eq!(Sharing::Replicas(200).shares(0), 64);
    }

    #[test]
    fn memory_unit_ids_parse_back() {
        assert_eq!(
            parse_memory_unit_id("pciroot-0-pci-0000-0000-0123456789abcdef-m12"),
            Some((PHYS, 12))
        );
        assert_eq!(
            parse_memory_unit_id("pciroot-0-pci-0000-0000-0123456789abcdef-m0"),
            Some((PHYS, 0))
        );
        for bad in [
            PHYS,
            "pciroot-0-pci-0000-0000-0123456789abcdef-r2",
            "pciroot-0-pci-0000-0000-0123456789abcdef-m",
            "pciroot-0-pci-0000-0000-0123456789abcdef-m01",
            "pciroot-0-pci-0000-0000-0123456789abcdef-m1x",
            "-m3",
            "",
        ] {
            assert_eq!(parse_memory_unit_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_containers_share_is_its_units_per_gpu() {
        let other = "pciroot-0-pci-0001-0000-fedcba9876543210";
        let ids = [
            "pciroot-0-pci-0000-0000-0123456789abcdef-m0",
            "pciroot-0-pci-0000-0000-0123456789abcdef-m3",
            "pciroot-0-pci-0000-0000-0123456789abcdef-m3",
            "pciroot-0-pci-0001-0000-fedcba9876543210-m7",
            "pciroot-0-pci-0001-0000-fedcba9876543210-r1",
        ];
        let share = memory_share(ids, 256 << 20);
        assert_eq!(share.len(), 2);
        assert_eq!(share[PHYS], 512 << 20);
        assert_eq!(share[other], 256 << 20);
    }
}
