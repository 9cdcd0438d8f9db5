//! Device health on the cluster side (issue 31): `GPUUnhealthy` Events on the pods holding an
//! Unhealthy device (API server stand-in + PodResources stand-in), the `DirectXGPUHealthy` and
//! `DirectXGPUIsolation` node conditions (strategic merge patches of `nodes/status` on the
//! stand-in), and `/readyz` waiting for the Node's allocatable (the real Node watch and the real
//! HTTP endpoint). Every expected Event, condition and answer is written out by hand from
//! `tests/fixtures/nvidia-multi-gpu.yaml` (four Tesla T4) with GPU 1 given problem code 43.

use crate::common;

use crate::apiserver;

use crate::podresources;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use apiserver::ApiServerStandin;
use dxdp::cluster::events::{EventLimits, EVENT_LIMITS};
use dxdp::cluster::Cluster;
use dxdp::config::Config;
use dxdp::health::capacity::{CapacityGate, NO_CLIENT};
use dxdp::health::conditions::NodeConditions;
use dxdp::health::events::HealthEvents;
use dxdp::inventory::{self, Inventory};
use dxdp::observe::device_health::{ConditionResult, HealthMetrics};
use dxdp::observe::event_metrics::EventResult;
use dxdp::observe::metrics::Metrics;
use dxdp::observe::state::{Capacity, Phase};
use dxdp::observe::Observe;
use dxdp::util::retry::Backoff;
use dxdp::util::task::Task;
use dxdp_core::facts::HostFacts;
use dxdp_core::telemetry::isolation::{Adapter, Violation, ViolationKind};
use dxdp_core::telemetry::{PodAllocation, PodRef};
use podresources::PodResourcesStandin;

const GPU0: &str = "pciroot-0-pci-1b00-0540e5ad73bf260f";
const GPU1: &str = "pciroot-0-pci-1c00-ba6abfb666f4630a";
const DISPLAY: &str = "directx.microsoft.com/display";
const COMPUTE: &str = "directx.microsoft.com/compute";
/// What dxdp says of problem code 43 (the pipeline's sentence).
const CODE_43: &str = "device node has problem code 43: CM_PROB_FAILED_POST_START (the driver reported a failure, often a crashed GPU)";
/// Generous: the waits are for behaviour, not speed.
const WAIT: Duration = Duration::from_secs(20);

const FAST: Backoff = Backoff {
    initial: Duration::from_millis(5),
    max: Duration::from_millis(50),
    timeout: Duration::from_secs(5),
};

/// 2026-11-25T21:49:12.512Z, the clock of "since when".
fn clock() -> u64 {
    1_795_643_352_512
}

/// The four T4s; with `sick`, GPU 1 has problem code 43.
fn facts(sick: bool) -> HostFacts {
    let mut f = common::facts("nvidia-multi-gpu");
    if sick {
        f.adapters[1].pnp.as_mut().unwrap().problem_code = 43;
    }
    f
}

fn inventory_of(facts: &HostFacts, config: Config) -> Arc<Inventory> {
    Arc::new(inventory::build(facts, Arc::new(config)).0)
}

fn holds(
    namespace: &str,
    pod: &str,
    container: &str,
    resource: &str,
    ids: &[&str],
) -> PodAllocation {
    PodAllocation {
        namespace: namespace.into(),
        pod: pod.into(),
        container: container.into(),
        resource: resource.into(),
        device_ids: ids.iter().map(|s| s.to_string()).collect(),
    }
}

/// Waits (bounded) until `done` holds for the metrics.
async fn counted(metrics: &HealthMetrics, what: &str, done: impl Fn(&HealthMetrics) -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done(metrics) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not counted: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The node conditions task's channels and metrics (dropping a sender ends nothing a test waits
/// for).
struct Running {
    inventory: watch::Sender<Arc<Inventory>>,
    active: watch::Sender<Option<Arc<Vec<Violation>>>>,
    config: watch::Sender<Arc<Config>>,
    metrics: HealthMetrics,
    task: tokio::task::JoinHandle<()>,
}

/// The node conditions task against `api` on `facts`, with the audit's `active` violations, under
/// `config`, reading the Node again every `resync`.
fn start_conditions(
    api: &ApiServerStandin,
    facts: HostFacts,
    active: Option<Arc<Vec<Violation>>>,
    config: Config,
    resync: Duration,
) -> Running {
    let (inventory, inventory_rx) = watch::channel(inventory_of(&facts, config.clone()));
    let (active, active_rx) = watch::channel(active);
    let (config, config_rx) = watch::channel(Arc::new(config));
    let metrics = Metrics::new().device_health().clone();
    let task = tokio::spawn(
        NodeConditions {
            cluster: Cluster::at_url(&api.url(), "n1").unwrap(),
            inventory: inventory_rx,
            active: active_rx,
            config: config_rx,
            metrics: metrics.clone(),
            backoff: FAST,
            resync,
        }
        .run(),
    );
    Running {
        inventory,
        active,
        config,
        metrics,
        task,
    }
}

fn message(container: &str, since: &str) -> String {
    format!("GPU {GPU1} (NVIDIA Tesla T4), allocated to container {container} as {DISPLAY}, is Unhealthy since {since} (problem_code: {CODE_43}). It is allocated to no new pod; this container keeps it (see dxdp's docs/health.md)")
}

mod events {
    use super::*;

    struct Rig {
        api: ApiServerStandin,
        pods: PodResourcesStandin,
        inventory: watch::Sender<Arc<Inventory>>,
        config: watch::Sender<Arc<Config>>,
        metrics: HealthMetrics,
        task: tokio::task::JoinHandle<()>,
        _dir: tempfile::TempDir,
    }

    /// GPU 1 sick, display served with two replicas, the Events task running with `limits`.
    async fn rig(allocations: Vec<PodAllocation>, limits: EventLimits, fail_posts: &[u16]) -> Rig {
        let dir = common::socket_tempdir();
        let endpoint = common::local_endpoint(dir.path(), "pod-resources.sock");
        let pods = PodResourcesStandin::start(&endpoint, allocations)
            .await
            .unwrap();
        let api = ApiServerStandin::start("n1", &[]).await.unwrap();
        api.fail_next("POST", fail_posts);
        let mut config = Config::default().with_replicas(2);
        config.telemetry.pod_resources_endpoint = Some(endpoint.clone());
        let (inventory, inventory_rx) = watch::channel(inventory_of(&facts(true), config.clone()));
        let (config, config_rx) = watch::channel(Arc::new(config));
        let metrics = Metrics::new().device_health().clone();
        let task = tokio::spawn(
            HealthEvents {
                cluster: Cluster::at_url(&api.url(), "n1").unwrap(),
                inventory: inventory_rx,
                config: config_rx,
                kubelet_dir: dir.path().join("device-plugins"),
                metrics: metrics.clone(),
                limits,
                backoff: FAST,
                clock,
            }
            .run(),
        );
        Rig {
            api,
            pods,
            inventory,
            config,
            metrics,
            task,
            _dir: dir,
        }
    }

    #[tokio::test]
    async fn each_pod_holding_the_unhealthy_device_gets_one_event() {
        if !common::af_unix("each_pod_holding_the_unhealthy_device_gets_one_event") {
            return;
        }
        // ml/train-0 holds GPU 1's second replica, vision/detect-0 its first; ml/infer-0 holds
        // healthy GPU 0; a resource dxdp does not serve naming GPU 1 is not dxdp's.
        let r = rig(
            vec![
                holds("ml", "train-0", "train", DISPLAY, &[&format!("{GPU1}-r1")]),
                holds("ml", "infer-0", "serve", DISPLAY, &[GPU0]),
                holds("vision", "detect-0", "worker", DISPLAY, &[GPU1]),
                holds("other", "x-0", "x", "example.com/gpu", &[GPU1]),
            ],
            EVENT_LIMITS,
            &[],
        )
        .await;
        assert!(
            r.api.wait_for_state(WAIT, |e, _| e.len() == 2).await,
            "{:?}",
            r.api.events()
        );
        let events = r.api.events();
        let got: Vec<(&str, &str, &str, &str)> = events
            .iter()
            .map(|e| {
                (
                    e["metadata"]["namespace"].as_str().unwrap(),
                    e["involvedObject"]["name"].as_str().unwrap(),
                    e["involvedObject"]["fieldPath"].as_str().unwrap(),
                    e["message"].as_str().unwrap(),
                )
            })
            .collect();
        let (train, worker) = (
            message("train", "2026-11-25T21:49:12Z"),
            message("worker", "2026-11-25T21:49:12Z"),
        );
        assert_eq!(
            got,
            [
                ("ml", "train-0", "spec.containers{train}", train.as_str()),
                (
                    "vision",
                    "detect-0",
                    "spec.containers{worker}",
                    worker.as_str()
                ),
            ]
        );
        for e in &events {
            assert_eq!(e["reason"], "GPUUnhealthy");
            assert_eq!(e["type"], "Warning");
            assert_eq!(e["involvedObject"]["kind"], "Pod");
            assert_eq!(
                e["source"],
                serde_json::json!({"component": "dxdp", "host": "n1"})
            );
            assert_eq!(e["related"]["kind"], "Node");
        }
        counted(&r.metrics, "sent", |m| m.events(EventResult::Sent) == 2).await;

        // A third pod comes; the device stays Unhealthy: only the new holder gets an Event.
        r.pods.set(vec![
            holds("ml", "train-0", "train", DISPLAY, &[&format!("{GPU1}-r1")]),
            holds("vision", "detect-0", "worker", DISPLAY, &[GPU1]),
            holds("ml", "train-1", "train", DISPLAY, &[GPU1]),
        ]);
        r.inventory.send_modify(|_| {});
        assert!(r.api.wait_for_state(WAIT, |e, _| e.len() == 3).await);
        assert_eq!(r.api.events()[2]["involvedObject"]["name"], "train-1");

        // The device's state becomes unreadable (a new reason: a new Event for each holder),
        // then problem code 43 again within the hour: each holder's Event for it is
        // deduplicated (3 keys).
        let config = r.config.borrow().as_ref().clone();
        let mut unreadable = facts(true);
        unreadable.adapters[1].pnp.as_mut().unwrap().status_error =
            Some("CM_Get_DevNode_Status failed: CR_NO_SUCH_DEVNODE".into());
        r.inventory
            .send_replace(inventory_of(&unreadable, config.clone()));
        assert!(r.api.wait_for_state(WAIT, |e, _| e.len() == 6).await);
        assert!(r.api.events()[3]["message"]
            .as_str()
            .unwrap()
            .contains("(status_unreadable: "));
        r.inventory
            .send_replace(inventory_of(&facts(true), config.clone()));
        counted(&r.metrics, "deduplicated", |m| {
            m.events(EventResult::Deduplicated) == 3
        })
        .await;
        assert_eq!(r.api.events().len(), 6);

        // health.events: false: a new holder is counted as disabled, nothing sent.
        let mut off = config.clone();
        off.health_reports.events = false;
        r.config.send_replace(Arc::new(off));
        r.pods
            .set(vec![holds("ml", "train-2", "train", DISPLAY, &[GPU1])]);
        r.inventory.send_modify(|_| {});
        counted(&r.metrics, "disabled", |m| {
            m.events(EventResult::Disabled) == 1
        })
        .await;
        assert_eq!(r.api.events().len(), 6);
        assert_eq!(r.metrics.events(EventResult::Error), 0);
        r.task.abort();
    }

    #[tokio::test]
    async fn events_are_rate_limited_and_retried_after_a_failure() {
        if !common::af_unix("events_are_rate_limited_and_retried_after_a_failure") {
            return;
        }
        // A bucket of two; the first POST fails (500), is counted and retried with backoff
        // (the failed attempt used a token, as for the isolation Events): a's Event is sent at
        // the retry, b's is held back.
        let limits = EventLimits {
            burst: 2,
            every: Duration::from_secs(3600),
            dedup: Duration::from_secs(3600),
        };
        let r = rig(
            vec![
                holds("a", "p", "c", DISPLAY, &[GPU1]),
                holds("b", "p", "c", DISPLAY, &[&format!("{GPU1}-r1")]),
            ],
            limits,
            &[500],
        )
        .await;
        assert!(r.api.wait_for_state(WAIT, |e, _| e.len() == 1).await);
        counted(&r.metrics, "rate_limited", |m| {
            m.events(EventResult::RateLimited) == 1
        })
        .await;
        assert_eq!(r.api.events()[0]["metadata"]["namespace"], "a");
        assert_eq!(r.metrics.events(EventResult::Sent), 1);
        assert_eq!(r.metrics.events(EventResult::Error), 1);
        r.task.abort();
    }

    #[tokio::test]
    async fn without_pod_resources_there_is_no_event_until_it_answers() {
        if !common::af_unix("without_pod_resources_there_is_no_event_until_it_answers") {
            return;
        }
        let r = rig(
            vec![holds("a", "p", "c", DISPLAY, &[GPU1])],
            EVENT_LIMITS,
            &[],
        )
        .await;
        assert!(r.api.wait_for_state(WAIT, |e, _| e.len() == 1).await);
        // PodResources goes away; a new holder cannot be known until it is back.
        let endpoint = r.pods.endpoint();
        r.pods.stop().await;
        r.inventory.send_modify(|_| {});
        let pods = PodResourcesStandin::start(
            &endpoint,
            vec![
                holds("a", "p", "c", DISPLAY, &[GPU1]),
                holds("b", "q", "c", DISPLAY, &[GPU1]),
            ],
        )
        .await
        .unwrap();
        // Retried with backoff (and every change of the devices): the new holder's Event comes.
        r.inventory.send_modify(|_| {});
        assert!(r.api.wait_for_state(WAIT, |e, _| e.len() == 2).await);
        assert_eq!(r.api.events()[1]["metadata"]["namespace"], "b");
        drop(pods);
        r.task.abort();
    }
}

mod conditions {
    use super::*;

    fn kubelet_ready() -> serde_json::Value {
        serde_json::json!({"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"})
    }

    fn find<'a>(conditions: &'a [serde_json::Value], t: &str) -> Option<&'a serde_json::Value> {
        conditions.iter().find(|c| c["type"] == t)
    }

    fn has(conditions: &[serde_json::Value], t: &str, status: &str, reason: &str) -> bool {
        find(conditions, t).is_some_and(|c| c["status"] == status && c["reason"] == reason)
    }

    fn violation() -> Violation {
        let adapter = |device: &str, luid: &str| Adapter {
            device: device.into(),
            luid: luid.into(),
            model: "NVIDIA Tesla T4".into(),
        };
        Violation {
            pod: PodRef {
                namespace: "vision".into(),
                pod: "detect-0".into(),
                container: "worker".into(),
            },
            used: adapter(GPU1, "0x00000000_0x006B9126"),
            allocated: vec![adapter(GPU0, "0x00000000_0x006B8B86")],
            processes: 1,
            kind: ViolationKind::OtherDevice,
        }
    }

    #[tokio::test]
    async fn conditions_follow_health_and_isolation_and_go_when_turned_off() {
        let api = ApiServerStandin::start("n1", &[]).await.unwrap();
        api.set_conditions(vec![kubelet_ready()]);
        let mut on = Config::default();
        on.health_reports.node_conditions = true;
        let Running {
            inventory,
            active,
            config,
            metrics,
            task,
        } = start_conditions(
            &api,
            facts(true),
            None,
            on.clone(),
            Duration::from_secs(3600),
        );
        assert!(
            api.wait_for_conditions(WAIT, |c| has(
                c,
                "DirectXGPUHealthy",
                "False",
                "ProblemCode"
            ) && has(
                c,
                "DirectXGPUIsolation",
                "Unknown",
                "AuditPending"
            ))
            .await,
            "{:?}",
            api.conditions()
        );
        let c = api.conditions();
        assert_eq!(
            c[0],
            kubelet_ready(),
            "the kubelet's condition is untouched"
        );
        assert_eq!(
            find(&c, "DirectXGPUHealthy").unwrap()["message"],
            format!("1 of 4 GPU(s) dxdp serves are Unhealthy: {GPU1} (NVIDIA Tesla T4): problem_code: {CODE_43}")
        );
        // Every write is a strategic merge patch of nodes/status naming only dxdp's types.
        for p in api.patches() {
            assert_eq!(p.path, "/api/v1/nodes/n1/status");
            assert_eq!(
                p.content_type.as_deref(),
                Some("application/strategic-merge-patch+json")
            );
            assert_eq!(
                p.query.get("fieldManager").map(String::as_str),
                Some("dxdp")
            );
            assert!(!p.body.contains("Ready"), "{}", p.body);
        }

        // A violation starts: DirectXGPUIsolation False, naming it.
        active.send_replace(Some(Arc::new(vec![violation()])));
        assert!(
            api.wait_for_conditions(WAIT, |c| has(
                c,
                "DirectXGPUIsolation",
                "False",
                "IsolationViolation"
            ))
            .await
        );
        let since =
            find(&api.conditions(), "DirectXGPUIsolation").unwrap()["lastTransitionTime"].clone();
        assert_eq!(
            find(&api.conditions(), "DirectXGPUIsolation").unwrap()["message"],
            format!("1 pod container(s) use a GPU they were not allocated (docs/isolation.md): vision/detect-0 container worker uses {GPU1}")
        );
        // It ends; GPU 1 recovers.
        active.send_replace(Some(Arc::new(Vec::new())));
        inventory.send_replace(inventory_of(&facts(false), on.clone()));
        assert!(
            api.wait_for_conditions(WAIT, |c| has(
                c,
                "DirectXGPUIsolation",
                "True",
                "NoViolation"
            ) && has(
                c,
                "DirectXGPUHealthy",
                "True",
                "GPUsHealthy"
            ))
            .await
        );
        let c = api.conditions();
        assert_eq!(
            find(&c, "DirectXGPUHealthy").unwrap()["message"],
            "all 4 GPU(s) dxdp serves are Healthy"
        );
        assert!(find(&c, "DirectXGPUIsolation").unwrap()["lastTransitionTime"].is_string());
        let _ = since;
        counted(&metrics, "set", |m| {
            m.conditions("DirectXGPUHealthy", ConditionResult::Set) == 2
        })
        .await;

        // Turned off: both removed, the kubelet's stays.
        let mut off = on.clone();
        off.health_reports.node_conditions = false;
        config.send_replace(Arc::new(off));
        assert!(
            api.wait_for_conditions(WAIT, |c| c.len() == 1).await,
            "{:?}",
            api.conditions()
        );
        assert_eq!(api.conditions(), vec![kubelet_ready()]);
        counted(&metrics, "removed", |m| {
            m.conditions("DirectXGPUHealthy", ConditionResult::Removed) == 1
                && m.conditions("DirectXGPUIsolation", ConditionResult::Removed) == 1
        })
        .await;
        assert_eq!(
            metrics.conditions("DirectXGPUHealthy", ConditionResult::Error),
            0
        );
        task.abort();
    }

    #[tokio::test]
    async fn conditions_an_earlier_run_left_are_removed_at_a_start_with_the_option_off() {
        let api = ApiServerStandin::start("n1", &[]).await.unwrap();
        api.set_conditions(vec![
            kubelet_ready(),
            serde_json::json!({"type": "DirectXGPUHealthy", "status": "False", "reason": "TDR", "message": "old"}),
            serde_json::json!({"type": "DirectXGPUIsolation", "status": "True", "reason": "NoViolation", "message": "old"}),
        ]);
        let running = start_conditions(
            &api,
            facts(false),
            None,
            Config::default(),
            Duration::from_secs(3600),
        );
        assert!(api.wait_for_conditions(WAIT, |c| c.len() == 1).await);
        assert_eq!(api.conditions(), vec![kubelet_ready()]);
        let patches = api.patches();
        assert_eq!(patches.len(), 1);
        assert_eq!(
            patches[0].json(),
            serde_json::json!({"status": {"conditions": [
                {"type": "DirectXGPUHealthy", "$patch": "delete"},
                {"type": "DirectXGPUIsolation", "$patch": "delete"},
            ]}})
        );
        running.task.abort();
    }
}

mod conditions_more {
    use super::*;

    fn ready() -> serde_json::Value {
        serde_json::json!({"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"})
    }

    /// The conditions task on the four healthy T4s, no violation, under `config`.
    fn spawn(api: &ApiServerStandin, config: Config, resync: Duration) -> Running {
        start_conditions(
            api,
            facts(false),
            Some(Arc::new(Vec::new())),
            config,
            resync,
        )
    }

    #[tokio::test]
    async fn a_condition_removed_by_hand_comes_back_at_the_resync() {
        let api = ApiServerStandin::start("n1", &[]).await.unwrap();
        api.set_conditions(vec![ready()]);
        let mut on = Config::default();
        on.health_reports.node_conditions = true;
        let r = spawn(&api, on, Duration::from_millis(200));
        let both = |c: &[serde_json::Value]| {
            c.len() == 3
                && c.iter()
                    .any(|c| c["type"] == "DirectXGPUHealthy" && c["status"] == "True")
                && c.iter()
                    .any(|c| c["type"] == "DirectXGPUIsolation" && c["status"] == "True")
        };
        assert!(
            api.wait_for_conditions(WAIT, both).await,
            "{:?}",
            api.conditions()
        );
        // Someone takes them off (a `kubectl` status patch, another controller's bug).
        api.set_conditions(vec![ready()]);
        assert!(
            api.wait_for_conditions(WAIT, both).await,
            "{:?}",
            api.conditions()
        );
        r.task.abort();
    }

    #[tokio::test]
    async fn without_the_permission_leftover_conditions_are_said_once_and_the_option_still_works() {
        let api = ApiServerStandin::start("n1", &[]).await.unwrap();
        let left = serde_json::json!({"type": "DirectXGPUHealthy", "status": "False", "reason": "TDR", "message": "old"});
        api.set_conditions(vec![ready(), left.clone()]);
        api.fail_next_with(
            "PATCH",
            403,
            "nodes \"n1\" is forbidden: User cannot patch resource \"nodes/status\"",
        );
        let r = spawn(&api, Config::default(), Duration::from_secs(3600));
        counted(&r.metrics, "error", |m| {
            m.conditions("DirectXGPUHealthy", ConditionResult::Error) == 1
        })
        .await;
        assert_eq!(api.conditions(), vec![ready(), left]);
        // The permission is granted and the option turned on: the conditions are kept.
        let mut on = Config::default();
        on.health_reports.node_conditions = true;
        r.config.send_replace(Arc::new(on));
        assert!(
            api.wait_for_conditions(WAIT, |c| c
                .iter()
                .any(|c| c["type"] == "DirectXGPUHealthy" && c["status"] == "True"))
                .await
        );
        r.task.abort();
    }
}

mod readiness {
    use super::*;

    /// One GET on a fresh connection: status and body.
    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let (status, _, body) = common::http(addr, "GET", path).await;
        (status, body)
    }

    /// Asks `/readyz` until `done` holds (bounded).
    pub(super) async fn until(addr: SocketAddr, what: &str, done: impl Fn(u16, &str) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let (status, body) = get(addr, "/readyz").await;
            if done(status, &body) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}: /readyz answers {status} {body:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// An Observe whose every name is registered and watched by the kubelet, served over HTTP.
    async fn served(names: &[&str]) -> (Observe, SocketAddr) {
        let observe = Observe::new();
        observe.phase(Phase::Running);
        observe.wanted(names.iter().map(|n| n.to_string()).collect());
        observe.kubelet_missing(None);
        for (i, n) in names.iter().enumerate() {
            observe.server_started(n, i as u64 + 1);
            observe.registration(n, i as u64 + 1, Ok(()));
            observe.watching(n, i as u64 + 1, true);
        }
        let server = dxdp::observe::http::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = server.local_addr();
        tokio::spawn(server.serve(observe.clone()));
        (observe, addr)
    }

    #[tokio::test]
    async fn ready_once_the_node_shows_every_resource_with_healthy_devices() {
        let api = ApiServerStandin::start("n1", &[]).await.unwrap();
        let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
        // Both resources served, display with two replicas; the T4s are display devices, so
        // compute has none and is not required.
        let config = Config::default().with_replicas(2);
        let (observe, addr) = served(&[DISPLAY, COMPUTE]).await;
        assert_eq!(
            get(addr, "/readyz").await,
            (200, "ok\n".into()),
            "no gate yet: today's meaning"
        );
        let (node_tx, node_rx) = watch::channel(None);
        let follow = tokio::spawn(
            dxdp::cluster::node::FollowNode {
                cluster,
                tx: node_tx,
                backoff: FAST,
                poll: Duration::from_secs(3600),
            }
            .run(),
        );
        let (inventory, inventory_rx) = watch::channel(inventory_of(&facts(true), config.clone()));
        let gate = tokio::spawn(
            CapacityGate {
                node: node_rx,
                inventory: inventory_rx,
                readiness: observe.readiness.clone(),
                first_read_grace: Duration::from_secs(3600),
            }
            .run(),
        );
        // Three healthy T4s (GPU 1 has problem code 43), two replicas each: 6 IDs.
        until(addr, "the gap", |s, b| {
            s == 503
                && b == format!("{DISPLAY}: 6 healthy device ID(s) advertised, but the Node's status.allocatable does not show it yet (the kubelet adds it at its next node status update)\n")
        })
        .await;
        api.set_allocatable(&[("cpu", "4"), (DISPLAY, "0")]);
        until(addr, "a zero", |s, b| {
            s == 503 && b.starts_with(&format!("{DISPLAY}: 6 healthy device ID(s) advertised, but the Node's status.allocatable shows 0"))
        })
        .await;
        // The kubelet's count lags (4 of 6): shown is enough.
        api.set_allocatable(&[("cpu", "4"), (DISPLAY, "4")]);
        until(addr, "ready", |s, b| s == 200 && b == "ok\n").await;
        // Every device Unhealthy: nothing is required, ready whatever the Node shows.
        api.set_allocatable(&[("cpu", "4")]);
        until(addr, "the gap again", |s, _| s == 503).await;
        let mut all_sick = facts(false);
        for a in &mut all_sick.adapters {
            if let Some(p) = a.pnp.as_mut() {
                p.problem_code = 43;
            }
        }
        inventory.send_replace(inventory_of(&all_sick, config.clone()));
        until(addr, "ready without healthy devices", |s, b| {
            s == 200 && b == "ok\n"
        })
        .await;
        // Registration still comes first.
        observe.watching(DISPLAY, 1, false);
        until(addr, "not watched", |s, b| {
            s == 503 && b.contains("waiting for the kubelet to watch")
        })
        .await;
        gate.abort();
        follow.abort();
    }

    #[tokio::test]
    async fn without_the_api_server_readyz_keeps_its_meaning_and_says_so() {
        let (observe, addr) = served(&[DISPLAY]).await;
        observe
            .readiness
            .set_capacity(Capacity::NotChecked(NO_CLIENT.into()));
        assert_eq!(
            get(addr, "/readyz").await,
            (200, "ok (the Node's allocatable capacity is not checked: dxdp has no API server client)\n".into())
        );
    }

    #[tokio::test]
    async fn a_node_never_read_stops_holding_readiness_after_the_grace() {
        let (observe, addr) = served(&[DISPLAY]).await;
        let (_node_tx, node_rx) = watch::channel(None);
        let (_inventory, inventory_rx) =
            watch::channel(inventory_of(&facts(false), Config::default()));
        let gate = tokio::spawn(
            CapacityGate {
                node: node_rx,
                inventory: inventory_rx,
                readiness: observe.readiness.clone(),
                first_read_grace: Duration::from_millis(300),
            }
            .run(),
        );
        until(addr, "waiting for the Node", |s, b| {
            s == 503 && b.starts_with("waiting to read the Node")
        })
        .await;
        until(addr, "given up", |s, b| {
            s == 200 && b == "ok (the Node's allocatable capacity is not checked: the Node could not be read yet)\n"
        })
        .await;
        gate.abort();
    }
}

/// The daemon end to end: `dxdp plugin` with a kubelet stand-in, a PodResources stand-in and an
/// API server stand-in, on the four T4s with GPU 1 at problem code 43.
#[cfg(unix)]
mod daemon {
    use super::*;
    use dxdp::kubelet::standin::KubeletStandin;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_daemon_reports_the_sick_gpu_to_its_pod_and_node_and_waits_for_capacity() {
        if !common::af_unix("the_daemon_reports_the_sick_gpu_to_its_pod_and_node") {
            return;
        }
        let dir = common::socket_tempdir();
        let _kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
            .await
            .unwrap();
        let endpoint = common::local_endpoint(dir.path(), "pod-resources.sock");
        let _pods = PodResourcesStandin::start(
            &endpoint,
            vec![holds("ml", "train-0", "train", DISPLAY, &[GPU1])],
        )
        .await
        .unwrap();
        let api = ApiServerStandin::start("gpu-node-1", &[]).await.unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
        let snapshot = dir.path().join("node.yaml");
        let text = std::fs::read_to_string(common::fixture_path("nvidia-multi-gpu")).unwrap();
        let key = "      driverKey: '{4d36e968-e325-11ce-bfc1-08002be10318}\\0005'\n";
        assert!(text.contains(key));
        std::fs::write(
            &snapshot,
            text.replace(key, &format!("{key}      problemCode: 43\n")),
        )
        .unwrap();
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let config = dir.path().join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "health:\n  nodeConditions: true\ntelemetry:\n  podResourcesEndpoint: {endpoint}\nmetrics:\n  probeAddress: 127.0.0.1:{port}\n"
            ),
        )
        .unwrap();
        let mut plugin = tokio::process::Command::new(env!("CARGO_BIN_EXE_dxdp"))
            .args(["plugin", "--kubelet-dir"])
            .arg(dir.path())
            .arg("--host-snapshot")
            .arg(&snapshot)
            .arg("--config")
            .arg(&config)
            .env_clear()
            .env("NODE_NAME", "gpu-node-1")
            .env("KUBECONFIG", &kubeconfig)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("stderr.log")).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        assert!(
            api.wait_for_state(WAIT, |e, _| e.len() == 1).await,
            "{:?}",
            api.events()
        );
        let e = &api.events()[0];
        assert_eq!(e["reason"], "GPUUnhealthy");
        assert_eq!(e["involvedObject"]["name"], "train-0");
        assert!(
            api.wait_for_conditions(WAIT, |c| c
                .iter()
                .any(|c| c["type"] == "DirectXGPUHealthy" && c["status"] == "False"))
                .await
        );
        // Registered and watched, but the Node shows no capacity yet: NotReady, saying why.
        readiness::until(addr, "the gap", |s, b| {
            s == 503 && b.starts_with(&format!("{DISPLAY}: 3 healthy device ID(s) advertised"))
        })
        .await;
        api.set_allocatable(&[(DISPLAY, "3")]);
        readiness::until(addr, "ready", |s, b| s == 200 && b == "ok\n").await;
        common::terminate(&mut plugin, WAIT).await;
    }

    /// Issue 42: the cluster features read the configuration in force, never one the daemon
    /// rejected. A configuration that turns the node conditions off but cannot be served (the
    /// display resource under the compute resource's name) is rejected whole; when a GPU then
    /// fails, the node conditions say so. Wired to the published configuration, the
    /// conditions task took the rejected one and removed the conditions instead.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_configuration_the_daemon_rejects_never_reaches_the_cluster_features() {
        use dxdp::backend::SnapshotFile;
        use dxdp::daemon::{ClusterChoice, Daemon};
        let dir = common::socket_tempdir();
        let _kubelet = KubeletStandin::start(common::transport(), dir.path())
            .await
            .unwrap();
        let api = ApiServerStandin::start("gpu-node-1", &[]).await.unwrap();
        let snapshot = dir.path().join("node.yaml");
        let text = std::fs::read_to_string(common::fixture_path("nvidia-multi-gpu")).unwrap();
        std::fs::write(&snapshot, &text).unwrap();
        let mut on = Config::default();
        on.health_reports.node_conditions = true;
        let mut pc = common::plugin_config(dir.path());
        pc.config = on.clone().into();
        let observe = pc.observe.clone();
        let (tx, updates) = watch::channel(Arc::new(on.clone()));
        let cluster = Cluster::at_url(&api.url(), "gpu-node-1").unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let daemon = tokio::spawn(
            Daemon::new(pc, Arc::new(SnapshotFile::new(snapshot.clone())))
                .cluster(ClusterChoice::Given(Box::new(cluster)))
                .updates(updates)
                .run(async {
                    let _ = stopped.await;
                }),
        );
        let healthy = |status: &'static str| {
            move |c: &[serde_json::Value]| {
                c.iter()
                    .any(|c| c["type"] == "DirectXGPUHealthy" && c["status"] == status)
            }
        };
        assert!(api.wait_for_conditions(WAIT, healthy("True")).await);
        let mut rejected = on.clone();
        rejected.health_reports.node_conditions = false;
        rejected
            .resources
            .get_mut(&dxdp_core::devices::Resource::Display)
            .unwrap()
            .name = "directx.microsoft.com/compute".into();
        tx.send_replace(Arc::new(rejected));
        let counted = "dxdp_config_reloads_total{result=\"rejected\"} 1";
        let deadline = tokio::time::Instant::now() + WAIT;
        while !observe.metrics.encode().lines().any(|l| l == counted) {
            assert!(tokio::time::Instant::now() < deadline, "not rejected");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // GPU 1 fails: the conditions task wakes and reads the configuration.
        let key = "      driverKey: '{4d36e968-e325-11ce-bfc1-08002be10318}\\0005'\n";
        assert!(text.contains(key));
        let tmp = dir.path().join("node.tmp");
        std::fs::write(
            &tmp,
            text.replace(key, &format!("{key}      problemCode: 43\n")),
        )
        .unwrap();
        std::fs::rename(&tmp, &snapshot).unwrap();
        assert!(
            api.wait_for_conditions(WAIT, healthy("False")).await,
            "the node conditions do not show the failed GPU: {:?}",
            api.conditions()
        );
        let removals: Vec<_> = api
            .requests()
            .into_iter()
            .filter(|r| r.method == "PATCH" && r.body.contains("$patch"))
            .collect();
        assert!(removals.is_empty(), "conditions removed: {removals:?}");
        let _ = stop.send(());
        tokio::time::timeout(WAIT, daemon)
            .await
            .expect("stops")
            .unwrap()
            .unwrap();
    }
}
