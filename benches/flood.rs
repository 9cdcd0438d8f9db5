//! A flood of wrong passwords at the metrics endpoint must not tire the daemon (issue 44, H1).
//!
//! The release `dxdp plugin` (or `DXDP_BENCH_BIN`) runs pinned to one CPU (`taskset -c`, CPU
//! `DXDP_BENCH_CPU`, default 1; this process runs on the others), with a web configuration
//! holding one user at bcrypt cost 10, the metrics and probe listeners on. Measured:
//! 1. Allocate's p99 from the grpc-go client (the kubelet's gRPC stack, `benches/grpc-go`,
//!    one caller, `DXDP_BENCH_ITERATIONS` calls, default 1000) while quiet;
//! 2. the same during a flood: 64 clients, each sending `GET /metrics` with a random wrong
//!    password and closing after 1 to 5 ms, again and again;
//! 3. probe failures during the flood (`GET /healthz` on the probe address every 100 ms, 1 s
//!    timeout);
//! 4. how long after the flood ends the daemon's CPU (utime + stime of `/proc/<pid>/stat`, over
//!    100 ms windows) is back below 5% of one CPU.
//!
//! Targets: flood p99 within 5x the quiet p99, no probe failure, idle within 2 s. Run with
//! `cargo bench --bench flood`; it needs `go` with grpc-go (Debian's `golang-go` and
//! `golang-google-grpc-dev`) and `taskset`, and says so when they are missing.

mod common;

/// The bench itself: Linux only (`taskset`, `/proc/<pid>/stat`, `sched_setaffinity`).
#[cfg(target_os = "linux")]
mod flood {
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use base64::Engine as _;
    use dxdp::kubelet::standin::KubeletStandin;
    use dxdp::kubelet::v1beta1::{AllocateRequest, ContainerAllocateRequest};
    use prost::Message;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::common::{self, env_number, Rng, DISPLAY};

    /// The flood's clients.
    const CLIENTS: usize = 64;

    /// Flood p99 over quiet p99, at most.
    const TARGET_RATIO: f64 = 5.0;

    /// Back below [`IDLE_SHARE`] of one CPU within this of the flood's end.
    const TARGET_IDLE: Duration = Duration::from_secs(2);

    /// What counts as idle: this share of one CPU over a 100 ms window.
    const IDLE_SHARE: f64 = 0.05;

    /// Allocate's p99 with one caller from the grpc-go client (`series 1 allocate ...`), or what
    /// the client said when a call failed (each has a 10 s deadline).
    fn go_p99(
        client: &Path,
        socket: &Path,
        request: &AllocateRequest,
        iterations: u64,
    ) -> Result<Duration, String> {
        let hex: String = request
            .encode_to_vec()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let run = Command::new(client)
            .arg("-socket")
            .arg(socket)
            .args(["-allocate", &hex, "-iterations", &iterations.to_string()])
            .output()
            .expect("grpc-go client");
        if !run.status.success() {
            return Err(String::from_utf8_lossy(&run.stderr).trim().to_string());
        }
        for line in String::from_utf8_lossy(&run.stdout).lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if let ["series", "1", "allocate", _, _, _, p99] = f[..] {
                return Ok(Duration::from_nanos(p99.parse().expect("p99")));
            }
        }
        Err("the grpc-go client printed no one-caller Allocate series".into())
    }

    /// The CPU time of `pid`: the kernel's per-process clock (nanoseconds), else utime + stime of
    /// `/proc/<pid>/stat` (clock ticks).
    fn cpu(pid: u32) -> Duration {
        if let Some(t) = common::process_cpu(pid) {
            return t;
        }
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        // The fields after the command's closing parenthesis: utime and stime are 14th and 15th.
        let rest = &text[text.rfind(')').expect("stat format") + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 =
            f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
        // SAFETY: sysconf takes and returns plain integers.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Duration::from_nanos(ticks * 1_000_000_000 / hz)
    }

    /// One flood client: a request with a random wrong password, closed after 1 to 5 ms, again
    /// and again until `stop`.
    async fn flood_client(
        address: std::net::SocketAddr,
        seed: u64,
        stop: Arc<AtomicBool>,
        sent: Arc<AtomicU64>,
    ) {
        let mut rng = Rng(seed | 1);
        while !stop.load(Ordering::Relaxed) {
            // Bounded, so that the clients stop soon after `stop` even when the backlog is full.
            let connect = tokio::net::TcpStream::connect(address);
            let Ok(Ok(mut s)) = tokio::time::timeout(Duration::from_millis(200), connect).await
            else {
                continue;
            };
            let password = format!("{:016x}", rng.next());
            let auth =
                base64::engine::general_purpose::STANDARD.encode(format!("prometheus:{password}"));
            let request =
                format!("GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {auth}\r\n\r\n");
            let write = s.write_all(request.as_bytes());
            if let Ok(Ok(())) = tokio::time::timeout(Duration::from_millis(200), write).await {
                sent.fetch_add(1, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(1 + rng.next() % 5)).await;
            drop(s);
        }
    }

    /// `GET /healthz` on `address` within 1 s: whether it answered 200.
    async fn probe(address: std::net::SocketAddr) -> bool {
        let ask = async {
            let mut s = tokio::net::TcpStream::connect(address).await.ok()?;
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await
                .ok()?;
            let mut answer = Vec::new();
            s.read_to_end(&mut answer).await.ok()?;
            Some(answer.starts_with(b"HTTP/1.1 200"))
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(1), ask).await,
            Ok(Some(true))
        )
    }

    fn free_port() -> std::net::SocketAddr {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
    }

    pub(crate) fn main() {
        let iterations = env_number("DXDP_BENCH_ITERATIONS", 1000);
        let daemon_cpu = env_number("DXDP_BENCH_CPU", 1);
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let client = match common::build_go_client(&out) {
            Ok(c) => c,
            Err(why) => {
                println!("flood: skipped: {why}");
                return;
            }
        };
        if Command::new("taskset").arg("-V").output().is_err() {
            println!("flood: skipped: `taskset` (util-linux) not found: the daemon must be pinned to one CPU");
            return;
        }
        // This process (the clients) on every CPU but the daemon's.
        // SAFETY: a zeroed cpu_set_t is valid; the calls take plain pointers to it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
            for c in (0..cpus).filter(|&c| c as u64 != daemon_cpu) {
                libc::CPU_SET(c, &mut set);
            }
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
        let runtime = common::runtime();
        runtime.block_on(async move {
            let (dir, host) = common::sample_host_dir();
            let hash = bcrypt::hash("the-right-password", 10).expect("bcrypt");
            let web = dir.path().join("web.yml");
            std::fs::write(&web, format!("basic_auth_users:\n  prometheus: '{hash}'\n")).expect("web");
            let (metrics, probes) = (free_port(), free_port());
            let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
                .await
                .expect("kubelet stand-in");
            let bin =
                std::env::var_os("DXDP_BENCH_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_dxdp").into());
            let mut daemon = tokio::process::Command::new("taskset")
                .args(["-c", &daemon_cpu.to_string()])
                .arg(&bin)
                .args(["plugin", "--log-level", "warn", "--kubelet-dir"])
                .arg(dir.path())
                .arg("--host-snapshot")
                .arg(&host)
                .args(["--metrics-address", &metrics.to_string()])
                .args(["--probe-address", &probes.to_string()])
                .arg("--web-config-file")
                .arg(&web)
                .env_clear()
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("dxdp plugin");
            let pid = daemon.id().expect("pid");
            assert!(
                kubelet
                    .wait_for(Duration::from_secs(20), |v| v.devices(DISPLAY).is_some())
                    .await,
                "plugin registered"
            );
            let deadline = Instant::now() + Duration::from_secs(10);
            while !probe(probes).await {
                assert!(Instant::now() < deadline, "the probe endpoint answers");
            }
            let id = kubelet.view().devices(DISPLAY).expect("devices")[0].id.clone();
            let request = AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: vec![id],
                }],
            };
            let socket = dir.path().join(kubelet.view().plugins[DISPLAY].endpoint.clone());
            let blocking = |request: AllocateRequest| {
                let (client, socket) = (client.clone(), socket.clone());
                tokio::task::spawn_blocking(move || go_p99(&client, &socket, &request, iterations))
            };
            tokio::time::sleep(Duration::from_secs(1)).await;
            let quiet = blocking(request.clone())
                .await
                .expect("quiet series")
                .expect("Allocate answers while quiet");

            // The flood, and the probes beside it.
            let stop = Arc::new(AtomicBool::new(false));
            let sent = Arc::new(AtomicU64::new(0));
            let flood: Vec<_> = (0..CLIENTS as u64)
                .map(|i| tokio::spawn(flood_client(metrics, 0x9e37_79b9_7f4a_7c15 ^ i, stop.clone(), sent.clone())))
                .collect();
            let (probed, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
            let prober = {
                let (stop, probed, failed) = (stop.clone(), probed.clone(), failed.clone());
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(Duration::from_millis(100));
                    while !stop.load(Ordering::Relaxed) {
                        tick.tick().await;
                        probed.fetch_add(1, Ordering::Relaxed);
                        if !probe(probes).await {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            };
            tokio::time::sleep(Duration::from_secs(1)).await;
            let cpu_before = cpu(pid);
            let flood_started = Instant::now();
            let flooded = blocking(request.clone()).await.expect("flood series");
            // At least 5 s of flood in all.
            let left = Duration::from_secs(4).saturating_sub(flood_started.elapsed());
            tokio::time::sleep(left).await;
            let flood_cpu = (cpu(pid) - cpu_before).as_secs_f64() / flood_started.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
            for f in flood {
                let _ = f.await;
            }
            let _ = prober.await;
            let ended = Instant::now();

            // Back to idle: the first 100 ms window under IDLE_SHARE of one CPU (up to 15 s).
            let mut last = cpu(pid);
            let mut idle_after = None;
            while ended.elapsed() < Duration::from_secs(15) {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let now = cpu(pid);
                if (now - last).as_secs_f64() / 0.1 < IDLE_SHARE {
                    idle_after = Some(ended.elapsed());
                    break;
                }
                last = now;
            }

            let _ = daemon.kill().await;
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            println!(
                "dxdp pinned to CPU {daemon_cpu}; basic_auth_users at bcrypt cost 10; {CLIENTS} flood clients sent {} wrong passwords in {:.1} s; daemon CPU during the flood {:.0}% of one CPU",
                sent.load(Ordering::Relaxed),
                (ended - flood_started).as_secs_f64() + 1.0,
                flood_cpu * 100.0
            );
            match flooded {
                Ok(flooded) => {
                    let ratio = flooded.as_secs_f64() / quiet.as_secs_f64();
                    println!(
                        "Allocate p99 (grpc-go, 1 caller, {iterations} calls): quiet {:.1}us, flood {:.1}us: {ratio:.2}x (target <= {TARGET_RATIO:.0}x) -> {}",
                        us(quiet),
                        us(flooded),
                        if ratio <= TARGET_RATIO { "met" } else { "NOT met" }
                    );
                }
                Err(why) => println!(
                    "Allocate p99 (grpc-go, 1 caller, {iterations} calls): quiet {:.1}us, flood: a call failed ({why}) -> NOT met",
                    us(quiet)
                ),
            }
            let failed = failed.load(Ordering::Relaxed);
            println!(
                "probe failures (GET /healthz every 100 ms, 1 s timeout): {failed} of {} (target 0) -> {}",
                probed.load(Ordering::Relaxed),
                if failed == 0 { "met" } else { "NOT met" }
            );
            match idle_after {
                Some(t) => println!(
                    "CPU below {:.0}% of one CPU {:.1} s after the flood ended (target <= {:.0} s) -> {}",
                    IDLE_SHARE * 100.0,
                    t.as_secs_f64(),
                    TARGET_IDLE.as_secs_f64(),
                    if t <= TARGET_IDLE { "met" } else { "NOT met" }
                ),
                None => println!(
                    "CPU still above {:.0}% of one CPU 15 s after the flood ended (target <= {:.0} s) -> NOT met",
                    IDLE_SHARE * 100.0,
                    TARGET_IDLE.as_secs_f64()
                ),
            }
            kubelet.stop().await;
            drop(dir);
        });
    }
}

#[cfg(target_os = "linux")]
fn main() {
    flood::main();
}

#[cfg(not(target_os = "linux"))]
fn main() {
    println!("flood: skipped: Linux only (taskset, /proc/<pid>/stat)");
}
