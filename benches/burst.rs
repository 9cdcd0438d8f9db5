//! Resident memory of `dxdp plugin` after bursts of concurrent Allocate calls (issues 36 and
//! 42): the release binary against the kubelet stand-in, `DXDP_BENCH_BURSTS` (default 5) bursts
//! of `DXDP_BENCH_BURST` (default 10,000) Allocate calls started at once, spread over
//! `DXDP_BENCH_BURST_CONNS` (default 200) connections to the plugin's socket, which stay open
//! (as a kubelet's does); VmRSS idle before, its peak during each burst (sampled every 20 ms),
//! and 1, 10, 30 and `DXDP_BENCH_BURST_WAIT_SECS` (default 60) seconds after the last, with where
//! it is (the main heap, other anonymous memory such as malloc's per-thread arenas, thread
//! stacks, the mapped binary). Then the connections close and it is read 2 and 12 s after. Target: back
//! within 5 MiB of idle a minute after. `MALLOC_ARENA_MAX` and `GLIBC_TUNABLES`, when set, are
//! passed to the daemon (to compare allocator settings).
//!
//! Run with `cargo bench --bench burst` (`DXDP_BENCH_BIN=path/to/dxdp` runs another build).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dxdp::kubelet::standin::{KubeletStandin, StandinView};
use dxdp::kubelet::v1beta1::device_plugin_client::DevicePluginClient;
use dxdp::kubelet::v1beta1::{AllocateRequest, ContainerAllocateRequest};
use dxdp_core::snapshot;
use tonic::transport::Channel;

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

/// Where the resident memory of `pid` is, from `/proc/<pid>/smaps`: the main heap (`[heap]`,
/// grown by `brk`), other anonymous mappings of at least 1 MiB (malloc's per-thread arenas
/// reserve 64 MiB each; large allocations are mapped on their own), smaller anonymous mappings
/// (thread stacks and guard pages, small mmaps), and file-backed mappings (the binary, libc).
fn where_kib(pid: u32) -> Option<[u64; 4]> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let mut out = [0u64; 4];
    let mut kind = 0usize;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            let (start, end) = first.split_once('-')?;
            let size = u64::from_str_radix(end, 16).ok()? - u64::from_str_radix(start, 16).ok()?;
            let name = fields.nth(4).unwrap_or("");
            kind = if name == "[heap]" {
                0
            } else if name.is_empty() && size >= 1 << 20 {
                1
            } else if name.is_empty() || name.starts_with('[') {
                2
            } else {
                3
            };
        } else if first == "Rss:" {
            out[kind] += fields.next()?.parse::<u64>().ok()?;
        }
    }
    Some(out)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn describe(pid: u32) -> String {
    match where_kib(pid) {
        Some([heap, big, small, file]) => format!(
            "[heap] {:.2}, anonymous >= 1 MiB (arenas) {:.2}, other anonymous (stacks) {:.2}, files {:.2} MiB",
            mib(heap),
            mib(big),
            mib(small),
            mib(file)
        ),
        None => "smaps not readable".into(),
    }
}

fn both_listed(v: &StandinView) -> bool {
    v.devices(DISPLAY).is_some() && v.devices(COMPUTE).is_some()
}

/// One burst: `n` Allocate calls started at once, round-robin over `clients` (one connection
/// each); the time until all are answered, the peak VmRSS meanwhile, and the calls that failed
/// with their first error (a server that closes a connection fails the rest on it).
async fn burst(
    clients: &[DevicePluginClient<Channel>],
    ids: &[String],
    pid: u32,
    n: usize,
) -> (Duration, u64, usize, Option<String>) {
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
        let mut client = clients[i % clients.len()].clone();
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
    let bursts = env_number("DXDP_BENCH_BURSTS", 5).max(1);
    let conns = env_number("DXDP_BENCH_BURST_CONNS", 200).max(1) as usize;
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
    let view = kubelet.view();
    let ids: Vec<String> = view
        .devices(DISPLAY)
        .expect("display devices")
        .iter()
        .map(|d| d.id.clone())
        .collect();
    let socket = dir.path().join(&view.plugins[DISPLAY].endpoint);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = rss_kib(pid);
    if idle == 0 {
        println!("resident memory: /proc/<pid>/status is not available here");
        return;
    }
    println!("idle: {:.2} MiB ({})", mib(idle), describe(pid));
    let mut clients = Vec::with_capacity(conns);
    for _ in 0..conns {
        let channel = dxdp::transport::Transport::UnixSocket
            .channel(&socket)
            .await
            .expect("a connection to the plugin");
        clients.push(DevicePluginClient::new(channel));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let connected = rss_kib(pid);
    println!(
        "{conns} connections open, idle: {:.2} MiB ({:+.2} MiB)",
        mib(connected),
        mib(connected) - mib(idle)
    );
    for round in 1..=bursts {
        let (elapsed, peak, failed, first_error) = burst(&clients, &ids, pid, n).await;
        println!(
            "burst {round}: {n} concurrent Allocate calls over {conns} connections done in {:.2} s, {failed} failed{}, peak {:.2} MiB ({:+.2} MiB), at its end {:.2} MiB",
            elapsed.as_secs_f64(),
            first_error.map(|e| format!(" (first: {e})")).unwrap_or_default(),
            mib(peak),
            mib(peak) - mib(idle),
            mib(rss_kib(pid)),
        );
    }
    let after = Instant::now();
    let mut marks: Vec<u64> = [1, 10, 30, wait]
        .into_iter()
        .filter(|&at| at <= wait)
        .collect();
    marks.dedup();
    for at in marks {
        let until = Duration::from_secs(at).saturating_sub(after.elapsed());
        tokio::time::sleep(until).await;
        let rss = rss_kib(pid);
        println!(
            "{at:>3} s after: {:.2} MiB ({:+.2} MiB over idle; target within 5 MiB at {wait} s): {}",
            mib(rss),
            mib(rss) - mib(idle),
            describe(pid)
        );
    }
    drop(clients);
    let closed = Instant::now();
    for at in [2, 12] {
        tokio::time::sleep(Duration::from_secs(at).saturating_sub(closed.elapsed())).await;
        let rss = rss_kib(pid);
        println!(
            "{at:>3} s after the {conns} connections closed: {:.2} MiB ({:+.2} MiB over idle): {}",
            mib(rss),
            mib(rss) - mib(idle),
            describe(pid)
        );
    }
    let _ = child.kill().await;
    kubelet.stop().await;
}

fn spawn(dir: &Path, snapshot: &Path) -> tokio::process::Child {
    common::spawn_plugin(dir, snapshot, &[])
}
