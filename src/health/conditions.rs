//! dxdp's node conditions (`health.nodeConditions: true`, off by default), where cluster tools
//! (drain controllers, autoscalers, alerts on `kube_node_status_condition`) look, next to Node
//! Problem Detector's:
//!
//! - `HEALTHY` `DirectXGPUHealthy`: `False` while any served device is Unhealthy (reason: the
//!   health reason, `MultipleReasons` when they differ; the message names every device and
//!   why) or devices `health.expectedDevices` expects are missing (reason `GPUMissing`; the
//!   message names expected against found), `True` otherwise, `Unknown` with
//!   `health.enabled: false`;
//! - `ISOLATION` `DirectXGPUIsolation`: `False` while a GPU isolation violation lasts (from
//!   the isolation tracker's channel), `True` when none does, `Unknown` until the first audit
//!   and with `telemetry.enabled: false` (no audit runs).
//!
//! Written with a strategic merge patch of `status.conditions` on the `nodes/status`
//! subresource, keyed by `type` (as Node Problem Detector does): the kubelet's and other
//! writers' conditions are never sent, so nothing is overwritten and no `resourceVersion` race
//! is lost. The Node is read before each write: a condition is only written when its status,
//! reason or message differ, `lastTransitionTime` is kept while the status stays. Every
//! `RESYNC` the Node is read again, so a condition removed by hand comes back.
//!
//! Turned off (at start or by a reload), dxdp removes its two conditions (a strategic
//! `$patch: delete` per type) if the Node has them; `dxdp cleanup` removes them at uninstall.
//! Failures are counted (`dxdp_node_condition_updates_total{condition, result="error"}`),
//! logged once per distinct error and retried with backoff.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::NodeCondition;
use kube::api::{Patch, PatchParams};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cluster::cleanup::CONDITION_TYPES;
use crate::cluster::say_once;
use crate::cluster::{Cluster, FIELD_MANAGER};
use crate::config::Config;
use crate::inventory::{Inventory, InventoryRx};
use crate::observe::device_health::{ConditionResult, HealthMetrics};
use crate::util::errors::chain;
use crate::util::retry::{random, Backoff};
use crate::util::sleep_until;
use crate::util::task::Task;
use dxdp_core::health::reason::Reason;
use dxdp_core::telemetry::isolation::Active;

/// The condition of device health.
pub(crate) const HEALTHY: &str = CONDITION_TYPES[0];

/// The condition of the GPU isolation audit.
pub(crate) const ISOLATION: &str = CONDITION_TYPES[1];

/// The reason of `DirectXGPUHealthy` while devices `health.expectedDevices` expects are gone.
pub(crate) const GPU_MISSING: &str = "GPUMissing";

/// How often the Node is read again while the conditions are on.
pub(crate) const RESYNC: Duration = Duration::from_secs(300);

/// A condition as dxdp wants it (without times).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wanted {
    /// `DirectXGPUHealthy` or `DirectXGPUIsolation`.
    pub(crate) type_: &'static str,
    /// `True`, `False` or `Unknown`.
    pub(crate) status: &'static str,
    /// A CamelCase reason.
    pub(crate) reason: String,
    /// For people.
    pub(crate) message: String,
}

/// The CamelCase condition reason of a health reason (`problem_code` -> `ProblemCode`).
pub(crate) fn camel(reason: Reason) -> String {
    match reason {
        Reason::Tdr => "TDR".into(),
        other => other
            .as_str()
            .split('_')
            .map(|w| {
                let mut c = w.chars();
                c.next()
                    .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                    .unwrap_or_default()
            })
            .collect(),
    }
}

fn cut(message: String) -> String {
    crate::cluster::events::bounded(message)
}

/// `DirectXGPUHealthy` for `inventory`: its served devices (enabled resources). `Unknown` with
/// `health.enabled: false` (every device is then advertised Healthy unchecked).
pub(crate) fn healthy(inventory: &Inventory) -> Wanted {
    if !inventory.config.pipeline.health.enabled {
        return Wanted {
            type_: HEALTHY,
            status: "Unknown",
            reason: "HealthChecksOff".into(),
            message: "health.enabled is false: dxdp does not check device health".into(),
        };
    }
    let sick = super::events::unhealthy_served(inventory);
    let total = super::events::served_devices(inventory).count();
    let missing =
        dxdp_core::health::expected::missing_message(&dxdp_core::health::expected::judge(
            &inventory.discovery,
            &inventory.config.expected_counts(),
        ));
    if let Some(m) = &missing {
        // Devices health.expectedDevices expects are gone: `GPUMissing`, or `MultipleReasons`
        // when served devices are Unhealthy too (both are said).
        let unhealthy = if sick.is_empty() {
            String::new()
        } else {
            format!(
                "; {} of {total} GPU(s) dxdp serves are Unhealthy: {}",
                sick.len(),
                each_sick(&sick).join("; ")
            )
        };
        return Wanted {
            type_: HEALTHY,
            status: "False",
            reason: if sick.is_empty() {
                GPU_MISSING.into()
            } else {
                "MultipleReasons".into()
            },
            message: cut(format!(
                "GPUs missing (health.expectedDevices): {m}{unhealthy}"
            )),
        };
    }
    if sick.is_empty() {
        return Wanted {
            type_: HEALTHY,
            status: "True",
            reason: "GPUsHealthy".into(),
            message: format!("all {total} GPU(s) dxdp serves are Healthy"),
        };
    }
    let reason = if sick.iter().all(|s| s.reason == sick[0].reason) {
        camel(sick[0].reason)
    } else {
        "MultipleReasons".into()
    };
    let each = each_sick(&sick);
    Wanted {
        type_: HEALTHY,
        status: "False",
        reason,
        message: cut(format!(
            "{} of {total} GPU(s) dxdp serves are Unhealthy: {}",
            sick.len(),
            each.join("; ")
        )),
    }
}

/// Each Unhealthy device and why, for a condition's message.
fn each_sick(sick: &[super::events::Sick]) -> Vec<String> {
    sick.iter()
        .map(|s| match &s.detail {
            Some(d) => format!("{} ({}): {}: {d}", s.device, s.description, s.reason),
            None => format!("{} ({}): {}", s.device, s.description, s.reason),
        })
        .collect()
}

/// `DirectXGPUIsolation` for the violations that last (`None`: no audit yet); `Unknown` when
/// telemetry, which the audit judges, is off (`audit_on` false).
pub(crate) fn isolation(active: &Active, audit_on: bool) -> Wanted {
    if !audit_on {
        return Wanted {
            type_: ISOLATION,
            status: "Unknown",
            reason: "AuditOff".into(),
            message: "telemetry.enabled is false: the GPU isolation audit does not run".into(),
        };
    }
    match active {
        None => Wanted {
            type_: ISOLATION,
            status: "Unknown",
            reason: "AuditPending".into(),
            message: "the GPU isolation audit has not judged a sample yet".into(),
        },
        Some(v) if v.is_empty() => Wanted {
            type_: ISOLATION,
            status: "True",
            reason: "NoViolation".into(),
            message: "no pod container uses a GPU it was not allocated".into(),
        },
        Some(v) => {
            let each: Vec<String> = v
                .iter()
                .map(|v| {
                    format!(
                        "{}/{} container {} uses {}",
                        v.pod.namespace, v.pod.pod, v.pod.container, v.used.device
                    )
                })
                .collect();
            Wanted {
                type_: ISOLATION,
                status: "False",
                reason: "IsolationViolation".into(),
                message: cut(format!(
                    "{} pod container(s) use a GPU they were not allocated (docs/isolation.md): {}",
                    v.len(),
                    each.join("; ")
                )),
            }
        }
    }
}

/// The condition to write for `want`, given the Node's current one of that type: its
/// `lastTransitionTime` is kept while the status stays. `None` when nothing would change.
pub(crate) fn to_write(
    want: &Wanted,
    current: Option<&NodeCondition>,
    now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> Option<NodeCondition> {
    if let Some(c) = current {
        if c.status == want.status
            && c.reason.as_deref() == Some(want.reason.as_str())
            && c.message.as_deref() == Some(want.message.as_str())
        {
            return None;
        }
    }
    let transition = current
        .filter(|c| c.status == want.status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Some(NodeCondition {
        type_: want.type_.into(),
        status: want.status.into(),
        reason: Some(want.reason.clone()),
        message: Some(want.message.clone()),
        last_heartbeat_time: Some(now),
        last_transition_time: Some(transition),
    })
}

impl Cluster {
    /// The node's `status.conditions` now.
    async fn node_conditions(&self) -> Result<Vec<NodeCondition>, String> {
        let node = self.get_node().await.map_err(|e| e.to_string())?;
        Ok(node.status.and_then(|s| s.conditions).unwrap_or_default())
    }

    /// Writes `wanted` into the node's conditions where they differ (one strategic merge patch
    /// of `nodes/status`). Returns the types written.
    pub(crate) async fn set_conditions(
        &self,
        wanted: &[Wanted],
    ) -> Result<Vec<&'static str>, String> {
        let current = self.node_conditions().await?;
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        );
        let mut written = Vec::new();
        let mut changes = Vec::new();
        for w in wanted {
            let c = current.iter().find(|c| c.type_ == w.type_);
            if let Some(new) = to_write(w, c, now.clone()) {
                written.push(w.type_);
                changes.push(serde_json::to_value(new).map_err(|e| e.to_string())?);
            }
        }
        if changes.is_empty() {
            return Ok(written);
        }
        self.patch_conditions(serde_json::Value::Array(changes))
            .await?;
        Ok(written)
    }

    /// Removes dxdp's conditions from the node if it has them (a strategic `$patch: delete`
    /// per type). Returns the types removed.
    pub(crate) async fn drop_conditions(&self) -> Result<Vec<&'static str>, String> {
        let current = self.node_conditions().await?;
        let present: Vec<&'static str> = CONDITION_TYPES
            .into_iter()
            .filter(|t| current.iter().any(|c| c.type_ == *t))
            .collect();
        if present.is_empty() {
            return Ok(present);
        }
        let deletes: Vec<serde_json::Value> = present
            .iter()
            .map(|t| serde_json::json!({"type": t, "$patch": "delete"}))
            .collect();
        self.patch_conditions(serde_json::Value::Array(deletes))
            .await?;
        Ok(present)
    }

    async fn patch_conditions(&self, conditions: serde_json::Value) -> Result<(), String> {
        let body = serde_json::json!({"status": {"conditions": conditions}});
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        let patch = Patch::Strategic(&body);
        let call = self.api.patch_status(self.node(), &params, &patch);
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(kube::Error::Api(s))) if s.code == 403 => Err(format!(
                "cannot patch the status of node {}: {} (grant patch on nodes/status: the chart does with health.nodeConditions=true)",
                self.node(),
                s.message
            )),
            Ok(Err(e)) => Err(format!(
                "cannot patch the status of node {}: {}",
                self.node(),
                chain(&e)
            )),
            Err(_) => Err(format!(
                "the API server did not answer a status patch of node {} within {} s",
                self.node(),
                self.timeout.as_secs_f64()
            )),
        }
    }
}

/// The node conditions task: its inputs, cloned for every (re)start by the supervisor.
#[derive(Debug, Clone)]
pub struct NodeConditions {
    /// The API server.
    pub cluster: Cluster,
    /// The served inventory.
    pub inventory: InventoryRx,
    /// The isolation violations that last (the isolation tracker's channel).
    pub active: watch::Receiver<Active>,
    /// The configuration (`health.nodeConditions`).
    pub config: watch::Receiver<Arc<Config>>,
    /// Where writes are counted.
    pub metrics: HealthMetrics,
    /// Retries of failed calls.
    pub backoff: Backoff,
    /// How often the Node is read again (`RESYNC`).
    pub resync: Duration,
}

impl Task for NodeConditions {
    /// Keeps the conditions until the channels close (then waits to be stopped).
    async fn run(self) {
        let NodeConditions {
            cluster,
            mut inventory,
            mut active,
            mut config,
            metrics,
            backoff,
            resync,
        } = self;
        // What the node has, as last written or read (`None`: read it again).
        let mut applied: Option<Vec<Wanted>> = None;
        // Whether the conditions are known to be off the node (while turned off).
        let mut removed = false;
        let mut failures = 0u32;
        let mut last_error: Option<String> = None;
        let mut resync_at = Instant::now() + resync;
        let (mut inventory_open, mut active_open, mut config_open) = (true, true, true);
        loop {
            let (on, audit_on) = {
                let c = config.borrow_and_update();
                (c.health_reports.node_conditions, c.telemetry.enabled)
            };
            let inv = inventory.borrow_and_update().clone();
            let violations = active.borrow_and_update().clone();
            if Instant::now() >= resync_at {
                applied = None;
                resync_at = Instant::now() + resync;
            }
            let mut wake = Some(resync_at);
            if on {
                removed = false;
                let mut want = Vec::new();
                want.push(healthy(&inv));
                want.push(isolation(&violations, audit_on));
                if applied.as_ref() != Some(&want) {
                    match cluster.set_conditions(&want).await {
                        Ok(written) => {
                            for w in want.iter().filter(|w| written.contains(&w.type_)) {
                                metrics.condition(w.type_, ConditionResult::Set);
                                if w.status == "False" {
                                    tracing::warn!(node = %cluster.node(), condition = w.type_, reason = %w.reason, "node condition {}=False: {}", w.type_, w.message);
                                } else {
                                    tracing::info!(node = %cluster.node(), condition = w.type_, reason = %w.reason, "node condition {}={}", w.type_, w.status);
                                }
                            }
                            if failures > 0 {
                                tracing::info!("node conditions are written again after {failures} failed attempts");
                            }
                            applied = Some(want);
                            failures = 0;
                            last_error = None;
                        }
                        Err(why) => {
                            for w in &want {
                                metrics.condition(w.type_, ConditionResult::Error);
                            }
                            failures = failures.saturating_add(1);
                            say_once(&mut last_error, why, "cannot set dxdp's node conditions");
                            wake = Some(Instant::now() + backoff.delay(failures, random()));
                        }
                    }
                }
            } else if !removed {
                applied = None;
                match cluster.drop_conditions().await {
                    Ok(types) => {
                        for t in &types {
                            metrics.condition(t, ConditionResult::Removed);
                        }
                        if !types.is_empty() {
                            tracing::info!(node = %cluster.node(), "node conditions {} removed (health.nodeConditions is false)", types.join(", "));
                        }
                        removed = true;
                        failures = 0;
                        last_error = None;
                    }
                    Err(why) if why.contains("grant patch on nodes/status") => {
                        // Without the permission (the chart grants it only while the option is
                        // on) this cannot succeed: said once, not retried.
                        for t in CONDITION_TYPES {
                            metrics.condition(t, ConditionResult::Error);
                        }
                        tracing::warn!(node = %cluster.node(), "dxdp's node conditions are left on the node from when health.nodeConditions was true, and cannot be removed: {why}; run `dxdp cleanup --node {}` (it removes them; dxdp puts its labels back), or turn health.nodeConditions off in the ConfigMap before a helm upgrade takes the permission away", cluster.node());
                        removed = true;
                    }
                    Err(why) => {
                        for t in CONDITION_TYPES {
                            metrics.condition(t, ConditionResult::Error);
                        }
                        failures = failures.saturating_add(1);
                        say_once(&mut last_error, why, "cannot remove dxdp's node conditions");
                        wake = Some(Instant::now() + backoff.delay(failures, random()));
                    }
                }
            }
            if !on && removed {
                // Nothing to keep: wait for the option to come back.
                wake = None;
            }
            if !inventory_open && !active_open && !config_open && wake.is_none() {
                std::future::pending::<()>().await;
            }
            tokio::select! {
                changed = inventory.changed(), if inventory_open => inventory_open = changed.is_ok(),
                changed = active.changed(), if active_open => active_open = changed.is_ok(),
                changed = config.changed(), if config_open => config_open = changed.is_ok(),
                () = sleep_until(wake) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn reasons_are_camel_case() {
        assert_eq!(camel(Reason::ProblemCode), "ProblemCode");
        assert_eq!(camel(Reason::DriverUpdate), "DriverUpdate");
        assert_eq!(camel(Reason::LiveKernelEvent), "LiveKernelEvent");
        assert_eq!(camel(Reason::Removed), "Removed");
        assert_eq!(camel(Reason::Tdr), "TDR");
        assert_eq!(camel(Reason::IsolationViolation), "IsolationViolation");
        assert_eq!(camel(Reason::Thermal), "Thermal");
    }

    #[test]
    fn the_transition_time_is_kept_while_the_status_stays() {
        let t0 = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap());
        let t1 = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_600).unwrap());
        let want = Wanted {
            type_: HEALTHY,
            status: "False",
            reason: "TDR".into(),
            message: "1 of 4".into(),
        };
        let first = to_write(&want, None, t0.clone()).unwrap();
        assert_eq!(first.last_transition_time, Some(t0.clone()));
        assert_eq!(to_write(&want, Some(&first), t1.clone()), None, "unchanged");
        let more = Wanted {
            message: "2 of 4".into(),
            ..want.clone()
        };
        let second = to_write(&more, Some(&first), t1.clone()).unwrap();
        assert_eq!(second.last_transition_time, Some(t0), "still False");
        assert_eq!(second.last_heartbeat_time, Some(t1.clone()));
        let well = Wanted {
            status: "True",
            reason: "GPUsHealthy".into(),
            ..more
        };
        let third = to_write(&well, Some(&second), t1.clone()).unwrap();
        assert_eq!(third.last_transition_time, Some(t1));
    }

    /// `health.expectedDevices.fromNodeLabel` end to end: the Node's instance type (read from the
    /// stand-in) selects the built-in row of `g4dn.12xlarge` (4 GPUs); the host has three of the
    /// four T4s of tests/fixtures/nvidia-multi-gpu.yaml; `DirectXGPUHealthy` says `GPUMissing`,
    /// naming expected against found, and `True` again once the fourth is back.
    #[tokio::test]
    async fn the_instance_type_label_sets_the_expectation_and_the_condition_says_gpu_missing() {
        use std::collections::BTreeMap;
        use std::time::Duration;

        use crate::cluster::tests::standin::ApiServerStandin;
        use crate::config::{Config, Inputs};
        use crate::inventory::{self, Inventory};
        use crate::util::retry::Backoff;
        use crate::util::task::Task;

        const WAIT: Duration = Duration::from_secs(20);
        const FAST: Backoff = Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(20),
            timeout: Duration::from_secs(5),
        };
        let fixture = |name: &str| {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures")
                .join(name);
            dxdp_core::snapshot::read_file(&path).unwrap()
        };
        let inventory = |facts: &dxdp_core::facts::HostFacts, config: Config| -> Arc<Inventory> {
            Arc::new(inventory::build(facts, Arc::new(config)).0)
        };

        let api = ApiServerStandin::start(
            "n1",
            &[("node.kubernetes.io/instance-type", "g4dn.12xlarge")],
        )
        .await
        .unwrap();
        let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(
            &file,
            "health:\n  nodeConditions: true\n  expectedDevices:\n    fromNodeLabel: true\n",
        )
        .unwrap();
        let resolved = Inputs {
            file: Some((file, true)),
            node: Some(cluster.get().await.unwrap()),
            ..Inputs::default()
        }
        .resolve()
        .unwrap();
        assert!(resolved.notices.is_empty(), "{:?}", resolved.notices);
        assert_eq!(
            resolved.expected_counts(),
            BTreeMap::from([(dxdp_core::devices::Resource::Display, 4)])
        );
        let shown = resolved
            .entries()
            .into_iter()
            .find(|(k, _, _)| *k == crate::config::keys::Key::HealthExpectedDevices)
            .map(|(_, v, _)| v);
        assert_eq!(
            shown,
            Some(serde_json::json!({
                "display": 4,
                "compute": null,
                "fromNodeLabel": "node.kubernetes.io/instance-type",
                "derived": {
                    "from": "node.kubernetes.io/instance-type=g4dn.12xlarge",
                    "row": "built-in",
                    "counts": {"display": 4, "compute": null},
                },
            }))
        );
        let config = resolved.config;
        let all = fixture("nvidia-multi-gpu.yaml");
        let mut three = all.clone();
        three.adapters.remove(3);
        let (inventory_tx, inventory_rx) = watch::channel(inventory(&three, config.clone()));
        let (_active_tx, active_rx) = watch::channel(None);
        let (_config_tx, config_rx) = watch::channel(Arc::new(config.clone()));
        let task = tokio::spawn(
            NodeConditions {
                cluster,
                inventory: inventory_rx,
                active: active_rx,
                config: config_rx,
                metrics: crate::observe::metrics::Metrics::new()
                    .device_health()
                    .clone(),
                backoff: FAST,
                resync: RESYNC,
            }
            .run(),
        );
        let healthy = |c: &[serde_json::Value], status: &str, reason: &str| {
            c.iter().any(|c| {
                c["type"] == "DirectXGPUHealthy" && c["status"] == status && c["reason"] == reason
            })
        };
        assert!(
            api.wait_for_conditions(WAIT, |c| healthy(c, "False", "GPUMissing"))
                .await,
            "{:?}",
            api.conditions()
        );
        let c = api.conditions();
        let condition = c.iter().find(|c| c["type"] == "DirectXGPUHealthy").unwrap();
        assert_eq!(
            condition["message"],
            "GPUs missing (health.expectedDevices): display: 3 of 4 expected GPU(s) found"
        );
        inventory_tx.send_replace(inventory(&all, config));
        assert!(
            api.wait_for_conditions(WAIT, |c| healthy(c, "True", "GPUsHealthy"))
                .await,
            "{:?}",
            api.conditions()
        );
        task.abort();
    }
}
