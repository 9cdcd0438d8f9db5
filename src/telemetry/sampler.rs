//! The sampling task: every `telemetry.interval`, read the counters, refresh the containers'
//! process lists (HCS), which pod each container is (the runtime's CRI) and the kubelet's
//! allocations (PodResources), compute the figures and publish them on `/metrics`.
//!
//! It never fails and never panics on bad data: a source that fails is retried with a doubling
//! delay (1 s up to 5 minutes, never more often than the interval), every attempt is counted in
//! `dxdp_telemetry_samples_total{result}`, and the figures are withdrawn while the source fails
//! (stale figures would mislead). A PodResources, CRI or HCS failure keeps the last answer, is
//! counted (`dxdp_telemetry_{pod_resources,cri,hcs}_calls_total{result}`), warned about once
//! per outage and backs off the same way. Device serving never waits for any of it. In the daemon,
//! the isolation audit is fed after every successful sample (`run_with`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use dxdp_core::devices::Resource;
use dxdp_core::telemetry::compute::{compute, device_refs, push_sample, DeviceRef, TelemetryView};
use dxdp_core::telemetry::{
    ContainerProcesses, CounterSample, PodAllocation, PodRef, TelemetryFacts,
};

use super::audit::Tracker;
use crate::backend::counters::{ContainerSource, CounterSource};
use crate::backend::HostFactsSource;
use crate::config::values::CriAddress;
use crate::config::Config;
use crate::inventory::InventoryRx;
use crate::kubelet::cri;
use crate::kubelet::podresources;
use crate::observe::telemetry_metrics::{SampleResult, TelemetryMetrics};
use crate::transport::Endpoint;
use crate::util::bounded::{Lane, Overdue};

/// How long one read of the counters (or of the host facts) may take.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one PodResources `List` call may take.
pub(crate) const POD_RESOURCES_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one CRI `ListContainers` call may take.
pub const CRI_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the device list is rebuilt from the host facts (it changes rarely; the plugin
/// itself reacts to device events).
pub(crate) const DEVICES_REFRESH: Duration = Duration::from_secs(60);
/// How long the sampler waits before its first sample, so that the daemon's own start (reading
/// the host facts, registering with the kubelet) comes first and its errors are reported once,
/// by the daemon.
pub(crate) const START_DELAY: Duration = Duration::from_secs(2);
/// The longest delay between retries of a failing source.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Where the sampler gets its devices.
#[derive(Clone)]
pub enum Devices {
    /// The daemon's inventory (its devices and the configuration in force). The sampler then never collects host facts itself, so it cannot
    /// disturb the daemon's device watching (on Windows, a collection replaces the DXCore session
    /// and resets the health poll).
    Daemon(InventoryRx),
    /// Host facts collected by the sampler itself, every `DEVICES_REFRESH` (for `dxdp top`, a
    /// process of its own).
    Host(Arc<dyn HostFactsSource>),
}

/// What the sampler reads from and writes to.
#[derive(Clone)]
pub struct Sampler {
    /// The counters.
    pub source: Arc<dyn CounterSource>,
    /// The devices.
    pub devices: Devices,
    /// The configuration (telemetry settings; with [`Devices::Host`], also the resource names
    /// and pipeline).
    pub config: watch::Receiver<Arc<Config>>,
    /// Where the kubelet serves PodResources; `None`: use the answer recorded with the samples.
    pub pod_resources: Option<Endpoint>,
    /// Where the container runtime serves CRI, which names each container's pod; `None`: use
    /// the pods recorded with the containers.
    pub cri: Option<Endpoint>,
    /// The live source of the containers' process lists (HCS); `None`: use the containers
    /// recorded with the samples (none live: every process is then the host's).
    pub containers: Option<Arc<dyn ContainerSource>>,
    /// Where the figures and counters go.
    pub metrics: TelemetryMetrics,
}

/// What the sampler keeps between samples.
#[derive(Debug, Default)]
pub struct State {
    window: Vec<CounterSample>,
    devices: Vec<DeviceRef>,
    devices_at: Option<Instant>,
    allocations: Vec<PodAllocation>,
    /// The kubelet's PodResources API answered at least once.
    pod_answered: bool,
    pod_retry: Retry,
    containers: Vec<ContainerProcesses>,
    containers_retry: Retry,
    /// Whether the last listing left running containers unreadable (warned once per episode).
    containers_partial: bool,
    pods: HashMap<String, PodRef>,
    cri_retry: Retry,
    /// The pods of the runtime's last `ListPodSandbox` answer (for `dxdp_pod_info`).
    sandboxes: HashMap<(String, String), cri::PodSandboxInfo>,
    sandbox_retry: Retry,
    /// The `dxdp_pod_info` series of the last sample and the labels left out for a collision;
    /// `None`: off.
    pod_info: Option<(Vec<crate::observe::podinfo::PodInfo>, usize)>,
    stuck_host: Stuck<dxdp_core::facts::HostFacts>,
    stuck_counters: Stuck<TelemetryFacts>,
    stuck_containers: Stuck<crate::backend::counters::ContainerListing>,
}

impl State {
    /// The `dxdp_pod_info` series of the last [`Sampler::step`] and the number of pod labels
    /// left out for a name collision; `None` when off (`telemetry.podLabels` and
    /// `telemetry.podUid` unset).
    pub fn pod_info(&self) -> Option<(Vec<crate::observe::podinfo::PodInfo>, usize)> {
        self.pod_info.clone()
    }
}

/// When a source that failed may be asked again.
#[derive(Debug, Default)]
struct Retry {
    failures: u32,
    next_try: Option<Instant>,
    /// The source answered in the current step (not skipped by backoff, not failed).
    fresh: bool,
}

impl Retry {
    /// Whether the source may be asked now.
    fn due(&self) -> bool {
        self.next_try.is_none_or(|t| Instant::now() >= t)
    }

    /// Records an answer; true when it ends an outage.
    fn answered(&mut self) -> bool {
        let recovered = self.failures > 0;
        self.failures = 0;
        self.next_try = None;
        self.fresh = true;
        recovered
    }

    /// Records a failure, `error`, of the source of `what`, and logs it: at warn for the first of
    /// an outage (what is kept, when it is tried again: see [`backoff`]), at debug after.
    fn failed(&mut self, floor: Duration, error: &str, what: &str) {
        self.failures += 1;
        self.fresh = false;
        let delay = backoff(self.failures, floor);
        self.next_try = Some(Instant::now() + delay);
        if self.failures == 1 {
            tracing::warn!("{error}; {what} keeps the last answer, retrying in {delay:?} and backing off (device serving is not affected)");
        } else {
            tracing::debug!(failures = self.failures, "{error}");
        }
    }
}

/// The delay before retry number `failures` (1 for the first): 1 s doubled per earlier failure,
/// at least `floor`, at most [`MAX_BACKOFF`].
pub(crate) fn backoff(failures: u32, floor: Duration) -> Duration {
    crate::util::retry::Backoff::pauses(Duration::from_secs(1), MAX_BACKOFF)
        .base(failures)
        .max(floor)
}

/// Runs `f` on the blocking pool with [`READ_TIMEOUT`]; a panic in `f` is an error.
///
/// A read that times out keeps its blocking thread (a thread cannot be stopped) and is kept in
/// `stuck`'s [`Lane`]: while it still runs, no second one of the same kind is started, so a source
/// that hangs holds one thread of the blocking pool, never a growing number of them (the pool is
/// the daemon's too).
async fn blocking<T: Send + 'static>(
    stuck: &mut Stuck<T>,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, (SampleResult, String)> {
    blocking_within(READ_TIMEOUT, stuck, f).await
}

/// [`blocking`] with another time limit.
async fn blocking_within<T: Send + 'static>(
    limit: Duration,
    stuck: &mut Stuck<T>,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, (SampleResult, String)> {
    let lane = stuck.get_or_insert_with(|| Lane::new("a telemetry read", limit));
    match lane.run(f).await {
        Ok(r) => r.map_err(|e| (SampleResult::Error, e)),
        Err(Overdue::TimedOut { .. }) => {
            Err((SampleResult::Timeout, format!("no answer within {limit:?}")))
        }
        Err(Overdue::StillRunning { .. }) => Err((
            SampleResult::Timeout,
            format!("the previous read, started more than {limit:?} ago, has not returned yet; not starting another"),
        )),
        Err(Overdue::Panicked { message, .. }) => Err((
            SampleResult::Error,
            format!("the read failed: {message}"),
        )),
    }
}

/// Blocking reads of one kind, one at a time (created by the first).
type Stuck<T> = Option<Lane<Result<T, String>>>;

impl Sampler {
    /// One sample: reads the counters (and, when due, the devices, the containers' processes,
    /// their pods and the kubelet's allocations) and computes the figures. Does not publish them.
    pub async fn step(&self, state: &mut State) -> Result<TelemetryView, (SampleResult, String)> {
        for retry in [
            &mut state.pod_retry,
            &mut state.containers_retry,
            &mut state.cri_retry,
        ] {
            retry.fresh = false;
        }
        let mut config = self.config.borrow().clone();
        let names = |config: &Config, r: Resource| {
            config
                .resources
                .get(&r)
                .filter(|s| s.enabled)
                .map(|s| s.name.clone())
        };
        match &self.devices {
            Devices::Daemon(inventory) => {
                let inventory = inventory.borrow().clone();
                config = inventory.config.clone();
                state.devices = device_refs(&inventory.discovery, |r| names(&config, r));
            }
            Devices::Host(host) => {
                let due = state
                    .devices_at
                    .is_none_or(|at| at.elapsed() >= DEVICES_REFRESH);
                if due {
                    let host = host.clone();
                    let facts = blocking(&mut state.stuck_host, move || {
                        host.load().map_err(|e| e.to_string())
                    })
                    .await?;
                    let discovery = dxdp_core::pipeline::discover(&facts, &config.pipeline);
                    state.devices = device_refs(&discovery, |r| names(&config, r));
                    state.devices_at = Some(Instant::now());
                }
            }
        }
        let source = self.source.clone();
        let mut facts: TelemetryFacts =
            blocking(&mut state.stuck_counters, move || source.read()).await?;
        if facts.samples.len() < 2 {
            // A live read: one new sample; keep the window here.
            for s in std::mem::take(&mut facts.samples) {
                push_sample(&mut state.window, s);
            }
            facts.samples = state.window.clone();
        }
        if let Some(lister) = &self.containers {
            self.refresh_containers(lister, &config, state).await;
            facts.containers = state.containers.clone();
        }
        if let Some(endpoint) = &self.cri {
            self.refresh_pods(endpoint, &config, state).await;
            if config.telemetry.pod_info() {
                self.refresh_sandboxes(endpoint, &config, state).await;
            }
        }
        let allocations = match &self.pod_resources {
            None => facts.pod_resources.clone(),
            Some(endpoint) => {
                self.refresh_allocations(endpoint, &config, state).await;
                state.allocations.clone()
            }
        };
        // The memory resources' units name their GPUs too.
        let units = super::overuse::unit_sizes(&config);
        let served: Vec<String> = config.endpoints().into_iter().map(|(_, n)| n).collect();
        let allocations: Vec<PodAllocation> = allocations
            .into_iter()
            .filter(|a| served.contains(&a.resource) || units.contains_key(&a.resource))
            .collect();
        // The pods the runtime named (empty without CRI) win over the recorded ones.
        let mut view = compute(&state.devices, &facts, &state.pods, &allocations);
        dxdp_core::telemetry::overuse::annotate_shares(&mut view, &units);
        state.pod_info = super::podinfo::pod_info(&view, &state.sandboxes, &config.telemetry);
        Ok(view)
    }

    /// Whether the last [`Sampler::step`] may be judged by the isolation audit: each live
    /// attribution source (PodResources, the HCS process lists, CRI; a recorded one always is)
    /// answered in that very step, neither skipped by backoff nor failed. With an old answer a
    /// pod that started since would look unallocated, and a PID Windows reused would be placed
    /// in the wrong container.
    pub fn sources_current(&self, state: &State) -> bool {
        (self.pod_resources.is_none() || (state.pod_answered && state.pod_retry.fresh))
            && (self.containers.is_none() || state.containers_retry.fresh)
            && (self.cri.is_none() || state.cri_retry.fresh)
    }

    async fn refresh_allocations(&self, endpoint: &Endpoint, config: &Config, state: &mut State) {
        if !state.pod_retry.due() {
            return;
        }
        match podresources::list(endpoint, POD_RESOURCES_TIMEOUT).await {
            Ok(a) => {
                if state.pod_retry.answered() {
                    tracing::info!(%endpoint, "the kubelet's PodResources API answers again");
                }
                self.metrics.pod_resources_call(true);
                state.allocations = a;
                state.pod_answered = true;
            }
            Err(e) => {
                self.metrics.pod_resources_call(false);
                let floor = config.telemetry.interval;
                state
                    .pod_retry
                    .failed(floor, &e.to_string(), "pod attribution");
            }
        }
    }

    async fn refresh_pods(&self, endpoint: &Endpoint, config: &Config, state: &mut State) {
        if !state.cri_retry.due() {
            return;
        }
        match cri::list_pods(endpoint, CRI_TIMEOUT).await {
            Ok(pods) => {
                if state.cri_retry.answered() {
                    tracing::info!(%endpoint, "the container runtime's CRI API answers again");
                }
                self.metrics.cri_call(true);
                state.pods = pods;
            }
            Err(e) => {
                self.metrics.cri_call(false);
                let floor = config.telemetry.interval;
                state
                    .cri_retry
                    .failed(floor, &e.to_string(), "which pod each container is");
            }
        }
    }

    /// Refreshes the pods' UIDs and labels for `dxdp_pod_info`. A failure keeps the last
    /// answer (the pods' series stay, as the per-pod series do on the last `ListContainers`
    /// answer), is counted with the other CRI calls and backs off the same way.
    async fn refresh_sandboxes(&self, endpoint: &Endpoint, config: &Config, state: &mut State) {
        if !state.sandbox_retry.due() {
            return;
        }
        match cri::list_sandboxes(endpoint, CRI_TIMEOUT).await {
            Ok(sandboxes) => {
                if state.sandbox_retry.answered() {
                    tracing::info!(%endpoint, "the container runtime's CRI ListPodSandbox answers again");
                }
                self.metrics.cri_call(true);
                state.sandboxes = sandboxes;
            }
            Err(e) => {
                self.metrics.cri_call(false);
                let floor = config.telemetry.interval;
                state.sandbox_retry.failed(
                    floor,
                    &e.to_string(),
                    "dxdp_pod_info (the pods' UIDs and labels)",
                );
            }
        }
    }

    async fn refresh_containers(
        &self,
        lister: &Arc<dyn ContainerSource>,
        config: &Config,
        state: &mut State,
    ) {
        if !state.containers_retry.due() {
            return;
        }
        let source = lister.clone();
        match blocking(&mut state.stuck_containers, move || source.list()).await {
            Ok(listing) => {
                if state.containers_retry.answered() {
                    tracing::info!(source = %lister.describe(), "the containers' process lists can be read again");
                }
                let partial = !listing.unreadable.is_empty();
                self.metrics
                    .hcs_call(if partial { "partial" } else { "ok" });
                if partial && !state.containers_partial {
                    let (id, why) = &listing.unreadable[0];
                    tracing::warn!(source = %lister.describe(), unreadable = listing.unreadable.len(), "the process lists of some running containers cannot be read (container {id}: {why}); they keep their last known processes (warned once until every container can be read again)");
                } else if !partial && state.containers_partial {
                    tracing::info!(source = %lister.describe(), "every running container's process list can be read again");
                }
                state.containers_partial = partial;
                state.containers = merge_listing(&state.containers, listing);
            }
            Err((_, why)) => {
                self.metrics.hcs_call("error");
                let floor = config.telemetry.interval;
                state.containers_retry.failed(
                    floor,
                    &format!(
                        "cannot read the containers' process lists from {}: {why}",
                        lister.describe()
                    ),
                    "which processes each container has",
                );
            }
        }
    }
}

/// The containers of a new listing, and for each running container it could not read, its
/// previous process list when there is one (a container without one is left out: its processes
/// are the host's until it can be read).
fn merge_listing(
    previous: &[ContainerProcesses],
    listing: crate::backend::counters::ContainerListing,
) -> Vec<ContainerProcesses> {
    let mut out = listing.containers;
    for (id, _) in listing.unreadable {
        if let Some(p) = previous.iter().find(|p| p.id == id) {
            out.push(p.clone());
        }
    }
    out
}

/// The CRI endpoint for `telemetry.criEndpoint` (`configured`, parsed when the configuration
/// was read), or containerd's on this OS.
pub fn cri_endpoint(configured: Option<&CriAddress>) -> Endpoint {
    match configured {
        Some(a) => Endpoint::parse(&a.address),
        None => cri::default_endpoint(),
    }
}

/// A sampler: counters from the host snapshot's recording (with `host_snapshot`) or PDH,
/// PodResources at `telemetry.podResourcesEndpoint`, else the recorded answer (with a snapshot),
/// else the kubelet's endpoint beside `kubelet_dir`. Live, the containers' processes from HCS
/// and their pods from CRI at `telemetry.criEndpoint` (else containerd's); with a snapshot, the
/// recorded containers and pods, unless `telemetry.criEndpoint` is set. `None` (and a log line
/// saying why) when there is no counter source.
pub fn build(
    devices: Devices,
    config: watch::Receiver<Arc<Config>>,
    host_snapshot: Option<&std::path::Path>,
    kubelet_dir: &std::path::Path,
    metrics: TelemetryMetrics,
) -> Option<Sampler> {
    let source = match crate::backend::select_counters(host_snapshot) {
        Ok(s) => s,
        Err(why) => {
            tracing::info!("GPU telemetry is off: {why}");
            return None;
        }
    };
    let (configured, configured_cri) = {
        let c = config.borrow();
        (
            c.telemetry.pod_resources_endpoint.clone(),
            c.telemetry.cri_endpoint.clone(),
        )
    };
    let recorded = source.is_recorded();
    let pod_resources = match configured {
        Some(e) => Some(e),
        None if recorded => None,
        None => Some(Endpoint::default_for(kubelet_dir)),
    };
    let containers: Option<Arc<dyn ContainerSource>> = if recorded {
        None
    } else {
        match crate::backend::native_containers() {
            Ok(c) => Some(Arc::from(c)),
            Err(why) => {
                tracing::info!(
                    "GPU use per pod is off, every process is counted under pod=\"\": {why}"
                );
                None
            }
        }
    };
    let cri = match configured_cri {
        // Live without process lists, the pods of the containers are of no use.
        _ if !recorded && containers.is_none() => None,
        Some(e) => Some(cri_endpoint(Some(&e))),
        None if recorded => None,
        None => Some(cri::default_endpoint()),
    };
    Some(Sampler {
        source: Arc::from(source),
        devices,
        config,
        pod_resources,
        cri,
        containers,
        metrics,
    })
}

/// Samples every `telemetry.interval` until `cancel` completes. Never returns early, never
/// fails: with telemetry off or no source it waits for `cancel`; failures are logged (the first
/// of a run at warn), counted and retried with backoff.
pub async fn run(sampler: Sampler, cancel: impl Future<Output = ()>) {
    run_with(sampler, Trackers::default(), cancel).await
}

/// What the daemon's sampler feeds after every sample.
#[derive(Default)]
pub(crate) struct Trackers {
    /// The isolation audit.
    pub(crate) isolation: Option<Tracker>,
    /// The `thermal` health signal.
    pub(crate) thermal: Option<super::thermal::ThermalTracker>,
    /// GPU memory over-use.
    pub(crate) overuse: Option<super::overuse::OverUseTracker>,
}

/// [`run`], feeding the isolation audit's `tracker` after every successful sample (and telling
/// it when telemetry is off); when no sample could be judged for
/// [`stale_after`](super::audit::stale_after) the interval, its violations end.
pub(crate) async fn run_with(
    sampler: Sampler,
    trackers: Trackers,
    cancel: impl Future<Output = ()>,
) {
    let Trackers {
        isolation: mut tracker,
        mut thermal,
        overuse,
    } = trackers;
    tokio::pin!(cancel);
    let mut state = State::default();
    let mut failures = 0u32;
    tracing::info!(source = %sampler.source.describe(), "GPU telemetry on");
    tokio::select! {
        () = &mut cancel => return,
        () = tokio::time::sleep(START_DELAY) => {}
    }
    loop {
        let config = sampler.config.borrow().clone();
        let wait = if !config.telemetry.enabled {
            sampler.metrics.publish(None);
            if let Some(t) = &mut tracker {
                t.off("telemetry.enabled is false");
            }
            if let Some(t) = &mut thermal {
                t.unknown();
            }
            if let Some(t) = &overuse {
                t.off();
            }
            config.telemetry.interval
        } else {
            let started = Instant::now();
            let result = sampler.step(&mut state).await;
            let elapsed = started.elapsed();
            match result {
                Ok(view) => {
                    sampler.metrics.sample(SampleResult::Ok, elapsed);
                    let view = Arc::new(view);
                    sampler.metrics.publish(Some(view.clone()));
                    match state.pod_info() {
                        Some((pods, collisions)) => {
                            sampler.metrics.publish_pod_info(Some(pods), collisions)
                        }
                        None => sampler.metrics.publish_pod_info(None, 0),
                    }
                    let current = sampler.sources_current(&state);
                    sampler.metrics.attribution_current(current);
                    if let Some(t) = &mut tracker {
                        t.sample(&view, current);
                    }
                    if let Some(t) = &mut thermal {
                        t.sample(&view, &config);
                    }
                    if let Some(t) = &overuse {
                        t.sample(&view, &config, current);
                    }
                    if failures > 0 {
                        tracing::info!(after = failures, "GPU telemetry samples again");
                    }
                    failures = 0;
                    config.telemetry.interval
                }
                Err((outcome, why)) => {
                    sampler.metrics.sample(outcome, elapsed);
                    sampler.metrics.publish(None);
                    sampler.metrics.attribution_current(false);
                    if let Some(t) = &mut thermal {
                        t.unknown();
                    }
                    if let Some(t) = &overuse {
                        t.unknown();
                    }
                    failures += 1;
                    let delay = backoff(failures, config.telemetry.interval);
                    if failures == 1 {
                        tracing::warn!(source = %sampler.source.describe(), "cannot sample the GPU counters: {why}; retrying in {delay:?}, backing off (device serving is not affected)");
                    } else {
                        tracing::debug!(failures, "cannot sample the GPU counters: {why}");
                    }
                    delay
                }
            }
        };
        // Violations stand without a judged sample for a limited time only.
        let limit = super::audit::stale_after(config.telemetry.interval);
        let wait = match &mut tracker {
            Some(t) => {
                t.expire(limit);
                t.stale_at(limit).map_or(wait, |at| {
                    wait.min(at.saturating_duration_since(tokio::time::Instant::now()))
                })
            }
            None => wait,
        };
        tokio::select! {
            () = &mut cancel => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_endpoints_are_the_configured_one_or_containerds() {
        let configured = |text: &str| cri_endpoint(CriAddress::parse(text).unwrap().as_ref());
        assert_eq!(
            configured("npipe:////./pipe/containerd-containerd"),
            Endpoint::Pipe(r"\\.\pipe\containerd-containerd".into())
        );
        assert_eq!(
            configured("unix:///run/k3s/containerd/containerd.sock"),
            Endpoint::Socket("/run/k3s/containerd/containerd.sock".into())
        );
        assert_eq!(cri_endpoint(None), cri::default_endpoint());
        assert_eq!(configured(""), cri::default_endpoint());
    }

    #[test]
    fn a_replay_asks_the_runtime_only_when_an_endpoint_is_configured() {
        let snapshot = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/telemetry-t4.yaml");
        let kubelet = std::path::Path::new("/nonexistent/device-plugins");
        let built = |cri: Option<&str>| {
            let mut config = Config::default();
            config.telemetry.cri_endpoint = cri.and_then(|c| CriAddress::parse(c).unwrap());
            let (_, config) = watch::channel(Arc::new(config));
            let empty = crate::inventory::build(&Default::default(), config.borrow().clone()).0;
            let (_, inventory) = watch::channel(Arc::new(empty));
            build(
                Devices::Daemon(inventory),
                config,
                Some(&snapshot),
                kubelet,
                crate::observe::metrics::Metrics::new().telemetry().clone(),
            )
            .expect("the snapshot is a source")
        };
        let recorded = built(None);
        // The recording's containers and pods: no live lists, no runtime, no kubelet.
        assert!(recorded.containers.is_none() && recorded.cri.is_none());
        assert!(recorded.pod_resources.is_none());
        let asked = built(Some("unix:///run/cri.sock"));
        assert!(asked.containers.is_none());
        assert_eq!(asked.cri, Some(Endpoint::Socket("/run/cri.sock".into())));
    }

    #[test]
    fn containers_that_cannot_be_read_keep_their_last_process_list() {
        let c = |id: &str, pids: &[u32]| ContainerProcesses {
            id: id.into(),
            pids: pids.to_vec(),
            pod: None,
        };
        let previous = [c("a", &[1, 2]), c("b", &[3])];
        let listing = crate::backend::counters::ContainerListing {
            containers: vec![c("a", &[1, 5])],
            unreadable: vec![
                ("b".into(), "access denied".into()),
                ("new".into(), "access denied".into()),
            ],
        };
        // "a" as read now, "b" as last read, "new" (never read) left out.
        assert_eq!(
            merge_listing(&previous, listing),
            [c("a", &[1, 5]), c("b", &[3])]
        );
    }

    // Real time: tokio's paused clock does not advance while a blocking task runs.
    #[tokio::test]
    async fn a_read_that_hangs_holds_one_thread_and_no_second_read_starts_meanwhile() {
        let limit = Duration::from_millis(50);
        let mut stuck = None;
        let (release, hung) = std::sync::mpsc::channel::<()>();
        let first = blocking_within(limit, &mut stuck, move || {
            let _ = hung.recv();
            Ok(1)
        })
        .await;
        assert!(
            matches!(first, Err((SampleResult::Timeout, _))),
            "{first:?}"
        );
        // While it still runs, the next read is not started.
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = started.clone();
        let second = blocking_within(limit, &mut stuck, move || {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(2)
        })
        .await;
        match second {
            Err((SampleResult::Timeout, why)) => assert!(why.contains("not returned yet"), "{why}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert!(!started.load(std::sync::atomic::Ordering::SeqCst));
        // Once it returns, reads start again.
        release.send(()).unwrap();
        while stuck.as_ref().is_some_and(Lane::is_stuck) {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            blocking_within(limit, &mut stuck, || Ok(3)).await.unwrap(),
            3
        );
        assert!(!stuck.as_ref().is_some_and(Lane::is_stuck));
    }

    #[test]
    fn backoff_doubles_from_one_second_within_the_interval_and_five_minutes() {
        let s = Duration::from_secs;
        // (failures, floor, delay)
        let table = [
            (1, s(0), s(1)),
            (2, s(0), s(2)),
            (3, s(0), s(4)),
            (9, s(0), s(256)),
            (10, s(0), s(300)),
            (1000, s(0), s(300)),
            (1, s(10), s(10)),
            (5, s(10), s(16)),
        ];
        for (failures, floor, want) in table {
            assert_eq!(backoff(failures, floor), want, "{failures} {floor:?}");
        }
    }
}
