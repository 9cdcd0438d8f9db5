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
use crate::util::errors::chain;
use crate::util::retry::{random, Backoff};
use crate::util::task::Task;

/// How long one watch may run before the server ends it (it is then re-established).
const WATCH_SECONDS: u32 = 290;

/// Publishes the node's labels on `tx` until `tx` has no receivers. Only changes are sent. When
/// the API server forbids watching nodes, the labels are read every `poll` instead.
#[derive(Clone)]
pub struct FollowNode {
    pub cluster: Cluster,
    pub tx: watch::Sender<Option<NodeInfo>>,
    pub backoff: Backoff,
    pub poll: Duration,
}

impl Task for FollowNode {
    async fn run(self) {
        let FollowNode {
            cluster,
            tx,
            backoff,
            poll,
        } = self;
        let api: &Api<Node> = &cluster.api;
        let params = WatchParams::default()
            .fields(&format!("metadata.name={}", cluster.node))
            .timeout(WATCH_SECONDS);
        let mut failures = 0u32;
        let mut last_error: Option<String> = None;
        // Reads left before the watch is tried again, while watching is forbidden.
        let mut polls_left = 0u32;
        let mut forbidden_warned = false;
        loop {
            let polling = polls_left > 0;
            let outcome = tokio::select! {
                outcome = follow_once(&cluster, api, &params, &tx, polling.then_some(poll)) => outcome,
                _ = tx.closed() => return,
            };
            polls_left = polls_left.saturating_sub(1);
            match outcome {
                // The watch ended normally (server timeout): start again at once.
                Ok(()) => failures = 0,
                Err(Failure::WatchForbidden(why)) => {
                    if !forbidden_warned {
                        tracing::warn!(node = %cluster.node, "cannot watch the node ({why}): grant the watch verb on nodes (the chart does); reading its labels every {poll:?} instead, and trying the watch again every {RETRY_WATCH_AFTER} reads");
                        forbidden_warned = true;
                    }
                    polls_left = RETRY_WATCH_AFTER;
                }
                Err(Failure::Other(why)) => {
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
}

/// While watching is forbidden, the watch is tried again after this many reads (RBAC may have
/// been fixed).
const RETRY_WATCH_AFTER: u32 = 30;

/// A watch that ends sooner than this without any event counts as a failure (backoff), so that
/// a proxy closing watches at once cannot make a tight loop.
const SHORTEST_WATCH: Duration = Duration::from_secs(1);

/// Why following stopped.
enum Failure {
    /// The API server forbids watching nodes (RBAC without `watch`).
    WatchForbidden(String),
    /// Anything else (retried with backoff).
    Other(String),
}

impl From<kube::Error> for Failure {
    fn from(e: kube::Error) -> Self {
        Failure::Other(chain(&e))
    }
}

impl From<String> for Failure {
    fn from(e: String) -> Self {
        Failure::Other(e)
    }
}

/// One `get` and one watch from its resource version; when polling, one `get` and a pause.
async fn follow_once(
    cluster: &Cluster,
    api: &Api<Node>,
    params: &WatchParams,
    tx: &watch::Sender<Option<NodeInfo>>,
    polling: Option<Duration>,
) -> Result<(), Failure> {
    let node = cluster
        .get_node()
        .await
        .map_err(|e| Failure::Other(e.to_string()))?;
    publish(tx, node_info(&node, &cluster.node));
    if let Some(pause) = polling {
        tokio::time::sleep(pause).await;
        return Ok(());
    }
    let version = node.metadata.resource_version.clone().unwrap_or_default();
    let started = tokio::time::timeout(cluster.timeout, api.watch(params, &version))
        .await
        .map_err(|_| {
            Failure::Other(format!(
                "the API server did not start the watch within {} s",
                cluster.timeout.as_secs_f64()
            ))
        })?;
    let stream = match started {
        Ok(stream) => stream,
        Err(kube::Error::Api(status)) if status.code == 403 => {
            return Err(Failure::WatchForbidden(status.message.clone()))
        }
        Err(e) => return Err(e.into()),
    };
    futures_util::pin_mut!(stream);
    let started = tokio::time::Instant::now();
    let mut events = 0u64;
    // A watch that yields nothing for longer than the server's own timeout is dead.
    let idle = Duration::from_secs(u64::from(WATCH_SECONDS) + 30);
    loop {
        let event = match tokio::time::timeout(idle, stream.next()).await {
            Err(_) => return Err(Failure::Other("the watch went silent".into())),
            Ok(None) if events == 0 && started.elapsed() < SHORTEST_WATCH => {
                return Err(Failure::Other("the watch ended at once".into()))
            }
            Ok(None) => return Ok(()),
            Ok(Some(event)) => event?,
        };
        events += 1;
        match event {
            WatchEvent::Added(node) | WatchEvent::Modified(node) => {
                publish(tx, node_info(&node, &cluster.node))
            }
            WatchEvent::Deleted(_) => publish(
                tx,
                NodeInfo {
                    name: cluster.node.clone(),
                    ..NodeInfo::default()
                },
            ),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(status) => {
                return Err(Failure::Other(format!(
                    "the API server ended the watch: {}",
                    status.message
                )))
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
