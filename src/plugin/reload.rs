//! Configuration hot reload: re-reads the configuration as soon as one of its files changes
//! (including a ConfigMap update, which swaps a `..data` symlink, and a default file that
//! appears after start), validates it, and publishes it to the running plugin. A file that does
//! not parse, or a configuration that cannot be served, is rejected whole and the running
//! configuration stays; only what is published is logged as applied.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;

use super::inventory::InventoryRx;
use super::validate;
use super::watch::{Notice, Subscription};
use crate::config::{Config, Inputs, NodeInfo};
use crate::observe::metrics::{Metrics, ReloadResult};
use dxdp_core::facts::OsFacts;

/// What one reload attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Published to the plugin.
    Applied,
    /// Read and valid, but the same as the running configuration.
    Unchanged,
    /// Not published: the reason.
    Rejected(String),
}

/// Re-reads the configuration (a blocking read: call it off the async workers); publishes it on
/// `tx` only when it differs and passes [`validate`] for `kubelet_dir` on a host with `os`.
pub fn reload_once(
    inputs: &Inputs,
    tx: &watch::Sender<Arc<Config>>,
    kubelet_dir: &Path,
    os: &OsFacts,
) -> Outcome {
    let new = match inputs.resolve() {
        Ok(c) => c,
        Err(e) => return Outcome::Rejected(e.to_string()),
    };
    if *tx.borrow().as_ref() == new {
        return Outcome::Unchanged;
    }
    if let Err(e) = validate(&new, kubelet_dir, os) {
        return Outcome::Rejected(e.to_string());
    }
    tx.send_replace(Arc::new(new));
    Outcome::Applied
}

/// Reloads on file events (from `files`, the subscription to the directories of
/// `inputs.watched_files()`), on every check it asks for (safety tick, lost events, a directory
/// watched again), on every reload request (SIGHUP, [`crate::shutdown::reload_requests`]) and on
/// every change of the node's labels (`node`: they select the named
/// configuration), until `tx` has no receivers. Counts reloads in `metrics`
/// (`dxdp_config_reloads_total`): every reload a file event triggers, and a check's reload when
/// it applies a change or brings a new rejection (the routine re-reads that find nothing are not
/// counted). New configurations are validated against the host of `inventory`.
pub async fn watch_counted(
    mut inputs: Inputs,
    tx: watch::Sender<Arc<Config>>,
    kubelet_dir: PathBuf,
    mut files_watch: Subscription,
    mut node: Option<watch::Receiver<Option<NodeInfo>>>,
    metrics: Metrics,
    inventory: InventoryRx,
) {
    let files = inputs.watched_files();
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let mut last_rejection: Option<String> = None;
    // SIGHUP (`crate::shutdown`): re-read now, counted like a file event.
    let mut hangups = Some(crate::shutdown::reload_requests());
    loop {
        let from_event = tokio::select! {
            notice = files_watch.next() => match notice {
                Notice::Events(events) => {
                    let relevant = events.iter().any(|e| {
                        files.iter().any(|f| {
                            super::watch::parent_dir(f) == e.dir
                                && (f.file_name() == Some(e.name.as_os_str())
                                    || e.name.to_string_lossy().starts_with(".."))
                        })
                    });
                    if !relevant {
                        continue;
                    }
                    true
                }
                Notice::Check(_) => false,
            },
            _ = tx.closed() => return,
            changed = async { match hangups.as_mut() {
                Some(rx) => rx.changed().await,
                None => std::future::pending().await,
            } } => {
                if changed.is_err() {
                    hangups = None;
                    continue;
                }
                true
            }
            changed = async { match node.as_mut() {
                Some(rx) => rx.changed().await,
                None => std::future::pending().await,
            } } => {
                match (changed, node.as_mut()) {
                    (Ok(()), Some(rx)) => {
                        let info = rx.borrow_and_update().clone();
                        if info.is_none() {
                            continue;
                        }
                        // Only the selection label matters (dxdp's own label updates and
                        // anyone else's labels do not reload).
                        let key = tx.borrow().node_labels.selector_key();
                        let value = |n: &Option<NodeInfo>| {
                            n.as_ref().and_then(|n| n.labels.get(&key).cloned())
                        };
                        let unchanged = inputs.node.is_some() && value(&inputs.node) == value(&info);
                        inputs.node = info;
                        if unchanged {
                            continue;
                        }
                    }
                    // The node is no longer followed: keep the last selection.
                    _ => {
                        node = None;
                        continue;
                    }
                }
                true
            }
        };
        let before = {
            let c = tx.borrow();
            (c.metrics_address, c.probe_address)
        };
        // Reading a file waits for a writer to finish: never on an async worker.
        let outcome = {
            let (inputs, tx, dir) = (inputs.clone(), tx.clone(), kubelet_dir.clone());
            let os = inventory.borrow().os.clone();
            tokio::task::spawn_blocking(move || reload_once(&inputs, &tx, &dir, &os))
                .await
                .unwrap_or_else(|e| Outcome::Rejected(format!("the reload failed: {e}")))
        };
        match outcome {
            Outcome::Applied => {
                last_rejection = None;
                metrics.config_reload(ReloadResult::Applied);
                let selection = tx.borrow().selection.clone();
                tracing::info!(files = ?names, configuration = selection.name.as_deref().unwrap_or("default"), reason = %selection.reason, "configuration reloaded and applied");
                if let Some(w) = &selection.warning {
                    tracing::warn!("{w}");
                }
                let after = {
                    let c = tx.borrow();
                    (c.metrics_address, c.probe_address)
                };
                for (key, before, after) in [
                    ("metrics.address", before.0, after.0),
                    ("metrics.probeAddress", before.1, after.1),
                ] {
                    if after != before {
                        tracing::warn!(
                            "{key} changed from {} to {}: it takes effect when the plugin restarts",
                            address_text(before),
                            address_text(after)
                        );
                    }
                }
            }
            Outcome::Unchanged => {
                if from_event {
                    metrics.config_reload(ReloadResult::Unchanged);
                }
                if last_rejection.take().is_some() || from_event {
                    tracing::info!(files = ?names, "configuration re-read: no effective change");
                }
            }
            Outcome::Rejected(why) => {
                if from_event || last_rejection.as_deref() != Some(why.as_str()) {
                    metrics.config_reload(ReloadResult::Rejected);
                }
                if last_rejection.as_deref() != Some(why.as_str()) {
                    tracing::error!(
                        "configuration rejected; keeping the running configuration: {why}"
                    );
                    last_rejection = Some(why);
                }
            }
        }
    }
}

fn address_text(a: Option<std::net::SocketAddr>) -> String {
    a.map(|a| a.to_string()).unwrap_or_else(|| "off".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(text: &str) -> (tempfile::TempDir, Inputs, watch::Sender<Arc<Config>>) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, text).unwrap();
        let inputs = Inputs {
            file: Some((file, true)),
            ..Inputs::default()
        };
        let first = inputs.resolve().unwrap();
        let (tx, _) = watch::channel(Arc::new(first));
        (dir, inputs, tx)
    }

    #[test]
    fn a_valid_change_is_applied_and_an_identical_one_is_not() {
        let (dir, inputs, tx) = setup("resources: {display: {replicas: 2}}\n");
        let _rx = tx.subscribe();
        assert_eq!(
            reload_once(&inputs, &tx, dir.path(), &OsFacts::default()),
            Outcome::Unchanged
        );
        std::fs::write(
            dir.path().join("config.yaml"),
            "resources: {display: {replicas: 3}}\n",
        )
        .unwrap();
        assert_eq!(
            reload_once(&inputs, &tx, dir.path(), &OsFacts::default()),
            Outcome::Applied
        );
        assert_eq!(
            tx.borrow().replicas(dxdp_core::devices::Resource::Display),
            3
        );
    }

    #[test]
    fn unservable_or_invalid_configurations_are_rejected_whole() {
        let (dir, inputs, tx) = setup("resources: {display: {replicas: 2}}\n");
        let before = tx.borrow().clone();
        let long = format!("a{}.example/x", "b".repeat(90));
        let cases = [
            // An alias whose socket path would not fit in sun_path.
            format!("resources: {{display: {{replicas: 5, aliases: [{long}]}}}}\n"),
            // Nothing left to serve.
            "resources: {display: {enabled: false}, compute: {enabled: false}}\n".to_string(),
            // One name twice.
            "resources: {compute: {name: directx.microsoft.com/display}}\n".to_string(),
            // Not even valid YAML for dxdp.
            "resources: {display: {replicas: zero}}\n".to_string(),
        ];
        for text in cases {
            std::fs::write(dir.path().join("config.yaml"), &text).unwrap();
            let outcome = reload_once(&inputs, &tx, dir.path(), &OsFacts::default());
            assert!(
                matches!(outcome, Outcome::Rejected(_)),
                "{text}: {outcome:?}"
            );
            assert_eq!(
                *tx.borrow(),
                before,
                "{text}: the running configuration stays"
            );
        }
    }

    #[test]
    fn location_path_on_a_host_without_hcs_2_2_is_rejected_on_reload_as_at_start() {
        let (dir, inputs, tx) = setup("resources: {display: {replicas: 2}}\n");
        std::fs::write(
            dir.path().join("config.yaml"),
            "assignment: location-path\n",
        )
        .unwrap();
        let old = OsFacts {
            hcs_schema_versions: vec!["2.1".into()],
            ..OsFacts::default()
        };
        let outcome = reload_once(&inputs, &tx, dir.path(), &old);
        assert_eq!(
            outcome,
            Outcome::Rejected("assignment location-path needs HCS schema 2.2 or later (Windows Server 2022+), and this host has 2.1: every container start would fail. Use assignment auto (class-guid here, every container then gets every GPU) or class-guid".into())
        );
        let new = OsFacts {
            hcs_schema_versions: vec!["2.1".into(), "2.2".into()],
            ..OsFacts::default()
        };
        assert_eq!(
            reload_once(&inputs, &tx, dir.path(), &new),
            Outcome::Applied
        );
    }

    /// Starts the reload with a subscription made before it runs (so nothing written after this
    /// returns is missed) and an hour-long safety tick (so only events drive it).
    fn spawn_watch(
        inputs: Inputs,
        tx: watch::Sender<Arc<Config>>,
        kubelet_dir: &Path,
    ) -> tokio::task::JoinHandle<()> {
        let fw = super::super::watch::FileWatch::new();
        let sub = fw.subscribe(
            &super::super::watch::parent_dirs(&inputs.watched_files()),
            std::time::Duration::from_secs(3600),
        );
        let facts = dxdp_core::facts::HostFacts::default();
        let (inventory, _) = super::super::inventory::build(&facts, tx.borrow().clone());
        let (keep, rx) = watch::channel(Arc::new(inventory));
        let task = watch_counted(
            inputs,
            tx,
            kubelet_dir.to_path_buf(),
            sub,
            None,
            Metrics::new(),
            rx,
        );
        tokio::spawn(async move {
            let _keep = (keep, fw);
            task.await
        })
    }

    async fn wait_for_replicas(rx: &mut watch::Receiver<Arc<Config>>, n: u32) {
        let r = dxdp_core::devices::Resource::Display;
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            rx.wait_for(|c| c.replicas(r) == n),
        )
        .await
        .unwrap_or_else(|_| panic!("no configuration with {n} replicas was published"))
        .unwrap();
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_configmap_symlink_swap_is_applied_without_waiting_for_the_safety_poll() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let v1 = dir.path().join("..2026_11_22_v1");
        let v2 = dir.path().join("..2026_11_22_v2");
        std::fs::create_dir(&v1).unwrap();
        std::fs::create_dir(&v2).unwrap();
        std::fs::write(
            v1.join("config.yaml"),
            "resources: {display: {replicas: 2}}\n",
        )
        .unwrap();
        std::fs::write(
            v2.join("config.yaml"),
            "resources: {display: {replicas: 7}}\n",
        )
        .unwrap();
        symlink(&v1, dir.path().join("..data")).unwrap();
        symlink(
            dir.path().join("..data/config.yaml"),
            dir.path().join("config.yaml"),
        )
        .unwrap();
        let inputs = Inputs {
            file: Some((dir.path().join("config.yaml"), true)),
            ..Inputs::default()
        };
        let (tx, mut rx) = watch::channel(Arc::new(inputs.resolve().unwrap()));
        let task = spawn_watch(inputs, tx, dir.path());
        // The kubelet's atomic update: a new ..data symlink renamed over the old one.
        symlink(&v2, dir.path().join("..data_tmp")).unwrap();
        std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).unwrap();
        wait_for_replicas(&mut rx, 7).await;
        task.abort();
    }

    #[tokio::test]
    async fn a_default_file_that_appears_after_start_is_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        let inputs = Inputs {
            file: Some((file.clone(), false)),
            ..Inputs::default()
        };
        let (tx, mut rx) = watch::channel(Arc::new(inputs.resolve().unwrap()));
        let task = spawn_watch(inputs, tx, dir.path());
        let tmp = dir.path().join("config.yaml.tmp");
        std::fs::write(&tmp, "resources: {display: {replicas: 4}}\n").unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        wait_for_replicas(&mut rx, 4).await;
        task.abort();
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_config_directory_removed_and_recreated_is_watched_again_without_the_safety_poll() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("config");
        std::fs::create_dir(&dir).unwrap();
        let file = dir.join("config.yaml");
        std::fs::write(&file, "resources: {display: {replicas: 2}}\n").unwrap();
        let inputs = Inputs {
            file: Some((file.clone(), false)),
            ..Inputs::default()
        };
        let (tx, mut rx) = watch::channel(Arc::new(inputs.resolve().unwrap()));
        let task = spawn_watch(inputs, tx, top.path());
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::create_dir(&dir).unwrap();
        let tmp = dir.join("config.yaml.tmp");
        std::fs::write(&tmp, "resources: {display: {replicas: 6}}\n").unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        wait_for_replicas(&mut rx, 6).await;
        task.abort();
    }
}
