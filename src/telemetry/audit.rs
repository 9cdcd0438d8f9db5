//! The isolation audit in the daemon: after every successful telemetry sample the figures are
//! audited (`dxdp_core::telemetry::isolation`), and the [`Tracker`] turns the violations of one
//! sample into starts and ends: each start and each end is logged once (not once per sample)
//! and counted, the current set is exported as `dxdp_isolation_violations`, and it is published
//! on a channel for the Kubernetes side: Events on the pod (`cluster::isolation_events`), the node
//! taint (`cluster::taint`) and the node condition (`health::conditions`).
//!
//! A violation lasts from the first sample that shows it until `CLEAN_TO_END` judged samples
//! in a row do not (so that use that is brief but frequent does not flap). Nothing is judged
//! unless every attribution source (the kubelet's PodResources, the containers' process lists,
//! CRI) answered in that same sample: with an old answer a new pod would look unallocated and a
//! reused PID would be placed in the wrong container; the last state stands meanwhile, as it
//! does while samples fail, but for [`stale_after`] at most: then every violation ends (unknown
//! is not a violation), with one warning. With telemetry off every violation ends at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use dxdp_core::telemetry::compute::TelemetryView;
use dxdp_core::telemetry::isolation::{
    audit, held, ContainerVerdict, IsolationReport, SeenAdapter, Violation,
};
use dxdp_core::telemetry::PodRef;

use crate::config::Config;
use crate::observe::isolation_metrics::IsolationMetrics;
use crate::output::{AuditDoc, AuditScope, AuditVerdict};

use dxdp_core::telemetry::isolation::Active;

/// The sending side of [`Active`], shared by the restarts of the telemetry task.
pub(crate) type ActiveTx = Arc<watch::Sender<Active>>;

/// What one audit changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Violations that started.
    pub started: Vec<Violation>,
    /// Violations that ended.
    pub ended: Vec<Violation>,
}

/// How many judged samples in a row must not show a violation for it to end.
pub(crate) const CLEAN_TO_END: u32 = 3;

/// The shortest time without a judged sample after which every violation ends.
pub(crate) const STALE_MIN: Duration = Duration::from_secs(300);

/// How long violations stand without a judged sample: `max(``STALE_MIN``, 10 × interval)`.
pub fn stale_after(interval: Duration) -> Duration {
    STALE_MIN.max(interval.saturating_mul(10))
}

/// A violation that lasts.
#[derive(Debug)]
struct Live {
    violation: Violation,
    /// When it started (as this tracker saw it).
    since: Instant,
    /// Judged samples in a row that did not show it.
    clean: u32,
}

/// Follows violations from sample to sample.
#[derive(Debug)]
pub struct Tracker {
    metrics: IsolationMetrics,
    active: ActiveTx,
    /// The violations that last.
    current: BTreeMap<(PodRef, String), Live>,
    /// Whether "waiting for current answers" was said.
    waiting_said: bool,
    /// When a sample was last judged (or the tracker was made).
    judged: Instant,
}

impl Tracker {
    /// A tracker publishing on `active`. A restarted telemetry task takes over the violations
    /// the last one published, so that they are not logged and counted again.
    pub fn new(metrics: IsolationMetrics, active: ActiveTx) -> Self {
        let now = Instant::now();
        let current = active
            .borrow()
            .iter()
            .flat_map(|v| v.iter())
            .map(|v| {
                let live = Live {
                    violation: v.clone(),
                    since: now,
                    clean: 0,
                };
                (v.key(), live)
            })
            .collect();
        Tracker {
            metrics,
            active,
            current,
            waiting_said: false,
            judged: now,
        }
    }

    /// Audits the figures of a successful sample. `sources_current`: every attribution source
    /// answered in this sample (see `Sampler::sources_current`); otherwise nothing is judged.
    pub fn sample(&mut self, view: &TelemetryView, sources_current: bool) -> Changes {
        if !sources_current {
            if !self.waiting_said {
                tracing::info!("the GPU isolation audit waits for current answers of the kubelet's PodResources API, the containers' process lists (HCS) and CRI: with old ones a new pod would look unallocated and a reused PID would be misplaced (the last state stands meanwhile)");
                self.waiting_said = true;
            }
            return Changes::default();
        }
        self.waiting_said = false;
        self.judged = Instant::now();
        let report = audit(view, &held(view));
        self.metrics.unplaced(report.unplaced_processes);
        self.apply(
            report.violations,
            false,
            &format!("the last {CLEAN_TO_END} samples show no such use"),
        )
    }

    /// Nothing can be known (telemetry off, or no source): every violation ends.
    pub fn off(&mut self, why: &str) -> Changes {
        self.metrics.unplaced(0);
        self.apply(Vec::new(), true, why)
    }

    /// When the violations that last end for want of a judged sample (see [`stale_after`]);
    /// `None` when none lasts.
    pub(crate) fn stale_at(&self, limit: Duration) -> Option<Instant> {
        (!self.current.is_empty()).then(|| self.judged + limit)
    }

    /// Ends every violation, with one warning, when no sample was judged for `limit`: unknown
    /// is not a violation (and keeps no taint on the node).
    pub fn expire(&mut self, limit: Duration) -> Changes {
        if self.stale_at(limit).is_none_or(|at| Instant::now() < at) {
            return Changes::default();
        }
        tracing::warn!(
            violations = self.current.len(),
            "no telemetry sample could be judged for {} s (failing samples, or the kubelet's PodResources, HCS or CRI not answering): the GPU isolation violations are no longer known and end; they start again when a judged sample shows them",
            limit.as_secs()
        );
        self.metrics.unplaced(0);
        self.apply(Vec::new(), true, "no sample could be judged for too long")
    }

    /// Ends the violations when [`stale_after`] the configured interval passes without a
    /// judged sample (for a telemetry task that cannot sample at all), then returns.
    pub async fn expire_when_stale(mut self, config: watch::Receiver<Arc<Config>>) {
        let limit = stale_after(config.borrow().telemetry.interval);
        if let Some(at) = self.stale_at(limit) {
            tokio::time::sleep_until(at).await;
            self.expire(limit);
        }
    }

    fn apply(&mut self, violations: Vec<Violation>, at_once: bool, why_ended: &str) -> Changes {
        let now = Instant::now();
        let mut changes = Changes::default();
        let mut next: BTreeMap<(PodRef, String), Live> = BTreeMap::new();
        for v in violations {
            let key = v.key();
            let since = match self.current.remove(&key) {
                Some(live) => live.since,
                None => {
                    log_start(&v);
                    changes.started.push(v.clone());
                    now
                }
            };
            let live = Live {
                violation: v,
                since,
                clean: 0,
            };
            next.insert(key, live);
        }
        for (key, mut live) in std::mem::take(&mut self.current) {
            live.clean += 1;
            if at_once || live.clean >= CLEAN_TO_END {
                log_end(
                    &live.violation,
                    now.saturating_duration_since(live.since),
                    why_ended,
                );
                changes.ended.push(live.violation);
            } else {
                next.insert(key, live);
            }
        }
        self.current = next;
        self.metrics.started(changes.started.len() as u64);
        let list: Vec<Violation> = self.current.values().map(|l| l.violation.clone()).collect();
        self.metrics.set_active(Arc::new(list.clone()));
        self.active.send_if_modified(|published| {
            if published.as_deref() == Some(&list) {
                false
            } else {
                *published = Some(Arc::new(list));
                true
            }
        });
        changes
    }
}

fn log_start(v: &Violation) {
    tracing::warn!(
        namespace = %v.pod.namespace,
        pod = %v.pod.pod,
        container = %v.pod.container,
        device = %v.used.device,
        kind = v.kind.as_str(),
        "GPU isolation violation started: pod {}/{}: {} (docs/isolation.md)",
        v.pod.namespace,
        v.pod.pod,
        v.message()
    );
}

fn log_end(v: &Violation, lasted: Duration, why: &str) {
    tracing::info!(
        namespace = %v.pod.namespace,
        pod = %v.pod.pod,
        container = %v.pod.container,
        device = %v.used.device,
        lasted_seconds = lasted.as_secs(),
        "GPU isolation violation ended: container {} of pod {}/{} and GPU {}: {why}",
        v.pod.container,
        v.pod.namespace,
        v.pod.pod,
        v.used.device
    );
}

/// The text `dxdp audit` prints for people: the containers (node scope) or what this container
/// sees (container scope), the violations, the processes not judged, notes and the verdict.
pub fn audit_text(doc: &AuditDoc) -> String {
    let mut out = String::new();
    if let Some(report) = &doc.node {
        out.push_str(&node_table(report));
    }
    if let Some(check) = &doc.container {
        let list = |adapters: &[SeenAdapter]| {
            if adapters.is_empty() {
                return "-".to_string();
            }
            adapters
                .iter()
                .map(|a| {
                    if a.model.is_empty() {
                        a.luid_label.clone()
                    } else {
                        format!("{} ({})", a.luid_label, a.model)
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push_str(&super::top::table(&[
            vec![
                "Given (DXDP_ADAPTER_LUIDS):".to_string(),
                list(&check.allocated),
            ],
            vec!["Visible here (DXCore):".into(), list(&check.visible)],
            vec!["Visible, not given:".into(), list(&check.extra)],
            vec!["Given, not visible:".into(), list(&check.missing)],
        ]));
    }
    for note in &doc.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    let verdict = match (doc.verdict, doc.scope) {
        (AuditVerdict::Clean, AuditScope::Node) => {
            "clean: every container uses only the GPUs it was allocated".to_string()
        }
        (AuditVerdict::Clean, AuditScope::Container) => {
            "clean: this container sees only the GPUs it was given".to_string()
        }
        (AuditVerdict::Violations, AuditScope::Node) => {
            "violations: containers use GPUs they were not allocated".to_string()
        }
        (AuditVerdict::Violations, AuditScope::Container) => {
            "violations: this node leaks GPUs into containers (this one sees GPUs it was not given)"
                .to_string()
        }
        (AuditVerdict::Unknown, _) => format!(
            "unknown: {}",
            doc.reason.as_deref().unwrap_or("the audit could not tell")
        ),
    };
    if !out.is_empty() {
        out.push('\n');
    }
    out.push_str(&format!(
        "Verdict: {verdict} (exit code {})\n",
        doc.verdict.exit_code()
    ));
    out
}

fn node_table(report: &IsolationReport) -> String {
    let mut out = String::new();
    if report.containers.is_empty() {
        out.push_str("No pod container holds or uses a GPU dxdp serves.\n");
    } else {
        let mut rows = vec![vec![
            "CONTAINER".to_string(),
            "ALLOCATED".into(),
            "USED".into(),
            "VERDICT".into(),
        ]];
        for c in &report.containers {
            let mut allocated: Vec<String> = c
                .allocated
                .iter()
                .map(|a| a.adapter.device.clone())
                .collect();
            allocated.dedup();
            let used: Vec<String> = c
                .used
                .iter()
                .map(|u| {
                    let device = if u.allocated {
                        u.adapter.device.clone()
                    } else {
                        format!("{} (not allocated)", u.adapter.device)
                    };
                    match (u.memory_used, u.memory_share) {
                        (Some(used), Some(share)) => {
                            format!("{device} ({})", super::top::share_text(used, share))
                        }
                        _ => device,
                    }
                })
                .collect();
            let cell = |v: Vec<String>| {
                if v.is_empty() {
                    "-".to_string()
                } else {
                    v.join(", ")
                }
            };
            rows.push(vec![
                super::top::pod_text(&c.pod),
                cell(allocated),
                cell(used),
                match c.verdict {
                    ContainerVerdict::Violation => "VIOLATION".into(),
                    v => v.as_str().into(),
                },
            ]);
        }
        out.push_str(&super::top::table(&rows));
    }
    if !report.violations.is_empty() {
        out.push('\n');
        for v in &report.violations {
            out.push_str(&format!(
                "{}/{}: {}\n",
                v.pod.namespace,
                v.pod.pod,
                v.message()
            ));
        }
    }
    if report.unplaced_processes > 0 {
        out.push_str(&format!(
            "\n{} process{} dxdp cannot place (the host's, or of containers whose pod is unknown) use{} GPUs: not judged.\n",
            report.unplaced_processes,
            if report.unplaced_processes == 1 { "" } else { "es" },
            if report.unplaced_processes == 1 { "s" } else { "" },
        ));
    }
    out
}
