//! The live inventory: the latest devices and the configuration they were made with,
//! republished whenever the host facts or the configuration change.
//!
//! The refresher reloads the facts at once when a file of the source changes (a host snapshot
//! edited or replaced) or the source wakes it (a DXCore adapter notification), asks the source
//! on every slow safety poll whether facts without events changed (device health on Windows),
//! and reruns the pipeline over the last facts when the configuration changes. A load that fails
//! keeps the last good inventory. Warnings and load errors are logged when they change, not on
//! every refresh. Every load has a time limit ([`crate::util::bounded`]): one that does not
//! return keeps the last good inventory and fails `/healthz` until it returns.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};

use super::file_watch::{parent_dirs, Change, DirEvent, FileWatch, Notice, Recheck};
use crate::backend::HostFactsSource;
use crate::config::file::IsolationPolicy;
use crate::config::Config;
use crate::kubelet::podresources;
use crate::observe::device_health::{DeviceHealth, UNMATCHED};
use crate::observe::metrics::{DeviceCounts, Metrics};
use crate::observe::Observe;
use crate::transport::Endpoint;
use crate::util::bounded::Lane;
use dxdp_core::allocation;
use dxdp_core::devices::{HealthState, Resource};
use dxdp_core::facts::HostFacts;
use dxdp_core::health::reason::Reason;
use dxdp_core::telemetry::isolation::Active;
use dxdp_core::telemetry::PodAllocation;

use crate::inventory::{build, Inventory, InventoryRx};
use crate::util::task::Task;

/// Logs each notice that was not in `logged` and remembers the current set.
fn log_new(notices: Vec<String>, logged: &mut BTreeSet<String>) {
    for n in &notices {
        if !logged.contains(n) {
            tracing::warn!("{n}");
        }
    }
    *logged = notices.into_iter().collect();
}

/// The files of a source (or of the configuration) and the directories watched for them.
pub(super) struct Files {
    dirs: Vec<PathBuf>,
    names: BTreeSet<OsString>,
}

impl Files {
    pub(super) fn new(files: &[PathBuf]) -> Self {
        Files {
            dirs: parent_dirs(files),
            names: files
                .iter()
                .filter_map(|f| f.file_name().map(|n| n.to_os_string()))
                .collect(),
        }
    }

    /// Whether an event may concern one of the files: the file itself, or a ConfigMap-style
    /// `..data` swap beside it.
    fn concerns(&self, e: &DirEvent) -> bool {
        self.dirs.contains(&e.dir) && (self.names.contains(&e.name) || is_swap(e))
    }

    /// What a batch of events means for the files.
    pub(super) fn classify(&self, events: &[DirEvent]) -> Batch {
        let relevant: Vec<&DirEvent> = events.iter().filter(|e| self.concerns(e)).collect();
        if relevant.is_empty() {
            Batch::Unrelated
        } else if relevant.iter().any(|e| e.change.completes() || is_swap(e)) {
            Batch::Complete
        } else if relevant.iter().all(|e| e.change == Change::Removed) {
            Batch::Removed
        } else {
            Batch::Writing
        }
    }
}

/// A ConfigMap-style swap (`..data`, `..2026_11_23_…`): atomic by construction.
fn is_swap(e: &DirEvent) -> bool {
    e.name.to_string_lossy().starts_with("..")
}

/// What a batch of file events means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Batch {
    /// Nothing about the source's files.
    Unrelated,
    /// A file was renamed into place or closed after writing: read it now.
    Complete,
    /// A file is being written (created, modified): wait for it to be closed.
    Writing,
    /// A file was removed.
    Removed,
}

/// How long a file may be written in place before it is read anyway (with the source's own
/// settle check): enough for any editor's save, short enough to notice a writer that never
/// closes, and the only path on Windows, which reports no close events.
pub(super) const WRITE_GRACE: Duration = Duration::from_millis(300);

/// How a reload reads the facts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// The files are complete.
    Complete,
    /// The files may be mid-write: let the source make sure.
    Careful,
}

/// The device gauges of an inventory: per served name (each enabled resource's name and
/// aliases), its physical devices by health and the devices the kubelet sees.
pub(crate) fn device_counts(inventory: &Inventory) -> Vec<DeviceCounts> {
    let expected = dxdp_core::health::expected::judge(
        &inventory.discovery,
        &inventory.config.expected_counts(),
    );
    crate::inventory::endpoints(&inventory.config)
        .into_iter()
        .map(|(r, name)| {
            let (mut healthy, mut unhealthy) = (0, 0);
            for d in inventory.discovery.devices_for(r) {
                match d.health.state {
                    HealthState::Healthy => healthy += 1,
                    HealthState::Unhealthy => unhealthy += 1,
                }
            }
            let served = crate::inventory::served(&inventory.config, r, &name);
            let advertised = allocation::advertise(&inventory.discovery, r, served).len();
            DeviceCounts {
                resource: name,
                healthy,
                unhealthy,
                advertised: advertised as u64,
                expected: expected
                    .iter()
                    .find(|c| c.resource == r)
                    .map(|c| (u64::from(c.expected), u64::from(c.missing()))),
            }
        })
        .collect()
}

/// The served name of a device's resource (the first of its names that advertises it: the
/// memory resource for a GPU shared by memory), or `none`.
fn served_name(inventory: &Inventory, device: &dxdp_core::devices::Device) -> String {
    let endpoints = crate::inventory::endpoints(&inventory.config);
    let advertises = |r: Resource, n: &str| {
        crate::inventory::served(&inventory.config, r, n).shares(device.dedicated_memory_bytes) > 0
    };
    device
        .resource
        .and_then(|r| {
            endpoints
                .iter()
                .find(|(e, n)| *e == r && advertises(r, n))
                .or_else(|| endpoints.iter().find(|(e, _)| *e == r))
        })
        .map(|(_, n)| n.clone())
        .unwrap_or_else(|| "none".into())
}

/// Every device's health for `dxdp_device_health`.
pub fn device_health(inventory: &Inventory) -> Vec<DeviceHealth> {
    inventory
        .discovery
        .devices
        .iter()
        .map(|d| DeviceHealth {
            device: d.id.clone(),
            resource: served_name(inventory, d),
            reason: d.health.code.as_str().to_string(),
        })
        .collect()
}

/// Whether a device of `inventory` is withdrawn for an isolation violation.
fn withdrawn_any(inventory: &Inventory) -> bool {
    inventory
        .discovery
        .devices
        .iter()
        .any(|d| d.health.code == Reason::IsolationViolation)
}

/// Whether the `thermal` signal makes hot devices Unhealthy under `config`.
fn thermal_counts(config: &Config) -> bool {
    let health = &config.pipeline.health;
    health.enabled && health.policy.condition_counts(Reason::Thermal)
}

/// Whether a device of `inventory` is Unhealthy for heat.
fn held_for_heat(inventory: &Inventory) -> bool {
    inventory
        .discovery
        .devices
        .iter()
        .any(|d| d.health.code == Reason::Thermal)
}

/// The fault events of `inventory` not counted yet (by `seen`), counted into `metrics`; `seen`
/// then holds the events still recorded (so that it stays as small as the host's record).
pub fn count_faults(inventory: &Inventory, seen: &mut BTreeSet<(u64, String)>, metrics: &Metrics) {
    let mut now_seen = BTreeSet::new();
    for hit in &inventory.faults {
        let key = (hit.event.time_ms, hit.event.detail.clone());
        if !seen.contains(&key) && !now_seen.contains(&key) {
            let kind = hit.event.signal.as_str();
            if hit.devices.is_empty() {
                metrics.device_health().fault(UNMATCHED, kind);
            }
            if !hit.ambiguous.is_empty() {
                tracing::info!(
                    kind,
                    event = %hit.event.detail,
                    devices = %hit.ambiguous.join(","),
                    "fault event charged to no device: it cannot say which of these it was (health.signals.{kind}.ambiguous: event_only; docs/health.md)"
                );
            }
            for d in &hit.devices {
                metrics.device_health().fault(d, kind);
            }
        }
        now_seen.insert(key);
    }
    *seen = now_seen;
}

/// Logs each device whose health differs between `old` and `new` (with `old` absent: every
/// Unhealthy device, as at start), with the reason: a warning when a device becomes Unhealthy,
/// an info line when it recovers or leaves.
pub(crate) fn log_health(old: Option<&Inventory>, new: &Inventory) {
    for d in &new.discovery.devices {
        let before = old
            .and_then(|o| o.discovery.device(&d.id))
            .map(|o| &o.health);
        if before == Some(&d.health) || (before.is_none() && old.is_none() && d.health.is_healthy())
        {
            continue;
        }
        let resource = served_name(new, d);
        if d.health.is_healthy() {
            tracing::info!(
                device = %d.id,
                resource = %resource,
                reason = d.health.code.as_str(),
                was = before.map(|b| b.code.as_str()).unwrap_or("new"),
                "device is Healthy"
            );
        } else {
            tracing::warn!(
                device = %d.id,
                description = %d.description,
                resource = %resource,
                reason = d.health.code.as_str(),
                "device is Unhealthy: {}",
                d.health.reason.as_deref().unwrap_or("no detail")
            );
        }
    }
    for o in old.iter().flat_map(|o| o.discovery.devices.iter()) {
        if new.discovery.device(&o.id).is_none() {
            tracing::info!(device = %o.id, description = %o.description, "device left the host");
        }
    }
}

/// Keeps the device gauges of `metrics` equal to the current inventory until the inventory's
/// sender is gone: per-resource counts, every device's health reason, and the fault events.
#[derive(Clone, Debug)]
pub(crate) struct DeviceGauges {
    /// The served inventory.
    pub(crate) inventory: InventoryRx,
    /// Where the gauges are.
    pub(crate) metrics: Metrics,
}

impl Task for DeviceGauges {
    async fn run(self) {
        let DeviceGauges {
            mut inventory,
            metrics,
        } = self;
        let mut seen = BTreeSet::new();
        // What was last said about missing devices (`None`: none missing).
        let mut missing: Option<String> = None;
        loop {
            {
                let current = inventory.borrow_and_update().clone();
                say_missing(&current, &mut missing);
                metrics.set_devices(&device_counts(&current));
                metrics.device_health().set_current(device_health(&current));
                count_faults(&current, &mut seen, &metrics);
            }
            if inventory.changed().await.is_err() {
                return;
            }
        }
    }
}

/// Logs, once per change, that devices `health.expectedDevices` expects are missing (a
/// warning), or that they are back.
fn say_missing(inventory: &Inventory, said: &mut Option<String>) {
    let counts = dxdp_core::health::expected::judge(
        &inventory.discovery,
        &inventory.config.expected_counts(),
    );
    let now = dxdp_core::health::expected::missing_message(&counts);
    if now == *said {
        return;
    }
    match &now {
        Some(m) => tracing::warn!(
            "GPUs missing: {m} (health.expectedDevices; docs/alerts.md#dxdpgpumissing)"
        ),
        None => tracing::info!("every GPU health.expectedDevices expects is on the host again"),
    }
    *said = now;
}

/// How long the refresher waits for PodResources when a device left the host.
const HOLDERS_TIMEOUT: Duration = Duration::from_secs(5);

/// Physical device ID to the pod holding it (`namespace/pod`), from PodResources' answer, for the
/// devices of `previous`.
pub(crate) fn holders(
    previous: &Inventory,
    allocations: &[PodAllocation],
) -> BTreeMap<String, String> {
    let endpoints = crate::inventory::endpoints(&previous.config);
    let mut out = BTreeMap::new();
    for a in allocations {
        let Some((r, name)) = endpoints.iter().find(|(_, n)| *n == a.resource) else {
            continue;
        };
        let served = crate::inventory::served(&previous.config, *r, name);
        for id in &a.device_ids {
            if let Some(d) = allocation::resolve(&previous.discovery, *r, served, id) {
                out.entry(d.id.clone())
                    .or_insert_with(|| format!("{}/{}", a.namespace, a.pod));
            }
        }
    }
    out
}

/// KEP-4680: keeps each device of `previous` that left the host in `inventory` as Unhealthy
/// (`removed`) while PodResources shows a pod holding it. When PodResources does not answer
/// (no kubelet socket, a kubelet without the API), the devices leave the list as before, with
/// a warning: keeping them until an answer that may never come would list a device forever.
async fn keep_held(
    inventory: &mut Inventory,
    previous: &Inventory,
    kubelet_dir: &Path,
    last_error: &mut Option<String>,
) {
    let health = &inventory.config.pipeline.health;
    if !health.enabled || !health.policy.condition_counts(Reason::Removed) {
        return;
    }
    let gone: Vec<String> = dxdp_core::health::departed(&inventory.discovery, &previous.discovery)
        .into_iter()
        .map(|d| d.id.clone())
        .collect();
    if gone.is_empty() {
        return;
    }
    let endpoint = (inventory.config.telemetry.pod_resources_endpoint.clone())
        .unwrap_or_else(|| Endpoint::default_for(kubelet_dir));
    let held = match podresources::list(&endpoint, HOLDERS_TIMEOUT).await {
        Ok(allocations) => {
            if last_error.take().is_some() {
                tracing::info!("PodResources answers again");
            }
            holders(previous, &allocations)
        }
        Err(e) => {
            let e = e.to_string();
            if last_error.as_deref() != Some(e.as_str()) {
                tracing::warn!(
                    devices = ?gone,
                    "devices left the host, and PodResources cannot tell which pods hold them ({e}); they leave the list, so a pod holding one sees it Healthy in allocatedResourcesStatus (docs/health.md)"
                );
                *last_error = Some(e);
            }
            BTreeMap::new()
        }
    };
    dxdp_core::health::keep_removed(&mut inventory.discovery, &previous.discovery, &held);
}

/// What the telemetry tells the refresher: the isolation violations that last, and the devices
/// the `thermal` signal holds.
pub(crate) struct Feeds {
    /// The isolation audit's violations ([`Refresher::active`]).
    pub(crate) active: watch::Receiver<Active>,
    /// The hot devices ([`Refresher::hot`]).
    pub(crate) hot: watch::Receiver<dxdp_core::health::Hot>,
}

/// The name under which a host read that does not return is reported to `/healthz`.
pub(crate) const STALL_NAME: &str = "host facts read";

/// The task that keeps the inventory up to date until every receiver is gone (supervised: it is
/// restarted from the last good facts in `facts` when it ends or panics). Every reload of the
/// host facts is counted in `observe`'s metrics and given `read_limit`; one that does not
/// return fails `/healthz` (as [`STALL_NAME`]) until it does, and no other starts meanwhile.
#[derive(Clone)]
pub(crate) struct Refresher {
    /// Where the host facts come from.
    pub(crate) source: Arc<dyn HostFactsSource>,
    /// The last good facts.
    pub(crate) facts: Arc<Mutex<HostFacts>>,
    /// The notices already shown for the first inventory.
    pub(crate) logged: Vec<String>,
    /// The configuration in force.
    pub(crate) config: watch::Receiver<Arc<Config>>,
    /// Where every inventory is published.
    pub(crate) tx: watch::Sender<Arc<Inventory>>,
    /// The file watch (the directories of the source's files), with its safety tick.
    pub(crate) watch: (FileWatch, Duration),
    /// Metrics and `/healthz`.
    pub(crate) observe: Observe,
    /// How long one read of the host facts may take.
    pub(crate) read_limit: Duration,
    /// The kubelet's device-plugin directory (PodResources, for the holders of vanished devices).
    pub(crate) kubelet_dir: PathBuf,
    /// The GPU isolation violations that last (the audit's): with `isolation.policy: withdraw`
    /// each GPU used without allocation is advertised Unhealthy while its violation lasts.
    pub(crate) active: watch::Receiver<Active>,
    /// The devices the `thermal` signal holds (the telemetry's): with
    /// `health.signals.thermal: unhealthy_until_cleared` each is advertised Unhealthy while hot.
    pub(crate) hot: watch::Receiver<dxdp_core::health::Hot>,
}

impl Task for Refresher {
    /// Runs the task (see [`Refresher`]).
    async fn run(self) {
        let Refresher {
            source,
            facts,
            logged,
            mut config,
            tx,
            watch: (watch, safety),
            observe,
            read_limit,
            kubelet_dir,
            mut active,
            mut hot,
        } = self;
        let mut files_watch = watch.subscribe(&parent_dirs(&source.watched_files()), safety);
        let metrics = observe.metrics.clone();
        // Why PodResources did not answer last time (logged once per error).
        let mut holders_error: Option<String> = None;
        let mut lane = Lane::new(
            format!("reading host facts from {}", source.describe()),
            read_limit,
        );
        // Set while a read that timed out has not returned.
        let mut stalled = false;
        // A restarted task starts over: a read of its previous run that hung is no longer awaited
        // (a new read that hangs says so again).
        observe.health.stalled(STALL_NAME, None);
        let woken = Arc::new(Notify::new());
        {
            let woken = woken.clone();
            source.on_change(Arc::new(move || woken.notify_one()));
        }
        let files = Files::new(&source.watched_files());
        let mut logged: BTreeSet<String> = logged.into_iter().collect();
        let mut last_error: Option<String> = None;
        let mut config_open = true;
        let mut active_open = true;
        let mut hot_open = true;
        // Set while a file is being written in place: when to read it anyway.
        let mut writing_until: Option<tokio::time::Instant> = None;
        // A restarted refresher rebuilds at once (the configuration may have changed meanwhile).
        let mut rebuild = true;
        loop {
            let grace = crate::util::sleep_until(writing_until);
            // A fault-driven Unhealthy spell that ends: rebuild then (health is judged at a time).
            let spell_end = tx.borrow().next_health_change_ms;
            let spell = async move {
                match spell_end {
                    Some(t) => {
                        let wait = t.saturating_sub(crate::inventory::now_ms());
                        tokio::time::sleep(Duration::from_millis(wait.saturating_add(1))).await
                    }
                    None => std::future::pending().await,
                }
            };
            let reload = if std::mem::take(&mut rebuild) {
                None
            } else {
                tokio::select! {
                    notice = files_watch.next() => match notice {
                        Notice::Events(events) => match files.classify(&events) {
                            Batch::Unrelated => continue,
                            Batch::Writing => {
                                // The grace counts from the first write: a writer that keeps
                                // writing without closing is read anyway once it is over.
                                writing_until
                                    .get_or_insert(tokio::time::Instant::now() + WRITE_GRACE);
                                continue;
                            }
                            Batch::Complete => Some(Read::Complete),
                            Batch::Removed => Some(Read::Careful),
                        },
                        // The cheap check: does the source know of a change without events?
                        Notice::Recheck(Recheck::Tick) => source.changed().then_some(Read::Careful),
                        // Events may have been missed: read again.
                        Notice::Recheck(_) => Some(Read::Careful),
                    },
                    _ = grace => Some(Read::Careful),
                    _ = spell => None,
                    _ = woken.notified() => Some(Read::Careful),
                    _ = lane.unstuck(), if stalled => {
                        stalled = false;
                        observe.health.stalled(STALL_NAME, None);
                        tracing::info!("{} returned; reading the host facts again", lane.what());
                        Some(Read::Careful)
                    }
                    changed = active.changed(), if active_open => {
                        if changed.is_err() {
                            active_open = false;
                            continue;
                        }
                        // Violations change health only under withdraw, or when it was just
                        // turned off with GPUs still withdrawn (the rebuild returns them).
                        let withdrawing = config.borrow().isolation.policy == IsolationPolicy::Withdraw;
                        if !withdrawing && !withdrawn_any(&tx.borrow()) {
                            continue;
                        }
                        None
                    }
                    changed = hot.changed(), if hot_open => {
                        if changed.is_err() {
                            hot_open = false;
                            continue;
                        }
                        // Hot devices change health only when the signal says so, or when it
                        // was just turned off with devices still held (the rebuild returns them).
                        if !thermal_counts(&config.borrow()) && !held_for_heat(&tx.borrow()) {
                            continue;
                        }
                        None
                    }
                    changed = config.changed(), if config_open => {
                        if changed.is_err() {
                            // No more configuration updates: keep following the host facts.
                            config_open = false;
                            continue;
                        }
                        None
                    }
                    _ = tx.closed() => return,
                }
            };
            if let Some(how) = reload {
                writing_until = None;
                let loader = source.clone();
                let loaded = lane
                    .run(move || match how {
                        Read::Complete => loader.load_complete(),
                        Read::Careful => loader.load(),
                    })
                    .await
                    .map_err(|e| {
                        if lane.is_stuck() && !stalled {
                            stalled = true;
                            observe.health.stalled(STALL_NAME, Some(e.to_string()));
                        }
                        e.to_string()
                    })
                    .and_then(|r| r.map_err(|e| e.to_string()));
                metrics.host_refresh(loaded.is_ok());
                match loaded {
                    Ok(new) => {
                        if last_error.take().is_some() {
                            tracing::info!("host facts can be read again");
                        }
                        *facts.lock().unwrap_or_else(|p| p.into_inner()) = new;
                    }
                    Err(e) => {
                        if last_error.as_deref() != Some(e.as_str()) {
                            tracing::error!("keeping the last good device list: {e}");
                            last_error = Some(e);
                        }
                        continue;
                    }
                }
            }
            let current = facts.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let (mut inventory, notices) = build(&current, config.borrow_and_update().clone());
            log_new(notices, &mut logged);
            if inventory.config.isolation.policy == IsolationPolicy::Withdraw {
                let violations = active.borrow_and_update().clone();
                if let Some(violations) = violations {
                    dxdp_core::health::withdraw(&mut inventory.discovery, &violations);
                }
            }
            if thermal_counts(&inventory.config) {
                let hot = hot.borrow_and_update().clone();
                dxdp_core::health::overheated(&mut inventory.discovery, &hot);
            }
            let previous = tx.borrow().clone();
            keep_held(&mut inventory, &previous, &kubelet_dir, &mut holders_error).await;
            let changed = tx.send_if_modified(|current| {
                if **current == inventory {
                    false
                } else {
                    *current = Arc::new(inventory);
                    true
                }
            });
            if changed {
                let current = tx.borrow().clone();
                log_health(Some(&previous), &current);
                // New fault events alone (up to once a second in a flood) are not worth a line.
                let same_devices = current.discovery == previous.discovery
                    && current.config == previous.config
                    && current.assignment == previous.assignment;
                if same_devices {
                    tracing::debug!(
                        faults = current.faults.len(),
                        "fault events judged; devices unchanged"
                    );
                } else {
                    tracing::info!(
                        devices = current.discovery.devices.len(),
                        "devices or configuration changed; re-advertising"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dxdp_core::assignment::Assignment;
    use dxdp_core::facts::OsFacts;

    #[test]
    fn auto_assignment_falling_back_is_a_notice() {
        let facts = HostFacts {
            os: Some(OsFacts {
                hcs_schema_versions: vec!["2.1".into()],
                ..OsFacts::default()
            }),
            ..HostFacts::default()
        };
        let mut config = Config {
            assignment: Assignment::Auto,
            ..Config::default()
        };
        let (inv, notices) = build(&facts, Arc::new(config.clone()));
        assert_eq!(inv.assignment, Assignment::ClassGuid);
        assert_eq!(notices.len(), 1, "{notices:?}");
        assert!(notices[0].contains("class-guid"));
        // An explicit location-path on such a host is kept (the daemon refuses it at start) and
        // said on every reload that brings it.
        config.assignment = Assignment::LocationPath;
        let (inv, notices) = build(&facts, Arc::new(config.clone()));
        assert_eq!(inv.assignment, Assignment::LocationPath);
        assert_eq!(notices.len(), 1, "{notices:?}");
        assert!(notices[0].contains("every container start will fail"));
        config.assignment = Assignment::ClassGuid;
        let (_, notices) = build(&facts, Arc::new(config));
        assert!(notices.is_empty(), "{notices:?}");
    }

    #[test]
    fn batches_of_events_say_whether_the_file_is_complete() {
        let files = Files::new(&[PathBuf::from("/d/host.yaml")]);
        // The watcher reports absolute directories ("Z:\\d" under Wine, where "/d" has no drive).
        let e = |name: &str, change: Change| DirEvent {
            dir: std::path::absolute("/d").unwrap(),
            name: name.into(),
            change,
        };
        use Change::*;
        let table: [(&[DirEvent], Batch); 8] = [
            (&[e("other.yaml", Replaced)], Batch::Unrelated),
            (&[e("host.yaml", Other)], Batch::Writing),
            (
                &[e("host.yaml", Created), e("host.yaml", Other)],
                Batch::Writing,
            ),
            (
                &[e("host.yaml", Other), e("host.yaml", Closed)],
                Batch::Complete,
            ),
            (
                &[e("host.yaml.tmp", Closed), e("host.yaml", Replaced)],
                Batch::Complete,
            ),
            (
                &[e("..data_tmp", Created), e("..data", Replaced)],
                Batch::Complete,
            ),
            (&[e("host.yaml", Removed)], Batch::Removed),
            (
                &[e("host.yaml", Removed), e("host.yaml", Created)],
                Batch::Writing,
            ),
        ];
        for (events, want) in table {
            assert_eq!(files.classify(events), want, "{events:?}");
        }
    }

    #[test]
    fn events_concern_the_file_or_a_configmap_swap_in_its_directory() {
        let files = Files::new(&[PathBuf::from("/etc/dxdp/host.yaml")]);
        let event = |dir: &str, name: &str| DirEvent {
            dir: std::path::absolute(dir).unwrap(),
            name: name.into(),
            change: Change::Created,
        };
        assert!(files.concerns(&event("/etc/dxdp", "host.yaml")));
        assert!(files.concerns(&event("/etc/dxdp", "..data")));
        assert!(!files.concerns(&event("/etc/dxdp", "other.yaml")));
        assert!(!files.concerns(&event("/etc", "host.yaml")));
    }
}
