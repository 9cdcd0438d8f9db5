//! The metrics endpoint's web configuration (`metrics.webConfigFile`, the Prometheus exporters'
//! format) over real TLS and real sockets: client certificates required and verified, basic
//! authentication with bcrypt hashes, headers, `/healthz` and `/readyz` answering status only,
//! certificates rotated without a restart, and invalid files refused at start and at reload
//! with the file and key named. Certificates are made at test time (tests/support/tls.rs).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use dxdp::observe::access::Access;
use dxdp::observe::http;
use dxdp::observe::web::{Web, WebConfig};
use dxdp::observe::Observe;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::apiserver;
use crate::tls;

const WAIT: Duration = Duration::from_secs(10);

async fn serve(web: &Path, observe: &Observe) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let metrics = observe.metrics.clone();
    let web = Web::load(web, move |r| metrics.access().web_reload(r)).unwrap();
    let server = http::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
        .with_access(Access {
            web: Some(Arc::new(web)),
            ..Access::default()
        });
    let address = server.local_addr();
    (address, tokio::spawn(server.serve(observe.clone())))
}

async fn plain_get(address: SocketAddr, path: &str, auth: Option<&str>) -> Result<String, String> {
    let mut s = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|e| e.to_string())?;
    let auth = auth
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").as_bytes(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut raw))
        .await
        .map_err(|_| "timeout".to_string())?
        .map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&raw).into_owned())
}

fn status(answer: &str) -> &str {
    answer.lines().next().unwrap_or_default()
}

fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

fn counter(observe: &Observe, series: &str) -> f64 {
    observe
        .metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no series {series}"))
}

#[tokio::test]
async fn tls_with_required_client_certificates_serves_only_verified_clients() {
    let dir = tempfile::tempdir().unwrap();
    let pki = tls::pki(dir.path(), "a");
    let web = dir.path().join("web.yml");
    // Relative paths are relative to the web configuration file, as in the exporters.
    std::fs::write(
        &web,
        "tls_server_config:\n  cert_file: a-server.pem\n  key_file: a-server-key.pem\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: a-ca.pem\n  min_version: TLS12\nhttp_server_config:\n  headers:\n    Strict-Transport-Security: max-age=31536000\n    X-Content-Type-Options: nosniff\n",
    )
    .unwrap();
    let observe = Observe::new();
    let (address, task) = serve(&web, &observe).await;

    let (_, answer) = tls::https_get(&tls::client(&pki, true), address, "/metrics", None)
        .await
        .unwrap();
    assert_eq!(status(&answer), "HTTP/1.1 200 OK", "{answer}");
    assert!(answer.contains("# TYPE dxdp_metrics_requests_denied counter"));
    let lower = answer.to_ascii_lowercase();
    assert!(
        lower.contains("\r\nstrict-transport-security: max-age=31536000\r\n"),
        "{answer}"
    );
    assert!(
        lower.contains("\r\nx-content-type-options: nosniff\r\n"),
        "{answer}"
    );

    // No client certificate: no answer.
    let refused = tls::https_get(&tls::client(&pki, false), address, "/metrics", None).await;
    assert!(refused.is_err(), "{refused:?}");
    // Plain HTTP to the TLS port: no HTTP answer.
    let plain = plain_get(address, "/metrics", None).await;
    assert!(
        !plain.as_deref().unwrap_or("").starts_with("HTTP/1.1 200"),
        "{plain:?}"
    );
    // A client trusting another CA refuses the server.
    let other = tls::pki(dir.path(), "other");
    let mismatch = tls::https_get(&tls::client(&other, false), address, "/metrics", None).await;
    assert!(mismatch.is_err(), "{mismatch:?}");
    task.abort();
}

#[tokio::test]
async fn basic_auth_guards_metrics_and_the_probes_answer_status_only() {
    let dir = tempfile::tempdir().unwrap();
    // Cost 4 keeps the test fast; the hash is made here, the password is a test value.
    let hash = bcrypt::hash("test-only-password", 4).unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(
        &web,
        format!("basic_auth_users:\n  prometheus: '{hash}'\nhttp_server_config:\n  headers:\n    X-Frame-Options: deny\n"),
    )
    .unwrap();
    let observe = Observe::new();
    let (address, task) = serve(&web, &observe).await;

    let none = plain_get(address, "/metrics", None).await.unwrap();
    assert_eq!(status(&none), "HTTP/1.1 401 Unauthorized", "{none}");
    assert!(
        none.to_ascii_lowercase()
            .contains("www-authenticate: basic realm=\"dxdp\""),
        "{none}"
    );
    assert!(!none.contains("dxdp_build_info"), "{none}");
    let wrong = plain_get(address, "/metrics", Some(&basic("prometheus", "nope")))
        .await
        .unwrap();
    assert_eq!(status(&wrong), "HTTP/1.1 401 Unauthorized", "{wrong}");
    let unknown = plain_get(
        address,
        "/metrics",
        Some(&basic("mallory", "test-only-password")),
    )
    .await
    .unwrap();
    assert_eq!(status(&unknown), "HTTP/1.1 401 Unauthorized", "{unknown}");
    // Unknown paths are answered before any password check (issue 44): nothing to guard.
    let nothing = plain_get(address, "/nothing", None).await.unwrap();
    assert_eq!(status(&nothing), "HTTP/1.1 404 Not Found", "{nothing}");
    for _ in 0..2 {
        let ok = plain_get(
            address,
            "/metrics",
            Some(&basic("prometheus", "test-only-password")),
        )
        .await
        .unwrap();
        assert_eq!(status(&ok), "HTTP/1.1 200 OK", "{ok}");
        assert!(ok.contains("dxdp_build_info{"), "{ok}");
        assert!(ok
            .to_ascii_lowercase()
            .contains("\r\nx-frame-options: deny\r\n"));
    }
    assert_eq!(
        counter(
            &observe,
            "dxdp_metrics_requests_denied_total{reason=\"unauthenticated\"}"
        ),
        3.0
    );
    // The probes answer without credentials, with one word: the reasons need credentials.
    let ready = plain_get(address, "/readyz", None).await.unwrap();
    assert_eq!(
        status(&ready),
        "HTTP/1.1 503 Service Unavailable",
        "{ready}"
    );
    assert!(ready.ends_with("\r\n\r\nunavailable\n"), "{ready}");
    let ready = plain_get(
        address,
        "/readyz",
        Some(&basic("prometheus", "test-only-password")),
    )
    .await
    .unwrap();
    assert!(ready.contains("starting"), "{ready}");
    task.abort();
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart_and_a_broken_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first = tls::pki(dir.path(), "first");
    let web = dir.path().join("web.yml");
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    std::fs::copy(&first.server_cert, &cert).unwrap();
    std::fs::copy(&first.server_key, &key).unwrap();
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    let observe = Observe::new();
    let (address, task) = serve(&web, &observe).await;
    let first_der = std::fs::read_to_string(&first.server_cert).unwrap();
    let (peer, answer) = tls::https_get(&tls::client(&first, false), address, "/metrics", None)
        .await
        .unwrap();
    assert_eq!(status(&answer), "HTTP/1.1 200 OK");
    assert!(!peer.is_empty() && !first_der.is_empty());

    // cert-manager renews: a new key and certificate (of another CA here, so that the client
    // can tell them apart) are renamed into place.
    let second = tls::pki(dir.path(), "second");
    let tmp = dir.path().join("tmp");
    std::fs::copy(&second.server_key, &tmp).unwrap();
    std::fs::rename(&tmp, &key).unwrap();
    std::fs::copy(&second.server_cert, &tmp).unwrap();
    std::fs::rename(&tmp, &cert).unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Ok((_, answer)) =
            tls::https_get(&tls::client(&second, false), address, "/metrics", None).await
        {
            assert_eq!(status(&answer), "HTTP/1.1 200 OK");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the renewed certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        counter(
            &observe,
            "dxdp_web_config_reloads_total{result=\"applied\"}"
        ),
        1.0
    );

    // A broken edit: the last good configuration stays (still TLS, still the second
    // certificate), and the rejection is counted once.
    std::fs::write(&web, "tls_server_config:\n  cert_file: [\n").unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while counter(
        &observe,
        "dxdp_web_config_reloads_total{result=\"rejected\"}",
    ) < 1.0
    {
        assert!(tokio::time::Instant::now() < deadline, "never rejected");
        let (_, answer) = tls::https_get(&tls::client(&second, false), address, "/metrics", None)
            .await
            .unwrap();
        assert_eq!(status(&answer), "HTTP/1.1 200 OK");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let plain = plain_get(address, "/metrics", None).await;
    assert!(
        !plain.as_deref().unwrap_or("").starts_with("HTTP/1.1 200"),
        "{plain:?}"
    );
    task.abort();
}

/// Each invalid file is refused with the file and the key named.
#[test]
fn invalid_web_configurations_name_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let pki = tls::pki(dir.path(), "p");
    let other = tls::pki(dir.path(), "q");
    let web = dir.path().join("web.yml");
    let tls_with = |extra: &str| {
        format!(
            "tls_server_config:\n  cert_file: p-server.pem\n  key_file: p-server-key.pem\n{extra}"
        )
    };
    let cases: Vec<(String, &str, &str)> = vec![
        (
            "tls_server_config:\n  key_file: p-server-key.pem\n".into(),
            "tls_server_config.cert_file",
            "missing",
        ),
        (
            "tls_server_config:\n  cert_file: nothing.pem\n  key_file: p-server-key.pem\n".into(),
            "tls_server_config.cert_file",
            "nothing.pem",
        ),
        (
            "tls_server_config:\n  cert_file: p-server.pem\n  key_file: q-server-key.pem\n"
                .into(),
            "tls_server_config.key_file",
            "does not go with cert_file",
        ),
        (
            tls_with("  client_auth_type: RequireAnyClientCert\n  client_ca_file: p-ca.pem\n"),
            "tls_server_config.client_auth_type",
            "RequireAndVerifyClientCert",
        ),
        (
            tls_with("  client_auth_type: RequireAndVerifyClientCert\n"),
            "tls_server_config.client_ca_file",
            "missing",
        ),
        (
            tls_with("  client_ca_file: p-server-key.pem\n  client_auth_type: RequireAndVerifyClientCert\n"),
            "tls_server_config.client_ca_file",
            "no PEM certificate",
        ),
        (
            tls_with("  min_version: TLS14\n"),
            "tls_server_config.min_version",
            "TLS12 or TLS13",
        ),
        (
            tls_with("  cipher_suites: [TLS_RSA_WITH_AES_128_CBC_SHA]\n"),
            "tls_server_config.cipher_suites[0]",
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        ),
        (
            "basic_auth_users:\n  prometheus: secret\n".into(),
            "basic_auth_users.prometheus",
            "not a bcrypt hash",
        ),
        (
            "http_server_config:\n  headers:\n    Set-Cookie: a=b\n".into(),
            "http_server_config.headers.Set-Cookie",
            "cannot be set",
        ),
        (
            "tls_config:\n  cert_file: x\n".into(),
            "line 1 column 1",
            "tls_config",
        ),
    ];
    for (text, key, words) in cases {
        std::fs::write(&web, &text).unwrap();
        let e = WebConfig::load(&web).unwrap_err();
        let message = e.to_string();
        assert_eq!(e.key, key, "{text}: {message}");
        assert!(
            message.starts_with(&format!("web configuration {}: {key}: ", web.display())),
            "{message}"
        );
        assert!(message.contains(words), "{text}: {message}");
    }
    // And the valid forms load: TLS 1.3 only, chosen suites, optional client certificates.
    std::fs::write(
        &web,
        tls_with("  min_version: TLS13\n  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: p-ca.pem\n  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305]\n  prefer_server_cipher_suites: true\n"),
    )
    .unwrap();
    let loaded = WebConfig::load(&web).unwrap();
    assert!(loaded.tls().is_some());
    drop((pki, other));
}

/// `metrics.authorization: kubernetes` against the API server stand-in: no token and an
/// invalid token 401, a valid token without the right 403, with it 200; decisions are cached
/// (no second review); the API server failing answers 503, never the metrics.
#[tokio::test]
async fn kubernetes_authorization_checks_tokens_caches_and_never_opens() {
    let api = apiserver::ApiServerStandin::start("n1", &[]).await.unwrap();
    api.add_token(
        "prometheus-token",
        "system:serviceaccount:monitoring:prometheus",
        &["system:serviceaccounts"],
    );
    api.add_token("other-token", "system:serviceaccount:default:other", &[]);
    api.add_token("late-token", "system:serviceaccount:monitoring:late", &[]);
    api.allow(
        "system:serviceaccount:monitoring:prometheus",
        "get",
        "/metrics",
    );
    api.allow("system:serviceaccount:monitoring:late", "get", "/metrics");
    let authorizer = dxdp::cluster::metrics_authz::KubernetesAuthorizer::at_url(&api.url())
        .unwrap()
        .with_timeout(Duration::from_secs(2));
    let observe = Observe::new();
    let server = http::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
        .with_access(Access {
            authorizer: Some(Arc::new(authorizer)),
            ..Access::default()
        });
    let address = server.local_addr();
    let task = tokio::spawn(server.serve(observe.clone()));
    let reviews = || {
        api.requests()
            .iter()
            .filter(|r| r.path.ends_with("reviews"))
            .count()
    };

    let none = plain_get(address, "/metrics", None).await.unwrap();
    assert_eq!(status(&none), "HTTP/1.1 401 Unauthorized", "{none}");
    assert!(none.contains("bearer token is required"), "{none}");
    assert_eq!(reviews(), 0);
    let bad = plain_get(address, "/metrics", Some("Bearer nonsense"))
        .await
        .unwrap();
    assert_eq!(status(&bad), "HTTP/1.1 401 Unauthorized", "{bad}");
    assert!(
        bad.contains("the API server did not authenticate the bearer token: use a valid token"),
        "{bad}"
    );
    // The authenticator's own words ("invalid bearer token") are for the log, not the client.
    assert!(!bad.contains("invalid bearer token"), "{bad}");
    let other = plain_get(address, "/metrics", Some("Bearer other-token"))
        .await
        .unwrap();
    assert_eq!(status(&other), "HTTP/1.1 403 Forbidden", "{other}");
    assert!(
        other.contains("system:serviceaccount:default:other"),
        "{other}"
    );
    assert!(!other.contains("dxdp_build_info"));
    let before = reviews();
    for _ in 0..3 {
        let ok = plain_get(address, "/metrics", Some("Bearer prometheus-token"))
            .await
            .unwrap();
        assert_eq!(status(&ok), "HTTP/1.1 200 OK", "{ok}");
        assert!(ok.contains("dxdp_build_info{"), "{ok}");
    }
    // One TokenReview and one SubjectAccessReview for the three scrapes.
    assert_eq!(reviews(), before + 2);
    let sar = api
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.path.ends_with("subjectaccessreviews"))
        .unwrap()
        .json();
    assert_eq!(sar["spec"]["nonResourceAttributes"]["path"], "/metrics");
    assert_eq!(sar["spec"]["nonResourceAttributes"]["verb"], "get");
    assert_eq!(sar["spec"]["groups"][0], "system:serviceaccounts");

    // The API server fails: 503, never the metrics, and not remembered.
    api.fail_next("POST", &[500, 500]);
    let down = plain_get(address, "/metrics", Some("Bearer late-token"))
        .await
        .unwrap();
    assert_eq!(status(&down), "HTTP/1.1 503 Service Unavailable", "{down}");
    assert!(!down.contains("dxdp_build_info"));
    drop(api);
    let gone = plain_get(address, "/metrics", Some("Bearer late-token"))
        .await
        .unwrap();
    assert_eq!(status(&gone), "HTTP/1.1 503 Service Unavailable", "{gone}");
    // The probes answer status only, without a token.
    let health = plain_get(address, "/readyz", None).await.unwrap();
    assert!(health.ends_with("\r\n\r\nunavailable\n"), "{health}");
    assert_eq!(
        counter(
            &observe,
            "dxdp_metrics_requests_denied_total{reason=\"unavailable\"}"
        ),
        2.0
    );
    assert_eq!(
        counter(
            &observe,
            "dxdp_metrics_requests_denied_total{reason=\"forbidden\"}"
        ),
        1.0
    );
    task.abort();
}
