//! Issue 45 items 1 and 2: the GPUs' sensors of a host snapshot (`telemetry-sensors`) replayed
//! end to end: the figures, the daemon's `/metrics`, `dxdp top` against it, and the `thermal`
//! health signal making the hot GPU Unhealthy until it cools. Every expected value is written
//! out by hand from the fixture (its header comment shows the arithmetic).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use dxdp::backend::SnapshotFile;
use dxdp::config::{Config, Inputs};
use dxdp_core::pipeline::{discover, PipelineConfig};
use dxdp_core::telemetry::compute::{compute, device_refs};
use dxdp_core::telemetry::sensors::{ClockFigure, Figure, SensorSource, SensorView};

use crate::common;

const GPU0: &str = "pciroot-0-pci-1b00-0540e5ad73bf260f";
const GPU1: &str = "pciroot-0-pci-1c00-ba6abfb666f4630a";
const DISPLAY: &str = "directx.microsoft.com/display";
/// How long the daemon may take to sample (its first sample is 2 s after start).
const WAIT: Duration = Duration::from_secs(30);

fn fixture() -> PathBuf {
    common::fixture_path("telemetry-sensors")
}

fn figure(value: f64, source: SensorSource) -> Option<Figure> {
    Some(Figure { value, source })
}

fn clock(domain: &str, hertz: f64, max: Option<f64>, source: SensorSource) -> ClockFigure {
    ClockFigure {
        domain: domain.into(),
        hertz,
        max_hertz: max,
        source,
    }
}

#[test]
fn each_figure_comes_from_the_first_source_that_reports_it() {
    use SensorSource::*;
    let (facts, telemetry) = dxdp_core::snapshot::read_file_full(&fixture()).unwrap();
    let telemetry = telemetry.unwrap();
    let discovery = discover(&facts, &PipelineConfig::default());
    let devices = device_refs(&discovery, |r| Some(r.default_resource_name().to_string()));
    let view = compute(&devices, &telemetry, &HashMap::new(), &[]);
    assert_eq!(
        view.devices[0].sensors,
        SensorView {
            temperature_celsius: figure(82.0, Nvml),
            temperature_margin_celsius: figure(4.0, Nvml),
            power_ratio: figure(0.975, D3dkmt),
            power_watts: figure(68.25, Nvml),
            power_limit_watts: figure(70.0, Nvml),
            fan_rpm: None,
            clocks: vec![
                clock("graphics", 1_590_000_000.0, Some(1_590_000_000.0), Nvml),
                clock("memory", 5_001_000_000.0, Some(5_001_000_000.0), Nvml),
                clock("sm", 1_590_000_000.0, None, Nvml),
            ],
            throttle_reasons: vec!["sw_power_cap".into(), "sw_thermal_slowdown".into()],
            throttle_source: Some(Nvml),
        }
    );
    assert_eq!(
        view.devices[1].sensors,
        SensorView {
            temperature_celsius: figure(55.4, D3dkmt),
            temperature_margin_celsius: figure(29.6, D3dkmt),
            power_ratio: figure(0.312, D3dkmt),
            clocks: vec![clock("memory", 5_001_000_000.0, None, D3dkmt)],
            ..SensorView::default()
        }
    );
    // The thermal signal: GPU 0 is within 5 °C and NVML names a thermal reason; GPU 1 is not.
    let hot: Vec<Option<String>> = view
        .devices
        .iter()
        .map(|d| dxdp_core::health::thermal(&d.sensors, 5))
        .collect();
    assert_eq!(
        hot,
        [
            Some("temperature 4.0 °C below the warning temperature, within health.thermal.marginCelsius 5 (nvml); clocks held down for sw_thermal_slowdown (nvml)".to_string()),
            None
        ]
    );
}

async fn metrics(addr: SocketAddr) -> std::collections::BTreeMap<String, String> {
    let (status, _, body) = common::http(addr, "GET", "/metrics").await;
    assert_eq!(status, 200, "{body}");
    common::metric_samples(&body)
}

/// Scrapes until `done` holds for the samples (bounded by [`WAIT`]); returns them.
async fn until(
    addr: SocketAddr,
    what: &str,
    done: impl Fn(&std::collections::BTreeMap<String, String>) -> bool,
) -> std::collections::BTreeMap<String, String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let m = metrics(addr).await;
        if done(&m) {
            return m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {WAIT:?}: {m:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn health(device: &str, reason: &str) -> String {
    format!("dxdp_device_health{{device=\"{device}\",resource=\"{DISPLAY}\",reason=\"{reason}\"}}")
}

fn config(dir: &Path, yaml: &str) -> Config {
    let path = dir.join("config.yaml");
    std::fs::write(&path, yaml).unwrap();
    Inputs {
        file: Some((path, true)),
        ..Default::default()
    }
    .resolve()
    .unwrap()
    .config
}

fn top(addr: SocketAddr, format: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dxdp"))
        .args(["top", "--endpoint", &addr.to_string()])
        .args(format)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_snapshot_shows_its_sensors_in_metrics_and_top_and_a_hot_gpu_is_unhealthy_until_it_cools(
) {
    let dir = tempfile::Builder::new()
        .prefix("dxdp")
        .tempdir_in(common::socket_tempdir_base())
        .unwrap();
    let snapshot = dir.path().join("host.yaml");
    let recorded = std::fs::read_to_string(fixture()).unwrap();
    std::fs::write(&snapshot, &recorded).unwrap();
    let mut config = config(
        dir.path(),
        "telemetry:\n  interval: 1s\nhealth:\n  signals:\n    thermal: {action: unhealthy_until_cleared}\n",
    );
    config.metrics_address = Some("127.0.0.1:0".parse().unwrap());
    let mut pc = common::plugin_config(dir.path());
    pc.config = config.into();
    let observe = pc.observe.clone();
    let mut listening = observe.listening();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let daemon = dxdp::daemon::Daemon::new(pc, Arc::new(SnapshotFile::new(snapshot.clone())))
        .host_snapshot(Some(snapshot.clone()));
    let task = tokio::spawn(daemon.run(async {
        let _ = stopped.await;
    }));
    let addr = tokio::time::timeout(WAIT, listening.wait_for(|a| a.is_some()))
        .await
        .expect("the endpoint listens")
        .unwrap()
        .unwrap();

    // The hot GPU 0 becomes Unhealthy (thermal) once a sample judged it.
    let m = until(addr, "GPU 0 Unhealthy for heat", |m| {
        m.contains_key(&health(GPU0, "thermal"))
    })
    .await;
    let dev0 = format!("device=\"{GPU0}\",resource=\"{DISPLAY}\",luid=\"0x00000000_0x006B8B86\"");
    let dev1 = format!("device=\"{GPU1}\",resource=\"{DISPLAY}\",luid=\"0x00000000_0x006B9126\"");
    let expected = [
        (
            format!("dxdp_gpu_temperature_celsius{{{dev0},source=\"nvml\"}}"),
            "82.0",
        ),
        (
            format!("dxdp_gpu_temperature_margin_celsius{{{dev0},source=\"nvml\"}}"),
            "4.0",
        ),
        (
            format!("dxdp_gpu_power_ratio{{{dev0},source=\"d3dkmt\"}}"),
            "0.975",
        ),
        (
            format!("dxdp_gpu_power_watts{{{dev0},source=\"nvml\"}}"),
            "68.25",
        ),
        (
            format!("dxdp_gpu_power_limit_watts{{{dev0},source=\"nvml\"}}"),
            "70.0",
        ),
        (
            format!("dxdp_gpu_clock_hertz{{{dev0},domain=\"graphics\",source=\"nvml\"}}"),
            "1590000000.0",
        ),
        (
            format!("dxdp_gpu_clock_max_hertz{{{dev0},domain=\"graphics\",source=\"nvml\"}}"),
            "1590000000.0",
        ),
        (
            format!("dxdp_gpu_clock_hertz{{{dev0},domain=\"memory\",source=\"nvml\"}}"),
            "5001000000.0",
        ),
        (
            format!("dxdp_gpu_clock_hertz{{{dev0},domain=\"sm\",source=\"nvml\"}}"),
            "1590000000.0",
        ),
        (
            format!("dxdp_gpu_throttled{{{dev0},reason=\"sw_power_cap\",source=\"nvml\"}}"),
            "1",
        ),
        (
            format!("dxdp_gpu_throttled{{{dev0},reason=\"sw_thermal_slowdown\",source=\"nvml\"}}"),
            "1",
        ),
        (
            format!("dxdp_gpu_temperature_celsius{{{dev1},source=\"d3dkmt\"}}"),
            "55.4",
        ),
        (
            format!("dxdp_gpu_temperature_margin_celsius{{{dev1},source=\"d3dkmt\"}}"),
            "29.6",
        ),
        (
            format!("dxdp_gpu_power_ratio{{{dev1},source=\"d3dkmt\"}}"),
            "0.312",
        ),
        (
            format!("dxdp_gpu_clock_hertz{{{dev1},domain=\"memory\",source=\"d3dkmt\"}}"),
            "5001000000.0",
        ),
        (format!("dxdp_gpu_thermal{{{dev0}}}"), "1"),
        (health(GPU0, "thermal"), "1"),
        (health(GPU1, "healthy"), "1"),
        (
            format!("dxdp_gpu_faults_total{{device=\"{GPU0}\",kind=\"thermal\"}}"),
            "1",
        ),
    ];
    for (series, value) in &expected {
        assert_eq!(
            m.get(series).map(String::as_str),
            Some(*value),
            "{series} in {m:#?}"
        );
    }
    // Absent, never 0: no fan on either GPU (GPU 1's recorded 0 included), no watts on GPU 1,
    // no sensor series but these.
    let sensor_series: Vec<&String> = m
        .keys()
        .filter(|k| {
            [
                "dxdp_gpu_temperature",
                "dxdp_gpu_power",
                "dxdp_gpu_clock",
                "dxdp_gpu_fan",
                "dxdp_gpu_throttled",
            ]
            .iter()
            .any(|p| k.starts_with(p))
        })
        .collect();
    assert_eq!(sensor_series.len(), 16, "{sensor_series:#?}");
    assert!(!m.keys().any(|k| k.starts_with("dxdp_gpu_fan_rpm")));

    // `dxdp top` against the daemon: the same figures.
    let doc: serde_json::Value = serde_json::from_str(&top(addr, &["-o", "json"])).unwrap();
    let s0 = &doc["devices"][0]["sensors"];
    assert_eq!(
        s0["temperatureCelsius"],
        serde_json::json!({"value": 82.0, "source": "nvml"})
    );
    assert_eq!(s0["temperatureMarginCelsius"]["value"], 4.0);
    assert_eq!(s0["powerWatts"]["value"], 68.25);
    assert_eq!(s0["powerLimitWatts"]["value"], 70.0);
    assert_eq!(
        s0["powerRatio"],
        serde_json::json!({"value": 0.975, "source": "d3dkmt"})
    );
    assert_eq!(
        s0["clocks"][0],
        serde_json::json!({"domain": "graphics", "hertz": 1_590_000_000.0, "maxHertz": 1_590_000_000.0, "source": "nvml"})
    );
    assert_eq!(
        s0["throttleReasons"],
        serde_json::json!(["sw_power_cap", "sw_thermal_slowdown"])
    );
    assert_eq!(doc["devices"][0]["health"], "thermal");
    let s1 = &doc["devices"][1]["sensors"];
    assert_eq!(s1["temperatureCelsius"]["value"], 55.4);
    assert!(s1.get("fanRpm").is_none(), "{s1}");
    assert!(s1.get("powerWatts").is_none(), "{s1}");
    let text = top(addr, &[]);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].ends_with("TEMP    MARGIN  POWER        HEALTH"),
        "{text}"
    );
    assert!(
        lines[1].ends_with("82.0°C  4.0°C   68.2/70.0 W  thermal"),
        "{text}"
    );
    assert!(
        lines[2].ends_with("55.4°C  29.6°C  31%          healthy"),
        "{text}"
    );

    // GPU 0 cools (70.0 °C, only the power cap): Healthy again, the episode counted once.
    let cooler = recorded
        .replace("temperatureDecidegrees: 820", "temperatureDecidegrees: 700")
        .replace(
            "throttleReasons: [sw_power_cap, sw_thermal_slowdown]",
            "throttleReasons: [sw_power_cap]",
        );
    assert_ne!(cooler, recorded);
    let tmp = snapshot.with_extension("tmp");
    std::fs::write(&tmp, &cooler).unwrap();
    std::fs::rename(&tmp, &snapshot).unwrap();
    let m = until(addr, "GPU 0 Healthy again", |m| {
        m.contains_key(&health(GPU0, "healthy"))
    })
    .await;
    assert_eq!(
        m.get(&format!(
            "dxdp_gpu_temperature_margin_celsius{{{dev0},source=\"nvml\"}}"
        ))
        .map(String::as_str),
        Some("16.0")
    );
    assert_eq!(
        m.get(&format!(
            "dxdp_gpu_faults_total{{device=\"{GPU0}\",kind=\"thermal\"}}"
        ))
        .map(String::as_str),
        Some("1")
    );
    assert!(
        !m.keys().any(|k| k.starts_with("dxdp_gpu_thermal")),
        "{m:#?}"
    );
    let _ = stop.send(());
    tokio::time::timeout(WAIT, task)
        .await
        .expect("the daemon stops")
        .unwrap()
        .unwrap();
}
