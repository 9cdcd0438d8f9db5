//! The metrics and probes endpoint over real HTTP, with the daemon on a temporary kubelet
//! directory and the kubelet stand-in speaking the real protocol: `/readyz` before the kubelet
//! exists, after registration, across a kubelet restart with refused registrations; `/healthz`;
//! unknown paths and methods; exact metric values after allocations, host refreshes and
//! configuration reloads.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use dxdp::backend::SnapshotFile;
use dxdp::config::{Config, Inputs};
use dxdp::kubelet::standin::KubeletStandin;
use dxdp::observe::Observe;
use dxdp::plugin::{PluginConfig, PluginError};
use dxdp_core::devices::Resource;
use dxdp_core::facts::HostFacts;
use dxdp_core::pipeline::{discover, PipelineConfig};
use dxdp_core::snapshot;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::common;

const DISPLAY: &str = "directx.microsoft.com/display";
const COMPUTE: &str = "directx.microsoft.com/compute";
const WAIT: Duration = Duration::from_secs(10);
use common::NO_SAFETY_POLL;

/// One HTTP/1.1 exchange on a fresh connection: status, raw headers, body.
async fn request(addr: SocketAddr, method: &str, path: &str) -> (u16, String, String) {
    common::http(addr, method, path).await
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let (status, _, body) = request(addr, "GET", path).await;
    (status, body)
}

/// Asks `path` until `done` holds for its answer (bounded: fails after [`WAIT`]).
async fn until(addr: SocketAddr, path: &str, what: &str, done: impl Fn(u16, &str) -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (status, body) = get(addr, path).await;
        if done(status, &body) {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for {what}: {path} answers {status} {body:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `series -> value` of the OpenMetrics text.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

async fn metrics(addr: SocketAddr) -> BTreeMap<String, f64> {
    let (status, head, body) = request(addr, "GET", "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text; version=1.0.0; charset=utf-8"),
        "{head}"
    );
    samples(&body)
}

/// Waits until `series` is at least `value`. File events can come twice for one edit (a
/// rename is reported as its two halves and as a whole), and each read is counted, so counts
/// of reads are checked as lower bounds.
async fn metric_at_least(addr: SocketAddr, series: &str, value: f64) {
    until(addr, "/metrics", series, |_, body| {
        samples(body).get(series).is_some_and(|v| *v >= value)
    })
    .await;
}

async fn metric_is(addr: SocketAddr, series: &str, value: f64) {
    until(addr, "/metrics", series, |_, body| {
        samples(body).get(series) == Some(&value)
    })
    .await;
}

/// Both resources are registered now, after `ok` successful registrations each.
fn assert_registered(m: &BTreeMap<String, f64>, ok: f64) {
    for name in [DISPLAY, COMPUTE] {
        let registered = series("dxdp_kubelet_registered", &[("resource", name)]);
        assert_eq!(m[&registered], 1.0, "{name}");
        let total = series(
            "dxdp_kubelet_registrations_total",
            &[("resource", name), ("result", "ok")],
        );
        assert_eq!(m[&total], ok, "{name}");
    }
}

fn series(name: &str, labels: &[(&str, &str)]) -> String {
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    format!("{name}{{{}}}", labels.join(","))
}

struct Daemon {
    dir: tempfile::TempDir,
    snapshot: PathBuf,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), PluginError>>>,
    observe: Observe,
}

impl Daemon {
    fn write_facts(snapshot: &Path, facts: &HostFacts) {
        let text = snapshot::write(facts, snapshot::Format::Yaml).unwrap();
        replace(snapshot, &text);
    }

    /// Starts the daemon on a new temporary kubelet directory with the sample host, metrics on
    /// a free local port, running `reload` when given.
    async fn start(dir: tempfile::TempDir, config: Config, reload: Option<Inputs>) -> Daemon {
        Self::start_with(dir, config, reload, |_| {}).await
    }

    /// [`Daemon::start`], with `tweak` applied to the daemon's settings.
    async fn start_with(
        dir: tempfile::TempDir,
        mut config: Config,
        reload: Option<Inputs>,
        tweak: impl FnOnce(&mut PluginConfig),
    ) -> Daemon {
        let snapshot = dir.path().join("host.yaml");
        Self::write_facts(&snapshot, &common::facts("sample"));
        config.metrics_address = Some("127.0.0.1:0".parse().unwrap());
        let mut pc = common::plugin_config(dir.path());
        pc.config = config.clone().into();
        tweak(&mut pc);
        let observe = pc.observe.clone();
        let mut listening = observe.listening();
        let (stop, stopped) = oneshot::channel::<()>();
        let source = Arc::new(SnapshotFile::new(snapshot.clone()));
        let daemon = dxdp::daemon::Daemon::new(pc, source);
        let daemon = match reload {
            Some(inputs) => daemon.reload(inputs),
            None => daemon,
        };
        let task = tokio::spawn(daemon.run(async {
            let _ = stopped.await;
        }));
        let addr = tokio::time::timeout(WAIT, listening.wait_for(|a| a.is_some()))
            .await
            .expect("the endpoint listens")
            .unwrap()
            .unwrap();
        Daemon {
            dir,
            snapshot,
            addr,
            stop: Some(stop),
            task: Some(task),
            observe,
        }
    }

    async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(WAIT, task)
                .await
                .expect("plugin stops")
                .unwrap()
                .unwrap();
        }
        assert_eq!(
            *self.observe.listening().borrow(),
            None,
            "the endpoint stops with the daemon"
        );
        assert!(
            tokio::net::TcpStream::connect(self.addr).await.is_err(),
            "nothing listens on {} after the daemon stopped",
            self.addr
        );
    }
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dxdp")
        .tempdir_in(common::socket_tempdir_base())
        .unwrap()
}

fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn physical(facts: &HostFacts, r: Resource) -> usize {
    discover(facts, &PipelineConfig::default())
        .devices_for(r)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_registration_through_a_kubelet_restart() {
    let d = Daemon::start(tempdir(), Config::default(), None).await;
    let sock = d.dir.path().join("kubelet.sock");
    let waiting = format!(
        "waiting for the kubelet: {} does not exist\n",
        sock.display()
    );
    until(d.addr, "/readyz", "no kubelet yet", |s, b| {
        s == 503 && b == waiting
    })
    .await;
    until(d.addr, "/healthz", "the supervisor running", |s, b| {
        s == 200 && b == "ok\n"
    })
    .await;
    let m = metrics(d.addr).await;
    for name in [DISPLAY, COMPUTE] {
        assert_eq!(
            m[&series("dxdp_kubelet_registered", &[("resource", name)])],
            0.0
        );
    }

    // Only GET and HEAD on the three paths.
    let (status, head, body) = request(d.addr, "GET", "/nope").await;
    assert_eq!(status, 404, "{head}");
    assert!(body.contains("/metrics, /healthz and /readyz"), "{body}");
    let (status, head, _) = request(d.addr, "POST", "/metrics").await;
    assert_eq!(status, 405);
    assert!(
        head.to_ascii_lowercase().contains("allow: get, head"),
        "{head}"
    );
    let (status, head, body) = request(d.addr, "HEAD", "/readyz").await;
    assert_eq!((status, body.as_str()), (503, ""), "{head}");

    // The kubelet appears: ready once both names are registered.
    let kubelet = KubeletStandin::start(common::transport(), d.dir.path())
        .await
        .unwrap();
    until(d.addr, "/readyz", "registration", |s, b| {
        s == 200 && b == "ok\n"
    })
    .await;
    let (status, _, body) = request(d.addr, "HEAD", "/readyz").await;
    assert_eq!((status, body.as_str()), (200, ""));
    assert_registered(&metrics(d.addr).await, 1.0);

    // The kubelet stops: not ready.
    kubelet.stop().await;
    until(d.addr, "/readyz", "the kubelet gone", |s, b| {
        s == 503 && b == waiting
    })
    .await;
    // It comes back refusing registrations: still not ready, and says why.
    let kubelet =
        KubeletStandin::start_refusing(common::transport(), d.dir.path(), Some("not ready yet"))
            .await
            .unwrap();
    let refused =
        format!("{DISPLAY}: registration failed: the kubelet refused: not ready yet, retrying");
    until(d.addr, "/readyz", "a refused registration", |s, b| {
        s == 503 && b.contains(&refused)
    })
    .await;
    until(d.addr, "/healthz", "liveness while not ready", |s, b| {
        s == 200 && b == "ok\n"
    })
    .await;
    let m = metrics(d.addr).await;
    assert_eq!(
        m[&series("dxdp_kubelet_registered", &[("resource", DISPLAY)])],
        0.0
    );
    let errors = series(
        "dxdp_kubelet_registrations_total",
        &[("resource", DISPLAY), ("result", "error")],
    );
    assert!(m[&errors] >= 1.0, "{m:#?}");
    // It accepts again: ready.
    kubelet.refuse_registrations(None);
    until(d.addr, "/readyz", "re-registration", |s, b| {
        s == 200 && b == "ok\n"
    })
    .await;
    // Once per kubelet.
    assert_registered(&metrics(d.addr).await, 2.0);
    d.shutdown().await;
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_allocations_host_refreshes_and_configuration_reloads() {
    let dir = tempdir();
    let config_path = dir.path().join("config.yaml");
    // The address is in the file (metrics.address), as the configuration reloads re-read it.
    let file = |replicas: u32| {
        format!("metrics: {{address: '127.0.0.1:0'}}\nresources: {{display: {{replicas: {replicas}}}}}\n")
    };
    std::fs::write(&config_path, file(2)).unwrap();
    let kubelet = KubeletStandin::start(common::transport(), dir.path())
        .await
        .unwrap();
    let inputs = Inputs {
        file: Some((config_path.clone(), true)),
        ..Default::default()
    };
    let config = inputs.resolve().unwrap().config;
    assert_eq!(config.metrics_address, Some("127.0.0.1:0".parse().unwrap()));
    let d = Daemon::start(dir, config, Some(inputs)).await;
    until(d.addr, "/readyz", "registration", |s, b| {
        s == 200 && b == "ok\n"
    })
    .await;

    let facts = common::facts("sample");
    let gpus = physical(&facts, Resource::Display);
    let npus = physical(&facts, Resource::Compute);
    assert!(gpus >= 2, "the sample host has several GPUs");
    let devices = |name: &str, health: &str| {
        series("dxdp_devices", &[("resource", name), ("health", health)])
    };
    let advertised = |name: &str| series("dxdp_advertised_devices", &[("resource", name)]);
    let m = metrics(d.addr).await;
    assert_eq!(m[&devices(DISPLAY, "Healthy")], gpus as f64);
    assert_eq!(m[&devices(DISPLAY, "Unhealthy")], 0.0);
    assert_eq!(m[&devices(COMPUTE, "Healthy")], npus as f64);
    assert_eq!(m[&advertised(DISPLAY)], (2 * gpus) as f64);
    assert_eq!(m[&advertised(COMPUTE)], npus as f64);
    assert_eq!(m["dxdp_host_refreshes_total{result=\"ok\"}"], 0.0);

    // Allocations: two that succeed, one that fails.
    let ids: Vec<String> = kubelet
        .view()
        .devices(DISPLAY)
        .unwrap()
        .iter()
        .map(|d| d.id.clone())
        .collect();
    kubelet.allocate(DISPLAY, &ids[..1]).await.unwrap();
    kubelet.allocate(DISPLAY, &ids[1..2]).await.unwrap();
    kubelet
        .allocate(DISPLAY, &["no-such-device".to_string()])
        .await
        .unwrap_err();
    let m = metrics(d.addr).await;
    let alloc = |name: &str, result: &str| {
        series(
            "dxdp_allocations_total",
            &[("resource", name), ("result", result)],
        )
    };
    assert_eq!(m[&alloc(DISPLAY, "ok")], 2.0);
    assert_eq!(m[&alloc(DISPLAY, "error")], 1.0);
    assert_eq!(m[&alloc(COMPUTE, "ok")], 0.0);
    let count = series(
        "dxdp_allocate_duration_seconds_count",
        &[("resource", DISPLAY)],
    );
    assert_eq!(m[&count], 3.0);
    let inf = series(
        "dxdp_allocate_duration_seconds_bucket",
        &[("le", "+Inf"), ("resource", DISPLAY)],
    );
    assert_eq!(m[&inf], 3.0);

    // A host refresh: one GPU becomes unhealthy.
    // The sample host's first adapter is a display GPU (as tests/daemon/plugin.rs relies on too).
    let mut sick = facts.clone();
    sick.adapters[0].pnp.as_mut().unwrap().problem_code = 43;
    Daemon::write_facts(&d.snapshot, &sick);
    metric_is(d.addr, &devices(DISPLAY, "Unhealthy"), 1.0).await;
    let m = metrics(d.addr).await;
    assert_eq!(m[&devices(DISPLAY, "Healthy")], (gpus - 1) as f64);
    assert_eq!(
        m[&advertised(DISPLAY)],
        (2 * gpus) as f64,
        "unhealthy devices stay advertised"
    );
    assert!(
        m["dxdp_host_refreshes_total{result=\"ok\"}"] >= 1.0,
        "{m:#?}"
    );
    assert_eq!(m["dxdp_host_refreshes_total{result=\"error\"}"], 0.0);
    // A malformed snapshot: a failed refresh, the last good devices stay.
    replace(&d.snapshot, "adapters: [\n");
    metric_at_least(d.addr, "dxdp_host_refreshes_total{result=\"error\"}", 1.0).await;
    // Events are handled in order: every batch of the earlier write was handled before this
    // error, so from here on every refresh reads a malformed file. Another malformed edit
    // counts as an error, never as ok.
    let m = metrics(d.addr).await;
    let (ok_refreshes, errors) = (
        m["dxdp_host_refreshes_total{result=\"ok\"}"],
        m["dxdp_host_refreshes_total{result=\"error\"}"],
    );
    replace(&d.snapshot, "adapters: [[\n");
    metric_at_least(
        d.addr,
        "dxdp_host_refreshes_total{result=\"error\"}",
        errors + 1.0,
    )
    .await;
    let m = metrics(d.addr).await;
    assert_eq!(m["dxdp_host_refreshes_total{result=\"ok\"}"], ok_refreshes);
    assert_eq!(m[&devices(DISPLAY, "Unhealthy")], 1.0);

    // Configuration reloads: applied, rejected, unchanged.
    replace(&config_path, &file(3));
    metric_is(d.addr, "dxdp_config_reloads_total{result=\"applied\"}", 1.0).await;
    metric_is(d.addr, &advertised(DISPLAY), (3 * gpus) as f64).await;
    replace(&config_path, "resources: {display: {replicas: 0}}\n");
    metric_at_least(
        d.addr,
        "dxdp_config_reloads_total{result=\"rejected\"}",
        1.0,
    )
    .await;
    let unchanged = metrics(d.addr).await["dxdp_config_reloads_total{result=\"unchanged\"}"];
    replace(&config_path, &file(3));
    metric_at_least(
        d.addr,
        "dxdp_config_reloads_total{result=\"unchanged\"}",
        unchanged + 1.0,
    )
    .await;
    let m = metrics(d.addr).await;
    assert_eq!(
        m["dxdp_config_reloads_total{result=\"applied\"}"], 1.0,
        "only the first edit changed the configuration"
    );
    assert_eq!(m[&advertised(DISPLAY)], (3 * gpus) as f64);

    d.shutdown().await;
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_in_use_does_not_stop_device_serving_and_the_endpoint_comes_up_once_free() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap();
    let dir = tempdir();
    let snapshot = dir.path().join("host.yaml");
    Daemon::write_facts(&snapshot, &common::facts("sample"));
    let kubelet = KubeletStandin::start(common::transport(), dir.path())
        .await
        .unwrap();
    let mut pc = PluginConfig::new(dir.path().to_path_buf());
    pc.config.metrics_address = Some(address);
    pc.safety_poll = NO_SAFETY_POLL;
    pc.transport = common::transport();
    let observe = pc.observe.clone();
    let mut listening = observe.listening();
    let source = Arc::new(SnapshotFile::new(snapshot));
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(dxdp::daemon::Daemon::new(pc, source).run(async {
        let _ = stopped.await;
    }));
    // The kubelet gets both resources although the endpoint cannot listen.
    assert!(
        kubelet
            .wait_for(WAIT, |v| v.devices(DISPLAY).is_some()
                && v.devices("directx.microsoft.com/compute").is_some())
            .await,
        "devices are served regardless of the metrics endpoint"
    );
    assert_eq!(*listening.borrow(), None);
    // The port is freed: the endpoint listens on it (retried in the background).
    drop(taken);
    let bound = tokio::time::timeout(WAIT, listening.wait_for(|a| a.is_some()))
        .await
        .expect("the endpoint is retried")
        .unwrap()
        .unwrap();
    assert_eq!(bound, address);
    let (status, body) = get(address, "/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let _ = stop.send(());
    tokio::time::timeout(WAIT, task)
        .await
        .expect("stops")
        .unwrap()
        .unwrap();
    kubelet.stop().await;
}

/// Principle: only what the kubelet needs may stop the daemon. A web configuration that does not
/// load refuses `/metrics` (503, naming the setting and key, not the file's path) while devices are served and the probes
/// answer; once the file is fixed the endpoint serves `/metrics` without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_web_configuration_refuses_metrics_but_never_stops_the_daemon() {
    let dir = tempdir();
    let web = dir.path().join("web.yml");
    std::fs::write(&web, "tls_server_config:\n  cert_file: missing.crt\n").unwrap();
    let config = Config {
        web_config_file: Some(web.clone()),
        ..Config::default()
    };
    let d = Daemon::start_with(dir, config, None, |pc| {
        pc.guard_retry = std::time::Duration::from_millis(100)
    })
    .await;
    until(d.addr, "/metrics", "503 naming the key", |s, b| {
        s == 503
            && b.contains("(metrics.webConfigFile, key tls_server_config.key_file)")
            && !b.contains("web.yml")
    })
    .await;
    until(d.addr, "/healthz", "the daemon alive", |s, b| {
        s == 200 && b == "ok\n"
    })
    .await;
    assert!(
        !d.task.as_ref().unwrap().is_finished(),
        "the daemon runs on"
    );
    // Fixed: a configuration without TLS or users (headers only). The endpoint listens again,
    // guarded as configured (on a new port here: the test binds port 0).
    let mut listening = d.observe.listening();
    let old = Some(d.addr);
    replace(
        &web,
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n",
    );
    let addr = tokio::time::timeout(WAIT, listening.wait_for(|a| a.is_some() && *a != old))
        .await
        .expect("the endpoint listens again once the file loads")
        .unwrap()
        .unwrap();
    until(addr, "/metrics", "served once the file loads", |s, b| {
        s == 200 && b.contains("dxdp_metrics_guard_failures_total")
    })
    .await;
    d.shutdown().await;
}

/// `metrics.authorization: kubernetes` without the API server (the daemon runs without one):
/// `/metrics` answers 503 with the reason, never unchecked, and the daemon serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_authorization_without_credentials_refuses_metrics_and_serves_on() {
    let config = Config {
        metrics_authorization: dxdp::config::file::MetricsAuthorization::Kubernetes,
        ..Config::default()
    };
    let d = Daemon::start(tempdir(), config, None).await;
    until(d.addr, "/metrics", "503 with the reason", |s, b| {
        s == 503
            && b.contains("(metrics.authorization: kubernetes)")
            && b.contains("the daemon's log says what to fix")
    })
    .await;
    until(d.addr, "/healthz", "the daemon alive", |s, b| {
        s == 200 && b == "ok\n"
    })
    .await;
    assert!(
        !d.task.as_ref().unwrap().is_finished(),
        "the daemon runs on"
    );
    d.shutdown().await;
}
