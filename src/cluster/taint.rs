//! The node taint of `isolation.policy: taint`: [`TAINT_KEY`]`:NoSchedule` on the node while any
//! GPU isolation violation lasts ([`KeepTaint`], following the violations the telemetry task
//! publishes, `telemetry::audit`, through the daemon's wiring).
//!
//! A read-modify-write of `spec.taints` with a JSON merge patch conditional on the Node's
//! `resourceVersion` (`Cluster::set_isolation_taint`: the taints are one list on the API
//! server, so a patch without the condition could drop a taint someone else added meanwhile). At
//! start the node is reconciled once the first audit is known (at the latest after
//! `TAINT_START_GRACE`): a taint an earlier run left is removed when no violation is known,
//! also with `policy: audit`. Once on, the taint stays at least [`TAINT_MIN_HOLD`] (with `policy:
//! taint`); the Node is read again whenever a violation starts.
//!
//! Every failure is logged once per distinct error, counted, and retried with backoff; device
//! serving never waits for any of it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;
use kube::api::{Patch, PatchParams};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{say_once, Cluster, FIELD_MANAGER};
use crate::config::file::IsolationPolicy;
use crate::config::Config;
use crate::observe::isolation_metrics::{IsolationMetrics, TaintResult};
use crate::util::errors::chain;
use crate::util::retry::{random, Backoff};
use crate::util::sleep_until;
use crate::util::task::Task;
use dxdp_core::telemetry::isolation::{Active, Violation};
use dxdp_core::telemetry::PodRef;

/// The taint dxdp puts on its node while a violation lasts (`policy: taint`). dxdp owns this
/// key: it removes every taint with it when no violation lasts.
pub const TAINT_KEY: &str = "directx.microsoft.com/isolation-violation";

/// The taint's effect: new pods that do not tolerate it are not scheduled on the node; pods
/// running there keep running.
pub(crate) const TAINT_EFFECT: &str = "NoSchedule";

impl Cluster {
    /// Puts dxdp's taint on the node (`on`) or takes every taint with its key off. Returns
    /// whether the node changed.
    pub(crate) async fn set_isolation_taint(&self, on: bool) -> Result<bool, String> {
        const CONFLICTS: u32 = 3;
        for _ in 0..CONFLICTS {
            let node = self.get_node().await.map_err(|e| e.to_string())?;
            let taints: Vec<Taint> = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            // Ours is the key with its effect; the key with another effect (set by hand) is
            // replaced when the taint is wanted, and removed with it.
            let done = if on {
                taints
                    .iter()
                    .any(|t| t.key == TAINT_KEY && t.effect == TAINT_EFFECT)
            } else {
                !taints.iter().any(|t| t.key == TAINT_KEY)
            };
            if done {
                return Ok(false);
            }
            let mut next: Vec<Taint> = taints.into_iter().filter(|t| t.key != TAINT_KEY).collect();
            if on {
                next.push(Taint {
                    key: TAINT_KEY.into(),
                    effect: TAINT_EFFECT.into(),
                    ..Taint::default()
                });
            }
            let body = serde_json::json!({
                "metadata": {"resourceVersion": node.metadata.resource_version},
                "spec": {"taints": next},
            });
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            let patch = Patch::Merge(&body);
            match tokio::time::timeout(self.timeout, self.api.patch(&self.node, &params, &patch))
                .await
            {
                Ok(Ok(_)) => return Ok(true),
                // The node changed since it was read: read it again.
                Ok(Err(kube::Error::Api(s))) if s.code == 409 => continue,
                Ok(Err(kube::Error::Api(s))) if s.code == 403 => {
                    return Err(format!(
                        "cannot patch node {}: {} (grant patch on nodes: the chart does with nodeApi.enabled)",
                        self.node, s.message
                    ))
                }
                Ok(Err(e)) => return Err(format!("cannot patch node {}: {}", self.node, chain(&e))),
                Err(_) => {
                    return Err(format!(
                        "the API server did not answer a patch of node {} within {} s",
                        self.node,
                        self.timeout.as_secs_f64()
                    ))
                }
            }
        }
        Err(format!(
            "node {} changed under every one of {CONFLICTS} attempts to update its taints",
            self.node
        ))
    }
}

/// How long the taint waits for the first audit after a start before it counts as "no
/// violation known" (the telemetry sampler takes its first sample 2 s after the start).
pub(crate) const TAINT_START_GRACE: Duration = Duration::from_secs(60);

/// How long the taint stays at least once this run added it (or found it needed), so that use
/// that is brief but frequent does not open and close the node every sample.
pub const TAINT_MIN_HOLD: Duration = Duration::from_secs(600);

/// What the taint should be now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaintWant {
    /// On the node.
    On,
    /// Off the node.
    Off,
    /// Left as it is for this long, then decided again.
    Wait(Duration),
}

/// Decides the taint (pure): `violations` is how many last (`None`: no audit known yet),
/// `since_start` the time since this run started, `tainted_for` how long ago this run put the
/// taint on (or found it needed), `None` when it did not.
pub fn taint_want(
    policy: IsolationPolicy,
    violations: Option<usize>,
    since_start: Duration,
    start_grace: Duration,
    tainted_for: Option<Duration>,
    min_hold: Duration,
) -> TaintWant {
    match (policy, violations) {
        // The operator turned the policy off (or withdraws GPUs instead): at once.
        (IsolationPolicy::Audit | IsolationPolicy::Withdraw, _) => TaintWant::Off,
        (IsolationPolicy::Taint, Some(n)) if n > 0 => TaintWant::On,
        (IsolationPolicy::Taint, None) if since_start < start_grace => {
            TaintWant::Wait(start_grace - since_start)
        }
        (IsolationPolicy::Taint, _) => match tainted_for {
            Some(t) if t < min_hold => TaintWant::Wait(min_hold - t),
            _ => TaintWant::Off,
        },
    }
}

/// Keeps dxdp's taint on the node while a violation lasts and `isolation.policy` is `taint`
/// (and for `min_hold` at least once it is on), and off otherwise, until both channels close.
/// A taint an earlier run left is removed once the first audit shows no violation, or after
/// `start_grace` when none comes. The Node is read again whenever a violation starts, so that
/// a taint removed by hand comes back.
#[derive(Clone)]
pub struct KeepTaint {
    pub cluster: Cluster,
    pub active: watch::Receiver<Active>,
    pub config: watch::Receiver<Arc<Config>>,
    pub metrics: IsolationMetrics,
    pub backoff: Backoff,
    pub start_grace: Duration,
    pub min_hold: Duration,
}

impl Task for KeepTaint {
    async fn run(self) {
        let KeepTaint {
            cluster,
            mut active,
            mut config,
            metrics,
            backoff,
            start_grace,
            min_hold,
        } = self;
        let started = Instant::now();
        // What the node has, as dxdp last read or wrote it.
        let mut applied: Option<bool> = None;
        // When this run put the taint on, or found it needed.
        let mut tainted_at: Option<Instant> = None;
        let mut known_keys: BTreeSet<(PodRef, String)> = BTreeSet::new();
        let mut failures = 0u32;
        let mut last_error: Option<String> = None;
        let (mut active_open, mut config_open) = (true, true);
        loop {
            let policy = config.borrow_and_update().isolation.policy;
            let known = active.borrow_and_update().clone();
            let keys: BTreeSet<(PodRef, String)> = known
                .iter()
                .flat_map(|v| v.iter().map(Violation::key))
                .collect();
            if !keys.is_subset(&known_keys) {
                // A violation started: read the Node again rather than trust what was applied.
                applied = None;
            }
            known_keys = keys;
            let now = Instant::now();
            let want = taint_want(
                policy,
                known.as_ref().map(|v| v.len()),
                now.saturating_duration_since(started),
                start_grace,
                tainted_at.map(|t| now.saturating_duration_since(t)),
                min_hold,
            );
            let mut wake = None;
            match want {
                TaintWant::Wait(d) => wake = Some(now + d),
                TaintWant::On | TaintWant::Off => {
                    let w = want == TaintWant::On;
                    if applied != Some(w) {
                        match cluster.set_isolation_taint(w).await {
                            Ok(changed) => {
                                if changed && w {
                                    metrics.taint_change(TaintResult::Added);
                                    tracing::warn!(node = %cluster.node(), taint = TAINT_KEY, "node tainted {TAINT_KEY}:{TAINT_EFFECT} (isolation.policy: taint): a pod container uses a GPU it was not allocated, so no new pod is scheduled here until it stops");
                                } else if changed {
                                    metrics.taint_change(TaintResult::Removed);
                                    tracing::info!(node = %cluster.node(), taint = TAINT_KEY, "taint {TAINT_KEY} removed: no GPU isolation violation lasts (or the policy is audit)");
                                }
                                metrics.tainted(w);
                                applied = Some(w);
                                failures = 0;
                                last_error = None;
                            }
                            Err(why) => {
                                metrics.taint_change(TaintResult::Error);
                                failures = failures.saturating_add(1);
                                say_once(
                                    &mut last_error,
                                    why,
                                    if w {
                                        "cannot taint the node for a GPU isolation violation"
                                    } else {
                                        "cannot remove dxdp's isolation taint from the node"
                                    },
                                );
                                wake = Some(Instant::now() + backoff.delay(failures, random()));
                            }
                        }
                    }
                    if applied == Some(true) && tainted_at.is_none() {
                        tainted_at = Some(Instant::now());
                    } else if applied == Some(false) {
                        tainted_at = None;
                    }
                }
            }
            if !active_open && !config_open && wake.is_none() {
                std::future::pending::<()>().await;
            }
            tokio::select! {
                changed = active.changed(), if active_open => active_open = changed.is_ok(),
                changed = config.changed(), if config_open => config_open = changed.is_ok(),
                () = sleep_until(wake) => {}
            }
        }
    }
}
