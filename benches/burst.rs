//! Resident memory of `dxdp plugin` after a burst of concurrent Allocate calls (issue 36): the
//! release binary against the kubelet stand-in, `DXDP_BENCH_BURST` (default 10,000) Allocate
//! calls started at once over the stand-in's one connection, twice; VmRSS idle before, its peak
//! during each burst (sampled every 20 ms), and 1, 10, 30 and `DXDP_BENCH_BURST_WAIT_SECS`
//! (default 60) seconds after the second. Target: back within 5 MiB of idle a minute after.
//!
//! Run with `cargo bench --bench burst` (`DXDP_BENCH_BIN=path/to/dxdp` runs another build).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dxdp::kubelet::standin::{KubeletStandin, StandinView};
use dxdp::kubelet::v1beta1::{AllocateRequest, ContainerAllocateRequest};
use dxdp_core::snapshot;

mod common;

use common::{env_number, COMPUTE, DISPLAY};

fn rss_kib(pid: u32) -> u64 {
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

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn both_listed(v: &StandinView) -> bool {
    v.devices(DISPLAY).is_some() && v.devices(COMPUTE).is_some()
}

/// One burst: `n` Allocate calls started at once; the time until all are answered, the peak
/// VmRSS meanwhile, and the calls that failed with their first error (a server that closes the
/// connection fails the rest).
async fn burst(
    kubelet: &KubeletStandin,
    pid: u32,
    n: usize,
) -> (Duration, u64, usize, Option<String>) {
    let ids: Vec<String> = kubelet
        .view()
        .devices(DISPLAY)
        .expect("display devices")
        .iter()
        .map(|d| d.id.clone())
        .collect();
    let client = kubelet.client(DISPLAY).expect("client");
    let peak = Arc::new(AtomicU64::new(rss_kib(pid)));
    let sampling = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let start = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..n {
        let mut client = client.clone();
        let id = ids[i % ids.len()].clone();
        calls.spawn(async move {
            let request = AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: vec![id],
                }],
            };
            client.allocate(request).await.map(drop)
        });
    }
    let (mut failed, mut first_error) = (0, None);
    while let Some(done) = calls.join_next().await {
        if let Err(e) = done.expect("caller") {
            failed += 1;
            first_error.get_or_insert_with(|| e.to_string());
        }
    }
    let elapsed = start.elapsed();
    peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
    sampling.abort();
    (elapsed, peak.load(Ordering::Relaxed), failed, first_error)
}

#[tokio::main]
async fn main() {
    let n = env_number("DXDP_BENCH_BURST", 10_000) as usize;
    let wait = env_number("DXDP_BENCH_BURST_WAIT_SECS", 60);
    let host = dxdp_core::sample::sample_host().expect("sample host");
    let snapshot_dir = tempfile::tempdir().expect("temp dir");
    let snapshot_path = snapshot_dir.path().join("host.yaml");
    std::fs::write(
        &snapshot_path,
        snapshot::write(&host, snapshot::Format::Yaml).expect("snapshot"),
    )
    .expect("write snapshot");
    let dir = tempfile::Builder::new()
        .prefix("dxdp-bench")
        .tempdir_in(std::env::temp_dir())
        .expect("temp dir");
    let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
        .await
        .expect("stand-in");
    let mut child = spawn(dir.path(), &snapshot_path);
    let pid = child.id().expect("pid");
    assert!(
        kubelet.wait_for(Duration::from_secs(10), both_listed).await,
        "registered"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = rss_kib(pid);
    if idle == 0 {
        println!("resident memory: /proc/<pid>/status is not available here");
        return;
    }
    println!("idle: {:.2} MiB", mib(idle));
    for round in 1..=2 {
        let (elapsed, peak, failed, first_error) = burst(&kubelet, pid, n).await;
        println!(
            "burst {round}: {n} concurrent Allocate calls done in {:.2} s, {failed} failed{}, peak {:.2} MiB ({:+.2} MiB)",
            elapsed.as_secs_f64(),
            first_error.map(|e| format!(" (first: {e})")).unwrap_or_default(),
            mib(peak),
            mib(peak) - mib(idle)
        );
    }
    let after = Instant::now();
    for at in [1, 10, 30, wait] {
        if at > wait {
            continue;
        }
        let until = Duration::from_secs(at).saturating_sub(after.elapsed());
        tokio::time::sleep(until).await;
        let rss = rss_kib(pid);
        println!(
            "{at:>3} s after: {:.2} MiB ({:+.2} MiB over idle; target within 5 MiB at {wait} s)",
            mib(rss),
            mib(rss) - mib(idle)
        );
    }
    let _ = child.kill().await;
    kubelet.stop().await;
}

fn spawn(dir: &Path, snapshot: &Path) -> tokio::process::Child {
    // DXDP_BENCH_BIN: another build of dxdp, to compare (e.g. the one before a change).
    let bin =
        std::env::var_os("DXDP_BENCH_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_dxdp").into());
    tokio::process::Command::new(bin)
        .args(["plugin", "--log-level", "warn", "--kubelet-dir"])
        .arg(dir)
        .arg("--host-snapshot")
        .arg(snapshot)
        .env_clear()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("dxdp plugin")
}
