//! Device health: why a device is Healthy or Unhealthy (the [`reason::Reason`]), the catalogue of fault
//! signals with their default actions, the operator's policy over them, and the fault events
//! (display-driver resets and their Windows Error Reporting reports) applied to devices.
//!
//! Pure: the event-log subscription and the clock live in the daemon; the events arrive here as
//! the XML `EvtRender` returns ([`eventlog`]) and the time as milliseconds since the Unix epoch.

pub mod eventlog;
pub mod expected;
pub mod feed;
pub mod reason;

use reason::Reason;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;

use crate::devices::{Device, Discovery, Health, HealthState};
use crate::facts::HostFacts;
use crate::telemetry::isolation::Violation;
use crate::telemetry::sensors::SensorView;

/// What a signal does to the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Unhealthy for this long after the signal (event signals only).
    UnhealthyFor(Duration),
    /// Unhealthy until the condition clears (condition signals) or the daemon restarts (event
    /// signals: the way NVIDIA's plugin treats an XID).
    UnhealthyUntilCleared,
    /// Logged and counted (`dxdp_gpu_faults_total`); health unchanged.
    EventOnly,
    /// Not even counted.
    Ignore,
}

impl Action {
    /// The configuration's name for the action.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::UnhealthyFor(_) => "unhealthy_for",
            Action::UnhealthyUntilCleared => "unhealthy_until_cleared",
            Action::EventOnly => "event_only",
            Action::Ignore => "ignore",
        }
    }
}

/// What an event does that cannot be told apart among several devices: a driver reset (event
/// 4101 names the driver's service, so its vendor) on a node with two or more devices of that
/// vendor. An event that names nothing dxdp can match on a node with several devices is never
/// charged to any of them, whatever this says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ambiguous {
    /// Counted, logged and shown, charged to no device: one tenant's resets do not take every
    /// GPU of the vendor from the others (the default).
    #[default]
    EventOnly,
    /// Charged to every device of the vendor the driver belongs to (what dxdp did before: any
    /// device of the driver may be the sick one, at the price of all of them).
    AllOfVendor,
}

impl Ambiguous {
    /// The configuration's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Ambiguous::EventOnly => "event_only",
            Ambiguous::AllOfVendor => "all_of_vendor",
        }
    }
}

/// A signal's action and how many occurrences within a window trigger it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignalPolicy {
    /// What the signal does once triggered.
    pub action: Action,
    /// Occurrences within `window` that trigger the action (1: every occurrence).
    pub count: u32,
    /// The window `count` is counted in.
    pub window: Duration,
    /// What an event that cannot be told apart among several devices of its vendor does.
    pub ambiguous: Ambiguous,
}

impl SignalPolicy {
    /// Every occurrence triggers `action`.
    pub const fn every(action: Action) -> Self {
        SignalPolicy {
            action,
            count: 1,
            window: Duration::ZERO,
            ambiguous: Ambiguous::EventOnly,
        }
    }
}

/// One row of the catalogue (docs/health.md shows the same table).
#[derive(Debug, Clone, Copy)]
pub struct CatalogueEntry {
    /// The signal.
    pub signal: Reason,
    /// Where Windows reports it.
    pub source: &'static str,
    /// Its action when the operator says nothing.
    pub default: SignalPolicy,
    /// Why that default.
    pub why: &'static str,
}

/// Every signal, its source and its default action.
pub const CATALOGUE: [CatalogueEntry; 7] = [
    CatalogueEntry {
        signal: Reason::ProblemCode,
        source: "device node problem code (CM_Get_DevNode_Status)",
        default: SignalPolicy::every(Action::UnhealthyUntilCleared),
        why: "a device with a problem code does not work (Code 43: the driver reported a failure); it recovers when the code clears",
    },
    CatalogueEntry {
        signal: Reason::StatusUnreadable,
        source: "CM_Get_DevNode_Status fails",
        default: SignalPolicy::every(Action::UnhealthyUntilCleared),
        why: "a device whose state cannot be read is not trusted",
    },
    CatalogueEntry {
        signal: Reason::DriverUpdate,
        source: "DXCore DriverUpdateInProgress",
        default: SignalPolicy::every(Action::UnhealthyUntilCleared),
        why: "the driver is being replaced; containers started now fail",
    },
    CatalogueEntry {
        signal: Reason::Removed,
        source: "DXCore adapter no longer valid / device node removed, while a pod holds it",
        default: SignalPolicy::every(Action::UnhealthyUntilCleared),
        why: "the pod's device is gone; the kubelet reports it in allocatedResourcesStatus only while the plugin lists it Unhealthy",
    },
    CatalogueEntry {
        signal: Reason::Tdr,
        source: "System log, provider Display, event 4101",
        default: SignalPolicy {
            action: Action::UnhealthyFor(Duration::from_secs(10 * 60)),
            count: 3,
            window: Duration::from_secs(10 * 60),
            ambiguous: Ambiguous::EventOnly,
        },
        why: "one reset the driver recovered from is usually the workload's own long GPU job (like NVIDIA's application XIDs); repeated resets mean a sick GPU or driver",
    },
    CatalogueEntry {
        signal: Reason::LiveKernelEvent,
        source: "Application log, provider Windows Error Reporting, event 1001, LiveKernelEvent 117/141",
        default: SignalPolicy::every(Action::EventOnly),
        why: "Windows' report of a display timeout that event 4101 already counts; it names no adapter",
    },
    CatalogueEntry {
        signal: Reason::Thermal,
        source: "telemetry sensors: temperature margin (D3DKMT/NVML) within health.thermal.marginCelsius, or NVML thermal/power-brake throttle reasons",
        default: SignalPolicy::every(Action::EventOnly),
        why: "a hot or throttled GPU still works, only slower; whether that should stop new pods is the operator's call",
    },
];

/// The catalogue row of a signal.
pub fn catalogue_entry(signal: Reason) -> Option<&'static CatalogueEntry> {
    CATALOGUE.iter().find(|e| e.signal == signal)
}

/// The operator's policy: per-signal overrides (`health.signals`) and ignored signals
/// (`health.ignore`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthPolicy {
    /// Overrides by signal.
    pub signals: BTreeMap<Reason, SignalPolicy>,
    /// Signals ignored altogether.
    pub ignore: BTreeSet<Reason>,
}

impl HealthPolicy {
    /// The policy in force for `signal`.
    pub fn of(&self, signal: Reason) -> SignalPolicy {
        if self.ignore.contains(&signal) {
            return SignalPolicy::every(Action::Ignore);
        }
        if let Some(p) = self.signals.get(&signal) {
            return *p;
        }
        catalogue_entry(signal)
            .map(|e| e.default)
            .unwrap_or(SignalPolicy::every(Action::EventOnly))
    }

    /// Whether a condition signal makes a device Unhealthy.
    pub fn condition_counts(&self, signal: Reason) -> bool {
        matches!(
            self.of(signal).action,
            Action::UnhealthyUntilCleared | Action::UnhealthyFor(_)
        )
    }
}

/// What a fault event names, to find its device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum FaultTarget {
    /// A display driver by its service name (`nvlddmkm`): every device of that driver.
    Driver(String),
    /// Nothing that names a device.
    Unknown,
}

/// A fault event, as the pure core sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuFault {
    /// When Windows logged it, in milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// The signal.
    pub signal: Reason,
    /// What it names.
    pub target: FaultTarget,
    /// A short description for logs and Events (`display driver nvlddmkm was reset`).
    pub detail: String,
}

/// The PCI vendor a display driver's kernel service belongs to (the service name is what event
/// 4101 names). Only the inbox and vendor drivers seen on GPU nodes are known.
pub fn driver_vendor(service: &str) -> Option<u32> {
    let s = service.to_ascii_lowercase();
    match s.as_str() {
        "nvlddmkm" => Some(crate::vendor::NVIDIA),
        "amdkmdag" | "amdkmdap" | "amdwddmg" | "atikmdag" | "atikmpag" => Some(0x1002),
        "igfx" | "igfxn" | "igdkmd64" | "igdkmdn64" | "igdkmdnd64" | "igdkmd32" => Some(0x8086),
        _ => None,
    }
}

/// Which devices an event is charged to, and which it may be about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Charge {
    /// IDs of the devices the event counts against (their health may change).
    pub devices: Vec<String>,
    /// IDs of the devices the event may be about when it was charged to none of them (the two
    /// or more devices of the driver's vendor, [`Ambiguous::EventOnly`]); empty otherwise.
    pub ambiguous: Vec<String>,
}

/// The devices an event is charged to. A driver's service names its vendor: with one device of
/// that vendor on the node, that device; with two or more the event cannot tell them apart
/// (event 4101 names no adapter), so it is charged to none of them unless `ambiguous` is
/// [`Ambiguous::AllOfVendor`] (then every one); with none, to no device. An event that names
/// nothing dxdp can match (an unknown driver, a WER report) is charged to the node's only
/// device when there is exactly one, otherwise to none.
pub fn charge(event: &GpuFault, devices: &[Device], ambiguous: Ambiguous) -> Charge {
    if let FaultTarget::Driver(service) = &event.target {
        if let Some(vendor) = driver_vendor(service) {
            let of_vendor: Vec<String> = devices
                .iter()
                .filter(|d| d.vendor_id == vendor)
                .map(|d| d.id.clone())
                .collect();
            return match (of_vendor.len(), ambiguous) {
                (0 | 1, _) | (_, Ambiguous::AllOfVendor) => Charge {
                    devices: of_vendor,
                    ambiguous: Vec::new(),
                },
                (_, Ambiguous::EventOnly) => Charge {
                    devices: Vec::new(),
                    ambiguous: of_vendor,
                },
            };
        }
    }
    match devices {
        [only] => Charge {
            devices: vec![only.id.clone()],
            ambiguous: Vec::new(),
        },
        _ => Charge::default(),
    }
}

/// When an event signal makes a device Unhealthy: from `since` until `until` (milliseconds
/// since the epoch; `None`: until the daemon restarts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spell {
    /// When the device became Unhealthy.
    pub since_ms: u64,
    /// When it becomes Healthy again.
    pub until_ms: Option<u64>,
}

/// The spell of Unhealthy that `times` (one signal's events on one device, any order) cause
/// under `policy` that is still running at `now_ms`, if any. An occurrence triggers the action
/// when at least `count` occurrences fall within `window` ending at it; spells that overlap or
/// touch are one spell.
pub fn spell(times: &[u64], policy: SignalPolicy, now_ms: u64) -> Option<Spell> {
    let length = match policy.action {
        Action::UnhealthyFor(d) => Some(d.as_millis() as u64),
        Action::UnhealthyUntilCleared => None,
        Action::EventOnly | Action::Ignore => return None,
    };
    let mut sorted: Vec<u64> = times.iter().copied().filter(|t| *t <= now_ms).collect();
    sorted.sort_unstable();
    let count = policy.count.max(1) as usize;
    let window = policy.window.as_millis() as u64;
    let mut current: Option<Spell> = None;
    for (i, &t) in sorted.iter().enumerate() {
        if i + 1 < count {
            continue;
        }
        let first = sorted[i + 1 - count];
        if count > 1 && t - first > window {
            continue;
        }
        let until = length.map(|l| t.saturating_add(l));
        current = match current {
            Some(s) if s.until_ms.is_none_or(|u| t <= u) => Some(Spell {
                since_ms: s.since_ms,
                until_ms: until,
            }),
            _ => Some(Spell {
                since_ms: t,
                until_ms: until,
            }),
        };
    }
    current.filter(|s| s.until_ms.is_none_or(|u| now_ms < u))
}

/// A fault event and the devices it is charged to (none: unmatched or ambiguous).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// The event.
    pub event: GpuFault,
    /// IDs of the devices it is charged to; empty when it is charged to none.
    pub devices: Vec<String>,
    /// IDs of the devices it may be about when it is charged to none of them ([`charge`]).
    pub ambiguous: Vec<String>,
}

/// What applying fault events to a discovery did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Every event that is not ignored, with its devices.
    pub hits: Vec<Hit>,
    /// The earliest time a running spell ends (when to look again).
    pub next_change_ms: Option<u64>,
    /// Records that could not be read, one sentence each.
    pub errors: Vec<String>,
}

/// The most event-log records judged (the newest): a flood costs bounded time per rebuild. At
/// 1,000 events a second that is the last 4 s, in which any `count` up to 4,096 is reached.
pub const MAX_JUDGED_FAULTS: usize = 4096;

/// The fault events among the host's recorded event-log records (a WER report once, by its
/// report ID), and a sentence for each record that cannot be read.
pub fn recorded_faults(facts: &HostFacts) -> (Vec<GpuFault>, Vec<String>) {
    let mut events = Vec::new();
    let mut errors = Vec::new();
    let skip = facts.faults.len().saturating_sub(MAX_JUDGED_FAULTS);
    if skip > 0 {
        errors.push(format!(
            "more than {MAX_JUDGED_FAULTS} event-log records are recorded: only the newest {MAX_JUDGED_FAULTS} are judged"
        ));
    }
    // A WER report is one fault whatever how many of its states were recorded.
    let mut reports = std::collections::HashSet::new();
    for (i, r) in facts.faults.iter().enumerate().skip(skip) {
        match eventlog::parse(&r.xml) {
            Ok(record) => {
                if eventlog::report_id(&record).is_some_and(|id| !reports.insert(id)) {
                    continue;
                }
                if let Some(e) = eventlog::fault(&record) {
                    events.push(e);
                }
            }
            Err(e) => errors.push(format!("event-log record faults[{i}] is not read: {e}")),
        }
    }
    (events, errors)
}

/// [`apply_faults`] over the host's recorded events ([`recorded_faults`]).
pub fn apply_recorded(
    facts: &HostFacts,
    discovery: &mut Discovery,
    policy: &HealthPolicy,
    now_ms: u64,
) -> Applied {
    let (events, errors) = recorded_faults(facts);
    let mut applied = apply_faults(discovery, &events, policy, now_ms);
    applied.errors = errors;
    applied
}

/// Applies `events` to the devices of `discovery` at `now_ms` under `policy`: a device that is
/// Healthy by its conditions becomes Unhealthy with the event's reason while a spell runs. A
/// device already Unhealthy keeps its condition's reason (the condition is what must be fixed).
/// Events after `now_ms` are not counted yet.
pub fn apply_faults(
    discovery: &mut Discovery,
    events: &[GpuFault],
    policy: &HealthPolicy,
    now_ms: u64,
) -> Applied {
    let mut applied = Applied::default();
    let mut times: BTreeMap<(String, Reason), (Vec<u64>, String)> = BTreeMap::new();
    for e in events {
        if policy.of(e.signal).action == Action::Ignore || e.time_ms > now_ms {
            continue;
        }
        let charged = charge(e, &discovery.devices, policy.of(e.signal).ambiguous);
        for id in &charged.devices {
            let slot = times.entry((id.clone(), e.signal)).or_default();
            slot.0.push(e.time_ms);
            slot.1 = e.detail.clone();
        }
        applied.hits.push(Hit {
            event: e.clone(),
            devices: charged.devices,
            ambiguous: charged.ambiguous,
        });
    }
    for ((id, signal), (ts, detail)) in &times {
        let Some(s) = spell(ts, policy.of(*signal), now_ms) else {
            continue;
        };
        if let Some(u) = s.until_ms {
            applied.next_change_ms = Some(applied.next_change_ms.map_or(u, |n| n.min(u)));
        }
        if let Some(d) = discovery.devices.iter_mut().find(|d| &d.id == id) {
            if d.health.is_healthy() {
                let until = match s.until_ms {
                    Some(u) => format!("until {}", eventlog::format_time(u)),
                    None => "until dxdp restarts".into(),
                };
                d.health = Health::unhealthy(
                    *signal,
                    format!(
                        "{detail}; {} such event(s), Unhealthy since {} {until}",
                        ts.len(),
                        eventlog::format_time(s.since_ms),
                    ),
                );
            }
        }
    }
    applied
}

/// The devices of `previous` that are not in `discovery` (they left the host, or were kept as
/// removed before).
pub fn departed<'a>(discovery: &Discovery, previous: &'a Discovery) -> Vec<&'a Device> {
    previous
        .devices
        .iter()
        .filter(|d| discovery.device(&d.id).is_none())
        .collect()
}

/// KEP-4680: the kubelet reports a device that leaves ListAndWatch as Healthy in the pod's
/// `allocatedResourcesStatus`. So a device that left the host while a pod holds it is added back
/// to `discovery` as Unhealthy (`removed`) for as long as `holders` (physical device ID to the
/// pod holding it) names it; it leaves the list once no pod holds it. Returns the IDs kept.
pub fn keep_removed(
    discovery: &mut Discovery,
    previous: &Discovery,
    holders: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut kept = Vec::new();
    let gone: Vec<Device> = departed(discovery, previous).into_iter().cloned().collect();
    for mut d in gone {
        let Some(pod) = holders.get(&d.id) else {
            continue;
        };
        let since = match (&d.health.code, &d.health.reason) {
            (Reason::Removed, Some(r)) => r.clone(),
            _ => format!(
                "the adapter left the host (DXCore no longer lists it, or its device node was removed) while pod {pod} holds it"
            ),
        };
        d.health = Health::unhealthy(Reason::Removed, since);
        kept.push(d.id.clone());
        discovery.devices.push(d);
    }
    kept
}

/// `isolation.policy: withdraw`: every device a pod container uses without having been
/// allocated it (each violation's `used` GPU, a physical device ID) is Unhealthy
/// (`isolation_violation`) while the violation lasts, so the kubelet allocates it to no new pod;
/// the pods that hold it keep it. A device already Unhealthy keeps its own reason. Returns the
/// IDs withdrawn, each once, in the order of `discovery`.
pub fn withdraw(discovery: &mut Discovery, violations: &[Violation]) -> Vec<String> {
    let mut withdrawn = Vec::new();
    for d in discovery.devices.iter_mut() {
        let users = violations.iter().filter(|v| v.used.device == d.id).count();
        if users == 0 || !d.health.is_healthy() {
            continue;
        }
        // The reason reaches the pods that hold the device (GPUUnhealthy Events, in their own
        // namespace): it does not name the other tenant's pod; the log and the
        // GPUIsolationViolation Event on the offending pod do.
        d.health = Health::unhealthy(
            Reason::IsolationViolation,
            format!(
                "withdrawn from allocation while {users} pod container(s) not allocated this GPU use it (isolation.policy: withdraw)"
            ),
        );
        withdrawn.push(d.id.clone());
    }
    withdrawn
}

/// NVML's clock event reasons that make the `thermal` signal: heat and the power brake. Not
/// `sw_power_cap`: a GPU at its power limit under full load works as designed.
pub const THERMAL_THROTTLE_REASONS: [&str; 4] = [
    "hw_slowdown",
    "hw_thermal_slowdown",
    "sw_thermal_slowdown",
    "hw_power_brake_slowdown",
];

/// `health.thermal.marginCelsius` when the operator says nothing: within 5 °C of the warning
/// temperature is "near".
pub const DEFAULT_THERMAL_MARGIN_CELSIUS: u32 = 5;

/// The `thermal` signal of one device's sensor figures: `Some(why)` when its temperature margin
/// (warning minus current) is at most `margin_celsius`, or NVML names one of
/// [`THERMAL_THROTTLE_REASONS`]; `None` when neither (or nothing is known).
pub fn thermal(sensors: &SensorView, margin_celsius: u32) -> Option<String> {
    let mut why = Vec::new();
    if let Some(m) = sensors.temperature_margin_celsius {
        let source = m.source.as_str();
        if m.value <= 0.0 {
            why.push(format!(
                "temperature {:.1} °C over the warning temperature, where the GPU throttles ({source})",
                -m.value
            ));
        } else if m.value <= f64::from(margin_celsius) {
            why.push(format!(
                "temperature {:.1} °C below the warning temperature, within health.thermal.marginCelsius {margin_celsius} ({source})",
                m.value
            ));
        }
    }
    let throttled: Vec<&str> = sensors
        .throttle_reasons
        .iter()
        .map(String::as_str)
        .filter(|r| THERMAL_THROTTLE_REASONS.contains(r))
        .collect();
    if !throttled.is_empty() {
        why.push(format!(
            "clocks held down for {} (nvml)",
            throttled.join(", ")
        ));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// The devices the `thermal` signal holds now: device ID to the sentence of [`thermal`] at
/// the start of the episode (the telemetry sampler publishes it, the refresher applies it).
pub type Hot = std::sync::Arc<BTreeMap<String, String>>;

/// `health.signals.thermal: unhealthy_until_cleared`: every device in `hot` (device ID to the
/// sentence of [`thermal`]) is Unhealthy (`thermal`) while it stays hot; a device already
/// Unhealthy keeps its own reason. Returns the IDs marked, in the order of `discovery`.
pub fn overheated(discovery: &mut Discovery, hot: &BTreeMap<String, String>) -> Vec<String> {
    let mut marked = Vec::new();
    for d in discovery.devices.iter_mut() {
        let Some(why) = hot.get(&d.id) else {
            continue;
        };
        if !d.health.is_healthy() {
            continue;
        }
        d.health = Health::unhealthy(Reason::Thermal, why.clone());
        marked.push(d.id.clone());
    }
    marked
}

/// A device that is Healthy or not, and why, as logs and tools show it.
pub fn describe(health: &Health) -> String {
    match (&health.state, &health.reason) {
        (HealthState::Healthy, _) => "Healthy".into(),
        (HealthState::Unhealthy, Some(r)) => format!("Unhealthy ({}: {r})", health.code),
        (HealthState::Unhealthy, None) => format!("Unhealthy ({})", health.code),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 60_000;

    #[test]
    fn names_are_stable_and_signals_exclude_healthy() {
        let names: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            names,
            [
                "healthy",
                "problem_code",
                "status_unreadable",
                "driver_update",
                "removed",
                "tdr",
                "live_kernel_event",
                "thermal"
            ]
        );
        assert_eq!(Reason::signal_named("tdr"), Some(Reason::Tdr));
        assert_eq!(Reason::signal_named("healthy"), None);
        assert_eq!(Reason::signal_named("xid"), None);
        assert_eq!(
            serde_json::to_string(&Reason::LiveKernelEvent).unwrap(),
            "\"live_kernel_event\""
        );
        for r in Reason::ALL.into_iter().skip(1) {
            assert!(catalogue_entry(r).is_some(), "{r} has no catalogue row");
        }
    }

    #[test]
    fn three_tdrs_within_ten_minutes_make_fifteen_unhealthy_minutes() {
        let p = SignalPolicy {
            action: Action::UnhealthyFor(Duration::from_secs(15 * 60)),
            count: 3,
            window: Duration::from_secs(10 * 60),
            ambiguous: Ambiguous::EventOnly,
        };
        // Events at 0, 4 and 9 minutes: the third is within 10 minutes of the first.
        let t = [0, 4 * M, 9 * M];
        assert_eq!(spell(&t, p, 8 * M), None, "two events are not enough");
        assert_eq!(
            spell(&t, p, 9 * M),
            Some(Spell {
                since_ms: 9 * M,
                until_ms: Some(24 * M)
            })
        );
        assert_eq!(
            spell(&t, p, 24 * M - 1).map(|s| s.until_ms),
            Some(Some(24 * M))
        );
        assert_eq!(spell(&t, p, 24 * M), None, "healthy again after 15 minutes");
        // Three events spread over 11 minutes never trigger.
        assert_eq!(spell(&[0, 6 * M, 11 * M], p, 11 * M), None);
        // A fourth event at 20 minutes (within 10 minutes of 11? no: of 9 and 4? 4,9,20 spans 16)
        // does not extend; one at 12 (4, 9, 12 within 10) extends the spell to 27.
        assert_eq!(
            spell(&[0, 4 * M, 9 * M, 12 * M], p, 25 * M),
            Some(Spell {
                since_ms: 9 * M,
                until_ms: Some(27 * M)
            })
        );
    }

    #[test]
    fn until_cleared_event_only_and_ignore() {
        let until = SignalPolicy::every(Action::UnhealthyUntilCleared);
        assert_eq!(
            spell(&[5 * M], until, 1000 * M),
            Some(Spell {
                since_ms: 5 * M,
                until_ms: None
            })
        );
        assert_eq!(spell(&[5 * M], until, 4 * M), None, "not yet happened");
        assert_eq!(
            spell(&[5 * M], SignalPolicy::every(Action::EventOnly), 6 * M),
            None
        );
        assert_eq!(
            spell(&[5 * M], SignalPolicy::every(Action::Ignore), 6 * M),
            None
        );
    }

    #[test]
    fn policy_overrides_and_ignores() {
        let mut p = HealthPolicy::default();
        assert_eq!(p.of(Reason::Tdr).count, 3);
        assert_eq!(p.of(Reason::LiveKernelEvent).action, Action::EventOnly);
        p.signals.insert(
            Reason::Tdr,
            SignalPolicy::every(Action::UnhealthyUntilCleared),
        );
        assert_eq!(p.of(Reason::Tdr).action, Action::UnhealthyUntilCleared);
        p.ignore.insert(Reason::Tdr);
        assert_eq!(p.of(Reason::Tdr).action, Action::Ignore);
        assert!(p.condition_counts(Reason::DriverUpdate));
        p.ignore.insert(Reason::DriverUpdate);
        assert!(!p.condition_counts(Reason::DriverUpdate));
    }

    #[test]
    fn drivers_name_their_vendor() {
        assert_eq!(driver_vendor("nvlddmkm"), Some(0x10DE));
        assert_eq!(driver_vendor("NVLDDMKM"), Some(0x10DE));
        assert_eq!(driver_vendor("amdkmdag"), Some(0x1002));
        assert_eq!(driver_vendor("igdkmdn64"), Some(0x8086));
        assert_eq!(driver_vendor("BasicDisplay"), None);
    }

    fn sample() -> Discovery {
        let facts = crate::sample::sample_host().unwrap();
        crate::pipeline::discover(&facts, &crate::pipeline::PipelineConfig::default())
    }

    fn tdr(time_ms: u64, driver: &str) -> GpuFault {
        GpuFault {
            time_ms,
            signal: Reason::Tdr,
            target: FaultTarget::Driver(driver.into()),
            detail: format!("display driver {driver} was reset"),
        }
    }

    #[test]
    fn repeated_resets_of_a_driver_with_several_devices_are_charged_to_none_by_default() {
        let mut d = sample();
        // The sample host: two A10s and an A100, all NVIDIA.
        let ids: Vec<String> = d.devices.iter().map(|d| d.id.clone()).collect();
        assert_eq!(ids.len(), 3, "{ids:?}");
        assert!(d.devices.iter().all(|d| d.vendor_id == 0x10DE));
        let t0 = 1_795_642_812_512;
        let events = [
            tdr(t0, "nvlddmkm"),
            tdr(t0 + 4 * M, "nvlddmkm"),
            tdr(t0 + 9 * M, "nvlddmkm"),
            tdr(t0 + 9 * M, "ContosoKmd"),
        ];
        let policy = HealthPolicy::default();
        assert_eq!(policy.of(Reason::Tdr).ambiguous, Ambiguous::EventOnly);
        // Three resets in 9 minutes, but event 4101 cannot say which of the three GPUs reset:
        // counted and shown, charged to none, every device stays Healthy.
        let a = apply_faults(&mut d, &events, &policy, t0 + 9 * M);
        assert_eq!(a.hits.len(), 4);
        for hit in &a.hits[..3] {
            assert_eq!(hit.devices, Vec::<String>::new());
            assert_eq!(hit.ambiguous, ids);
        }
        assert_eq!(a.hits[3].devices, Vec::<String>::new(), "ContosoKmd");
        assert_eq!(a.hits[3].ambiguous, Vec::<String>::new(), "ContosoKmd");
        assert_eq!(a.next_change_ms, None);
        assert!(d.devices.iter().all(|d| d.health.is_healthy()));
    }

    #[test]
    fn all_of_vendor_makes_every_device_of_the_driver_unhealthy_for_a_while() {
        let mut d = sample();
        let ids: Vec<String> = d.devices.iter().map(|d| d.id.clone()).collect();
        let t0 = 1_795_642_812_512;
        let events = [
            tdr(t0, "nvlddmkm"),
            tdr(t0 + 4 * M, "nvlddmkm"),
            tdr(t0 + 9 * M, "nvlddmkm"),
            tdr(t0 + 9 * M, "ContosoKmd"),
        ];
        let mut policy = HealthPolicy::default();
        policy.signals.insert(
            Reason::Tdr,
            SignalPolicy {
                action: Action::UnhealthyFor(Duration::from_secs(10 * 60)),
                count: 3,
                window: Duration::from_secs(10 * 60),
                ambiguous: Ambiguous::AllOfVendor,
            },
        );
        // Two resets: counted, still healthy (3 within 10 minutes).
        let a = apply_faults(&mut d, &events, &policy, t0 + 5 * M);
        assert_eq!(a.hits.len(), 2, "the later events have not happened yet");
        assert!(d.devices.iter().all(|d| d.health.is_healthy()));
        assert_eq!(a.next_change_ms, None);
        // The third: Unhealthy for 10 minutes from it, i.e. until t0 + 19 minutes.
        let mut d = sample();
        let a = apply_faults(&mut d, &events, &policy, t0 + 9 * M);
        assert_eq!(a.hits.len(), 4);
        assert_eq!(a.hits[0].devices, ids);
        assert_eq!(a.hits[0].ambiguous, Vec::<String>::new());
        assert_eq!(
            a.hits[3].devices,
            Vec::<String>::new(),
            "ContosoKmd is unmatched"
        );
        assert_eq!(a.next_change_ms, Some(t0 + 19 * M));
        for dev in &d.devices {
            assert_eq!(dev.health.code, Reason::Tdr);
            assert_eq!(
                dev.health.reason.as_deref(),
                Some("display driver nvlddmkm was reset; 3 such event(s), Unhealthy since 2026-11-25T21:49:12Z until 2026-11-25T21:59:12Z")
            );
        }
        let mut d = sample();
        apply_faults(&mut d, &events, &policy, t0 + 19 * M);
        assert!(d.devices.iter().all(|d| d.health.is_healthy()));
        // Ignored: not even a hit.
        let mut ignoring = HealthPolicy::default();
        ignoring.ignore.insert(Reason::Tdr);
        let mut d = sample();
        let a = apply_faults(&mut d, &events, &ignoring, t0 + 9 * M);
        assert!(a.hits.is_empty());
        assert!(d.devices.iter().all(|d| d.health.is_healthy()));
    }

    #[test]
    fn the_only_device_of_a_vendor_is_charged_with_its_drivers_resets() {
        // The sample host with its second and third GPU made Intel: one NVIDIA, two Intel.
        let mut d = sample();
        d.devices[1].vendor_id = 0x8086;
        d.devices[2].vendor_id = 0x8086;
        let ids: Vec<String> = d.devices.iter().map(|d| d.id.clone()).collect();
        let t0 = 1_795_642_812_512;
        let reset = |driver: &str| tdr(t0, driver);
        for ambiguous in [Ambiguous::EventOnly, Ambiguous::AllOfVendor] {
            assert_eq!(
                charge(&reset("nvlddmkm"), &d.devices, ambiguous),
                Charge {
                    devices: vec![ids[0].clone()],
                    ambiguous: vec![]
                }
            );
            // No AMD device: charged to none (not to some device of another vendor).
            assert_eq!(
                charge(&reset("amdkmdag"), &d.devices, ambiguous),
                Charge::default()
            );
        }
        assert_eq!(
            charge(&reset("igdkmd64"), &d.devices, Ambiguous::EventOnly),
            Charge {
                devices: vec![],
                ambiguous: vec![ids[1].clone(), ids[2].clone()]
            }
        );
        assert_eq!(
            charge(&reset("igdkmd64"), &d.devices, Ambiguous::AllOfVendor),
            Charge {
                devices: vec![ids[1].clone(), ids[2].clone()],
                ambiguous: vec![]
            }
        );
        // Three NVIDIA resets in 9 minutes, default policy: the NVIDIA GPU only.
        let events = [
            tdr(t0, "nvlddmkm"),
            tdr(t0 + 4 * M, "nvlddmkm"),
            tdr(t0 + 9 * M, "nvlddmkm"),
        ];
        apply_faults(&mut d, &events, &HealthPolicy::default(), t0 + 9 * M);
        let health: Vec<Reason> = d.devices.iter().map(|d| d.health.code).collect();
        assert_eq!(health, [Reason::Tdr, Reason::Healthy, Reason::Healthy]);
    }

    #[test]
    fn a_recorded_live_kernel_event_report_counts_once_whatever_its_states() {
        let record = |xml: &str| crate::facts::LogRecord { xml: xml.into() };
        let facts = HostFacts {
            faults: vec![
                record(include_str!(
                    "health/events/wer-1001-livekernelevent-141.xml"
                )),
                record(include_str!(
                    "health/events/wer-1001-livekernelevent-141-sent.xml"
                )),
                record(include_str!(
                    "health/events/wer-1001-livekernelevent-117.xml"
                )),
            ],
            ..HostFacts::default()
        };
        let (events, errors) = recorded_faults(&facts);
        assert!(errors.is_empty(), "{errors:?}");
        // Three records, two reports: 141 at 21:40:19.041, 117 at 21:46:33.125.
        let seen: Vec<(u64, &str)> = events
            .iter()
            .map(|e| (e.time_ms, e.detail.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                (
                    1_795_642_819_041,
                    "Windows Error Reporting filed LiveKernelEvent 141 (VIDEO_ENGINE_TIMEOUT_DETECTED)"
                ),
                (
                    1_795_643_193_125,
                    "Windows Error Reporting filed LiveKernelEvent 117 (VIDEO_TDR_TIMEOUT_DETECTED)"
                )
            ]
        );
    }

    #[test]
    fn an_event_naming_nothing_hits_the_only_device_or_none() {
        let mut d = sample();
        let e = GpuFault {
            time_ms: 10,
            signal: Reason::LiveKernelEvent,
            target: FaultTarget::Unknown,
            detail: String::new(),
        };
        for ambiguous in [Ambiguous::EventOnly, Ambiguous::AllOfVendor] {
            assert_eq!(charge(&e, &d.devices, ambiguous), Charge::default());
        }
        d.devices.truncate(1);
        assert_eq!(
            charge(&e, &d.devices, Ambiguous::EventOnly),
            Charge {
                devices: vec![d.devices[0].id.clone()],
                ambiguous: vec![]
            }
        );
    }

    #[test]
    fn withdraw_marks_only_the_gpus_used_without_allocation() {
        use crate::telemetry::isolation::{Adapter, ViolationKind};
        use crate::telemetry::PodRef;
        let mut d = sample();
        let ids: Vec<String> = d.devices.iter().map(|d| d.id.clone()).collect();
        let violation = |pod: &str, used: &str| Violation {
            pod: PodRef {
                namespace: "tenant-b".into(),
                pod: pod.into(),
                container: "main".into(),
            },
            used: Adapter {
                device: used.into(),
                luid: String::new(),
                model: String::new(),
            },
            allocated: vec![],
            processes: 1,
            kind: ViolationKind::NoAllocation,
        };
        // Two containers use the second GPU, one the third; a device dxdp does not list is
        // nothing to withdraw.
        let violations = [
            violation("a", &ids[1]),
            violation("b", &ids[1]),
            violation("c", &ids[2]),
            violation("d", "pciroot-0-pci-ff00-0000000000000000"),
        ];
        // The third already Unhealthy for its own reason: it keeps it.
        d.devices[2].health = Health::unhealthy(Reason::ProblemCode, "code 43");
        assert_eq!(withdraw(&mut d, &violations), vec![ids[1].clone()]);
        let codes: Vec<Reason> = d.devices.iter().map(|d| d.health.code).collect();
        assert_eq!(
            codes,
            [
                Reason::Healthy,
                Reason::IsolationViolation,
                Reason::ProblemCode
            ]
        );
        assert_eq!(
            d.devices[1].health.reason.as_deref(),
            Some("withdrawn from allocation while 2 pod container(s) not allocated this GPU use it (isolation.policy: withdraw)")
        );
        assert_eq!(Reason::IsolationViolation.as_str(), "isolation_violation");
        assert_eq!(Reason::signal_named("isolation_violation"), None);
        // No violation: nothing changes.
        let mut d = sample();
        assert!(withdraw(&mut d, &[]).is_empty());
        assert!(d.devices.iter().all(|d| d.health.is_healthy()));
    }

    #[test]
    fn thermal_is_a_margin_within_the_limit_or_a_thermal_throttle_reason() {
        use crate::telemetry::sensors::{Figure, SensorSource};
        assert!(Reason::Thermal.is_condition());
        assert_eq!(Reason::signal_named("thermal"), Some(Reason::Thermal));
        assert_eq!(
            HealthPolicy::default().of(Reason::Thermal).action,
            Action::EventOnly
        );
        let margin = |value| SensorView {
            temperature_margin_celsius: Some(Figure {
                value,
                source: SensorSource::D3dkmt,
            }),
            ..SensorView::default()
        };
        assert_eq!(thermal(&SensorView::default(), 5), None, "nothing known");
        assert_eq!(thermal(&margin(5.5), 5), None);
        assert_eq!(
            thermal(&margin(5.0), 5).as_deref(),
            Some("temperature 5.0 °C below the warning temperature, within health.thermal.marginCelsius 5 (d3dkmt)")
        );
        assert_eq!(thermal(&margin(0.5), 0), None, "margin 0: only at or over");
        assert_eq!(
            thermal(&margin(-2.5), 0).as_deref(),
            Some(
                "temperature 2.5 °C over the warning temperature, where the GPU throttles (d3dkmt)"
            )
        );
        let mut capped = margin(20.0);
        capped.throttle_reasons = vec!["sw_power_cap".into()];
        assert_eq!(thermal(&capped, 5), None, "a power cap is not heat");
        capped.throttle_reasons = vec!["hw_power_brake_slowdown".into(), "sw_power_cap".into()];
        assert_eq!(
            thermal(&capped, 5).as_deref(),
            Some("clocks held down for hw_power_brake_slowdown (nvml)")
        );
        let mut both = margin(1.0);
        both.throttle_reasons = vec!["hw_thermal_slowdown".into(), "sw_thermal_slowdown".into()];
        assert_eq!(
            thermal(&both, 5).as_deref(),
            Some("temperature 1.0 °C below the warning temperature, within health.thermal.marginCelsius 5 (d3dkmt); clocks held down for hw_thermal_slowdown, sw_thermal_slowdown (nvml)")
        );
    }

    #[test]
    fn overheated_marks_only_hot_healthy_devices() {
        let mut d = sample();
        let ids: Vec<String> = d.devices.iter().map(|d| d.id.clone()).collect();
        d.devices[2].health = Health::unhealthy(Reason::ProblemCode, "code 43");
        let hot = BTreeMap::from([
            (ids[1].clone(), "too hot".to_string()),
            (ids[2].clone(), "also hot".to_string()),
            ("gone".to_string(), "hot".to_string()),
        ]);
        assert_eq!(overheated(&mut d, &hot), vec![ids[1].clone()]);
        let codes: Vec<Reason> = d.devices.iter().map(|d| d.health.code).collect();
        assert_eq!(
            codes,
            [Reason::Healthy, Reason::Thermal, Reason::ProblemCode]
        );
        assert_eq!(d.devices[1].health.reason.as_deref(), Some("too hot"));
        let mut d = sample();
        assert!(overheated(&mut d, &BTreeMap::new()).is_empty());
    }

    #[test]
    fn a_device_that_left_stays_unhealthy_while_held_and_goes_once_free() {
        let before = sample();
        let mut after = sample();
        let gone = after.devices.remove(1);
        let mut holders = BTreeMap::new();
        holders.insert(gone.id.clone(), "ml/train-0".to_string());
        assert_eq!(departed(&after, &before).len(), 1);
        let mut now = after.clone();
        assert_eq!(
            keep_removed(&mut now, &before, &holders),
            vec![gone.id.clone()]
        );
        let kept = now.device(&gone.id).unwrap();
        assert_eq!(kept.health.code, Reason::Removed);
        assert_eq!(kept.health.state, HealthState::Unhealthy);
        assert_eq!(
            kept.health.reason.as_deref(),
            Some("the adapter left the host (DXCore no longer lists it, or its device node was removed) while pod ml/train-0 holds it")
        );
        // The next rebuild (from the kept list) keeps it, with the same sentence.
        let mut again = after.clone();
        keep_removed(&mut again, &now, &holders);
        assert_eq!(again.device(&gone.id).unwrap().health, kept.health);
        // No holder: it leaves.
        let mut free = after.clone();
        assert!(keep_removed(&mut free, &again, &BTreeMap::new()).is_empty());
        assert!(free.device(&gone.id).is_none());
    }
}
