//! `dxdp cleanup --node`: the binary, against the API server stand-in, takes off the node the
//! labels dxdp's field manager owns, the isolation taint and dxdp's node conditions, and leaves
//! everything else (labels, taints and conditions of others) as it was. Given dxdp's namespace
//! and DaemonSet it first stops the DaemonSet and waits until its pods are gone (a running dxdp
//! puts its labels back, `daemon`), and deletes the validation Jobs and dxdp's NodeFeature
//! objects; `--dry-run` changes
//! nothing; `--context` picks the kubeconfig context.

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
    for args in [
        &[][..],
        &["--all", "--node", "n1"][..],
        // The DaemonSet is looked for in dxdp's namespace, which must be named.
        &["--all", "--daemonset", "dxdp"][..],
        &["--all", "--namespace", "dxdp-system", "--wait", "5"][..],
    ] {
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

/// A validation Job as a daemon creates it (`validation::job`): its labels and the node its pod
/// is bound to are what the cleanup selects by.
fn validation_job(name: &str, node: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": "dxdp-system",
            "labels": {
                "app.kubernetes.io/name": "dxdp",
                "app.kubernetes.io/component": "dxdp-validation",
                "directx.microsoft.com/validation-node": node,
            },
        },
        "spec": {"template": {"spec": {"nodeName": node, "containers": []}}},
    })
}

fn kubeconfig_of(api: &ApiServerStandin) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
    (dir, kubeconfig)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_says_what_it_would_remove_and_changes_nothing() {
    let api = ApiServerStandin::start("gpu-node-1", &[("team", "vision")])
        .await
        .unwrap();
    let cluster = Cluster::at_url(&api.url(), "gpu-node-1").unwrap();
    let ours: BTreeMap<String, String> = [
        ("directx.microsoft.com/display.count", "4"),
        ("directx.microsoft.com/vendor", "nvidia"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    cluster.apply_labels(&ours).await.unwrap();
    api.set_taints(vec![serde_json::json!(
        {"key": "directx.microsoft.com/isolation-violation", "effect": "NoSchedule"}
    )]);
    api.set_conditions(vec![
        serde_json::json!({"type": "Ready", "status": "True"}),
        serde_json::json!({"type": "DirectXGPUHealthy", "status": "True", "reason": "GPUsHealthy"}),
    ]);
    api.add_daemonset("dxdp-system", "dxdp");
    api.add_job(validation_job(
        "dxdp-validate-gpu-node-1-1764028800",
        "gpu-node-1",
    ));
    api.add_job(validation_job(
        "dxdp-validate-gpu-node-2-1764028801",
        "gpu-node-2",
    ));
    let before = api.requests().len();
    let (_dir, kubeconfig) = kubeconfig_of(&api);
    let out = dxdp_cleanup(
        &kubeconfig,
        &[
            "--all",
            "--namespace",
            "dxdp-system",
            "--daemonset",
            "dxdp",
            "--dry-run",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout,
        "daemonset dxdp-system/dxdp: would be deleted, and its pods waited for (at most 60 s)\n\
         validation jobs in dxdp-system: would delete 2 (dxdp-validate-gpu-node-1-1764028800, dxdp-validate-gpu-node-2-1764028801)\n\
         NodeFeature objects in dxdp-system: none\n\
         node gpu-node-1: would remove 2 labels (directx.microsoft.com/display.count, directx.microsoft.com/vendor), the taint directx.microsoft.com/isolation-violation, the conditions DirectXGPUHealthy\n"
    );
    // Reads only.
    let methods: Vec<String> = api.requests()[before..]
        .iter()
        .map(|r| r.method.clone())
        .collect();
    assert!(methods.iter().all(|m| m == "GET"), "{methods:?}");
    assert!(api.daemonset("dxdp-system", "dxdp").is_some());
    assert_eq!(api.jobs().len(), 2);
    assert_eq!(api.labels().len(), 3, "{:?}", api.labels());
    assert_eq!(api.taints().len(), 1);
    assert_eq!(api.conditions().len(), 2);
}

/// A NodeFeature object for `node` named `name` (dxdp names its own `dxdp-<node>`).
fn node_feature(name: &str, node: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
        "kind": "NodeFeature",
        "metadata": {"name": name, "namespace": "dxdp-system",
                     "labels": {"nfd.node.kubernetes.io/node-name": node}},
        "spec": {"labels": {"directx.microsoft.com/display.count": "1"}},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_deletes_dxdp_nodefeature_objects_of_the_nodes_named_only() {
    let api = ApiServerStandin::start("gpu-node-1", &[]).await.unwrap();
    api.install_crd(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/crds/nfd-nodefeature.yaml"),
        )
        .unwrap(),
    );
    api.add_node_feature("dxdp-system", node_feature("dxdp-gpu-node-1", "gpu-node-1"));
    api.add_node_feature("dxdp-system", node_feature("dxdp-gpu-node-2", "gpu-node-2"));
    // Not dxdp's: another writer's object for the node, and a name that is not the node's.
    api.add_node_feature("dxdp-system", node_feature("gfd-gpu-node-1", "gpu-node-1"));
    api.add_node_feature("dxdp-system", node_feature("dxdp-gpu-node-3", "gpu-node-1"));
    let (_dir, kubeconfig) = kubeconfig_of(&api);
    let out = dxdp_cleanup(
        &kubeconfig,
        &["--node", "gpu-node-1", "--namespace", "dxdp-system"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout,
        "validation jobs in dxdp-system: none\n\
         NodeFeature objects in dxdp-system: deleted 1 (dxdp-gpu-node-1)\n\
         node gpu-node-1: nothing of dxdp's was left\n"
    );
    assert!(api.node_feature("dxdp-system", "dxdp-gpu-node-1").is_none());
    for left in ["dxdp-gpu-node-2", "gfd-gpu-node-1", "dxdp-gpu-node-3"] {
        assert!(api.node_feature("dxdp-system", left).is_some(), "{left}");
    }
    // --all (the uninstall hook): every node's, here as a dry run.
    let out = dxdp_cleanup(
        &kubeconfig,
        &["--all", "--namespace", "dxdp-system", "--dry-run"],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "validation jobs in dxdp-system: none\n\
         NodeFeature objects in dxdp-system: would delete 1 (dxdp-gpu-node-2)\n\
         no node has labels, taints or conditions of dxdp's\n"
    );
    assert!(api.node_feature("dxdp-system", "dxdp-gpu-node-2").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_of_named_nodes_deletes_their_validation_jobs_only() {
    let api = ApiServerStandin::start("gpu-node-1", &[]).await.unwrap();
    api.add_job(validation_job(
        "dxdp-validate-gpu-node-1-1764028800",
        "gpu-node-1",
    ));
    api.add_job(validation_job(
        "dxdp-validate-gpu-node-2-1764028801",
        "gpu-node-2",
    ));
    // Not a validation Job: never touched.
    let mut other = validation_job("backup-1", "gpu-node-1");
    other["metadata"]["labels"]["app.kubernetes.io/component"] = "backup".into();
    api.add_job(other);
    let (_dir, kubeconfig) = kubeconfig_of(&api);
    let out = dxdp_cleanup(
        &kubeconfig,
        &["--node", "gpu-node-1", "--namespace", "dxdp-system"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout,
        "validation jobs in dxdp-system: deleted 1 (dxdp-validate-gpu-node-1-1764028800)\n\
         NodeFeature objects in dxdp-system: none\n\
         node gpu-node-1: nothing of dxdp's was left\n"
    );
    let left: Vec<String> = api
        .jobs()
        .iter()
        .map(|j| j["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(left, ["dxdp-validate-gpu-node-2-1764028801", "backup-1"]);
    // With their pods: the garbage collector removes them in the background.
    let delete = api
        .requests()
        .into_iter()
        .find(|r| r.method == "DELETE")
        .unwrap();
    assert_eq!(
        delete.path,
        "/apis/batch/v1/namespaces/dxdp-system/jobs/dxdp-validate-gpu-node-1-1764028800"
    );
    assert_eq!(delete.propagation_policy().as_deref(), Some("Background"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_picks_the_kubeconfig_context_and_an_unknown_one_is_an_error() {
    let api = ApiServerStandin::start("gpu-node-1", &[]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    // The current context points where nothing answers.
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n\
         - name: standin\n  cluster:\n    server: {}\n\
         - name: nowhere\n  cluster:\n    server: http://127.0.0.1:9\n\
         users:\n- name: anonymous\n  user: {{}}\n\
         contexts:\n\
         - name: standin\n  context:\n    cluster: standin\n    user: anonymous\n\
         - name: elsewhere\n  context:\n    cluster: nowhere\n    user: anonymous\n\
         current-context: elsewhere\n",
        api.url()
    );
    std::fs::write(&kubeconfig, &text).unwrap();
    let out = dxdp_cleanup(
        &kubeconfig,
        &["--node", "gpu-node-1", "--context", "standin", "--dry-run"],
    );
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
        ),
        (
            Some(0),
            "node gpu-node-1: nothing of dxdp's is there\n".into()
        ),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = dxdp_cleanup(&kubeconfig, &["--node", "gpu-node-1", "--context", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("kubeconfig context \"nope\""), "{stderr}");
    assert!(stderr.contains("kubectl config get-contexts"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemonset_whose_pods_do_not_go_is_waited_for_at_most_wait_then_the_nodes_are_cleaned() {
    let api = ApiServerStandin::start("gpu-node-1", &[]).await.unwrap();
    let cluster = Cluster::at_url(&api.url(), "gpu-node-1").unwrap();
    let ours: BTreeMap<String, String> = [(
        "directx.microsoft.com/vendor".to_string(),
        "nvidia".to_string(),
    )]
    .into();
    cluster.apply_labels(&ours).await.unwrap();
    // Deleted in the foreground, but its pod on a node that does not answer never goes.
    api.add_daemonset("dxdp-system", "dxdp");
    let (_dir, kubeconfig) = kubeconfig_of(&api);
    let out = dxdp_cleanup(
        &kubeconfig,
        &[
            "--node",
            "gpu-node-1",
            "--namespace",
            "dxdp-system",
            "--daemonset",
            "dxdp",
            "--wait",
            "1",
        ],
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "validation jobs in dxdp-system: none\n\
         NodeFeature objects in dxdp-system: none\n\
         node gpu-node-1: removed 1 label (directx.microsoft.com/vendor)\n"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(
            "warning: daemonset dxdp-system/dxdp: deleted, but pods of it are still stopping after 1 s (on a node that does not answer?); cleaning anyway"
        ),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        api.daemonset("dxdp-system", "dxdp").unwrap()["metadata"]["deletionTimestamp"].is_string()
    );
    // Run again once it is gone: nothing left, and the DaemonSet is not found.
    api.daemonset_pods_gone("dxdp-system", "dxdp");
    let out = dxdp_cleanup(
        &kubeconfig,
        &[
            "--node",
            "gpu-node-1",
            "--namespace",
            "dxdp-system",
            "--daemonset",
            "dxdp",
        ],
    );
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
        ),
        (
            Some(0),
            "daemonset dxdp-system/dxdp: not found\n\
             validation jobs in dxdp-system: none\n\
             NodeFeature objects in dxdp-system: none\n\
             node gpu-node-1: nothing of dxdp's was left\n"
                .into()
        )
    );
}

/// `dxdp plugin` running (a kubelet stand-in on real Unix sockets, the API server stand-in)
/// while a cleanup runs: the uninstall's order.
#[cfg(unix)]
mod daemon {
    use super::*;

    use std::path::Path;
    use std::time::Duration;

    use crate::common;
    use dxdp::kubelet::standin::KubeletStandin;

    /// Generous: these waits are for behaviour, not speed.
    const WAIT: Duration = Duration::from_secs(30);

    /// The isolation taint and both node conditions on, and a replayed node that leaks (two
    /// violations): everything dxdp can put on a Node.
    const CONFIG: &str = "telemetry:\n  interval: 1s\nisolation:\n  policy: taint\nhealth:\n  nodeConditions: true\n";

    const TAINT: &str = "directx.microsoft.com/isolation-violation";

    /// The labels dxdp applies for the `telemetry-leak` fixture with the default resources: two
    /// NVIDIA Tesla T4 (graphics: the display resource), 16106127360 bytes = 15360 MiB each,
    /// driver 31.0.15.2824 (WDDM 3.1), PCI 10de:1eb8 (the turing family), one replica (not
    /// shared), more than one device (shared visibility); without the timestamp label, whose
    /// value is the time of the change ([`TIMESTAMP`]).
    fn daemon_labels() -> BTreeMap<String, String> {
        DAEMON_LABELS
            .iter()
            .map(|(k, v)| (format!("directx.microsoft.com/{k}"), v.to_string()))
            .collect()
    }

    const DAEMON_LABELS: &[(&str, &str)] = &[
        ("compute.count", "0"),
        ("display.count", "2"),
        ("display.family", "turing"),
        ("display.memory", "15360"),
        ("display.product", "NVIDIA-Tesla-T4"),
        ("display.replicas", "1"),
        ("display.sharing-strategy", "none"),
        ("display.wddm-version", "3.1"),
        ("driver-version", "31.0.15.2824"),
        ("family", "turing"),
        ("memory", "15360"),
        ("multi-gpu-visibility", "shared"),
        ("product", "NVIDIA-Tesla-T4"),
        ("replicas", "1"),
        ("sharing-strategy", "none"),
        ("vendor", "nvidia"),
        ("wddm-version", "3.1"),
    ];

    /// dxdp's timestamp label, set with the others.
    const TIMESTAMP: &str = "directx.microsoft.com/timestamp";

    fn start(dir: &Path, kubeconfig: &Path) -> tokio::process::Child {
        let config = dir.join("config.yaml");
        std::fs::write(&config, CONFIG).unwrap();
        tokio::process::Command::new(env!("CARGO_BIN_EXE_dxdp"))
            .args(["plugin", "--kubelet-dir"])
            .arg(dir)
            .arg("--host-snapshot")
            .arg(common::fixture_path("telemetry-leak"))
            .arg("--config")
            .arg(&config)
            .env_clear()
            .env("NODE_NAME", "gpu-node-1")
            .env("KUBECONFIG", kubeconfig)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    }

    fn cleanup_child(kubeconfig: &Path, args: &[&str]) -> tokio::process::Child {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_dxdp"))
            .arg("cleanup")
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    }

    fn condition_types(conditions: &[serde_json::Value]) -> Vec<String> {
        let mut types: Vec<String> = conditions
            .iter()
            .map(|c| c["type"].as_str().unwrap_or_default().to_string())
            .collect();
        types.sort();
        types
    }

    /// Everything dxdp puts on the Node is there: its labels, the taint, both conditions.
    async fn all_of_dxdp_is_on(api: &ApiServerStandin) {
        let want = daemon_labels();
        assert!(
            api.wait_for(WAIT, |_, l| want.iter().all(|(k, v)| l.get(k) == Some(v)))
                .await,
            "labels {:?}",
            api.labels()
        );
        assert!(
            api.wait_for_state(WAIT, |_, t| t.iter().any(|t| t["key"] == TAINT))
                .await,
            "taints {:?}",
            api.taints()
        );
        assert!(
            api.wait_for_conditions(WAIT, |c| condition_types(c)
                == ["DirectXGPUHealthy", "DirectXGPUIsolation", "Ready"])
                .await,
            "conditions {:?}",
            api.conditions()
        );
    }

    async fn setup(test: &str) -> Option<(tempfile::TempDir, KubeletStandin, ApiServerStandin)> {
        if !common::af_unix(test) {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("dxdp")
            .tempdir_in("/tmp")
            .unwrap();
        // The binary speaks AF_UNIX only.
        let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
            .await
            .unwrap();
        let api = ApiServerStandin::start("gpu-node-1", &[("team", "vision")])
            .await
            .unwrap();
        // The kubelet's own condition, which no cleanup touches.
        api.set_conditions(vec![serde_json::json!({"type": "Ready", "status": "True"})]);
        std::fs::write(dir.path().join("kubeconfig"), api.kubeconfig()).unwrap();
        Some((dir, kubelet, api))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_uninstall_stops_the_daemonset_first_and_nothing_comes_back() {
        let Some((dir, kubelet, api)) =
            setup("the_uninstall_stops_the_daemonset_first_and_nothing_comes_back").await
        else {
            return;
        };
        let kubeconfig = dir.path().join("kubeconfig");
        api.add_daemonset("dxdp-system", "dxdp");
        api.add_job(validation_job(
            "dxdp-validate-gpu-node-1-1764028800",
            "gpu-node-1",
        ));
        let mut plugin = start(dir.path(), &kubeconfig);
        all_of_dxdp_is_on(&api).await;

        // The chart's pre-delete hook, while the daemon runs.
        let cleanup = cleanup_child(
            &kubeconfig,
            &[
                "--all",
                "--namespace",
                "dxdp-system",
                "--daemonset",
                "dxdp",
                "--wait",
                "60",
            ],
        );
        let ds_path = "/apis/apps/v1/namespaces/dxdp-system/daemonsets/dxdp";
        // It deletes the DaemonSet in the foreground, then reads it until it is gone: twice
        // read while the daemon still runs...
        assert!(
            api.wait_for(WAIT, |r, _| {
                let deleted = r
                    .iter()
                    .position(|r| r.method == "DELETE" && r.path == ds_path);
                deleted.is_some_and(|at| {
                    r[at..]
                        .iter()
                        .filter(|r| r.method == "GET" && r.path == ds_path)
                        .count()
                        >= 2
                })
            })
            .await,
            "{:?}",
            api.requests()
        );
        let delete = api
            .requests()
            .into_iter()
            .find(|r| r.method == "DELETE" && r.path == ds_path)
            .unwrap();
        assert_eq!(delete.propagation_policy().as_deref(), Some("Foreground"));
        // ...and meanwhile nothing was taken off the node, nor any Job deleted.
        let want = daemon_labels();
        let labels = api.labels();
        assert!(
            want.iter().all(|(k, v)| labels.get(k) == Some(v)),
            "{labels:?}"
        );
        assert!(api.taints().iter().any(|t| t["key"] == TAINT));
        assert_eq!(api.jobs().len(), 1);

        // The kubelet stops the pod, then the garbage collector removes the DaemonSet.
        let log = {
            common::terminate(&mut plugin, WAIT).await;
            std::fs::read_to_string(dir.path().join("stderr.log")).unwrap()
        };
        api.daemonset_pods_gone("dxdp-system", "dxdp");
        let out = tokio::time::timeout(WAIT, cleanup.wait_with_output())
            .await
            .expect("the cleanup ends")
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}\n{log}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut labels: Vec<String> = want.keys().cloned().collect();
        labels.push(TIMESTAMP.to_string());
        labels.sort();
        assert_eq!(
            stdout,
            format!(
                "daemonset dxdp-system/dxdp: deleted, its pods are gone\n\
                 validation jobs in dxdp-system: deleted 1 (dxdp-validate-gpu-node-1-1764028800)\n\
                 NodeFeature objects in dxdp-system: none\n\
                 node gpu-node-1: removed {} labels ({}), the taint {TAINT}, the conditions DirectXGPUHealthy, DirectXGPUIsolation\n",
                labels.len(),
                labels.join(", ")
            )
        );
        // Nothing of dxdp's is left, and the rest is as it was.
        assert_eq!(
            api.labels(),
            [("team".to_string(), "vision".to_string())].into()
        );
        assert_eq!(api.taints(), Vec::<serde_json::Value>::new());
        assert_eq!(
            api.conditions(),
            [serde_json::json!({"type": "Ready", "status": "True"})]
        );
        assert!(api.jobs().is_empty());
        assert!(api.daemonset("dxdp-system", "dxdp").is_none());
        kubelet.stop().await;
    }

    /// Why the uninstall stops the daemons first: a running dxdp keeps its labels on its Node
    /// (docs/observability.md), so a cleanup alone is undone at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_running_daemon_puts_its_labels_back_after_a_cleanup_alone() {
        let Some((dir, kubelet, api)) =
            setup("a_running_daemon_puts_its_labels_back_after_a_cleanup_alone").await
        else {
            return;
        };
        let kubeconfig = dir.path().join("kubeconfig");
        let mut plugin = start(dir.path(), &kubeconfig);
        all_of_dxdp_is_on(&api).await;
        let applies = |r: &[apiserver::Recorded]| {
            r.iter()
                .filter(|r| r.content_type.as_deref() == Some("application/apply-patch+yaml"))
                .count()
        };
        let before = applies(&api.requests());
        let out = cleanup(&kubeconfig, "gpu-node-1");
        assert!(out.status.success());
        // The cleanup's two empty applies (dxdp-validation's, dxdp's), then the daemon's.
        let want = daemon_labels();
        assert!(
            api.wait_for(WAIT, |r, l| applies(r) >= before + 3
                && want.iter().all(|(k, v)| l.get(k) == Some(v)))
                .await,
            "{:?}",
            api.labels()
        );
        common::terminate(&mut plugin, WAIT).await;
        kubelet.stop().await;
    }
}
