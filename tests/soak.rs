//! Fault and soak tests: the daemon under kubelet restarts with concurrent Allocate calls, flapping
//! host facts, flapping configuration, and SIGKILL with a restart. Each runs for a bounded time
//! (`DXDP_SOAK_SECS`, default 3 s each) and stops by itself; afterwards the registration is present,
//! the lists are right, nothing panicked, and open file descriptors and resident memory are back
//! near their baseline. `DXDP_SOAK_SECS=300 cargo test --release --test soak` is the long mode.
//!
//! The tests take a lock so that they run one at a time: they count this process's descriptors.
//! On Windows (natively and under Wine, over the loopback transport there) the daemon runs the
//! same storms; descriptors and resident memory are read from `/proc`, so only Linux checks them,
//! and the SIGKILL test (which runs the binary) is Unix only.

#![cfg(any(unix, windows))]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dxdp::backend::SnapshotFile;
use dxdp::kubelet::standin::{KubeletStandin, StandinView};
use dxdp::plugin::PluginError;
use dxdp_core::devices::Resource;
use dxdp_core::facts::HostFacts;
use dxdp_core::snapshot;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

mod common;

const DISPLAY: &str = "directx.microsoft.com/display";
const COMPUTE: &str = "directx.microsoft.com/compute";
/// For behaviour, not speed.
const WAIT: Duration = Duration::from_secs(20);
/// Longer than any test, so that only events drive the daemon.
/// Descriptors that may still be closing when the count is taken (a connection the kubelet
/// stand-in is tearing down, a watch being replaced); a leak grows with the number of cycles and
/// exceeds this quickly.
const FD_SLACK: usize = 8;
/// Resident memory growth allowed over one run (allocator caches, tokio's lazily grown pools).
const RSS_SLACK_KIB: u64 = 16 * 1024;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long each test churns: `DXDP_SOAK_SECS` or 3 seconds.
fn soak_time() -> Duration {
    let secs = std::env::var("DXDP_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(3.0);
    Duration::from_secs_f64(secs)
}

#[cfg(unix)]
fn open_fds(pid: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[cfg(unix)]
fn rss_kib(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// No `/proc`: nothing is measured (said by [`Baseline::check`]).
#[cfg(not(unix))]
fn open_fds(_: &str) -> usize {
    0
}

#[cfg(not(unix))]
fn rss_kib(_: &str) -> u64 {
    0
}

/// Descriptors and memory of a process, taken once the daemon is settled.
struct Baseline {
    pid: String,
    fds: usize,
    rss: u64,
}

impl Baseline {
    fn take(pid: &str) -> Baseline {
        Baseline {
            pid: pid.to_string(),
            fds: open_fds(pid),
            rss: rss_kib(pid),
        }
    }

    /// Waits (a while) for descriptors to come back to the baseline, then checks memory.
    async fn check(&self, what: &str) {
        if cfg!(not(unix)) {
            eprintln!("{what}: descriptors and resident memory not checked (no /proc here)");
            return;
        }
        let deadline = Instant::now() + WAIT;
        let mut fds = open_fds(&self.pid);
        while fds > self.fds + FD_SLACK && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            fds = open_fds(&self.pid);
        }
        assert!(
            fds <= self.fds + FD_SLACK,
            "{what}: {fds} open descriptors, baseline {}",
            self.fds
        );
        let rss = rss_kib(&self.pid);
        assert!(
            rss <= self.rss + RSS_SLACK_KIB,
            "{what}: resident memory {rss} KiB, baseline {} KiB",
            self.rss
        );
        eprintln!(
            "{what}: descriptors {} -> {fds}, resident memory {} -> {rss} KiB",
            self.fds, self.rss
        );
    }
}

/// The IDs a fixture host advertises with `replicas` per device, written out from
/// `dxdp discover --json` of the host (replica k > 0 of device D is `D-r<k>`).
fn expected_ids(host: &str, resource: Resource, replicas: u32) -> Vec<String> {
    let physical: &[&str] = match (host, resource) {
        ("sample", Resource::Display) => &[
            "pciroot-0-pci-0100-pci-0000-d598ef34d10e0ad3",
            "pciroot-0-pci-0200-pci-0000-0d3ededcb0d74bd8",
        ],
        ("sample", Resource::Compute) => &["pciroot-0-pci-0300-pci-0000-4a1450fd9e47b7a5"],
        ("nvidia-multi-gpu", Resource::Display) => &[
            "pciroot-0-pci-1b00-0540e5ad73bf260f",
            "pciroot-0-pci-1c00-ba6abfb666f4630a",
            "pciroot-0-pci-1d00-99a65d9b8c3e813d",
            "pciroot-0-pci-1e00-4ed067a47f740fc8",
        ],
        _ => &[],
    };
    physical
        .iter()
        .flat_map(|d| {
            (0..replicas).map(move |k| {
                if k == 0 {
                    d.to_string()
                } else {
                    format!("{d}-r{k}")
                }
            })
        })
        .collect()
}

fn ids(view: &StandinView, resource: &str) -> Vec<String> {
    view.devices(resource)
        .unwrap_or_default()
        .iter()
        .map(|d| d.id.clone())
        .collect()
}

fn health(view: &StandinView, resource: &str) -> Vec<String> {
    view.devices(resource)
        .unwrap_or_default()
        .iter()
        .map(|d| d.health.clone())
        .collect()
}

/// Writes `text` beside `path` and renames it into place. On Windows (seen under Wine) the rename
/// is refused while the daemon has the file open for its read, so it is tried again, for at most
/// 5 s; there is no event to wait on.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match std::fs::rename(&tmp, path) {
            Ok(()) => return,
            Err(e)
                if cfg!(windows)
                    && e.kind() == std::io::ErrorKind::PermissionDenied
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("{}: {e}", path.display()),
        }
    }
}

fn plugin_sockets(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("dxdp-"))
        .collect();
    names.sort();
    names
}

/// A small deterministic generator for pauses (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// The daemon in this process, on a temporary kubelet directory with a host snapshot file.
struct Daemon {
    dir: tempfile::TempDir,
    snapshot: PathBuf,
    kubelet: Option<KubeletStandin>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), PluginError>>>,
}

impl Daemon {
    async fn start(facts: &HostFacts, reload: Option<dxdp::config::Inputs>) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("dxdp-soak")
            .tempdir_in(common::socket_tempdir_base())
            .unwrap();
        let snapshot = dir.path().join("host.yaml");
        replace(
            &snapshot,
            &snapshot::write(facts, snapshot::Format::Yaml).unwrap(),
        );
        let kubelet = KubeletStandin::start(common::transport(), dir.path())
            .await
            .unwrap();
        let mut config = common::plugin_config(dir.path());
        let source = Arc::new(SnapshotFile::new(snapshot.clone()));
        let daemon = match reload {
            Some(inputs) => {
                config.config = inputs.resolve().unwrap();
                dxdp::daemon::Daemon::new(config, source).reload(inputs)
            }
            // The configuration never changes.
            None => dxdp::daemon::Daemon::new(config, source),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(daemon.run(async {
            let _ = stopped.await;
        }));
        Daemon {
            dir,
            snapshot,
            kubelet: Some(kubelet),
            stop: Some(stop),
            task: Some(task),
        }
    }

    fn kubelet(&self) -> &KubeletStandin {
        self.kubelet.as_ref().unwrap()
    }

    async fn wait(&self, what: &str, done: impl Fn(&StandinView) -> bool) {
        if !self.kubelet().wait_for(WAIT, done).await {
            panic!(
                "timed out waiting for {what}; kubelet saw {:#?}",
                self.kubelet().view()
            );
        }
    }

    /// Waits until the kubelet has exactly these lists, healthy, for both resources.
    async fn lists(&self, display: &[String], compute: &[String]) {
        self.wait("the expected lists", |v| {
            ids(v, DISPLAY) == display
                && ids(v, COMPUTE) == compute
                && health(v, DISPLAY).iter().all(|h| h == "Healthy")
        })
        .await;
    }

    fn assert_running(&self) {
        assert!(
            !self.task.as_ref().unwrap().is_finished(),
            "the daemon stopped (or panicked) during the run"
        );
    }

    async fn shutdown(mut self) {
        self.assert_running();
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(WAIT, self.task.take().unwrap())
            .await
            .expect("the daemon stops")
            .expect("the daemon did not panic")
            .expect("the daemon ended without error");
        assert!(plugin_sockets(self.dir.path()).is_empty());
        if let Some(k) = self.kubelet.take() {
            k.stop().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restarts_every_few_hundred_ms_while_allocate_calls_run() {
    let _serial = SERIAL.lock().await;
    let facts = common::facts("sample");
    let display = expected_ids("sample", Resource::Display, 1);
    let compute = expected_ids("sample", Resource::Compute, 1);
    let mut d = Daemon::start(&facts, None).await;
    d.lists(&display, &compute).await;
    let baseline = Baseline::take("self");

    let stop = Arc::new(AtomicBool::new(false));
    let (ok, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut callers = Vec::new();
    for caller in 0..4 {
        let (stop, ok, refused) = (stop.clone(), ok.clone(), refused.clone());
        let dir = d.dir.path().to_path_buf();
        let id = display[caller % display.len()].clone();
        callers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                // Straight to the newest plugin socket, as the kubelet would after a restart.
                let Some(name) = plugin_sockets(&dir)
                    .into_iter()
                    .find(|n| n.contains("display"))
                else {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                };
                let answer = async {
                    let channel = common::transport().channel(&dir.join(name)).await.ok()?;
                    let mut client =
                        dxdp::kubelet::v1beta1::device_plugin_client::DevicePluginClient::new(
                            channel,
                        );
                    let request = dxdp::kubelet::v1beta1::AllocateRequest {
                        container_requests: vec![
                            dxdp::kubelet::v1beta1::ContainerAllocateRequest {
                                devices_ids: vec![id.clone()],
                            },
                        ],
                    };
                    Some(client.allocate(request).await)
                };
                match tokio::time::timeout(Duration::from_secs(5), answer).await {
                    Ok(Some(Ok(_))) => ok.fetch_add(1, Ordering::Relaxed),
                    Ok(Some(Err(status))) => {
                        // The device is known, so only a socket going away may fail a call.
                        assert_ne!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
                        refused.fetch_add(1, Ordering::Relaxed)
                    }
                    Ok(None) => refused.fetch_add(1, Ordering::Relaxed),
                    Err(_) => panic!("an Allocate call hung for 5 s"),
                };
            }
        }));
    }

    let mut rng = Rng(0x51_7cc1_b727_220a);
    let end = Instant::now() + soak_time();
    let mut restarts = 0;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(150 + rng.below(250))).await;
        d.kubelet.take().unwrap().stop().await;
        for name in plugin_sockets(d.dir.path()) {
            let _ = std::fs::remove_file(d.dir.path().join(name));
        }
        d.kubelet = Some(
            KubeletStandin::start(common::transport(), d.dir.path())
                .await
                .unwrap(),
        );
        restarts += 1;
        d.assert_running();
    }
    stop.store(true, Ordering::Relaxed);
    for c in callers {
        c.await.expect("no caller panicked");
    }
    d.lists(&display, &compute).await;
    assert_eq!(plugin_sockets(d.dir.path()).len(), 2);
    let id = display[0].clone();
    assert!(d.kubelet().allocate(DISPLAY, &[id]).await.is_ok());
    eprintln!(
        "{restarts} kubelet restarts; Allocate: {} answered, {} failed while a socket was gone",
        ok.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed)
    );
    assert!(
        ok.load(Ordering::Relaxed) > 0,
        "some Allocate calls succeeded"
    );
    baseline.check("after kubelet restarts").await;
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_facts_flapping_devices_and_health_end_in_the_right_list() {
    let _serial = SERIAL.lock().await;
    let full = common::facts("sample");
    let mut fewer = full.clone();
    fewer.adapters.remove(0);
    let mut sick = full.clone();
    sick.adapters[0].pnp.as_mut().unwrap().problem_code = 43;
    sick.adapters[1].driver_update_in_progress = true;
    let texts: Vec<String> = [&full, &fewer, &sick]
        .iter()
        .map(|f| snapshot::write(f, snapshot::Format::Yaml).unwrap())
        .collect();
    let display = expected_ids("sample", Resource::Display, 1);
    let compute = expected_ids("sample", Resource::Compute, 1);
    let d = Daemon::start(&full, None).await;
    d.lists(&display, &compute).await;
    let baseline = Baseline::take("self");

    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let end = Instant::now() + soak_time();
    let mut edits = 0;
    while Instant::now() < end {
        let text = &texts[rng.below(texts.len() as u64) as usize];
        // Sometimes a torn or broken file, which must be ignored.
        if rng.below(8) == 0 {
            replace(&d.snapshot, &text[..text.len() / 2]);
        } else {
            replace(&d.snapshot, text);
        }
        edits += 1;
        tokio::time::sleep(Duration::from_millis(rng.below(30))).await;
    }
    d.assert_running();
    // One more change after the churn: the final state is the full, healthy host.
    replace(&d.snapshot, &texts[1]);
    d.wait("the smaller host", |v| {
        ids(v, DISPLAY).len() == display.len() - 1
    })
    .await;
    replace(&d.snapshot, &texts[0]);
    d.lists(&display, &compute).await;
    eprintln!("{edits} host snapshot edits");
    baseline.check("after host facts flapping").await;
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_flapping_between_valid_and_invalid_ends_in_the_last_valid_one() {
    let _serial = SERIAL.lock().await;
    let facts = common::facts("sample");
    let dir = tempfile::Builder::new()
        .prefix("dxdp-soak-config")
        .tempdir_in(common::socket_tempdir_base())
        .unwrap();
    let config_path = dir.path().join("config.yaml");
    std::fs::write(&config_path, "resources: {display: {replicas: 1}}\n").unwrap();
    let inputs = dxdp::config::Inputs {
        file: Some((config_path.clone(), true)),
        ..Default::default()
    };
    let d = Daemon::start(&facts, Some(inputs)).await;
    let compute = expected_ids("sample", Resource::Compute, 1);
    d.lists(&expected_ids("sample", Resource::Display, 1), &compute)
        .await;
    let baseline = Baseline::take("self");

    let versions = [
        "resources: {display: {replicas: 2}}\n",
        "resources: {display: {replicas: 3}}\n",
        "resources: {display: {replicas: 0}}\n",
        "resources: {display: {replicas: [}}\n",
        "resources: {display: {replicas: 'many'}}\n",
        "unknownKey: 1\n",
        "resources: {display: {name: 'not a resource name'}}\n",
        "\u{0}\u{1}\u{2}",
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let end = Instant::now() + soak_time();
    let mut edits = 0;
    while Instant::now() < end {
        replace(
            &config_path,
            versions[rng.below(versions.len() as u64) as usize],
        );
        edits += 1;
        tokio::time::sleep(Duration::from_millis(rng.below(40))).await;
    }
    d.assert_running();
    // The last edit is valid: 4 replicas of each of the 2 GPUs.
    replace(&config_path, "resources: {display: {replicas: 4}}\n");
    d.lists(&expected_ids("sample", Resource::Display, 4), &compute)
        .await;
    // An invalid edit now keeps it.
    replace(&config_path, "resources: {display: {replicas: -1}}\n");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        ids(&d.kubelet().view(), DISPLAY),
        expected_ids("sample", Resource::Display, 4)
    );
    eprintln!("{edits} configuration edits");
    baseline.check("after configuration flapping").await;
    d.shutdown().await;
}

#[cfg(unix)]
fn spawn_binary(dir: &Path, snapshot: &Path) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_dxdp"))
        .args(["plugin", "--log-level", "warn", "--kubelet-dir"])
        .arg(dir)
        .arg("--host-snapshot")
        .arg(snapshot)
        .env_clear()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_and_restart_cleans_stale_sockets_and_registers_again() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::Builder::new()
        .prefix("dxdp-soak-kill")
        .tempdir_in(common::socket_tempdir_base())
        .unwrap();
    let snapshot = common::fixture_path("nvidia-multi-gpu");
    let display = expected_ids("nvidia-multi-gpu", Resource::Display, 1);
    let compute = expected_ids("nvidia-multi-gpu", Resource::Compute, 1);
    // The binary speaks AF_UNIX only.
    let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
        .await
        .unwrap();
    let end = Instant::now() + soak_time();
    let mut kills = 0;
    let mut endpoints: Vec<String> = Vec::new();
    let mut child = spawn_binary(dir.path(), &snapshot);
    loop {
        let registrations = kubelet.view().registrations.len();
        let fresh = |v: &StandinView| {
            v.registrations.len() >= registrations + 2
                && v.plugins.values().all(|p| p.connected)
                && ids(v, DISPLAY) == display
                && ids(v, COMPUTE) == compute
                && !endpoints.contains(&v.plugins[DISPLAY].endpoint)
        };
        if kills > 0 {
            // The killed one's sockets are still there until the new one starts.
            assert!(plugin_sockets(dir.path()).len() >= 2);
        }
        assert!(
            kubelet.wait_for(WAIT, fresh).await,
            "registered after {kills} kills: {:#?}",
            kubelet.view()
        );
        let view = kubelet.view();
        endpoints.push(view.plugins[DISPLAY].endpoint.clone());
        assert_eq!(
            plugin_sockets(dir.path()).len(),
            2,
            "stale sockets were removed: {:?}",
            plugin_sockets(dir.path())
        );
        if Instant::now() >= end {
            break;
        }
        let pid = child.id().unwrap().to_string();
        let killed = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status()
            .unwrap();
        assert!(killed.success());
        let status = tokio::time::timeout(WAIT, child.wait())
            .await
            .expect("killed")
            .unwrap();
        assert!(!status.success());
        kills += 1;
        child = spawn_binary(dir.path(), &snapshot);
    }
    assert!(kills > 0, "at least one SIGKILL");

    // The survivor: restart the kubelet a few times and check its descriptors and memory.
    let pid = child.id().unwrap().to_string();
    let baseline = Baseline::take(&pid);
    let mut kubelet = kubelet;
    for _ in 0..3 {
        kubelet.stop().await;
        for name in plugin_sockets(dir.path()) {
            let _ = std::fs::remove_file(dir.path().join(name));
        }
        kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
            .await
            .unwrap();
        assert!(
            kubelet
                .wait_for(WAIT, |v| ids(v, DISPLAY) == display
                    && ids(v, COMPUTE) == compute)
                .await
        );
    }
    baseline.check("the restarted binary").await;
    eprintln!("{kills} SIGKILLs, each followed by a clean start");
    let _ = child.kill().await;
    kubelet.stop().await;
}
