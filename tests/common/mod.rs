//! Fixture hosts shared by the integration tests.
#![allow(dead_code)] // each test crate uses a part

use std::path::{Path, PathBuf};

use dxdp_core::facts::HostFacts;

/// Every fixture host in `tests/fixtures/`.
pub const FIXTURES: [&str; 14] = [
    "nvidia-multi-gpu",
    "amd-radeon",
    "intel-igpu",
    "compute-only",
    "broken-drivers",
    "hostile-registry",
    "hostile-paths",
    "hostile-system-root",
    "in-container",
    "ws2019-old",
    "status-and-unsupported",
    "adapter-match",
    "telemetry-t4",
    "telemetry-leak",
];

/// The file of a fixture host.
pub fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("{name}.yaml"))
}

/// The facts of a fixture host, or of the built-in sample host for `"sample"`.
pub fn facts(name: &str) -> HostFacts {
    if name == "sample" {
        return dxdp_core::sample::sample_host().unwrap_or_else(|e| panic!("sample host: {e}"));
    }
    dxdp_core::snapshot::read_file(&fixture_path(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The transport the daemon tests run on: AF_UNIX where it works (Linux, Windows), the loopback
/// transport where it does not (Wine 8 has no AF_UNIX: `dxdp::transport` explains the loopback
/// transport), said once per test binary so that every run shows which one it tested.
/// `DXDP_TEST_TRANSPORT=loopback` asks for the loopback transport anywhere.
pub fn transport() -> dxdp::transport::Transport {
    use dxdp::transport::Transport;
    static CHOSEN: std::sync::OnceLock<Transport> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        if std::env::var("DXDP_TEST_TRANSPORT").as_deref() == Ok("loopback") {
            eprintln!("daemon tests run over the loopback transport (DXDP_TEST_TRANSPORT=loopback)");
            return Transport::Loopback;
        }
        let dir = socket_tempdir();
        match probe_bind(&dir.path().join("probe.sock")) {
            Ok(()) => Transport::UnixSocket,
            Err(e) => {
                eprintln!("daemon tests run over the loopback transport: AF_UNIX sockets are not available here ({e})");
                Transport::Loopback
            }
        }
    })
}

/// Where a node-local API (PodResources, CRI) is served in a test, as on a node: a socket file
/// `name` in `dir` on Unix, a named pipe unique to this process and moment on Windows.
pub fn local_endpoint(dir: &Path, name: &str) -> dxdp::transport::Endpoint {
    use dxdp::transport::Endpoint;
    if cfg!(windows) {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        Endpoint::Pipe(format!(
            r"\\.\pipe\dxdp-test-{}-{nanos}-{name}",
            std::process::id()
        ))
    } else {
        Endpoint::Socket(dir.join(name))
    }
}

/// Whether AF_UNIX sockets work here, for the tests that run the `dxdp` binary (which serves
/// the kubelet over AF_UNIX only). Wine (the Windows tests in CI) has no AF_UNIX at all: there
/// such a test says why it is skipped and returns, rather than failing or passing silently.
pub fn af_unix(test: &str) -> bool {
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("temporary directory: {e}"),
    };
    let path = dir.path().join("probe.sock");
    match probe_bind(&path) {
        Ok(()) => true,
        Err(e) => {
            eprintln!("skipped {test}: AF_UNIX sockets are not available here ({e}); Wine has none, run it on Linux or Windows");
            false
        }
    }
}

#[cfg(unix)]
fn probe_bind(path: &Path) -> std::io::Result<()> {
    std::os::unix::net::UnixListener::bind(path).map(drop)
}

#[cfg(windows)]
fn probe_bind(path: &Path) -> std::io::Result<()> {
    uds_windows::UnixListener::bind(path).map(drop)
}

/// Where [`socket_tempdir`] makes its directories: `/tmp` on Unix (short enough for AF_UNIX
/// socket paths), the temporary directory elsewhere.
pub fn socket_tempdir_base() -> PathBuf {
    if cfg!(unix) {
        PathBuf::from("/tmp")
    } else {
        std::env::temp_dir()
    }
}

/// A temporary directory for a kubelet directory: short enough for AF_UNIX socket paths.
pub fn socket_tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dxdp")
        .tempdir_in(socket_tempdir_base())
        .unwrap_or_else(|e| panic!("temporary directory: {e}"))
}

/// Longer than any test, so that only events drive the daemons under test.
pub const NO_SAFETY_POLL: std::time::Duration = std::time::Duration::from_secs(3600);

/// The daemon's configuration for tests on `kubelet_dir`: driven by events alone (the safety
/// poll an hour away) and registration retried fast (50 ms doubling to 200 ms, 5 s a call).
pub fn plugin_config(kubelet_dir: &Path) -> dxdp::plugin::PluginConfig {
    let mut c = dxdp::plugin::PluginConfig::new(kubelet_dir.to_path_buf());
    c.safety_poll = NO_SAFETY_POLL;
    c.transport = transport();
    c.backoff = dxdp::util::retry::Backoff {
        initial: std::time::Duration::from_millis(50),
        max: std::time::Duration::from_millis(200),
        timeout: std::time::Duration::from_secs(5),
    };
    c
}

/// Writes `facts` as a host snapshot at `path`, atomically (write beside it, then rename).
pub fn write_facts(path: &Path, facts: &HostFacts) {
    let text = dxdp_core::snapshot::write(facts, dxdp_core::snapshot::Format::Yaml)
        .unwrap_or_else(|e| panic!("snapshot: {e}"));
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    std::fs::rename(&tmp, path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// `series -> value` (as written) of every sample line of OpenMetrics text.
pub fn metric_samples(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Sends SIGTERM to `child` (as the kubelet's container runtime does) and asserts that it exits
/// successfully within `limit`.
pub async fn terminate(child: &mut tokio::process::Child, limit: std::time::Duration) {
    let pid = child.id().expect("running").to_string();
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = tokio::time::timeout(limit, child.wait())
        .await
        .expect("exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// Deletes the directory `dir` with everything in it and creates it again. On Windows a
/// directory that a process still has open (the daemon's watch) is only *marked* for deletion,
/// and creating the name again fails (`ERROR_ALREADY_EXISTS`, or access denied) until that
/// handle is closed: so this retries for at most 10 s, which also checks that the daemon lets
/// go of a deleted directory. There is no event to wait on: the retries are 20 ms apart.
pub fn recreate_dir(dir: &Path) {
    std::fs::remove_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match std::fs::create_dir(dir) {
            Ok(()) => return,
            Err(e)
                if cfg!(windows)
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::PermissionDenied
                    )
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("{} could not be created again: {e}", dir.display()),
        }
    }
}

/// One HTTP/1.1 exchange on a fresh connection to a dxdp endpoint (`Connection: close`, the
/// answer read to its end within 20 s): status, raw headers, body. Panics on anything else, as a
/// test should.
pub async fn http(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("{method} {path} HTTP/1.1\r\nHost: dxdp\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(20),
        stream.read_to_end(&mut raw),
    )
    .await
    .expect("the server answers and closes")
    .unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_string(), body.to_string())
}
