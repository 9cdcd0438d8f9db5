//! Reads of host files that must never hang the daemon (issue 36): a FIFO, a socket or an
//! oversized file as the host snapshot or the configuration, at start and after start, against
//! the real binary; a host read that never returns, against the in-process daemon with a source
//! whose read blocks (a hung file system or driver). Each test fails on a daemon that reads
//! with a plain blocking open, without a size cap or without time limits.

#![cfg(unix)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use dxdp::backend::{HostFactsSource, SnapshotFile, SourceError, Wake};
use dxdp::kubelet::standin::KubeletStandin;
use dxdp::plugin::PluginError;
use dxdp_core::facts::HostFacts;
use tokio::io::AsyncBufReadExt;
use tokio::sync::oneshot;

use crate::common;

const DISPLAY: &str = "directx.microsoft.com/display";
const COMPUTE: &str = "directx.microsoft.com/compute";
const WAIT: Duration = Duration::from_secs(10);

fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

/// Replaces `path` with a FIFO (as `rm path; mkfifo path` does).
fn make_fifo_at(path: &Path) {
    std::fs::remove_file(path).unwrap();
    mkfifo(path);
}

/// Writes `text` beside `path` and renames it over `path` (over a FIFO too).
fn replace(path: &Path, text: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A sparse file of `len` bytes renamed over `path`: over a size cap without writing it.
fn replace_sparse(path: &Path, len: u64) {
    let tmp = path.with_extension("tmp");
    std::fs::File::create(&tmp).unwrap().set_len(len).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn snapshot_text(facts: &HostFacts) -> String {
    dxdp_core::snapshot::write(facts, dxdp_core::snapshot::Format::Yaml).unwrap()
}

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let (status, _, body) = common::http(addr, "GET", path).await;
    (status, body)
}

/// The binary's stderr, collected line by line as it comes.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<String>>);

impl Log {
    fn follow(child: &mut tokio::process::Child) -> Log {
        let log = Log::default();
        let stderr = child.stderr.take().unwrap();
        let text = log.0.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut t = text.lock().unwrap();
                t.push_str(&line);
                t.push('\n');
            }
        });
        log
    }

    fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }

    /// How many lines contain `part`.
    fn count(&self, part: &str) -> usize {
        self.text().lines().filter(|l| l.contains(part)).count()
    }

    async fn wait_for(&self, part: &str) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while self.count(part) == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no line with {part:?} in the log:\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn dxdp() -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_dxdp"));
    cmd.env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// The error lines of the binary at start: a FIFO as the snapshot or as the configuration
/// file is an error naming the file and what it is, and the process ends at once (it used to
/// hang with no log line at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_as_the_snapshot_or_the_configuration_at_start_is_an_error_naming_it() {
    let dir = common::socket_tempdir();
    let fifo = dir.path().join("fifo.yaml");
    mkfifo(&fifo);
    let snapshot = dir.path().join("host.yaml");
    common::write_facts(&snapshot, &common::facts("sample"));
    let kubelet_dir = dir.path().join("kubelet");
    std::fs::create_dir(&kubelet_dir).unwrap();
    let cases: [(&[&str], &Path, String); 3] = [
        (
            &["--host-snapshot"],
            &fifo,
            format!(
                "cannot read host snapshot {}: it is a FIFO (named pipe), not a regular file: dxdp reads only regular files (replace it with one)",
                fifo.display()
            ),
        ),
        (
            &["--config"],
            &fifo,
            format!(
                "cannot read configuration file {}: it is a FIFO (named pipe), not a regular file: dxdp reads only regular files (replace it with one)",
                fifo.display()
            ),
        ),
        (
            &["--config"],
            dir.path(),
            format!(
                "cannot read configuration file {}: it is a directory, not a regular file: dxdp reads only regular files (replace it with one)",
                dir.path().display()
            ),
        ),
    ];
    for (flag, path, want) in cases {
        let mut cmd = dxdp();
        cmd.args(flag).arg(path);
        if flag[0] == "--config" {
            cmd.arg("--host-snapshot").arg(&snapshot);
        }
        let child = cmd
            .arg("plugin")
            .arg("--kubelet-dir")
            .arg(&kubelet_dir)
            .spawn()
            .unwrap();
        let out = tokio::time::timeout(WAIT, child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("dxdp {flag:?} {} did not end", path.display()))
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(&want), "{want}\nnot in\n{stderr}");
    }
    // `dxdp config check` reads the same way.
    let out = tokio::time::timeout(WAIT, dxdp().arg("config").arg("check").arg(&fifo).output())
        .await
        .expect("config check ends")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot read configuration file {}: it is a FIFO (named pipe)",
            fifo.display()
        )),
        "{stderr}"
    );
}

/// After start: the snapshot and the configuration each replaced by a FIFO, then by an
/// oversized file. Each is an error naming the file and what is wrong, logged once; the devices
/// and the configuration served stay; `/healthz` stays 200 (the daemon is alive and serving)
/// and the failures are counted; a valid file written there later is read; SIGTERM ends the
/// process. A daemon that opens the FIFO with a blocking open hangs its reader, logs nothing
/// and never reads the valid file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn special_and_oversized_files_after_start_keep_the_last_good_state_and_later_files_are_read()
{
    if !common::af_unix(
        "special_and_oversized_files_after_start_keep_the_last_good_state_and_later_files_are_read",
    ) {
        return;
    }
    let dir = common::socket_tempdir();
    let files = tempfile::tempdir().unwrap();
    let snapshot = files.path().join("host.yaml");
    let config = files.path().join("config.yaml");
    common::write_facts(&snapshot, &common::facts("sample"));
    replace(&config, b"resources: {display: {replicas: 1}}\n");
    // The binary speaks AF_UNIX only.
    let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
        .await
        .unwrap();
    let address = free_port();
    let mut child = dxdp()
        .arg("--config")
        .arg(&config)
        .arg("--host-snapshot")
        .arg(&snapshot)
        .args(["plugin", "--kubelet-dir"])
        .arg(dir.path())
        .arg("--metrics-address")
        .arg(address.to_string())
        .spawn()
        .unwrap();
    let log = Log::follow(&mut child);
    let registered = |n_display: usize, n_compute: usize| {
        move |v: &dxdp::kubelet::standin::StandinView| {
            v.devices(DISPLAY).is_some_and(|d| d.len() == n_display)
                && v.devices(COMPUTE).is_some_and(|d| d.len() == n_compute)
        }
    };
    assert!(
        kubelet.wait_for(WAIT, registered(2, 1)).await,
        "{:#?}\n{}",
        kubelet.view(),
        log.text()
    );

    // The snapshot becomes a FIFO, and its mode changes (a second read of it).
    make_fifo_at(&snapshot);
    let fifo_error = format!(
        "cannot read host snapshot {}: it is a FIFO (named pipe), not a regular file: dxdp reads only regular files (replace it with one)",
        snapshot.display()
    );
    log.wait_for(&fifo_error).await;
    let status = std::process::Command::new("chmod")
        .arg("640")
        .arg(&snapshot)
        .status()
        .unwrap();
    assert!(status.success());
    metric_at_least(address, "dxdp_host_refreshes_total{result=\"error\"}", 2.0).await;
    assert_eq!(log.count(&fifo_error), 1, "logged once:\n{}", log.text());
    assert_eq!(get(address, "/healthz").await.0, 200);
    // The configuration becomes a FIFO.
    make_fifo_at(&config);
    let config_fifo_error = format!(
        "cannot read configuration file {}: it is a FIFO (named pipe), not a regular file: dxdp reads only regular files (replace it with one)",
        config.display()
    );
    log.wait_for(&config_fifo_error).await;
    metric_at_least(
        address,
        "dxdp_config_reloads_total{result=\"rejected\"}",
        1.0,
    )
    .await;
    assert_eq!(get(address, "/healthz").await.0, 200);
    assert!(kubelet.wait_for(WAIT, registered(2, 1)).await, "kept");

    // Valid files written over the FIFOs are read: a host without the A100, 2 replicas.
    let mut fewer = common::facts("sample");
    fewer
        .adapters
        .retain(|a| !a.driver_description.contains("A100"));
    replace(&snapshot, snapshot_text(&fewer).as_bytes());
    replace(&config, b"resources: {display: {replicas: 2}}\n");
    assert!(
        kubelet.wait_for(WAIT, registered(4, 0)).await,
        "{:#?}\n{}",
        kubelet.view(),
        log.text()
    );

    // Oversized files are refused without being read, naming the cap; the last good state stays.
    replace_sparse(&snapshot, (64 << 20) + 1);
    log.wait_for(&format!(
        "cannot read host snapshot {}: it is 67108865 bytes, more than the 64 MiB limit for this file: it was not read (make it smaller)",
        snapshot.display()
    ))
    .await;
    replace_sparse(&config, (4 << 20) + 1);
    log.wait_for(&format!(
        "cannot read configuration file {}: it is 4194305 bytes, more than the 4 MiB limit for this file: it was not read (make it smaller)",
        config.display()
    ))
    .await;
    assert!(kubelet.wait_for(WAIT, registered(4, 0)).await, "kept");
    assert_eq!(get(address, "/healthz").await.0, 200);

    common::terminate(&mut child, WAIT).await;
    kubelet.stop().await;
}

/// Waits until the counter `series` is at least `value` on the binary's `/metrics`.
async fn metric_at_least(addr: SocketAddr, series: &str, value: f64) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, body) = get(addr, "/metrics").await;
        let now = common::metric_samples(&body)
            .get(series)
            .and_then(|v| v.parse::<f64>().ok());
        if now.is_some_and(|v| v >= value) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{series} never reached {value} (now {now:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A source of host facts whose reads block, while it is armed, until it is released: a read
/// hung in a file system or a driver.
struct Hung {
    inner: SnapshotFile,
    armed: AtomicBool,
    released: Arc<(Mutex<bool>, Condvar)>,
    wake: Mutex<Option<Wake>>,
}

impl Hung {
    fn new(snapshot: PathBuf, armed: bool) -> Arc<Hung> {
        Arc::new(Hung {
            inner: SnapshotFile::new(snapshot),
            armed: AtomicBool::new(armed),
            released: Arc::default(),
            wake: Mutex::new(None),
        })
    }

    /// Ends every blocked read, and lets later ones through.
    fn release(&self) {
        self.armed.store(false, Ordering::SeqCst);
        let (lock, cv) = &*self.released;
        *lock.lock().unwrap() = true;
        cv.notify_all();
    }

    /// Makes the daemon read the facts now (as a DXCore notification would).
    fn wake(&self) {
        let wake = self
            .wake
            .lock()
            .unwrap()
            .clone()
            .expect("the refresher listens");
        wake();
    }

    fn block_if_armed(&self) {
        if self.armed.load(Ordering::SeqCst) {
            let (lock, cv) = &*self.released;
            let mut released = lock.lock().unwrap();
            while !*released {
                released = cv.wait(released).unwrap();
            }
        }
    }
}

/// Releases the source when a test fails, so that it fails rather than hangs on the blocked
/// thread when its runtime is dropped.
struct ReleaseOnDrop(Arc<Hung>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.release();
        }
    }
}

impl HostFactsSource for Hung {
    fn describe(&self) -> String {
        "a hung test source".into()
    }
    fn is_simulated(&self) -> bool {
        true
    }
    fn load(&self) -> Result<HostFacts, SourceError> {
        self.block_if_armed();
        self.inner.load()
    }
    fn on_change(&self, wake: Wake) {
        *self.wake.lock().unwrap() = Some(wake);
    }
}

/// Waits until the daemon's liveness answer satisfies `done`.
async fn liveness(
    observe: &dxdp::observe::Observe,
    what: &str,
    done: impl Fn(&Result<&'static str, String>) -> bool,
) -> Result<&'static str, String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let now = observe.health.check(Duration::from_secs(2)).await;
        if done(&now) {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: /healthz says {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The first host read never returns: past the start deadline `/healthz` fails with what the
/// start is doing, readiness says it is starting, and a stop still ends the daemon at once.
/// Then the same with the runtime of `dxdp plugin`: its stop returns although the read's thread
/// is still blocked. A daemon without a start deadline answers "ok: starting" for ever, and one
/// that waits for the read before looking at its stop never stops.
#[test]
fn a_first_host_read_that_never_returns_fails_liveness_past_the_start_deadline_and_a_stop_still_exits(
) {
    if !common::af_unix("a_first_host_read_that_never_returns_fails_liveness_past_the_start_deadline_and_a_stop_still_exits") {
        return;
    }
    let dir = common::socket_tempdir();
    let snapshot = dir.path().join("host.yaml");
    common::write_facts(&snapshot, &common::facts("sample"));
    let source = Hung::new(snapshot, true);
    let _release = ReleaseOnDrop(source.clone());
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let (kubelet_dir, src) = (dir.path().to_path_buf(), source.clone());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let result = runtime.block_on(async move {
            let mut c = common::plugin_config(&kubelet_dir);
            c.read_limit = Duration::from_millis(100);
            c.start_deadline = Duration::from_millis(300);
            let observe = c.observe.clone();
            let _release = ReleaseOnDrop(src.clone());
            let (stop, stopped) = oneshot::channel::<()>();
            let daemon = tokio::spawn(dxdp::daemon::Daemon::new(c, src).run(async {
                let _ = stopped.await;
            }));
            let why = liveness(&observe, "the start deadline", |r| r.is_err())
                .await
                .unwrap_err();
            assert!(
                why.starts_with("the device plugin has not finished starting after "),
                "{why}"
            );
            assert!(
                why.ends_with("(start deadline 0.3 s): reading host facts from a hung test source has not returned"),
                "{why}"
            );
            assert_eq!(
                observe.readiness.check(),
                Err("starting: checking the configuration and collecting host facts".into())
            );
            let _ = stop.send(());
            let stopped: Result<(), PluginError> = tokio::time::timeout(WAIT, daemon)
                .await
                .expect("the daemon stops while its first read hangs")
                .unwrap();
            stopped
        });
        // As `dxdp plugin` ends: the blocked read's thread must not hold the exit.
        dxdp::daemon::stop_runtime(runtime);
        done_tx.send(result.map_err(|e| e.to_string())).unwrap();
    });
    let result = done_rx.recv_timeout(WAIT + Duration::from_secs(5));
    source.release();
    let result = result.expect("the runtime stops although a read is still blocked");
    assert_eq!(result, Ok(()));
}

/// After start, a refresh whose read never returns: the last good devices stay, `/healthz`
/// fails naming the read, no second read piles up behind it, and once it returns the facts are
/// read again and `/healthz` is 200 again. A refresher without a time limit keeps `/healthz`
/// green while nothing is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_that_never_returns_fails_liveness_until_it_returns() {
    if !common::af_unix("a_refresh_that_never_returns_fails_liveness_until_it_returns") {
        return;
    }
    let dir = common::socket_tempdir();
    let snapshot = dir.path().join("host.yaml");
    common::write_facts(&snapshot, &common::facts("sample"));
    let kubelet = KubeletStandin::start(common::transport(), dir.path())
        .await
        .unwrap();
    let source = Hung::new(snapshot.clone(), false);
    let _release = ReleaseOnDrop(source.clone());
    let mut c = common::plugin_config(dir.path());
    c.read_limit = Duration::from_millis(200);
    let observe = c.observe.clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let daemon = tokio::spawn(dxdp::daemon::Daemon::new(c, source.clone()).run(async {
        let _ = stopped.await;
    }));
    assert!(
        kubelet
            .wait_for(WAIT, |v| v.devices(COMPUTE).is_some_and(|d| d.len() == 1))
            .await
    );
    assert_eq!(liveness(&observe, "alive", |r| r.is_ok()).await, Ok("ok"));
    source.armed.store(true, Ordering::SeqCst);
    source.wake();
    let why = liveness(&observe, "the hung read", |r| r.is_err())
        .await
        .unwrap_err();
    assert_eq!(
        why,
        "reading host facts from a hung test source did not finish within 200 ms (a hung file system, device or driver?); it is left running"
    );
    // More wake-ups while it hangs start no second read (the second would hang too).
    source.wake();
    source.wake();
    // The host changes, and the read returns: the facts are read again.
    let mut fewer = common::facts("sample");
    fewer
        .adapters
        .retain(|a| !a.driver_description.contains("A100"));
    common::write_facts(&snapshot, &fewer);
    source.release();
    assert_eq!(
        liveness(&observe, "alive again", |r| r.is_ok()).await,
        Ok("ok")
    );
    assert!(
        kubelet
            .wait_for(WAIT, |v| v.devices(COMPUTE).is_some_and(|d| d.is_empty()))
            .await,
        "{:#?}",
        kubelet.view()
    );
    assert!(kubelet
        .view()
        .devices(DISPLAY)
        .is_some_and(|d| d.len() == 2));
    let _ = stop.send(());
    tokio::time::timeout(WAIT, daemon)
        .await
        .expect("stops")
        .unwrap()
        .unwrap();
    kubelet.stop().await;
}
