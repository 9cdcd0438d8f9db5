//! Device health an operator can act on (issue 31; issue 34 item 4): fault events recorded in a
//! host snapshot, judged under the default and an operator's policy, the metrics, and the log
//! lines. Every expected value is worked out by hand from the fixtures (the times and devices
//! are written in the comments).

use crate::common;

use crate::podresources;

use std::collections::BTreeSet;
use std::sync::Arc;

use dxdp::config::{Config, Inputs};
use dxdp::inventory::build_at;
use dxdp::observe::metrics::Metrics;
use dxdp::plugin::refresher::{count_faults, device_health};
use dxdp_core::health::reason::Reason;

/// The four T4s of `nvidia-multi-gpu` (and of `health/tdr-storm`).
const T4S: [&str; 4] = [
    "pciroot-0-pci-1b00-0540e5ad73bf260f",
    "pciroot-0-pci-1c00-ba6abfb666f4630a",
    "pciroot-0-pci-1d00-99a65d9b8c3e813d",
    "pciroot-0-pci-1e00-4ed067a47f740fc8",
];

/// 2026-11-25T00:00:00Z in ms (`date -u -d 2026-11-25 +%s` = 1795564800).
const DAY: u64 = 1_795_564_800_000;
const fn at(h: u64, m: u64, s: u64, ms: u64) -> u64 {
    DAY + ((h * 60 + m) * 60 + s) * 1000 + ms
}
/// The three nvlddmkm resets of the fixture: 21:40:12.512, 21:44:12.512, 21:49:12.512.
const RESET_3: u64 = at(21, 49, 12, 512);

fn config(yaml: &str) -> Config {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, yaml).unwrap();
    Inputs {
        file: Some((path, true)),
        ..Default::default()
    }
    .resolve()
    .unwrap()
    .config
}

fn reasons(inv: &dxdp::inventory::Inventory) -> Vec<(String, Reason)> {
    inv.discovery
        .devices
        .iter()
        .map(|d| (d.id.clone(), d.health.code))
        .collect()
}

fn all(reason: Reason) -> Vec<(String, Reason)> {
    T4S.iter().map(|d| (d.to_string(), reason)).collect()
}

/// `tdr` as by default, but charged to every device of the vendor when event 4101 cannot tell
/// them apart (`ambiguous: all_of_vendor`, what dxdp did before issue 44).
const ALL_OF_VENDOR: &str = "health:\n  signals:\n    tdr: {action: unhealthy_for, for: 10m, count: 3, window: 10m, ambiguous: all_of_vendor}\n";

/// Issue 44 item 7: the three `nvlddmkm` resets of a node with four T4s name no adapter, so by
/// default they are charged to none of the four: counted (`device="unmatched"`), every T4 stays
/// Healthy.
#[test]
fn resets_that_cannot_say_which_of_four_gpus_leave_all_four_healthy_by_default() {
    let facts = common::facts("health/tdr-storm");
    let (inv, _) = build_at(&facts, Arc::new(Config::default()), at(21, 55, 0, 0));
    assert_eq!(reasons(&inv), all(Reason::Healthy));
    assert_eq!(inv.next_health_change_ms, None);
    // The three resets (21:40:12, 21:44:12, 21:49:12) may be about any of the four T4s.
    let nvidia: Vec<&dxdp_core::health::Hit> = inv
        .faults
        .iter()
        .filter(|h| h.event.detail.contains("nvlddmkm"))
        .collect();
    assert_eq!(nvidia.len(), 3);
    for hit in nvidia {
        assert!(hit.devices.is_empty());
        assert_eq!(hit.ambiguous, T4S);
    }
    let metrics = Metrics::new();
    let mut seen = BTreeSet::new();
    count_faults(&inv, &mut seen, &metrics);
    let m = common::metric_samples(&metrics.encode());
    // Three nvlddmkm resets and the ContosoKmd reset.
    assert_eq!(
        m["dxdp_gpu_faults_total{device=\"unmatched\",kind=\"tdr\"}"],
        "4"
    );
    for d in T4S {
        let key = format!("dxdp_gpu_faults_total{{device=\"{d}\",kind=\"tdr\"}}");
        assert!(!m.contains_key(&key), "{key}");
    }
}

#[test]
fn three_resets_within_ten_minutes_make_every_nvidia_device_unhealthy_for_ten_minutes() {
    let facts = common::facts("health/tdr-storm");
    let config = Arc::new(config(ALL_OF_VENDOR));
    // Before the third reset: two within the window, Healthy.
    let (inv, notices) = build_at(&facts, config.clone(), RESET_3 - 1);
    assert!(
        !notices.iter().any(|n| n.starts_with("event-log")),
        "{notices:?}"
    );
    assert_eq!(reasons(&inv), all(Reason::Healthy));
    // At the third: Unhealthy (tdr) until 21:59:12.512.
    let (inv, _) = build_at(&facts, config.clone(), RESET_3);
    assert_eq!(reasons(&inv), all(Reason::Tdr));
    assert_eq!(inv.next_health_change_ms, Some(at(21, 59, 12, 512)));
    assert_eq!(
        inv.discovery.devices[0].health.reason.as_deref(),
        Some("display driver \"nvlddmkm\" stopped responding and was reset (event 4101); 3 such event(s), Unhealthy since 2026-11-25T21:49:12Z until 2026-11-25T21:59:12Z")
    );
    let (inv, _) = build_at(&facts, config.clone(), at(21, 59, 12, 511));
    assert_eq!(reasons(&inv), all(Reason::Tdr));
    // Ten minutes after the third reset: Healthy again, nothing more to wait for.
    let (inv, _) = build_at(&facts, config, at(21, 59, 12, 512));
    assert_eq!(reasons(&inv), all(Reason::Healthy));
    assert_eq!(inv.next_health_change_ms, None);
}

#[test]
fn an_operator_policy_overrides_and_ignores_signals() {
    let facts = common::facts("health/tdr-storm");
    // Until cleared: still Unhealthy a day later.
    let c = config(
        "health:\n  signals:\n    tdr: {action: unhealthy_until_cleared, count: 3, window: 10m, ambiguous: all_of_vendor}\n",
    );
    let (inv, _) = build_at(&facts, Arc::new(c), RESET_3 + 86_400_000);
    assert_eq!(reasons(&inv), all(Reason::Tdr));
    assert_eq!(inv.next_health_change_ms, None);
    // Four resets needed: never Unhealthy.
    let c = config(
        "health:\n  signals:\n    tdr: {action: unhealthy_for, for: 15m, count: 4, window: 10m, ambiguous: all_of_vendor}\n",
    );
    let (inv, _) = build_at(&facts, Arc::new(c), RESET_3);
    assert_eq!(reasons(&inv), all(Reason::Healthy));
    // Every reset, for 2 minutes: the first makes them Unhealthy from 21:40:12 to 21:42:12.
    let c = config("health:\n  signals:\n    tdr: {action: unhealthy_for, for: 2m, ambiguous: all_of_vendor}\n");
    let (inv, _) = build_at(&facts, Arc::new(c.clone()), at(21, 42, 12, 511));
    assert_eq!(reasons(&inv), all(Reason::Tdr));
    let (inv, _) = build_at(&facts, Arc::new(c), at(21, 42, 12, 512));
    assert_eq!(reasons(&inv), all(Reason::Healthy));
    // Ignored: no fault is even recorded.
    let c = config("health:\n  ignore: [tdr, live_kernel_event]\n");
    let (inv, _) = build_at(&facts, Arc::new(c), RESET_3);
    assert_eq!(reasons(&inv), all(Reason::Healthy));
    assert!(inv.faults.is_empty());
}

#[test]
fn the_metrics_show_every_reason_and_count_each_fault_once() {
    let facts = common::facts("health/tdr-storm");
    let c = Arc::new(config(ALL_OF_VENDOR));
    // After every event of the fixture (the last: ContosoKmd at 21:52:40), within the spell.
    let (inv, _) = build_at(&facts, c.clone(), at(21, 55, 0, 0));
    let metrics = Metrics::new();
    metrics.device_health().set_current(device_health(&inv));
    let mut seen = BTreeSet::new();
    count_faults(&inv, &mut seen, &metrics);
    // The same events again (a rebuild): not counted twice.
    count_faults(&inv, &mut seen, &metrics);
    let m = common::metric_samples(&metrics.encode());
    for d in T4S {
        assert_eq!(
            m[&format!("dxdp_device_health{{device=\"{d}\",resource=\"directx.microsoft.com/display\",reason=\"tdr\"}}")],
            "1"
        );
        assert_eq!(
            m[&format!("dxdp_gpu_faults_total{{device=\"{d}\",kind=\"tdr\"}}")],
            "3",
            "three nvlddmkm resets"
        );
    }
    // The ContosoKmd reset and the WER report name no device of this host.
    assert_eq!(
        m["dxdp_gpu_faults_total{device=\"unmatched\",kind=\"tdr\"}"],
        "1"
    );
    assert_eq!(
        m["dxdp_gpu_faults_total{device=\"unmatched\",kind=\"live_kernel_event\"}"],
        "1"
    );
    let health: Vec<&String> = m
        .keys()
        .filter(|k| k.starts_with("dxdp_device_health{"))
        .collect();
    assert_eq!(health.len(), 4, "one series per device: {health:?}");
    // Healthy again later: the series says so.
    let (inv, _) = build_at(&facts, c, at(22, 0, 0, 0));
    metrics.device_health().set_current(device_health(&inv));
    let m = common::metric_samples(&metrics.encode());
    assert_eq!(
        m[&format!("dxdp_device_health{{device=\"{}\",resource=\"directx.microsoft.com/display\",reason=\"healthy\"}}", T4S[0])],
        "1"
    );
}

#[test]
fn a_record_that_cannot_be_read_is_a_notice_not_a_failure() {
    let mut facts = common::facts("health/tdr-storm");
    facts.faults.push(dxdp_core::facts::LogRecord {
        xml: "<Event><System></System></Event>".into(),
    });
    let (inv, notices) = build_at(&facts, Arc::new(config(ALL_OF_VENDOR)), RESET_3);
    assert_eq!(reasons(&inv), all(Reason::Tdr));
    let about_events: Vec<&String> = notices
        .iter()
        .filter(|n| n.starts_with("event-log"))
        .collect();
    assert_eq!(
        about_events,
        ["event-log record faults[5] is not read: no System/Provider/@Name"]
    );
}

/// Issue 34 item 4: `dxdp plugin --host-snapshot tests/fixtures/broken-drivers.yaml` names the
/// two broken T4s at start: LUID 1001 (Code 43, at PCI 1B00) and LUID 1002 (a driver update,
/// at PCI 1C00).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_logs_every_unhealthy_device_at_start_with_its_reason() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    if !common::af_unix("the_daemon_logs_every_unhealthy_device_at_start_with_its_reason") {
        return;
    }
    let dir = common::socket_tempdir();
    let bin =
        std::env::var_os("DXDP_TEST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_dxdp").into());
    let mut child = tokio::process::Command::new(bin)
        .args(["plugin", "--kubelet-dir"])
        .arg(dir.path())
        .arg("--host-snapshot")
        .arg(common::fixture_path("broken-drivers"))
        .env_clear()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut want = vec![
        (
            "pciroot-0-pci-1b00-0540e5ad73bf260f",
            "problem_code",
            "problem code 43",
        ),
        (
            "pciroot-0-pci-1c00-ba6abfb666f4630a",
            "driver_update",
            "driver update in progress",
        ),
    ];
    let mut seen = Vec::new();
    let found = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            seen.push(line.clone());
            want.retain(|(id, reason, text)| {
                !(line.contains("device is Unhealthy")
                    && line.contains(id)
                    && line.contains(reason)
                    && line.contains(text))
            });
            if want.is_empty() {
                return true;
            }
        }
        false
    })
    .await;
    common::terminate(&mut child, std::time::Duration::from_secs(20)).await;
    assert_eq!(found, Ok(true), "missing {want:?} in:\n{}", seen.join("\n"));
    // The summary line counts them.
    assert!(
        seen.iter().any(|l| l.contains("serving")
            && l.contains("resource=directx.microsoft.com/display")
            && l.contains("devices=4")
            && l.contains("unhealthy=2")),
        "{seen:?}"
    );
    // Healthy devices get no such line.
    assert!(
        !seen
            .iter()
            .any(|l| l.contains("device is Unhealthy") && l.contains("reason=healthy")),
        "{seen:?}"
    );
}

/// Issue 31 item 3 (KEP-4680): the second T4 (PCI 1C00) leaves the host while pod ml/train-0
/// holds its second replica. The kubelet keeps seeing both of its replicas, Unhealthy, while
/// PodResources shows the holder, and neither once the pod is gone; the other T4s stay Healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_device_that_left_the_host_stays_unhealthy_until_no_pod_holds_it() {
    use dxdp::kubelet::standin::KubeletStandin;
    use dxdp::transport::Endpoint;
    use dxdp_core::telemetry::PodAllocation;
    use podresources::PodResourcesStandin;
    use std::time::Duration;
    const DISPLAY: &str = "directx.microsoft.com/display";
    const WAIT: Duration = Duration::from_secs(10);
    if !common::af_unix("a_held_device_that_left_the_host_stays_unhealthy_until_no_pod_holds_it") {
        return;
    }
    let dir = common::socket_tempdir();
    let snapshot = dir.path().join("host.yaml");
    let mut facts = common::facts("nvidia-multi-gpu");
    common::write_facts(&snapshot, &facts);
    let pr_socket = dir.path().join("pod-resources.sock");
    let holder = PodAllocation {
        namespace: "ml".into(),
        pod: "train-0".into(),
        container: "main".into(),
        resource: DISPLAY.into(),
        device_ids: vec![format!("{}-r1", T4S[1])],
    };
    let pod_resources =
        PodResourcesStandin::start(&Endpoint::Socket(pr_socket.clone()), vec![holder])
            .await
            .unwrap();
    let kubelet = KubeletStandin::start(common::transport(), dir.path())
        .await
        .unwrap();
    let mut config = Config::default().with_replicas(2);
    config.telemetry.pod_resources_endpoint = Some(Endpoint::Socket(pr_socket.clone()));
    let mut plugin_config = common::plugin_config(dir.path());
    plugin_config.config = config.clone().into();
    let observe = plugin_config.observe.clone();
    let (_keep, updates) = tokio::sync::watch::channel(Arc::new(config));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let daemon = tokio::spawn(
        dxdp::daemon::Daemon::new(
            plugin_config,
            Arc::new(dxdp::backend::SnapshotFile::new(snapshot.clone())),
        )
        .updates(updates)
        .run(async {
            let _ = stopped.await;
        }),
    );
    // health of every advertised ID, in the kubelet's view
    let health = |v: &dxdp::kubelet::standin::StandinView| -> Vec<(String, String)> {
        v.devices(DISPLAY)
            .unwrap_or_default()
            .iter()
            .map(|d| (d.id.clone(), d.health.clone()))
            .collect()
    };
    let expect = |removed: Option<&str>| -> Vec<(String, String)> {
        let mut out = Vec::new();
        for d in T4S {
            if removed == Some("gone") && d == T4S[1] {
                continue;
            }
            let h = if removed == Some("held") && d == T4S[1] {
                "Unhealthy"
            } else {
                "Healthy"
            };
            out.push((d.to_string(), h.to_string()));
            out.push((format!("{d}-r1"), h.to_string()));
        }
        out.sort();
        out
    };
    let sorted = |mut v: Vec<(String, String)>| {
        v.sort();
        v
    };
    assert!(
        kubelet
            .wait_for(WAIT, |v| sorted(health(v)) == expect(None))
            .await,
        "{:#?}",
        health(&kubelet.view())
    );
    // The 1C00 adapter leaves the host.
    let at = facts
        .adapters
        .iter()
        .position(|a| {
            a.pnp
                .as_ref()
                .is_some_and(|p| p.location_paths.iter().any(|l| l.contains("PCI(1C00)")))
        })
        .unwrap();
    facts.adapters.remove(at);
    common::write_facts(&snapshot, &facts);
    assert!(
        kubelet
            .wait_for(WAIT, |v| sorted(health(v)) == expect(Some("held")))
            .await,
        "{:#?}",
        health(&kubelet.view())
    );
    let series = format!(
        "dxdp_device_health{{device=\"{}\",resource=\"{DISPLAY}\",reason=\"removed\"}} 1",
        T4S[1]
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    while !observe.metrics.encode().lines().any(|l| l == series) {
        assert!(tokio::time::Instant::now() < deadline, "no {series}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The pod ends; the next rebuild (here: the snapshot written again) drops the device.
    pod_resources.set(Vec::new());
    common::write_facts(&snapshot, &facts);
    assert!(
        kubelet
            .wait_for(WAIT, |v| sorted(health(v)) == expect(Some("gone")))
            .await,
        "{:#?}",
        health(&kubelet.view())
    );
    let _ = stop.send(());
    tokio::time::timeout(WAIT, daemon)
        .await
        .expect("plugin stops")
        .unwrap()
        .unwrap();
    kubelet.stop().await;
    pod_resources.stop().await;
}

use crate::eventlog as eventlog_support;

/// Issue 31 item 5: what `dxdp snapshot` records from the event log (here a stand-in holding
/// the recorded `EvtRender` output of `crates/dxdp-core/src/health/events/`, in the order the
/// log returns them, with a duplicate and an event that is no fault) is written in `faults`,
/// read back unchanged, and replayed: the one `nvlddmkm` reset (21:40:12.512) makes the four
/// T4s Unhealthy for 15 minutes under `tdr: {action: unhealthy_for, for: 15m, ambiguous:
/// all_of_vendor}`.
#[test]
fn recorded_fault_events_replay_as_the_daemon_judges_them() {
    const DIR: &str = "crates/dxdp-core/src/health/events";
    let read = |name: &str| {
        std::fs::read_to_string(format!("{}/{DIR}/{name}", env!("CARGO_MANIFEST_DIR")))
            .unwrap()
            .trim_end()
            .to_string()
    };
    let tdr = read("display-4101-nvlddmkm.xml");
    let unknown = read("display-4101-unknown-driver.xml");
    let wer = read("wer-1001-livekernelevent-141.xml");
    let scm = read("scm-7036-not-a-fault.xml");
    let log = eventlog_support::ScriptedLog::delivering(vec![
        unknown.clone(),
        scm,
        tdr.clone(),
        wer.clone(),
        tdr.clone(),
    ]);
    let (records, skipped) = dxdp::backend::eventlog::recent_faults(
        log.as_ref(),
        std::time::Duration::from_secs(86_400),
    )
    .unwrap();
    assert_eq!(skipped, 1, "the Service Control Manager event");
    // Oldest first: 21:40:12.512, 21:40:19.041, 21:52:40.
    let xmls: Vec<&str> = records.iter().map(|r| r.xml.as_str()).collect();
    assert_eq!(xmls, [tdr.as_str(), wer.as_str(), unknown.as_str()]);
    let mut facts = common::facts("nvidia-multi-gpu");
    facts.faults = records;
    let text = dxdp_core::snapshot::write(&facts, dxdp_core::snapshot::Format::Yaml).unwrap();
    let replayed = dxdp_core::snapshot::parse(&text, "recorded.yaml").unwrap();
    assert_eq!(replayed, facts, "the snapshot round trip changes nothing");
    let c = Arc::new(config(
        "health:\n  signals:\n    tdr: {action: unhealthy_for, for: 15m, ambiguous: all_of_vendor}\n",
    ));
    let (inv, notices) = build_at(&replayed, c.clone(), at(21, 45, 0, 0));
    assert!(
        !notices.iter().any(|n| n.starts_with("event-log")),
        "{notices:?}"
    );
    assert_eq!(reasons(&inv), all(Reason::Tdr));
    assert_eq!(
        inv.discovery.devices[0].health.reason.as_deref(),
        Some("display driver \"nvlddmkm\" stopped responding and was reset (event 4101); 1 such event(s), Unhealthy since 2026-11-25T21:40:12Z until 2026-11-25T21:55:12Z")
    );
    // The reset and the WER report so far (ContosoKmd's reset at 21:52:40 is still to come);
    // the report names no adapter and there are four: unmatched.
    assert_eq!(inv.faults.len(), 2);
    assert_eq!(inv.faults[0].devices, T4S);
    assert!(inv.faults[1].devices.is_empty());
    // 15 minutes after the reset: Healthy (ContosoKmd's reset matches no device).
    let (inv, _) = build_at(&replayed, c, at(21, 55, 12, 512));
    assert_eq!(reasons(&inv), all(Reason::Healthy));
    assert_eq!(inv.faults.len(), 3);
}
