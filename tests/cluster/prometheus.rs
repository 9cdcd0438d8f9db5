//! A real Prometheus (Debian's `prometheus`, which CI installs) scrapes `dxdp plugin` on the
//! `telemetry-leak` fixture three ways: plain HTTP, TLS with a client certificate, and basic
//! authentication. The scrape configuration is what the chart's ServiceMonitor makes
//! (`honor_labels: true`, a `node` label). Through Prometheus' HTTP API, every PromQL expression
//! of the Grafana dashboard must return series, and every expression of docs/observability.md
//! must run (and return series unless it is a condition that is false on this fixture).
//!
//! Without a `prometheus` binary the test says `skipped ...` and passes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use dxdp::kubelet::standin::KubeletStandin;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::common;
use crate::tls;

const WAIT: Duration = Duration::from_secs(30);
/// The node of the `plain` job (the dashboard's `$node`); the others are `gpu-node-tls` and
/// `gpu-node-basic`: one dxdp per node, as in a cluster.
const NODE: &str = "gpu-node-plain";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn prometheus_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("prometheus"))
        .find(|p| p.is_file())
}

/// `GET path` on Prometheus' API: the JSON answer.
async fn api(address: SocketAddr, path_and_query: &str) -> Result<serde_json::Value, String> {
    let mut s = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(
        format!("GET {path_and_query} HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut raw))
        .await
        .map_err(|_| "timeout".to_string())?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no body")?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    out
}

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The result of an instant query.
async fn query(address: SocketAddr, q: &str) -> Result<Vec<serde_json::Value>, String> {
    // A subquery with a one-minute step (`[24h:1m]`, the Cost row's GPU-hours) is evaluated at
    // whole minutes only: on data a few seconds old none may fall inside it yet. Such a query
    // is asked at the next whole minute, where its last step sees the newest samples (within
    // the 5-minute lookback), as it would on a Prometheus that has run for a minute.
    let at = if q.contains(":1m]") {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        format!("&time={}", now.div_ceil(60) * 60)
    } else {
        String::new()
    };
    let doc = api(address, &format!("/api/v1/query?query={}{at}", encode(q))).await?;
    if doc["status"] != "success" {
        return Err(format!("{q}: {doc}"));
    }
    match doc["data"]["resultType"].as_str() {
        Some("vector") | Some("matrix") => Ok(doc["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()),
        Some("scalar") => Ok(vec![doc["data"]["result"].clone()]),
        other => Err(format!("{q}: unexpected result type {other:?}")),
    }
}

/// The PromQL of the dashboard's panels, with its `$node` variable set.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/grafana/dxdp-gpu-telemetry.json");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut out = Vec::new();
    fn walk(panels: &serde_json::Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = t["expr"].as_str() {
                    out.push((
                        p["title"].as_str().unwrap_or_default().to_string(),
                        expr.replace("$node", NODE),
                    ));
                }
            }
            walk(&p["panels"], out);
        }
    }
    walk(&doc["panels"], &mut out);
    out
}

/// The PromQL blocks of docs/observability.md: one expression per line, continued by indented
/// lines; `#` lines are comments.
fn doc_queries() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/observability.md");
    let text = std::fs::read_to_string(path).unwrap();
    let mut out: Vec<String> = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            inside = line.trim() == "```promql";
            continue;
        }
        if !inside || line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        if line.starts_with(' ') || line.starts_with(')') {
            if let Some(last) = out.last_mut() {
                last.push(' ');
                last.push_str(line.trim());
                continue;
            }
        }
        out.push(line.trim().to_string());
    }
    out
}

struct Scrape {
    name: &'static str,
    dxdp_args: Vec<String>,
    job: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_dxdp_and_every_dashboard_and_doc_query_returns_data() {
    let Some(prometheus) = prometheus_binary() else {
        eprintln!("skipped prometheus_scrapes_dxdp_and_every_dashboard_and_doc_query_returns_data: no prometheus binary on PATH (apt-get install prometheus)");
        return;
    };
    if !common::af_unix("prometheus_scrapes_dxdp_and_every_dashboard_and_doc_query_returns_data") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pki = tls::pki(dir.path(), "prom");
    let hash = bcrypt::hash("test-only-password", 4).unwrap();
    std::fs::write(
        dir.path().join("tls.yml"),
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {}\n",
            pki.server_cert.display(),
            pki.server_key.display(),
            pki.ca.display()
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("basic.yml"),
        format!("basic_auth_users:\n  prometheus: '{hash}'\n"),
    )
    .unwrap();

    let variants = [
        ("plain", None, String::new()),
        (
            "tls",
            Some(dir.path().join("tls.yml")),
            format!(
                "    scheme: https\n    tls_config:\n      ca_file: {}\n      cert_file: {}\n      key_file: {}\n      server_name: 127.0.0.1\n",
                pki.ca.display(),
                pki.client_cert.display(),
                pki.client_key.display()
            ),
        ),
        (
            "basic",
            Some(dir.path().join("basic.yml")),
            "    basic_auth:\n      username: prometheus\n      password: test-only-password\n"
                .to_string(),
        ),
    ];
    let pod_info_config = dir.path().join("config.yaml");
    std::fs::write(
        &pod_info_config,
        "telemetry:\n  podLabels: [team]\n  podUid: true\n",
    )
    .unwrap();
    let mut children: Vec<Child> = Vec::new();
    let mut kubelets = Vec::new();
    let mut scrape_configs = String::new();
    let mut scrapes = Vec::new();
    for (name, web, client) in &variants {
        let kubelet_dir = common::socket_tempdir();
        let kubelet =
            KubeletStandin::start(dxdp::transport::Transport::UnixSocket, kubelet_dir.path())
                .await
                .unwrap();
        let port = free_port();
        let mut args = vec![
            "plugin".to_string(),
            "--kubelet-dir".into(),
            kubelet_dir.path().display().to_string(),
            "--host-snapshot".into(),
            common::fixture_path("telemetry-leak").display().to_string(),
            "--metrics-address".into(),
            format!("127.0.0.1:{port}"),
            // dxdp_pod_info on, for the join recipes (no CRI here: namespace and pod only).
            "--config".into(),
            pod_info_config.display().to_string(),
        ];
        if let Some(web) = web {
            args.push("--web-config-file".into());
            args.push(web.display().to_string());
        }
        let child = Command::new(env!("CARGO_BIN_EXE_dxdp"))
            .args(&args)
            .env_clear()
            .env("DXDP_TELEMETRY_INTERVAL", "1s")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        children.push(child);
        kubelets.push((kubelet_dir, kubelet));
        // What the chart's ServiceMonitor makes: honor_labels, and the node's name as `node`
        // (here a static label: there is no Kubernetes service discovery).
        scrape_configs.push_str(&format!(
            "  - job_name: dxdp-{name}\n    honor_labels: true\n    scrape_interval: 1s\n    scrape_timeout: 1s\n{client}    static_configs:\n      - targets: ['127.0.0.1:{port}']\n        labels: {{node: gpu-node-{name}}}\n"
        ));
        scrapes.push(Scrape {
            name,
            dxdp_args: args,
            job: format!("dxdp-{name}"),
        });
    }
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{scrape_configs}"),
    )
    .unwrap();
    let prom_port = free_port();
    let prom_address: SocketAddr = format!("127.0.0.1:{prom_port}").parse().unwrap();
    let prom = Command::new(&prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("tsdb").display()
        ))
        .arg(format!("--web.listen-address={prom_address}"))
        .arg("--log.level=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    children.push(prom);

    // Every job up, with telemetry and isolation series, for at least three scrapes (rate()).
    let deadline = Instant::now() + WAIT;
    for s in &scrapes {
        loop {
            let up = query(
                prom_address,
                &format!(
                    "count_over_time(up{{job=\"{}\"}}[1m]) >= 3 and up{{job=\"{}\"}} == 1",
                    s.job, s.job
                ),
            )
            .await
            .unwrap_or_default();
            let violations = query(
                prom_address,
                &format!("dxdp_isolation_violations{{job=\"{}\"}}", s.job),
            )
            .await
            .unwrap_or_default();
            if !up.is_empty() && !violations.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{}: Prometheus never scraped dxdp ({:?}): {:?}",
                s.name,
                s.dxdp_args,
                api(prom_address, "/api/v1/targets").await
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    // honor_labels kept dxdp's pod labels (not exported_pod), and `node` is there.
    // The fixture's two violations (tests/cluster/isolation.rs works them out), once per job.
    let v = query(prom_address, "dxdp_isolation_violations")
        .await
        .unwrap();
    let mut seen: Vec<String> = v
        .iter()
        .map(|series| {
            let m = &series["metric"];
            assert!(m.get("exported_pod").is_none(), "{m}");
            assert_eq!(
                m["node"].as_str().unwrap_or_default(),
                m["job"]
                    .as_str()
                    .unwrap_or_default()
                    .replace("dxdp-", "gpu-node-"),
                "{m}"
            );
            format!(
                "{} {}/{}/{}",
                m["job"].as_str().unwrap_or_default(),
                m["namespace"].as_str().unwrap_or_default(),
                m["pod"].as_str().unwrap_or_default(),
                m["container"].as_str().unwrap_or_default()
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            "dxdp-basic tools/debug-0/shell",
            "dxdp-basic vision/detect-0/worker",
            "dxdp-plain tools/debug-0/shell",
            "dxdp-plain vision/detect-0/worker",
            "dxdp-tls tools/debug-0/shell",
            "dxdp-tls vision/detect-0/worker",
        ]
    );

    // Tables that list problems (idle or saturated shared GPUs), empty on this fixture's
    // figures: they must run; their counts are stat panels, which must return data.
    let problem_lists = ["Idle GPUs held by pods", "Oversubscribed shared GPUs"];
    let mut failures = Vec::new();
    let (dashboard, docs) = (dashboard_queries(), doc_queries());
    // The extraction itself works: the dashboard's 42 targets (27, the Cost row's 5 and the
    // Heat and power row's 10), the doc's 22 recipes.
    assert_eq!((dashboard.len(), docs.len()), (42, 22));
    for (title, q) in dashboard {
        let list = problem_lists.contains(&title.as_str()) && !q.contains("vector(0)");
        match query(prom_address, &q).await {
            Ok(r) if !r.is_empty() || list => {}
            Ok(_) => failures.push(format!("dashboard panel {title:?} returns nothing: {q}")),
            Err(e) => failures.push(format!("dashboard panel {title:?}: {e}")),
        }
    }
    // Conditions (a comparison or set operator at the top) may be false on this fixture.
    let condition = |q: &str| {
        [" > ", " < ", " == ", " >= ", " unless ", " and on"]
            .iter()
            .any(|op| q.contains(op))
    };
    // Recipes that need another exporter's series.
    let external = |q: &str| q.contains("kube_node_labels");
    for q in docs {
        match query(prom_address, &q).await {
            Ok(r) if r.is_empty() && !condition(&q) && !external(&q) => {
                failures.push(format!("docs/observability.md query returns nothing: {q}"))
            }
            Ok(_) => {}
            Err(e) => failures.push(format!("docs/observability.md query fails: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    drop(children);
    drop(kubelets);
}
