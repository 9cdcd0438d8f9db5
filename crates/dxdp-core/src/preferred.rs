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

use std::cmp::Reverse;
use std::collections::{HashMap, HashSet};

use crate::allocation;
use crate::devices::{Discovery, Resource};
use crate::policy::AllocationPolicy;

/// One physical device as the policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolDevice {
    /// The physical device ID.
    pub physical_id: String,
    /// Devices of one group can be mixed freely (same vendor and driver version).
    pub group: String,
    /// Every advertised ID of the device, replica 0 first.
    pub replica_ids: Vec<String>,
}

/// The physical devices of `resource` with their advertised IDs, in advertising order.
pub fn pool(discovery: &Discovery, resource: Resource, replicas: u32) -> Vec<PoolDevice> {
    let mut out: Vec<PoolDevice> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for a in allocation::advertise(discovery, resource, replicas) {
        let i = *index.entry(a.physical_id.clone()).or_insert_with(|| {
            let group = discovery
                .device(&a.physical_id)
                .map(|d| format!("{:04x}/{}", d.vendor_id, d.driver_version))
                .unwrap_or_default();
            out.push(PoolDevice {
                physical_id: a.physical_id.clone(),
                group,
                replica_ids: Vec::new(),
            });
            out.len() - 1
        });
        out[i].replica_ids.push(a.id);
    }
    out
}

/// The preferred IDs for one container of `resource`.
pub fn preferred_allocation(
    discovery: &Discovery,
    resource: Resource,
    replicas: u32,
    policy: AllocationPolicy,
    available: &[String],
    must_include: &[String],
    size: i32,
) -> Vec<String> {
    select(
        &pool(discovery, resource, replicas),
        policy,
        available,
        must_include,
        size,
    )
}

/// The policy over a pool (see the module documentation for the rules).
pub fn select(
    pool: &[PoolDevice],
    policy: AllocationPolicy,
    available: &[String],
    must_include: &[String],
    size: i32,
) -> Vec<String> {
    let owner: HashMap<&str, usize> = pool
        .iter()
        .enumerate()
        .flat_map(|(d, dev)| dev.replica_ids.iter().map(move |id| (id.as_str(), d)))
        .collect();
    let available: HashSet<&str> = available
        .iter()
        .map(String::as_str)
        .filter(|id| owner.contains_key(id))
        .collect();
    // Per device: its available IDs in advertising order, and its replicas in use.
    let mut free: Vec<Vec<&str>> = vec![Vec::new(); pool.len()];
    let mut seen: HashSet<&str> = HashSet::new();
    for (d, dev) in pool.iter().enumerate() {
        for id in &dev.replica_ids {
            if available.contains(id.as_str()) && seen.insert(id) {
                free[d].push(id);
            }
        }
    }
    let in_use: Vec<usize> = pool
        .iter()
        .zip(&free)
        .map(|(dev, f)| dev.replica_ids.len().saturating_sub(f.len()))
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
    use proptest::prelude::*;

    /// Devices `a`, `b`, ... with the given groups and `replicas` IDs each (`a`, `a-r1`, ...).
    fn devices(groups: &[&str], replicas: u32) -> Vec<PoolDevice> {
        groups
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let id = ((b'a' + i as u8) as char).to_string();
                PoolDevice {
                    replica_ids: (0..replicas)
                        .map(|k| allocation::replica_id(&id, k))
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
        let pool = pool(&d, Resource::Display, 3);
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
                p.replica_ids,
                (0..3)
                    .map(|k| allocation::replica_id(&p.physical_id, k))
                    .collect::<Vec<_>>()
            );
            assert!(p.group.starts_with("10de/"), "{}", p.group);
        }
        // The wrapper answers from the same pool.
        let available: Vec<String> = pool
            .iter()
            .flat_map(|p| p.replica_ids.iter().skip(1).cloned())
            .collect();
        let got = preferred_allocation(
            &d,
            Resource::Display,
            3,
            AllocationPolicy::Spread,
            &available,
            &[],
            1,
        );
        assert_eq!(got, vec![pool[0].replica_ids[1].clone()]);
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
                let all: Vec<String> = pool.iter().flat_map(|p| p.replica_ids.clone()).collect();
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
            let known: HashSet<&str> = pool.iter().flat_map(|p| p.replica_ids.iter().map(String::as_str)).collect();
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
            let owner = |id: &str| pool.iter().position(|p| p.replica_ids.iter().any(|r| r == id)).unwrap();
            let free: Vec<usize> = pool.iter().map(|p| p.replica_ids.iter().filter(|r| avail.contains(r.as_str())).count()).collect();
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
                let in_use = |d: usize| pool[d].replica_ids.len() - free[d];
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
