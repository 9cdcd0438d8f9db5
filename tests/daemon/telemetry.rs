//! The telemetry computation on the `telemetry-t4` fixture: every expected figure is worked out
//! by hand from the fixture's numbers (the comments show the arithmetic).

use crate::common;
use crate::cri as cri_standin;

use crate::podresources;

use std::collections::{BTreeMap, HashMap};

use dxdp_core::devices::Resource;
use dxdp_core::pipeline::{discover, PipelineConfig};
use dxdp_core::telemetry::compute::{compute, device_refs, Segments, TelemetryView};
use dxdp_core::telemetry::PodRef;

const GPU0: &str = "pciroot-0-pci-1b00-0540e5ad73bf260f";
const GPU1: &str = "pciroot-0-pci-1c00-ba6abfb666f4630a";
const DISPLAY: &str = "directx.microsoft.com/display";

fn view() -> TelemetryView {
    let (facts, telemetry) =
        dxdp_core::snapshot::read_file_full(&common::fixture_path("telemetry-t4")).unwrap();
    let telemetry = telemetry.expect("the fixture has telemetry");
    let discovery = discover(&facts, &PipelineConfig::default());
    let devices = device_refs(&discovery, |r| Some(r.default_resource_name().to_string()));
    compute(
        &devices,
        &telemetry,
        &HashMap::new(),
        &telemetry.pod_resources,
    )
}

fn engines(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn pod(namespace: &str, name: &str, container: &str) -> PodRef {
    PodRef {
        namespace: namespace.into(),
        pod: name.into(),
        container: container.into(),
    }
}

#[test]
fn device_figures_are_the_hand_computed_ones() {
    let v = view();
    assert_eq!(v.window_seconds, 10.0); // (1100000000 - 1000000000) * 100 ns
    assert_eq!(v.unparsed_instances, 1); // _Total
    assert_eq!(v.devices.len(), 2);
    let d0 = &v.devices[0];
    assert_eq!(
        (d0.device.as_str(), d0.resource.as_str(), d0.luid.as_str()),
        (GPU0, DISPLAY, "0x00000000_0x006B8B86")
    );
    assert_eq!(d0.model, "NVIDIA Tesla T4");
    // Window: 100,000,000 ticks.
    // 3d, engine 0: pid 4200 30M + pid 4300 20M + pid 1200 1M = 51M -> 0.51
    // copy: engine 1 (pid 4200) 5M, engine 2 (pid 4300) 10M -> the busiest, 0.10
    // video_decode: engine 3, 25M -> 0.25
    // compute: engine 4, pid 4400 is new in the later sample -> 0
    // cuda: engine 5 went down from 9M to 1M (reused pid) -> 0
    assert_eq!(
        d0.engines,
        engines(&[
            ("3d", 0.51),
            ("copy", 0.10),
            ("video_decode", 0.25),
            ("compute", 0.0),
            ("cuda", 0.0),
        ])
    );
    assert_eq!(
        d0.memory_used,
        Segments {
            dedicated: Some(6_710_886_400),
            shared: Some(121_634_816)
        }
    );
    assert_eq!(
        d0.memory_total,
        Segments {
            dedicated: Some(16_106_127_360),
            shared: Some(34_359_738_368)
        }
    );
    assert_eq!(d0.processes, 4); // 4200, 4300, 1200, 4400
    let holders: Vec<(PodRef, &str)> = d0
        .holders
        .iter()
        .map(|h| (h.pod.clone(), h.device_id.as_str()))
        .collect();
    let replica = format!("{GPU0}-r1");
    assert_eq!(
        holders,
        [
            (pod("ml", "infer-7d9", "server"), GPU0),
            (pod("web", "render-1", "app"), replica.as_str()),
        ]
    );

    let d1 = &v.devices[1];
    assert_eq!(
        (d1.device.as_str(), d1.luid.as_str()),
        (GPU1, "0x00000000_0x006B9126")
    );
    // compute, engine 0: pid 4100 80M + pid 4101 30M = 110M -> 1.1, capped at 1;
    // engine 1 (Compute_1): 30M -> 0.3. copy, engine 2: 2M -> 0.02.
    assert_eq!(d1.engines, engines(&[("compute", 1.0), ("copy", 0.02)]));
    assert_eq!(
        d1.memory_used,
        Segments {
            dedicated: Some(9_663_676_416),
            shared: Some(536_870_912)
        }
    );
    // No shared limit recorded for GPU 1.
    assert_eq!(
        d1.memory_total,
        Segments {
            dedicated: Some(16_106_127_360),
            shared: None
        }
    );
    assert_eq!(d1.processes, 2);
    assert_eq!(d1.holders.len(), 1);
    assert_eq!(d1.holders[0].pod, pod("ml", "train-0", "trainer"));
}

#[test]
fn container_figures_sum_their_processes_and_the_rest_is_the_hosts() {
    let v = view();
    /// (pod, device, dedicated, shared, engines, processes)
    type Row<'a> = (PodRef, &'a str, u64, u64, BTreeMap<String, f64>, u64);
    let got: Vec<Row> = v
        .containers
        .iter()
        .map(|c| {
            (
                c.pod.clone(),
                c.device.as_str(),
                c.memory_used.dedicated.unwrap(),
                c.memory_used.shared.unwrap(),
                c.engines.clone(),
                c.processes,
            )
        })
        .collect();
    let expected = vec![
        // The host: pid 1200 and pid 4400 (container ddd444 has no pod).
        // 3d: 1M / 100M; compute: pid 4400 is new -> 0.
        (
            PodRef::host(),
            GPU0,
            268_435_456,
            16_777_216,
            engines(&[("3d", 0.01), ("compute", 0.0)]),
            2,
        ),
        // pid 4200: 3d 30M, copy 5M.
        (
            pod("ml", "infer-7d9", "server"),
            GPU0,
            4_294_967_296,
            104_857_600,
            engines(&[("3d", 0.30), ("copy", 0.05)]),
            1,
        ),
        // pids 4100 + 4101: memory 8 GiB + 1 GiB, 512 MiB + 0; compute as the device.
        (
            pod("ml", "train-0", "trainer"),
            GPU1,
            9_663_676_416,
            536_870_912,
            engines(&[("compute", 1.0), ("copy", 0.02)]),
            2,
        ),
        // pid 4300: 3d 20M, copy 10M, video_decode 25M, cuda went down -> 0.
        (
            pod("web", "render-1", "app"),
            GPU0,
            2_147_483_648,
            0,
            engines(&[
                ("3d", 0.20),
                ("copy", 0.10),
                ("video_decode", 0.25),
                ("cuda", 0.0),
            ]),
            1,
        ),
    ];
    assert_eq!(got, expected);
}

#[test]
fn pods_from_the_pod_status_win_over_the_recorded_ones() {
    let (facts, telemetry) =
        dxdp_core::snapshot::read_file_full(&common::fixture_path("telemetry-t4")).unwrap();
    let telemetry = telemetry.unwrap();
    let discovery = discover(&facts, &PipelineConfig::default());
    let devices = device_refs(&discovery, |r| {
        (r == Resource::Display).then(|| "example.com/gpu".to_string())
    });
    // Container ddd444 is now known to be ops/agent/main.
    let pods = HashMap::from([("ddd444".to_string(), pod("ops", "agent", "main"))]);
    let v = compute(&devices, &telemetry, &pods, &[]);
    assert_eq!(v.devices[0].resource, "example.com/gpu");
    assert!(v.devices.iter().all(|d| d.holders.is_empty()));
    let agent = v
        .containers
        .iter()
        .find(|c| c.pod == pod("ops", "agent", "main"))
        .expect("the agent's processes");
    assert_eq!((agent.device.as_str(), agent.processes), (GPU0, 1));
    let host = v.containers.iter().find(|c| c.pod.is_host()).unwrap();
    // Only pid 1200 is left to the host.
    assert_eq!(host.processes, 1);
    assert_eq!(host.memory_used.dedicated, Some(268_435_456));
}

mod sampler {
    use super::*;

    use std::sync::Arc;
    use std::time::Duration;

    use dxdp::backend::counters::CounterSource;
    use dxdp::backend::counters::Recorded;
    use dxdp::backend::SnapshotFile;
    use dxdp::config::Config;
    use dxdp::observe::metrics::Metrics;
    use dxdp::telemetry::sampler::Devices;
    use dxdp::telemetry::sampler::{Sampler, State};
    use dxdp::transport::Endpoint;
    use dxdp_core::telemetry::{PodAllocation, TelemetryFacts};
    use podresources::PodResourcesStandin;
    use tokio::sync::watch;

    use super::common::metric_samples as samples;

    fn sampler(
        source: Arc<dyn CounterSource>,
        pod_resources: Option<Endpoint>,
    ) -> (Sampler, Metrics) {
        let metrics = Metrics::new();
        let path = common::fixture_path("telemetry-t4");
        // The receiver keeps the last value when the sender is gone.
        let (_, config) = watch::channel(Arc::new(Config::default()));
        (
            Sampler {
                source,
                devices: Devices::Host(Arc::new(SnapshotFile::new(path))),
                config,
                pod_resources,
                cri: None,
                containers: None,
                metrics: metrics.telemetry().clone(),
            },
            metrics,
        )
    }

    fn recorded() -> Arc<dyn CounterSource> {
        Arc::new(Recorded::new(&common::fixture_path("telemetry-t4")))
    }

    #[tokio::test]
    async fn the_figures_of_a_recorded_sample_reach_metrics_with_hand_computed_values() {
        let (s, metrics) = sampler(recorded(), None);
        let view = s.step(&mut State::default()).await.unwrap();
        metrics.telemetry().publish(Some(Arc::new(view)));
        let text = metrics.encode();
        let m = samples(&text);
        let dev0 =
            format!("device=\"{GPU0}\",resource=\"{DISPLAY}\",luid=\"0x00000000_0x006B8B86\"");
        let dev1 =
            format!("device=\"{GPU1}\",resource=\"{DISPLAY}\",luid=\"0x00000000_0x006B9126\"");
        let expect = [
            (format!("dxdp_gpu_engine_utilization_ratio{{{dev0},engine=\"3d\"}}"), "0.51"),
            (format!("dxdp_gpu_engine_utilization_ratio{{{dev0},engine=\"copy\"}}"), "0.1"),
            (format!("dxdp_gpu_engine_utilization_ratio{{{dev1},engine=\"compute\"}}"), "1.0"),
            (format!("dxdp_gpu_memory_used_bytes{{{dev0},segment=\"dedicated\"}}"), "6710886400"),
            (format!("dxdp_gpu_memory_used_bytes{{{dev0},segment=\"shared\"}}"), "121634816"),
            (format!("dxdp_gpu_memory_total_bytes{{{dev0},segment=\"dedicated\"}}"), "16106127360"),
            (format!("dxdp_gpu_memory_total_bytes{{{dev0},segment=\"shared\"}}"), "34359738368"),
            (format!("dxdp_gpu_processes{{{dev0}}}"), "4"),
            (format!("dxdp_gpu_processes{{{dev1}}}"), "2"),
            (format!("dxdp_gpu_info{{{dev0},model=\"NVIDIA Tesla T4\"}}"), "1"),
            (
                format!("dxdp_gpu_allocation{{device=\"{GPU0}\",resource=\"{DISPLAY}\",namespace=\"web\",pod=\"render-1\",container=\"app\"}}"),
                "1",
            ),
            (
                format!("dxdp_gpu_allocation{{device=\"{GPU1}\",resource=\"{DISPLAY}\",namespace=\"ml\",pod=\"train-0\",container=\"trainer\"}}"),
                "1",
            ),
            (
                format!("dxdp_container_gpu_memory_used_bytes{{namespace=\"ml\",pod=\"infer-7d9\",container=\"server\",device=\"{GPU0}\",segment=\"dedicated\"}}"),
                "4294967296",
            ),
            (
                format!("dxdp_container_gpu_memory_used_bytes{{namespace=\"\",pod=\"\",container=\"\",device=\"{GPU0}\",segment=\"dedicated\"}}"),
                "268435456",
            ),
            (
                format!("dxdp_container_gpu_engine_utilization_ratio{{namespace=\"web\",pod=\"render-1\",container=\"app\",device=\"{GPU0}\",engine=\"video_decode\"}}"),
                "0.25",
            ),
        ];
        for (series, value) in &expect {
            assert_eq!(
                m.get(series).map(String::as_str),
                Some(*value),
                "{series} in\n{text}"
            );
        }
        // Two holders of GPU 0 (one through a replica), one of GPU 1; the other resource's pod
        // is not dxdp's.
        assert_eq!(text.matches("dxdp_gpu_allocation{").count(), 3, "{text}");
        assert!(!text.contains("cpu-only"));
        assert!(text.ends_with("# EOF\n"));
        // Withdrawn figures leave no series.
        metrics.telemetry().publish(None);
        assert!(!metrics.encode().contains("dxdp_gpu_"));
    }

    #[tokio::test]
    async fn the_kubelets_live_answer_is_used_and_an_unreachable_kubelet_keeps_the_last_one() {
        let dir = tempfile::tempdir().unwrap();
        let endpoint = common::local_endpoint(dir.path(), "kubelet.sock");
        let only_trainer = vec![PodAllocation {
            namespace: "ml".into(),
            pod: "train-0".into(),
            container: "trainer".into(),
            resource: DISPLAY.into(),
            device_ids: vec![GPU1.into()],
        }];
        let standin = PodResourcesStandin::start(&endpoint, only_trainer)
            .await
            .unwrap();
        let (s, metrics) = sampler(recorded(), Some(standin.endpoint()));
        let mut state = State::default();
        let view = s.step(&mut state).await.unwrap();
        assert!(view.devices[0].holders.is_empty());
        assert_eq!(
            view.devices[1].holders[0].pod,
            pod("ml", "train-0", "trainer")
        );
        standin.stop().await;
        let view = s.step(&mut state).await.unwrap();
        assert_eq!(view.devices[1].holders.len(), 1, "the last answer is kept");
        let m = samples(&metrics.encode());
        assert_eq!(
            m["dxdp_telemetry_pod_resources_calls_total{result=\"ok\"}"],
            "1"
        );
        assert_eq!(
            m["dxdp_telemetry_pod_resources_calls_total{result=\"error\"}"],
            "1"
        );
    }

    /// The fixture's window with its containers as HCS lists them live: IDs and processes, no
    /// pods (aaa111: 4100, 4101; bbb222: 4200; ccc333: 4300; ddd444: 4400).
    fn recorded_without_pods(dir: &std::path::Path) -> std::path::PathBuf {
        let (facts, telemetry) =
            dxdp_core::snapshot::read_file_full(&common::fixture_path("telemetry-t4")).unwrap();
        let mut telemetry = telemetry.unwrap();
        for c in &mut telemetry.containers {
            c.pod = None;
        }
        let path = dir.join("live-containers.yaml");
        let text = dxdp_core::snapshot::write_full(
            &facts,
            Some(&telemetry),
            dxdp_core::snapshot::Format::Yaml,
        )
        .unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    /// (pod, device, dedicated, shared, engines, processes) of every container row.
    type Row = (PodRef, String, u64, u64, BTreeMap<String, f64>, u64);

    fn rows(view: &TelemetryView) -> Vec<Row> {
        view.containers
            .iter()
            .map(|c| {
                (
                    c.pod.clone(),
                    c.device.clone(),
                    c.memory_used.dedicated.unwrap(),
                    c.memory_used.shared.unwrap(),
                    c.engines.clone(),
                    c.processes,
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn the_container_runtime_names_the_pods_of_containers_recorded_without_them() {
        use cri_standin::{container, CriStandin};
        use dxdp::kubelet::cri::v1::{Container, ContainerState};

        let dir = tempfile::tempdir().unwrap();
        let source: Arc<dyn CounterSource> =
            Arc::new(Recorded::new(&recorded_without_pods(dir.path())));
        let running = ContainerState::ContainerRunning;
        let standin = CriStandin::start(
            &common::local_endpoint(dir.path(), "containerd.sock"),
            vec![
                container("aaa111", running, "ml", "train-0", "trainer"),
                container("bbb222", running, "ml", "infer-7d9", "server"),
                // Exited (this runtime ignores the request's filter): not placed.
                container(
                    "ccc333",
                    ContainerState::ContainerExited,
                    "web",
                    "render-1",
                    "app",
                ),
                container("ddd444", running, "ops", "agent", "main"),
                // Not created by the kubelet (no pod labels), and not in HCS's list anyway.
                Container {
                    id: "fff666".into(),
                    state: running as i32,
                    ..Container::default()
                },
            ],
        )
        .await
        .unwrap();

        // Without CRI, nothing places the containers: every process is the host's.
        let (mut s, metrics) = sampler(source, None);
        let view = s.step(&mut State::default()).await.unwrap();
        assert!(
            view.containers.iter().all(|c| c.pod.is_host()),
            "{:?}",
            view.containers
        );

        s.cri = Some(standin.endpoint());
        let mut state = State::default();
        let view = s.step(&mut state).await.unwrap();
        let expected: Vec<Row> = vec![
            // The host on GPU 0: pid 1200 and pid 4300 (ccc333 has exited as far as the
            // runtime knows). Memory 256 MiB + 2 GiB = 2415919104, shared 16 MiB + 0.
            // 3d engine 0: pid 1200 1M + pid 4300 20M = 21M of 100M; copy engine 2 (4300) 10M;
            // video_decode 25M; cuda went down -> 0.
            (
                PodRef::host(),
                GPU0.into(),
                2_415_919_104,
                16_777_216,
                engines(&[
                    ("3d", 0.21),
                    ("copy", 0.10),
                    ("video_decode", 0.25),
                    ("cuda", 0.0),
                ]),
                2,
            ),
            // pid 4200: 4 GiB, 100 MiB; 3d 30M, copy 5M.
            (
                pod("ml", "infer-7d9", "server"),
                GPU0.into(),
                4_294_967_296,
                104_857_600,
                engines(&[("3d", 0.30), ("copy", 0.05)]),
                1,
            ),
            // pids 4100 + 4101: 8 GiB + 1 GiB, 512 MiB + 0; compute engine 0 80M + 30M
            // capped at 1, copy 2M.
            (
                pod("ml", "train-0", "trainer"),
                GPU1.into(),
                9_663_676_416,
                536_870_912,
                engines(&[("compute", 1.0), ("copy", 0.02)]),
                2,
            ),
            // pid 4400: no memory; its compute counter is new in the later sample -> 0.
            (
                pod("ops", "agent", "main"),
                GPU0.into(),
                0,
                0,
                engines(&[("compute", 0.0)]),
                1,
            ),
        ];
        assert_eq!(rows(&view), expected);
        // dxdp asked for the running containers only.
        let requests = standin.requests();
        assert_eq!(requests.len(), 1);
        let state_filter = requests[0].filter.as_ref().and_then(|f| f.state.as_ref());
        assert_eq!(state_filter.map(|s| s.state), Some(running as i32));

        // The runtime goes away: the last answer is kept, the failure counted.
        standin.stop().await;
        let again = s.step(&mut state).await.unwrap();
        assert_eq!(rows(&again), expected);
        metrics.telemetry().publish(Some(Arc::new(again)));
        let m = samples(&metrics.encode());
        assert_eq!(m["dxdp_telemetry_cri_calls_total{result=\"ok\"}"], "1");
        assert_eq!(m["dxdp_telemetry_cri_calls_total{result=\"error\"}"], "1");
        assert_eq!(
            m[&format!("dxdp_container_gpu_memory_used_bytes{{namespace=\"\",pod=\"\",container=\"\",device=\"{GPU0}\",segment=\"dedicated\"}}")],
            "2415919104"
        );
        assert_eq!(
            m[&format!("dxdp_container_gpu_engine_utilization_ratio{{namespace=\"ops\",pod=\"agent\",container=\"main\",device=\"{GPU0}\",engine=\"compute\"}}")],
            "0.0"
        );
    }

    #[tokio::test]
    async fn pod_info_carries_the_uid_and_allowlisted_labels_from_list_pod_sandbox() {
        use cri_standin::{container, sandbox, CriStandin};
        use dxdp::config::values::PodLabelPattern;
        use dxdp::config::PodLabels;
        use dxdp::kubelet::cri::v1::ContainerState;

        let dir = tempfile::tempdir().unwrap();
        let source: Arc<dyn CounterSource> =
            Arc::new(Recorded::new(&recorded_without_pods(dir.path())));
        let running = ContainerState::ContainerRunning;
        let standin = CriStandin::start(
            &common::local_endpoint(dir.path(), "containerd.sock"),
            vec![
                container("aaa111", running, "ml", "train-0", "trainer"),
                container("bbb222", running, "ml", "infer-7d9", "server"),
                container("ddd444", running, "ops", "agent", "main"),
            ],
        )
        .await
        .unwrap();
        standin.set_sandboxes(vec![
            sandbox(
                "ml",
                "train-0",
                "7c2f0a8e-1111-4a2b-9c3d-000000000002",
                &[
                    ("team", "vision"),
                    ("app.kubernetes.io/name", "trainer"),
                    ("cost-center", "cc-1"),
                    ("cost_center", "cc-9"),
                    ("steam", "not-allowed"),
                ],
            ),
            sandbox(
                "ml",
                "infer-7d9",
                "7c2f0a8e-1111-4a2b-9c3d-000000000001",
                &[("team", "search"), ("pod-template-hash", "7d9")],
            ),
            sandbox(
                "web",
                "render-1",
                "7c2f0a8e-1111-4a2b-9c3d-000000000004",
                &[("team", "web"), ("secret", "x")],
            ),
            // Holds no GPU and uses none: no series.
            sandbox(
                "ml",
                "cpu-only",
                "7c2f0a8e-1111-4a2b-9c3d-000000000005",
                &[("team", "x")],
            ),
        ]);

        // Off by default: no ListPodSandbox call, no series.
        let (mut s, metrics) = sampler(source.clone(), None);
        s.cri = Some(standin.endpoint());
        let mut state = State::default();
        let view = s.step(&mut state).await.unwrap();
        assert!(state.pod_info().is_none());
        assert!(standin.sandbox_requests().is_empty());
        metrics.telemetry().publish(Some(Arc::new(view)));
        metrics.telemetry().publish_pod_info(None, 0);
        let text = metrics.encode();
        assert!(text.contains("dxdp_container_gpu_processes{namespace=\"ml\",pod=\"train-0\""));
        assert!(!text.contains("dxdp_pod_info{"), "{text}");

        // On: podLabels (whole keys; `cost.center` matches both cost-center and cost_center,
        // which give one label name) and podUid.
        let mut config = Config::default();
        config.telemetry.pod_labels = PodLabels::new(&[
            PodLabelPattern("team".into()),
            PodLabelPattern(r"app\.kubernetes\.io/.*".into()),
            PodLabelPattern("cost.center".into()),
        ])
        .unwrap();
        config.telemetry.pod_uid = true;
        s.config = watch::channel(Arc::new(config)).1;
        let expected = [
            "dxdp_pod_info{namespace=\"ml\",pod=\"infer-7d9\",uid=\"7c2f0a8e-1111-4a2b-9c3d-000000000001\",label_team=\"search\"} 1",
            "dxdp_pod_info{namespace=\"ml\",pod=\"train-0\",uid=\"7c2f0a8e-1111-4a2b-9c3d-000000000002\",label_app_kubernetes_io_name=\"trainer\",label_cost_center=\"cc-1\",label_team=\"vision\"} 1",
            // Uses a GPU, but the runtime named no sandbox for it: namespace and pod only.
            "dxdp_pod_info{namespace=\"ops\",pod=\"agent\"} 1",
            "dxdp_pod_info{namespace=\"web\",pod=\"render-1\",uid=\"7c2f0a8e-1111-4a2b-9c3d-000000000004\",label_team=\"web\"} 1",
        ];
        let publish = |view, state: &State| {
            metrics.telemetry().publish(Some(Arc::new(view)));
            let (pods, collisions) = state.pod_info().expect("on");
            metrics.telemetry().publish_pod_info(Some(pods), collisions);
            let text = metrics.encode();
            let lines: Vec<String> = text
                .lines()
                .filter(|l| l.starts_with("dxdp_pod_info{"))
                .map(str::to_string)
                .collect();
            (lines, text)
        };
        let view = s.step(&mut state).await.unwrap();
        let (lines, text) = publish(view, &state);
        assert_eq!(lines, expected, "{text}");
        assert!(
            text.contains("\ndxdp_telemetry_pod_label_collisions 1\n"),
            "{text}"
        );
        let requests = standin.sandbox_requests();
        assert_eq!(requests.len(), 1);
        let state_filter = requests[0].filter.as_ref().and_then(|f| f.state.as_ref());
        assert_eq!(state_filter.map(|s| s.state), Some(0)); // SANDBOX_READY

        // The runtime goes away: the last known pods keep their series.
        standin.stop().await;
        let view = s.step(&mut state).await.unwrap();
        let (lines, text) = publish(view, &state);
        assert_eq!(lines, expected, "{text}");

        // Withdrawn figures take dxdp_pod_info with them.
        metrics.telemetry().publish(None);
        assert!(!metrics.encode().contains("dxdp_pod_info{"));
    }

    struct Failing;

    impl CounterSource for Failing {
        fn describe(&self) -> String {
            "failing".into()
        }
        fn read(&self) -> Result<TelemetryFacts, String> {
            Err("PDH: the GPU Engine counter set does not exist".into())
        }
    }

    #[tokio::test]
    async fn a_failing_source_is_counted_and_the_task_ends_when_cancelled() {
        let (s, metrics) = sampler(Arc::new(Failing), None);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(dxdp::telemetry::sampler::run(s, async {
            let _ = stopped.await;
        }));
        // Wait (bounded) for the first attempt to be counted.
        let mut counted = false;
        for _ in 0..1000 {
            let m = samples(&metrics.encode());
            if m["dxdp_telemetry_samples_total{result=\"error\"}"] == "1" {
                counted = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(counted, "{}", metrics.encode());
        assert!(metrics.telemetry().view().is_none());
        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the sampler ends when cancelled")
            .unwrap();
    }
}

mod top {
    use super::*;

    use std::sync::Arc;

    use dxdp::observe::metrics::Metrics;
    use dxdp::telemetry::scrape::{Options, Scraper};
    use dxdp::telemetry::top;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn the_figures_read_back_from_metrics_give_the_same_table() {
        let v = view();
        let metrics = Metrics::new();
        metrics.telemetry().publish(Some(Arc::new(v.clone())));
        let back = top::view_from_metrics(&metrics.encode());
        assert_eq!(top::text(&back), top::text(&v));
        assert_eq!(back.devices.len(), 2);
        assert_eq!(back.devices[0].engines["3d"], 0.51);
    }

    #[test]
    fn the_table_shows_the_hand_computed_figures() {
        let text = top::text(&view());
        let expected = format!(
            "\
DEVICE                               MODEL            UTILISATION                       MEMORY        PROCS  PODS
{GPU0}  NVIDIA Tesla T4  3d 51% video_decode 25% copy 10%  6.2/15.0 GiB  4      ml/infer-7d9/server, web/render-1/app
{GPU1}  NVIDIA Tesla T4  compute 100% copy 2%              9.0/15.0 GiB  2      ml/train-0/trainer

POD                  DEVICE                               UTILISATION                       MEMORY   PROCS
(host)               {GPU0}  3d 1%                             0.2 GiB  2
ml/infer-7d9/server  {GPU0}  3d 30% copy 5%                    4.0 GiB  1
ml/train-0/trainer   {GPU1}  compute 100% copy 2%              9.0 GiB  2
web/render-1/app     {GPU0}  video_decode 25% 3d 20% copy 10%  2.0 GiB  1
"
        );
        assert_eq!(text, expected);
    }

    #[tokio::test]
    async fn fetch_reads_metrics_over_http() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut request = vec![0u8; 1024];
            let n = conn.read(&mut request).await.unwrap();
            let request = String::from_utf8_lossy(&request[..n]).to_string();
            let body =
                "dxdp_gpu_info{device=\"d\",resource=\"r\",luid=\"l\",model=\"m\"} 1\n# EOF\n";
            let answer = format!(
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(answer.as_bytes()).await.unwrap();
            request
        });
        let plain = Options::default();
        let text = Scraper::new(&address.to_string(), &plain)
            .unwrap()
            .fetch()
            .await
            .unwrap();
        let view = top::view_from_metrics(&text);
        assert_eq!(view.devices[0].device, "d");
        let request = server.await.unwrap();
        assert!(
            request.starts_with("GET /metrics HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(!request.to_ascii_lowercase().contains("authorization"));
        let err = Scraper::new("127.0.0.1:1", &plain)
            .unwrap()
            .fetch()
            .await
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("cannot connect to 127.0.0.1:1: "), "{err}");
    }

    #[test]
    fn dxdp_top_prints_json_for_scripts() {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dxdp"))
            .args(["top", "-o", "json", "--host-snapshot"])
            .arg(common::fixture_path("telemetry-t4"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(doc["kind"], "Top");
        assert_eq!(doc["apiVersion"], "dxdp/v1");
        assert_eq!(doc["windowSeconds"], 10.0);
        assert_eq!(doc["devices"][0]["engines"]["3d"], 0.51);
        assert_eq!(
            doc["devices"][1]["memoryUsed"]["dedicated"],
            9_663_676_416u64
        );
        assert_eq!(doc["devices"][0]["holders"][1]["pod"], "render-1");
        assert_eq!(doc["containers"][0]["pod"], "");
    }
}

#[test]
fn the_telemetry_section_round_trips_through_yaml_and_json() {
    let (facts, telemetry) =
        dxdp_core::snapshot::read_file_full(&common::fixture_path("telemetry-t4")).unwrap();
    let telemetry = telemetry.unwrap();
    for format in [
        dxdp_core::snapshot::Format::Yaml,
        dxdp_core::snapshot::Format::Json,
    ] {
        let text = dxdp_core::snapshot::write_full(&facts, Some(&telemetry), format).unwrap();
        let (back, t) = dxdp_core::snapshot::parse_full(&text, "round trip").unwrap();
        assert_eq!(back, facts);
        assert_eq!(t.as_ref(), Some(&telemetry), "{format}");
    }
    // Errors name the field inside the section.
    let bad = "apiVersion: dxdp/v1alpha1\nkind: HostSnapshot\ntelemetry:\n  samples:\n    - time100ns: 1\n      engines:\n        - {instance: x, runningTime: -5}\n";
    let err = dxdp_core::snapshot::parse(bad, "t.yaml")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("t.yaml:7:") && err.contains("telemetry.samples[0].engines[0].runningTime"),
        "{err}"
    );
}

/// Every series name `/metrics` has with the fixture's figures published, and the series name
/// of every family it declares (a family without series now, such as the isolation audit's
/// violations on a clean node, still exists: `_total` for a counter, the family's name else).
fn series_names() -> std::collections::BTreeSet<String> {
    let metrics = dxdp::observe::metrics::Metrics::new();
    metrics
        .telemetry()
        .publish(Some(std::sync::Arc::new(view())));
    let text = metrics.encode();
    let series = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string);
    let declared = text.lines().filter_map(|l| {
        let mut words = l.strip_prefix("# TYPE ")?.split(' ');
        let (name, kind) = (words.next()?, words.next()?);
        Some(match kind {
            "counter" => format!("{name}_total"),
            _ => name.to_string(),
        })
    });
    series.chain(declared).collect()
}

/// The `dxdp_…` names in a text.
fn referenced(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
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

#[test]
fn the_dashboard_references_only_metrics_that_exist() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/grafana/dxdp-gpu-telemetry.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut exprs = String::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push_str(target["expr"].as_str().unwrap_or_default());
            exprs.push('\n');
        }
    }
    let names = series_names();
    let used = referenced(&exprs);
    assert!(used.len() >= 8, "{used:?}");
    let unknown: Vec<_> = used.difference(&names).collect();
    assert!(
        unknown.is_empty(),
        "{} uses metrics dxdp does not serve: {unknown:?}",
        path.display()
    );
}

#[test]
fn every_telemetry_metric_is_documented_and_the_recipes_use_real_ones() {
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/observability.md"),
    )
    .unwrap();
    let start = page.find("\n## GPU telemetry\n").expect("section");
    let section = &page[start..];
    let section = &section[..section[4..].find("\n## ").map_or(section.len(), |i| i + 4)];
    let names = series_names();
    let served: std::collections::BTreeSet<String> = names
        .iter()
        .filter(|n| {
            n.starts_with("dxdp_gpu_")
                || n.starts_with("dxdp_container_gpu_")
                || n.starts_with("dxdp_telemetry_")
        })
        .map(|n| {
            ["_bucket", "_count", "_sum"]
                .iter()
                .fold(n.clone(), |n, s| {
                    n.strip_suffix(s).map_or(n.clone(), str::to_string)
                })
        })
        .collect();
    for name in &served {
        assert!(
            section.contains(&format!("| `{name}` |")),
            "docs/observability.md#gpu-telemetry lacks a row for {name}"
        );
    }
    let unknown: Vec<_> = referenced(section)
        .into_iter()
        .filter(|n| !names.contains(n) && !served.contains(n))
        .collect();
    assert!(
        unknown.is_empty(),
        "the docs name metrics dxdp does not serve: {unknown:?}"
    );
}

#[tokio::test]
async fn in_the_daemon_the_sampler_follows_the_served_inventory() {
    use std::sync::Arc;

    use dxdp::config::Config;
    use dxdp::telemetry::sampler::State;
    use dxdp::telemetry::sampler::{build, Devices};
    use tokio::sync::watch;

    let path = common::fixture_path("telemetry-t4");
    let (facts, _) = dxdp_core::snapshot::read_file_full(&path).unwrap();
    let (first, _) = dxdp::inventory::build(&facts, Arc::new(Config::default()));
    let (served_tx, inventory) = watch::channel(Arc::new(first));
    let (_, config) = watch::channel(Arc::new(Config::default()));
    let sampler = build(
        Devices::Daemon(inventory),
        config,
        Some(&path),
        std::path::Path::new("/nonexistent/device-plugins"),
        dxdp::observe::metrics::Metrics::new().telemetry().clone(),
    )
    .expect("the snapshot is a source");
    let mut state = State::default();
    let view = sampler.step(&mut state).await.unwrap();
    assert_eq!(view.devices.len(), 2);
    assert_eq!(view.devices[0].resource, "directx.microsoft.com/display");
    // The daemon serves the display resource under another name: the figures follow it.
    let mut served = Config::default();
    served.resources.get_mut(&Resource::Display).unwrap().name = "example.com/gpu".into();
    let (inv, _) = dxdp::inventory::build(&facts, Arc::new(served));
    served_tx.send_replace(Arc::new(inv));
    let view = sampler.step(&mut state).await.unwrap();
    assert_eq!(view.devices.len(), 2);
    assert_eq!(view.devices[0].resource, "example.com/gpu");
    // The recorded allocations are for directx.microsoft.com/display, which is not served now.
    assert!(view.devices.iter().all(|d| d.holders.is_empty()));
}

/// The PodResources stand-in over a real socket on Unix and a real named pipe on Windows (under
/// Wine too), as the kubelet serves it on each: `list` returns what it serves, follows a change,
/// and names the socket when nothing serves it.
#[tokio::test]
async fn list_returns_what_the_standin_serves_over_the_kubelets_kind_of_endpoint() {
    use dxdp::kubelet::podresources::list;
    use dxdp_core::telemetry::PodAllocation;
    use std::time::Duration;
    let allocation = |ns: &str, pod: &str, container: &str, ids: &[&str]| PodAllocation {
        namespace: ns.into(),
        pod: pod.into(),
        container: container.into(),
        resource: "directx.microsoft.com/display".into(),
        device_ids: ids.iter().map(|s| s.to_string()).collect(),
    };
    let dir = tempfile::tempdir().unwrap();
    let endpoint = common::local_endpoint(dir.path(), "kubelet.sock");
    let served = vec![
        allocation("ml", "train-0", "trainer", &["gpu-a"]),
        allocation("ml", "train-0", "sidecar", &["gpu-b-r1"]),
        allocation("web", "render", "app", &["gpu-a-r1", "gpu-b"]),
    ];
    let standin = podresources::PodResourcesStandin::start(&endpoint, served.clone())
        .await
        .unwrap();
    assert_eq!(standin.endpoint(), endpoint);
    let got = list(&standin.endpoint(), Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(got, served);
    standin.set(Vec::new());
    let got = list(&standin.endpoint(), Duration::from_secs(10))
        .await
        .unwrap();
    assert!(got.is_empty());
    standin.stop().await;
    let err = list(&endpoint, Duration::from_secs(10))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot connect") && err.contains("kubelet.sock"),
        "{err}"
    );
}
