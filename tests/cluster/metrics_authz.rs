//! `metrics.authorization: kubernetes` in `dxdp plugin` as a process against the API server
//! stand-in: bearer tokens over plain HTTP are refused unless allowed, and no client of the
//! metrics port makes the daemon ask the API server more than once per token (concurrent
//! requests share one review; junk tokens are refused without asking).

#![cfg(unix)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::apiserver::ApiServerStandin;
use crate::common;
use dxdp::kubelet::standin::KubeletStandin;

/// Generous: these waits are for behaviour, not speed.
const WAIT: Duration = Duration::from_secs(30);

/// A service-account-shaped token the stand-in knows, whose user may get /metrics.
const PROMETHEUS: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJwcm9tZXRoZXVzIn0.c2lnbmF0dXJl";
const PROMETHEUS_USER: &str = "system:serviceaccount:monitoring:prometheus";
/// Another one, first used by many requests at once.
const NEW: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJuZXcifQ.c2lnbmF0dXJlLTI";
const NEW_USER: &str = "system:serviceaccount:monitoring:new";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One GET with `token` as bearer token: status and body.
async fn get(address: SocketAddr, path: &str, token: Option<&str>) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(address).await.ok()?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").as_bytes(),
    )
    .await
    .ok()?;
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut raw))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// Polls `/metrics` with `token` until `done` holds for its answer.
async fn until(address: SocketAddr, token: &str, what: &str, done: impl Fn(u16, &str) -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let answer = get(address, "/metrics", Some(token)).await;
        if let Some((status, body)) = &answer {
            if done(*status, body) {
                return;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: /metrics answers {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn start(
    dir: &Path,
    port: u16,
    kubeconfig: &Path,
    extra: &[(&str, &str)],
) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_dxdp"))
        .args(["plugin", "--kubelet-dir"])
        .arg(dir)
        .arg("--host-snapshot")
        .arg(common::fixture_path("nvidia-multi-gpu"))
        .env_clear()
        .env("NODE_NAME", "gpu-node-1")
        .env("KUBECONFIG", kubeconfig)
        .env("DXDP_METRICS_ADDRESS", format!("127.0.0.1:{port}"))
        .env("DXDP_METRICS_AUTHORIZATION", "kubernetes")
        .envs(extra.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

fn token_reviews(api: &ApiServerStandin, token: &str) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.path.ends_with("/tokenreviews") && r.body.contains(token))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_tokens_need_tls_unless_plain_http_is_allowed() {
    let dir = common::socket_tempdir();
    let _kubelet = KubeletStandin::start(common::transport(), dir.path())
        .await
        .unwrap();
    let api = ApiServerStandin::start("gpu-node-1", &[]).await.unwrap();
    api.add_token(PROMETHEUS, PROMETHEUS_USER, &[]);
    api.allow(PROMETHEUS_USER, "get", "/metrics");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
    let port = free_port();
    let address: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();

    let mut plugin = start(dir.path(), port, &kubeconfig, &[]);
    until(address, PROMETHEUS, "503 saying why", |s, b| {
        s == 503 && b.contains("the metrics endpoint is not set up as configured (metrics.authorization: kubernetes without TLS (set tls_server_config in metrics.webConfigFile, or metrics.allowPlainHttpTokens: true))")
    })
    .await;
    assert_eq!(
        token_reviews(&api, PROMETHEUS),
        0,
        "the token was never sent"
    );
    common::terminate(&mut plugin, WAIT).await;

    let mut plugin = start(
        dir.path(),
        port,
        &kubeconfig,
        &[("DXDP_METRICS_ALLOW_PLAIN_HTTP_TOKENS", "true")],
    );
    until(address, PROMETHEUS, "200 with the token", |s, b| {
        s == 200 && b.contains("dxdp_metrics_token_reviews_total")
    })
    .await;
    common::terminate(&mut plugin, WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_the_metrics_port_cannot_multiply_reviews() {
    let dir = common::socket_tempdir();
    let _kubelet = KubeletStandin::start(common::transport(), dir.path())
        .await
        .unwrap();
    let api = ApiServerStandin::start("gpu-node-1", &[]).await.unwrap();
    for (token, user) in [(PROMETHEUS, PROMETHEUS_USER), (NEW, NEW_USER)] {
        api.add_token(token, user, &[]);
        api.allow(user, "get", "/metrics");
    }
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
    let port = free_port();
    let address: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut plugin = start(
        dir.path(),
        port,
        &kubeconfig,
        &[("DXDP_METRICS_ALLOW_PLAIN_HTTP_TOKENS", "true")],
    );
    until(address, PROMETHEUS, "the endpoint up", |s, _| s == 200).await;

    // 16 requests at once with a token never seen: one TokenReview.
    let answers = futures_util::future::join_all(
        (0..16).map(|_| async move { get(address, "/metrics", Some(NEW)).await }),
    )
    .await;
    for a in &answers {
        assert_eq!(a.as_ref().map(|(s, _)| *s), Some(200), "{a:?}");
    }
    assert_eq!(token_reviews(&api, NEW), 1);

    // Junk that is no token: refused without asking.
    let before = api
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("reviews"))
        .count();
    let junk: Vec<String> = (0..40).map(|i| format!("junk<{i}>")).collect();
    for token in &junk {
        let answer = get(address, "/metrics", Some(token)).await;
        assert_eq!(answer.as_ref().map(|(s, _)| *s), Some(401), "{answer:?}");
    }
    let after = api
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("reviews"))
        .count();
    assert_eq!(after, before, "no review for junk");
    let (_, body) = get(address, "/metrics", Some(PROMETHEUS)).await.unwrap();
    let samples = common::metric_samples(&body);
    assert_eq!(
        samples
            .get("dxdp_metrics_token_reviews_total{result=\"malformed\"}")
            .map(String::as_str),
        Some("40"),
        "{body}"
    );
    assert_eq!(
        samples
            .get("dxdp_metrics_token_reviews_total{result=\"asked\"}")
            .map(String::as_str),
        Some("2"),
        "{body}"
    );
    common::terminate(&mut plugin, WAIT).await;
}
