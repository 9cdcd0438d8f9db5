//! GPU memory over-use: a container that holds memory units of a GPU (a memory share) and whose
//! processes use more dedicated memory on that GPU than the share, for longer than a grace
//! period.
//!
//! Nothing on Windows caps a container's GPU memory, so dxdp tells the container its share
//! (`DXDP_GPU_MEMORY_LIMIT_BYTES`) and watches its use here:
//!
//! - [`annotate_shares`] writes each container's share per GPU into a computed view: the memory
//!   unit IDs (`<physical>-m<k>`) the kubelet assigned it under a memory resource, counted per
//!   physical GPU, times that resource's unit size ([`crate::sharing::memory_share`]);
//! - [`Episodes`] follows each (pod container, GPU) over the samples: an episode starts at the
//!   first sample whose dedicated use is above the share, is *confirmed* once it has lasted the
//!   grace period (then, and only then, it is reported: once per episode), and ends at the first
//!   sample where the use is within the share again or the container no longer uses the GPU
//!   (the next excess is a new episode: the rule re-arms).
//!
//! Only dedicated memory counts: shared (system) memory is not the GPU's and no share covers it.

use std::collections::BTreeMap;
use std::time::Duration;

use super::compute::TelemetryView;
use super::PodRef;

/// The default grace period (`health.memoryOverUse.gracePeriod`): long enough for a load spike
/// (a model being loaded twice while it is swapped), short enough to be seen within minutes.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(120);

/// Writes each container's memory share into `view` (`ContainerTelemetry::memory_share`): for
/// every (pod container, GPU), the memory units of the GPU it holds under a memory resource
/// (`unit_bytes`: the memory resources' names and their unit sizes), times the unit size. A
/// container that holds no unit of a GPU has no share there (`None`), whatever else it holds.
pub fn annotate_shares(view: &mut TelemetryView, unit_bytes: &BTreeMap<String, u64>) {
    if unit_bytes.is_empty() {
        return;
    }
    let mut shares: BTreeMap<(&PodRef, &str), u64> = BTreeMap::new();
    for d in &view.devices {
        // The IDs each container holds of each memory resource on this device.
        let mut held: BTreeMap<(&PodRef, &str), Vec<&str>> = BTreeMap::new();
        for h in &d.holders {
            if unit_bytes.contains_key(&h.resource) {
                held.entry((&h.pod, h.resource.as_str()))
                    .or_default()
                    .push(h.device_id.as_str());
            }
        }
        for ((pod, resource), ids) in held {
            let unit = unit_bytes.get(resource).copied().unwrap_or(0);
            let share = crate::sharing::memory_share(ids, unit)
                .get(&d.device)
                .copied()
                .unwrap_or(0);
            if share > 0 {
                let slot = shares.entry((pod, d.device.as_str())).or_insert(0);
                *slot = slot.saturating_add(share);
            }
        }
    }
    let shares: BTreeMap<(PodRef, String), u64> = shares
        .into_iter()
        .map(|((p, d), s)| ((p.clone(), d.to_string()), s))
        .collect();
    for c in &mut view.containers {
        c.memory_share = shares.get(&(c.pod.clone(), c.device.clone())).copied();
    }
}

/// One container's dedicated memory on one GPU above its share.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct OverUse {
    /// The pod container.
    pub pod: PodRef,
    /// The dxdp device ID of the GPU.
    pub device: String,
    /// The GPU's model, for messages (may be empty).
    pub model: String,
    /// Dedicated memory its processes use on the GPU, bytes.
    pub used: u64,
    /// Its share of the GPU (units held x unit size), bytes.
    pub share: u64,
    /// How long the use has been above the share, at the sample.
    pub lasted: Duration,
}

impl OverUse {
    /// The bytes above the share.
    pub fn excess(&self) -> u64 {
        self.used.saturating_sub(self.share)
    }

    /// The key of the episode: the pod container and the GPU.
    pub fn key(&self) -> (PodRef, String) {
        (self.pod.clone(), self.device.clone())
    }

    /// What happened and what to do, for an Event and the log.
    pub fn message(&self) -> String {
        let gpu = if self.model.is_empty() {
            self.device.clone()
        } else {
            format!("{} ({})", self.device, self.model)
        };
        format!(
            "container {} uses {} of dedicated memory on GPU {gpu}, above its share of {} by {} for {}s. Nothing enforces the share: the GPU's other containers may run out of memory. Request more memory units (the container's memory resource) or make the workload use less; its share is in DXDP_GPU_MEMORY_LIMIT_BYTES",
            self.pod.container,
            bytes(self.used),
            bytes(self.share),
            bytes(self.excess()),
            self.lasted.as_secs()
        )
    }
}

/// `1.5 GiB`, `300 MiB`, `12 KiB` or `17 B`, for messages.
pub fn bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, size) in UNITS {
        if n >= size {
            let whole = n / size;
            let tenths = (n % size) * 10 / size;
            return if tenths == 0 {
                format!("{whole} {name}")
            } else {
                format!("{whole}.{tenths} {name}")
            };
        }
    }
    format!("{n} B")
}

/// What one judged sample gives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Judged {
    /// Every confirmed episode, with this sample's figures (sorted): the gauge of the excess and
    /// the Events follow it.
    pub confirmed: Vec<OverUse>,
    /// The episodes confirmed by this sample (each once per episode): counted and logged.
    pub started: Vec<OverUse>,
    /// The confirmed episodes that ended with this sample.
    pub ended: Vec<(PodRef, String)>,
}

/// An episode in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Episode {
    /// The time of the first sample above the share.
    since: Duration,
    /// Whether it lasted the grace period (and was reported).
    confirmed: bool,
}

/// The over-use episodes of every (pod container, GPU).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Episodes {
    open: BTreeMap<(PodRef, String), Episode>,
}

impl Episodes {
    /// Judges the figures of a sample taken at `now` (any monotonic clock; only differences
    /// matter) whose containers carry their memory shares ([`annotate_shares`]), with `grace`:
    /// how long a use above the share may last before it is reported. A use of exactly the
    /// share is within it.
    pub fn judge(&mut self, view: &TelemetryView, grace: Duration, now: Duration) -> Judged {
        let model: BTreeMap<&str, &str> = view
            .devices
            .iter()
            .map(|d| (d.device.as_str(), d.model.as_str()))
            .collect();
        let mut judged = Judged::default();
        let mut open = BTreeMap::new();
        for c in &view.containers {
            let (Some(share), Some(used)) = (c.memory_share, c.memory_used.dedicated) else {
                continue;
            };
            if used <= share || c.pod.is_host() {
                continue;
            }
            let key = (c.pod.clone(), c.device.clone());
            let mut episode = self.open.get(&key).copied().unwrap_or(Episode {
                since: now,
                confirmed: false,
            });
            let lasted = now.saturating_sub(episode.since);
            let over = OverUse {
                pod: c.pod.clone(),
                device: c.device.clone(),
                model: model.get(c.device.as_str()).unwrap_or(&"").to_string(),
                used,
                share,
                lasted,
            };
            if lasted >= grace {
                if !episode.confirmed {
                    episode.confirmed = true;
                    judged.started.push(over.clone());
                }
                judged.confirmed.push(over);
            }
            open.insert(key, episode);
        }
        for (key, episode) in &self.open {
            if episode.confirmed && !open.contains_key(key) {
                judged.ended.push(key.clone());
            }
        }
        self.open = open;
        judged
    }

    /// Forgets every episode (telemetry is off): a use seen again starts a new one.
    pub fn clear(&mut self) -> Vec<(PodRef, String)> {
        let ended = self
            .open
            .iter()
            .filter(|(_, e)| e.confirmed)
            .map(|(k, _)| k.clone())
            .collect();
        self.open.clear();
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::compute::{ContainerTelemetry, DeviceTelemetry, Holder, Segments};

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    const GPU0: &str = "pciroot-0-pci-0000-0000-0123456789abcdef";
    const GPU1: &str = "pciroot-0-pci-0001-0000-fedcba9876543210";
    const MEMORY: &str = "directx.microsoft.com/display-memory";

    fn pod(name: &str) -> PodRef {
        PodRef {
            namespace: "vision".into(),
            pod: name.into(),
            container: "infer".into(),
        }
    }

    fn device(id: &str, holders: Vec<Holder>) -> DeviceTelemetry {
        DeviceTelemetry {
            device: id.into(),
            resource: "directx.microsoft.com/display".into(),
            luid: "0x00000000_0x00000001".into(),
            model: "NVIDIA T4".into(),
            engines: BTreeMap::new(),
            memory_used: Segments::default(),
            memory_total: Segments::default(),
            processes: 0,
            holders,
            health: String::new(),
            sensors: Default::default(),
        }
    }

    fn holds(p: &PodRef, resource: &str, id: &str) -> Holder {
        Holder {
            pod: p.clone(),
            resource: resource.into(),
            device_id: id.into(),
        }
    }

    fn uses(p: &PodRef, device: &str, dedicated: u64, share: Option<u64>) -> ContainerTelemetry {
        ContainerTelemetry {
            pod: p.clone(),
            device: device.into(),
            memory_used: Segments {
                dedicated: Some(dedicated),
                shared: Some(0),
            },
            memory_share: share,
            engines: BTreeMap::new(),
            processes: 1,
        }
    }

    fn view(containers: Vec<ContainerTelemetry>) -> TelemetryView {
        TelemetryView {
            devices: vec![device(GPU0, vec![]), device(GPU1, vec![])],
            containers,
            ..TelemetryView::default()
        }
    }

    #[test]
    fn a_containers_share_is_the_units_it_holds_on_the_gpu() {
        let (a, b) = (pod("a"), pod("b"));
        let mut v = TelemetryView {
            devices: vec![
                device(
                    GPU0,
                    vec![
                        holds(&a, MEMORY, &format!("{GPU0}-m0")),
                        holds(&a, MEMORY, &format!("{GPU0}-m1")),
                        holds(&a, MEMORY, &format!("{GPU0}-m2")),
                        // A replica of another resource is no share.
                        holds(&b, "directx.microsoft.com/display", &format!("{GPU0}-r1")),
                    ],
                ),
                device(GPU1, vec![holds(&b, MEMORY, &format!("{GPU1}-m4"))]),
            ],
            containers: vec![
                uses(&a, GPU0, GIB, None),
                uses(&a, GPU1, GIB, None),
                uses(&b, GPU0, GIB, None),
                uses(&b, GPU1, GIB, None),
            ],
            ..TelemetryView::default()
        };
        annotate_shares(&mut v, &BTreeMap::from([(MEMORY.to_string(), 256 * MIB)]));
        let shares: Vec<Option<u64>> = v.containers.iter().map(|c| c.memory_share).collect();
        // a: 3 units of GPU0 (768 MiB), none of GPU1; b: a replica of GPU0, 1 unit of GPU1.
        assert_eq!(shares, [Some(768 * MIB), None, None, Some(256 * MIB)]);
    }

    #[test]
    fn over_use_is_reported_once_after_the_grace_period_and_re_arms_when_it_ends() {
        let a = pod("a");
        let grace = Duration::from_secs(120);
        let s = Duration::from_secs;
        let mut episodes = Episodes::default();
        // (time, dedicated use, started, confirmed excess, ended)
        let table: [(u64, u64, usize, Option<u64>, usize); 8] = [
            (0, 2 * GIB, 0, None, 0),                      // within its 2 GiB share
            (10, 3 * GIB, 0, None, 0),                     // over from t=10
            (100, 3 * GIB, 0, None, 0),                    // 90 s: within the grace period
            (130, 3 * GIB, 1, Some(GIB), 0),               // 120 s: confirmed, reported
            (140, 2 * GIB + GIB / 2, 0, Some(GIB / 2), 0), // still over: not reported again
            (150, 2 * GIB, 0, None, 1),                    // back within: ended
            (160, 4 * GIB, 0, None, 0),                    // a new episode starts ...
            (280, 4 * GIB, 1, Some(2 * GIB), 0),           // ... and is reported once more
        ];
        for (t, used, started, excess, ended) in table {
            let j = episodes.judge(
                &view(vec![uses(&a, GPU0, used, Some(2 * GIB))]),
                grace,
                s(t),
            );
            assert_eq!(j.started.len(), started, "t={t}");
            assert_eq!(j.confirmed.first().map(OverUse::excess), excess, "t={t}");
            assert_eq!(j.ended.len(), ended, "t={t}");
        }
    }

    #[test]
    fn a_container_that_stops_using_the_gpu_ends_its_episode() {
        let (a, b) = (pod("a"), pod("b"));
        let mut episodes = Episodes::default();
        let zero = Duration::ZERO;
        let over = view(vec![
            uses(&a, GPU0, 3 * GIB, Some(GIB)),
            uses(&b, GPU1, 5 * GIB, Some(4 * GIB)),
        ]);
        // A grace period of 0: reported at the first sample.
        let j = episodes.judge(&over, zero, zero);
        assert_eq!(j.started.len(), 2);
        assert_eq!(j.confirmed[0].pod, a);
        assert_eq!(j.confirmed[0].excess(), 2 * GIB);
        assert_eq!(j.confirmed[1].excess(), GIB);
        let j = episodes.judge(
            &view(vec![uses(&b, GPU1, 5 * GIB, Some(4 * GIB))]),
            zero,
            zero,
        );
        assert_eq!(j.ended, [(a, GPU0.to_string())]);
        assert!(j.started.is_empty());
        assert_eq!(episodes.clear(), [(b, GPU1.to_string())]);
    }

    #[test]
    fn containers_without_a_share_and_the_host_are_not_judged() {
        let mut episodes = Episodes::default();
        let j = episodes.judge(
            &view(vec![
                uses(&pod("a"), GPU0, 10 * GIB, None),
                uses(&PodRef::host(), GPU0, 10 * GIB, Some(GIB)),
                // Exactly the share is within it.
                uses(&pod("c"), GPU0, GIB, Some(GIB)),
            ]),
            Duration::ZERO,
            Duration::ZERO,
        );
        assert_eq!(j, Judged::default());
    }

    #[test]
    fn the_message_names_container_gpu_use_share_and_what_to_do() {
        let o = OverUse {
            pod: pod("a"),
            device: GPU0.into(),
            model: "NVIDIA T4".into(),
            used: 3 * GIB + GIB / 2,
            share: 2 * GIB,
            lasted: Duration::from_secs(150),
        };
        assert_eq!(
            o.message(),
            "container infer uses 3.5 GiB of dedicated memory on GPU pciroot-0-pci-0000-0000-0123456789abcdef (NVIDIA T4), above its share of 2 GiB by 1.5 GiB for 150s. Nothing enforces the share: the GPU's other containers may run out of memory. Request more memory units (the container's memory resource) or make the workload use less; its share is in DXDP_GPU_MEMORY_LIMIT_BYTES"
        );
        assert_eq!(bytes(300 * MIB), "300 MiB");
        assert_eq!(bytes(17), "17 B");
    }
}
