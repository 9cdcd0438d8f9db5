//! Fault tests of the daemon (issue 25): each fails on a daemon that lets the fault pass
//! silently. The safety poll is an hour unless a test needs it, so only events drive the daemon;
//! expected device IDs are written out from the sample host.

#![cfg(any(unix, windows))]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dxdp::backend::{HostFactsSource, SnapshotFile, SourceError, Wake};
use dxdp::kubelet::standin::KubeletStandin;
use dxdp::observe::Observe;
use dxdp::plugin::{self, PluginConfig, PluginError};
use dxdp_core::facts::HostFacts;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::common;

const DISPLAY: &str = "directx.microsoft.com/display";
const COMPUTE: &str = "directx.microsoft.com/compute";
const WAIT: Duration = Duration::from_secs(10);

/// The sample host's devices (`dxdp discover --json` on the built-in sample host).
const SAMPLE_DISPLAY: [&str; 2] = [
    "pciroot-0-pci-0100-pci-0000-d598ef34d10e0ad3",
    "pciroot-0-pci-0200-pci-0000-0d3ededcb0d74bd8",
];
const SAMPLE_COMPUTE: [&str; 1] = ["pciroot-0-pci-0300-pci-0000-4a1450fd9e47b7a5"];

fn tempdir() -> tempfile::TempDir {
    common::socket_tempdir()
}

use common::write_facts;

fn config(dir: &Path) -> PluginConfig {
    common::plugin_config(dir)
}

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), PluginError>>,
}

fn spawn(config: PluginConfig, source: Arc<dyn HostFactsSource>) -> Running {
    run_daemon(dxdp::daemon::Daemon::new(config, source))
}

/// Runs `daemon` until [`Running::stop`].
fn run_daemon(daemon: dxdp::daemon::Daemon) -> Running {
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(daemon.run(async {
        let _ = stopped.await;
    }));
    Running { stop, task }
}

impl Running {
    async fn stop(self) -> Result<(), PluginError> {
        let _ = self.stop.send(());
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("stops")
            .unwrap()
    }
}

fn ids(kubelet: &KubeletStandin, resource: &str) -> Vec<String> {
    let mut ids: Vec<String> = kubelet
        .view()
        .devices(resource)
        .unwrap_or_default()
        .iter()
        .map(|d| d.id.clone())
        .collect();
    ids.sort();
    ids
}

fn sorted(ids: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

async fn both_registered(kubelet: &KubeletStandin) {
    assert!(
        kubelet
            .wait_for(WAIT, |v| v.devices(DISPLAY).is_some()
                && v.devices(COMPUTE).is_some())
            .await,
        "both resources registered: {:#?}",
        kubelet.view()
    );
}

/// Writes the sample host without its A100 to `snapshot` and waits until the kubelet's compute
/// list is empty (the daemon read the new snapshot).
async fn remove_the_a100(snapshot: &Path, kubelet: &KubeletStandin) {
    let mut fewer = common::facts("sample");
    fewer
        .adapters
        .retain(|a| !a.driver_description.contains("A100"));
    write_facts(snapshot, &fewer);
    assert!(
        kubelet
            .wait_for(WAIT, |v| v.devices(COMPUTE).is_some_and(|d| d.is_empty()))
            .await,
        "the snapshot without the A100 was not read: {:#?}",
        kubelet.view()
    );
}

/// Waits until `metric` (a whole line of the OpenMetrics text) is there.
async fn metric(observe: &Observe, line: &str) {
    let ok = tokio::time::timeout(WAIT, async {
        loop {
            if observe.metrics.encode().lines().any(|l| l == line) {
                return;
            }
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        ok.is_ok(),
        "no line {line:?} in\n{}",
        observe.metrics.encode()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelet_directory_deleted_and_recreated_is_watched_again_and_the_new_kubelet_gets_both_resources(
) {
    let top = tempdir();
    let dir = top.path().join("device-plugins");
    std::fs::create_dir(&dir).unwrap();
    let snapshot = top.path().join("host.yaml");
    write_facts(&snapshot, &common::facts("sample"));
    let kubelet = KubeletStandin::start(common::transport(), &dir)
        .await
        .unwrap();
    let running = spawn(config(&dir), Arc::new(SnapshotFile::new(snapshot)));
    both_registered(&kubelet).await;
    kubelet.stop().await;
    // The kubelet's directory goes away with everything in it and comes back.
    common::recreate_dir(&dir);
    let kubelet = KubeletStandin::start(common::transport(), &dir)
        .await
        .unwrap();
    // With the safety poll an hour away, only a watch that came back can see the new
    // kubelet.sock.
    both_registered(&kubelet).await;
    assert_eq!(ids(&kubelet, DISPLAY), sorted(&SAMPLE_DISPLAY));
    assert_eq!(ids(&kubelet, COMPUTE), sorted(&SAMPLE_COMPUTE));
    running.stop().await.unwrap();
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_directory_deleted_and_recreated_is_watched_again() {
    let dir = tempdir();
    let snap_dir = dir.path().join("facts");
    std::fs::create_dir(&snap_dir).unwrap();
    let snapshot = snap_dir.join("host.yaml");
    write_facts(&snapshot, &common::facts("sample"));
    let kubelet = KubeletStandin::start(common::transport(), dir.path())
        .await
        .unwrap();
    let running = spawn(
        config(dir.path()),
        Arc::new(SnapshotFile::new(snapshot.clone())),
    );
    both_registered(&kubelet).await;
    common::recreate_dir(&snap_dir);
    // A host without the A100: the compute list empties.
    remove_the_a100(&snapshot, &kubelet).await;
    assert_eq!(ids(&kubelet, DISPLAY), sorted(&SAMPLE_DISPLAY));
    running.stop().await.unwrap();
    kubelet.stop().await;
}

/// A snapshot source whose cheap change check panics once when armed: a bug in the refresher.
struct Panicky {
    inner: SnapshotFile,
    armed: AtomicBool,
}

impl HostFactsSource for Panicky {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn is_simulated(&self) -> bool {
        true
    }
    fn load(&self) -> Result<HostFacts, SourceError> {
        self.inner.load()
    }
    fn load_complete(&self) -> Result<HostFacts, SourceError> {
        self.inner.load_complete()
    }
    fn watched_files(&self) -> Vec<PathBuf> {
        self.inner.watched_files()
    }
    fn on_change(&self, wake: Wake) {
        self.inner.on_change(wake)
    }
    fn changed(&self) -> bool {
        if self.armed.swap(false, Ordering::SeqCst) {
            panic!("injected refresher fault");
        }
        false
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresher_that_panics_is_restarted_and_devices_keep_following_the_host() {
    let dir = tempdir();
    let snapshot = dir.path().join("host.yaml");
    write_facts(&snapshot, &common::facts("sample"));
    let kubelet = KubeletStandin::start(common::transport(), dir.path())
        .await
        .unwrap();
    let mut c = config(dir.path());
    // The safety tick is what calls the source's change check.
    c.safety_poll = Duration::from_millis(200);
    let observe = c.observe.clone();
    let running = spawn(
        c,
        Arc::new(Panicky {
            inner: SnapshotFile::new(snapshot.clone()),
            armed: AtomicBool::new(true),
        }),
    );
    both_registered(&kubelet).await;
    metric(&observe, "dxdp_task_restarts_total{task=\"refresher\"} 1").await;
    metric(&observe, "dxdp_task_up{task=\"refresher\"} 1").await;
    // The restarted refresher follows the host: the A100 goes.
    remove_the_a100(&snapshot, &kubelet).await;
    assert!(observe.health.check(Duration::from_secs(2)).await.is_ok());
    assert!(kubelet.view().plugins[DISPLAY].connected);
    running.stop().await.unwrap();
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_daemons_started_at_the_same_instant_exactly_one_serves() {
    for kubelet_first in [true, false] {
        for _ in 0..5 {
            let dir = tempdir();
            let snapshot = dir.path().join("host.yaml");
            write_facts(&snapshot, &common::facts("sample"));
            let kubelet = if kubelet_first {
                Some(
                    KubeletStandin::start(common::transport(), dir.path())
                        .await
                        .unwrap(),
                )
            } else {
                None
            };
            let source: Arc<dyn HostFactsSource> = Arc::new(SnapshotFile::new(snapshot));
            let mut a = spawn(config(dir.path()), source.clone());
            let mut b = spawn(config(dir.path()), source);
            // The loser ends at once with the lock's message; the winner keeps running.
            let (first, loser) = tokio::select! {
                r = &mut a.task => (true, r),
                r = &mut b.task => (false, r),
            };
            let winner = if first { b } else { a };
            match loser.unwrap() {
                Err(PluginError::Lock(dxdp::plugin::claim::LockError::Held { dir: d, .. })) => {
                    assert_eq!(d, dir.path())
                }
                other => panic!("expected Locked, got {other:?}"),
            }
            let kubelet = match kubelet {
                Some(k) => k,
                None => KubeletStandin::start(common::transport(), dir.path())
                    .await
                    .unwrap(),
            };
            both_registered(&kubelet).await;
            let view = kubelet.view();
            assert_eq!(view.registrations.len(), 2, "{view:#?}");
            assert!(!winner.task.is_finished());
            winner.stop().await.unwrap();
            kubelet.stop().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_selected_configuration_that_cannot_be_served_falls_back_to_the_top_level() {
    let dir = tempdir();
    let snapshot = dir.path().join("host.yaml");
    // Windows Server 2019: HCS 2.1, no location-path assignment.
    write_facts(&snapshot, &common::facts("ws2019-old"));
    let kubelet = KubeletStandin::start(common::transport(), dir.path())
        .await
        .unwrap();
    let mut c = config(dir.path());
    c.config.assignment = dxdp_core::assignment::Assignment::LocationPath;
    c.config.selection.name = Some("strict".into());
    let running = run_daemon(
        dxdp::daemon::Daemon::new(c, Arc::new(SnapshotFile::new(snapshot.clone())))
            .fallback(dxdp::config::Config::default()),
    );
    both_registered(&kubelet).await;
    running.stop().await.unwrap();
    kubelet.stop().await;
    // Without a top level to fall back to, it is a start-up error.
    let dir = tempdir();
    let snapshot = dir.path().join("host.yaml");
    write_facts(&snapshot, &common::facts("ws2019-old"));
    let mut c = config(dir.path());
    c.config.assignment = dxdp_core::assignment::Assignment::LocationPath;
    let r = tokio::time::timeout(
        WAIT,
        dxdp::daemon::Daemon::new(c, Arc::new(SnapshotFile::new(snapshot)))
            .run(std::future::pending()),
    )
    .await
    .expect("fails at once");
    assert!(
        matches!(
            r,
            Err(PluginError::Unservable(plugin::servable::Unservable::Assignment { ref schema })) if schema == "2.1"
        ),
        "{r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_closes_connections_that_never_speak() {
    let dir = tempdir();
    let snapshot = dir.path().join("host.yaml");
    write_facts(&snapshot, &common::facts("sample"));
    let kubelet = KubeletStandin::start(common::transport(), dir.path())
        .await
        .unwrap();
    let running = spawn(config(dir.path()), Arc::new(SnapshotFile::new(snapshot)));
    both_registered(&kubelet).await;
    let socket = dir.path().join(&kubelet.view().registrations[0].endpoint);
    // A client that connects and then neither reads nor writes.
    let mut silent = common::transport().connect(&socket).await.unwrap();
    // The socket goes (as in a kubelet restart): the server stops and closes the connection.
    std::fs::remove_file(&socket).unwrap();
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(WAIT, async {
        use tokio::io::AsyncReadExt;
        loop {
            match silent.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                // The server's HTTP/2 preface and GOAWAY: read on.
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the stopped server's connection stays open");
    running.stop().await.unwrap();
    kubelet.stop().await;
}

use crate::eventlog as eventlog_support;

/// The daemon over the built-in sample host (three NVIDIA GPUs) following the GPU fault events
/// of `log`, wired as `dxdp plugin` wires the Windows event log.
fn spawn_with_event_log(
    config: PluginConfig,
    log: Arc<dyn dxdp::backend::eventlog::EventLog>,
) -> Running {
    run_daemon(
        dxdp::daemon::Daemon::new(config, Arc::new(dxdp::backend::SampleHost)).event_log(log),
    )
}

fn healths(kubelet: &KubeletStandin, resource: &str) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = kubelet
        .view()
        .devices(resource)
        .unwrap_or_default()
        .iter()
        .map(|d| (d.id.clone(), d.health.clone()))
        .collect();
    v.sort();
    v
}

fn every(ids: &[&str], health: &str) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = ids
        .iter()
        .map(|d| (d.to_string(), health.to_string()))
        .collect();
    v.sort();
    v
}

/// Issue 31: display-driver resets the event log delivers while the daemon runs reach the
/// kubelet. Three resets of `nvlddmkm` within ten minutes (the default `tdr` policy, with
/// `ambiguous: all_of_vendor`: the sample host's three GPUs are all NVIDIA, so by default the
/// resets would be charged to none) make every NVIDIA device of the sample host Unhealthy
/// (reason `tdr`); the third arrives after the start, as a live event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_display_driver_resets_make_the_nvidia_devices_unhealthy() {
    use eventlog_support::{display_reset, ScriptedLog};
    let dir = tempdir();
    let kubelet = KubeletStandin::start(common::transport(), dir.path())
        .await
        .unwrap();
    let now = dxdp::inventory::now_ms();
    // Two resets 4 and 2 minutes ago (the backlog the subscription delivers first).
    let log = ScriptedLog::delivering(vec![
        display_reset(18_233, now - 240_000, "nvlddmkm"),
        display_reset(18_240, now - 120_000, "nvlddmkm"),
    ]);
    let mut config = config(dir.path());
    config.config.pipeline.health.policy.signals.insert(
        dxdp_core::health::reason::Reason::Tdr,
        dxdp_core::health::SignalPolicy {
            action: dxdp_core::health::Action::UnhealthyFor(Duration::from_secs(600)),
            count: 3,
            window: Duration::from_secs(600),
            ambiguous: dxdp_core::health::Ambiguous::AllOfVendor,
        },
    );
    let observe = config.observe.clone();
    let running = spawn_with_event_log(config, log.clone());
    both_registered(&kubelet).await;
    // Two are counted, the devices stay Healthy.
    metric(
        &observe,
        &format!(
            "dxdp_gpu_faults_total{{device=\"{}\",kind=\"tdr\"}} 2",
            SAMPLE_COMPUTE[0]
        ),
    )
    .await;
    assert_eq!(
        healths(&kubelet, DISPLAY),
        every(&SAMPLE_DISPLAY, "Healthy")
    );
    // The third, live.
    assert!(log.deliver(display_reset(18_251, dxdp::inventory::now_ms(), "nvlddmkm")));
    let unhealthy = kubelet
        .wait_for(WAIT, |v| {
            let all = |r: &str, ids: &[&str]| {
                let mut got: Vec<(String, String)> = v
                    .devices(r)
                    .unwrap_or_default()
                    .iter()
                    .map(|d| (d.id.clone(), d.health.clone()))
                    .collect();
                got.sort();
                got == every(ids, "Unhealthy")
            };
            all(DISPLAY, &SAMPLE_DISPLAY) && all(COMPUTE, &SAMPLE_COMPUTE)
        })
        .await;
    assert!(unhealthy, "{:#?}", kubelet.view());
    metric(
        &observe,
        &format!(
            "dxdp_device_health{{device=\"{}\",resource=\"{DISPLAY}\",reason=\"tdr\"}} 1",
            SAMPLE_DISPLAY[0]
        ),
    )
    .await;
    metric(&observe, "dxdp_eventlog_subscribed 1").await;
    running.stop().await.unwrap();
    kubelet.stop().await;
}

/// Issue 31: an event log that cannot be followed costs nothing but the live fault events: the
/// daemon serves every device, Healthy, and counts the failed subscriptions. On Windows (and
/// under Wine, whose `wevtapi.dll` is mostly stubs) this is the real event log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_serves_when_the_event_log_cannot_be_followed() {
    #[cfg(windows)]
    let log = dxdp::backend::native_event_log().unwrap();
    #[cfg(not(windows))]
    let log: Arc<dyn dxdp::backend::eventlog::EventLog> =
        eventlog_support::ScriptedLog::failing("EvtSubscribe failed: HRESULT 0x800706BA");
    let dir = tempdir();
    let kubelet = KubeletStandin::start(common::transport(), dir.path())
        .await
        .unwrap();
    let config = config(dir.path());
    let observe = config.observe.clone();
    let running = spawn_with_event_log(config, log);
    both_registered(&kubelet).await;
    assert_eq!(
        healths(&kubelet, DISPLAY),
        every(&SAMPLE_DISPLAY, "Healthy")
    );
    assert_eq!(
        healths(&kubelet, COMPUTE),
        every(&SAMPLE_COMPUTE, "Healthy")
    );
    // The task either follows the log (a Windows host, or a Wine that implements it) or keeps
    // failing, counted; it never stops the daemon.
    let deadline = tokio::time::Instant::now() + WAIT;
    let outcome = loop {
        let (errors, _, subscribed) = observe.metrics.device_health().eventlog("subscribe");
        if subscribed {
            break "followed";
        }
        if errors >= 2 {
            break "failed twice, retried";
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "neither subscribed nor failing:\n{}",
            observe.metrics.encode()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("the event log here: {outcome}");
    #[cfg(not(windows))]
    assert_eq!(outcome, "failed twice, retried");
    // Still serving, and the task is up (an optional task that failed would be restarted).
    assert_eq!(ids(&kubelet, DISPLAY), sorted(&SAMPLE_DISPLAY));
    metric(&observe, "dxdp_task_up{task=\"event-log\"} 1").await;
    running.stop().await.unwrap();
    kubelet.stop().await;
}

/// Waits until `f` holds of the stand-in log.
async fn until_log(what: &str, f: impl Fn() -> bool) {
    let ok = tokio::time::timeout(WAIT * 2, async {
        while !f() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(ok.is_ok(), "timed out: {what}");
}

/// Issue 43: the Event Log service restarts under the daemon. The subscription reports an
/// error; `dxdp_eventlog_subscribed` reads 0 while the service is down, and the daemon
/// subscribes again after the bookmark of what it read once the service is back: a reset and
/// two WER reports logged meanwhile are counted, nothing read before is counted twice, and a
/// report logged again (a later state of it) is not a new fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_log_subscription_heals_after_the_service_restarts() {
    use eventlog_support::{display_reset, live_kernel_event, ScriptedLog};
    const A: &str = "0e7b1c55-3a52-4c1e-9a0d-5f1f2f0a6b21";
    const B: &str = "5c2d9e41-0b7a-4f63-8e25-91ad4c6f3b08";
    const C: &str = "9a4f3e21-7c6d-4b58-a0e1-2d3c4b5a6f70";
    let dir = tempdir();
    let kubelet = KubeletStandin::start(common::transport(), dir.path())
        .await
        .unwrap();
    let now = dxdp::inventory::now_ms();
    // The backlog: two resets and report A, the reset the last record read.
    let log = ScriptedLog::delivering(vec![
        display_reset(18_233, now - 240_000, "nvlddmkm"),
        live_kernel_event(40_211, now - 200_000, 141, A),
        display_reset(18_240, now - 120_000, "nvlddmkm"),
    ]);
    let config = config(dir.path());
    let observe = config.observe.clone();
    let running = spawn_with_event_log(config, log.clone());
    both_registered(&kubelet).await;
    // A reset of nvlddmkm cannot say which of the sample host's three NVIDIA GPUs it was:
    // charged to none.
    let tdr = |n: u32| format!("dxdp_gpu_faults_total{{device=\"unmatched\",kind=\"tdr\"}} {n}");
    // A LiveKernelEvent names no device: of the sample host's three, it matches none.
    let lke = |n: u32| {
        format!("dxdp_gpu_faults_total{{device=\"unmatched\",kind=\"live_kernel_event\"}} {n}")
    };
    metric(&observe, &tdr(2)).await;
    metric(&observe, &lke(1)).await;
    metric(&observe, "dxdp_eventlog_subscribed 1").await;
    // The service stops; the subscription says so.
    log.stop_service(Some("the event-log subscription failed: Win32 error 1726"));
    metric(&observe, "dxdp_eventlog_subscribed 0").await;
    metric(&observe, "dxdp_eventlog_errors_total{stage=\"delivery\"} 1").await;
    // While it is down: a reset, report A again (sent), report B.
    assert!(!log.write(display_reset(18_251, now - 30_000, "nvlddmkm")));
    assert!(!log.write(live_kernel_event(40_215, now - 25_000, 141, A)));
    assert!(!log.write(live_kernel_event(40_220, now - 20_000, 117, B)));
    // An attempt while down fails (0 all along), then the service is back.
    let before = log.attempts();
    until_log("an attempt while down", || log.attempts() > before).await;
    metric(&observe, "dxdp_eventlog_subscribed 0").await;
    assert!(observe.metrics.device_health().eventlog("subscribe").0 >= 1);
    log.start_service();
    metric(&observe, "dxdp_eventlog_subscribed 1").await;
    // What was logged meanwhile is counted, each once: 2 + 1 resets, reports A and B.
    metric(&observe, &tdr(3)).await;
    metric(&observe, &lke(2)).await;
    // The first subscription from the oldest record, the others after the last one read.
    let bookmark = "<BookmarkList><Bookmark Channel='Application' RecordId='40211'/><Bookmark Channel='System' RecordId='18240' IsCurrent='true'/></BookmarkList>";
    let afters = log.afters();
    assert!(afters.len() >= 3, "{afters:?}");
    assert_eq!(afters[0], None);
    for a in &afters[1..] {
        assert_eq!(a.as_deref(), Some(bookmark));
    }
    // Live again: report C arrives at once; the counts so far stayed.
    assert!(log.write(live_kernel_event(40_230, dxdp::inventory::now_ms(), 141, C)));
    metric(&observe, &lke(3)).await;
    metric(&observe, &tdr(3)).await;
    running.stop().await.unwrap();
    kubelet.stop().await;
}
