//! The GPU isolation audit on the `telemetry-leak` and `telemetry-t4` fixtures: detection (every
//! expected container, violation and count written out by hand from the fixtures), the tracker
//! (starts and ends, metrics), Events and the node taint against the API server stand-in,
//! `dxdp audit`, and the daemon end to end.

use crate::common;

use crate::apiserver;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use dxdp::backend::counters::Recorded;
use dxdp::backend::SnapshotFile;
use dxdp::config::Config;
use dxdp::observe::metrics::Metrics;
use dxdp::telemetry::sampler::Devices;
use dxdp::telemetry::sampler::{Sampler, State};
use dxdp_core::telemetry::compute::TelemetryView;
use dxdp_core::telemetry::isolation::{
    audit, held, Adapter, ContainerVerdict, IsolationReport, Violation, ViolationKind,
};
use dxdp_core::telemetry::PodRef;

const GPU0: &str = "pciroot-0-pci-1b00-0540e5ad73bf260f";
const GPU1: &str = "pciroot-0-pci-1c00-ba6abfb666f4630a";
const LUID0: &str = "0x00000000_0x006B8B86";
const LUID1: &str = "0x00000000_0x006B9126";
const T4: &str = "NVIDIA Tesla T4";
/// Generous: these waits are for behaviour, not speed.
const WAIT: Duration = Duration::from_secs(20);

fn pod(namespace: &str, name: &str, container: &str) -> PodRef {
    PodRef {
        namespace: namespace.into(),
        pod: name.into(),
        container: container.into(),
    }
}

fn adapter(device: &str) -> Adapter {
    let luid = if device == GPU0 { LUID0 } else { LUID1 };
    Adapter {
        device: device.into(),
        luid: luid.into(),
        model: T4.into(),
    }
}

/// One sample of a snapshot file as the daemon's sampler takes it (the recorded PodResources
/// answer, filtered to the resources dxdp serves).
async fn view_of(path: &Path) -> TelemetryView {
    let (_, config) = watch::channel(Arc::new(Config::default()));
    let sampler = Sampler {
        source: Arc::new(Recorded::new(path)),
        devices: Devices::Host(Arc::new(SnapshotFile::new(path.to_path_buf()))),
        config,
        pod_resources: None,
        cri: None,
        containers: None,
        metrics: Metrics::new().telemetry().clone(),
    };
    let mut state = State::default();
    let view = sampler.step(&mut state).await.unwrap();
    assert!(sampler.sources_current(&state), "recorded allocations");
    view
}

async fn report_of(name: &str) -> IsolationReport {
    let view = view_of(&common::fixture_path(name)).await;
    audit(&view, &held(&view))
}

/// The leak fixture with the leaking containers' processes gone from their containers (they
/// ended; their PIDs are then the host's).
fn leak_ended(dir: &Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(common::fixture_path("telemetry-leak")).unwrap();
    let ended = text
        .replace("pids: [4500]", "pids: []")
        .replace("pids: [4600]", "pids: []");
    assert_ne!(ended, text);
    let path = dir.join("leak-ended.yaml");
    std::fs::write(&path, ended).unwrap();
    path
}

/// The leak fixture with the leaking processes' counters stopped (they stopped using the other
/// GPU): pid 4500's compute running time on GPU 1 does not move between the two samples and its
/// memory there is 0; pid 4600's memory on GPU 0 is 0.
fn leak_stopped(dir: &Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(common::fixture_path("telemetry-leak")).unwrap();
    let stopped = text
        .replace(
            "pid_4500_luid_0x00000000_0x006B9126_phys_0_eng_0_engtype_Compute_0, runningTime: 20000000}",
            "pid_4500_luid_0x00000000_0x006B9126_phys_0_eng_0_engtype_Compute_0, runningTime: 0}",
        )
        .replace(
            "pid_4500_luid_0x00000000_0x006B9126_phys_0, dedicated: 2147483648",
            "pid_4500_luid_0x00000000_0x006B9126_phys_0, dedicated: 0",
        )
        .replace(
            "pid_4600_luid_0x00000000_0x006B8B86_phys_0, dedicated: 268435456",
            "pid_4600_luid_0x00000000_0x006B8B86_phys_0, dedicated: 0",
        );
    assert_eq!(
        stopped
            .lines()
            .zip(text.lines())
            .filter(|(a, b)| a != b)
            .count(),
        3
    );
    let path = dir.join("leak-stopped.yaml");
    std::fs::write(&path, stopped).unwrap();
    path
}

/// The two violations of the leak fixture.
fn leak_violations() -> Vec<Violation> {
    vec![
        // debug-0 holds only example.com/other (not served): no dxdp allocation; pid 4600 has
        // 256 MiB on GPU 0.
        Violation {
            pod: pod("tools", "debug-0", "shell"),
            used: adapter(GPU0),
            allocated: vec![],
            processes: 1,
            kind: ViolationKind::NoAllocation,
        },
        // detect-0 holds GPU 0 (replica r2); pid 4500 computes on GPU 1 (20M of 100M ticks,
        // 2 GiB).
        Violation {
            pod: pod("vision", "detect-0", "worker"),
            used: adapter(GPU1),
            allocated: vec![adapter(GPU0)],
            processes: 1,
            kind: ViolationKind::OtherDevice,
        },
    ]
}

mod detection {
    use super::*;

    /// (container, allocated IDs as the kubelet gave them, used devices with "allocated", verdict)
    type Row = (String, Vec<String>, Vec<(String, bool)>, ContainerVerdict);

    fn rows(r: &IsolationReport) -> Vec<Row> {
        r.containers
            .iter()
            .map(|c| {
                (
                    format!("{}/{}/{}", c.pod.namespace, c.pod.pod, c.pod.container),
                    c.allocated.iter().map(|a| a.device_id.clone()).collect(),
                    c.used
                        .iter()
                        .map(|u| (u.adapter.device.clone(), u.allocated))
                        .collect(),
                    c.verdict,
                )
            })
            .collect()
    }

    fn row(c: &str, alloc: &[String], used: &[(&str, bool)], v: ContainerVerdict) -> Row {
        (
            c.into(),
            alloc.to_vec(),
            used.iter().map(|(d, a)| (d.to_string(), *a)).collect(),
            v,
        )
    }

    #[tokio::test]
    async fn one_leak_and_one_container_without_allocation_are_the_violations() {
        let r = report_of("telemetry-leak").await;
        let (r1, r2) = (format!("{GPU0}-r1"), format!("{GPU0}-r2"));
        let idle = format!("{GPU1}-r1");
        use ContainerVerdict::{Idle, Ok, Violation};
        assert_eq!(
            rows(&r),
            vec![
                // Holds GPU 1 (r1); pid 4700 has a GPU 0 counter without use: idle.
                row("ml/idle-0/main", &[idle], &[], Idle),
                row("ml/infer-7d9/server", &[GPU0.into()], &[(GPU0, true)], Ok),
                row("ml/train-0/trainer", &[GPU1.into()], &[(GPU1, true)], Ok),
                row("tools/debug-0/shell", &[], &[(GPU0, false)], Violation),
                row(
                    "vision/detect-0/worker",
                    &[r2],
                    &[(GPU0, true), (GPU1, false)],
                    Violation
                ),
                // GPU 0 shared through replica r1 with infer-7d9 (and r2 with detect-0).
                row("web/render-1/app", &[r1], &[(GPU0, true)], Ok),
            ]
        );
        assert_eq!(r.violations, leak_violations());
        assert_eq!(r.undetermined, None);
    }

    #[tokio::test]
    async fn processes_dxdp_cannot_place_are_counted_apart() {
        let r = report_of("telemetry-leak").await;
        // pid 1200 (the host) on GPU 0, pid 4400 (container ddd444, pod unknown) on GPU 1.
        let unplaced: Vec<(&str, u64)> = r
            .unplaced
            .iter()
            .map(|u| (u.device.as_str(), u.processes))
            .collect();
        assert_eq!(unplaced, [(GPU0, 1), (GPU1, 1)]);
        assert_eq!(r.unplaced_processes, 2);
        // Neither is judged: the violations are exactly the two placed leaks.
        assert_eq!(r.violations, leak_violations());
    }

    #[tokio::test]
    async fn a_clean_node_with_replicas_in_several_pods_has_no_violation() {
        let r = report_of("telemetry-t4").await;
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        let verdicts: Vec<(PodRef, ContainerVerdict)> = r
            .containers
            .iter()
            .map(|c| (c.pod.clone(), c.verdict))
            .collect();
        // infer-7d9 holds GPU 0 and render-1 its replica r1; both use GPU 0.
        assert_eq!(
            verdicts,
            [
                (pod("ml", "infer-7d9", "server"), ContainerVerdict::Ok),
                (pod("ml", "train-0", "trainer"), ContainerVerdict::Ok),
                (pod("web", "render-1", "app"), ContainerVerdict::Ok),
            ]
        );
        // pid 1200 (host) and pid 4400 (container ddd444, no pod), both on GPU 0.
        assert_eq!(r.unplaced_processes, 2);
    }

    #[tokio::test]
    async fn a_leak_that_ends_leaves_its_processes_to_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let view = view_of(&leak_ended(dir.path())).await;
        let r = audit(&view, &held(&view));
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        // 1200 and 4600 on GPU 0, 4400 and 4500 on GPU 1 (4500 also on GPU 0: one process
        // per device it has counters on).
        assert_eq!(r.unplaced_processes, 5);
        let detect = r
            .containers
            .iter()
            .find(|c| c.pod == pod("vision", "detect-0", "worker"))
            .unwrap();
        assert_eq!(detect.verdict, ContainerVerdict::Idle);
    }

    #[tokio::test]
    async fn a_leak_whose_counters_stop_is_no_violation() {
        let dir = tempfile::tempdir().unwrap();
        let view = view_of(&leak_stopped(dir.path())).await;
        let r = audit(&view, &held(&view));
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        let verdicts: Vec<(PodRef, ContainerVerdict)> = r
            .containers
            .iter()
            .map(|c| (c.pod.clone(), c.verdict))
            .collect();
        // detect-0 still works on its own GPU 0 (video decode, 256 MiB); debug-0 uses nothing
        // and holds no dxdp GPU, so it is not listed.
        assert_eq!(
            verdicts,
            [
                (pod("ml", "idle-0", "main"), ContainerVerdict::Idle),
                (pod("ml", "infer-7d9", "server"), ContainerVerdict::Ok),
                (pod("ml", "train-0", "trainer"), ContainerVerdict::Ok),
                (pod("vision", "detect-0", "worker"), ContainerVerdict::Ok),
                (pod("web", "render-1", "app"), ContainerVerdict::Ok),
            ]
        );
        // Only the host's pid 1200 and ddd444's pid 4400, as in the leak.
        assert_eq!(r.unplaced_processes, 2);
    }
}

mod judging {
    use super::*;

    use std::sync::atomic::{AtomicBool, Ordering};

    use dxdp::backend::counters::{ContainerListing, ContainerSource};
    use dxdp::transport::Endpoint;

    /// The containers' process lists, answering or failing as told.
    struct Lister(AtomicBool);

    impl ContainerSource for Lister {
        fn describe(&self) -> String {
            "test lister".into()
        }
        fn list(&self) -> Result<ContainerListing, String> {
            if self.0.load(Ordering::SeqCst) {
                Ok(ContainerListing::default())
            } else {
                Err("HCS is down".into())
            }
        }
    }

    fn sampler(
        lister: Option<Arc<Lister>>,
        pod_resources: Option<Endpoint>,
        cri: Option<Endpoint>,
    ) -> Sampler {
        let path = common::fixture_path("telemetry-leak");
        let (_, config) = watch::channel(Arc::new(Config::default()));
        Sampler {
            source: Arc::new(Recorded::new(&path)),
            devices: Devices::Host(Arc::new(SnapshotFile::new(path.to_path_buf()))),
            config,
            pod_resources,
            cri,
            containers: lister.map(|l| l as Arc<dyn ContainerSource>),
            metrics: Metrics::new().telemetry().clone(),
        }
    }

    #[tokio::test]
    async fn only_samples_where_every_attribution_source_answered_are_judged() {
        let dir = tempfile::tempdir().unwrap();
        let nowhere = Endpoint::Socket(dir.path().join("none.sock"));
        let lister = Arc::new(Lister(AtomicBool::new(true)));

        // HCS answers: judged; it fails: not; the next step is skipped by the backoff (the
        // last list would be used): still not.
        let s = sampler(Some(lister.clone()), None, None);
        let mut state = State::default();
        s.step(&mut state).await.unwrap();
        assert!(s.sources_current(&state));
        lister.0.store(false, Ordering::SeqCst);
        s.step(&mut state).await.unwrap();
        assert!(!s.sources_current(&state), "HCS failed");
        lister.0.store(true, Ordering::SeqCst);
        s.step(&mut state).await.unwrap();
        assert!(!s.sources_current(&state), "HCS skipped by the backoff");

        // CRI or PodResources that do not answer: not judged.
        let s = sampler(Some(lister.clone()), None, Some(nowhere.clone()));
        let mut state = State::default();
        s.step(&mut state).await.unwrap();
        assert!(!s.sources_current(&state), "CRI failed");
        let s = sampler(None, Some(nowhere), None);
        let mut state = State::default();
        s.step(&mut state).await.unwrap();
        assert!(!s.sources_current(&state), "PodResources failed");
    }
}

mod tracker {
    use super::*;

    use dxdp::telemetry::audit::{Changes, Tracker};

    use common::metric_samples as series;

    #[tokio::test]
    async fn a_leak_starts_once_lasts_and_ends_once_with_its_series() {
        let dir = tempfile::tempdir().unwrap();
        let leaking = view_of(&common::fixture_path("telemetry-leak")).await;
        let ended = view_of(&leak_stopped(dir.path())).await;
        let metrics = Metrics::new();
        let active = Arc::new(watch::Sender::new(None));
        let mut rx = active.subscribe();
        let mut t = Tracker::new(metrics.isolation().clone(), active.clone());

        // Without the kubelet's answer nothing is judged.
        assert_eq!(t.sample(&leaking, false), Changes::default());
        assert!(rx.borrow_and_update().is_none());

        let first = t.sample(&leaking, true);
        assert_eq!(first.started, leak_violations());
        assert!(first.ended.is_empty());
        assert_eq!(rx.borrow_and_update().as_deref(), Some(&leak_violations()));
        // The same violations in the next sample: nothing starts, nothing is published again.
        assert_eq!(t.sample(&leaking, true), Changes::default());
        assert!(!rx.has_changed().unwrap());

        let m = series(&metrics.encode());
        let detect = format!(
            "dxdp_isolation_violations{{namespace=\"vision\",pod=\"detect-0\",container=\"worker\",device=\"{GPU1}\"}}"
        );
        let debug = format!(
            "dxdp_isolation_violations{{namespace=\"tools\",pod=\"debug-0\",container=\"shell\",device=\"{GPU0}\"}}"
        );
        assert_eq!(m.get(&detect).map(String::as_str), Some("1"));
        assert_eq!(m.get(&debug).map(String::as_str), Some("1"));
        assert_eq!(m["dxdp_isolation_violations_total"], "2");
        assert_eq!(m["dxdp_isolation_unplaced_processes"], "2");

        // Two clean samples do not end it; the third does.
        for _ in 0..2 {
            assert_eq!(t.sample(&ended, true), Changes::default());
        }
        assert!(!rx.has_changed().unwrap());
        let end = t.sample(&ended, true);
        assert!(end.started.is_empty());
        assert_eq!(end.ended, leak_violations());
        assert_eq!(rx.borrow_and_update().as_deref(), Some(&Vec::new()));
        let m = series(&metrics.encode());
        assert!(!m.contains_key(&detect) && !m.contains_key(&debug));
        assert_eq!(m["dxdp_isolation_violations_total"], "2", "starts only");
        assert_eq!(m["dxdp_isolation_unplaced_processes"], "2");

        // It starts again, and telemetry turned off ends it.
        assert_eq!(t.sample(&leaking, true).started.len(), 2);
        assert_eq!(metrics.isolation().violations_started(), 4);
        assert_eq!(t.off("telemetry.enabled is false").ended.len(), 2);
        assert_eq!(rx.borrow_and_update().as_deref(), Some(&Vec::new()));
    }

    #[tokio::test]
    async fn a_leak_that_is_brief_but_frequent_lasts_until_three_clean_samples() {
        let dir = tempfile::tempdir().unwrap();
        let leaking = view_of(&common::fixture_path("telemetry-leak")).await;
        let clean = view_of(&leak_stopped(dir.path())).await;
        let metrics = Metrics::new();
        let active = Arc::new(watch::Sender::new(None));
        let mut t = Tracker::new(metrics.isolation().clone(), active.clone());
        assert_eq!(t.sample(&leaking, true).started.len(), 2);
        // leak, clean, clean, leak, clean, clean, leak: one violation all along.
        for _ in 0..2 {
            for _ in 0..2 {
                assert_eq!(t.sample(&clean, true), Changes::default());
            }
            assert_eq!(t.sample(&leaking, true), Changes::default());
        }
        // A sample that cannot be judged does not count as clean.
        for _ in 0..2 {
            assert_eq!(t.sample(&clean, true), Changes::default());
        }
        assert_eq!(t.sample(&clean, false), Changes::default());
        assert_eq!(active.borrow().as_deref(), Some(&leak_violations()));
        assert_eq!(t.sample(&clean, true).ended, leak_violations());
        assert_eq!(metrics.isolation().violations_started(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn violations_end_when_nothing_was_judged_for_too_long() {
        use dxdp::telemetry::audit::stale_after;
        let s = Duration::from_secs;
        // max(5 minutes, 10 intervals).
        assert_eq!(stale_after(s(10)), s(300));
        assert_eq!(stale_after(s(60)), s(600));
        let leaking = view_of(&common::fixture_path("telemetry-leak")).await;
        let metrics = Metrics::new();
        let active = Arc::new(watch::Sender::new(None));
        let mut t = Tracker::new(metrics.isolation().clone(), active.clone());
        let limit = stale_after(s(10));
        assert_eq!(t.expire(limit), Changes::default(), "nothing lasts");
        assert_eq!(t.sample(&leaking, true).started.len(), 2);
        tokio::time::advance(s(200)).await;
        // Samples that cannot be judged do not reset the clock.
        assert_eq!(t.sample(&leaking, false), Changes::default());
        tokio::time::advance(s(99)).await;
        assert_eq!(t.expire(limit), Changes::default());
        tokio::time::advance(s(1)).await;
        assert_eq!(t.expire(limit).ended, leak_violations());
        assert_eq!(active.borrow().as_deref(), Some(&Vec::new()));
        assert_eq!(t.expire(limit), Changes::default(), "once");

        // A telemetry task that cannot sample at all: the violations it took over end when
        // they are stale.
        let mut t = Tracker::new(metrics.isolation().clone(), active.clone());
        assert_eq!(t.sample(&leaking, true).started.len(), 2);
        let again = Tracker::new(metrics.isolation().clone(), active.clone());
        let (_, config) = watch::channel(Arc::new(Config::default()));
        let started = tokio::time::Instant::now();
        again.expire_when_stale(config).await;
        assert_eq!(started.elapsed(), s(300));
        assert_eq!(active.borrow().as_deref(), Some(&Vec::new()));
    }

    #[tokio::test]
    async fn a_restarted_tracker_takes_over_the_published_violations() {
        let leaking = view_of(&common::fixture_path("telemetry-leak")).await;
        let metrics = Metrics::new();
        let active = Arc::new(watch::Sender::new(None));
        let mut t = Tracker::new(metrics.isolation().clone(), active.clone());
        assert_eq!(t.sample(&leaking, true).started.len(), 2);
        drop(t);
        let mut again = Tracker::new(metrics.isolation().clone(), active.clone());
        assert_eq!(again.sample(&leaking, true), Changes::default());
        assert_eq!(metrics.isolation().violations_started(), 2);
    }

    #[test]
    fn the_metrics_text_has_one_family_per_name() {
        let metrics = Metrics::new();
        let text = metrics.encode();
        let mut types: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        let n = types.len();
        types.sort_unstable();
        types.dedup();
        assert_eq!(types.len(), n, "duplicate metric families in\n{text}");
        assert!(
            text.contains("# TYPE dxdp_isolation_violations gauge\n"),
            "{text}"
        );
        assert!(
            text.contains("\ndxdp_isolation_violations_total 0\n"),
            "{text}"
        );
    }
}

mod cluster {
    use super::*;

    use apiserver::ApiServerStandin;
    use dxdp::cluster::events::EventLimits;
    use dxdp::cluster::isolation_events::ReportEvents;
    use dxdp::cluster::taint::{KeepTaint, TAINT_KEY};
    use dxdp::cluster::Cluster;
    use dxdp::config::file::IsolationPolicy;
    use dxdp::observe::event_metrics::EventResult;
    use dxdp::observe::isolation_metrics::{IsolationMetrics, TaintResult};
    use dxdp::util::retry::Backoff;
    use dxdp::util::task::Task;

    const FAST: Backoff = Backoff {
        initial: Duration::from_millis(5),
        max: Duration::from_millis(20),
        timeout: Duration::from_secs(5),
    };

    type Active = Option<Arc<Vec<Violation>>>;

    /// Waits (bounded) until `done` holds for the metrics: the tasks count what they did.
    async fn counted(
        metrics: &IsolationMetrics,
        what: &str,
        done: impl Fn(&IsolationMetrics) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !done(metrics) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "not counted: {what}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn config(policy: IsolationPolicy) -> watch::Receiver<Arc<Config>> {
        let mut c = Config::default();
        c.isolation.policy = policy;
        watch::channel(Arc::new(c)).1
    }

    fn other_taint() -> serde_json::Value {
        serde_json::json!({"key": "os", "value": "windows", "effect": "NoSchedule"})
    }

    fn ours() -> serde_json::Value {
        serde_json::json!({"key": TAINT_KEY, "effect": "NoSchedule"})
    }

    fn violation(namespace: &str, name: &str) -> Violation {
        Violation {
            pod: pod(namespace, name, "app"),
            ..leak_violations()[1].clone()
        }
    }

    #[tokio::test]
    async fn one_event_per_violation_deduplicated_and_rate_limited() {
        let api = ApiServerStandin::start("n1", &[]).await.unwrap();
        let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
        let metrics = Metrics::new().isolation().clone();
        let (tx, rx) = watch::channel::<Active>(None);
        let limits = EventLimits {
            burst: 2,
            every: Duration::from_secs(3600),
            dedup: Duration::from_secs(3600),
        };
        let task = tokio::spawn(
            ReportEvents {
                cluster,
                active: rx,
                config: config(IsolationPolicy::Audit),
                metrics: metrics.clone(),
                limits,
                backoff: FAST,
            }
            .run(),
        );
        let (a, b, c) = (
            violation("a", "p"),
            violation("b", "p"),
            violation("c", "p"),
        );
        tx.send_replace(Some(Arc::new(vec![a.clone(), b.clone()])));
        // The burst.
        assert!(api.wait_for_state(WAIT, |e, _| e.len() == 2).await);
        // a ends, c starts: the bucket is empty, c is held back.
        tx.send_replace(Some(Arc::new(vec![b.clone(), c.clone()])));
        counted(&metrics, "rate_limited", |m| {
            m.events(EventResult::RateLimited) == 1
        })
        .await;
        let namespaces: Vec<String> = api
            .events()
            .iter()
            .map(|e| e["metadata"]["namespace"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(namespaces, ["a", "b"]);
        let posts: Vec<String> = api
            .requests()
            .iter()
            .filter(|r| r.method == "POST")
            .map(|r| r.path.clone())
            .collect();
        assert_eq!(
            posts,
            ["/api/v1/namespaces/a/events", "/api/v1/namespaces/b/events"]
        );
        let e = &api.events()[0];
        assert_eq!(e["reason"], "GPUIsolationViolation");
        assert_eq!(e["type"], "Warning");
        assert_eq!(e["involvedObject"]["kind"], "Pod");
        assert_eq!(e["involvedObject"]["name"], "p");
        assert_eq!(e["source"]["host"], "n1");
        let message = e["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("uses GPU {GPU1} ({T4}, LUID {LUID1})"))
                && message.contains(&format!("it was allocated {GPU0} ({T4}, LUID {LUID0})")),
            "{message}"
        );

        // a starts again within the window: deduplicated; c is still held back (counted once).
        tx.send_replace(Some(Arc::new(vec![a.clone(), b.clone(), c.clone()])));
        counted(&metrics, "deduplicated", |m| {
            m.events(EventResult::Deduplicated) == 1
        })
        .await;
        assert_eq!(api.events().len(), 2);
        assert_eq!(metrics.events(EventResult::RateLimited), 1);
        assert_eq!(metrics.events(EventResult::Sent), 2);
        assert_eq!(metrics.events(EventResult::Error), 0);
        task.abort();
    }

    #[tokio::test]
    async fn a_failed_event_is_counted_and_retried_with_backoff() {
        let api = ApiServerStandin::start("n1", &[]).await.unwrap();
        api.fail_next("POST", &[500, 409]);
        let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
        let metrics = Metrics::new().isolation().clone();
        let (tx, rx) = watch::channel::<Active>(None);
        let task = tokio::spawn(
            ReportEvents {
                cluster,
                active: rx,
                config: config(IsolationPolicy::Audit),
                metrics: metrics.clone(),
                limits: dxdp::cluster::events::EVENT_LIMITS,
                backoff: FAST,
            }
            .run(),
        );
        tx.send_replace(Some(Arc::new(vec![violation("a", "p")])));
        assert!(api.wait_for_state(WAIT, |e, _| e.len() == 1).await);
        counted(&metrics, "sent", |m| m.events(EventResult::Sent) == 1).await;
        assert_eq!(metrics.events(EventResult::Error), 2);
        assert_eq!(
            api.requests().iter().filter(|r| r.method == "POST").count(),
            3
        );
        task.abort();
    }

    #[tokio::test]
    async fn an_event_the_api_server_refuses_is_dropped_and_the_next_one_sent() {
        let api = ApiServerStandin::start("n1", &[]).await.unwrap();
        api.fail_next_with(
            "POST",
            403,
            "events \"p.1\" is forbidden: unable to create new content in namespace a because it is being terminated",
        );
        api.fail_next("POST", &[422]);
        let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
        let metrics = Metrics::new().isolation().clone();
        let (tx, rx) = watch::channel::<Active>(None);
        let task = tokio::spawn(
            ReportEvents { cluster, active: rx, config: config(IsolationPolicy::Audit), metrics: metrics.clone(), limits: dxdp::cluster::events::EVENT_LIMITS, backoff: // A refusal must not wait for a retry: a backoff longer than the test.
            Backoff {
                initial: Duration::from_secs(3600),
                max: Duration::from_secs(3600),
                timeout: Duration::from_secs(5),
            } }
            .run(),
        );
        // In key order: a (403, terminating), b (422), c (sent).
        tx.send_replace(Some(Arc::new(vec![
            violation("a", "p"),
            violation("b", "q"),
            violation("c", "r"),
        ])));
        counted(&metrics, "sent", |m| m.events(EventResult::Sent) == 1).await;
        assert_eq!(metrics.events(EventResult::Error), 2);
        let events = api.events();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0]["metadata"]["namespace"], "c");
        let posts: Vec<String> = api
            .requests()
            .into_iter()
            .filter(|r| r.method == "POST")
            .map(|r| r.path)
            .collect();
        assert_eq!(
            posts,
            [
                "/api/v1/namespaces/a/events",
                "/api/v1/namespaces/b/events",
                "/api/v1/namespaces/c/events"
            ]
        );
        task.abort();
    }

    #[tokio::test]
    async fn with_events_off_nothing_is_sent() {
        let api = ApiServerStandin::start("n1", &[]).await.unwrap();
        let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
        let metrics = Metrics::new().isolation().clone();
        let (tx, rx) = watch::channel::<Active>(None);
        let mut c = Config::default();
        c.isolation.events = false;
        let (config_tx, config_rx) = watch::channel(Arc::new(c));
        let task = tokio::spawn(
            ReportEvents {
                cluster,
                active: rx,
                config: config_rx,
                metrics: metrics.clone(),
                limits: dxdp::cluster::events::EVENT_LIMITS,
                backoff: FAST,
            }
            .run(),
        );
        tx.send_replace(Some(Arc::new(vec![violation("a", "p")])));
        counted(&metrics, "disabled", |m| {
            m.events(EventResult::Disabled) == 1
        })
        .await;
        // Turned on while it lasts: no Event for a violation that started while off.
        config_tx.send_replace(Arc::new(Config::default()));
        tx.send_replace(Some(Arc::new(vec![
            violation("a", "p"),
            violation("b", "p"),
        ])));
        assert!(api.wait_for_state(WAIT, |e, _| e.len() == 1).await);
        counted(&metrics, "sent", |m| m.events(EventResult::Sent) == 1).await;
        assert_eq!(api.events()[0]["metadata"]["namespace"], "b");
        task.abort();
    }

    #[tokio::test]
    async fn the_taint_is_added_while_a_violation_lasts_and_removed_after() {
        let api = ApiServerStandin::start("n1", &[]).await.unwrap();
        api.set_taints(vec![other_taint()]);
        let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
        let metrics = Metrics::new().isolation().clone();
        let (tx, rx) = watch::channel::<Active>(None);
        let task = tokio::spawn(
            KeepTaint {
                cluster,
                active: rx,
                config: config(IsolationPolicy::Taint),
                metrics: metrics.clone(),
                backoff: FAST,
                start_grace: WAIT,
                min_hold: Duration::ZERO,
            }
            .run(),
        );
        tx.send_replace(Some(Arc::new(vec![violation("a", "p")])));
        assert!(
            api.wait_for_state(WAIT, |_, t| t.len() == 2).await,
            "{:?}",
            api.taints()
        );
        assert_eq!(api.taints(), [other_taint(), ours()]);
        let patch = api
            .requests()
            .into_iter()
            .find(|r| r.method == "PATCH")
            .unwrap();
        assert_eq!(
            patch.content_type.as_deref(),
            Some("application/merge-patch+json")
        );
        // Conditional on the version read (1 at start, 2 after set_taints).
        assert_eq!(
            patch.json(),
            serde_json::json!({"metadata": {"resourceVersion": "2"}, "spec": {"taints": [other_taint(), ours()]}})
        );
        counted(&metrics, "added", |m| {
            m.taint_changes(TaintResult::Added) == 1
        })
        .await;
        assert!(metrics.node_tainted());
        // Another sample with the violation: no call.
        tx.send_replace(Some(Arc::new(vec![violation("a", "p")])));
        tx.send_replace(Some(Arc::new(vec![])));
        assert!(api.wait_for_state(WAIT, |_, t| t.len() == 1).await);
        assert_eq!(api.taints(), [other_taint()]);
        counted(&metrics, "removed", |m| {
            m.taint_changes(TaintResult::Removed) == 1
        })
        .await;
        assert!(!metrics.node_tainted());
        assert_eq!(api.patches().len(), 2);
        task.abort();
    }

    #[test]
    fn the_taint_stays_ten_minutes_at_least_and_goes_at_once_with_policy_audit() {
        use dxdp::cluster::taint::{taint_want, TaintWant, TAINT_MIN_HOLD};
        use IsolationPolicy::{Audit, Taint};
        let s = Duration::from_secs;
        assert_eq!(TAINT_MIN_HOLD, s(600));
        let grace = s(60);
        let want = |policy, violations, since_start, tainted_for| {
            taint_want(policy, violations, since_start, grace, tainted_for, s(600))
        };
        // (policy, violations, since start, tainted for, want)
        let table = [
            (Taint, Some(1), s(0), None, TaintWant::On),
            (Taint, Some(1), s(900), Some(s(5)), TaintWant::On),
            (Taint, Some(0), s(900), Some(s(5)), TaintWant::Wait(s(595))),
            (Taint, Some(0), s(900), Some(s(599)), TaintWant::Wait(s(1))),
            (Taint, Some(0), s(900), Some(s(600)), TaintWant::Off),
            (Taint, Some(0), s(900), None, TaintWant::Off),
            (Taint, None, s(10), None, TaintWant::Wait(s(50))),
            (Taint, None, s(60), None, TaintWant::Off),
            (Audit, Some(1), s(900), Some(s(5)), TaintWant::Off),
        ];
        for (policy, violations, since, tainted, expected) in table {
            assert_eq!(
                want(policy, violations, since, tainted),
                expected,
                "{policy:?} {violations:?} {since:?} {tainted:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_taint_removed_by_hand_comes_back_when_a_violation_starts() {
        let api = ApiServerStandin::start("n1", &[]).await.unwrap();
        let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
        let metrics = Metrics::new().isolation().clone();
        let (tx, rx) = watch::channel::<Active>(None);
        let task = tokio::spawn(
            KeepTaint {
                cluster,
                active: rx,
                config: config(IsolationPolicy::Taint),
                metrics: metrics.clone(),
                backoff: FAST,
                start_grace: WAIT,
                min_hold: Duration::ZERO,
            }
            .run(),
        );
        tx.send_replace(Some(Arc::new(vec![violation("a", "p")])));
        counted(&metrics, "added", |m| {
            m.taint_changes(TaintResult::Added) == 1
        })
        .await;
        // Removed by hand, or replaced by the key with another effect: the same violations
        // change nothing, a new one reads the Node again and puts it back.
        let by_hand = serde_json::json!({"key": TAINT_KEY, "effect": "PreferNoSchedule"});
        api.set_taints(vec![by_hand]);
        tx.send_replace(Some(Arc::new(vec![violation("a", "p")])));
        tx.send_replace(Some(Arc::new(vec![
            violation("a", "p"),
            violation("b", "q"),
        ])));
        counted(&metrics, "added again", |m| {
            m.taint_changes(TaintResult::Added) == 2
        })
        .await;
        assert_eq!(api.taints(), [ours()]);
        task.abort();
    }

    #[tokio::test]
    async fn a_conflicting_update_is_read_again() {
        let api = ApiServerStandin::start("n1", &[]).await.unwrap();
        api.fail_next("PATCH", &[409]);
        let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
        let metrics = Metrics::new().isolation().clone();
        let (_tx, rx) = watch::channel::<Active>(Some(Arc::new(vec![violation("a", "p")])));
        let task = tokio::spawn(
            KeepTaint {
                cluster,
                active: rx,
                config: config(IsolationPolicy::Taint),
                metrics: metrics.clone(),
                backoff: FAST,
                start_grace: WAIT,
                min_hold: Duration::ZERO,
            }
            .run(),
        );
        assert!(api.wait_for_state(WAIT, |_, t| t.len() == 1).await);
        counted(&metrics, "added", |m| {
            m.taint_changes(TaintResult::Added) == 1
        })
        .await;
        assert_eq!(metrics.taint_changes(TaintResult::Error), 0);
        let methods: Vec<String> = api.requests().iter().map(|r| r.method.clone()).collect();
        assert_eq!(methods, ["GET", "PATCH", "GET", "PATCH"]);
        task.abort();
    }

    #[tokio::test]
    async fn a_taint_an_earlier_run_left_is_removed_when_no_violation_is_known() {
        // The first audit shows none.
        let api = ApiServerStandin::start("n1", &[]).await.unwrap();
        api.set_taints(vec![ours(), other_taint()]);
        let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
        let metrics = Metrics::new().isolation().clone();
        let (tx, rx) = watch::channel::<Active>(None);
        let task = tokio::spawn(
            KeepTaint {
                cluster: cluster.clone(),
                active: rx,
                config: config(IsolationPolicy::Taint),
                metrics: metrics.clone(),
                backoff: FAST,
                start_grace: WAIT,
                min_hold: Duration::ZERO,
            }
            .run(),
        );
        tx.send_replace(Some(Arc::new(vec![])));
        assert!(api.wait_for_state(WAIT, |_, t| t.len() == 1).await);
        assert_eq!(api.taints(), [other_taint()]);
        counted(&metrics, "removed", |m| {
            m.taint_changes(TaintResult::Removed) == 1
        })
        .await;
        task.abort();

        // No audit comes (the counters cannot be read): removed after the start grace.
        api.set_taints(vec![ours()]);
        let (_tx, rx) = watch::channel::<Active>(None);
        let task = tokio::spawn(
            KeepTaint {
                cluster: cluster.clone(),
                active: rx,
                config: config(IsolationPolicy::Taint),
                metrics: metrics.clone(),
                backoff: FAST,
                start_grace: Duration::from_millis(50),
                min_hold: Duration::ZERO,
            }
            .run(),
        );
        assert!(api.wait_for_state(WAIT, |_, t| t.is_empty()).await);
        counted(&metrics, "removed", |m| {
            m.taint_changes(TaintResult::Removed) == 2
        })
        .await;
        task.abort();

        // The policy is audit now: removed at once, whatever the audit says.
        api.set_taints(vec![ours()]);
        let (_tx, rx) = watch::channel::<Active>(Some(Arc::new(vec![violation("a", "p")])));
        let task = tokio::spawn(
            KeepTaint {
                cluster,
                active: rx,
                config: config(IsolationPolicy::Audit),
                metrics: metrics.clone(),
                backoff: FAST,
                start_grace: WAIT,
                min_hold: Duration::ZERO,
            }
            .run(),
        );
        assert!(api.wait_for_state(WAIT, |_, t| t.is_empty()).await);
        counted(&metrics, "removed", |m| {
            m.taint_changes(TaintResult::Removed) == 3
        })
        .await;
        task.abort();
    }

    #[tokio::test]
    async fn a_violation_known_at_start_keeps_the_taint_without_a_patch() {
        let api = ApiServerStandin::start("n1", &[]).await.unwrap();
        api.set_taints(vec![ours()]);
        let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
        let metrics = Metrics::new().isolation().clone();
        let (_tx, rx) = watch::channel::<Active>(Some(Arc::new(vec![violation("a", "p")])));
        let task = tokio::spawn(
            KeepTaint {
                cluster,
                active: rx,
                config: config(IsolationPolicy::Taint),
                metrics: metrics.clone(),
                backoff: FAST,
                start_grace: WAIT,
                min_hold: Duration::ZERO,
            }
            .run(),
        );
        counted(&metrics, "tainted", IsolationMetrics::node_tainted).await;
        assert!(api.patches().is_empty());
        assert_eq!(api.taints(), [ours()]);
        task.abort();
    }
}

mod cli {
    use super::*;

    use std::process::{Command, Output};

    fn dxdp(args: &[&str], env: &[(&str, &str)]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_dxdp"))
            .args(args)
            .env_clear()
            .envs(env.iter().copied())
            .output()
            .unwrap()
    }

    fn json(out: &Output) -> serde_json::Value {
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "no JSON ({e}): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    fn snapshot(name: &str) -> String {
        common::fixture_path(name).display().to_string()
    }

    #[test]
    fn the_node_audit_exits_1_with_violations_0_when_clean_and_2_when_it_cannot_tell() {
        let out = dxdp(
            &[
                "audit",
                "-o",
                "json",
                "--host-snapshot",
                &snapshot("telemetry-leak"),
            ],
            &[],
        );
        assert_eq!(out.status.code(), Some(1));
        let doc = json(&out);
        assert_eq!(doc["kind"], "Audit");
        assert_eq!(doc["scope"], "node");
        assert_eq!(doc["verdict"], "violations");
        let violations = &doc["node"]["violations"];
        assert_eq!(violations.as_array().map(Vec::len), Some(2));
        assert_eq!(violations[1]["pod"], "detect-0");
        assert_eq!(violations[1]["kind"], "other-device");
        assert_eq!(violations[1]["used"]["device"], GPU1);
        assert_eq!(violations[1]["allocated"][0]["luid"], LUID0);
        assert_eq!(violations[0]["kind"], "no-allocation");
        assert_eq!(doc["node"]["unplacedProcesses"], 2);
        assert_eq!(doc["node"]["containers"][0]["verdict"], "idle");

        let out = dxdp(
            &["audit", "--host-snapshot", &snapshot("telemetry-t4")],
            &[],
        );
        assert_eq!(out.status.code(), Some(0));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&format!("web/render-1/app     {GPU0}  {GPU0}  ok\n")),
            "{text}"
        );
        assert!(text.ends_with("Verdict: clean: every container uses only the GPUs it was allocated (exit code 0)\n"), "{text}");

        let out = dxdp(
            &[
                "audit",
                "-o",
                "yaml",
                "--host-snapshot",
                &snapshot("nvidia-multi-gpu"),
            ],
            &[],
        );
        assert_eq!(out.status.code(), Some(3));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("verdict: unknown\n") && text.contains("has no telemetry section"),
            "{text}"
        );
    }

    #[test]
    fn in_a_container_the_audit_compares_what_it_sees_with_what_it_was_given() {
        // telemetry-t4 as seen from a container given GPU 0 only: GPU 1 leaks in.
        let out = dxdp(
            &[
                "audit",
                "-o",
                "json",
                "--host-snapshot",
                &snapshot("telemetry-t4"),
            ],
            &[("DXDP_ADAPTER_LUIDS", "7048070")],
        );
        assert_eq!(out.status.code(), Some(1));
        let doc = json(&out);
        assert_eq!(doc["scope"], "container");
        assert_eq!(doc["verdict"], "violations");
        assert_eq!(
            doc["container"]["extra"],
            serde_json::json!([{"luid": 7049510, "luidLabel": LUID1, "model": T4}])
        );
        // The in-container fixture sees exactly its GPU.
        let out = dxdp(
            &["audit", "--host-snapshot", &snapshot("in-container")],
            &[("DXDP_ADAPTER_LUIDS", "7048070")],
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        // A variable that is no LUID list: could not tell.
        let out = dxdp(
            &["audit", "--host-snapshot", &snapshot("in-container")],
            &[("DXDP_ADAPTER_LUIDS", "0x6B8B86")],
        );
        assert_eq!(out.status.code(), Some(3));
        // --node audits the node even inside.
        let out = dxdp(
            &[
                "audit",
                "--node",
                "--host-snapshot",
                &snapshot("telemetry-leak"),
            ],
            &[("DXDP_ADAPTER_LUIDS", "7048070")],
        );
        assert_eq!(out.status.code(), Some(1));
    }

    /// Serves `body` as `/metrics` once per connection until dropped.
    async fn serve_metrics(body: String) -> (String, tokio::task::JoinHandle<()>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let mut request = vec![0u8; 4096];
                let _ = conn.read(&mut request).await;
                let answer = format!(
                    "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
            }
        });
        (address, task)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_audit_reads_a_running_daemons_metrics() {
        async fn audit_of(text: String) -> Output {
            let (address, server) = serve_metrics(text).await;
            let out = tokio::task::spawn_blocking(move || {
                dxdp(&["audit", "-o", "json", "--endpoint", &address], &[])
            })
            .await
            .unwrap();
            server.abort();
            out
        }
        let metrics = Metrics::new();
        let view = view_of(&common::fixture_path("telemetry-leak")).await;
        metrics.telemetry().publish(Some(Arc::new(view)));
        metrics.telemetry().pod_resources_call(true);
        metrics.telemetry().attribution_current(true);
        let out = audit_of(metrics.encode()).await;
        assert_eq!(out.status.code(), Some(1));
        let doc = json(&out);
        assert_eq!(doc["node"]["violations"][1]["pod"], "detect-0");
        assert_eq!(doc["node"]["violations"][1]["allocated"][0]["device"], GPU0);

        // PodResources answered once but not the last call (an outage): it cannot tell.
        metrics.telemetry().pod_resources_call(false);
        metrics.telemetry().attribution_current(false);
        let out = audit_of(metrics.encode()).await;
        assert_eq!(out.status.code(), Some(3));
        assert!(json(&out)["reason"]
            .as_str()
            .unwrap()
            .contains("PodResources"));

        // A daemon without the gauge whose PodResources calls all failed cannot tell either.
        let older = Metrics::new();
        let view = view_of(&common::fixture_path("telemetry-leak")).await;
        older.telemetry().publish(Some(Arc::new(view)));
        older.telemetry().pod_resources_call(false);
        let text: String = older
            .encode()
            .lines()
            .filter(|l| !l.contains("dxdp_telemetry_attribution_current"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(audit_of(text).await.status.code(), Some(3));
    }
}

/// The daemon end to end: `dxdp plugin` with a kubelet stand-in and an API server stand-in, a
/// replayed node whose snapshot is rewritten between samples.
#[cfg(unix)]
mod daemon {
    use super::*;

    use apiserver::ApiServerStandin;
    use dxdp::cluster::taint::TAINT_KEY;
    use dxdp::kubelet::standin::KubeletStandin;

    const CONFIG: &str = "telemetry:\n  interval: 1s\nisolation:\n  policy: taint\n";

    fn start(dir: &Path, snapshot: &Path, kubeconfig: &Path) -> tokio::process::Child {
        let config = dir.join("config.yaml");
        std::fs::write(&config, CONFIG).unwrap();
        tokio::process::Command::new(env!("CARGO_BIN_EXE_dxdp"))
            .args(["plugin", "--kubelet-dir"])
            .arg(dir)
            .arg("--host-snapshot")
            .arg(snapshot)
            .arg("--config")
            .arg(&config)
            .env_clear()
            .env("NODE_NAME", "gpu-node-1")
            .env("KUBECONFIG", kubeconfig)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    }

    async fn stop(mut child: tokio::process::Child, dir: &Path) -> String {
        common::terminate(&mut child, WAIT).await;
        std::fs::read_to_string(dir.join("stderr.log")).unwrap()
    }

    fn has_ours(taints: &[serde_json::Value]) -> bool {
        taints.iter().any(|t| t["key"] == TAINT_KEY)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leak_is_reported_and_taints_the_node_until_it_ends_also_across_a_restart() {
        if !common::af_unix("a_leak_is_reported_and_taints_the_node") {
            return;
        }
        let dir = tempfile::Builder::new()
            .prefix("dxdp")
            .tempdir_in("/tmp")
            .unwrap();
        // The binary speaks AF_UNIX only.
        let _kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
            .await
            .unwrap();
        let api = ApiServerStandin::start("gpu-node-1", &[]).await.unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
        let snapshot = dir.path().join("node.yaml");
        let leaking = std::fs::read_to_string(common::fixture_path("telemetry-leak")).unwrap();
        std::fs::write(&snapshot, &leaking).unwrap();
        let ended_dir = tempfile::tempdir().unwrap();
        let ended = std::fs::read_to_string(leak_ended(ended_dir.path())).unwrap();

        let plugin = start(dir.path(), &snapshot, &kubeconfig);
        // Two violations: two Events, and the taint.
        assert!(
            api.wait_for_state(WAIT, |e, t| e.len() == 2 && has_ours(t))
                .await,
            "events {:?}, taints {:?}",
            api.events(),
            api.taints()
        );
        let mut pods: Vec<String> = api
            .events()
            .iter()
            .map(|e| e["involvedObject"]["name"].as_str().unwrap().to_string())
            .collect();
        pods.sort();
        assert_eq!(pods, ["debug-0", "detect-0"]);

        // The leak ends while dxdp is down; the next dxdp removes the taint.
        let log = stop(plugin, dir.path()).await;
        assert_eq!(
            log.matches("GPU isolation violation started").count(),
            2,
            "once per start, not per sample:\n{log}"
        );
        assert!(has_ours(&api.taints()));
        std::fs::write(&snapshot, &ended).unwrap();
        let plugin = start(dir.path(), &snapshot, &kubeconfig);
        assert!(
            api.wait_for_state(WAIT, |_, t| !has_ours(t)).await,
            "{:?}",
            api.taints()
        );
        // It starts again: tainted again, and two more Events (the deduplication memory is the
        // run's: this run has sent none yet).
        std::fs::write(&snapshot, &leaking).unwrap();
        assert!(
            api.wait_for_state(WAIT, |e, t| e.len() == 4 && has_ours(t))
                .await
        );
        // Its counters stop: the violations end after three clean samples, but the taint
        // stays for this run (TAINT_MIN_HOLD, 10 minutes); the next run removes it at start.
        let stopped_dir = tempfile::tempdir().unwrap();
        let stopped = std::fs::read_to_string(leak_stopped(stopped_dir.path())).unwrap();
        std::fs::write(&snapshot, &stopped).unwrap();
        stop(plugin, dir.path()).await;
        assert!(has_ours(&api.taints()));
        let plugin = start(dir.path(), &snapshot, &kubeconfig);
        assert!(api.wait_for_state(WAIT, |_, t| !has_ours(t)).await);
        let log = stop(plugin, dir.path()).await;
        assert_eq!(
            log.matches("GPU isolation violation started").count(),
            0,
            "{log}"
        );
        assert_eq!(api.events().len(), 4);
    }
}

/// Issue 44 item 7: `isolation.policy: withdraw` takes only the GPUs a violation uses out of
/// serving (advertised Unhealthy, so the kubelet gives them to no new pod), with no API server
/// and no taint, and returns each when its violation ends.
#[cfg(unix)]
mod withdraw {
    use super::*;

    use dxdp::kubelet::standin::{KubeletStandin, StandinView};

    const DISPLAY: &str = "directx.microsoft.com/display";

    /// The health of every device of `view` for `DISPLAY`, by physical GPU (replicas included):
    /// `(GPU0's, GPU1's)`, each sorted and deduplicated.
    fn health(view: &StandinView) -> (Vec<String>, Vec<String>) {
        let of = |gpu: &str| {
            let mut h: Vec<String> = view
                .devices(DISPLAY)
                .unwrap_or_default()
                .iter()
                .filter(|d| d.id.starts_with(gpu))
                .map(|d| d.health.clone())
                .collect();
            h.sort();
            h.dedup();
            h
        };
        (of(GPU0), of(GPU1))
    }

    fn want(gpu0: &str, gpu1: &str) -> (Vec<String>, Vec<String>) {
        (vec![gpu0.to_string()], vec![gpu1.to_string()])
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_gpus_a_leak_uses_are_withdrawn_and_each_returns_when_its_leak_ends() {
        if !common::af_unix("only_the_gpus_a_leak_uses_are_withdrawn") {
            return;
        }
        let dir = tempfile::Builder::new()
            .prefix("dxdp")
            .tempdir_in("/tmp")
            .unwrap();
        // The binary speaks AF_UNIX only.
        let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
            .await
            .unwrap();
        let snapshot = dir.path().join("node.yaml");
        let leaking = std::fs::read_to_string(common::fixture_path("telemetry-leak")).unwrap();
        std::fs::write(&snapshot, &leaking).unwrap();
        // debug-0 stops using GPU 0 (its 256 MiB there go); detect-0 still computes on GPU 1.
        let gpu0_free = leaking.replace(
            "pid_4600_luid_0x00000000_0x006B8B86_phys_0, dedicated: 268435456",
            "pid_4600_luid_0x00000000_0x006B8B86_phys_0, dedicated: 0",
        );
        assert_ne!(gpu0_free, leaking);
        let ended_dir = tempfile::tempdir().unwrap();
        let ended = std::fs::read_to_string(leak_ended(ended_dir.path())).unwrap();
        let config = dir.path().join("config.yaml");
        std::fs::write(
            &config,
            "telemetry:\n  interval: 1s\nisolation:\n  policy: withdraw\n",
        )
        .unwrap();
        // No NODE_NAME, no KUBECONFIG: withdraw needs no API server.
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_dxdp"))
            .args(["plugin", "--kubelet-dir"])
            .arg(dir.path())
            .arg("--host-snapshot")
            .arg(&snapshot)
            .arg("--config")
            .arg(&config)
            .env_clear()
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("stderr.log")).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // Both GPUs are used without allocation (debug-0 on GPU 0, detect-0 on GPU 1).
        assert!(
            kubelet
                .wait_for(WAIT, |v| health(v) == want("Unhealthy", "Unhealthy"))
                .await,
            "{:?}",
            health(&kubelet.view())
        );
        // GPU 0's leak ends (three clean samples): GPU 0 returns, GPU 1 stays withdrawn.
        std::fs::write(&snapshot, &gpu0_free).unwrap();
        assert!(
            kubelet
                .wait_for(WAIT, |v| health(v) == want("Healthy", "Unhealthy"))
                .await,
            "{:?}",
            health(&kubelet.view())
        );
        // Every leak ends: both return.
        std::fs::write(&snapshot, &ended).unwrap();
        assert!(
            kubelet
                .wait_for(WAIT, |v| health(v) == want("Healthy", "Healthy"))
                .await,
            "{:?}",
            health(&kubelet.view())
        );
        common::terminate(&mut child, WAIT).await;
        let log = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap();
        assert!(log.contains("isolation_violation"), "{log}");
        kubelet.stop().await;
    }
}

mod docs {
    use super::*;

    use std::collections::BTreeSet;

    fn page(name: &str) -> String {
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(name)).unwrap()
    }

    /// The `dxdp_…` names in a text.
    fn referenced(text: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let mut rest = text;
        while let Some(i) = rest.find("dxdp_") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                .unwrap_or(tail.len());
            out.insert(tail[..end].to_string());
            rest = &tail[end..];
        }
        out
    }

    #[tokio::test]
    async fn every_isolation_metric_is_documented_and_the_alerts_use_real_ones() {
        let metrics = Metrics::new();
        let view = view_of(&common::fixture_path("telemetry-leak")).await;
        metrics.telemetry().publish(Some(Arc::new(view.clone())));
        let active = Arc::new(watch::Sender::new(None));
        let mut t = dxdp::telemetry::audit::Tracker::new(metrics.isolation().clone(), active);
        t.sample(&view, true);
        let served: BTreeSet<String> = metrics
            .encode()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .map(str::to_string)
            .collect();
        let isolation: Vec<&String> = served
            .iter()
            .filter(|n| n.starts_with("dxdp_isolation_"))
            .collect();
        assert_eq!(isolation.len(), 7, "{isolation:?}");
        let observability = page("docs/observability.md");
        let start = observability.find("\n## GPU isolation\n").expect("section");
        let section = &observability[start..];
        let section = &section[..section[4..].find("\n## ").map_or(section.len(), |i| i + 4)];
        let guide = page("docs/isolation.md");
        for name in isolation {
            let row = format!("| `{name}` |");
            assert!(
                section.contains(&row),
                "docs/observability.md#gpu-isolation lacks {name}"
            );
            assert!(guide.contains(&row), "docs/isolation.md lacks {name}");
        }
        let unknown: Vec<String> = referenced(&guide)
            .into_iter()
            .filter(|n| !served.contains(n) && n != "dxdp_")
            .collect();
        assert!(
            unknown.is_empty(),
            "docs/isolation.md names metrics dxdp does not serve: {unknown:?}"
        );
    }
}
