//! Node labels and node following against the API server stand-in, over real HTTP.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

#[path = "../../tests/support/apiserver.rs"]
pub(crate) mod standin;

use super::*;
use crate::config::{Config, NodeInfo};
use crate::inventory::{self, Inventory};
use crate::observe::label_metrics::{LabelMetrics, WriteResult, WriteTarget};
use crate::util::retry::Backoff;
use crate::util::task::Task;
use standin::ApiServerStandin;

const FAST: Backoff = Backoff {
    initial: Duration::from_millis(5),
    max: Duration::from_millis(20),
    timeout: Duration::from_secs(5),
};

/// Generous: the waits are for behaviour, not speed.
const WAIT: Duration = Duration::from_secs(20);

const SELECTOR: &str = "directx.microsoft.com/device-plugin.config";

impl Cluster {
    /// The same client with another per-call timeout.
    fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

fn fixture(name: &str) -> dxdp_core::facts::HostFacts {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    dxdp_core::snapshot::read_file(&path).unwrap()
}

fn inventory(facts: &dxdp_core::facts::HostFacts, config: Config) -> Arc<Inventory> {
    Arc::new(inventory::build(facts, Arc::new(config)).0)
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The labels of tests/fixtures/nvidia-multi-gpu.yaml (four Tesla T4, 10de:1eb8, 16106127360
/// bytes each, driver 31.0.15.2824, D3D12 feature level 12_1), written out by hand from the
/// fixture; without the timestamp.
fn four_t4(replicas: &str) -> BTreeMap<String, String> {
    let p = "directx.microsoft.com/";
    let (product, strategy) = if replicas == "1" {
        ("NVIDIA-Tesla-T4", "none")
    } else {
        ("NVIDIA-Tesla-T4-SHARED", "time-slicing")
    };
    [
        ("display.product", product),
        ("display.family", "turing"),
        ("display.memory", "15360"),
        ("display.wddm-version", "3.1"),
        ("display.d3d12-feature-level", "12_1"),
        ("display.sharing-strategy", strategy),
        ("display.replicas", replicas),
        ("family", "turing"),
        ("wddm-version", "3.1"),
        ("sharing-strategy", strategy),
    ]
    .iter()
    .map(|(k, v)| (format!("{p}{k}"), v.to_string()))
    .chain(four_t4_original(replicas))
    .collect()
}

/// `labels` without dxdp's timestamp label (checked on its own: it is the time of the change).
fn no_stamp(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut l = labels.clone();
    l.retain(|k, _| !k.ends_with("/timestamp"));
    l
}

/// The timestamp label of `labels`.
fn stamp(labels: &BTreeMap<String, String>) -> Option<String> {
    labels
        .iter()
        .find(|(k, _)| k.ends_with("/timestamp"))
        .map(|(_, v)| v.clone())
}

/// The labels dxdp set before issue 46 (their meaning is unchanged).
fn four_t4_original(replicas: &str) -> BTreeMap<String, String> {
    let p = "directx.microsoft.com/";
    [
        ("display.count", "4"),
        ("compute.count", "0"),
        ("vendor", "nvidia"),
        ("product", "NVIDIA-Tesla-T4"),
        ("memory", "15360"),
        ("driver-version", "31.0.15.2824"),
        ("replicas", replicas),
        ("multi-gpu-visibility", "shared"),
        ("api.cuda", "true"),
        ("api.nvml", "true"),
        ("api.opencl", "true"),
        ("api.nvenc", "true"),
    ]
    .iter()
    .map(|(k, v)| (format!("{p}{k}"), v.to_string()))
    .collect()
}

/// Waits until the stand-in has received `n` PATCH requests.
async fn applies_reach(api: &ApiServerStandin, n: usize) {
    let reached = api
        .wait_for(WAIT, |r, _| {
            r.iter().filter(|r| r.method == "PATCH").count() == n
        })
        .await;
    assert!(reached, "{n} applies expected, got {}", api.patches().len());
}

fn with_others(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut all = labels.clone();
    all.extend(map(&[("team", "vision"), (SELECTOR, "big")]));
    all
}

#[tokio::test]
async fn labels_are_added_changed_and_removed_with_server_side_apply() {
    let api = ApiServerStandin::start("n1", &[("team", "vision"), (SELECTOR, "big")])
        .await
        .unwrap();
    let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
    let facts = fixture("nvidia-multi-gpu.yaml");
    let (inventory_tx, inventory_rx) = watch::channel(inventory(&facts, Config::default()));
    let (_node_tx, node_rx) = watch::channel(None::<NodeInfo>);
    let task = tokio::spawn(
        labels::KeepLabels {
            cluster,
            inventory: inventory_rx,
            node: node_rx,
            backoff: FAST,
            namespace: None,
            metrics: Default::default(),
        }
        .run(),
    );

    // Add.
    applies_reach(&api, 1).await;
    let patch = &api.patches()[0];
    assert_eq!(patch.path, "/api/v1/nodes/n1");
    assert_eq!(
        patch.content_type.as_deref(),
        Some("application/apply-patch+yaml")
    );
    assert_eq!(
        patch.query,
        map(&[("fieldManager", "dxdp"), ("force", "true")])
    );
    let want = four_t4("1");
    let sent = patch.json();
    let labels: BTreeMap<String, String> =
        serde_json::from_value(sent["metadata"]["labels"].clone()).unwrap();
    assert_eq!(
        sent,
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1", "labels": labels},
        })
    );
    assert_eq!(no_stamp(&labels), want);
    let first_stamp = stamp(&labels).expect("a timestamp label");
    assert!(first_stamp.parse::<u64>().is_ok_and(|t| t > 1_700_000_000));
    assert_eq!(no_stamp(&api.labels()), with_others(&want));

    // Change: replicas follow the configuration.
    inventory_tx.send_replace(inventory(&facts, Config::default().with_replicas(4)));
    applies_reach(&api, 2).await;
    let want = four_t4("4");
    let sent: BTreeMap<String, String> =
        serde_json::from_value(api.patches()[1].json()["metadata"]["labels"].clone()).unwrap();
    assert_eq!(no_stamp(&sent), want);
    assert_eq!(no_stamp(&api.labels()), with_others(&want));

    // Removal: with one device left, the visibility label goes; others' labels stay.
    let mut one = facts.clone();
    one.adapters.truncate(1);
    inventory_tx.send_replace(inventory(&one, Config::default().with_replicas(4)));
    applies_reach(&api, 3).await;
    let mut want = four_t4("4");
    want.remove("directx.microsoft.com/multi-gpu-visibility");
    want.insert("directx.microsoft.com/display.count".into(), "1".into());
    let sent: BTreeMap<String, String> =
        serde_json::from_value(api.patches()[2].json()["metadata"]["labels"].clone()).unwrap();
    assert_eq!(no_stamp(&sent), want);
    assert_eq!(no_stamp(&api.labels()), with_others(&want));

    // The same labels again: nothing is sent.
    inventory_tx.send_replace(inventory(&one, Config::default().with_replicas(4)));
    // Labels turned off: dxdp's labels are removed, once.
    let mut off = Config::default().with_replicas(4);
    off.node_labels.enabled = false;
    inventory_tx.send_replace(inventory(&one, off));
    applies_reach(&api, 4).await;
    assert_eq!(
        api.patches()[3].json()["metadata"]["labels"],
        serde_json::json!({})
    );
    assert_eq!(api.labels(), map(&[("team", "vision"), (SELECTOR, "big")]));

    drop(inventory_tx);
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("keep ends when the inventory channel closes")
        .unwrap();
    assert_eq!(api.patches().len(), 4);
}

#[tokio::test]
async fn a_custom_prefix_replaces_the_old_keys() {
    let api = ApiServerStandin::start("n1", &[]).await.unwrap();
    let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
    let facts = fixture("nvidia-multi-gpu.yaml");
    let (inventory_tx, inventory_rx) = watch::channel(inventory(&facts, Config::default()));
    let (_node_tx, node_rx) = watch::channel(None::<NodeInfo>);
    let _task = tokio::spawn(
        labels::KeepLabels {
            cluster,
            inventory: inventory_rx,
            node: node_rx,
            backoff: FAST,
            namespace: None,
            metrics: Default::default(),
        }
        .run(),
    );
    assert!(api.wait_for(WAIT, |_, l| no_stamp(l) == four_t4("1")).await);
    let mut c = Config::default();
    c.node_labels.prefix = "gpu.example.com/".into();
    inventory_tx.send_replace(inventory(&facts, c));
    let want: BTreeMap<String, String> = four_t4("1")
        .into_iter()
        .map(|(k, v)| (k.replace("directx.microsoft.com/", "gpu.example.com/"), v))
        .collect();
    assert!(api.wait_for(WAIT, |_, l| no_stamp(l) == want).await);
}

#[tokio::test]
async fn api_errors_are_retried_and_labels_off_removes_only_dxdp_labels() {
    let api = ApiServerStandin::start("n1", &[("team", "vision")])
        .await
        .unwrap();
    api.fail_next("PATCH", &[500, 503, 429]);
    let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
    let facts = fixture("nvidia-multi-gpu.yaml");
    let (inventory_tx, inventory_rx) = watch::channel(inventory(&facts, Config::default()));
    let (_node_tx, node_rx) = watch::channel(None::<NodeInfo>);
    let task = tokio::spawn(
        labels::KeepLabels {
            cluster: cluster.clone(),
            inventory: inventory_rx,
            node: node_rx,
            backoff: FAST,
            namespace: None,
            metrics: Default::default(),
        }
        .run(),
    );
    // 12 original labels, 10 new ones, the timestamp and team.
    assert!(api.wait_for(WAIT, |_, l| l.len() == 24).await);
    assert_eq!(api.patches().len(), 4, "three failures, then success");
    assert_eq!(no_stamp(&api.labels()), {
        let mut all = four_t4("1");
        all.insert("team".into(), "vision".into());
        all
    });
    drop(inventory_tx);
    task.await.unwrap();

    // A later run with labels off removes the labels this one left, and only those.
    let mut off = Config::default();
    off.node_labels.enabled = false;
    let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
    let (inventory_tx, inventory_rx) = watch::channel(inventory(&facts, off));
    let (_node_tx, node_rx) = watch::channel(None::<NodeInfo>);
    let task = tokio::spawn(
        labels::KeepLabels {
            cluster,
            inventory: inventory_rx,
            node: node_rx,
            backoff: FAST,
            namespace: None,
            metrics: Default::default(),
        }
        .run(),
    );
    assert!(
        api.wait_for(WAIT, |_, l| l.len() == 1).await,
        "{:?}",
        api.labels()
    );
    assert_eq!(api.labels(), map(&[("team", "vision")]));
    assert_eq!(
        api.patches().last().unwrap().json()["metadata"]["labels"],
        serde_json::json!({})
    );
    drop(inventory_tx);
    task.await.unwrap();
    assert_eq!(api.patches().len(), 5);
}

#[tokio::test]
async fn labels_are_applied_once_while_the_node_is_read_again_and_again() {
    // The follower polls (watch forbidden) and keeps publishing the Node: the labels, already
    // on the Node, are not applied again.
    let api = ApiServerStandin::start("n1", &[]).await.unwrap();
    api.forbid_watch();
    let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
    let facts = fixture("nvidia-multi-gpu.yaml");
    let (_inventory_tx, inventory_rx) = watch::channel(inventory(&facts, Config::default()));
    let (node_tx, node_rx) = watch::channel(None::<NodeInfo>);
    let _follow = tokio::spawn(
        node::FollowNode {
            cluster: cluster.clone(),
            tx: node_tx,
            backoff: FAST,
            poll: Duration::from_millis(5),
        }
        .run(),
    );
    let _keep = tokio::spawn(
        labels::KeepLabels {
            cluster,
            inventory: inventory_rx,
            node: node_rx,
            backoff: FAST,
            namespace: None,
            metrics: Default::default(),
        }
        .run(),
    );
    assert!(api.wait_for(WAIT, |_, l| no_stamp(l) == four_t4("1")).await);
    let gets = |r: &[standin::Recorded]| {
        r.iter()
            .filter(|r| r.method == "GET" && !r.query.contains_key("watch"))
            .count()
    };
    // A read that was under way while the labels were applied may show the Node without them
    // and cause one more apply; after that, reads showing the labels cause none.
    let seen = gets(&api.requests());
    assert!(api.wait_for(WAIT, |r, _| gets(r) >= seen + 20).await);
    let applies = api.patches().len();
    assert!(applies <= 2, "{applies} applies");
    let seen = gets(&api.requests());
    assert!(api.wait_for(WAIT, |r, _| gets(r) >= seen + 20).await);
    assert_eq!(
        api.patches().len(),
        applies,
        "no applies while the Node shows the labels"
    );
}

#[tokio::test]
async fn the_node_is_followed_and_an_edited_label_is_put_back() {
    let api = ApiServerStandin::start("n1", &[]).await.unwrap();
    let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
    let facts = fixture("nvidia-multi-gpu.yaml");
    let (_inventory_tx, inventory_rx) = watch::channel(inventory(&facts, Config::default()));
    let (node_tx, mut node_rx) = watch::channel(None::<NodeInfo>);
    let _follow = tokio::spawn(
        node::FollowNode {
            cluster: cluster.clone(),
            tx: node_tx,
            backoff: FAST,
            poll: Duration::from_secs(3600),
        }
        .run(),
    );
    let _keep = tokio::spawn(
        labels::KeepLabels {
            cluster,
            inventory: inventory_rx,
            node: node_rx.clone(),
            backoff: FAST,
            namespace: None,
            metrics: Default::default(),
        }
        .run(),
    );
    assert!(api.wait_for(WAIT, |_, l| no_stamp(l) == four_t4("1")).await);

    // A selection label set by someone else reaches the follower.
    api.set_label(SELECTOR, Some("big"));
    let seen = tokio::time::timeout(
        WAIT,
        node_rx.wait_for(|n| {
            n.as_ref()
                .is_some_and(|n| n.labels.get(SELECTOR).map(String::as_str) == Some("big"))
        }),
    )
    .await
    .expect("within WAIT")
    .unwrap()
    .clone();
    assert_eq!(seen.unwrap().name, "n1");

    // One of dxdp's labels edited by hand is put back.
    let patches = api.patches().len();
    api.set_label("directx.microsoft.com/display.count", Some("99"));
    assert!(
        api.wait_for(WAIT, |r, l| {
            r.iter().filter(|r| r.method == "PATCH").count() > patches
                && l.get("directx.microsoft.com/display.count")
                    .map(String::as_str)
                    == Some("4")
        })
        .await
    );
    // The watch was asked for this node only.
    let watch = api
        .requests()
        .into_iter()
        .find(|r| r.query.get("watch").map(String::as_str) == Some("true"))
        .unwrap();
    assert_eq!(watch.path, "/api/v1/nodes");
    assert_eq!(watch.query["fieldSelector"], "metadata.name=n1");
}

#[tokio::test]
async fn following_survives_api_errors() {
    let api = ApiServerStandin::start("n1", &[(SELECTOR, "a")])
        .await
        .unwrap();
    api.fail_next("GET", &[500, 500]);
    let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
    let (node_tx, mut node_rx) = watch::channel(None::<NodeInfo>);
    let _follow = tokio::spawn(
        node::FollowNode {
            cluster,
            tx: node_tx,
            backoff: FAST,
            poll: Duration::from_secs(3600),
        }
        .run(),
    );
    tokio::time::timeout(
        WAIT,
        node_rx.wait_for(|n| {
            n.as_ref()
                .is_some_and(|n| n.labels.get(SELECTOR).map(String::as_str) == Some("a"))
        }),
    )
    .await
    .expect("within WAIT")
    .unwrap();
    api.set_label(SELECTOR, None);
    tokio::time::timeout(
        WAIT,
        node_rx.wait_for(|n| n.as_ref().is_some_and(|n| !n.labels.contains_key(SELECTOR))),
    )
    .await
    .expect("within WAIT")
    .unwrap();
}

#[tokio::test]
async fn without_a_node_name_the_cluster_features_are_off() {
    for name in [None, Some(""), Some("  ")] {
        assert!(matches!(Cluster::connect(name).await, Err(Off::NoNodeName)));
    }
    assert!(matches!(
        Cluster::at_url("not a url", "n1"),
        Err(Off::Client(_))
    ));
}

#[test]
fn the_sandbox_service_account_of_containerd_1_6_is_found() {
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let all: &[(&str, &str)] = &[
        ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
        ("KUBERNETES_SERVICE_PORT", "443"),
        ("CONTAINER_SANDBOX_MOUNT_POINT", "C:\\C\\abc\\"),
    ];
    let token = "C:\\C\\abc\\var\\run\\secrets\\kubernetes.io\\serviceaccount\\token";
    let doc = sandbox_kubeconfig(env(all), |p| p == token).unwrap();
    assert_eq!(
        doc["clusters"][0]["cluster"]["server"],
        "https://10.0.0.1:443"
    );
    assert_eq!(
        doc["clusters"][0]["cluster"]["certificate-authority"],
        "C:\\C\\abc\\var\\run\\secrets\\kubernetes.io\\serviceaccount\\ca.crt"
    );
    assert_eq!(doc["users"][0]["user"]["tokenFile"], token);
    // kube reads it as a kubeconfig.
    let parsed: kube::config::Kubeconfig = serde_json::from_value(doc).unwrap();
    assert_eq!(parsed.current_context.as_deref(), Some("in-cluster"));
    assert_eq!(
        parsed.auth_infos[0]
            .auth_info
            .as_ref()
            .unwrap()
            .token_file
            .as_deref(),
        Some(token)
    );
    // IPv6 service address.
    let v6: &[(&str, &str)] = &[
        ("KUBERNETES_SERVICE_HOST", "fd00::1"),
        ("KUBERNETES_SERVICE_PORT", "443"),
        ("CONTAINER_SANDBOX_MOUNT_POINT", "C:\\C\\abc"),
    ];
    let doc = sandbox_kubeconfig(env(v6), |_| true).unwrap();
    assert_eq!(
        doc["clusters"][0]["cluster"]["server"],
        "https://[fd00::1]:443"
    );
    // Not in a sandbox, no service, or no token: none.
    assert!(sandbox_kubeconfig(env(&all[..2]), |_| true).is_none());
    assert!(sandbox_kubeconfig(env(&all[1..]), |_| true).is_none());
    assert!(sandbox_kubeconfig(env(all), |_| false).is_none());
}

#[tokio::test]
async fn a_node_that_cannot_be_watched_is_read_every_poll() {
    let api = ApiServerStandin::start("n1", &[(SELECTOR, "a")])
        .await
        .unwrap();
    api.forbid_watch();
    let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
    let (node_tx, mut node_rx) = watch::channel(None::<NodeInfo>);
    let _follow = tokio::spawn(
        node::FollowNode {
            cluster,
            tx: node_tx,
            backoff: FAST,
            poll: Duration::from_millis(10),
        }
        .run(),
    );
    let has = |v: &'static str| {
        move |n: &Option<NodeInfo>| {
            n.as_ref()
                .is_some_and(|n| n.labels.get(SELECTOR).map(String::as_str) == Some(v))
        }
    };
    tokio::time::timeout(WAIT, node_rx.wait_for(has("a")))
        .await
        .expect("within WAIT")
        .unwrap();
    api.set_label(SELECTOR, Some("b"));
    tokio::time::timeout(WAIT, node_rx.wait_for(has("b")))
        .await
        .expect("within WAIT")
        .unwrap();
    let watches = api
        .requests()
        .iter()
        .filter(|r| r.query.contains_key("watch"))
        .count();
    assert_eq!(watches, 1, "a forbidden watch is not retried");
}

/// An API server that accepts connections and never answers (a half-open connection).
async fn silent_server() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    (url, task)
}

#[tokio::test]
async fn api_calls_that_get_no_answer_fail_after_the_call_timeout() {
    let (url, server) = silent_server().await;
    let cluster = Cluster::at_url(&url, "n1")
        .unwrap()
        .with_timeout(Duration::from_millis(200));
    let get = tokio::time::timeout(WAIT, cluster.get())
        .await
        .expect("the call gives up by itself");
    assert_eq!(
        get.unwrap_err().to_string(),
        "get node n1: the API server did not answer within 0.2 s"
    );
    let apply = tokio::time::timeout(WAIT, cluster.apply_labels(&BTreeMap::new()))
        .await
        .expect("the call gives up by itself");
    assert_eq!(
        apply.unwrap_err().to_string(),
        "apply labels to node n1: the API server did not answer within 0.2 s"
    );
    server.abort();
}

/// The NodeFeature CRD fixture (the published API's schema, written for the tests).
fn node_feature_crd() -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/crds/nfd-nodefeature.yaml"),
    )
    .unwrap()
}

fn keep(
    cluster: Cluster,
    inventory: watch::Receiver<Arc<Inventory>>,
    node: watch::Receiver<Option<NodeInfo>>,
    namespace: Option<&str>,
) -> tokio::task::JoinHandle<()> {
    keep_counted(cluster, inventory, node, namespace).0
}

/// Whether `condition` (on a counter the task updates once the API server has answered) holds
/// within `WAIT`, checked every 10 ms.
async fn until(mut condition: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !condition() {
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// `keep`, with the counter of its writes (registered: `metrics_text` shows it as /metrics
/// does).
fn keep_counted(
    cluster: Cluster,
    inventory: watch::Receiver<Arc<Inventory>>,
    node: watch::Receiver<Option<NodeInfo>>,
    namespace: Option<&str>,
) -> (
    tokio::task::JoinHandle<()>,
    LabelMetrics,
    prometheus_client::registry::Registry,
) {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = LabelMetrics::register(&mut registry);
    let task = tokio::spawn(
        labels::KeepLabels {
            cluster,
            inventory,
            node,
            backoff: FAST,
            namespace: namespace.map(str::to_string),
            metrics: metrics.clone(),
        }
        .run(),
    );
    (task, metrics, registry)
}

/// The OpenMetrics text of `registry`.
fn metrics_text(registry: &prometheus_client::registry::Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

#[tokio::test]
async fn a_restart_with_the_same_labels_keeps_the_timestamp_and_a_change_renews_it() {
    // The Node shows the labels of an earlier run, stamped 1000.
    let mut earlier: Vec<(String, String)> = four_t4("1").into_iter().collect();
    earlier.push(("directx.microsoft.com/timestamp".into(), "1000".into()));
    let pairs: Vec<(&str, &str)> = earlier
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let api = ApiServerStandin::start("n1", &pairs).await.unwrap();
    let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
    let shown = cluster.get().await.unwrap();
    let facts = fixture("nvidia-multi-gpu.yaml");
    let (inventory_tx, inventory_rx) = watch::channel(inventory(&facts, Config::default()));
    let (_node_tx, node_rx) = watch::channel(Some(shown));
    let _task = keep(cluster, inventory_rx, node_rx, None);
    applies_reach(&api, 1).await;
    let sent = api.patches()[0].json();
    assert_eq!(
        sent["metadata"]["labels"]["directx.microsoft.com/timestamp"],
        "1000"
    );
    // A changed set gets the time of the change.
    inventory_tx.send_replace(inventory(&facts, Config::default().with_replicas(2)));
    applies_reach(&api, 2).await;
    let renewed = api.labels()["directx.microsoft.com/timestamp"].clone();
    assert!(
        renewed.parse::<u64>().is_ok_and(|t| t > 1_700_000_000),
        "{renewed}"
    );
}

#[tokio::test]
async fn several_models_and_the_machine_type_are_labelled() {
    // tests/fixtures/adapter-match.yaml: two A10 (10de:2236, a third has no device node) for
    // display, an A100 (10de:20b5) for compute; the Node's instance type names the machine.
    let api = ApiServerStandin::start(
        "n1",
        &[(
            "node.kubernetes.io/instance-type",
            "Standard_NC24ads_A100_v4",
        )],
    )
    .await
    .unwrap();
    let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
    let shown = cluster.get().await.unwrap();
    let facts = fixture("adapter-match.yaml");
    let (_inventory_tx, inventory_rx) = watch::channel(inventory(&facts, Config::default()));
    let (_node_tx, node_rx) = watch::channel(Some(shown));
    let _task = keep(cluster, inventory_rx, node_rx, None);
    applies_reach(&api, 1).await;
    let l = api.labels();
    let get = |k: &str| {
        l.get(&format!("directx.microsoft.com/{k}"))
            .map(String::as_str)
    };
    assert_eq!(get("machine"), Some("Standard_NC24ads_A100_v4"));
    assert_eq!(get("compute.10de-20b5.family"), Some("ampere"));
    assert_eq!(get("compute.10de-20b5.count"), Some("1"));
    assert_eq!(get("compute.10de-20b5.memory"), Some("81920"));
    assert_eq!(get("display.10de-2236.family"), Some("ampere"));
    assert_eq!(get("display.10de-2236.count"), Some("2"));
    assert_eq!(
        get("display.10de-2236.product"),
        Some("NVIDIA-A10-LUID-property")
    );
    assert_eq!(get("display.sharing-strategy"), Some("none"));
    assert_eq!(get("compute.sharing-strategy"), Some("none"));
}

#[tokio::test]
async fn nodefeature_mode_writes_one_object_that_fits_the_crd() {
    let api = ApiServerStandin::start("n1", &[("team", "vision")])
        .await
        .unwrap();
    api.install_crd(&node_feature_crd());
    let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
    let facts = fixture("nvidia-multi-gpu.yaml");
    let mut config = Config::default();
    config.node_labels.mode = crate::config::file::LabelMode::Nodefeature;
    let (_inventory_tx, inventory_rx) = watch::channel(inventory(&facts, config));
    let (_node_tx, node_rx) = watch::channel(None::<NodeInfo>);
    let _task = keep(cluster, inventory_rx, node_rx, Some("gpu-system"));
    assert!(
        api.wait_for_node_feature(WAIT, "gpu-system", "dxdp-n1")
            .await
    );
    let object = api.node_feature("gpu-system", "dxdp-n1").unwrap();
    assert_eq!(object["apiVersion"], "nfd.k8s-sigs.io/v1alpha1");
    assert_eq!(object["kind"], "NodeFeature");
    assert_eq!(
        object["metadata"]["labels"],
        serde_json::json!({"nfd.node.kubernetes.io/node-name": "n1"})
    );
    let labels: BTreeMap<String, String> =
        serde_json::from_value(object["spec"]["labels"].clone()).unwrap();
    assert_eq!(no_stamp(&labels), four_t4("1"));
    assert!(stamp(&labels).is_some());
    // The Node is not labelled by dxdp: an empty apply (removing what node mode left), then
    // the object, with dxdp's field manager.
    let patches = api.patches();
    assert_eq!(patches.len(), 2, "{patches:?}");
    assert_eq!(patches[0].path, "/api/v1/nodes/n1");
    assert_eq!(
        patches[0].json()["metadata"]["labels"],
        serde_json::json!({})
    );
    assert_eq!(
        patches[1].path,
        "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/gpu-system/nodefeatures/dxdp-n1"
    );
    assert_eq!(
        patches[1].query,
        map(&[("fieldManager", "dxdp"), ("force", "true")])
    );
    assert_eq!(api.labels(), map(&[("team", "vision")]));
}

#[tokio::test]
async fn without_the_crd_nodefeature_mode_retries_until_it_is_installed() {
    let api = ApiServerStandin::start("n1", &[]).await.unwrap();
    let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
    // The error says what is missing and what to do.
    let err = cluster
        .apply_node_feature("gpu-system", &BTreeMap::new())
        .await
        .unwrap_err();
    assert_eq!(err.status, Some(404));
    let err = err.message;
    assert!(
        err.contains("Node Feature Discovery's CRDs are not installed")
            && err.contains("nodeLabels.mode: node"),
        "{err}"
    );
    let facts = fixture("nvidia-multi-gpu.yaml");
    let mut config = Config::default();
    config.node_labels.mode = crate::config::file::LabelMode::Nodefeature;
    let (_inventory_tx, inventory_rx) = watch::channel(inventory(&facts, config));
    let (_node_tx, node_rx) = watch::channel(None::<NodeInfo>);
    let (_task, metrics, registry) =
        keep_counted(cluster, inventory_rx, node_rx, Some("gpu-system"));
    let tries = |r: &[standin::Recorded]| {
        r.iter()
            .filter(|r| r.method == "PATCH" && r.path.contains("/nodefeatures/"))
            .count()
    };
    // Retried (with backoff) while the CRD is missing ...
    assert!(api.wait_for(WAIT, |r, _| tries(r) >= 4).await);
    assert!(api.node_feature("gpu-system", "dxdp-n1").is_none());
    // ... each try counted as crd_missing (the Node's emptying apply, once, as ok) ...
    assert!(until(|| metrics.get(WriteTarget::NodeFeature, WriteResult::CrdMissing) >= 4).await);
    assert_eq!(metrics.get(WriteTarget::NodeFeature, WriteResult::Ok), 0);
    assert_eq!(metrics.get(WriteTarget::Node, WriteResult::Ok), 1);
    // ... and written once it is there.
    api.install_crd(&node_feature_crd());
    assert!(
        api.wait_for_node_feature(WAIT, "gpu-system", "dxdp-n1")
            .await
    );
    assert!(until(|| metrics.get(WriteTarget::NodeFeature, WriteResult::Ok) == 1).await);
    // As /metrics shows it: the one write of each target, no other result; the failed tries
    // as crd_missing (as many as were made before the CRD came: at least 4).
    let text = metrics_text(&registry);
    let missing = metrics.get(WriteTarget::NodeFeature, WriteResult::CrdMissing);
    assert!(missing >= 4, "{missing}");
    let missing_line = format!(
        "dxdp_node_labels_writes_total{{target=\"nodefeature\",result=\"crd_missing\"}} {missing}"
    );
    for line in [
        "dxdp_node_labels_writes_total{target=\"nodefeature\",result=\"ok\"} 1",
        "dxdp_node_labels_writes_total{target=\"nodefeature\",result=\"error\"} 0",
        "dxdp_node_labels_writes_total{target=\"nodefeature\",result=\"forbidden\"} 0",
        "dxdp_node_labels_writes_total{target=\"node\",result=\"ok\"} 1",
        "dxdp_node_labels_writes_total{target=\"node\",result=\"error\"} 0",
        "dxdp_node_labels_writes_total{target=\"node\",result=\"crd_missing\"} 0",
        "dxdp_node_labels_writes_total{target=\"node\",result=\"forbidden\"} 0",
        missing_line.as_str(),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in {text}");
    }
}

#[tokio::test]
async fn back_to_node_mode_deletes_the_nodefeature_object() {
    let api = ApiServerStandin::start("n1", &[]).await.unwrap();
    api.install_crd(&node_feature_crd());
    let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
    let facts = fixture("nvidia-multi-gpu.yaml");
    let mut config = Config::default();
    config.node_labels.mode = crate::config::file::LabelMode::Nodefeature;
    let (inventory_tx, inventory_rx) = watch::channel(inventory(&facts, config.clone()));
    let (_node_tx, node_rx) = watch::channel(None::<NodeInfo>);
    let (_task, metrics, _registry) =
        keep_counted(cluster, inventory_rx, node_rx, Some("gpu-system"));
    assert!(
        api.wait_for_node_feature(WAIT, "gpu-system", "dxdp-n1")
            .await
    );
    config.node_labels.mode = crate::config::file::LabelMode::Node;
    inventory_tx.send_replace(inventory(&facts, config));
    // The object is deleted, then the labels go onto the Node.
    let deleted = |r: &[standin::Recorded]| {
        r.iter().any(|r| {
            r.method == "DELETE"
                && r.path
                    == "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/gpu-system/nodefeatures/dxdp-n1"
        })
    };
    assert!(api.wait_for(WAIT, |r, _| deleted(r)).await);
    applies_reach(&api, 3).await;
    assert!(api.node_feature("gpu-system", "dxdp-n1").is_none());
    assert_eq!(no_stamp(&api.labels()), four_t4("1"));
    // Node: the emptying apply and the labels; NodeFeature: the apply and the delete.
    assert!(until(|| metrics.get(WriteTarget::Node, WriteResult::Ok) == 2).await);
    assert_eq!(metrics.get(WriteTarget::NodeFeature, WriteResult::Ok), 2);
}

#[test]
fn the_standin_refuses_objects_that_do_not_fit_the_crd() {
    let crd: serde_json::Value = serde_saphyr::from_str(&node_feature_crd()).unwrap();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let object = |spec: serde_json::Value| {
        serde_json::json!({
            "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
            "kind": "NodeFeature",
            "metadata": {"name": "dxdp-n1", "labels": {"a": "b"}},
            "spec": spec,
        })
    };
    let ok = object(serde_json::json!({"labels": {"directx.microsoft.com/x": "1"}}));
    assert_eq!(standin::validate(schema, &ok, ""), Ok(()));
    let features = object(serde_json::json!({
        "features": {"attributes": {"a": {"elements": {"k": "v"}}}},
        "labels": {},
    }));
    assert_eq!(standin::validate(schema, &features, ""), Ok(()));
    for (spec, want) in [
        (
            serde_json::json!({"labels": {"x": 1}}),
            ".spec.labels.x: must be of type string",
        ),
        (
            serde_json::json!({"label": {}}),
            ".spec.label: field not declared in schema",
        ),
        (
            serde_json::json!({"features": {"flags": {"f": {}}}}),
            ".spec.features.flags.f.elements: Required value",
        ),
    ] {
        assert_eq!(
            standin::validate(schema, &object(spec), ""),
            Err(want.to_string())
        );
    }
    let mut no_spec = ok.clone();
    no_spec.as_object_mut().unwrap().remove("spec");
    assert_eq!(
        standin::validate(schema, &no_spec, ""),
        Err(".spec: Required value".to_string())
    );
}

#[test]
fn memory_sharing_is_the_sharing_strategy_and_the_product_says_shared() {
    let facts = fixture("nvidia-multi-gpu.yaml");
    let mut config = Config::default();
    if let Some(s) = config
        .resources
        .get_mut(&dxdp_core::devices::Resource::Display)
    {
        s.memory_sharing.enabled = true;
    }
    let want: BTreeMap<String, String> = four_t4("1")
        .into_iter()
        .map(|(k, v)| match k.as_str() {
            "directx.microsoft.com/display.product" => (k, "NVIDIA-Tesla-T4-SHARED".into()),
            "directx.microsoft.com/display.sharing-strategy"
            | "directx.microsoft.com/sharing-strategy" => (k, "memory".into()),
            _ => (k, v),
        })
        .filter(|(k, _)| k != "directx.microsoft.com/display.replicas")
        .collect();
    assert_eq!(labels::desired(&inventory(&facts, config), None), want);
}

#[tokio::test]
async fn labels_off_in_nodefeature_mode_empty_the_object() {
    let api = ApiServerStandin::start("n1", &[]).await.unwrap();
    api.install_crd(&node_feature_crd());
    let cluster = Cluster::at_url(&api.url(), "n1").unwrap();
    let facts = fixture("nvidia-multi-gpu.yaml");
    let mut config = Config::default();
    config.node_labels.mode = crate::config::file::LabelMode::Nodefeature;
    let (inventory_tx, inventory_rx) = watch::channel(inventory(&facts, config.clone()));
    let (_node_tx, node_rx) = watch::channel(None::<NodeInfo>);
    let _task = keep(cluster, inventory_rx, node_rx, Some("gpu-system"));
    assert!(
        api.wait_for_node_feature(WAIT, "gpu-system", "dxdp-n1")
            .await
    );
    config.node_labels.enabled = false;
    inventory_tx.send_replace(inventory(&facts, config));
    applies_reach(&api, 3).await;
    let object = api.node_feature("gpu-system", "dxdp-n1").unwrap();
    assert_eq!(object["spec"]["labels"], serde_json::json!({}));
}
