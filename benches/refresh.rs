//! How fast a host change reaches the kubelet, and what the idle daemon costs.
//!
//! 1. Edit latency: the host snapshot is replaced atomically (write, then rename) at random
//!    intervals, alternating between two hosts; each time, the time from the rename to the kubelet
//!    stand-in receiving the new device list. Reports p50/p99 (target: p99 under 20 ms).
//!    Then the same edits with the `dxdp plugin` binary as its own process, measured from
//!    outside (issue 42's target: p99 at most 4 ms).
//! 2. Idle cost: `dxdp plugin` as its own process, registered with the stand-in and left alone;
//!    its CPU time (the process CPU clock) and the number of times its threads ran, from `/proc/<pid>/task/*/schedstat`
//!    (target: under 0.05% of a core, about one wake-up per second or fewer).
//!
//! Run with `cargo bench --bench refresh`. `DXDP_BENCH_EDITS` (default 200) and
//! `DXDP_BENCH_IDLE_SECS` (default 60) change the sizes.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dxdp::backend::SnapshotFile;
use dxdp::kubelet::standin::KubeletStandin;
use dxdp::plugin::PluginConfig;
use dxdp_core::facts::HostFacts;
use dxdp_core::snapshot;

mod common;

use common::{
    env_number, percentile, process_cpu, replace, sample_host_dir, schedstat, Rng, DISPLAY,
};

/// The two hosts the edits alternate between (the sample host, and it without its first
/// adapter) as YAML, and the number of display devices each lists.
fn two_hosts() -> ([String; 2], [usize; 2]) {
    let full = dxdp_core::sample::sample_host().expect("sample host");
    let mut less: HostFacts = full.clone();
    less.adapters.remove(0);
    (
        [
            snapshot::write(&full, snapshot::Format::Yaml).expect("yaml"),
            snapshot::write(&less, snapshot::Format::Yaml).expect("yaml"),
        ],
        [2, 1],
    )
}

/// `edits` replacements of `path`, 5-50 ms apart, alternating the two hosts (it holds the
/// first); the time from each rename to the kubelet holding the new list, sorted.
async fn edits_seen(kubelet: &KubeletStandin, path: &Path, edits: usize) -> Vec<Duration> {
    let (texts, counts) = two_hosts();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut latencies = Vec::with_capacity(edits);
    for i in 1..=edits {
        tokio::time::sleep(Duration::from_millis(5 + rng.next() % 46)).await;
        let want = counts[i % 2];
        let start = Instant::now();
        replace(path, &texts[i % 2]);
        let seen = kubelet
            .wait_for(Duration::from_secs(5), |v| {
                v.devices(DISPLAY).is_some_and(|d| d.len() == want)
            })
            .await;
        assert!(seen, "edit {i} reached the kubelet");
        latencies.push(start.elapsed());
    }
    latencies.sort();
    latencies
}

fn report_edits(what: &str, target: &str, latencies: &[Duration]) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{what} ({} edits, 5-50 ms apart): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (target {target})",
        latencies.len(),
        ms(percentile(latencies, 0.50)),
        ms(percentile(latencies, 0.99)),
        ms(latencies[latencies.len() - 1]),
    );
}

/// The edits with the daemon in the bench's process.
async fn edit_latency(edits: usize) {
    let dir = tempfile::Builder::new()
        .prefix("dxdp-bench")
        .tempdir_in(std::env::temp_dir())
        .expect("temp dir");
    let (texts, _) = two_hosts();
    let path = dir.path().join("host.yaml");
    replace(&path, &texts[0]);
    let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
        .await
        .expect("stand-in");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let daemon = tokio::spawn(
        dxdp::daemon::Daemon::new(
            PluginConfig::new(dir.path().to_path_buf()),
            Arc::new(SnapshotFile::new(path.clone())),
        )
        .run(async {
            let _ = stopped.await;
        }),
    );
    let registered = kubelet
        .wait_for(Duration::from_secs(10), |v| {
            v.devices(DISPLAY).is_some_and(|d| d.len() == 2)
        })
        .await;
    assert!(registered, "plugin registered");
    let latencies = edits_seen(&kubelet, &path, edits).await;
    report_edits(
        "host snapshot edit -> kubelet list, daemon in the bench's process",
        "p99 < 20 ms",
        &latencies,
    );
    let _ = stop.send(());
    let _ = daemon.await;
    kubelet.stop().await;
}

/// The edits with the `dxdp plugin` binary as its own process, measured from outside.
async fn edit_latency_binary(edits: usize) {
    let dir = tempfile::Builder::new()
        .prefix("dxdp-bench")
        .tempdir_in(std::env::temp_dir())
        .expect("temp dir");
    let (texts, _) = two_hosts();
    let path = dir.path().join("host.yaml");
    replace(&path, &texts[0]);
    let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
        .await
        .expect("stand-in");
    let mut child = common::spawn_plugin(dir.path(), &path, &[]);
    let registered = kubelet
        .wait_for(Duration::from_secs(10), |v| {
            v.devices(DISPLAY).is_some_and(|d| d.len() == 2)
        })
        .await;
    assert!(registered, "plugin registered");
    let latencies = edits_seen(&kubelet, &path, edits).await;
    report_edits(
        "host snapshot edit -> kubelet list, dxdp plugin binary",
        "issue 42: p99 at most 4 ms",
        &latencies,
    );
    let _ = child.kill().await;
    kubelet.stop().await;
}

async fn idle_cost(seconds: u64) {
    let (dir, path) = sample_host_dir();
    let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
        .await
        .expect("stand-in");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_dxdp"))
        .args(["plugin", "--log-level", "warn", "--kubelet-dir"])
        .arg(dir.path())
        .arg("--host-snapshot")
        .arg(&path)
        .env_clear()
        .kill_on_drop(true)
        .spawn()
        .expect("dxdp plugin");
    let pid = child.id().expect("pid");
    let registered = kubelet
        .wait_for(Duration::from_secs(10), |v| {
            v.devices(DISPLAY).is_some() && v.registrations.len() == 2
        })
        .await;
    assert!(registered, "plugin registered");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (Some(before), Some(cpu_before), start) =
        (schedstat(pid), process_cpu(pid), Instant::now())
    else {
        println!("idle cost: /proc/<pid>/task/*/schedstat or the process CPU clock is not available here");
        return;
    };
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let elapsed = start.elapsed();
    let (Some(after), Some(cpu_after)) = (schedstat(pid), process_cpu(pid)) else {
        println!("idle cost: the plugin exited during the measurement");
        return;
    };
    let cpu = cpu_after.saturating_sub(cpu_before);
    // Wake-ups of the threads alive at both reads (an exited thread's are lost).
    let runs = after.1.saturating_sub(before.1);
    println!(
        "idle dxdp plugin over {:.0} s: CPU {:.3} ms = {:.4}% of a core (target < 0.05%), {} thread wake-ups = {:.2}/s",
        elapsed.as_secs_f64(),
        cpu.as_secs_f64() * 1000.0,
        cpu.as_secs_f64() / elapsed.as_secs_f64() * 100.0,
        runs,
        runs as f64 / elapsed.as_secs_f64(),
    );
    let _ = child.kill().await;
    kubelet.stop().await;
}

fn main() {
    let edits = env_number("DXDP_BENCH_EDITS", 200) as usize;
    let idle = env_number("DXDP_BENCH_IDLE_SECS", 60);
    let runtime = common::runtime();
    runtime.block_on(async move {
        edit_latency(edits).await;
        edit_latency_binary(edits).await;
        idle_cost(idle).await;
    });
}
