//! What `dxdp plugin` costs as a process: the time from start to registered, and its resident
//! memory idle and after many allocations.
//!
//! 1. Start to registered: the binary is started `DXDP_BENCH_STARTS` times (default 20) against the
//!    kubelet stand-in; each time, from spawning the process to the stand-in holding both
//!    resources' device lists. Reports p50/p99.
//! 2. Resident memory (VmRSS from `/proc/<pid>/status`): idle after registration, then after
//!    `DXDP_BENCH_ALLOCATIONS` (default 100,000) Allocate calls over the real socket from 8
//!    concurrent callers (targets: under 12 MiB idle, growth under 1 MiB).
//!
//! Run with `cargo bench --bench footprint` (the binary is then the release build).

use std::path::Path;
use std::time::{Duration, Instant};

use dxdp::kubelet::standin::{KubeletStandin, StandinView};
use dxdp::kubelet::v1beta1::{AllocateRequest, ContainerAllocateRequest};
use dxdp_core::snapshot;

const DISPLAY: &str = "directx.microsoft.com/display";
const COMPUTE: &str = "directx.microsoft.com/compute";

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

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

fn spawn(dir: &Path, snapshot: &Path) -> tokio::process::Child {
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
        .expect("dxdp plugin")
}

fn both_listed(v: &StandinView) -> bool {
    v.devices(DISPLAY).is_some() && v.devices(COMPUTE).is_some()
}

async fn start_to_registered(starts: usize, snapshot: &Path) {
    let mut times = Vec::with_capacity(starts);
    for _ in 0..starts {
        let dir = tempfile::Builder::new()
            .prefix("dxdp-bench")
            .tempdir_in(std::env::temp_dir())
            .expect("temp dir");
        let kubelet = KubeletStandin::start(dir.path()).await.expect("stand-in");
        let start = Instant::now();
        let mut child = spawn(dir.path(), snapshot);
        assert!(
            kubelet.wait_for(Duration::from_secs(10), both_listed).await,
            "registered"
        );
        times.push(start.elapsed());
        let _ = child.kill().await;
        kubelet.stop().await;
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "start -> registered with both device lists ({starts} starts of the binary): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        ms(percentile(&times, 0.50)),
        ms(percentile(&times, 0.99)),
        ms(times[times.len() - 1]),
    );
}

async fn memory(allocations: usize, snapshot: &Path) {
    let dir = tempfile::Builder::new()
        .prefix("dxdp-bench")
        .tempdir_in(std::env::temp_dir())
        .expect("temp dir");
    let kubelet = KubeletStandin::start(dir.path()).await.expect("stand-in");
    let mut child = spawn(dir.path(), snapshot);
    let pid = child.id().expect("pid");
    assert!(
        kubelet.wait_for(Duration::from_secs(10), both_listed).await,
        "registered"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let Some(idle) = rss_kib(pid) else {
        println!("resident memory: /proc/<pid>/status is not available here");
        return;
    };
    let ids: Vec<String> = kubelet
        .view()
        .devices(DISPLAY)
        .expect("display devices")
        .iter()
        .map(|d| d.id.clone())
        .collect();
    let client = kubelet.client(DISPLAY).expect("client");
    let callers = 8;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..callers {
        let mut client = client.clone();
        let id = ids[c % ids.len()].clone();
        let n = allocations / callers + usize::from(c < allocations % callers);
        tasks.push(tokio::spawn(async move {
            for _ in 0..n {
                let request = AllocateRequest {
                    container_requests: vec![ContainerAllocateRequest {
                        devices_ids: vec![id.clone()],
                    }],
                };
                client.allocate(request).await.expect("allocate");
            }
        }));
    }
    for t in tasks {
        t.await.expect("caller");
    }
    let elapsed = start.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_kib(pid).unwrap_or(0);
    let mib = |k: u64| k as f64 / 1024.0;
    println!(
        "resident memory of dxdp plugin: idle {:.2} MiB (target < 12 MiB); after {allocations} Allocate calls ({:.1} s, {callers} callers) {:.2} MiB, growth {:+.2} MiB (target < 1 MiB)",
        mib(idle),
        elapsed.as_secs_f64(),
        mib(after),
        mib(after) - mib(idle),
    );
    let _ = child.kill().await;
    kubelet.stop().await;
}

fn main() {
    let starts = env_number("DXDP_BENCH_STARTS", 20) as usize;
    let allocations = env_number("DXDP_BENCH_ALLOCATIONS", 100_000) as usize;
    let dir = tempfile::Builder::new()
        .prefix("dxdp-bench-host")
        .tempdir_in(std::env::temp_dir())
        .expect("temp dir");
    let snapshot_path = dir.path().join("host.yaml");
    let facts = dxdp_core::sample::sample_host().expect("sample host");
    std::fs::write(
        &snapshot_path,
        snapshot::write(&facts, snapshot::Format::Yaml).expect("yaml"),
    )
    .expect("write snapshot");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        start_to_registered(starts.max(1), &snapshot_path).await;
        memory(allocations, &snapshot_path).await;
    });
}
