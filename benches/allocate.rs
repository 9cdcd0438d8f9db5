//! Allocate latency over the real socket, as a ratio to a no-op unary RPC on the same transport.
//!
//! Allocate is on the pod-start path. The target is at most 1.10x the no-op call
//! (`GetDevicePluginOptions`) at p50 and at p99, with 1 caller and with 64 concurrent callers
//! sharing the one connection (as the kubelet's admission of many pods at once would), measured
//! from two clients: tonic (ours) and grpc-go (the kubelet's gRPC stack, dialled with the
//! kubelet's options; `benches/grpc-go/main.go`, built with `go` from Debian's `golang-go` and
//! `golang-google-grpc-dev` when `go` is on the PATH, skipped with a note otherwise). The daemon
//! runs at its default log level (info), so each Allocate logs a line as in production. Run with
//! `cargo bench --bench allocate`. With grpc-go there is a second target: dxdp's Allocate no slower
//! than a grpc-go plugin that does no work and answers the same bytes (the same program run with
//! `-serve`, called in the same iterations on a connection of its own), at p50.
//! Two cases, each with its own daemon: one whole GPU (one ID per request), and memory sharing
//! (the display GPUs in 1 GiB units, 4 units of one GPU per request, as a pod asking for 4 GiB).
//! `DXDP_BENCH_ITERATIONS` changes the number of calls of each
//! kind per series (default 3000); `DXDP_BENCH_LOG_LEVEL` the daemon's log level (default
//! info; the lines go to the bench's stderr: send it to a pipe, as the container runtime's
//! is, e.g. `2> >(cat >/dev/null)`); `DXDP_BENCH_GOPATH` where Go finds grpc-go (default
//! `/usr/share/gocode`, Debian's).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dxdp::backend::SampleHost;
use dxdp::kubelet::standin::KubeletStandin;
use dxdp::kubelet::v1beta1::device_plugin_client::DevicePluginClient;
use dxdp::kubelet::v1beta1::{AllocateRequest, ContainerAllocateRequest, Empty};
use dxdp::plugin::answer::server::device_plugin_server::{DevicePlugin, DevicePluginServer};
use dxdp::plugin::answer::AllocateAnswer;
use dxdp::plugin::PluginConfig;
use prost::Message;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

mod common;

use common::{percentile, DISPLAY};

/// The target ratio of Allocate to the no-op call at p50 and p99.
const TARGET: f64 = 1.10;

/// Prints one series' percentiles (p50, p90, p99 of the no-op and of Allocate) and returns the
/// worse of the p50 and p99 ratios.
fn report(
    client: &str,
    callers: usize,
    calls: usize,
    noop: [Duration; 3],
    alloc: [Duration; 3],
) -> f64 {
    println!(
        "Allocate vs no-op unary RPC over the plugin's Unix socket, {client} client, {callers} concurrent caller(s), {calls} calls each"
    );
    println!(
        "{:<6} {:>12} {:>12} {:>8}",
        "", "no-op", "Allocate", "ratio"
    );
    let mut worst: f64 = 0.0;
    for (i, name) in ["p50", "p90", "p99"].into_iter().enumerate() {
        let (n, a) = (noop[i], alloc[i]);
        let ratio = a.as_secs_f64() / n.as_secs_f64();
        if name != "p90" {
            worst = worst.max(ratio);
        }
        println!(
            "{name:<6} {:>10.1}us {:>10.1}us {ratio:>7.2}x",
            n.as_secs_f64() * 1e6,
            a.as_secs_f64() * 1e6
        );
    }
    worst
}

/// `callers` concurrent callers on the one connection (as the kubelet has), each interleaving
/// no-op and Allocate calls so that drift hits both alike; prints p50/p90/p99 and returns the
/// worse of the p50 and p99 ratios.
async fn series(
    client: &DevicePluginClient<Channel>,
    request: &AllocateRequest,
    callers: usize,
    iterations: usize,
) -> (f64, Duration) {
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
    let at = |d: &[Duration]| [0.50, 0.90, 0.99].map(|p| percentile(d, p));
    let p50 = percentile(&noop, 0.5);
    (
        report("tonic", callers, noop.len(), at(&noop), at(&alloc)),
        p50,
    )
}

/// What the client alone spends decoding one Allocate answer (prost, as the tonic client does),
/// median of 20,000 decodes of the answer as the server encodes it: the part of the ratio no
/// server can remove.
fn client_decode(answer: &dxdp::kubelet::v1beta1::AllocateResponse) -> (usize, Duration) {
    let bytes = answer.encode_to_vec();
    let mut times = Vec::with_capacity(20_000);
    for _ in 0..20_000 {
        let t = Instant::now();
        let decoded =
            dxdp::kubelet::v1beta1::AllocateResponse::decode(bytes.as_slice()).expect("decode");
        std::hint::black_box(decoded);
        times.push(t.elapsed());
    }
    times.sort();
    (bytes.len(), percentile(&times, 0.5))
}

/// Lowercase hex, as the grpc-go program takes bytes.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The grpc-go reference plugin, killed when dropped.
struct Reference(std::process::Child);

impl Drop for Reference {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the grpc-go reference plugin on `socket`, answering `options` and `answer`; waits (at
/// most 10 s) until it listens.
fn start_reference(
    binary: &Path,
    socket: &Path,
    options: &[u8],
    answer: &[u8],
) -> Result<Reference, String> {
    let child = Command::new(binary)
        .arg("-serve")
        .arg(socket)
        .args(["-options", &hex(options), "-answer", &hex(answer)])
        .spawn()
        .map_err(|e| format!("cannot start the grpc-go reference plugin: {e}"))?;
    let reference = Reference(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        if Instant::now() > deadline {
            return Err(format!(
                "the grpc-go reference plugin did not listen on {} within 10 s",
                socket.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(reference)
}

/// What dxdp answers: GetDevicePluginOptions and Allocate.
struct Answers {
    options: dxdp::kubelet::v1beta1::DevicePluginOptions,
    allocate: dxdp::kubelet::v1beta1::AllocateResponse,
}

/// A tonic device plugin that does no work: it answers the options and Allocate with what dxdp
/// answered (Allocate pre-encoded, as dxdp's server answers), whatever was asked.
struct NoWork {
    options: dxdp::kubelet::v1beta1::DevicePluginOptions,
    allocate: AllocateAnswer,
}

type NoList = std::pin::Pin<
    Box<
        dyn tokio_stream::Stream<
                Item = Result<dxdp::kubelet::v1beta1::ListAndWatchResponse, Status>,
            > + Send,
    >,
>;

#[tonic::async_trait]
impl DevicePlugin for NoWork {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<dxdp::kubelet::v1beta1::DevicePluginOptions>, Status> {
        Ok(Response::new(self.options))
    }

    type ListAndWatchStream = NoList;

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<NoList>, Status> {
        Err(Status::unimplemented("no work"))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<dxdp::kubelet::v1beta1::PreferredAllocationRequest>,
    ) -> Result<Response<dxdp::kubelet::v1beta1::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("no work"))
    }

    async fn allocate(
        &self,
        _: Request<AllocateRequest>,
    ) -> Result<Response<AllocateAnswer>, Status> {
        Ok(Response::new(self.allocate.clone()))
    }

    async fn pre_start_container(
        &self,
        _: Request<dxdp::kubelet::v1beta1::PreStartContainerRequest>,
    ) -> Result<Response<dxdp::kubelet::v1beta1::PreStartContainerResponse>, Status> {
        Err(Status::unimplemented("no work"))
    }
}

/// Serves [`NoWork`] on `socket` on a runtime of its own (two workers, as the daemon's), until
/// the returned sender is dropped.
fn start_tonic_reference(
    socket: &Path,
    answers: &Answers,
) -> Result<tokio::sync::oneshot::Sender<()>, String> {
    let listener = dxdp::transport::Transport::UnixSocket
        .bind(socket)
        .map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?;
    let service = NoWork {
        options: answers.options,
        allocate: AllocateAnswer {
            container_responses: answers
                .allocate
                .container_responses
                .iter()
                .map(dxdp::plugin::answer::encode_container)
                .collect(),
        },
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let runtime = common::runtime();
        runtime.block_on(async move {
            let mut served = dxdp::transport::Served::spawn(
                listener,
                tonic::transport::Server::builder().add_service(DevicePluginServer::new(service)),
            );
            let _ = stopped.await;
            served.stop(Some(Duration::from_secs(2))).await;
        });
    });
    Ok(stop)
}

/// Prints `subject` against `reference` (p50, p90, p99) for Allocate and the no-op; returns the
/// Allocate p50 ratio.
fn compare(
    title: &str,
    names: (&str, &str),
    subject: (&Row, &Row),
    reference: (&Row, &Row),
) -> f64 {
    println!("{title}");
    println!("{:<6} {:>12} {:>12} {:>8}", "", names.1, names.0, "ratio");
    for (i, name) in ["p50", "p90", "p99"].into_iter().enumerate() {
        println!(
            "{name:<6} {:>10.1}us {:>10.1}us {:>7.2}x",
            reference.1 .3[i].as_secs_f64() * 1e6,
            subject.1 .3[i].as_secs_f64() * 1e6,
            subject.1 .3[i].as_secs_f64() / reference.1 .3[i].as_secs_f64()
        );
    }
    // The same comparison for the no-op: what the two gRPC servers cost apart from Allocate.
    println!(
        "no-op, {} vs {}: p50 {:.1} / {:.1}us, {:.2}x; p99 {:.2}x",
        names.0,
        names.1,
        subject.0 .3[0].as_secs_f64() * 1e6,
        reference.0 .3[0].as_secs_f64() * 1e6,
        subject.0 .3[0].as_secs_f64() / reference.0 .3[0].as_secs_f64(),
        subject.0 .3[2].as_secs_f64() / reference.0 .3[2].as_secs_f64()
    );
    subject.1 .3[0].as_secs_f64() / reference.1 .3[0].as_secs_f64()
}

/// One series line of the grpc-go client: callers, kind, calls, p50/p90/p99.
type Row = (usize, String, usize, [Duration; 3]);

/// Runs the grpc-go client against `socket`, and alike against two plugins that do no work and
/// answer `answers`: grpc-go's (the target's reference) and tonic's (which tells the gRPC stack
/// apart from Allocate's work). Returns the worst ratio to the no-op and the worst p50 ratio to
/// the grpc-go reference, or why it did not run.
fn go_series(
    socket: &Path,
    request: &AllocateRequest,
    answers: &Answers,
    iterations: usize,
) -> Result<(f64, Option<f64>), String> {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let binary = common::build_go_client(&out)?;
    let mut references = Vec::new();
    let go_socket = socket.with_file_name("grpc-go-reference.sock");
    let go_reference = match start_reference(
        &binary,
        &go_socket,
        &answers.options.encode_to_vec(),
        &answers.allocate.encode_to_vec(),
    ) {
        Ok(r) => {
            references.push(format!("reference={}", go_socket.display()));
            Some(r)
        }
        Err(why) => {
            println!("grpc-go reference plugin: skipped: {why}");
            None
        }
    };
    let tonic_socket = socket.with_file_name("tonic-reference.sock");
    let tonic_reference = match start_tonic_reference(&tonic_socket, answers) {
        Ok(stop) => {
            references.push(format!("tonic={}", tonic_socket.display()));
            Some(stop)
        }
        Err(why) => {
            println!("tonic reference plugin: skipped: {why}");
            None
        }
    };
    let mut command = Command::new(&binary);
    command.arg("-socket").arg(socket).args([
        "-allocate",
        &hex(&request.encode_to_vec()),
        "-iterations",
        &iterations.to_string(),
        "-references",
        &references.join(","),
    ]);
    let run = command
        .output()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    drop(go_reference);
    drop(tonic_reference);
    if !run.status.success() {
        return Err(format!(
            "the grpc-go client failed: {}",
            String::from_utf8_lossy(&run.stderr).trim()
        ));
    }
    // "series <callers> <kind> <calls> <p50_ns> <p90_ns> <p99_ns>"
    let mut rows: Vec<Row> = Vec::new();
    for line in String::from_utf8_lossy(&run.stdout).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if let ["series", callers, kind, calls, p50, p90, p99] = f[..] {
            let n = |s: &str| s.parse::<u64>().map(Duration::from_nanos);
            if let (Ok(c), Ok(calls), Ok(a), Ok(b), Ok(d)) =
                (callers.parse(), calls.parse(), n(p50), n(p90), n(p99))
            {
                rows.push((c, kind.to_string(), calls, [a, b, d]));
            }
        }
    }
    let mut worst: f64 = 0.0;
    let mut against_reference: Option<f64> = None;
    let bytes = answers.allocate.encoded_len();
    for callers in [1usize, 64] {
        let find = |kind: &str| rows.iter().find(|r| r.0 == callers && r.1 == kind);
        let (Some(noop), Some(alloc)) = (find("noop"), find("allocate")) else {
            return Err(format!(
                "the grpc-go client printed no {callers}-caller series"
            ));
        };
        worst = worst.max(report("grpc-go", callers, noop.2, noop.3, alloc.3));
        let go = find("reference-noop").zip(find("reference-allocate"));
        let tonic = find("tonic-noop").zip(find("tonic-allocate"));
        let calls = alloc.2;
        if let Some(go) = go {
            let ratio = compare(
                &format!("Allocate, dxdp vs a grpc-go plugin that does no work and answers the same {bytes} bytes (grpc-go client, {callers} caller(s), {calls} calls each)"),
                ("dxdp", "grpc-go"),
                (noop, alloc),
                go,
            );
            against_reference = Some(against_reference.unwrap_or(0.0).max(ratio));
        }
        if let Some(tonic) = tonic {
            compare(
                &format!("Allocate, dxdp vs a tonic plugin that does no work (Allocate's own work; {callers} caller(s))"),
                ("dxdp", "tonic"),
                (noop, alloc),
                tonic,
            );
        }
        if let (Some(tonic), Some(go)) = (tonic, go) {
            compare(
                &format!("Allocate, tonic vs grpc-go, both doing no work (the gRPC stacks; {callers} caller(s))"),
                ("tonic", "grpc-go"),
                tonic,
                go,
            );
        }
    }
    Ok((worst, against_reference))
}

/// The memory-sharing case's resource: the display GPUs in 1 GiB units (21 per A10 of the
/// sample host), a request of 4 units of one GPU (what a pod asking for 4 GiB sends).
const DISPLAY_MEMORY: &str = "directx.microsoft.com/display-memory";

/// The units one Allocate of the memory-sharing case asks for.
const MEMORY_UNITS: usize = 4;

fn main() {
    let iterations: usize = std::env::var("DXDP_BENCH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    // The daemon's default log level: each Allocate logs a line, as in production.
    let level = std::env::var("DXDP_BENCH_LOG_LEVEL").unwrap_or_else(|_| "info".into());
    let _log = dxdp::logging::init(dxdp::logging::LogFormat::Text, &level).expect("log level");
    let runtime = common::runtime();
    runtime.block_on(async move {
        println!("== one whole GPU ({DISPLAY}, 1 ID per request)");
        case(dxdp::config::Config::default(), DISPLAY, 1, iterations).await;
        println!();
        println!(
            "== memory sharing ({DISPLAY_MEMORY}: 1 GiB units, 1 GiB kept back; {MEMORY_UNITS} units of one GPU per request)"
        );
        let memory = dxdp::config::Config::default().with_memory_sharing(
            dxdp_core::devices::Resource::Display,
            1 << 30,
            1 << 30,
        );
        case(memory, DISPLAY_MEMORY, MEMORY_UNITS, iterations).await;
    });
}

/// One case: the daemon on the sample host serving `config`, Allocate of the first `units` IDs
/// of `name` against the no-op call, with the targets.
async fn case(config: dxdp::config::Config, name: &str, units: usize, iterations: usize) {
    {
        let dir = tempfile::Builder::new()
            .prefix("dxdp-bench")
            .tempdir_in(std::env::temp_dir())
            .expect("temp dir");
        let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
            .await
            .expect("kubelet stand-in");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let mut plugin_config = PluginConfig::new(dir.path().to_path_buf());
        plugin_config.config = config.into();
        let daemon = tokio::spawn(
            dxdp::daemon::Daemon::new(plugin_config, Arc::new(SampleHost)).run(async {
                let _ = stopped.await;
            }),
        );
        assert!(
            kubelet
                .wait_for(Duration::from_secs(10), |v| v.devices(name).is_some())
                .await,
            "plugin registered"
        );
        let ids: Vec<String> = kubelet.view().devices(name).expect("devices")[..units]
            .iter()
            .map(|d| d.id.clone())
            .collect();
        let mut client = kubelet.client(name).expect("client");
        let request = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest { devices_ids: ids }],
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
        let mut one_caller_noop = Duration::ZERO;
        for callers in [1usize, 64] {
            let (ratio, noop) = series(&client, &request, callers, iterations).await;
            worst = worst.max(ratio);
            if callers == 1 {
                one_caller_noop = noop;
            }
        }
        let answer = client
            .allocate(request.clone())
            .await
            .expect("allocate")
            .into_inner();
        let (size, decode) = client_decode(&answer);
        println!(
            "the tonic client alone decodes the {size}-byte Allocate answer in {:.2}us (p50): with one caller's no-op at {:.1}us, no server can bring Allocate below {:.2}x at p50",
            decode.as_secs_f64() * 1e6,
            one_caller_noop.as_secs_f64() * 1e6,
            (one_caller_noop + decode).as_secs_f64() / one_caller_noop.as_secs_f64()
        );
        let answers = Answers {
            options: client
                .get_device_plugin_options(Empty {})
                .await
                .expect("options")
                .into_inner(),
            allocate: answer,
        };
        let endpoint = kubelet.view().plugins[name].endpoint.clone();
        let socket = dir.path().join(endpoint);
        let go = {
            let request = request.clone();
            tokio::task::spawn_blocking(move || go_series(&socket, &request, &answers, iterations))
                .await
                .expect("grpc-go series")
        };
        let mut against_reference = None;
        let clients = match go {
            Ok((ratio, reference)) => {
                worst = worst.max(ratio);
                against_reference = reference;
                "tonic and grpc-go clients"
            }
            Err(why) => {
                println!("grpc-go client: skipped: {why}");
                "tonic client only"
            }
        };
        println!(
            "target: at most {TARGET:.2}x at p50 and p99 with 1 and 64 callers ({clients}) -> {}",
            if worst <= TARGET { "met" } else { "NOT met" }
        );
        match against_reference {
            Some(r) => println!(
                "target: Allocate no slower than the grpc-go plugin answering the same bytes, p50 with 1 and 64 callers: worst {r:.2}x -> {}",
                if r <= 1.0 { "met" } else { "NOT met" }
            ),
            None => println!(
                "target: Allocate no slower than a grpc-go plugin answering the same bytes: not measured (see above)"
            ),
        }
        let _ = stop.send(());
        let _ = daemon.await;
        kubelet.stop().await;
    }
}
