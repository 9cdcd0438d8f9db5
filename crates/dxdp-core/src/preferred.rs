//! Preferred allocation: which advertised IDs the kubelet should give a container
//! (`GetPreferredAllocation`).
//!
//! Rules, in priority order (see `docs/allocation.md`):
//!
//! 1. Only IDs from the available list, each once; unknown IDs are ignored. Every
//!    must-include ID that is available is returned.
//! 2. Exactly `allocation_size` IDs when that many are available (fewer when not; the kubelet fills
//!    the rest itself).
//! 3. As few physical devices as possible.
//! 4. Among those, devices of one vendor and driver version when that is possible.
//! 5. Then the policy: `spread` takes the physical device with the fewest replicas in use, `pack`
//!    the one with the most. "In use" is seen from the request: the device's replicas that are not
//!    in the available list. Ties go to the device first in location-path order.
//!
//! A memory resource ([`Served::Memory`]) keeps a request on one GPU instead ([`select_one_gpu`]):
//! all of a request's units come from the GPU that fits best by the policy, `pack` the fitting
//! GPU with the fewest free units, `spread` the one with the most (ties again by location-path
//! order); must-include IDs are kept and their GPU filled first. When no GPU has the units free,
//! the answer is the most one GPU has, fewer than asked: the kubelet fills the rest from other
//! GPUs and Allocate then refuses the request, saying why.

use std::cmp::Reverse;
use std::collections::{HashMap, HashSet};

use crate::allocation;
use crate::devices::{Discovery, Resource};
use crate::policy::AllocationPolicy;
use crate::sharing::Served;

/// One physical device as the policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolDevice {
    /// The physical device ID.
    pub physical_id: String,
    /// Devices of one group can be mixed freely (same vendor and driver version).
    pub group: String,
    /// Every advertised ID of the device (its replicas or memory units), share 0 first.
    pub share_ids: Vec<String>,
}

/// The physical devices of `resource` with their advertised IDs, in advertising order.
pub fn pool(
    discovery: &Discovery,
    resource: Resource,
    served: impl Into<Served>,
) -> Vec<PoolDevice> {
    let mut out: Vec<PoolDevice> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for a in allocation::advertise(discovery, resource, served) {
        let i = *index.entry(a.physical_id.clone()).or_insert_with(|| {
            let group = discovery
                .device(&a.physical_id)
                .map(|d| format!("{:04x}/{}", d.vendor_id, d.driver_version))
                .unwrap_or_default();
            out.push(PoolDevice {
                physical_id: a.physical_id.clone(),
                group,
                share_ids: Vec::new(),
            });
            out.len() - 1
        });
        out[i].share_ids.push(a.id);
    }
    out
}

/// The preferred IDs for one container of `resource`.
pub fn preferred_allocation(
    discovery: &Discovery,
    resource: Resource,
    served: impl Into<Served>,
    policy: AllocationPolicy,
    available: &[String],
    must_include: &[String],
    size: i32,
) -> Vec<String> {
    let served = served.into();
    let pool = pool(discovery, resource, served);
    if served.memory().is_some() {
        select_one_gpu(&pool, policy, available, must_include, size)
    } else {
        select(&pool, policy, available, must_include, size)
    }
}

/// A memory resource's policy over a pool: every ID of the answer on one GPU (see the module
/// documentation). Must-include IDs on several GPUs are all kept (the kubelet needs them), and
/// the rest is taken from the one of their GPUs the policy prefers; Allocate then refuses the
/// request.
pub fn select_one_gpu(
    pool: &[PoolDevice],
    policy: AllocationPolicy,
    available: &[String],
    must_include: &[String],
    size: i32,
) -> Vec<String> {
    let (owner, available) = index(pool, available);
    let mut chosen: Vec<&str> = Vec::new();
    let mut taken: HashSet<&str> = HashSet::new();
    for id in must_include {
        if available.contains(id.as_str()) && taken.insert(id) {
            chosen.push(id);
        }
    }
    let want = usize::try_from(size).unwrap_or(0).min(available.len());
    if chosen.len() >= want {
        return chosen.into_iter().map(String::from).collect();
    }
    // Per device: its available IDs not yet taken, in advertising order.
    let free: Vec<Vec<&str>> = pool
        .iter()
        .map(|dev| {
            dev.share_ids
                .iter()
                .map(String::as_str)
                .filter(|id| available.contains(id) && !taken.contains(id))
                .collect()
        })
        .collect();
    let need = want - chosen.len();
    let mut must_gpus: Vec<usize> = chosen.iter().map(|id| owner[id]).collect();
    must_gpus.sort_unstable();
    must_gpus.dedup();
    // The GPUs to choose from: the must-include IDs' GPUs, else those with the units free,
    // else (none fits) every GPU, the one with the most free units winning.
    let (candidates, policy) = if !must_gpus.is_empty() {
        (must_gpus, policy)
    } else {
        let fitting: Vec<usize> = (0..pool.len()).filter(|d| free[*d].len() >= need).collect();
        if fitting.is_empty() {
            ((0..pool.len()).collect(), AllocationPolicy::Spread)
        } else {
            (fitting, policy)
        }
    };
    let best = candidates.into_iter().min_by_key(|d| match policy {
        AllocationPolicy::Pack => (free[*d].len(), *d),
        AllocationPolicy::Spread => (usize::MAX - free[*d].len(), *d),
    });
    if let Some(d) = best {
        chosen.extend(free[d].iter().take(need));
    }
    chosen.into_iter().map(String::from).collect()
}

/// The policy over a pool (see the module documentation for the rules).
pub fn select(
    pool: &[PoolDevice],
    policy: AllocationPolicy,
    available: &[String],
    must_include: &[String],
    size: i32,
) -> Vec<String> {
    let (owner, available) = index(pool, available);
    // Per device: its available IDs in advertising order, and its replicas in use.
    let mut free: Vec<Vec<&str>> = vec![Vec::new(); pool.len()];
    let mut seen: HashSet<&str> = HashSet::new();
    for (d, dev) in pool.iter().enumerate() {
        for id in &dev.share_ids {
            if available.contains(id.as_str()) && seen.insert(id) {
                free[d].push(id);
            }
        }
    }
    let in_use: Vec<usize> = pool
        .iter()
        .zip(&free)
        .map(|(dev, f)| dev.share_ids.len().saturating_sub(f.len()))
        .collect();
    let preference = |d: &usize| match policy {
        AllocationPolicy::Spread => (in_use[*d], Reverse(0), *d),
        AllocationPolicy::Pack => (0, Reverse(in_use[*d]), *d),
    };

    let mut chosen: Vec<&str> = Vec::new();
    let mut taken: HashSet<&str> = HashSet::new();
    for id in must_include {
        if available.contains(id.as_str()) && taken.insert(id) {
            chosen.push(id);
        }
    }
    let want = usize::try_from(size).unwrap_or(0).min(available.len());
    if chosen.len() >= want {
        return chosen.into_iter().map(String::from).collect();
    }
    let mut need = want - chosen.len();
    let spare =
        |d: usize, taken: &HashSet<&str>| free[d].iter().filter(|id| !taken.contains(*id)).count();

    // 1. The devices the must-include IDs already use cost no extra device.
    let mut base: Vec<usize> = Vec::new();
    for id in &chosen {
        let d = owner[id];
        if !base.contains(&d) {
            base.push(d);
        }
    }
    base.sort_by_key(preference);
    for &d in &base {
        let n = spare(d, &taken).min(need);
        take(&free[d], n, &mut taken, &mut chosen);
        need -= n;
    }
    if need == 0 {
        return chosen.into_iter().map(String::from).collect();
    }

    // 2. The fewest further devices, of the must-include devices' group (or one group) if possible.
    let spares: Vec<usize> = (0..pool.len()).map(|d| spare(d, &taken)).collect();
    let candidates: Vec<usize> = (0..pool.len())
        .filter(|d| !base.contains(d) && spares[*d] > 0)
        .collect();
    let Some(fewest) = fewest_devices(candidates.iter().map(|d| spares[*d]), need) else {
        // Unreachable while `want` is at most the number of available IDs; stay total anyway.
        return chosen.into_iter().map(String::from).collect();
    };
    let base_groups: HashSet<&str> = base.iter().map(|d| pool[*d].group.as_str()).collect();
    let mut groups: Vec<&str> = Vec::new();
    for d in &candidates {
        let g = pool[*d].group.as_str();
        let fits = base_groups.is_empty() || (base_groups.len() == 1 && base_groups.contains(g));
        if fits && !groups.contains(&g) {
            groups.push(g);
        }
    }
    let mut best: Option<Vec<usize>> = None;
    for group in groups {
        let in_group: Vec<usize> = candidates
            .iter()
            .copied()
            .filter(|d| pool[*d].group == group)
            .collect();
        let Some(picked) = pick(&in_group, &spares, fewest, need, preference) else {
            continue;
        };
        let better = match &best {
            None => true,
            Some(current) => preference(&picked[0]) < preference(&current[0]),
        };
        if better {
            best = Some(picked);
        }
    }
    let picked = best
        .or_else(|| pick(&candidates, &spares, fewest, need, preference))
        .unwrap_or_default();
    for d in picked {
        let n = spares[d].min(need);
        take(&free[d], n, &mut taken, &mut chosen);
        need -= n;
    }
    chosen.into_iter().map(String::from).collect()
}

/// Which device owns each advertised ID, and the available IDs the pool knows (unknown ones
/// are ignored).
fn index<'a>(
    pool: &'a [PoolDevice],
    available: &'a [String],
) -> (HashMap<&'a str, usize>, HashSet<&'a str>) {
    let owner: HashMap<&str, usize> = pool
        .iter()
        .enumerate()
        .flat_map(|(d, dev)| dev.share_ids.iter().map(move |id| (id.as_str(), d)))
        .collect();
    let available: HashSet<&str> = available
        .iter()
        .map(String::as_str)
        .filter(|id| owner.contains_key(id))
        .collect();
    (owner, available)
}

/// Moves the first `n` IDs of `free` not yet taken to `chosen`.
fn take<'a>(free: &[&'a str], n: usize, taken: &mut HashSet<&'a str>, chosen: &mut Vec<&'a str>) {
    let ids: Vec<&str> = free
        .iter()
        .copied()
        .filter(|id| !taken.contains(id))
        .take(n)
        .collect();
    for id in ids {
        taken.insert(id);
        chosen.push(id);
    }
}

/// The fewest items of `spares` whose sum reaches `need` (largest first), if they can.
fn fewest_devices(spares: impl Iterator<Item = usize>, need: usize) -> Option<usize> {
    let mut sorted: Vec<usize> = spares.collect();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let mut sum = 0usize;
    for (k, s) in sorted.iter().enumerate() {
        sum += s;
        if sum >= need {
            return Some(k + 1);
        }
    }
    None
}

/// `count` devices of `candidates` whose spare IDs reach `need`, each the most preferred that
/// keeps the rest feasible; `None` when no `count` of them reach `need`.
fn pick<K: Ord>(
    candidates: &[usize],
    spares: &[usize],
    count: usize,
    need: usize,
    preference: impl Fn(&usize) -> K,
) -> Option<Vec<usize>> {
    let mut rest: Vec<usize> = candidates.to_vec();
    rest.sort_by_key(&preference);
    let top = |rest: &[usize], skip: usize, slots: usize| -> usize {
        let mut s: Vec<usize> = rest
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != skip)
            .map(|(_, d)| spares[*d])
            .collect();
        s.sort_unstable_by(|a, b| b.cmp(a));
        s.into_iter().take(slots).sum()
    };
    let mut out = Vec::new();
    let mut need = need;
    for step in 0..count {
        let slots = count - step - 1;
        let i = (0..rest.len()).find(|&i| {
            let after = need.saturating_sub(spares[rest[i]]);
            top(&rest, i, slots) >= after
        })?;
        let d = rest.remove(i);
        need = need.saturating_sub(spares[d]);
        out.push(d);
    }
    (need == 0).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharing::{MemorySharing, Sharing};
    use proptest::prelude::*;

    /// Devices `a`, `b`, ... with the given groups and `replicas` IDs each (`a`, `a-r1`, ...).
    fn devices(groups: &[&str], replicas: u32) -> Vec<PoolDevice> {
        groups
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let id = ((b'a' + i as u8) as char).to_string();
                PoolDevice {
                    share_ids: (0..replicas)
                        .map(|k| crate::sharing::replica_id(&id, k))
                        .collect(),
                    physical_id: id,
                    group: g.to_string(),
                }
            })
            .collect()
    }

    fn strings(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    fn sorted(mut v: Vec<String>) -> Vec<String> {
        v.sort();
        v
    }

    #[test]
    fn policy_decisions() {
        use AllocationPolicy::{Pack, Spread};
        // (case, groups, replicas, policy, available, must, size, expected IDs in any order)
        type Case<'a> = (
            &'a str,
            &'a [&'a str],
            u32,
            AllocationPolicy,
            &'a [&'a str],
            &'a [&'a str],
            i32,
            &'a [&'a str],
        );
        let g2: &[&str] = &["nv", "nv"];
        let all4: &[&str] = &["a", "a-r1", "b", "b-r1"];
        let table: [Case; 17] = [
            (
                "fresh node, spread: first device",
                g2,
                2,
                Spread,
                all4,
                &[],
                1,
                &["a"],
            ),
            (
                "fresh node, pack: first device",
                g2,
                2,
                Pack,
                all4,
                &[],
                1,
                &["a"],
            ),
            (
                "spread avoids the busy device",
                g2,
                2,
                Spread,
                &["a-r1", "b", "b-r1"],
                &[],
                1,
                &["b"],
            ),
            (
                "pack fills the busy device",
                g2,
                2,
                Pack,
                &["a-r1", "b", "b-r1"],
                &[],
                1,
                &["a-r1"],
            ),
            (
                "spread: least used of three",
                &["nv", "nv", "nv"],
                3,
                Spread,
                &["a-r2", "b-r1", "b-r2", "c", "c-r1", "c-r2"],
                &[],
                1,
                &["c"],
            ),
            (
                "pack: most used of three",
                &["nv", "nv", "nv"],
                3,
                Pack,
                &["a-r2", "b-r1", "b-r2", "c", "c-r1"],
                &[],
                1,
                &["a-r2"],
            ),
            (
                "two replicas from one device",
                g2,
                2,
                Spread,
                &["a-r1", "b", "b-r1"],
                &[],
                2,
                &["b", "b-r1"],
            ),
            (
                "two replicas must span two devices",
                g2,
                2,
                Spread,
                &["a-r1", "b-r1"],
                &[],
                2,
                &["a-r1", "b-r1"],
            ),
            (
                "must-include device is filled first",
                g2,
                2,
                Spread,
                all4,
                &["b-r1"],
                2,
                &["b-r1", "b"],
            ),
            (
                "one vendor when possible",
                &["nv", "amd", "nv"],
                2,
                Spread,
                &["a", "b", "b-r1", "c"],
                &[],
                2,
                &["b", "b-r1"],
            ),
            (
                "same group as the must-include device",
                &["nv", "amd", "nv"],
                1,
                Spread,
                &["a", "b", "c"],
                &["c"],
                2,
                &["c", "a"],
            ),
            (
                "mixing when unavoidable",
                &["nv", "amd"],
                1,
                Spread,
                &["a", "b"],
                &[],
                2,
                &["a", "b"],
            ),
            (
                "unknown and duplicate IDs are ignored",
                g2,
                2,
                Spread,
                &["zzz", "a", "a", "a-r9"],
                &["nope"],
                2,
                &["a"],
            ),
            (
                "size zero gives the must-include IDs",
                g2,
                2,
                Spread,
                all4,
                &["b"],
                0,
                &["b"],
            ),
            (
                "negative size gives nothing",
                g2,
                2,
                Spread,
                all4,
                &[],
                -3,
                &[],
            ),
            (
                "more than available gives all available",
                g2,
                2,
                Pack,
                &["a", "b-r1"],
                &[],
                9,
                &["a", "b-r1"],
            ),
            (
                "must-include outside available is dropped",
                g2,
                2,
                Spread,
                &["a"],
                &["b"],
                1,
                &["a"],
            ),
        ];
        for (case, groups, replicas, policy, available, must, size, expected) in table {
            let got = select(
                &devices(groups, replicas),
                policy,
                &strings(available),
                &strings(must),
                size,
            );
            assert_eq!(sorted(got), sorted(strings(expected)), "{case}");
        }
    }

    #[test]
    fn pool_groups_replicas_of_the_sample_host_by_physical_device() {
        let facts = crate::sample::sample_host().unwrap();
        let d = crate::pipeline::discover(&facts, &crate::pipeline::PipelineConfig::default());
        let pool = pool(&d, Resource::Display, Sharing::Replicas(3));
        let physical: Vec<&str> = d
            .devices_for(Resource::Display)
            .map(|x| x.id.as_str())
            .collect();
        assert_eq!(
            pool.iter()
                .map(|p| p.physical_id.as_str())
                .collect::<Vec<_>>(),
            physical
        );
        for p in &pool {
            assert_eq!(
                p.share_ids,
                (0..3)
                    .map(|k| crate::sharing::replica_id(&p.physical_id, k))
                    .collect::<Vec<_>>()
            );
            assert!(p.group.starts_with("10de/"), "{}", p.group);
        }
        // The wrapper answers from the same pool.
        let available: Vec<String> = pool
            .iter()
            .flat_map(|p| p.share_ids.iter().skip(1).cloned())
            .collect();
        let got = preferred_allocation(
            &d,
            Resource::Display,
            Sharing::Replicas(3),
            AllocationPolicy::Spread,
            &available,
            &[],
            1,
        );
        assert_eq!(got, vec![pool[0].share_ids[1].clone()]);
    }

    /// GPUs `a`, `b`, ... with the given numbers of memory units (`a-m0`, `a-m1`, ...).
    fn gpus(units: &[u32]) -> Vec<PoolDevice> {
        units
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let id = ((b'a' + i as u8) as char).to_string();
                PoolDevice {
                    share_ids: (0..*n)
                        .map(|k| crate::sharing::memory_unit_id(&id, k))
                        .collect(),
                    physical_id: id,
                    group: "nv".to_string(),
                }
            })
            .collect()
    }

    #[test]
    fn memory_requests_stay_on_the_gpu_that_fits_best() {
        use AllocationPolicy::{Pack, Spread};
        // (case, units per GPU, policy, available, must, size, expected IDs in any order)
        type Case<'a> = (
            &'a str,
            &'a [u32],
            AllocationPolicy,
            &'a [&'a str],
            &'a [&'a str],
            i32,
            &'a [&'a str],
        );
        // a has 1 unit free, b 3, c 2.
        let avail: &[&str] = &["a-m3", "b-m0", "b-m1", "b-m2", "c-m0", "c-m1"];
        let table: [Case; 10] = [
            (
                "pack: the fitting GPU with the fewest free",
                &[4, 4, 4],
                Pack,
                avail,
                &[],
                2,
                &["c-m0", "c-m1"],
            ),
            (
                "pack: one unit fills the fullest GPU",
                &[4, 4, 4],
                Pack,
                avail,
                &[],
                1,
                &["a-m3"],
            ),
            (
                "spread: the most free",
                &[4, 4, 4],
                Spread,
                avail,
                &[],
                2,
                &["b-m0", "b-m1"],
            ),
            (
                "spread: one unit too",
                &[4, 4, 4],
                Spread,
                avail,
                &[],
                1,
                &["b-m0"],
            ),
            (
                "only one GPU fits",
                &[4, 4, 4],
                Pack,
                avail,
                &[],
                3,
                &["b-m0", "b-m1", "b-m2"],
            ),
            (
                "ties by location-path order",
                &[2, 2],
                Spread,
                &["a-m0", "a-m1", "b-m0", "b-m1"],
                &[],
                1,
                &["a-m0"],
            ),
            (
                "none fits: the most one GPU has",
                &[4, 4, 4],
                Pack,
                avail,
                &[],
                5,
                &["b-m0", "b-m1", "b-m2"],
            ),
            (
                "must-include: its GPU is filled",
                &[4, 4, 4],
                Spread,
                avail,
                &["c-m1"],
                2,
                &["c-m1", "c-m0"],
            ),
            (
                "must-include on two GPUs: kept, rest from the preferred one",
                &[4, 4, 4],
                Spread,
                avail,
                &["a-m3", "c-m0"],
                3,
                &["a-m3", "c-m0", "c-m1"],
            ),
            (
                "unknown and duplicate IDs are ignored",
                &[4, 4, 4],
                Spread,
                &["zzz", "a-m0", "a-m0", "a-r1"],
                &["nope"],
                2,
                &["a-m0"],
            ),
        ];
        for (case, units, policy, available, must, size, expected) in table {
            let got = select_one_gpu(
                &gpus(units),
                policy,
                &strings(available),
                &strings(must),
                size,
            );
            assert_eq!(sorted(got), sorted(strings(expected)), "{case}");
        }
    }

    #[test]
    fn the_memory_wrapper_keeps_a_request_on_one_gpu_of_the_sample_host() {
        let facts = crate::sample::sample_host().unwrap();
        let d = crate::pipeline::discover(&facts, &crate::pipeline::PipelineConfig::default());
        let memory = Sharing::Memory(MemorySharing {
            unit_bytes: 1 << 30,
            reserve_bytes: 1 << 30,
        });
        let pool = pool(&d, Resource::Display, memory);
        // 21 units per A10; the first has 5 free, the second 21: 6 units fit only the second.
        let mut available: Vec<String> = pool[0].share_ids[16..].to_vec();
        available.extend(pool[1].share_ids.iter().cloned());
        let got = preferred_allocation(
            &d,
            Resource::Display,
            memory,
            AllocationPolicy::Pack,
            &available,
            &[],
            6,
        );
        assert_eq!(got, pool[1].share_ids[..6].to_vec());
        let got = preferred_allocation(
            &d,
            Resource::Display,
            memory,
            AllocationPolicy::Pack,
            &available,
            &[],
            5,
        );
        assert_eq!(got, pool[0].share_ids[16..].to_vec());
    }

    /// A random memory pool and request: GPUs with 0 to 9 units, some free, must-include IDs
    /// on one GPU or several.
    fn memory_scenario() -> impl Strategy<
        Value = (
            Vec<PoolDevice>,
            AllocationPolicy,
            Vec<String>,
            Vec<String>,
            i32,
        ),
    > {
        proptest::collection::vec(0u32..10, 1..6)
            .prop_flat_map(|units| {
                let ids = units.iter().sum::<u32>() as usize;
                (
                    Just(units),
                    proptest::collection::vec(any::<bool>(), ids),
                    proptest::collection::vec(0u8..8, ids),
                    -2i32..(ids as i32 + 3),
                    any::<bool>(),
                )
            })
            .prop_map(|(units, avail, must, size, pack)| {
                let pool = gpus(&units);
                let all: Vec<String> = pool.iter().flat_map(|p| p.share_ids.clone()).collect();
                let available: Vec<String> = all
                    .iter()
                    .zip(&avail)
                    .filter(|(_, a)| **a)
                    .map(|(id, _)| id.clone())
                    .collect();
                // About one ID in eight must be included (often none).
                let must_include: Vec<String> = available
                    .iter()
                    .zip(&must)
                    .filter(|(_, m)| **m == 0)
                    .map(|(id, _)| id.clone())
                    .take(size.max(0) as usize)
                    .collect();
                let policy = if pack {
                    AllocationPolicy::Pack
                } else {
                    AllocationPolicy::Spread
                };
                (pool, policy, available, must_include, size)
            })
    }

    proptest! {
        #[test]
        fn all_units_of_a_preferred_allocation_lie_on_one_gpu(
            (pool, policy, available, must, size) in memory_scenario()
        ) {
            let got = select_one_gpu(&pool, policy, &available, &must, size);
            let owner = |id: &str| pool.iter().position(|p| p.share_ids.iter().any(|r| r == id)).unwrap();
            let unique: HashSet<&str> = got.iter().map(String::as_str).collect();
            prop_assert_eq!(unique.len(), got.len(), "duplicates in {:?}", got);
            prop_assert!(got.iter().all(|id| available.contains(id)), "{:?} not all available", got);
            prop_assert!(must.iter().all(|id| got.contains(id)), "{:?} lacks some of {:?}", got, must);
            let must_gpus: HashSet<usize> = must.iter().map(|id| owner(id)).collect();
            let got_gpus: HashSet<usize> = got.iter().map(|id| owner(id)).collect();
            if must_gpus.len() <= 1 {
                prop_assert!(got_gpus.len() <= 1, "{:?} spans GPUs {:?}", got, got_gpus);
            } else {
                prop_assert_eq!(&got_gpus, &must_gpus, "{:?}", got);
            }
            let want = (size.max(0) as usize).min(available.len());
            prop_assert!(got.len() <= want.max(must.len()));
            let free: Vec<usize> = pool.iter().map(|p| p.share_ids.iter().filter(|r| available.contains(r)).count()).collect();
            if must.is_empty() && want > 0 {
                let fitting: Vec<usize> = (0..pool.len()).filter(|d| free[*d] >= want).collect();
                let d = owner(&got[0]);
                if fitting.is_empty() {
                    // The most one GPU has.
                    prop_assert_eq!(got.len(), free.iter().copied().max().unwrap());
                } else {
                    prop_assert_eq!(got.len(), want);
                    let best = match policy {
                        AllocationPolicy::Pack => fitting.iter().map(|d| free[*d]).min(),
                        AllocationPolicy::Spread => fitting.iter().map(|d| free[*d]).max(),
                    };
                    prop_assert_eq!(Some(free[d]), best, "{:?} is not the best fit", got);
                    // Ties go to the first GPU in location-path order.
                    prop_assert_eq!(fitting.iter().copied().find(|x| Some(free[*x]) == best), Some(d));
                }
            }
        }
    }

    /// The sample host's first A10, copied to `gib.len()` PCI slots with the given dedicated
    /// memory in MiB.
    fn discovery_with_memory(mib: &[u64]) -> Discovery {
        let facts = crate::sample::sample_host().unwrap();
        let sample = crate::pipeline::discover(&facts, &crate::pipeline::PipelineConfig::default());
        let template = sample
            .devices_for(Resource::Display)
            .next()
            .unwrap()
            .clone();
        let mut d = Discovery::default();
        for (i, m) in mib.iter().enumerate() {
            let mut dev = template.clone();
            dev.location_path = format!("PCIROOT(0)#PCI({:02X}00)#PCI(0000)", i + 1);
            dev.id = crate::pipeline::ids::device_id(&dev.location_path);
            dev.dedicated_memory_bytes = m << 20;
            d.devices.push(dev);
        }
        d
    }

    proptest! {
        /// Pods come and go as the kubelet would run them (preferred allocation, then Allocate):
        /// no GPU ever hands out more units than it has, and the shares on a GPU never add up
        /// to more than its dedicated memory less the reserve.
        #[test]
        fn no_gpu_is_over_committed(
            mib in proptest::collection::vec(0u64..(96 << 10), 1..5),
            unit_mib in 64u64..(8 << 10),
            reserve_mib in 0u64..(4 << 10),
            requests in proptest::collection::vec((1i32..40, any::<bool>(), any::<bool>()), 1..30),
        ) {
            use crate::allocation::{advertise, allocate};
            let d = discovery_with_memory(&mib);
            let m = MemorySharing { unit_bytes: unit_mib << 20, reserve_bytes: reserve_mib << 20 };
            let memory = Sharing::Memory(m);
            let all: Vec<String> = advertise(&d, Resource::Display, memory).into_iter().map(|a| a.id).collect();
            let mut running: Vec<Vec<String>> = Vec::new();
            for (size, pack, release) in requests {
                if release && !running.is_empty() {
                    running.remove(0);
                }
                let used: HashSet<&String> = running.iter().flatten().collect();
                let available: Vec<String> = all.iter().filter(|id| !used.contains(id)).cloned().collect();
                let policy = if pack { AllocationPolicy::Pack } else { AllocationPolicy::Spread };
                let ids = preferred_allocation(&d, Resource::Display, memory, policy, &available, &[], size);
                if ids.len() < size as usize {
                    // The kubelet would fill the rest from other GPUs, and Allocate refuse it.
                    let mut spill = ids.clone();
                    spill.extend(available.iter().filter(|id| !ids.contains(id)).take(size as usize - ids.len()).cloned());
                    let result = allocate(&d, Resource::Display, "memory", memory, crate::assignment::Assignment::LocationPath, &Default::default(), &spill);
                    let gpus: HashSet<&str> = spill.iter().filter_map(|id| crate::sharing::parse_memory_unit_id(id)).map(|(p, _)| p).collect();
                    prop_assert_eq!(result.is_err(), gpus.len() > 1 || spill.is_empty());
                    continue;
                }
                let edits = allocate(&d, Resource::Display, "memory", memory, crate::assignment::Assignment::LocationPath, &Default::default(), &ids).unwrap();
                prop_assert_eq!(edits.devices.len(), 1);
                prop_assert_eq!(&edits.envs["DXDP_GPU_MEMORY_LIMIT_BYTES"], &(ids.len() as u64 * m.unit_bytes).to_string());
                running.push(ids);
                // Every GPU: units handed out at most its units; shares at most memory - reserve.
                for dev in &d.devices {
                    let held: Vec<&String> = running.iter().flatten().filter(|id| id.starts_with(&format!("{}-m", dev.id))).collect();
                    let distinct: HashSet<&&String> = held.iter().collect();
                    prop_assert_eq!(distinct.len(), held.len(), "a unit handed out twice");
                    prop_assert!(held.len() as u64 <= u64::from(m.units(dev.dedicated_memory_bytes)));
                    let shares: u64 = running.iter().map(|ids| crate::sharing::memory_share(ids.iter().map(String::as_str), m.unit_bytes).get(&dev.id).copied().unwrap_or(0)).sum();
                    prop_assert!(shares <= dev.dedicated_memory_bytes.saturating_sub(m.reserve_bytes), "{} bytes shared of {}", shares, dev.dedicated_memory_bytes);
                }
            }
        }
    }

    /// A random pool, request and policy.
    fn scenario() -> impl Strategy<
        Value = (
            Vec<PoolDevice>,
            AllocationPolicy,
            Vec<String>,
            Vec<String>,
            i32,
        ),
    > {
        (1usize..6, 1u32..5)
            .prop_flat_map(|(n, replicas)| {
                let groups = proptest::collection::vec(prop_oneof!["g1", "g2"], n);
                let ids = (n as u32 * replicas) as usize;
                (
                    groups,
                    Just(replicas),
                    proptest::collection::vec(any::<bool>(), ids),
                    proptest::collection::vec(any::<bool>(), ids),
                    -2i32..(ids as i32 + 3),
                    any::<bool>(),
                    proptest::collection::vec("[a-z0-9-]{1,8}", 0..4),
                )
            })
            .prop_map(|(groups, replicas, avail, must, size, pack, junk)| {
                let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
                let pool = devices(&groups, replicas);
                let all: Vec<String> = pool.iter().flat_map(|p| p.share_ids.clone()).collect();
                let mut available: Vec<String> = all
                    .iter()
                    .zip(&avail)
                    .filter(|(_, a)| **a)
                    .map(|(id, _)| id.clone())
                    .collect();
                let must_include: Vec<String> = available
                    .iter()
                    .zip(&must)
                    .filter(|(_, m)| **m)
                    .map(|(id, _)| id.clone())
                    .take(size.max(0) as usize)
                    .collect();
                // Hostile extras: unknown IDs and duplicates.
                available.extend(junk);
                if let Some(first) = available.first().cloned() {
                    available.push(first);
                }
                let policy = if pack {
                    AllocationPolicy::Pack
                } else {
                    AllocationPolicy::Spread
                };
                (pool, policy, available, must_include, size)
            })
    }

    /// The smallest set of physical devices (as a bit mask) that contains `required` and has at
    /// least `want` available IDs, by trying every subset.
    fn brute_force_minimum(
        pool: &[PoolDevice],
        free: &[usize],
        required: u32,
        want: usize,
        one_group: bool,
    ) -> Option<u32> {
        (0u32..1 << pool.len())
            .filter(|mask| mask & required == required)
            .filter(|mask| {
                (0..pool.len())
                    .filter(|d| mask & (1 << d) != 0)
                    .map(|d| free[d])
                    .sum::<usize>()
                    >= want
            })
            .filter(|mask| {
                let groups: HashSet<&str> = (0..pool.len())
                    .filter(|d| mask & (1 << d) != 0)
                    .map(|d| pool[d].group.as_str())
                    .collect();
                !one_group || groups.len() <= 1
            })
            .map(u32::count_ones)
            .min()
    }

    proptest! {
        #[test]
        fn preferred_allocations_keep_every_invariant(
            (pool, policy, available, must, size) in scenario()
        ) {
            let got = select(&pool, policy, &available, &must, size);
            let known: HashSet<&str> = pool.iter().flat_map(|p| p.share_ids.iter().map(String::as_str)).collect();
            let avail: HashSet<&str> = available.iter().map(String::as_str).filter(|id| known.contains(id)).collect();
            // Available and unique.
            let unique: HashSet<&str> = got.iter().map(String::as_str).collect();
            prop_assert_eq!(unique.len(), got.len(), "duplicates in {:?}", got);
            prop_assert!(got.iter().all(|id| avail.contains(id.as_str())), "{:?} not all available", got);
            // Must-include.
            prop_assert!(must.iter().all(|id| got.contains(id)), "{:?} lacks some of {:?}", got, must);
            // Count.
            let want = (size.max(0) as usize).min(avail.len());
            prop_assert_eq!(got.len(), want.max(must.len()));
            // Fewest physical devices, computed by brute force.
            let owner = |id: &str| pool.iter().position(|p| p.share_ids.iter().any(|r| r == id)).unwrap();
            let free: Vec<usize> = pool.iter().map(|p| p.share_ids.iter().filter(|r| avail.contains(r.as_str())).count()).collect();
            let required = must.iter().fold(0u32, |m, id| m | 1 << owner(id));
            let used = got.iter().fold(0u32, |m, id| m | 1 << owner(id));
            let minimum = brute_force_minimum(&pool, &free, required, want, false).unwrap();
            prop_assert_eq!(used.count_ones(), minimum, "{:?} uses more devices than needed", got);
            // One group whenever a smallest one-group set exists.
            if brute_force_minimum(&pool, &free, required, want, true) == Some(minimum) {
                let groups: HashSet<&str> = got.iter().map(|id| pool[owner(id)].group.as_str()).collect();
                prop_assert!(groups.len() <= 1, "{:?} mixes groups {:?}", got, groups);
            }
            // A single replica goes to the least (spread) or most (pack) used device with a free ID.
            if must.is_empty() && want == 1 && pool.iter().all(|p| p.group == pool[0].group) {
                let in_use = |d: usize| pool[d].share_ids.len() - free[d];
                let candidates = (0..pool.len()).filter(|d| free[*d] > 0);
                let best = match policy {
                    AllocationPolicy::Spread => candidates.map(in_use).min(),
                    AllocationPolicy::Pack => candidates.map(in_use).max(),
                };
                prop_assert_eq!(Some(in_use(owner(&got[0]))), best);
            }
        }

        #[test]
        fn hostile_requests_never_panic(
            available in proptest::collection::vec("[a-z0-9-]{0,10}", 0..50),
            must in proptest::collection::vec("[a-z0-9-]{0,10}", 0..10),
            size in any::<i32>(),
        ) {
            let pool = devices(&["g", "g", "h"], 3);
            let got = select(&pool, AllocationPolicy::Spread, &available, &must, size);
            prop_assert!(got.len() <= available.len());
        }
    }
}
