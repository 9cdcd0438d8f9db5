//! What every bench shares: sizes from the environment, percentiles, atomic file replaces, a
//! deterministic random generator, the per-thread CPU figures of a process and the grpc-go client
//! (`benches/grpc-go`) built for a measurement.
#![allow(dead_code)] // each bench uses a part

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The served resource names.
pub const DISPLAY: &str = "directx.microsoft.com/display";
pub const COMPUTE: &str = "directx.microsoft.com/compute";

/// A size from the environment variable `name`, else `default`.
pub fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `p` quantile (0..1) of sorted durations (nearest rank).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// Replaces `path` atomically (write beside it, then rename), as an editor or ConfigMap would.
pub fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// A small deterministic generator for random intervals (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    /// The next value.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// The CPU time of process `pid` (every thread it ever had, exited ones included: the kernel's
/// per-process CPU clock through `clock_getcpuclockid`). Summing the threads' `schedstat`
/// instead loses the time of threads that exit during a measurement, such as a blocking-pool
/// thread that ran one telemetry sample.
#[cfg(unix)]
pub fn process_cpu(pid: u32) -> Option<Duration> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `clock` is a valid out pointer.
    if unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) } != 0 {
        return None;
    }
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec and `clock` came from the kernel.
    if unsafe { libc::clock_gettime(clock, &mut t) } != 0 {
        return None;
    }
    Some(Duration::new(t.tv_sec as u64, t.tv_nsec as u32))
}

/// Not available on other systems (the benches run on Linux).
#[cfg(not(unix))]
pub fn process_cpu(_pid: u32) -> Option<Duration> {
    None
}

/// The CPU time (ns) and the number of times they ran of all threads of `pid`, summed from
/// `/proc/<pid>/task/*/schedstat` (threads that exited are not counted).
pub fn schedstat(pid: u32) -> Option<(u64, u64)> {
    let mut cpu = 0;
    let mut runs = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let text = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
        let fields: Vec<u64> = text
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        cpu += fields.first()?;
        runs += fields.get(2)?;
    }
    Some((cpu, runs))
}

/// A temporary kubelet directory holding the built-in sample host as `host.yaml`, and that file.
pub fn sample_host_dir() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("dxdp-bench")
        .tempdir_in(std::env::temp_dir())
        .expect("temp dir");
    let host = dir.path().join("host.yaml");
    let facts = dxdp_core::sample::sample_host().expect("sample host");
    let text = dxdp_core::snapshot::write(&facts, dxdp_core::snapshot::Format::Yaml).expect("yaml");
    replace(&host, &text);
    (dir, host)
}

/// The runtime a bench runs the daemon (or a stand-in server) on: two workers, as the daemon's.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Starts the `dxdp plugin` binary (the release build, or `DXDP_BENCH_BIN`) on `dir` with the
/// host snapshot `snapshot`, at log level `warn`, with an empty environment but for
/// `MALLOC_ARENA_MAX` and `GLIBC_TUNABLES` when the bench has them (to compare allocator
/// settings); `extra` arguments come last.
pub fn spawn_plugin(dir: &Path, snapshot: &Path, extra: &[&str]) -> tokio::process::Child {
    let bin =
        std::env::var_os("DXDP_BENCH_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_dxdp").into());
    let mut command = tokio::process::Command::new(bin);
    command
        .args(["plugin", "--log-level", "warn", "--kubelet-dir"])
        .arg(dir)
        .arg("--host-snapshot")
        .arg(snapshot)
        .args(extra)
        .env_clear();
    for name in ["MALLOC_ARENA_MAX", "GLIBC_TUNABLES"] {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("dxdp plugin")
}

/// Builds the grpc-go client into `out`; why not, when it cannot.
pub fn build_go_client(out: &Path) -> Result<PathBuf, String> {
    match Command::new("go").arg("version").output() {
        Ok(o) if o.status.success() => {}
        _ => {
            return Err(
                "`go` not found: install golang-go and golang-google-grpc-dev (Debian) to measure from grpc-go too".into(),
            )
        }
    }
    let gopath = std::env::var("DXDP_BENCH_GOPATH").unwrap_or_else(|_| "/usr/share/gocode".into());
    let binary = out.join("grpc-go-client");
    let built = Command::new("go")
        .args(["build", "-o"])
        .arg(&binary)
        .arg(".")
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/grpc-go"))
        .env("GOPATH", &gopath)
        .env("GO111MODULE", "off")
        .env("GOFLAGS", "")
        .env("GOCACHE", out.join("go-cache"))
        .output()
        .map_err(|e| format!("cannot run go build: {e}"))?;
    if !built.status.success() {
        return Err(format!(
            "go build failed (is golang-google-grpc-dev installed under {gopath}?): {}",
            String::from_utf8_lossy(&built.stderr).trim()
        ));
    }
    Ok(binary)
}
