//! Allocate latency over the real socket, as a ratio to a no-op unary RPC on the same transport.
//!
//! Allocate is on the pod-start path. The target is at most 1.25x the no-op call
//! (`GetDevicePluginOptions`) at p99, with 1 caller and with 64 concurrent callers sharing the one
//! connection (as the kubelet's admission of many pods at once would). Run with
//! `cargo bench --bench allocate`; `DXDP_BENCH_ITERATIONS` changes the number of calls of each
//! kind per series (default 3000).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dxdp::backend::SampleHost;
use dxdp::kubelet::standin::KubeletStandin;
use dxdp::kubelet::v1beta1::device_plugin_client::DevicePluginClient;
use dxdp::kubelet::v1beta1::{AllocateRequest, ContainerAllocateRequest, Empty};
use dxdp::plugin::{self, PluginConfig};
use tonic::transport::Channel;

const DISPLAY: &str = "directx.microsoft.com/display";

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// The target ratio of Allocate to the no-op call at p99.
const TARGET: f64 = 1.25;

/// `callers` concurrent callers on the one connection (as the kubelet has), each interleaving
/// no-op and Allocate calls so that drift hits both alike; prints p50/p90/p99 and returns the
/// p99 ratio.
async fn series(
    client: &DevicePluginClient<Channel>,
    request: &AllocateRequest,
    callers: usize,
    iterations: usize,
) -> f64 {
    let per_caller = iterations.div_ceil(callers).max(1);
    let mut tasks = Vec::with_capacity(callers);
    for _ in 0..callers {
        let mut client = client.clone();
        let request = request.clone();
        tasks.push(tokio::spawn(async move {
            let mut noop = Vec::with_capacity(per_caller);
            let mut alloc = Vec::with_capacity(per_caller);
            for _ in 0..per_caller {
                let t = Instant::now();
                client
                    .get_device_plugin_options(Empty {})
                    .await
                    .expect("noop");
                noop.push(t.elapsed());
                let t = Instant::now();
                client.allocate(request.clone()).await.expect("allocate");
                alloc.push(t.elapsed());
            }
            (noop, alloc)
        }));
    }
    let mut noop = Vec::with_capacity(per_caller * callers);
    let mut alloc = Vec::with_capacity(per_caller * callers);
    for t in tasks {
        let (n, a) = t.await.expect("caller");
        noop.extend(n);
        alloc.extend(a);
    }
    noop.sort();
    alloc.sort();
    println!(
        "Allocate vs no-op unary RPC over the plugin's Unix socket, {callers} concurrent caller(s), {} calls each",
        noop.len()
    );
    println!(
        "{:<6} {:>12} {:>12} {:>8}",
        "", "no-op", "Allocate", "ratio"
    );
    let mut p99 = 0.0;
    for (name, p) in [("p50", 0.50), ("p90", 0.90), ("p99", 0.99)] {
        let (n, a) = (percentile(&noop, p), percentile(&alloc, p));
        let ratio = a.as_secs_f64() / n.as_secs_f64();
        if name == "p99" {
            p99 = ratio;
        }
        println!(
            "{name:<6} {:>10.1}us {:>10.1}us {ratio:>7.2}x",
            n.as_secs_f64() * 1e6,
            a.as_secs_f64() * 1e6
        );
    }
    p99
}

fn main() {
    let iterations: usize = std::env::var("DXDP_BENCH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let dir = tempfile::Builder::new()
            .prefix("dxdp-bench")
            .tempdir_in(std::env::temp_dir())
            .expect("temp dir");
        let kubelet = KubeletStandin::start(dir.path())
            .await
            .expect("kubelet stand-in");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let daemon = tokio::spawn(plugin::run(
            PluginConfig::new(dir.path().to_path_buf()),
            Arc::new(SampleHost),
            async {
                let _ = stopped.await;
            },
        ));
        assert!(
            kubelet
                .wait_for(Duration::from_secs(10), |v| v.devices(DISPLAY).is_some())
                .await,
            "plugin registered"
        );
        let id = kubelet.view().devices(DISPLAY).expect("devices")[0]
            .id
            .clone();
        let mut client = kubelet.client(DISPLAY).expect("client");
        let request = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![id],
            }],
        };

        // Warm up both paths.
        for _ in 0..200 {
            client
                .get_device_plugin_options(Empty {})
                .await
                .expect("noop");
            client.allocate(request.clone()).await.expect("allocate");
        }
        let mut worst: f64 = 0.0;
        for callers in [1usize, 64] {
            worst = worst.max(series(&client, &request, callers, iterations).await);
        }
        println!(
            "target: at most {TARGET:.2}x at p99 with 1 and 64 callers -> {}",
            if worst <= TARGET { "met" } else { "NOT met" }
        );
        let _ = stop.send(());
        let _ = daemon.await;
        kubelet.stop().await;
    });
}
