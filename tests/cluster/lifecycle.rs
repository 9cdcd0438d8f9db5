//! The node's lifecycle around its GPUs against the API server stand-in (issue 45 items 4 and
//! 5): the startup taint removed once the Node's allocatable shows the GPUs (and, with
//! `validation.gate`, once validation passed), and only the configured taint; evictions of the
//! pods holding a GPU Unhealthy past the grace period, a PodDisruptionBudget's 429 tried again;
//! the cordon of a node none of whose GPUs is Healthy, lifted only when it is dxdp's. Expected
//! values are written out from `tests/fixtures/nvidia-multi-gpu.yaml` (four Tesla T4, display).

use crate::apiserver;
use crate::common;
use crate::podresources;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::watch;

use apiserver::ApiServerStandin;
use dxdp::cluster::node::FollowNode;
use dxdp::cluster::Cluster;
use dxdp::config::{Config, NodeInfo};
use dxdp::health::lifecycle::cordon::{KeepCordon, CORDON_MARK};
use dxdp::health::lifecycle::evict::EvictHolders;
use dxdp::health::lifecycle::startup_taint::RemoveStartupTaint;
use dxdp::inventory::{self, Inventory};
use dxdp::observe::metrics::Metrics;
use dxdp::observe::remediation_metrics::{EvictionResult, NodeChange, RemediationMetrics};
use dxdp::util::retry::Backoff;
use dxdp::util::task::Task;
use dxdp_core::facts::HostFacts;
use dxdp_core::lifecycle::ManagedTaint;
use dxdp_core::telemetry::PodAllocation;
use podresources::PodResourcesStandin;

const GPU0: &str = "pciroot-0-pci-1b00-0540e5ad73bf260f";
const GPU1: &str = "pciroot-0-pci-1c00-ba6abfb666f4630a";
const DISPLAY: &str = "directx.microsoft.com/display";
const NOT_READY: &str = "directx.microsoft.com/gpu-not-ready";
const WAIT: Duration = Duration::from_secs(20);

const FAST: Backoff = Backoff {
    initial: Duration::from_millis(5),
    max: Duration::from_millis(50),
    timeout: Duration::from_secs(5),
};

/// The four T4s; the adapters at `sick` have problem code 43.
fn facts(sick: &[usize]) -> HostFacts {
    let mut f = common::facts("nvidia-multi-gpu");
    for &i in sick {
        f.adapters[i].pnp.as_mut().unwrap().problem_code = 43;
    }
    f
}

fn inventory_of(facts: &HostFacts, config: &Config) -> Arc<Inventory> {
    Arc::new(inventory::build(facts, Arc::new(config.clone())).0)
}

fn taint(key: &str, effect: &str) -> serde_json::Value {
    json!({"key": key, "effect": effect})
}

/// Waits (bounded) until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not reached: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Whether `happened` stayed false for all of `d` (for what must not happen).
async fn stays_false(d: Duration, happened: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + d;
    while tokio::time::Instant::now() < deadline {
        if happened() {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}

/// The Node followed from `api`, as the daemon follows it.
fn follow(
    api: &ApiServerStandin,
) -> (
    watch::Receiver<Option<NodeInfo>>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = watch::channel(None);
    let task = tokio::spawn(
        FollowNode {
            cluster: Cluster::at_url(&api.url(), "n1").unwrap(),
            tx,
            backoff: FAST,
            poll: Duration::from_secs(3600),
        }
        .run(),
    );
    (rx, task)
}

mod startup_taint {
    use super::*;

    struct Rig {
        api: ApiServerStandin,
        node: watch::Receiver<Option<NodeInfo>>,
        config: watch::Sender<Arc<Config>>,
        metrics: RemediationMetrics,
        tasks: Vec<tokio::task::JoinHandle<()>>,
    }

    impl Drop for Rig {
        fn drop(&mut self) {
            for t in &self.tasks {
                t.abort();
            }
        }
    }

    /// The node registered with the startup taint, another key's taint and the startup key with
    /// another effect; GPU 1 Unhealthy.
    async fn rig(config: Config) -> Rig {
        let api = ApiServerStandin::start("n1", &[]).await.unwrap();
        api.set_taints(vec![
            taint("example.com/dedicated", "NoSchedule"),
            taint(NOT_READY, "NoSchedule"),
            taint(NOT_READY, "NoExecute"),
        ]);
        let (node, follow) = follow(&api);
        let (_inventory, inventory_rx) = watch::channel(inventory_of(&facts(&[1]), &config));
        let (config, config_rx) = watch::channel(Arc::new(config));
        let metrics = Metrics::new().remediation().clone();
        let task = tokio::spawn(
            RemoveStartupTaint {
                cluster: Cluster::at_url(&api.url(), "n1").unwrap(),
                node: node.clone(),
                inventory: inventory_rx,
                config: config_rx,
                metrics: metrics.clone(),
                backoff: FAST,
            }
            .run(),
        );
        // The inventory sender lives in the task's receiver only: the task keeps its last value.
        Rig {
            api,
            node,
            config,
            metrics,
            tasks: vec![follow, task],
        }
    }

    fn managed() -> Config {
        Config {
            startup_taint: Some(
                ManagedTaint::parse("directx.microsoft.com/gpu-not-ready:NoSchedule").unwrap(),
            ),
            ..Config::default()
        }
    }

    /// The index of the first taint patch in the stand-in's requests.
    fn taint_patch(api: &ApiServerStandin) -> Option<usize> {
        api.requests()
            .iter()
            .position(|r| r.method == "PATCH" && r.json().pointer("/spec/taints").is_some())
    }

    /// Waits until the node followed shows `allocatable` for the display resource.
    async fn shown(r: &mut Rig, quantity: &str) {
        let q = quantity.to_string();
        let mut node = r.node.clone();
        tokio::time::timeout(
            WAIT,
            node.wait_for(|n| {
                n.as_ref().and_then(|n| n.allocatable_of(DISPLAY)) == Some(q.as_str())
            }),
        )
        .await
        .expect("the Node watch shows the allocatable")
        .unwrap();
        // Whatever the task makes of it has happened once it is polled again.
        tokio::task::yield_now().await;
    }

    #[tokio::test]
    async fn it_comes_off_once_allocatable_shows_the_gpus_and_only_it() {
        let mut r = rig(managed()).await;
        until("the task saw the taint", || r.metrics.taint_present()).await;
        // The kubelet has not shown the GPUs yet (0 allocatable): the taint stays.
        r.api.set_allocatable(&[("cpu", "4"), (DISPLAY, "0")]);
        shown(&mut r, "0").await;
        let before = r.api.requests().len();
        assert_eq!(taint_patch(&r.api), None);
        // Three healthy T4s shown: removed, and only the managed key with its effect.
        r.api.set_allocatable(&[("cpu", "4"), (DISPLAY, "3")]);
        assert!(
            r.api.wait_for_state(WAIT, |_, t| t.len() == 2).await,
            "{:?}",
            r.api.taints()
        );
        assert!(taint_patch(&r.api).unwrap() >= before);
        assert_eq!(
            r.api.taints(),
            vec![
                taint("example.com/dedicated", "NoSchedule"),
                taint(NOT_READY, "NoExecute"),
            ]
        );
        until("counted", || {
            r.metrics.taint_removals(NodeChange::Removed) == 1
        })
        .await;
        until("the gauge follows", || !r.metrics.taint_present()).await;
        // Put back by hand: removed again (the rule holds).
        r.api.set_taints(vec![taint(NOT_READY, "NoSchedule")]);
        assert!(r.api.wait_for_state(WAIT, |_, t| t.is_empty()).await);
        until("counted twice", || {
            r.metrics.taint_removals(NodeChange::Removed) == 2
        })
        .await;
    }

    #[tokio::test]
    async fn with_the_gate_it_waits_for_a_passed_validation() {
        let mut r = rig(managed().with_validation_gate(true, true)).await;
        r.api.set_allocatable(&[(DISPLAY, "3")]);
        shown(&mut r, "3").await;
        until("the task saw the taint", || r.metrics.taint_present()).await;
        r.api
            .set_label("directx.microsoft.com/validated", Some("false"));
        let mut node = r.node.clone();
        node.wait_for(|n| {
            n.as_ref()
                .is_some_and(|n| n.label("directx.microsoft.com/validated").is_some())
        })
        .await
        .unwrap();
        tokio::task::yield_now().await;
        let before = r.api.requests().len();
        assert_eq!(
            taint_patch(&r.api),
            None,
            "removed before validation passed"
        );
        r.api
            .set_label("directx.microsoft.com/validated", Some("true"));
        assert!(r.api.wait_for_state(WAIT, |_, t| t.len() == 2).await);
        assert!(taint_patch(&r.api).unwrap() >= before);
    }

    #[tokio::test]
    async fn a_taint_dxdp_is_not_configured_to_manage_is_left_alone() {
        let mut r = rig(Config::default()).await;
        r.api.set_allocatable(&[(DISPLAY, "3")]);
        shown(&mut r, "3").await;
        tokio::task::yield_now().await;
        let before = r.api.requests().len();
        assert_eq!(taint_patch(&r.api), None);
        assert_eq!(r.api.taints().len(), 3);
        // Configured for another effect: still none of the node's.
        let other = Config {
            startup_taint: Some(
                ManagedTaint::parse("directx.microsoft.com/gpu-not-ready:PreferNoSchedule")
                    .unwrap(),
            ),
            ..Config::default()
        };
        r.config.send_replace(Arc::new(other));
        // Then for the node's: removed, after the configuration said so.
        r.config.send_replace(Arc::new(managed()));
        assert!(r.api.wait_for_state(WAIT, |_, t| t.len() == 2).await);
        assert!(taint_patch(&r.api).unwrap() >= before);
        assert!(!r.api.taints().contains(&taint(NOT_READY, "NoSchedule")));
    }
}

mod remediation {
    use super::*;

    fn holds(namespace: &str, pod: &str, ids: &[&str]) -> PodAllocation {
        PodAllocation {
            namespace: namespace.into(),
            pod: pod.into(),
            container: "main".into(),
            resource: DISPLAY.into(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn clock() -> u64 {
        // 2026-11-25T21:49:12.512Z
        1_795_643_352_512
    }

    #[tokio::test]
    async fn holders_of_a_gpu_unhealthy_past_the_grace_period_are_evicted_a_429_tried_again() {
        if !common::af_unix(
            "holders_of_a_gpu_unhealthy_past_the_grace_period_are_evicted_a_429_tried_again",
        ) {
            return;
        }
        let dir = common::socket_tempdir();
        let endpoint = common::local_endpoint(dir.path(), "pod-resources.sock");
        // ml/train-0 and vision/detect-0 hold GPU 1 (Unhealthy), ml/infer-0 holds GPU 0.
        let _pods = PodResourcesStandin::start(
            &endpoint,
            vec![
                holds("ml", "train-0", &[GPU1]),
                holds("ml", "infer-0", &[GPU0]),
                holds("vision", "detect-0", &[GPU1]),
            ],
        )
        .await
        .unwrap();
        let api = ApiServerStandin::start("n1", &[]).await.unwrap();
        // A PodDisruptionBudget refuses the first eviction (ml/train-0, first in order).
        api.answer_evictions(&[429]);
        let grace = Duration::from_millis(500);
        let mut config = Config::default();
        config.telemetry.pod_resources_endpoint = Some(endpoint.clone());
        config.remediation.evict_pods = true;
        config.remediation.grace_period = grace;
        let (inventory, inventory_rx) = watch::channel(inventory_of(&facts(&[1]), &config));
        let (_config, config_rx) = watch::channel(Arc::new(config.clone()));
        let metrics = Metrics::new().remediation().clone();
        let started = Instant::now();
        let task = tokio::spawn(
            EvictHolders {
                cluster: Cluster::at_url(&api.url(), "n1").unwrap(),
                inventory: inventory_rx,
                config: config_rx,
                kubelet_dir: dir.path().join("device-plugins"),
                metrics: metrics.clone(),
                backoff: FAST,
                clock,
                refused_retry: Duration::from_millis(200),
            }
            .run(),
        );
        until("both evicted", || api.evicted().len() == 2).await;
        assert!(
            started.elapsed() >= grace,
            "evicted within the grace period"
        );
        assert_eq!(api.evicted(), vec!["vision/detect-0", "ml/train-0"]);
        assert_eq!(metrics.evictions(EvictionResult::Refused), 1);
        until("counted", || {
            metrics.evictions(EvictionResult::Evicted) == 2
        })
        .await;
        until("three Events", || api.events().len() == 3).await;
        let events: Vec<(String, String, String)> = api
            .events()
            .iter()
            .map(|e| {
                (
                    e["involvedObject"]["namespace"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                    e["involvedObject"]["name"].as_str().unwrap().to_string(),
                    e["reason"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let t = |ns: &str, p: &str, r: &str| (ns.to_string(), p.to_string(), r.to_string());
        assert_eq!(
            events,
            vec![
                t("ml", "train-0", "GPUUnhealthyEvictionRefused"),
                t("vision", "detect-0", "GPUUnhealthyEviction"),
                t("ml", "train-0", "GPUUnhealthyEviction"),
            ]
        );
        let message = api.events()[1]["message"].as_str().unwrap().to_string();
        assert_eq!(
            message,
            format!("GPU {GPU1} (NVIDIA Tesla T4), allocated to container main as {DISPLAY}, is Unhealthy since 2026-11-25T21:49:12Z (problem_code: device node has problem code 43: CM_PROB_FAILED_POST_START (the driver reported a failure, often a crashed GPU)), longer than health.remediation.gracePeriod (0.5 s): dxdp evicted the pod (health.remediation.evictPods)")
        );
        assert!(api.events()[0]["message"]
            .as_str()
            .unwrap()
            .contains("the eviction was refused (Cannot evict pod as it would violate the pod's disruption budget.), most likely by a PodDisruptionBudget"));
        // The device recovers and fails again while the pods are still listed: no second
        // eviction of either (they are terminating).
        inventory.send_replace(inventory_of(&facts(&[]), &config));
        assert!(stays_false(grace * 2, || api.evicted().len() > 2).await);
        inventory.send_replace(inventory_of(&facts(&[1]), &config));
        assert!(
            stays_false(grace * 4, || api.evicted().len() > 2).await,
            "evicted twice: {:?}",
            api.evicted()
        );
        assert_eq!(metrics.evictions(EvictionResult::Evicted), 2);
        task.abort();
    }

    struct Cordon {
        api: ApiServerStandin,
        inventory: watch::Sender<Arc<Inventory>>,
        config: Config,
        metrics: RemediationMetrics,
        tasks: Vec<tokio::task::JoinHandle<()>>,
    }

    impl Drop for Cordon {
        fn drop(&mut self) {
            for t in &self.tasks {
                t.abort();
            }
        }
    }

    async fn cordon_rig(sick: &[usize], grace: Duration) -> Cordon {
        let api = ApiServerStandin::start("n1", &[]).await.unwrap();
        let (node, follow) = follow(&api);
        let mut config = Config::default();
        config.remediation.cordon = true;
        config.remediation.grace_period = grace;
        let (inventory, inventory_rx) = watch::channel(inventory_of(&facts(sick), &config));
        let (_config, config_rx) = watch::channel(Arc::new(config.clone()));
        let metrics = Metrics::new().remediation().clone();
        let task = tokio::spawn(
            KeepCordon {
                cluster: Cluster::at_url(&api.url(), "n1").unwrap(),
                node,
                inventory: inventory_rx,
                config: config_rx,
                metrics: metrics.clone(),
                backoff: FAST,
            }
            .run(),
        );
        Cordon {
            api,
            inventory,
            config,
            metrics,
            tasks: vec![follow, task],
        }
    }

    #[tokio::test]
    async fn dxdp_cordons_a_node_without_a_healthy_gpu_and_lifts_only_its_own_cordon() {
        let grace = Duration::from_millis(300);
        let all = [0, 1, 2, 3];
        let started = Instant::now();
        let r = cordon_rig(&all, grace).await;
        assert!(
            r.api
                .wait_for_cordon(WAIT, |u, a| u && a.contains_key(CORDON_MARK))
                .await,
            "{:?}",
            r.api.cordon_state()
        );
        assert!(started.elapsed() >= grace);
        let (_, annotations) = r.api.cordon_state();
        assert!(annotations[CORDON_MARK].starts_with("every served GPU (4) Unhealthy since "));
        until("counted", || r.metrics.cordons(NodeChange::Cordoned) == 1).await;
        // One GPU Healthy again: dxdp's cordon is lifted, its mark with it.
        r.inventory
            .send_replace(inventory_of(&facts(&[0, 1, 2]), &r.config));
        assert!(r.api.wait_for_cordon(WAIT, |u, a| !u && a.is_empty()).await);
        until("counted", || r.metrics.cordons(NodeChange::Uncordoned) == 1).await;
        // An operator cordons the node; the GPUs fail again and recover: dxdp neither marks
        // nor lifts that cordon.
        r.api.set_unschedulable(true);
        r.inventory
            .send_replace(inventory_of(&facts(&all), &r.config));
        assert!(
            !r.api
                .wait_for_cordon(grace * 4, |u, a| !u || a.contains_key(CORDON_MARK))
                .await,
            "dxdp touched an operator's cordon: {:?}",
            r.api.cordon_state()
        );
        r.inventory
            .send_replace(inventory_of(&facts(&[]), &r.config));
        assert!(
            !r.api.wait_for_cordon(grace * 4, |u, _| !u).await,
            "dxdp lifted an operator's cordon"
        );
        assert_eq!(r.metrics.cordons(NodeChange::Cordoned), 1);
        assert_eq!(r.metrics.cordons(NodeChange::Uncordoned), 1);
    }

    #[tokio::test]
    async fn an_operator_who_uncordons_dxdps_cordon_is_respected_until_the_gpus_recover() {
        let grace = Duration::from_millis(200);
        let all = [0, 1, 2, 3];
        let r = cordon_rig(&all, grace).await;
        assert!(
            r.api
                .wait_for_cordon(WAIT, |u, a| u && a.contains_key(CORDON_MARK))
                .await
        );
        // The operator uncordons: dxdp removes its mark and does not cordon again this episode.
        r.api.set_unschedulable(false);
        assert!(r.api.wait_for_cordon(WAIT, |u, a| !u && a.is_empty()).await);
        assert!(
            stays_false(grace * 4, || r.api.cordon_state().0).await,
            "cordoned again in the same episode"
        );
        // Recovered, then failed again: a new episode, cordoned again.
        r.inventory
            .send_replace(inventory_of(&facts(&[0]), &r.config));
        assert!(stays_false(grace * 2, || r.api.cordon_state().0).await);
        r.inventory
            .send_replace(inventory_of(&facts(&all), &r.config));
        assert!(
            r.api
                .wait_for_cordon(WAIT, |u, a| u && a.contains_key(CORDON_MARK))
                .await
        );
        until("counted", || r.metrics.cordons(NodeChange::Cordoned) == 2).await;
    }
}
