//! `dxdp top --endpoint` and `dxdp audit --endpoint` (the binary) against the daemon's own
//! secured `/metrics` (observe/http.rs behind its guard): TLS with basic authentication, TLS
//! with Kubernetes-authorized bearer tokens (the API server stand-in), client certificates, a
//! wrong CA, a wrong name, no check at all, plain HTTP and TLS mixed up, and a redirect that is
//! not followed. Certificates are made at test time (tests/support/tls.rs); the figures are the
//! telemetry-t4 fixture's, sampled as the daemon samples them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use dxdp::backend::counters::Recorded;
use dxdp::backend::SnapshotFile;
use dxdp::cluster::metrics_authz::KubernetesAuthorizer;
use dxdp::config::Config;
use dxdp::observe::access::Access;
use dxdp::observe::http;
use dxdp::observe::metrics::Metrics;
use dxdp::observe::web::Web;
use dxdp::observe::Observe;
use dxdp::telemetry::sampler::{Devices, Sampler, State};
use tokio::sync::watch;

use crate::apiserver::ApiServerStandin;
use crate::common;
use crate::tls;

/// The telemetry-t4 fixture's devices, in its order.
const GPU0: &str = "pciroot-0-pci-1b00-0540e5ad73bf260f";
const GPU1: &str = "pciroot-0-pci-1c00-ba6abfb666f4630a";
const T4: &str = "NVIDIA Tesla T4";

/// A daemon's metrics with telemetry-t4's figures, its allocations current.
async fn observed() -> Observe {
    let path = common::fixture_path("telemetry-t4");
    let (_, config) = watch::channel(Arc::new(Config::default()));
    let sampler = Sampler {
        source: Arc::new(Recorded::new(&path)),
        devices: Devices::Host(Arc::new(SnapshotFile::new(path.clone()))),
        config,
        pod_resources: None,
        cri: None,
        containers: None,
        metrics: Metrics::new().telemetry().clone(),
    };
    let view = sampler.step(&mut State::default()).await.unwrap();
    let observe = Observe::new();
    observe.metrics.telemetry().publish(Some(Arc::new(view)));
    observe.metrics.telemetry().pod_resources_call(true);
    observe.metrics.telemetry().attribution_current(true);
    observe
}

/// The daemon's metrics listener on a free port, guarded by `web` and `authorizer`.
async fn serve(
    observe: &Observe,
    web: Option<&Path>,
    authorizer: Option<KubernetesAuthorizer>,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let web = web.map(|w| {
        let metrics = observe.metrics.clone();
        Arc::new(Web::load(w, move |r| metrics.access().web_reload(r)).unwrap())
    });
    let server = http::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
        .with_access(Access {
            web,
            authorizer: authorizer.map(|a| Arc::new(a) as _),
            ..Access::default()
        });
    let address = server.local_addr();
    (address, tokio::spawn(server.serve(observe.clone())))
}

/// Runs `dxdp ARGS` with an empty environment (no configuration, no DXDP_* variables).
async fn dxdp(args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_dxdp"))
        .args(args)
        .env_clear()
        .output()
        .await
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            stderr(out)
        )
    })
}

/// `top -o json` read the fixture's two T4s.
fn shows_the_fixture(out: &Output) {
    assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
    let doc = json(out);
    assert_eq!(doc["kind"], "Top");
    let devices: Vec<(&str, &str)> = doc["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["device"].as_str().unwrap(), d["model"].as_str().unwrap()))
        .collect();
    assert_eq!(devices, [(GPU0, T4), (GPU1, T4)]);
}

/// Exit code `code` and exactly this one `error: …` line on stderr.
fn fails_with(out: &Output, code: i32, message: &str) {
    assert_eq!(out.status.code(), Some(code), "{}", stderr(out));
    assert_eq!(stderr(out), format!("error: {message}\n"));
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The words of several lists, in order.
fn words<'a>(parts: &[&[&'a str]]) -> Vec<&'a str> {
    parts.concat()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_and_audit_read_a_tls_endpoint_with_basic_auth() {
    let dir = tempfile::tempdir().unwrap();
    let pki = tls::pki(dir.path(), "a");
    // Cost 4 keeps the test fast; the hash is made here, the password is a test value.
    let hash = bcrypt::hash("test-only-password", 4).unwrap();
    let web = write(
        dir.path(),
        "web.yml",
        &format!("tls_server_config:\n  cert_file: a-server.pem\n  key_file: a-server-key.pem\nbasic_auth_users:\n  prometheus: '{hash}'\n"),
    );
    let observe = observed().await;
    let (address, task) = serve(&observe, Some(&web), None).await;
    let url = format!("https://127.0.0.1:{}", address.port());
    let ca = s(&pki.ca);
    // The file as `echo` writes it: the line end is not part of the password.
    let password = write(dir.path(), "password", "test-only-password\n");
    let secured = ["--certificate-authority", ca, "--username", "prometheus"];

    let out = dxdp(&words(&[
        &["top", "-o", "json", "--endpoint", &url],
        &secured,
        &["--password-file", s(&password)],
    ]))
    .await;
    shows_the_fixture(&out);
    assert_eq!(stderr(&out), "");

    let out = dxdp(&words(&[
        &["audit", "-o", "json", "--endpoint", &url],
        &secured,
        &["--password-file", s(&password)],
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc = json(&out);
    assert_eq!(doc["verdict"], "clean");
    assert_eq!(
        doc["source"],
        format!("the daemon's /metrics at {url}/metrics")
    );

    // No credentials: what the endpoint wants, and how to give it.
    let wants = format!("{url}/metrics answered 401 Unauthorized (unauthorized: give the user and password of basic_auth_users): the endpoint wants a user and password (basic_auth_users of its web configuration): give --username USER --password-file FILE");
    let out = dxdp(&["top", "--endpoint", &url, "--certificate-authority", ca]).await;
    fails_with(&out, 1, &wants);
    // audit: "could not tell", with the same reason.
    let out = dxdp(&[
        "audit",
        "-o",
        "json",
        "--endpoint",
        &url,
        "--certificate-authority",
        ca,
    ])
    .await;
    assert_eq!(out.status.code(), Some(3));
    let doc = json(&out);
    assert_eq!(doc["verdict"], "unknown");
    assert_eq!(doc["reason"], wants.as_str());

    // A wrong password names the user and the file, never the password.
    let wrong = write(dir.path(), "wrong", "not-the-password");
    let out = dxdp(&words(&[
        &["top", "--endpoint", &url],
        &secured,
        &["--password-file", s(&wrong)],
    ]))
    .await;
    fails_with(&out, 1, &format!("{url}/metrics answered 401 Unauthorized (unauthorized: give the user and password of basic_auth_users): user \"prometheus\" with the password in {} was refused: check both against basic_auth_users of the daemon's web configuration", wrong.display()));
    assert!(!stderr(&out).contains("not-the-password"));

    // A token where a password is wanted.
    let token = write(dir.path(), "token", "some-token\n");
    let out = dxdp(&[
        "top",
        "--endpoint",
        &url,
        "--certificate-authority",
        ca,
        "--token-file",
        s(&token),
    ])
    .await;
    fails_with(&out, 1, &format!("{url}/metrics answered 401 Unauthorized (unauthorized: give the user and password of basic_auth_users): the endpoint wants a user and password, not a token: give --username USER --password-file FILE instead of --token-file {}", token.display()));
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_and_audit_send_a_bearer_token_to_a_kubernetes_authorized_tls_endpoint() {
    let api = ApiServerStandin::start("n1", &[]).await.unwrap();
    api.add_token(
        "prometheus-token",
        "system:serviceaccount:monitoring:prometheus",
        &["system:serviceaccounts"],
    );
    api.add_token("other-token", "system:serviceaccount:default:other", &[]);
    api.allow(
        "system:serviceaccount:monitoring:prometheus",
        "get",
        "/metrics",
    );
    let authorizer = KubernetesAuthorizer::at_url(&api.url())
        .unwrap()
        .with_timeout(Duration::from_secs(2));
    let dir = tempfile::tempdir().unwrap();
    let pki = tls::pki(dir.path(), "b");
    let web = write(
        dir.path(),
        "web.yml",
        "tls_server_config:\n  cert_file: b-server.pem\n  key_file: b-server-key.pem\n",
    );
    let observe = observed().await;
    let (address, task) = serve(&observe, Some(&web), Some(authorizer)).await;
    let url = format!("https://127.0.0.1:{}", address.port());
    let ca = s(&pki.ca);
    // As `kubectl create token … > token` writes it, with the line end.
    let token = write(dir.path(), "token", "prometheus-token\n");

    let out = dxdp(&[
        "top",
        "-o",
        "json",
        "--endpoint",
        &url,
        "--certificate-authority",
        ca,
        "--token-file",
        s(&token),
    ])
    .await;
    shows_the_fixture(&out);
    let out = dxdp(&[
        "audit",
        "--endpoint",
        &url,
        "--certificate-authority",
        ca,
        "--token-file",
        s(&token),
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let sent: Vec<String> = api
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/tokenreviews"))
        .map(|r| r.json()["spec"]["token"].as_str().unwrap_or("").to_string())
        .collect();
    // The token as the file holds it, without the line end (reviewed once, then cached).
    assert_eq!(sent, ["prometheus-token"]);

    let out = dxdp(&["top", "--endpoint", &url, "--certificate-authority", ca]).await;
    fails_with(&out, 1, &format!("{url}/metrics answered 401 Unauthorized (unauthorized: a bearer token is required (Authorization: Bearer …)): the endpoint wants a bearer token (metrics.authorization: kubernetes): give --token-file FILE with the token of a service account that may get /metrics"));

    let other = write(dir.path(), "other", "other-token");
    let out = dxdp(&[
        "top",
        "--endpoint",
        &url,
        "--certificate-authority",
        ca,
        "--token-file",
        s(&other),
    ])
    .await;
    fails_with(&out, 1, &format!("{url}/metrics answered 403 Forbidden (forbidden: user \"system:serviceaccount:default:other\" may not get /metrics (grant get on the nonResourceURL /metrics in a ClusterRole)): the token's user may not get /metrics: bind it to the chart's <release>-dxdp-metrics-reader ClusterRole, or use a token of a user that may"));

    let password = write(dir.path(), "password", "x");
    let out = dxdp(&[
        "audit",
        "-o",
        "json",
        "--endpoint",
        &url,
        "--certificate-authority",
        ca,
        "--username",
        "prometheus",
        "--password-file",
        s(&password),
    ])
    .await;
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(json(&out)["reason"], format!("{url}/metrics answered 401 Unauthorized (unauthorized: a bearer token is required (Authorization: Bearer …)): the endpoint wants a bearer token, not a password: give --token-file FILE instead of --username and --password-file"));
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_is_checked_against_the_ca_and_name_unless_told_not_to() {
    let dir = tempfile::tempdir().unwrap();
    let pki = tls::pki(dir.path(), "c");
    let other = tls::pki(dir.path(), "other");
    let web = write(
        dir.path(),
        "web.yml",
        "tls_server_config:\n  cert_file: c-server.pem\n  key_file: c-server-key.pem\n",
    );
    let observe = observed().await;
    let (address, task) = serve(&observe, Some(&web), None).await;
    let port = address.port();
    let url = format!("https://127.0.0.1:{port}");

    // A CA that did not sign the server's certificate.
    let out = dxdp(&[
        "top",
        "--endpoint",
        &url,
        "--certificate-authority",
        s(&other.ca),
    ])
    .await;
    fails_with(&out, 1, &format!("{url}/metrics: the server's certificate is not signed by a CA trusted here (the CA bundle {}): give the CA that signed the daemon's certificate with --certificate-authority FILE (e.g. cert-manager's ca.crt), or skip the check with --insecure-skip-tls-verify", other.ca.display()));
    let out = dxdp(&[
        "audit",
        "-o",
        "json",
        "--endpoint",
        &url,
        "--certificate-authority",
        s(&other.ca),
    ])
    .await;
    assert_eq!(out.status.code(), Some(3));
    assert!(json(&out)["reason"]
        .as_str()
        .unwrap()
        .contains("not signed by a CA trusted here"));
    // No CA given: the system's trust store, which does not know the test CA either.
    let out = dxdp(&["top", "--endpoint", &url]).await;
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(
        e.starts_with(&format!("error: {url}/metrics: the server's certificate is not signed by a CA trusted here (the system's trust store"))
            || e.starts_with("error: cannot use the system's trust store"),
        "{e}"
    );
    assert!(e.contains("--certificate-authority FILE"), "{e}");

    // The right CA, but a name the certificate does not carry.
    let out = dxdp(&[
        "top",
        "--endpoint",
        &url,
        "--certificate-authority",
        s(&pki.ca),
        "--tls-server-name",
        "dxdp-metrics",
    ])
    .await;
    fails_with(&out, 1, &format!("{url}/metrics: invalid peer certificate: certificate not valid for name \"dxdp-metrics\"; certificate is only valid for IpAddress(127.0.0.1) or DnsName(\"localhost\"): connect by a name the certificate carries, or name it with --tls-server-name NAME (the serverName Prometheus uses)"));
    // A name it carries, given or in the URL.
    let by_name = format!("https://localhost:{port}");
    for args in [
        vec!["--tls-server-name", "localhost", "--endpoint", url.as_str()],
        vec!["--endpoint", by_name.as_str()],
    ] {
        let out = dxdp(&words(&[
            &["top", "-o", "json", "--certificate-authority", s(&pki.ca)],
            &args,
        ]))
        .await;
        shows_the_fixture(&out);
    }

    // No check at all, when asked.
    let out = dxdp(&[
        "top",
        "-o",
        "json",
        "--endpoint",
        &url,
        "--insecure-skip-tls-verify",
    ])
    .await;
    shows_the_fixture(&out);
    // ... but not together with a CA (a usage error).
    let out = dxdp(&[
        "top",
        "--endpoint",
        &url,
        "--insecure-skip-tls-verify",
        "--certificate-authority",
        s(&pki.ca),
    ])
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // Plain HTTP to the TLS port: no HTTP answer, and the hint.
    let plain = format!("http://127.0.0.1:{port}");
    let out = dxdp(&["top", "--endpoint", &plain]).await;
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(
        e.starts_with(&format!("error: {plain}/metrics: no HTTP answer ("))
            && e.ends_with(&format!("): if the daemon serves TLS (tls_server_config in its web configuration), use {url}/metrics\n")),
        "{e}"
    );
    // A TLS flag with a plain endpoint.
    let out = dxdp(&[
        "top",
        "--endpoint",
        &plain,
        "--certificate-authority",
        s(&pki.ca),
    ])
    .await;
    fails_with(&out, 1, &format!("--certificate-authority is for an https:// endpoint, and {plain}/metrics is plain HTTP: write {url}/metrics if the daemon serves TLS"));
    task.abort();

    // TLS to a plain HTTP port.
    let (address, task) = serve(&observe, None, None).await;
    let url = format!("https://127.0.0.1:{}", address.port());
    let out = dxdp(&[
        "top",
        "--endpoint",
        &url,
        "--certificate-authority",
        s(&pki.ca),
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(
        e.starts_with(&format!("error: {url}/metrics: the server does not speak TLS ("))
            && e.ends_with(&format!("): if it serves plain HTTP (no tls_server_config in its web configuration), use http://127.0.0.1:{}/metrics\n", address.port())),
        "{e}"
    );
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_sent_when_the_endpoint_requires_one() {
    let dir = tempfile::tempdir().unwrap();
    let pki = tls::pki(dir.path(), "d");
    let web = write(
        dir.path(),
        "web.yml",
        "tls_server_config:\n  cert_file: d-server.pem\n  key_file: d-server-key.pem\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: d-ca.pem\n",
    );
    let observe = observed().await;
    let (address, task) = serve(&observe, Some(&web), None).await;
    let url = format!("https://127.0.0.1:{}", address.port());
    let ca = s(&pki.ca);

    let out = dxdp(&["top", "--endpoint", &url, "--certificate-authority", ca]).await;
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(
        e.starts_with(&format!("error: {url}/metrics: the server refused the connection ("))
            && e.ends_with("): it may require a client certificate signed by its client_ca_file: give --client-certificate FILE --client-key FILE\n"),
        "{e}"
    );
    let out = dxdp(&[
        "top",
        "-o",
        "json",
        "--endpoint",
        &url,
        "--certificate-authority",
        ca,
        "--client-certificate",
        s(&pki.client_cert),
        "--client-key",
        s(&pki.client_key),
    ])
    .await;
    shows_the_fixture(&out);
    // Half a pair is a usage error.
    let out = dxdp(&[
        "top",
        "--endpoint",
        &url,
        "--client-certificate",
        s(&pki.client_cert),
    ])
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    task.abort();
}

/// A redirect is reported, not followed; flags of a secured endpoint need --endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_are_not_followed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        let mut requests = 0;
        while let Ok((mut conn, _)) = listener.accept().await {
            requests += 1;
            let mut buf = vec![0u8; 4096];
            let _ = conn.read(&mut buf).await;
            let _ = conn
                .write_all(b"HTTP/1.1 302 Found\r\nLocation: https://elsewhere:9466/metrics\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await;
            if requests == 1 {
                return requests;
            }
        }
        requests
    });
    let url = format!("http://127.0.0.1:{port}");
    let out = dxdp(&["top", "--endpoint", &url]).await;
    fails_with(&out, 1, &format!("{url}/metrics answered 302 Found to https://elsewhere:9466/metrics: redirects are not followed; give the daemon's own address with --endpoint"));
    assert_eq!(server.await.unwrap(), 1);

    let out = dxdp(&["top", "--token-file", "x"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--endpoint"), "{}", stderr(&out));
}
