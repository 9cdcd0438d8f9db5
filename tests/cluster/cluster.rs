//! `dxdp plugin` as a process with a cluster: a kubelet stand-in on real Unix sockets and an API
//! server stand-in on real HTTP, found through `NODE_NAME` and `KUBECONFIG` as on a node. The
//! node's labels follow the devices and the configuration, and the node's
//! `device-plugin.config` label selects a named configuration at start and on every change.

#![cfg(unix)]

use std::path::Path;
use std::time::Duration;

use crate::apiserver;

use apiserver::ApiServerStandin;
use dxdp::kubelet::standin::KubeletStandin;

use crate::common;

const DISPLAY: &str = "directx.microsoft.com/display";
const SELECTOR: &str = "directx.microsoft.com/device-plugin.config";
/// Generous: these waits are for behaviour, not speed.
const WAIT: Duration = Duration::from_secs(20);

const CONFIG: &str = "
resources:
  display:
    replicas: 1
configurations:
  shared:
    resources:
      display:
        replicas: 3
  exclusive: {}
";

struct Plugin {
    child: tokio::process::Child,
    log: std::path::PathBuf,
}

impl Plugin {
    fn start(dir: &Path, env: &[(&str, &str)]) -> Plugin {
        let log = dir.join("stderr.log");
        let config = dir.join("config.yaml");
        std::fs::write(&config, CONFIG).unwrap();
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_dxdp"))
            .args(["plugin", "--kubelet-dir"])
            .arg(dir)
            .arg("--host-snapshot")
            .arg(common::fixture_path("nvidia-multi-gpu"))
            .arg("--config")
            .arg(&config)
            .env_clear()
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Plugin { child, log }
    }

    async fn stop(mut self) -> String {
        common::terminate(&mut self.child, WAIT).await;
        std::fs::read_to_string(&self.log).unwrap()
    }
}

fn label<'a>(labels: &'a std::collections::BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    labels
        .get(&format!("directx.microsoft.com/{key}"))
        .map(String::as_str)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_and_the_selected_configuration_follow_the_node() {
    let dir = tempfile::Builder::new()
        .prefix("dxdp")
        .tempdir_in("/tmp")
        .unwrap();
    let kubelet = KubeletStandin::start(common::transport(), dir.path())
        .await
        .unwrap();
    let api = ApiServerStandin::start("gpu-node-1", &[(SELECTOR, "shared"), ("team", "vision")])
        .await
        .unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
    let plugin = Plugin::start(
        dir.path(),
        &[
            ("NODE_NAME", "gpu-node-1"),
            ("KUBECONFIG", kubeconfig.to_str().unwrap()),
        ],
    );

    // The node's label selects "shared" from the start: 4 GPUs x 3 replicas.
    let len = |n: usize| {
        move |v: &dxdp::kubelet::standin::StandinView| v.devices(DISPLAY).map(<[_]>::len) == Some(n)
    };
    assert!(
        kubelet.wait_for(WAIT, len(12)).await,
        "{:?}",
        kubelet.view()
    );
    assert!(
        api.wait_for(WAIT, |_, l| {
            label(l, "replicas") == Some("3") && label(l, "display.count") == Some("4")
        })
        .await,
        "labels applied"
    );
    assert_eq!(api.labels().get("team").map(String::as_str), Some("vision"));
    let patch = api.patches().remove(0);
    assert_eq!(
        patch.content_type.as_deref(),
        Some("application/apply-patch+yaml")
    );
    assert_eq!(
        patch.query.get("fieldManager").map(String::as_str),
        Some("dxdp")
    );

    // The label changes: the other configuration applies, and the labels follow.
    api.set_label(SELECTOR, Some("exclusive"));
    assert!(kubelet.wait_for(WAIT, len(4)).await, "{:?}", kubelet.view());
    assert!(
        api.wait_for(WAIT, |_, l| label(l, "replicas") == Some("1"))
            .await,
        "replicas label follows the configuration"
    );

    // An unknown name falls back to the default (1 replica) with a warning.
    api.set_label(SELECTOR, Some("huge"));
    api.set_label(SELECTOR, Some("shared"));
    assert!(kubelet.wait_for(WAIT, len(12)).await);
    api.set_label(SELECTOR, Some("huge"));
    assert!(kubelet.wait_for(WAIT, len(4)).await);

    let log = plugin.stop().await;
    assert!(log.contains("node labels on"), "{log}");
    assert_eq!(
        log.matches("Kubernetes credentials: KUBECONFIG or ~/.kube/config (not in a pod)")
            .count(),
        1,
        "which credentials, said once: {log}"
    );
    assert!(
        log.contains("\"huge\" (node label directx.microsoft.com/device-plugin.config on node gpu-node-1) is not in"),
        "{log}"
    );
    // The labels stay after a stop: the devices are still there.
    assert_eq!(label(&api.labels(), "display.count"), Some("4"));
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_node_name_or_credentials_it_serves_and_says_why_once() {
    // A kubeconfig that works: in a pod dxdp must not fall back to it (issue 35).
    let api = ApiServerStandin::start("n1", &[]).await.unwrap();
    let kc_dir = tempfile::tempdir().unwrap();
    let kubeconfig = kc_dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
    let kubeconfig = kubeconfig.to_str().unwrap();
    for (env, why) in [
        (vec![], "NODE_NAME is not set"),
        (
            vec![
                ("NODE_NAME", "n1"),
                ("KUBECONFIG", "/nonexistent/kubeconfig"),
            ],
            "no Kubernetes credentials found",
        ),
        (
            vec![
                ("NODE_NAME", "n1"),
                ("KUBECONFIG", kubeconfig),
                ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
                ("KUBERNETES_SERVICE_PORT", "443"),
            ],
            "dxdp does not fall back to the host's kubeconfig in a pod",
        ),
    ] {
        let dir = tempfile::Builder::new()
            .prefix("dxdp")
            .tempdir_in("/tmp")
            .unwrap();
        let kubelet = KubeletStandin::start(common::transport(), dir.path())
            .await
            .unwrap();
        let plugin = Plugin::start(dir.path(), &env);
        assert!(
            kubelet
                .wait_for(WAIT, |v| v.devices(DISPLAY).map(<[_]>::len) == Some(4))
                .await
        );
        let log = plugin.stop().await;
        assert_eq!(
            log.matches("node labels and per-node configuration are off")
                .count(),
            1,
            "{log}"
        );
        assert!(log.contains(why), "{log}");
        kubelet.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_show_says_which_configuration_the_node_selects_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let api = ApiServerStandin::start("gpu-node-1", &[(SELECTOR, "shared")])
        .await
        .unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let show = |args: &'static [&'static str], node: bool| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_dxdp"));
        cmd.args(["config", "show", "--config"])
            .arg(&config)
            .args(args)
            .env_clear()
            .env("KUBECONFIG", &kubeconfig);
        if node {
            cmd.env("NODE_NAME", "gpu-node-1");
        }
        async move {
            let out = cmd.output().await.unwrap();
            assert!(out.status.success(), "{out:?}");
            (
                String::from_utf8(out.stdout).unwrap(),
                String::from_utf8(out.stderr).unwrap(),
            )
        }
    };
    let file = format!("file {}", config.display());
    let (out, _) = show(&[], true).await;
    assert!(
        out.contains("configuration: shared  # node label directx.microsoft.com/device-plugin.config on node gpu-node-1\n"),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "resources.display.replicas: 3  # {file} (configuration shared)\n"
        )),
        "{out}"
    );
    let (out, _) = show(&["--configuration", "exclusive"], true).await;
    assert!(
        out.contains("configuration: exclusive  # flag --configuration\n"),
        "{out}"
    );
    assert!(
        out.contains(&format!("resources.display.replicas: 1  # {file}\n")),
        "{out}"
    );
    let (out, _) = show(&[], false).await;
    assert!(
        out.contains("configuration: default  # default: no configuration selected\n"),
        "{out}"
    );
    api.set_label(SELECTOR, Some("huge"));
    let (out, err) = show(&[], true).await;
    assert!(
        out.contains("configuration: default  # default: \"huge\""),
        "{out}"
    );
    assert!(err.contains("warning: configuration \"huge\""), "{err}");
}
