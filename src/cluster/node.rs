//! Follows this node's Node object: its name and labels now and after every change, from one
//! `get` and then a watch on that single Node (re-established with backoff when it ends or
//! fails). The configuration reloader selects the named configuration from these labels.

use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, WatchEvent, WatchParams};
use tokio::sync::watch;

use super::{node_info, Cluster};
use crate::config::NodeInfo;
use crate::plugin::register::{chain, random, Backoff};

/// How long one watch may run before the server ends it (it is then re-established).
const WATCH_SECONDS: u32 = 290;

/// Publishes the node's labels on `tx` until `tx` has no receivers. Only changes are sent.
pub async fn follow(cluster: Cluster, tx: watch::Sender<Option<NodeInfo>>, backoff: Backoff) {
    let api: &Api<Node> = &cluster.api;
    let params = WatchParams::default()
        .fields(&format!("metadata.name={}", cluster.node))
        .timeout(WATCH_SECONDS);
    let mut failures = 0u32;
    let mut last_error: Option<String> = None;
    loop {
        let outcome = tokio::select! {
            outcome = follow_once(&cluster, api, &params, &tx) => outcome,
            _ = tx.closed() => return,
        };
        match outcome {
            // The watch ended normally (server timeout): start again at once.
            Ok(()) => failures = 0,
            Err(why) => {
                failures = failures.saturating_add(1);
                if last_error.as_deref() != Some(why.as_str()) {
                    tracing::warn!(node = %cluster.node, "cannot follow the node's labels, retrying: {why}");
                    last_error = Some(why);
                }
                let delay = backoff.delay(failures, random());
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = tx.closed() => return,
                }
            }
        }
    }
}

/// One `get` and one watch from its resource version.
async fn follow_once(
    cluster: &Cluster,
    api: &Api<Node>,
    params: &WatchParams,
    tx: &watch::Sender<Option<NodeInfo>>,
) -> Result<(), String> {
    let node = api.get(&cluster.node).await.map_err(|e| chain(&e))?;
    publish(tx, node_info(&node, &cluster.node));
    let version = node.metadata.resource_version.clone().unwrap_or_default();
    let stream = api.watch(params, &version).await.map_err(|e| chain(&e))?;
    futures_util::pin_mut!(stream);
    // A watch that yields nothing for longer than the server's own timeout is dead.
    let idle = Duration::from_secs(u64::from(WATCH_SECONDS) + 30);
    loop {
        let event = match tokio::time::timeout(idle, stream.next()).await {
            Err(_) => return Err("the watch went silent".into()),
            Ok(None) => return Ok(()),
            Ok(Some(event)) => event.map_err(|e| chain(&e))?,
        };
        match event {
            WatchEvent::Added(node) | WatchEvent::Modified(node) => {
                publish(tx, node_info(&node, &cluster.node))
            }
            WatchEvent::Deleted(_) => publish(
                tx,
                NodeInfo {
                    name: cluster.node.clone(),
                    labels: Default::default(),
                },
            ),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(status) => {
                return Err(format!(
                    "the API server ended the watch: {}",
                    status.message
                ))
            }
        }
    }
}

fn publish(tx: &watch::Sender<Option<NodeInfo>>, info: NodeInfo) {
    tx.send_if_modified(|current| {
        if current.as_ref() == Some(&info) {
            false
        } else {
            *current = Some(info);
            true
        }
    });
}
