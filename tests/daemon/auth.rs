//! Basic authentication of the daemon's metrics endpoint over real sockets (issue 44): unknown
//! paths answered before any password check, `rate_limit` answering 429 (never to the probes),
//! an empty web configuration refused at start and at reload, and a reload that would drop
//! the users refused until a restart.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use dxdp::backend::SnapshotFile;
use dxdp::config::Config;
use dxdp::observe::Observe;
use dxdp::plugin::PluginError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::common;

const WAIT: Duration = Duration::from_secs(10);

struct Daemon {
    _dir: tempfile::TempDir,
    observe: Observe,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), PluginError>>,
}

impl Daemon {
    /// The daemon on the sample host, its metrics endpoint on a free port guarded by `web`
    /// (written to `web.yml` in its directory, whose path is returned too).
    async fn start(web: &str) -> (Daemon, SocketAddr, std::path::PathBuf) {
        let dir = tempfile::Builder::new()
            .prefix("dxdp")
            .tempdir_in(common::socket_tempdir_base())
            .unwrap();
        let snapshot = dir.path().join("host.yaml");
        let facts = common::facts("sample");
        let text = dxdp_core::snapshot::write(&facts, dxdp_core::snapshot::Format::Yaml).unwrap();
        std::fs::write(&snapshot, text).unwrap();
        let web_file = dir.path().join("web.yml");
        std::fs::write(&web_file, web).unwrap();
        let config = Config {
            metrics_address: Some("127.0.0.1:0".parse().unwrap()),
            web_config_file: Some(web_file.clone()),
            ..Config::default()
        };
        let mut pc = common::plugin_config(dir.path());
        pc.config = config.into();
        pc.guard_retry = Duration::from_millis(100);
        let observe = pc.observe.clone();
        let mut listening = observe.listening();
        let (stop, stopped) = oneshot::channel::<()>();
        let daemon = dxdp::daemon::Daemon::new(pc, Arc::new(SnapshotFile::new(snapshot)));
        let task = tokio::spawn(daemon.run(async {
            let _ = stopped.await;
        }));
        let addr = tokio::time::timeout(WAIT, listening.wait_for(|a| a.is_some()))
            .await
            .expect("the endpoint listens")
            .unwrap()
            .unwrap();
        let daemon = Daemon {
            _dir: dir,
            observe,
            stop,
            task,
        };
        (daemon, addr, web_file)
    }

    fn counter(&self, series: &str) -> f64 {
        self.observe
            .metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no series {series}"))
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("stops")
            .unwrap()
            .unwrap();
    }
}

fn basic(user: &str, password: &str) -> String {
    let pair = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {pair}")
}

/// `method path` with `authorization`: status, head, body.
async fn ask(
    addr: SocketAddr,
    method: &str,
    path: &str,
    authorization: Option<&str>,
) -> (u16, String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    s.write_all(
        format!("{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut raw))
        .await
        .expect("an answer")
        .unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).unwrap_or("0").parse().unwrap();
    (status, head.to_string(), body.to_string())
}

fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_come_first_and_rate_limit_answers_429_but_never_to_the_probes() {
    let hash = bcrypt::hash("test-only-password", 4).unwrap();
    let (d, addr, _) = Daemon::start(&format!(
        "basic_auth_users:\n  prometheus: '{hash}'\nrate_limit:\n  interval: 1h\n  burst: 3\n"
    ))
    .await;
    let wrong = basic("prometheus", "wrong");
    let right = basic("prometheus", "test-only-password");
    // Unknown paths and methods: answered without authentication, not limited.
    for _ in 0..4 {
        let (status, _, body) = ask(addr, "GET", "/nothing", Some(&wrong)).await;
        assert_eq!(
            (status, body.as_str()),
            (
                404,
                "not found: dxdp serves /metrics, /healthz and /readyz\n"
            )
        );
        let (status, _, _) = ask(addr, "POST", "/metrics", Some(&wrong)).await;
        assert_eq!(status, 405);
    }
    // Three requests through (the burst), the fourth refused with 429 and Retry-After.
    assert_eq!(ask(addr, "GET", "/metrics", Some(&wrong)).await.0, 401);
    assert_eq!(ask(addr, "GET", "/metrics", Some(&right)).await.0, 200);
    assert_eq!(ask(addr, "GET", "/metrics", None).await.0, 401);
    let (status, head, body) = ask(addr, "GET", "/metrics", Some(&right)).await;
    assert_eq!(status, 429, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("\r\nretry-after: 1"),
        "{head}"
    );
    assert_eq!(
        body,
        "too many requests: rate_limit of the web configuration; try again later\n"
    );
    // The probes answer whatever the limit.
    for _ in 0..5 {
        let (status, _, _) = ask(addr, "GET", "/healthz", None).await;
        assert_eq!(status, 200);
    }
    assert_eq!(
        d.counter("dxdp_metrics_requests_denied_total{reason=\"rate_limited\"}"),
        1.0
    );
    assert_eq!(
        d.counter("dxdp_metrics_requests_denied_total{reason=\"unauthenticated\"}"),
        2.0
    );
    assert_eq!(
        d.counter("dxdp_metrics_requests_denied_total{reason=\"busy\"}"),
        0.0
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_web_configuration_guards_nothing_and_is_refused_at_start_and_reload() {
    let (d, addr, web) = Daemon::start("\n").await;
    let (status, _, body) = ask(addr, "GET", "/metrics", None).await;
    assert_eq!(
        (status, body.as_str()),
        (503, "unavailable: the metrics endpoint is not set up as configured (metrics.webConfigFile, key (file)); the daemon's log says what to fix, and it tries again on its own\n")
    );
    // Fixed: a user. The endpoint listens again (a new port: the test binds port 0).
    let hash = bcrypt::hash("test-only-password", 4).unwrap();
    let users = format!("basic_auth_users:\n  prometheus: '{hash}'\n");
    let mut listening = d.observe.listening();
    replace(&web, &users);
    let addr = tokio::time::timeout(
        WAIT,
        listening.wait_for(|a| a.is_some() && *a != Some(addr)),
    )
    .await
    .expect("listens once the file loads")
    .unwrap()
    .unwrap();
    let right = basic("prometheus", "test-only-password");
    assert_eq!(ask(addr, "GET", "/metrics", Some(&right)).await.0, 200);
    // Emptied, then stripped of its users: each reload is rejected, the users stay.
    for (i, text) in [
        "",
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n",
    ]
    .into_iter()
    .enumerate()
    {
        replace(&web, text);
        let deadline = tokio::time::Instant::now() + WAIT;
        while d.counter("dxdp_web_config_reloads_total{result=\"rejected\"}") < (i + 1) as f64 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "reload {i} rejected"
            );
            // Each new connection looks at the file (at most once a second).
            assert_eq!(ask(addr, "GET", "/metrics", None).await.0, 401);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(ask(addr, "GET", "/metrics", None).await.0, 401);
        assert_eq!(ask(addr, "GET", "/metrics", Some(&right)).await.0, 200);
    }
    assert_eq!(
        d.counter("dxdp_web_config_reloads_total{result=\"applied\"}"),
        0.0
    );
    d.stop().await;
}
