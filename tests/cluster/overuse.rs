//! GPU memory over-use (issue 46) on the `telemetry-memshare` fixture: the shares the sampler
//! gives each container, and the daemon end to end (the excess series and one
//! `GPUMemoryOverUse` Event at the API server stand-in). Every expected value is written out by
//! hand from the fixture (its header says who holds what and uses how much).

use crate::apiserver::ApiServerStandin;
use crate::common;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use dxdp::cluster::Cluster;
use dxdp::config::{Config, Inputs};
use dxdp::daemon::{ClusterChoice, Daemon};
use dxdp::kubelet::standin::KubeletStandin;

const GPU0: &str = "pciroot-0-pci-1b00-0540e5ad73bf260f";
const GPU1: &str = "pciroot-0-pci-1c00-ba6abfb666f4630a";
const GIB: u64 = 1 << 30;
/// Generous: these waits are for behaviour, not speed.
const WAIT: Duration = Duration::from_secs(30);

/// The fixture's configuration: the display GPUs shared by memory in 1 GiB units, 1 GiB kept
/// back, sampled every second, with a grace period of one second.
const CONFIG: &str = "resources:
  display:
    memorySharing: {enabled: true, unit: 1Gi, reserve: 1Gi}
telemetry:
  interval: 1s
health:
  memoryOverUse: {gracePeriod: 1s}
";

fn config(dir: &std::path::Path) -> Config {
    let path = dir.join("config.yaml");
    std::fs::write(&path, CONFIG).unwrap();
    Inputs {
        file: Some((path, true)),
        ..Default::default()
    }
    .resolve()
    .unwrap()
    .config
}

#[tokio::test]
async fn each_container_gets_the_units_it_holds_on_each_gpu_as_its_share() {
    use dxdp::telemetry::sampler::{build, Devices, State};
    let dir = tempfile::tempdir().unwrap();
    let config = Arc::new(config(dir.path()));
    let path = common::fixture_path("telemetry-memshare");
    let (facts, _) = dxdp_core::snapshot::read_file_full(&path).unwrap();
    let (inventory, _) = dxdp::inventory::build(&facts, config.clone());
    let (_, inventory) = watch::channel(Arc::new(inventory));
    let (_, config) = watch::channel(config);
    let sampler = build(
        Devices::Daemon(inventory),
        config,
        Some(&path),
        std::path::Path::new("/nonexistent/device-plugins"),
        dxdp::observe::metrics::Metrics::new().telemetry().clone(),
    )
    .expect("the snapshot is a source");
    let view = sampler.step(&mut State::default()).await.unwrap();
    // (namespace/pod, device, dedicated use, share)
    let rows: Vec<(String, String, Option<u64>, Option<u64>)> = view
        .containers
        .iter()
        .map(|c| {
            (
                format!("{}/{}", c.pod.namespace, c.pod.pod),
                c.device.clone(),
                c.memory_used.dedicated,
                c.memory_share,
            )
        })
        .collect();
    let row = |p: &str, d: &str, used: u64, share: Option<u64>| {
        (p.to_string(), d.to_string(), Some(used), share)
    };
    assert_eq!(
        rows,
        [
            row("/", GPU0, 128 << 20, None),
            row("ml/infer-a", GPU0, 3 * GIB, Some(2 * GIB)),
            row("ml/train-c", GPU1, 8 * GIB, Some(8 * GIB)),
            row("web/render-b", GPU0, 3 * GIB / 2, Some(4 * GIB)),
        ]
    );
    // The memory units name their GPUs: each is held, under the memory resource.
    let holders: Vec<(String, usize)> = view
        .devices
        .iter()
        .map(|d| (d.device.clone(), d.holders.len()))
        .collect();
    assert_eq!(holders, [(GPU0.to_string(), 6), (GPU1.to_string(), 8)]);
    assert!(view.devices[0]
        .holders
        .iter()
        .all(|h| h.resource == "directx.microsoft.com/display-memory"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_reports_a_container_over_its_share_once_with_its_excess() {
    let dir = common::socket_tempdir();
    let _kubelet = KubeletStandin::start(common::transport(), dir.path())
        .await
        .unwrap();
    let api = ApiServerStandin::start("gpu-node-1", &[]).await.unwrap();
    let mut pc = common::plugin_config(dir.path());
    pc.config = config(dir.path()).into();
    let observe = pc.observe.clone();
    let snapshot = common::fixture_path("telemetry-memshare");
    let cluster = Cluster::at_url(&api.url(), "gpu-node-1").unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let daemon = tokio::spawn(
        Daemon::new(
            pc,
            Arc::new(dxdp::backend::SnapshotFile::new(snapshot.clone())),
        )
        .cluster(ClusterChoice::Given(Box::new(cluster)))
        .host_snapshot(Some(snapshot))
        .run(async {
            let _ = stopped.await;
        }),
    );
    let over_use = |e: &serde_json::Value| e["reason"] == "GPUMemoryOverUse";
    assert!(
        api.wait_for_state(WAIT, |e, _| e.iter().any(over_use))
            .await,
        "no GPUMemoryOverUse Event: {:?}",
        api.events()
    );
    let events: Vec<serde_json::Value> = api.events().into_iter().filter(over_use).collect();
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["metadata"]["namespace"], "ml");
    assert_eq!(
        e["involvedObject"],
        serde_json::json!({"apiVersion": "v1", "kind": "Pod", "name": "infer-a", "namespace": "ml", "fieldPath": "spec.containers{server}"})
    );
    let message = e["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("container server uses 3 GiB of dedicated memory on GPU {GPU0} (NVIDIA Tesla T4), above its share of 2 GiB by 1 GiB for ")),
        "{message}"
    );
    assert!(
        message.ends_with("its share is in DXDP_GPU_MEMORY_LIMIT_BYTES; see dxdp's docs/health.md#memory-over-use"),
        "{message}"
    );

    // The metrics: the excess of infer-a only, every share, one episode, one Event sent (the
    // Event is counted once the API server has answered: wait for the count).
    let samples = || common::metric_samples(&observe.metrics.encode());
    let sent = "dxdp_memory_overuse_events_total{result=\"sent\"}";
    let deadline = tokio::time::Instant::now() + WAIT;
    while samples()[sent] != "1" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Event is not counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let m = samples();
    let excess: Vec<(&String, &String)> = m
        .iter()
        .filter(|(k, _)| k.starts_with("dxdp_container_gpu_memory_overuse_bytes"))
        .collect();
    let infer_a = format!(
        "dxdp_container_gpu_memory_overuse_bytes{{namespace=\"ml\",pod=\"infer-a\",container=\"server\",device=\"{GPU0}\"}}"
    );
    assert_eq!(excess, [(&infer_a, &"1073741824".to_string())]);
    let share = |ns: &str, pod: &str, container: &str, device: &str| {
        m[&format!("dxdp_container_gpu_memory_share_bytes{{namespace=\"{ns}\",pod=\"{pod}\",container=\"{container}\",device=\"{device}\"}}")].clone()
    };
    assert_eq!(share("ml", "infer-a", "server", GPU0), "2147483648");
    assert_eq!(share("web", "render-b", "app", GPU0), "4294967296");
    assert_eq!(share("ml", "train-c", "trainer", GPU1), "8589934592");
    assert_eq!(m["dxdp_memory_overuse_episodes_total"], "1");

    // Three more samples of the same over-use: the same episode, no second Event.
    let ok = "dxdp_telemetry_samples_total{result=\"ok\"}";
    let seen: f64 = m[ok].parse().unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while samples()[ok].parse::<f64>().unwrap() < seen + 3.0 {
        assert!(tokio::time::Instant::now() < deadline, "no more samples");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let m = samples();
    assert_eq!(m["dxdp_memory_overuse_episodes_total"], "1");
    assert_eq!(m[&infer_a], "1073741824");
    assert_eq!(api.events().iter().filter(|e| over_use(e)).count(), 1);
    assert_eq!(m[sent], "1");
    // Memory units are allocations of their GPU: no isolation violation (isolation.events is on
    // by default), no Event but the over-use.
    assert!(
        !m.keys()
            .any(|k| k.starts_with("dxdp_isolation_violations{")),
        "{m:?}"
    );
    assert_eq!(api.events().len(), 1, "{:?}", api.events());

    let _ = stop.send(());
    daemon.await.unwrap().unwrap();
}

/// `dxdp top` and `dxdp audit` on the fixture: each container's share beside its use, in the
/// table and in `-o json`.
#[test]
fn top_and_audit_show_the_share_beside_the_use() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let dxdp = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dxdp"))
            .args(args)
            .arg("--config")
            .arg(&config)
            .arg("--host-snapshot")
            .arg(common::fixture_path("telemetry-memshare"))
            .env_clear()
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let table = dxdp(&["top"]);
    let rows: Vec<&str> = table
        .lines()
        .skip_while(|l| !l.starts_with("POD"))
        .map(str::trim_end)
        .collect();
    assert_eq!(
        rows[0],
        "POD                 DEVICE                               UTILISATION  MEMORY   SHARE          PROCS"
    );
    assert_eq!(
        rows[2],
        format!("ml/infer-a/server   {GPU0}  compute 40%  3.0 GiB  2.0 GiB, over  1")
    );
    assert_eq!(
        rows[4],
        format!("web/render-b/app    {GPU0}  3d 20%       1.5 GiB  4.0 GiB        1")
    );
    let doc: serde_json::Value = serde_json::from_str(&dxdp(&["top", "-o", "json"])).unwrap();
    let shares: Vec<serde_json::Value> = doc["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["memoryShare"].clone())
        .collect();
    assert_eq!(
        shares,
        [
            serde_json::Value::Null,
            serde_json::json!(2 * GIB),
            serde_json::json!(8 * GIB),
            serde_json::json!(4 * GIB)
        ]
    );

    let audit = dxdp(&["audit"]);
    assert!(
        audit.contains(&format!("{GPU0} (3.0 of 2.0 GiB share, over)")),
        "{audit}"
    );
    assert!(
        audit.contains(&format!("{GPU1} (8.0 of 8.0 GiB share)")),
        "{audit}"
    );
    let doc: serde_json::Value = serde_json::from_str(&dxdp(&["audit", "-o", "json"])).unwrap();
    let infer_a = &doc["node"]["containers"][0];
    assert_eq!(infer_a["pod"], "infer-a");
    assert_eq!(infer_a["verdict"], "ok");
    assert_eq!(infer_a["used"][0]["memoryUsed"], 3 * GIB);
    assert_eq!(infer_a["used"][0]["memoryShare"], 2 * GIB);
}
