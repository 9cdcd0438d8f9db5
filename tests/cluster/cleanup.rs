//! `dxdp cleanup --node`: the binary, against the API server stand-in, takes off the node the
//! labels dxdp's field manager owns, the isolation taint and dxdp's node conditions, and leaves
//! everything else (labels, taints and conditions of others) as it was.

use crate::apiserver;

use std::collections::BTreeMap;

use apiserver::ApiServerStandin;
use dxdp::cluster::Cluster;

const SELECTOR: &str = "directx.microsoft.com/device-plugin.config";

fn cleanup(kubeconfig: &std::path::Path, node: &str) -> std::process::Output {
    dxdp_cleanup(kubeconfig, &["--node", node])
}

fn dxdp_cleanup(kubeconfig: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_dxdp"))
        .arg("cleanup")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_removes_dxdp_labels_taint_and_conditions_and_nothing_else() {
    let api = ApiServerStandin::start("gpu-node-1", &[(SELECTOR, "shared"), ("team", "vision")])
        .await
        .unwrap();
    // What a running dxdp leaves: its labels (server-side apply as "dxdp"), its taint and its
    // conditions, beside the kubelet's own condition and someone else's taint.
    let cluster = Cluster::at_url(&api.url(), "gpu-node-1").unwrap();
    let ours: BTreeMap<String, String> = [
        ("directx.microsoft.com/display.count", "4"),
        ("directx.microsoft.com/replicas", "3"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    cluster.apply_labels(&ours).await.unwrap();
    api.set_taints(vec![
        serde_json::json!({"key": "directx.microsoft.com/isolation-violation", "effect": "NoSchedule"}),
        serde_json::json!({"key": "os", "value": "windows", "effect": "NoSchedule"}),
    ]);
    api.set_conditions(vec![
        serde_json::json!({"type": "Ready", "status": "True"}),
        serde_json::json!({"type": "DirectXGPUHealthy", "status": "False", "reason": "DevicesUnhealthy"}),
        serde_json::json!({"type": "DirectXGPUIsolation", "status": "True", "reason": "NoViolation"}),
    ]);

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
    let out = cleanup(&kubeconfig, "gpu-node-1");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout,
        "node gpu-node-1: removed 2 labels (directx.microsoft.com/display.count, directx.microsoft.com/replicas), the taint directx.microsoft.com/isolation-violation, the conditions DirectXGPUHealthy, DirectXGPUIsolation\n"
    );
    let labels = api.labels();
    assert_eq!(
        labels,
        [(SELECTOR, "shared"), ("team", "vision")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
    );
    assert_eq!(
        api.taints(),
        [serde_json::json!({"key": "os", "value": "windows", "effect": "NoSchedule"})]
    );
    assert_eq!(
        api.conditions(),
        [serde_json::json!({"type": "Ready", "status": "True"})]
    );

    // Run again (after a crash, twice by mistake): nothing left, exit 0.
    let out = cleanup(&kubeconfig, "gpu-node-1");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "node gpu-node-1: nothing of dxdp's was left\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_of_a_node_that_does_not_exist_fails_naming_it() {
    let api = ApiServerStandin::start("gpu-node-1", &[]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
    let out = cleanup(&kubeconfig, "no-such-node");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("error: node no-such-node: get node no-such-node"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_all_finds_the_nodes_dxdp_left_something_on() {
    let api = ApiServerStandin::start("gpu-node-1", &[("team", "vision")])
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
    // Only someone else's label: nothing to do, and nothing is patched.
    let out = dxdp_cleanup(&kubeconfig, &["--all"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "no node has labels, taints or conditions of dxdp's\n"
    );
    assert!(api.patches().is_empty(), "{:?}", api.patches());
    // A label dxdp applied (found through managedFields): the node is cleaned.
    let cluster = Cluster::at_url(&api.url(), "gpu-node-1").unwrap();
    let ours: BTreeMap<String, String> = [(
        "directx.microsoft.com/vendor".to_string(),
        "nvidia".to_string(),
    )]
    .into();
    cluster.apply_labels(&ours).await.unwrap();
    let out = dxdp_cleanup(&kubeconfig, &["--all"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "node gpu-node-1: removed 1 label (directx.microsoft.com/vendor)\n"
    );
    assert_eq!(
        api.labels(),
        [("team".to_string(), "vision".to_string())].into()
    );
}

#[test]
fn cleanup_needs_node_or_all_and_not_both() {
    for args in [&[][..], &["--all", "--node", "n1"][..]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dxdp"))
            .arg("cleanup")
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_also_removes_the_validation_labels() {
    let api = ApiServerStandin::start("gpu-node-2", &[("team", "vision")])
        .await
        .unwrap();
    let cluster = Cluster::at_url(&api.url(), "gpu-node-2").unwrap();
    // What a validation run leaves (its own field manager) and nothing else: `--all` finds the
    // node by those labels alone.
    let passed = dxdp::validation::job::JobResult {
        verdict: dxdp_core::validation::Verdict::Pass,
        summary: dxdp_core::validation::parse_summary_line(
            "dxdp-validation v1 pass adapters=pass d3d12=pass\n",
        ),
        reason: String::new(),
    };
    dxdp::validation::run::publish_labels(&cluster, &passed)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
    let out = dxdp_cleanup(&kubeconfig, &["--all"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout,
        "node gpu-node-2: removed 2 labels (directx.microsoft.com/api.d3d12.validated, directx.microsoft.com/validated)\n"
    );
    assert_eq!(
        api.labels(),
        [("team".to_string(), "vision".to_string())].into()
    );
}
