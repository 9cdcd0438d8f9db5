//! What `dxdp plugin` costs as a process: the time from start to registered, and its resident
//! memory idle and after many allocations.
//!
//! 1. Start to registered: the binary is started `DXDP_BENCH_STARTS` times (default 20) against the
//!    kubelet stand-in; each time, from spawning the process to the stand-in holding both
//!    resources' device lists. Reports p50/p99.
//! 2. Resident memory (VmRSS from `/proc/<pid>/status`): idle after registration, then after
//!    `DXDP_BENCH_ALLOCATIONS` (default 100,000) Allocate calls over the real socket from 8
//!    concurrent callers (targets: under 12 MiB idle, growth under 1 MiB), and the thread count.
//! 3. The metrics endpoint under load: `DXDP_BENCH_METRICS_CLIENTS` (default 1,000) clients
//!    requesting `/metrics` over kept-alive connections (reconnecting when the server closes
//!    one) for `DXDP_BENCH_METRICS_SECS` (default 5) seconds; the peak VmRSS sampled every
//!    50 ms (target under 20 MiB) and VmRSS 2 s after the clients are gone.
//!
//! 4. Memory sharing: the same binary with both classes shared by memory (256 MiB units, 1 GiB
//!    kept back: 85 units per A10 and 316 for the A100 of the sample host, 486 IDs): start to
//!    registered with both memory resources' lists, and resident memory idle and after the
//!    same number of Allocate calls, each of 4 units of one GPU (a pod asking for 1 GiB).
//!
//! Run with `cargo bench --bench footprint` (the binary is then the release build).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use dxdp::kubelet::standin::{KubeletStandin, StandinView};
use dxdp::kubelet::v1beta1::{AllocateRequest, ContainerAllocateRequest};
use dxdp_core::snapshot;

mod common;

use common::{env_number, percentile, COMPUTE, DISPLAY};

/// A number field of `/proc/<pid>/status` (`VmRSS` in KiB, `Threads`).
fn status_field(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn rss_kib(pid: u32) -> Option<u64> {
    status_field(pid, "VmRSS")
}

fn spawn(dir: &Path, snapshot: &Path) -> tokio::process::Child {
    spawn_with(dir, snapshot, &[])
}

fn spawn_with(dir: &Path, snapshot: &Path, extra: &[&str]) -> tokio::process::Child {
    common::spawn_plugin(dir, snapshot, extra)
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
        let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
            .await
            .expect("stand-in");
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
    let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
        .await
        .expect("stand-in");
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
        "resident memory of dxdp plugin: idle {:.2} MiB (target < 12 MiB), {} threads; after {allocations} Allocate calls ({:.1} s, {callers} callers) {:.2} MiB, growth {:+.2} MiB (target < 1 MiB)",
        mib(idle),
        status_field(pid, "Threads").unwrap_or(0),
        elapsed.as_secs_f64(),
        mib(after),
        mib(after) - mib(idle),
    );
    let _ = child.kill().await;
    kubelet.stop().await;
}

/// One client: GET /metrics over a kept-alive connection until `deadline`, reconnecting when the
/// server closes it; counts whole answers.
async fn hammer(address: std::net::SocketAddr, deadline: Instant, answers: Arc<AtomicU64>) {
    const REQUEST: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n";
    let mut buf = Vec::with_capacity(16 * 1024);
    'connect: while Instant::now() < deadline {
        let Ok(Ok(mut stream)) = tokio::time::timeout(
            deadline.saturating_duration_since(Instant::now()),
            tokio::net::TcpStream::connect(address),
        )
        .await
        else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        while Instant::now() < deadline {
            if stream.write_all(REQUEST).await.is_err() {
                continue 'connect;
            }
            buf.clear();
            // Headers, then Content-Length bytes of body.
            let (head_end, length) = loop {
                let mut chunk = [0u8; 4096];
                let read = tokio::time::timeout(
                    deadline.saturating_duration_since(Instant::now()),
                    stream.read(&mut chunk),
                )
                .await;
                match read {
                    Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                    _ => continue 'connect,
                }
                if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    break (end + 4, length);
                }
            };
            while buf.len() < head_end + length {
                let mut chunk = [0u8; 4096];
                match stream.read(&mut chunk).await {
                    Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                    _ => continue 'connect,
                }
            }
            answers.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn metrics_load(snapshot: &Path, clients: usize, secs: u64) {
    let dir = tempfile::Builder::new()
        .prefix("dxdp-bench")
        .tempdir_in(std::env::temp_dir())
        .expect("temp dir");
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
        .await
        .expect("stand-in");
    let mut child = spawn_with(
        dir.path(),
        snapshot,
        &["--metrics-address", &address.to_string()],
    );
    let pid = child.id().expect("pid");
    assert!(
        kubelet.wait_for(Duration::from_secs(10), both_listed).await,
        "registered"
    );
    let probe_deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(address).await.is_err() {
        assert!(
            Instant::now() < probe_deadline,
            "the metrics endpoint listens"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let Some(idle) = rss_kib(pid) else {
        println!("resident memory: /proc/<pid>/status is not available here");
        return;
    };
    let answers = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..clients)
        .map(|_| tokio::spawn(hammer(address, deadline, answers.clone())))
        .collect();
    let mut peak = idle;
    while Instant::now() < deadline {
        peak = peak.max(rss_kib(pid).unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for t in tasks {
        t.await.expect("client");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_kib(pid).unwrap_or(0);
    let mib = |k: u64| k as f64 / 1024.0;
    println!(
        "metrics endpoint, {clients} clients for {secs} s: {} answers; resident memory idle {:.2} MiB, peak {:.2} MiB (target < 20 MiB), 2 s after {:.2} MiB; {} threads",
        answers.load(Ordering::Relaxed),
        mib(idle),
        mib(peak),
        mib(after),
        status_field(pid, "Threads").unwrap_or(0),
    );
    let _ = child.kill().await;
    kubelet.stop().await;
}

fn main() {
    let starts = env_number("DXDP_BENCH_STARTS", 20) as usize;
    let allocations = env_number("DXDP_BENCH_ALLOCATIONS", 100_000) as usize;
    let metrics_clients = env_number("DXDP_BENCH_METRICS_CLIENTS", 1000) as usize;
    let metrics_secs = env_number("DXDP_BENCH_METRICS_SECS", 5);
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
    let runtime = common::runtime();
    runtime.block_on(async move {
        start_to_registered(starts.max(1), &snapshot_path).await;
        memory(allocations, &snapshot_path).await;
        metrics_load(&snapshot_path, metrics_clients.max(1), metrics_secs.max(1)).await;
        memory_sharing(starts.max(1), allocations, &snapshot_path).await;
    });
}

const DISPLAY_MEMORY: &str = "directx.microsoft.com/display-memory";
const COMPUTE_MEMORY: &str = "directx.microsoft.com/compute-memory";

fn both_memory_listed(v: &StandinView) -> bool {
    v.devices(DISPLAY_MEMORY).is_some() && v.devices(COMPUTE_MEMORY).is_some()
}

/// Part 4: the binary with both classes shared by memory.
async fn memory_sharing(starts: usize, allocations: usize, snapshot: &Path) {
    let config_dir = tempfile::Builder::new()
        .prefix("dxdp-bench-config")
        .tempdir_in(std::env::temp_dir())
        .expect("temp dir");
    let config = config_dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "resources:\n  display: {memorySharing: {enabled: true, unit: 256Mi, reserve: 1Gi}}\n  compute: {memorySharing: {enabled: true, unit: 256Mi, reserve: 1Gi}}\n",
    )
    .expect("write config");
    let config = config.to_str().expect("UTF-8 path").to_string();
    let extra = ["--config", config.as_str()];
    let mut times = Vec::with_capacity(starts);
    let mut ids = 0;
    for _ in 0..starts {
        let dir = tempfile::Builder::new()
            .prefix("dxdp-bench")
            .tempdir_in(std::env::temp_dir())
            .expect("temp dir");
        let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
            .await
            .expect("stand-in");
        let start = Instant::now();
        let mut child = spawn_with(dir.path(), snapshot, &extra);
        assert!(
            kubelet
                .wait_for(Duration::from_secs(10), both_memory_listed)
                .await,
            "registered"
        );
        times.push(start.elapsed());
        let view = kubelet.view();
        ids = view.devices(DISPLAY_MEMORY).map_or(0, |d| d.len())
            + view.devices(COMPUTE_MEMORY).map_or(0, |d| d.len());
        let _ = child.kill().await;
        kubelet.stop().await;
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "memory sharing: start -> registered with both memory resources' lists ({ids} IDs; {starts} starts): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        ms(percentile(&times, 0.50)),
        ms(percentile(&times, 0.99)),
        ms(times[times.len() - 1]),
    );

    let dir = tempfile::Builder::new()
        .prefix("dxdp-bench")
        .tempdir_in(std::env::temp_dir())
        .expect("temp dir");
    let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
        .await
        .expect("stand-in");
    let mut child = spawn_with(dir.path(), snapshot, &extra);
    let pid = child.id().expect("pid");
    assert!(
        kubelet
            .wait_for(Duration::from_secs(10), both_memory_listed)
            .await,
        "registered"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let Some(idle) = rss_kib(pid) else {
        println!("memory sharing: resident memory: /proc/<pid>/status is not available here");
        return;
    };
    // Four units of one GPU per request: the first GPU's first units, then the second's.
    let units: Vec<String> = kubelet
        .view()
        .devices(DISPLAY_MEMORY)
        .expect("display memory units")
        .iter()
        .map(|d| d.id.clone())
        .collect();
    let requests: Vec<Vec<String>> = vec![units[..4].to_vec(), units[units.len() - 4..].to_vec()];
    let client = kubelet.client(DISPLAY_MEMORY).expect("client");
    let callers = 8;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..callers {
        let mut client = client.clone();
        let ids = requests[c % requests.len()].clone();
        let n = allocations / callers + usize::from(c < allocations % callers);
        tasks.push(tokio::spawn(async move {
            for _ in 0..n {
                let request = AllocateRequest {
                    container_requests: vec![ContainerAllocateRequest {
                        devices_ids: ids.clone(),
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
        "memory sharing: resident memory of dxdp plugin: idle {:.2} MiB, {} threads; after {allocations} Allocate calls of 4 units ({:.1} s, {callers} callers) {:.2} MiB, growth {:+.2} MiB (target < 1 MiB)",
        mib(idle),
        status_field(pid, "Threads").unwrap_or(0),
        elapsed.as_secs_f64(),
        mib(after),
        mib(after) - mib(idle),
    );
    let _ = child.kill().await;
    kubelet.stop().await;
}
