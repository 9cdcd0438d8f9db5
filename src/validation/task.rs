//! The daemon's validation task (`validation.enabled`): runs a validation Job on its own node
//! after registration, after a driver change and on a schedule, one at a time, and publishes
//! the result (node labels, metrics, a Node Event on failure).
//!
//! - **When**: once every served resource is registered and the kubelet watches it (the
//!   daemon's readiness), and the devices have been stable for [`Timing::settle`]: first after
//!   start, again when the served devices or their driver versions change (a driver update),
//!   and every `validation.interval`. A run that gives `unknown` (no free device, the image not
//!   pulled, the API server refusing) is tried again after [`Timing::retry_unknown`] (at most
//!   the interval). The configuration is read at each run: a reload applies then.
//! - **A run**: places the daemon's `dxdp.exe` on the host ([`super::exe`]), creates
//!   the Job and follows it ([`super::run::run_once`]) within `validation.timeout`,
//!   applies the labels, records the metrics, creates a Warning Event about the Node when it
//!   failed (rate-limited), deletes a Job it gave up on, Jobs of an earlier daemon left running
//!   and finished Jobs beyond the newest [`Timing::keep_jobs`], and copies of `dxdp.exe` that
//!   no Job uses.
//! - **Never stuck**: every wait has a limit; every API failure is a result (`unknown`) or is
//!   logged once and tried again later; device serving never waits for any of it.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams};
use tokio::sync::watch;
use tokio::time::Instant;

use super::exe;
use super::job::{label_value, JobResult, JobSpec, COMPONENT, COMPONENT_LABEL, NODE_LABEL};
use super::run::{publish_labels, run_once};
use crate::cluster::events::{EventLimits, EventSender, Voice};
use crate::cluster::Cluster;
use crate::config::validation::Validation;
use crate::config::Config;
use crate::inventory::{Inventory, InventoryRx};
use crate::observe::event_metrics::EventResult;
use crate::observe::state::Readiness;
use crate::observe::validation::ValidationMetrics;
use crate::util::bounded::{run_blocking, Overdue};
use crate::util::retry::{random, Backoff};
use crate::util::task::Task;
use dxdp_core::devices::Resource;
use dxdp_core::validation::Verdict;

/// The environment variable naming the daemon's namespace (the chart sets it from
/// `metadata.namespace`): the validation Jobs live there.
pub(crate) const NAMESPACE_VAR: &str = "POD_NAMESPACE";

/// The reason of the Event on a failed validation.
pub(crate) const EVENT_REASON: &str = "GPUValidationFailed";

/// The time constants of the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    /// How often a running Job and its pod are read.
    pub(crate) poll: Duration,
    /// How long the devices must stay unchanged before a run (a driver update changes them in
    /// several steps).
    pub(crate) settle: Duration,
    /// When a run gave `unknown`, the next one after this long (at most the interval).
    pub(crate) retry_unknown: Duration,
    /// Finished Jobs kept for inspection (the newest).
    pub(crate) keep_jobs: usize,
    /// The limit of placing `dxdp.exe` on the host.
    pub(crate) place_limit: Duration,
    /// The Events' rate limit.
    pub(crate) events: EventLimits,
}

/// The daemon's timing.
pub(crate) const TIMING: Timing = Timing {
    poll: Duration::from_secs(5),
    settle: Duration::from_secs(30),
    retry_unknown: Duration::from_secs(30 * 60),
    keep_jobs: 3,
    place_limit: Duration::from_secs(60),
    events: EventLimits {
        burst: 3,
        every: Duration::from_secs(600),
        dedup: Duration::from_secs(3600),
    },
};

/// What the task needs.
#[derive(Clone)]
pub(crate) struct ValidationTask {
    /// The API server client of this node.
    pub(crate) cluster: Cluster,
    /// The daemon's namespace (`POD_NAMESPACE`); `None`: the task says so once and idles.
    pub(crate) namespace: Option<String>,
    /// The served inventory.
    pub(crate) inventory: InventoryRx,
    /// The configuration in force.
    pub(crate) config: watch::Receiver<Arc<Config>>,
    /// Whether every served resource is registered and watched.
    pub(crate) readiness: Readiness,
    /// The metrics.
    pub(crate) metrics: ValidationMetrics,
    /// The executable to place on the host (the running `dxdp.exe`).
    pub(crate) exe: PathBuf,
    /// Its version (part of the copy's directory name).
    pub(crate) version: String,
    /// Retries of label applies.
    pub(crate) backoff: Backoff,
    /// The time constants.
    pub(crate) timing: Timing,
    /// Counts the runs done (published and cleaned up), for whoever waits on them (tests);
    /// `None`: not counted.
    pub(crate) done: Option<Arc<watch::Sender<u64>>>,
}

impl std::fmt::Debug for ValidationTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValidationTask")
            .field("node", &self.cluster.node())
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// What a run validates, and what identifies the devices it validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The served resource names with at least one healthy device (one of each is requested).
    pub(crate) resources: Vec<String>,
    /// The served devices and their driver versions (`resource/id/driver`), sorted: a change
    /// of it (a driver update, a device added or gone) triggers a run.
    pub(crate) fingerprint: Vec<String>,
}

/// The plan for `inventory`: `None` when no served resource has a healthy device.
pub(crate) fn plan(inventory: &Inventory) -> Option<Plan> {
    let config = &inventory.config;
    let mut resources = Vec::new();
    let mut fingerprint = Vec::new();
    for r in Resource::ALL {
        let Some(s) = config.resources.get(&r).filter(|s| s.enabled) else {
            continue;
        };
        let devices: Vec<_> = inventory.discovery.devices_for(r).collect();
        for d in &devices {
            fingerprint.push(format!("{}/{}/{}", s.name, d.id, d.driver_version));
        }
        if devices
            .iter()
            .any(|d| d.health.state == dxdp_core::devices::HealthState::Healthy)
        {
            resources.push(s.name.clone());
        }
    }
    fingerprint.sort();
    (!resources.is_empty()).then_some(Plan {
        resources,
        fingerprint,
    })
}

/// The image for a host of Windows `build` (`10.0.20348.1547`): Server Core of the matching
/// LTSC release, the one base image whose build matches the host (process isolation needs it)
/// and that has the DirectX runtime. Unknown builds get ltsc2022, and the reason says so.
pub(crate) fn default_image(build: Option<&str>) -> (String, Option<String>) {
    let number = build
        .and_then(|b| b.split('.').nth(2))
        .and_then(|n| n.parse::<u32>().ok());
    let tag = match number {
        Some(17763) => Some("ltsc2019"),
        Some(20348) => Some("ltsc2022"),
        Some(26100) => Some("ltsc2025"),
        _ => None,
    };
    let image = |t: &str| format!("mcr.microsoft.com/windows/servercore:{t}");
    match tag {
        Some(t) => (image(t), None),
        None => (
            image("ltsc2022"),
            Some(format!(
                "the host's Windows build {} has no Server Core LTSC image dxdp knows; using ltsc2022: set validation.image to an image matching the host's build",
                build.unwrap_or("(unknown)")
            )),
        ),
    }
}

/// `dxdp validate --timeout` (each check's limit) for a run limited to `limit`: a quarter of
/// it, from 30 s to 120 s.
pub(crate) fn check_timeout(limit: Duration) -> Duration {
    (limit / 4).clamp(Duration::from_secs(30), Duration::from_secs(120))
}

/// Why a run is due now, or `None`.
pub(crate) fn due(
    last: Option<&[String]>,
    fingerprint: &[String],
    next: Option<Instant>,
    now: Instant,
) -> Option<&'static str> {
    match last {
        None => Some("after registration"),
        Some(l) if l != fingerprint => Some("after a device or driver change"),
        Some(_) if next.is_some_and(|n| now >= n) => Some("on schedule"),
        Some(_) => None,
    }
}

/// A failed run, as its Event tells it.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    /// The namespace of the Job (and of the Event).
    pub(crate) namespace: String,
    /// The Job's name.
    pub(crate) job: String,
    /// What the run gave.
    pub(crate) result: JobResult,
}

/// How the validation's Events are named in the log.
const VOICE: Voice = Voice {
    failing: "cannot report a failed GPU validation as an Event",
    resumed: "Events about failed GPU validations",
    grant: "the chart does with validation.enabled",
};

/// The Event about the node for a failed run.
pub(crate) fn event(f: &Failure, node: &str, now: Time) -> Event {
    let (namespace, job, result) = (&f.namespace, &f.job, &f.result);
    let failed = result
        .summary
        .as_ref()
        .map(|s| s.failed.join(", "))
        .filter(|f| !f.is_empty())
        .unwrap_or_else(|| "(no summary)".into());
    let message = format!(
        "GPU validation failed on node {node}: {failed} (Job {namespace}/{job}: {}). See dxdp's docs/validation.md, \"Reading a failure\"",
        result.reason
    );
    crate::cluster::events::warning(
        crate::cluster::events::Warning {
            namespace: namespace.to_string(),
            // As the kubelet refers to its node (the UID is the node's name): `kubectl describe
            // node` shows the Event.
            involved: ObjectReference {
                uid: Some(node.to_string()),
                ..crate::cluster::events::node_ref(node)
            },
            related: Some(ObjectReference {
                api_version: Some("batch/v1".into()),
                kind: Some("Job".into()),
                name: Some(job.clone()),
                namespace: Some(namespace.to_string()),
                ..ObjectReference::default()
            }),
            reason: EVENT_REASON,
            action: "Validate",
            message,
        },
        node,
        now,
    )
}

/// One of this node's validation Jobs as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    /// Its name.
    pub(crate) name: String,
    /// Its creation time (RFC 3339).
    pub(crate) created: String,
    /// It completed or failed.
    pub(crate) finished: bool,
    /// The host directory it mounts (the `dxdp.exe` copy it runs).
    pub(crate) host_dir: Option<String>,
}

/// A Job of the list answer.
pub(crate) fn listed(job: &Job) -> Listed {
    let spec = job.spec.as_ref().and_then(|s| s.template.spec.as_ref());
    let conditions = job.status.as_ref().and_then(|s| s.conditions.as_ref());
    Listed {
        name: job.metadata.name.clone().unwrap_or_default(),
        // As the API server writes it.
        created: (job.metadata.creation_timestamp.as_ref())
            .map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
            .unwrap_or_default(),
        finished: conditions
            .into_iter()
            .flatten()
            .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True"),
        host_dir: (spec.and_then(|s| s.volumes.as_ref()).into_iter().flatten())
            .find_map(|v| v.host_path.as_ref())
            .map(|h| h.path.clone()),
    }
}

impl Cluster {
    fn jobs(&self, namespace: &str) -> Api<Job> {
        Api::namespaced(self.client.clone(), namespace)
    }

    async fn validation_jobs(&self, namespace: &str) -> Result<Vec<Listed>, String> {
        let selector = format!(
            "{COMPONENT_LABEL}={COMPONENT},{NODE_LABEL}={}",
            label_value(&self.node)
        );
        let (jobs, params) = (
            self.jobs(namespace),
            ListParams::default().labels(&selector),
        );
        let list = self.call("list the validation Jobs of", jobs.list(&params));
        let list = list.await.map_err(|e| e.to_string())?;
        Ok(list.items.iter().map(listed).collect())
    }

    async fn delete_job(&self, namespace: &str, name: &str) -> Result<(), String> {
        // Background: the Job's pod goes with it (and frees its devices).
        let (jobs, params) = (self.jobs(namespace), DeleteParams::background());
        let deleted = self.call("delete a validation Job of", jobs.delete(name, &params));
        match deleted.await {
            Ok(_) => Ok(()),
            // Already gone: what was asked for.
            Err(e) if e.status == Some(404) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What one run needs from the configuration.
struct RunSettings {
    validation: Validation,
    image: String,
}

impl Task for ValidationTask {
    /// The task: until the inventory channel closes, runs validations when they are due.
    async fn run(self) {
        let t = self;
        let mut inventory = t.inventory.clone();
        let mut config = t.config.clone();
        let mut ready = t.readiness.changes();
        let mut last: Option<Vec<String>> = None;
        let mut next: Option<Instant> = None;
        let mut said: Option<String> = None;
        let mut events = EventSender::new(
            t.cluster.clone(),
            t.timing.events,
            t.backoff,
            VOICE,
            event,
            |r| {
                if matches!(r, EventResult::Deduplicated | EventResult::RateLimited) {
                    tracing::debug!("no Event for this validation failure: one was sent recently");
                }
            },
        );
        // When the Event sender wants to be called again (a failed create, the rate limit).
        let mut events_at: Option<Instant> = None;
        let mut run_number = 0u64;
        let mut metrics_ready = false;
        loop {
            let settings = config.borrow_and_update().validation.clone();
            let inv = inventory.borrow_and_update().clone();
            let waiting: Option<String> = if !settings.enabled {
                Some("validation Jobs are off (validation.enabled: false)".into())
            } else if t.namespace.is_none() {
                Some(format!("validation.enabled is true, but {NAMESPACE_VAR} is not set (the chart sets it from metadata.namespace): no validation Jobs"))
            } else if let Err(why) = t.readiness.check() {
                Some(format!("validation waits for registration: {why}"))
            } else {
                None
            };
            if !settings.enabled && last.is_some() {
                // Turned off: the labels of the last run would go stale; take them off.
                let off = JobResult {
                    verdict: Verdict::Unknown,
                    summary: None,
                    reason: "validation turned off".into(),
                };
                match publish_labels(&t.cluster, &off).await {
                    Ok(()) => tracing::info!("validation turned off: its node labels are removed"),
                    Err(e) => {
                        tracing::warn!("validation turned off, but its node labels stay: {e}")
                    }
                }
                last = None;
                next = None;
            }
            if let Some(why) = waiting {
                if said.as_deref() != Some(why.as_str()) {
                    if settings.enabled && t.namespace.is_none() {
                        tracing::warn!("{why}");
                    } else if !settings.enabled {
                        tracing::info!("{why}");
                    } else {
                        tracing::debug!("{why}");
                    }
                    said = Some(why);
                }
                tokio::select! {
                    r = inventory.changed() => if r.is_err() { return },
                    r = config.changed() => if r.is_err() { return },
                    _ = ready.changed() => {},
                }
                continue;
            }
            if !metrics_ready {
                t.metrics.init();
                metrics_ready = true;
            }
            let Some(p) = plan(&inv) else {
                let why = "validation waits for a served resource with a healthy device";
                if said.as_deref() != Some(why) {
                    tracing::info!("{why}");
                    said = Some(why.into());
                }
                tokio::select! {
                    r = inventory.changed() => if r.is_err() { return },
                    r = config.changed() => if r.is_err() { return },
                }
                continue;
            };
            let now = Instant::now();
            let Some(why) = due(last.as_deref(), &p.fingerprint, next, now) else {
                if events_at.is_some_and(|at| at <= now) {
                    events_at = events.send().await;
                    continue;
                }
                let wake = next.unwrap_or(now + settings.interval);
                let wake = events_at.map_or(wake, |at| at.min(wake));
                tokio::select! {
                    _ = tokio::time::sleep_until(wake) => {},
                    r = inventory.changed() => if r.is_err() { return },
                    r = config.changed() => if r.is_err() {
                        return
                    } else {
                        // A new interval applies from the last run.
                        let c = config.borrow().validation.interval;
                        if c != settings.interval {
                            next = next.map(|n| {
                                n.checked_sub(settings.interval).map_or(n, |last| last + c)
                            });
                        }
                    },
                }
                continue;
            };
            // The devices must stay as they are for a while (a driver update comes in steps).
            if why != "on schedule" {
                let settled = tokio::select! {
                    _ = tokio::time::sleep(t.timing.settle) => true,
                    r = inventory.changed() => if r.is_err() { return } else { false },
                };
                if !settled {
                    continue;
                }
                let still = plan(&inventory.borrow());
                if still.as_ref() != Some(&p) {
                    continue;
                }
            }
            let (image, note) = match &settings.image {
                Some(i) => (i.clone(), None),
                None => default_image(inv.os.build.as_deref()),
            };
            if let Some(n) = note {
                tracing::warn!("{n}");
            }
            said = None;
            run_number = unix_now().max(run_number + 1);
            tracing::info!(node = %t.cluster.node(), resources = ?p.resources, image = %image, "starting a validation Job {why}");
            let result = t
                .run_one(
                    &p,
                    RunSettings {
                        validation: settings.clone(),
                        image,
                    },
                    run_number,
                    (&mut events, &mut events_at),
                )
                .await;
            last = Some(p.fingerprint.clone());
            if let Some(d) = &t.done {
                d.send_modify(|n| *n += 1);
            }
            let wait = match result.verdict {
                Verdict::Unknown => settings.interval.min(t.timing.retry_unknown),
                _ => settings.interval,
            };
            next = Some(Instant::now() + wait);
        }
    }
}

impl ValidationTask {
    /// One run: place the executable, run the Job, publish, clean up.
    async fn run_one(
        &self,
        p: &Plan,
        s: RunSettings,
        run: u64,
        (events, events_at): (&mut EventSender<String, Failure>, &mut Option<Instant>),
    ) -> JobResult {
        let ns = self.namespace.clone().unwrap_or_default();
        let node = self.cluster.node().to_string();
        // Jobs an earlier daemon left running hold devices and would refuse ours: delete them.
        match self.cluster.validation_jobs(&ns).await {
            Ok(jobs) => {
                for j in jobs.iter().filter(|j| !j.finished) {
                    tracing::info!(job = %j.name, "deleting a validation Job an earlier run left unfinished");
                    if let Err(e) = self.cluster.delete_job(&ns, &j.name).await {
                        tracing::warn!("{e}");
                    }
                }
            }
            Err(e) => tracing::warn!("{e}"),
        }
        let placed = {
            let (exe, dir, version) = (
                self.exe.clone(),
                PathBuf::from(&s.validation.host_dir),
                self.version.clone(),
            );
            let work = run_blocking(self.timing.place_limit, "placing dxdp.exe", move || {
                let content = std::fs::read(&exe).map_err(|e| {
                    format!("cannot read the running executable {}: {e}", exe.display())
                })?;
                exe::place(&dir, &version, &content).map_err(|e| e.to_string())
            });
            match work.await {
                Ok(r) => r,
                Err(Overdue::Panicked { message, .. }) => {
                    Err(format!("placing dxdp.exe failed: {message}"))
                }
                Err(_) => Err(format!(
                    "placing dxdp.exe in {} took longer than {} s",
                    s.validation.host_dir,
                    self.timing.place_limit.as_secs()
                )),
            }
        };
        let result = match &placed {
            Err(why) => JobResult {
                verdict: Verdict::Unknown,
                summary: None,
                reason: why.clone(),
            },
            Ok(dir) => {
                let spec = JobSpec {
                    node: node.clone(),
                    namespace: ns.clone(),
                    image: s.image.clone(),
                    host_dir: dir.display().to_string(),
                    resources: p.resources.clone(),
                    check_timeout: check_timeout(s.validation.timeout),
                    deadline: s.validation.timeout,
                    run,
                };
                run_once(&self.cluster, &spec, s.validation.timeout, self.timing.poll).await
            }
        };
        let job = super::job::job_name(&node, run);
        match result.verdict {
            Verdict::Pass => {
                tracing::info!(node = %node, job = %job, "GPU validation passed: {}", result.reason)
            }
            Verdict::Fail => {
                tracing::warn!(node = %node, job = %job, "GPU validation failed: {}", result.reason)
            }
            Verdict::Unknown => {
                tracing::warn!(node = %node, job = %job, "GPU validation gave no result: {}", result.reason)
            }
        }
        // Labels, with a few retries: the next run sets them again anyway.
        let mut failures = 0u32;
        loop {
            match publish_labels(&self.cluster, &result).await {
                Ok(()) => break,
                Err(e) => {
                    failures += 1;
                    if failures >= 4 {
                        tracing::warn!(
                            "cannot apply the validation labels, trying again at the next run: {e}"
                        );
                        break;
                    }
                    tokio::time::sleep(self.backoff.delay(failures, random())).await;
                }
            }
        }
        let checks: Vec<(String, String)> = result
            .summary
            .as_ref()
            .map(|s| {
                s.checks
                    .iter()
                    .map(|(n, o)| (n.clone(), o.as_str().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        self.metrics
            .record(result.verdict.as_str(), &checks, &p.resources, unix_now());
        // A run that did not fail replaces a failure's Event still held back.
        let failure = (result.verdict == Verdict::Fail).then(|| {
            let checks = result.summary.as_ref().map(|s| s.failed.join(","));
            let f = Failure {
                namespace: ns.clone(),
                job: job.clone(),
                result: result.clone(),
            };
            (checks.unwrap_or_default(), f)
        });
        events.occurred(failure, true, Instant::now());
        *events_at = events.send().await;
        // Clean up: the Job given up on, old finished Jobs, unused copies of dxdp.exe.
        let jobs = match self.cluster.validation_jobs(&ns).await {
            Ok(j) => j,
            Err(e) => {
                tracing::warn!("{e}");
                return result;
            }
        };
        let mut deleted = BTreeSet::new();
        if result.verdict == Verdict::Unknown {
            if let Some(j) = jobs.iter().find(|j| j.name == job && !j.finished) {
                if let Err(e) = self.cluster.delete_job(&ns, &j.name).await {
                    tracing::warn!("{e}");
                } else {
                    deleted.insert(j.name.clone());
                }
            }
        }
        let finished: Vec<(String, String, bool)> = jobs
            .iter()
            .filter(|j| !deleted.contains(&j.name))
            .map(|j| {
                (
                    j.name.clone(),
                    j.created.clone(),
                    j.finished || j.name == job,
                )
            })
            .collect();
        for name in super::job::old_jobs(&finished, self.timing.keep_jobs) {
            match self.cluster.delete_job(&ns, &name).await {
                Ok(()) => {
                    deleted.insert(name);
                }
                Err(e) => tracing::warn!("{e}"),
            }
        }
        if let Ok(dir) = &placed {
            let mut keep: BTreeSet<String> = jobs
                .iter()
                .filter(|j| !deleted.contains(&j.name) && !j.finished && j.name != job)
                .filter_map(|j| j.host_dir.as_deref())
                .map(|d| exe::last_component(d).to_string())
                .collect();
            keep.insert(exe::last_component(&dir.display().to_string()).to_string());
            let host = PathBuf::from(&s.validation.host_dir);
            let prune = move || exe::prune(&host, &keep);
            let pruned = run_blocking(self.timing.place_limit, "pruning dxdp.exe", prune).await;
            if let Ok(left) = pruned {
                for (name, why) in left {
                    tracing::debug!(
                        "an old copy of dxdp.exe stays until no Job runs it: {name}: {why}"
                    );
                }
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::tests::standin::ApiServerStandin;
    use crate::observe::state::Phase;
    use crate::validation::job::VALIDATED_LABEL;
    use serde_json::{json, Value};

    const NODE: &str = "n1";
    const NS: &str = "dxdp-system";
    const DISPLAY: &str = "directx.microsoft.com/display";
    /// Generous: the waits are for behaviour, not speed.
    const WAIT: Duration = Duration::from_secs(30);

    const TEST_TIMING: Timing = Timing {
        poll: Duration::from_millis(20),
        settle: Duration::from_millis(50),
        retry_unknown: Duration::from_secs(3600),
        keep_jobs: 2,
        place_limit: Duration::from_secs(10),
        events: EventLimits {
            burst: 3,
            every: Duration::from_secs(600),
            dedup: Duration::from_secs(3600),
        },
    };

    const FAST: Backoff = Backoff {
        initial: Duration::from_millis(5),
        max: Duration::from_millis(20),
        timeout: Duration::from_secs(5),
    };

    /// tests/fixtures/nvidia-multi-gpu.yaml: four Tesla T4 display devices, driver
    /// 31.0.15.2824, Windows build 10.0.20348.1547.
    fn four_t4() -> Inventory {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/nvidia-multi-gpu.yaml");
        let facts = dxdp_core::snapshot::read_file(&path).unwrap();
        crate::inventory::build(&facts, Arc::new(Config::default())).0
    }

    fn ready() -> Readiness {
        let r = Readiness::default();
        r.set_phase(Phase::Running);
        r.set_wanted(vec![DISPLAY.into()]);
        r.server_started(DISPLAY, 1);
        r.registration(DISPLAY, 1, Ok(()));
        r.watching(DISPLAY, 1, true);
        r
    }

    struct Rig {
        api: ApiServerStandin,
        runs: watch::Receiver<u64>,
        metrics: ValidationMetrics,
        inventory: watch::Sender<Arc<Inventory>>,
        config: watch::Sender<Arc<Config>>,
        host: tempfile::TempDir,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for Rig {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    fn config(host: &std::path::Path, timeout: Duration) -> Config {
        let mut c = Config::default();
        c.validation.enabled = true;
        c.validation.timeout = timeout;
        c.validation.host_dir = host.display().to_string();
        c
    }

    async fn start(pod: Option<Value>, job_status: Value, timeout: Duration) -> Rig {
        let api = ApiServerStandin::start(NODE, &[]).await.unwrap();
        api.set_job_pod(pod);
        api.set_job_status(job_status);
        let cluster = Cluster::at_url(&api.url(), NODE).unwrap();
        let host = tempfile::tempdir().unwrap();
        let exe = host.path().join("running-dxdp.exe");
        std::fs::write(&exe, b"MZ the running dxdp").unwrap();
        let done = Arc::new(watch::Sender::new(0u64));
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = ValidationMetrics::register(&mut registry);
        let (inventory, inventory_rx) = watch::channel(Arc::new(four_t4()));
        let (config_tx, config_rx) =
            watch::channel(Arc::new(config(&host.path().join("validation"), timeout)));
        let task = ValidationTask {
            cluster,
            namespace: Some(NS.into()),
            inventory: inventory_rx,
            config: config_rx,
            readiness: ready(),
            metrics: metrics.clone(),
            exe,
            version: "0.1.0".into(),
            backoff: FAST,
            timing: TEST_TIMING,
            done: Some(done.clone()),
        };
        let task = tokio::spawn(task.run());
        let runs = done.subscribe();
        Rig {
            api,
            runs,
            metrics,
            inventory,
            config: config_tx,
            host,
            task,
        }
    }

    fn terminated(code: i64, message: &str) -> Value {
        json!({"metadata": {"name": "p"}, "status": {"phase": if code == 0 { "Succeeded" } else { "Failed" },
            "containerStatuses": [{"state": {"terminated": {"exitCode": code, "message": message}}}]}})
    }

    fn complete() -> Value {
        json!({"conditions": [{"type": "Complete", "status": "True"}]})
    }

    /// Waits until the task has done `n` runs.
    async fn runs_reach(rig: &mut Rig, n: u64) {
        let reached = tokio::time::timeout(WAIT, rig.runs.wait_for(|r| *r >= n))
            .await
            .is_ok_and(|r| r.is_ok());
        assert!(reached, "{n} runs expected, got {}", *rig.runs.borrow());
    }

    #[tokio::test]
    async fn deleting_a_job_that_is_already_gone_succeeds_and_other_refusals_do_not() {
        let api = ApiServerStandin::start(NODE, &[]).await.unwrap();
        let cluster = Cluster::at_url(&api.url(), NODE).unwrap();
        // The API server answers 404 (a Status naming the Job): what was asked for is done.
        assert_eq!(cluster.delete_job(NS, "dxdp-validate-gone").await, Ok(()));
        let deletes = api
            .requests()
            .into_iter()
            .filter(|r| r.method == "DELETE")
            .count();
        assert_eq!(deletes, 1);
        // A 404 from elsewhere is told apart by its status, not its words: a refusal whose
        // message says "not found" is still an error.
        api.fail_next_with("DELETE", 403, "jobs.batch \"not found\" is forbidden");
        assert!(cluster.delete_job(NS, "dxdp-validate-gone").await.is_err());
    }

    #[tokio::test]
    async fn a_passing_job_labels_the_node_and_records_the_checks() {
        let pass = "dxdp-validation v1 pass adapters=pass d3d12=pass runtime-files=pass cuda=pass vulkan=absent\n";
        let mut rig = start(
            Some(terminated(0, pass)),
            complete(),
            Duration::from_secs(60),
        )
        .await;
        // A copy an earlier build left, which no Job runs.
        let host = rig.host.path().join("validation");
        std::fs::create_dir_all(host.join("dxdp-0.0.9-aaaaaaaaaaaaaaaa")).unwrap();
        runs_reach(&mut rig, 1).await;
        let l = rig.api.labels();
        assert_eq!(l.get(VALIDATED_LABEL).map(String::as_str), Some("true"));
        for api in ["d3d12", "cuda"] {
            assert_eq!(
                l.get(&format!("directx.microsoft.com/api.{api}.validated"))
                    .map(String::as_str),
                Some("true"),
                "{api}"
            );
        }
        assert_eq!(l.get("directx.microsoft.com/api.vulkan.validated"), None);
        let jobs = rig.api.jobs();
        assert_eq!(jobs.len(), 1);
        let pod = &jobs[0]["spec"]["template"]["spec"];
        assert_eq!(pod["nodeName"], NODE);
        assert_eq!(
            pod["containers"][0]["image"],
            "mcr.microsoft.com/windows/servercore:ltsc2022"
        );
        assert_eq!(
            pod["containers"][0]["resources"]["limits"],
            json!({DISPLAY: "1"})
        );
        // The Job mounts the copy of this build, named by version and content hash.
        let copy = host.join(format!(
            "dxdp-0.1.0-{:016x}",
            exe::content_hash(b"MZ the running dxdp")
        ));
        assert_eq!(
            pod["volumes"][0]["hostPath"]["path"],
            copy.display().to_string()
        );
        assert_eq!(
            std::fs::read(copy.join("dxdp.exe")).unwrap(),
            b"MZ the running dxdp"
        );
        let mut left: Vec<String> = std::fs::read_dir(&host)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            vec![format!(
                "dxdp-0.1.0-{:016x}",
                exe::content_hash(b"MZ the running dxdp")
            )],
            "the unused copy is removed"
        );
        let checks = rig.metrics.checks();
        let want: std::collections::BTreeMap<String, String> = [
            ("adapters", "pass"),
            ("d3d12", "pass"),
            ("runtime-files", "pass"),
            ("cuda", "pass"),
            ("vulkan", "absent"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(checks, want);
        assert!(rig
            .metrics
            .last_success(DISPLAY)
            .is_some_and(|t| t > 1_700_000_000));
        assert!(rig.api.events().is_empty(), "no Event when it passes");
        assert_eq!(rig.metrics.runs("pass"), 1);
    }

    #[tokio::test]
    async fn a_failing_job_sets_false_and_creates_a_node_event() {
        let fail = "dxdp-validation v1 fail adapters=pass d3d12=pass cuda=fail\n";
        let mut rig = start(
            Some(terminated(1, fail)),
            json!({"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}),
            Duration::from_secs(60),
        )
        .await;
        runs_reach(&mut rig, 1).await;
        let l = rig.api.labels();
        assert_eq!(l.get(VALIDATED_LABEL).map(String::as_str), Some("false"));
        assert_eq!(
            l.get("directx.microsoft.com/api.d3d12.validated")
                .map(String::as_str),
            Some("true")
        );
        assert_eq!(l.get("directx.microsoft.com/api.cuda.validated"), None);
        let events = rig.api.events();
        assert_eq!(events.len(), 1, "{events:?}");
        let e = &events[0];
        assert_eq!(e["metadata"]["namespace"], NS);
        assert_eq!(e["reason"], "GPUValidationFailed");
        assert_eq!(e["type"], "Warning");
        assert_eq!(
            e["involvedObject"],
            json!({"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "n1"})
        );
        let job = rig.api.jobs()[0]["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(
            e["message"],
            format!("GPU validation failed on node n1: cuda (Job dxdp-system/{job}: failed: cuda). See dxdp's docs/validation.md, \"Reading a failure\"")
        );
        assert_eq!(rig.metrics.runs("fail"), 1);
        assert_eq!(rig.metrics.checks()["cuda"], "fail");
        assert_eq!(rig.metrics.last_success(DISPLAY), None);
        // The same failure again (a run after a driver change): no second Event within the hour.
        let mut inv = four_t4();
        inv.discovery.devices[0].driver_version = "31.0.15.3000".into();
        rig.inventory.send_replace(Arc::new(inv));
        runs_reach(&mut rig, 2).await;
        assert_eq!(rig.metrics.runs("fail"), 2);
        assert_eq!(
            rig.api.events().len(),
            1,
            "rate-limited: one Event per failure an hour"
        );
    }

    #[tokio::test]
    async fn a_job_that_never_schedules_is_unknown_within_the_timeout_and_deleted() {
        let pending = json!({"metadata": {"name": "p"}, "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes are available"}]}});
        let started = std::time::Instant::now();
        let mut rig = start(Some(pending), json!({}), Duration::from_secs(1)).await;
        runs_reach(&mut rig, 1).await;
        // Settle (50 ms) + the 1 s limit + API calls: well within 10 s.
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        let deletes: Vec<_> = rig
            .api
            .requests()
            .into_iter()
            .filter(|r| r.method == "DELETE")
            .collect();
        assert_eq!(deletes.len(), 1, "the Job given up on is deleted");
        assert_eq!(
            deletes[0].propagation_policy().as_deref(),
            Some("Background")
        );
        assert!(rig.api.jobs().is_empty());
        assert_eq!(
            rig.api.labels().get(VALIDATED_LABEL),
            None,
            "unknown: neither"
        );
        assert!(
            rig.metrics.checks().is_empty(),
            "no checks without a result"
        );
        assert_eq!(rig.metrics.runs("unknown"), 1);
        assert_eq!(rig.metrics.runs("pass"), 0);
        assert!(
            rig.api.events().is_empty(),
            "no Event when nothing is known"
        );
    }

    #[tokio::test]
    async fn a_driver_change_runs_again_old_jobs_are_deleted_and_off_removes_the_labels() {
        let pass = "dxdp-validation v1 pass adapters=pass d3d12=pass\n";
        let mut rig = start(
            Some(terminated(0, pass)),
            complete(),
            Duration::from_secs(60),
        )
        .await;
        runs_reach(&mut rig, 1).await;
        assert_eq!(rig.api.jobs().len(), 1);
        // Three driver updates, one after another: a run after each.
        for (n, version) in ["31.0.15.3000", "31.0.15.3100", "31.0.15.3200"]
            .iter()
            .enumerate()
        {
            let mut inv = four_t4();
            for d in &mut inv.discovery.devices {
                d.driver_version = version.to_string();
            }
            rig.inventory.send_replace(Arc::new(inv));
            runs_reach(&mut rig, n as u64 + 2).await;
        }
        let posts = rig
            .api
            .requests()
            .into_iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/jobs"))
            .count();
        assert_eq!(posts, 4, "one Job at start, one per driver change");
        // Finished Jobs beyond the newest two are deleted.
        let mut created: Vec<String> = rig
            .api
            .requests()
            .into_iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/jobs"))
            .map(|r| r.json()["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        let mut left: Vec<String> = rig
            .api
            .jobs()
            .iter()
            .map(|j| j["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        left.sort();
        created.sort();
        assert_eq!(left, created[2..].to_vec());
        assert_eq!(
            rig.api.labels().get(VALIDATED_LABEL).map(String::as_str),
            Some("true")
        );
        // Turned off: the labels go.
        let mut off = (**rig.config.borrow()).clone();
        off.validation.enabled = false;
        rig.config.send_replace(Arc::new(off));
        let gone = rig
            .api
            .wait_for(WAIT, |_, l| !l.contains_key(VALIDATED_LABEL))
            .await;
        assert!(gone, "{:?}", rig.api.labels());
        assert!(rig
            .api
            .labels()
            .keys()
            .all(|k| !k.starts_with("directx.microsoft.com/api.")));
    }

    #[tokio::test]
    async fn the_schedule_runs_again_without_any_change() {
        let pass = "dxdp-validation v1 pass adapters=pass d3d12=pass\n";
        let mut rig = start(
            Some(terminated(0, pass)),
            complete(),
            Duration::from_secs(60),
        )
        .await;
        runs_reach(&mut rig, 1).await;
        // An interval far below the file's minimum, set on the configuration directly.
        let mut short = (**rig.config.borrow()).clone();
        short.validation.interval = Duration::from_millis(200);
        rig.config.send_replace(Arc::new(short));
        runs_reach(&mut rig, 3).await;
        assert_eq!(rig.metrics.runs("pass"), 3);
    }

    #[test]
    fn plans_images_and_triggers() {
        let p = plan(&four_t4()).unwrap();
        assert_eq!(p.resources, vec![DISPLAY.to_string()]);
        assert_eq!(p.fingerprint.len(), 4);
        assert!(p.fingerprint[0].starts_with("directx.microsoft.com/display/"));
        assert!(p.fingerprint[0].ends_with("/31.0.15.2824"));
        assert_eq!(
            default_image(Some("10.0.26100.2314")),
            (
                "mcr.microsoft.com/windows/servercore:ltsc2025".to_string(),
                None
            )
        );
        assert_eq!(
            default_image(Some("10.0.17763.1")).0,
            "mcr.microsoft.com/windows/servercore:ltsc2019"
        );
        let (image, note) = default_image(Some("10.0.22631.1"));
        assert_eq!(image, "mcr.microsoft.com/windows/servercore:ltsc2022");
        assert!(note.unwrap().contains("set validation.image"));
        assert_eq!(
            check_timeout(Duration::from_secs(1200)),
            Duration::from_secs(120)
        );
        assert_eq!(
            check_timeout(Duration::from_secs(60)),
            Duration::from_secs(30)
        );
        let now = Instant::now();
        let fp = vec!["a".to_string()];
        assert_eq!(due(None, &fp, None, now), Some("after registration"));
        assert_eq!(
            due(
                Some(&["b".to_string()]),
                &fp,
                Some(now + Duration::from_secs(9)),
                now
            ),
            Some("after a device or driver change")
        );
        assert_eq!(
            due(Some(&fp), &fp, Some(now + Duration::from_secs(9)), now),
            None
        );
        assert_eq!(due(Some(&fp), &fp, Some(now), now), Some("on schedule"));
        let l = listed(
            &serde_json::from_value(json!({"metadata": {"name": "j", "creationTimestamp": "2026-11-25T00:00:00Z"},
            "spec": {"template": {"spec": {"volumes": [{"name": "dxdp", "hostPath": {"path": "C:\\x\\dxdp-1"}}]}}},
            "status": {"conditions": [{"type": "Complete", "status": "True"}]}}))
            .unwrap(),
        );
        assert_eq!(
            l,
            Listed {
                name: "j".into(),
                created: "2026-11-25T00:00:00Z".into(),
                finished: true,
                host_dir: Some("C:\\x\\dxdp-1".into())
            }
        );
    }
}
