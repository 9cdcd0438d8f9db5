//! The `dxdp plugin` binary as a process (issue 36): a stderr nobody reads must not stop it
//! from serving, and signals: SIGHUP reloads the configuration, every other signal a runtime
//! may send to end it stops it gracefully (exit status 0, sockets removed). Against the kubelet
//! stand-in on real sockets.

#![cfg(unix)]

use std::path::Path;
use std::time::{Duration, Instant};

use dxdp::kubelet::standin::KubeletStandin;
use dxdp::kubelet::v1beta1::{AllocateRequest, ContainerAllocateRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::common;

const DISPLAY: &str = "directx.microsoft.com/display";
const COMPUTE: &str = "directx.microsoft.com/compute";
/// For behaviour, not speed.
const WAIT: Duration = Duration::from_secs(20);
/// The first T4 of the `nvidia-multi-gpu` fixture.
const T4: &str = "pciroot-0-pci-1b00-0540e5ad73bf260f";

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dxdp")
        .tempdir_in("/tmp")
        .unwrap()
}

/// `dxdp plugin` on `dir` with the `nvidia-multi-gpu` fixture, stdout to nowhere and stderr a
/// pipe the caller may read or not (`DXDP_TEST_BIN` runs another build).
fn spawn(dir: &Path, extra: &[&str]) -> Child {
    // DXDP_TEST_BIN: another build to test (the release binary, or an older one to see these
    // tests fail).
    let bin =
        std::env::var_os("DXDP_TEST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_dxdp").into());
    Command::new(bin)
        .args(["plugin", "--kubelet-dir"])
        .arg(dir)
        .arg("--host-snapshot")
        .arg(common::fixture_path("nvidia-multi-gpu"))
        .args(extra)
        .env_clear()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
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

fn send(child: &Child, signal: i32) {
    let pid = i32::try_from(child.id().expect("running")).unwrap();
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

/// Waits (at most `limit`) for `child` to exit, and asserts it exited with status 0.
async fn exits_cleanly(child: &mut Child, limit: Duration, what: &str) {
    let status = tokio::time::timeout(limit, child.wait())
        .await
        .unwrap_or_else(|_| panic!("{what}: still running after {limit:?}"))
        .unwrap();
    assert!(status.success(), "{what}: {status:?}");
}

/// A free port on 127.0.0.1 (bound and released: nothing else on this machine races for it in
/// the test's few milliseconds).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET `path` on `port`: the status code and the body, or why not within `limit`.
async fn get(port: u16, path: &str, limit: Duration) -> Result<(u16, String), String> {
    tokio::time::timeout(limit, async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .map_err(|e| e.to_string())?;
        let mut text = String::new();
        s.read_to_string(&mut text)
            .await
            .map_err(|e| e.to_string())?;
        let code = text
            .get(9..12)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("no status line in {text:?}"))?;
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        Ok((code, body.to_string()))
    })
    .await
    .map_err(|_| format!("no answer to {path} within {limit:?}"))?
}

/// The value of the sample `series` in `/metrics`.
async fn metric(port: u16, series: &str) -> u64 {
    let (code, text) = get(port, "/metrics", Duration::from_secs(5)).await.unwrap();
    assert_eq!(code, 200);
    common::metric_samples(&text)
        .get(series)
        .unwrap_or_else(|| panic!("{series} in {text}"))
        .parse()
        .unwrap()
}

/// `n` Allocate calls of the T4 from 16 concurrent callers (as the kubelet's one connection
/// carries them), each answered within 5 s, and `/healthz` answered 200 within 1 s after every
/// 1,000 of them.
async fn allocate_and_probe(kubelet: &KubeletStandin, port: u16, n: usize) {
    let client = kubelet.client(DISPLAY).expect("registered");
    for round in 0..n / 1000 {
        let mut calls = tokio::task::JoinSet::new();
        for caller in 0..16 {
            let mut client = client.clone();
            calls.spawn(async move {
                for i in 0..1000 / 16 + usize::from(caller < 1000 % 16) {
                    let request = AllocateRequest {
                        container_requests: vec![ContainerAllocateRequest {
                            devices_ids: vec![T4.to_string()],
                        }],
                    };
                    let answer =
                        tokio::time::timeout(Duration::from_secs(5), client.allocate(request))
                            .await
                            .unwrap_or_else(|_| panic!("Allocate {i} of caller {caller} hung"));
                    assert!(answer.is_ok(), "Allocate: {answer:?}");
                }
            });
        }
        while let Some(done) = calls.join_next().await {
            done.unwrap();
        }
        let health = get(port, "/healthz", Duration::from_secs(1)).await;
        assert_eq!(
            health.map(|(c, _)| c),
            Ok(200),
            "after {} Allocates",
            (round + 1) * 1000
        );
    }
}

/// The daemon with its metrics endpoint and probe listener on these loopback ports, registered
/// with a kubelet stand-in and answering `/readyz` 200 on the probe listener.
async fn ready_with_endpoints(
    dir: &Path,
    metrics_port: u16,
    probe_port: u16,
) -> (KubeletStandin, Child) {
    let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir)
        .await
        .unwrap();
    let metrics_address = format!("127.0.0.1:{metrics_port}");
    let probe_address = format!("127.0.0.1:{probe_port}");
    let child = spawn(
        dir,
        &[
            "--metrics-address",
            &metrics_address,
            "--probe-address",
            &probe_address,
        ],
    );
    both_registered(&kubelet).await;
    let deadline = Instant::now() + WAIT;
    while get(probe_port, "/readyz", WAIT).await.map(|(c, _)| c) != Ok(200) {
        assert!(Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (kubelet, child)
}

async fn both_registered(kubelet: &KubeletStandin) {
    assert!(
        kubelet
            .wait_for(WAIT, |v| v.devices(DISPLAY).is_some()
                && v.devices(COMPUTE).is_some())
            .await,
        "both resources registered"
    );
}

/// Issue 36: a container runtime's log shipper that stops reading stderr froze the daemon after
/// some 5,600 Allocates (the log queue was full and every logging task waited). Now lines are
/// dropped and counted instead, serving goes on, the count is said once the reader is back, and
/// SIGTERM still ends the process in time while nobody reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stderr_nobody_reads_never_stops_serving_and_sigterm_still_exits() {
    if !common::af_unix("a_stderr_nobody_reads_never_stops_serving_and_sigterm_still_exits") {
        return;
    }
    let dir = tempdir();
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
        .await
        .unwrap();
    let mut child = spawn(
        dir.path(),
        &["--log-level", "info", "--metrics-address", &address],
    );
    let mut stderr = child.stderr.take().unwrap();
    let t0 = Instant::now();
    both_registered(&kubelet).await;
    eprintln!("registered {:?}", t0.elapsed());
    // One log line of some 250 bytes per Allocate: 6,000 fill the pipe (64 KiB) and the log
    // queue (1,024 lines).
    allocate_and_probe(&kubelet, port, 6000).await;
    eprintln!("allocated {:?}", t0.elapsed());
    let dropped = metric(port, "dxdp_log_lines_dropped_total").await;
    assert!(dropped > 0, "nothing dropped: is stderr a pipe?");
    // Registration goes on: a kubelet restart is followed.
    kubelet.stop().await;
    let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
        .await
        .unwrap();
    both_registered(&kubelet).await;
    // The reader is back: the lost lines are counted in one line.
    let said = tokio::time::timeout(WAIT, async {
        let mut text = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = stderr.read(&mut buf).await.unwrap();
            assert!(n > 0, "stderr closed");
            text.extend_from_slice(&buf[..n]);
            let s = String::from_utf8_lossy(&text);
            if let Some(line) = s.lines().find(|l| l.contains("log lines dropped")) {
                return line.to_string();
            }
        }
    })
    .await
    .expect("a line saying how many lines were dropped");
    assert!(said.contains("WARN"), "{said}");
    eprintln!("said {:?}", t0.elapsed());
    // Nobody reads again; SIGTERM ends the process in time all the same, sockets removed.
    allocate_and_probe(&kubelet, port, 6000).await;
    assert!(metric(port, "dxdp_log_lines_dropped_total").await > dropped);
    let started = Instant::now();
    send(&child, libc::SIGTERM);
    exits_cleanly(
        &mut child,
        Duration::from_secs(10),
        "SIGTERM with stderr not read",
    )
    .await;
    eprintln!("exited {:?} after SIGTERM", started.elapsed());
    assert_eq!(plugin_sockets(dir.path()), Vec::<String>::new());
    kubelet.stop().await;
}

/// SIGHUP re-reads the configuration (here a change the file watch cannot see: the file is a
/// symbolic link into another directory, edited in place there), and SIGUSR1 then stops the
/// daemon as SIGTERM does. Before, both ended the process at once, leaving its sockets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_configuration_and_sigusr1_stops_gracefully() {
    if !common::af_unix("sighup_reloads_the_configuration_and_sigusr1_stops_gracefully") {
        return;
    }
    let dir = tempdir();
    let real = dir.path().join("real");
    let linked = dir.path().join("linked");
    std::fs::create_dir_all(&real).unwrap();
    std::fs::create_dir_all(&linked).unwrap();
    std::fs::write(
        real.join("config.yaml"),
        "resources: {display: {replicas: 1}}\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(real.join("config.yaml"), linked.join("config.yaml")).unwrap();
    let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
        .await
        .unwrap();
    let config = linked.join("config.yaml");
    let mut child = spawn(
        dir.path(),
        &[
            "--config",
            config.to_str().unwrap(),
            "--safety-poll",
            "3600",
        ],
    );
    let display = |n: usize| {
        move |v: &dxdp::kubelet::standin::StandinView| v.devices(DISPLAY).map(<[_]>::len) == Some(n)
    };
    // The fixture's 4 T4s, once each.
    assert!(kubelet.wait_for(WAIT, display(4)).await);
    // Edited in place, in the other directory: no file event reaches the daemon.
    std::fs::write(
        real.join("config.yaml"),
        "resources: {display: {replicas: 2}}\nlogLevel: debug\n",
    )
    .unwrap();
    // A short look that nothing else applies it (this is what SIGHUP is for).
    assert!(
        !kubelet
            .wait_for(Duration::from_millis(300), display(8))
            .await
    );
    send(&child, libc::SIGHUP);
    assert!(
        kubelet.wait_for(WAIT, display(8)).await,
        "SIGHUP applied replicas: 2"
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "SIGHUP ended the process"
    );
    send(&child, libc::SIGUSR1);
    exits_cleanly(&mut child, WAIT, "SIGUSR1").await;
    assert_eq!(plugin_sockets(dir.path()), Vec::<String>::new());
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .await
        .unwrap();
    for line in [
        "SIGHUP: re-reading the configuration",
        "configuration reloaded and applied",
        "logLevel or logFormat changed: it takes effect when the plugin restarts",
        "SIGUSR1: shutting down",
        "device plugin stopped",
    ] {
        assert!(log.contains(line), "{line:?} in {log}");
    }
    // The last line is the stop's own: nothing is cut off.
    assert!(
        log.lines()
            .last()
            .is_some_and(|l| l.contains("device plugin stopped")),
        "{log}"
    );
    kubelet.stop().await;
}

/// Every other signal a runtime may send to end the process stops it gracefully: exit status
/// 0, sockets removed, the ListAndWatch streams ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigquit_sigusr2_sigint_sigalrm_and_sigpwr_stop_gracefully() {
    if !common::af_unix("sigquit_sigusr2_sigint_sigalrm_and_sigpwr_stop_gracefully") {
        return;
    }
    for (signal, name) in [
        (libc::SIGQUIT, "SIGQUIT"),
        (libc::SIGUSR2, "SIGUSR2"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGALRM, "SIGALRM"),
        #[cfg(target_os = "linux")]
        (libc::SIGPWR, "SIGPWR"),
    ] {
        let dir = tempdir();
        let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
            .await
            .unwrap();
        let mut child = spawn(dir.path(), &[]);
        both_registered(&kubelet).await;
        assert_eq!(plugin_sockets(dir.path()).len(), 2, "{name}");
        send(&child, signal);
        exits_cleanly(&mut child, WAIT, name).await;
        assert_eq!(plugin_sockets(dir.path()), Vec::<String>::new(), "{name}");
        assert!(
            kubelet
                .wait_for(WAIT, |v| !v.plugins[DISPLAY].connected)
                .await,
            "{name}: ListAndWatch ended"
        );
        kubelet.stop().await;
    }
}

/// Issue 36: 128 connections to the metrics port that send nothing (its cap is 64) made 9 of 11
/// `/healthz` probes time out, and the kubelet restarted dxdp. The probes now have a listener
/// of their own (`--probe-address`, which the chart's probes use): they answer within 1 s,
/// every time, however many metrics connections sit idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_metrics_connections_beyond_the_cap_do_not_starve_the_probes() {
    if !common::af_unix("idle_metrics_connections_beyond_the_cap_do_not_starve_the_probes") {
        return;
    }
    let dir = tempdir();
    let (metrics_port, probe_port) = (free_port(), free_port());
    let (kubelet, mut child) = ready_with_endpoints(dir.path(), metrics_port, probe_port).await;
    // Twice the metrics listener's cap of 64, sending nothing.
    let mut idle = Vec::new();
    for _ in 0..128 {
        idle.push(
            tokio::net::TcpStream::connect(("127.0.0.1", metrics_port))
                .await
                .unwrap(),
        );
    }
    for round in 0..20 {
        for path in ["/healthz", "/readyz"] {
            let answer = get(probe_port, path, Duration::from_secs(1)).await;
            assert_eq!(answer.map(|(c, _)| c), Ok(200), "{path}, round {round}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The probe listener serves the probes only.
    let (code, body) = get(probe_port, "/metrics", WAIT).await.unwrap();
    assert_eq!(code, 404, "{body}");
    drop(idle);
    send(&child, libc::SIGTERM);
    exits_cleanly(&mut child, WAIT, "SIGTERM").await;
    kubelet.stop().await;
}

/// VmRSS of `pid` in KiB (Linux), `None` elsewhere.
fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Issue 36: 10,000 concurrent Allocate calls took resident memory from 11.6 to ~43 MB for
/// good, and on h2 0.4.20 they make the server close the connection (`GOAWAY
/// ENHANCE_YOUR_CALM too_many_data_frames`: too many small DATA frames buffered). The server now
/// takes 100 streams at a time and the client queues the rest: every call is answered, and
/// memory stays within 5 MiB of idle (`cargo bench --bench burst` measures the release build).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_concurrent_allocates_are_answered_and_memory_stays_bounded() {
    if !common::af_unix("ten_thousand_concurrent_allocates_are_answered_and_memory_stays_bounded") {
        return;
    }
    let dir = tempdir();
    let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
        .await
        .unwrap();
    let mut child = spawn(dir.path(), &["--log-level", "warn"]);
    let pid = child.id().expect("running");
    both_registered(&kubelet).await;
    let client = kubelet.client(DISPLAY).expect("registered");
    // Settled: one call answered, then the idle figure.
    let mut first = client.clone();
    let request = || AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: vec![T4.to_string()],
        }],
    };
    first.allocate(request()).await.unwrap();
    let idle = rss_kib(pid);
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..10_000 {
        let mut client = client.clone();
        let request = request();
        calls.spawn(async move { client.allocate(request).await.map(drop) });
    }
    let answers = tokio::time::timeout(Duration::from_secs(120), async {
        let mut failed = Vec::new();
        while let Some(done) = calls.join_next().await {
            if let Err(e) = done.unwrap() {
                failed.push(e.to_string());
            }
        }
        failed
    })
    .await
    .expect("answered within 120 s");
    assert_eq!(
        answers.len(),
        0,
        "first failures: {:?}",
        &answers[..answers.len().min(3)]
    );
    match (idle, rss_kib(pid)) {
        (Some(idle), Some(after)) => {
            eprintln!("resident memory: idle {idle} KiB, after the burst {after} KiB");
            assert!(
                after <= idle + 5 * 1024,
                "idle {idle} KiB, after {after} KiB"
            );
        }
        _ => eprintln!("skipped the memory check: /proc/<pid>/status is not available here"),
    }
    send(&child, libc::SIGTERM);
    exits_cleanly(&mut child, WAIT, "SIGTERM").await;
    kubelet.stop().await;
}

/// Issue 34: a relative `--config` is hot-reloaded like an absolute one. The file watch reports
/// absolute paths, and a relative path kept as given never matched them, so only the safety poll
/// (10 s by default) saw an edit. The safety poll is an hour here: only the file watch can apply
/// the edit within the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_config_path_is_reloaded_on_its_file_event() {
    if !common::af_unix("a_relative_config_path_is_reloaded_on_its_file_event") {
        return;
    }
    let dir = tempdir();
    let work = dir.path().join("work");
    std::fs::create_dir_all(work.join("cfg")).unwrap();
    std::fs::write(
        work.join("cfg/config.yaml"),
        "resources: {display: {replicas: 1}}\n",
    )
    .unwrap();
    let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
        .await
        .unwrap();
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let bin =
        std::env::var_os("DXDP_TEST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_dxdp").into());
    let mut child = Command::new(bin)
        .current_dir(&work)
        .args(["plugin", "--kubelet-dir"])
        .arg(dir.path())
        .arg("--host-snapshot")
        .arg(common::fixture_path("nvidia-multi-gpu"))
        .args([
            "--config",
            "cfg/config.yaml",
            "--safety-poll",
            "3600",
            "--metrics-address",
            &address,
        ])
        .env_clear()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let display = |n: usize| {
        move |v: &dxdp::kubelet::standin::StandinView| v.devices(DISPLAY).map(<[_]>::len) == Some(n)
    };
    // The fixture's 4 T4s, once each.
    assert!(kubelet.wait_for(WAIT, display(4)).await);
    let applied = "dxdp_config_reloads_total{result=\"applied\"}";
    assert_eq!(metric(port, applied).await, 0);
    // An atomic replace, as editors and `kubectl apply` of a ConfigMap do.
    std::fs::write(
        work.join("cfg/config.yaml.new"),
        "resources: {display: {replicas: 2}}\n",
    )
    .unwrap();
    let edited = Instant::now();
    std::fs::rename(
        work.join("cfg/config.yaml.new"),
        work.join("cfg/config.yaml"),
    )
    .unwrap();
    // Well under the default 10 s safety poll (and the poll is an hour here).
    let bound = Duration::from_secs(3);
    assert!(
        kubelet.wait_for(bound, display(8)).await,
        "the edit of the relative --config was not applied within {bound:?}"
    );
    assert_eq!(metric(port, applied).await, 1);
    eprintln!("applied {:?} after the edit", edited.elapsed());
    send(&child, libc::SIGTERM);
    exits_cleanly(&mut child, WAIT, "SIGTERM").await;
    kubelet.stop().await;
}

/// Issue 33: the metrics port is taken by another program. The metrics endpoint retries in the
/// background, and the probes (the chart's liveness and readiness probes use `--probe-address`,
/// never the metrics port) keep answering 200: a clash on the metrics port never fails liveness,
/// so the kubelet never restarts device serving for it. Once the port is free, metrics are
/// served without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_metrics_port_never_fails_the_probes() {
    if !common::af_unix("a_taken_metrics_port_never_fails_the_probes") {
        return;
    }
    let dir = tempdir();
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let metrics_port = squatter.local_addr().unwrap().port();
    let probe_port = free_port();
    let (kubelet, mut child) = ready_with_endpoints(dir.path(), metrics_port, probe_port).await;
    // Across several of the endpoint's bind retries (0.5 s doubling), liveness and readiness
    // stay 200 and the process keeps running.
    for round in 0..20 {
        for path in ["/healthz", "/readyz"] {
            let answer = get(probe_port, path, Duration::from_secs(1)).await;
            assert_eq!(answer.map(|(c, _)| c), Ok(200), "{path}, round {round}");
        }
        assert!(child.try_wait().unwrap().is_none(), "dxdp exited");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // The metrics port still belongs to the other program.
    assert!(std::net::TcpListener::bind(("127.0.0.1", metrics_port)).is_err());
    drop(squatter);
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        if let Ok((200, body)) = get(metrics_port, "/metrics", Duration::from_secs(2)).await {
            assert!(
                body.contains("dxdp_task_up{task=\"metrics-endpoint\"} 1"),
                "{body}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "metrics never served once the port was free"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    send(&child, libc::SIGTERM);
    exits_cleanly(&mut child, WAIT, "SIGTERM").await;
    kubelet.stop().await;
}
