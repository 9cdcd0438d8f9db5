//! Configuration hot reload: re-reads the configuration as soon as one of its files changes
//! (including a ConfigMap update, which swaps a `..data` symlink, and a default file that
//! appears after start), validates it, and publishes it to the running plugin. A file that does
//! not parse, or a configuration that cannot be served, is rejected whole and the running
//! configuration stays; only what is published is logged as applied.
//!
//! A file written in place is read only once its writer is done, as the host snapshot is (see
//! `inventory`): when it is closed after writing (Linux), renamed into place, or after a short
//! grace from its first write (Windows, which reports no close); until then neither its events
//! nor the safety checks read it. A file truncated and then rewritten (`open(path, "w")`,
//! `echo > file`) is otherwise read empty or half-written, which is often a valid configuration
//! with fewer settings. Every read has a time limit ([`crate::util::bounded`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::file_watch::{FileWatch, Notice, Subscription};
use super::refresher::{Batch, Files, WRITE_GRACE};
use super::servable;
use super::Reload;
use crate::config::{Config, Inputs, NodeInfo, Resolved};
use crate::inventory::InventoryRx;
use crate::observe::metrics::ReloadResult;
use crate::observe::Observe;
use crate::util::bounded::Lane;
use crate::util::task::Task;
use dxdp_core::facts::OsFacts;

/// The name under which a configuration read that does not return is reported to `/healthz`.
pub(crate) const STALL_NAME: &str = "configuration read";

/// What one reload attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Published to the plugin.
    Applied,
    /// Read and valid, but the same as the running configuration.
    Unchanged,
    /// Not published: the reason.
    Rejected(String),
}

/// Re-reads the configuration (a blocking read: call it off the async workers) and judges it
/// against what `tx` serves: `Applied` when its values differ (where they came from is not
/// compared) and pass [`servable::check`] for `kubelet_dir` on a host with `os`. The caller
/// publishes an applied one, after counting and logging it (so that whoever sees the new devices
/// also finds the reload counted and logged). Returns the configuration read, unless rejected.
pub(crate) fn reload_once(
    inputs: &Inputs,
    tx: &watch::Sender<Arc<Config>>,
    kubelet_dir: &Path,
    os: &OsFacts,
) -> (Outcome, Option<Resolved>) {
    let new = match inputs.resolve() {
        Ok(c) => c,
        Err(e) => return (Outcome::Rejected(e.to_string()), None),
    };
    if **tx.borrow() == new.config {
        return (Outcome::Unchanged, Some(new));
    }
    if let Err(e) = servable::check(&new, kubelet_dir, os) {
        return (Outcome::Rejected(e.to_string()), None);
    }
    (Outcome::Applied, Some(new))
}

/// The configuration reload as a task: subscribes to the file watch for `dirs` (re-checked every
/// `safety_poll`) on every start, then [`watch_counted`].
#[derive(Clone, Debug)]
pub(crate) struct ConfigReload {
    /// The inputs, the channel the configurations are published on, the node's labels.
    pub(crate) reload: Reload,
    /// The kubelet's directory (the lock's place).
    pub(crate) kubelet_dir: PathBuf,
    /// The daemon's one file watch.
    pub(crate) watch: FileWatch,
    /// The directories of the configuration's files.
    pub(crate) dirs: Vec<PathBuf>,
    /// The safety re-check interval.
    pub(crate) safety_poll: Duration,
    /// Metrics and health.
    pub(crate) observe: Observe,
    /// The served inventory (new configurations are validated on its host).
    pub(crate) inventory: InventoryRx,
    /// The limit of one read.
    pub(crate) read_limit: Duration,
}

impl Task for ConfigReload {
    async fn run(self) {
        let files = self.watch.subscribe(&self.dirs, self.safety_poll);
        watch_counted(
            self.reload,
            self.kubelet_dir,
            files,
            self.observe,
            self.inventory,
            self.read_limit,
        )
        .await
    }
}

/// Reloads `reload.inputs` on file events (from `files`, the subscription to the directories of
/// `inputs.watched_files()`; a file written in place once its writer is done), on every check
/// it asks for (safety tick, lost events, a directory watched again; not while a file is being
/// written), on every reload request (SIGHUP, [`crate::shutdown::reload_requests`]) and on
/// every change of the node's labels (`reload.node`: they select the named
/// configuration), until `reload.tx` has no receivers. Counts reloads in `observe`'s metrics
/// (`dxdp_config_reloads_total`): every reload a file event triggers, and a check's reload when
/// it applies a change or brings a new rejection (the routine re-reads that find nothing are not
/// counted). New configurations are validated against the host of `inventory`. Each read is
/// given `read_limit`; one that does not return fails `/healthz` (as [`STALL_NAME`]) until it
/// does.
pub(crate) async fn watch_counted(
    reload: Reload,
    kubelet_dir: PathBuf,
    mut files_watch: Subscription,
    observe: Observe,
    inventory: InventoryRx,
    read_limit: Duration,
) {
    let Reload {
        mut inputs,
        tx,
        mut node,
        mut logged,
        kept,
        fallback,
    } = reload;
    let fallback_now = || fallback.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let metrics = observe.metrics.clone();
    let files = inputs.watched_files();
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let watched = Files::new(&files);
    let mut lane = Lane::new(inputs.reading(), read_limit);
    // The rejection at start, while the last-served configuration is served: said then.
    let mut last_rejection: Option<String> = fallback_now();
    // A failure to keep the served configuration on the host, said once.
    let mut keep_error: Option<String> = None;
    // Set while a file is being written in place: when to read it anyway.
    let mut writing_until: Option<tokio::time::Instant> = None;
    // Set while a read that timed out has not returned: read again once it does.
    let mut stalled = false;
    // A restarted task starts over: a read of its previous run that hung is no longer awaited
    // (a new read that hangs says so again).
    observe.health.stalled(STALL_NAME, None);
    // SIGHUP (`crate::shutdown`): re-read now, counted like a file event.
    let mut hangups = Some(crate::shutdown::reload_requests());
    loop {
        let grace = crate::util::sleep_until(writing_until);
        let from_event = tokio::select! {
            notice = files_watch.next() => match notice {
                Notice::Events(events) => match watched.classify(&events) {
                    Batch::Unrelated => continue,
                    Batch::Writing => {
                        // The grace counts from the first write: a writer that keeps writing
                        // without closing is read anyway once it is over.
                        writing_until.get_or_insert(tokio::time::Instant::now() + WRITE_GRACE);
                        continue;
                    }
                    Batch::Complete | Batch::Removed => true,
                },
                // A file being written is read when its writer is done, not before.
                Notice::Recheck(_) if writing_until.is_some() => continue,
                Notice::Recheck(_) => false,
            },
            _ = grace => true,
            _ = lane.unstuck(), if stalled => {
                stalled = false;
                observe.health.stalled(STALL_NAME, None);
                tracing::info!("{} returned; reading the configuration again", lane.what());
                true
            }
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
        writing_until = None;
        let before = tx.borrow().clone();
        // Reading a file waits for a writer to finish: never on an async worker, and never
        // without a time limit.
        let (outcome, read) = {
            let (inputs, tx, dir) = (inputs.clone(), tx.clone(), kubelet_dir.clone());
            let os = inventory.borrow().os.clone();
            let kept = kept.clone();
            let read = lane.run(move || {
                let (outcome, read) = reload_once(&inputs, &tx, &dir, &os);
                // What is served now, read from the files: kept on the host (written only
                // when its text changed).
                let keep = match (&outcome, &read, &kept) {
                    (Outcome::Applied | Outcome::Unchanged, Some(r), Some(k)) => {
                        Some(k.keep(&inputs, r).map_err(|e| (k.path().to_path_buf(), e)))
                    }
                    _ => None,
                };
                (outcome, read, keep)
            });
            match read.await {
                Ok((outcome, read, keep)) => {
                    match keep {
                        Some(Err((path, e))) if keep_error.is_none() => {
                            tracing::warn!("{}", keep_failed(&path, &e));
                            keep_error = Some(e.to_string());
                        }
                        Some(Ok(_)) => keep_error = None,
                        _ => {}
                    }
                    metrics.set_config_rejected(matches!(outcome, Outcome::Rejected(_)));
                    (outcome, read)
                }
                Err(e) => {
                    if lane.is_stuck() && !stalled {
                        stalled = true;
                        observe.health.stalled(STALL_NAME, Some(e.to_string()));
                    }
                    (Outcome::Rejected(e.to_string()), None)
                }
            }
        };
        if !matches!(outcome, Outcome::Rejected(_)) {
            let ended = fallback.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(why) = ended {
                observe.readiness.set_config_fallback(None);
                metrics.set_config_fallback(false);
                tracing::info!(
                    files = ?names,
                    "the configuration is valid again and served; it replaces the last-served configuration kept on the host (rejected at start: {why}); /readyz no longer fails for it"
                );
            }
        }
        match outcome {
            Outcome::Applied => {
                last_rejection = None;
                metrics.config_reload(ReloadResult::Applied);
                let selection = read
                    .as_ref()
                    .map(|r| r.selection.clone())
                    .unwrap_or_default();
                tracing::info!(files = ?names, configuration = selection.name.as_deref().unwrap_or("default"), reason = %selection.reason, "configuration reloaded and applied");
                if let Some(w) = &selection.warning {
                    tracing::warn!("{w}");
                }
                if let Some(r) = &read {
                    tx.send_replace(Arc::new(r.config.clone()));
                }
                let after = tx.borrow().clone();
                for (key, before, after) in [
                    (
                        "metrics.address",
                        before.metrics_address,
                        after.metrics_address,
                    ),
                    (
                        "metrics.probeAddress",
                        before.probe_address,
                        after.probe_address,
                    ),
                ] {
                    if after != before {
                        tracing::warn!(
                            "{key} changed from {} to {}: it takes effect when the plugin restarts",
                            address_text(before),
                            address_text(after)
                        );
                    }
                }
                if (&after.log_level, after.log_format) != (&before.log_level, before.log_format) {
                    tracing::warn!(
                        "logLevel or logFormat changed: it takes effect when the plugin restarts"
                    );
                }
                if (
                    &after.web_config_file,
                    after.metrics_authorization,
                    &after.metrics_token_audiences,
                    after.metrics_allow_plain_http_tokens,
                ) != (
                    &before.web_config_file,
                    before.metrics_authorization,
                    &before.metrics_token_audiences,
                    before.metrics_allow_plain_http_tokens,
                ) {
                    tracing::warn!(
                        "metrics.webConfigFile, metrics.authorization, metrics.tokenAudiences or metrics.allowPlainHttpTokens changed: it takes effect when the plugin restarts (the web configuration file's own content is re-read when it changes)"
                    );
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
                    match (&kept, fallback_now()) {
                        (Some(k), None) => tracing::error!(
                            "configuration rejected; keeping the running configuration: {why}. A restart now would serve the last configuration this node served (kept at {}) and fail /readyz until the configuration is fixed: fix it (`dxdp config check`)",
                            k.path().display()
                        ),
                        (Some(k), Some(_)) => tracing::error!(
                            "configuration still rejected; serving the last configuration this node served (kept at {}), /readyz fails until it is fixed: {why}",
                            k.path().display()
                        ),
                        (None, _) => tracing::error!(
                            "configuration rejected; keeping the running configuration: {why}"
                        ),
                    }
                    last_rejection = Some(why);
                }
            }
        }
        // A file value that a variable hides: the edit changed nothing, say so (whether or not
        // anything else changed).
        if let Some(read) = read {
            for n in read
                .notices
                .iter()
                .filter(|n| n.contains(" overrides file "))
            {
                if !logged.contains(n) {
                    tracing::warn!("{n}");
                }
            }
            logged = read.notices;
        }
    }
}

/// What is logged when the configuration served cannot be kept at `path` on the host.
pub(crate) fn keep_failed(path: &Path, e: &std::io::Error) -> String {
    format!(
        "cannot keep the configuration it serves at {}: {e}; if the configuration is rejected at a later start, there is no last-served configuration to serve instead and dxdp will not start",
        path.display()
    )
}

fn address_text(a: Option<std::net::SocketAddr>) -> String {
    a.map(|a| a.to_string()).unwrap_or_else(|| "off".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`super::reload_once`] and the publish of an applied configuration that the task does.
    fn reload_once(
        inputs: &Inputs,
        tx: &watch::Sender<Arc<Config>>,
        kubelet_dir: &Path,
        os: &OsFacts,
    ) -> (Outcome, Option<Resolved>) {
        let (outcome, read) = super::reload_once(inputs, tx, kubelet_dir, os);
        if let (Outcome::Applied, Some(r)) = (&outcome, &read) {
            tx.send_replace(Arc::new(r.config.clone()));
        }
        (outcome, read)
    }

    fn setup(text: &str) -> (tempfile::TempDir, Inputs, watch::Sender<Arc<Config>>) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, text).unwrap();
        let inputs = Inputs {
            file: Some((file, true)),
            ..Inputs::default()
        };
        let first = inputs.resolve().unwrap().config;
        let (tx, _) = watch::channel(Arc::new(first));
        (dir, inputs, tx)
    }

    #[test]
    fn a_valid_change_is_applied_and_an_identical_one_is_not() {
        let (dir, inputs, tx) = setup("resources: {display: {replicas: 2}}\n");
        let _rx = tx.subscribe();
        assert_eq!(
            reload_once(&inputs, &tx, dir.path(), &OsFacts::default()).0,
            Outcome::Unchanged
        );
        std::fs::write(
            dir.path().join("config.yaml"),
            "resources: {display: {replicas: 3}}\n",
        )
        .unwrap();
        assert_eq!(
            reload_once(&inputs, &tx, dir.path(), &OsFacts::default()).0,
            Outcome::Applied
        );
        assert_eq!(
            tx.borrow().replicas(dxdp_core::devices::Resource::Display),
            3
        );
    }

    #[test]
    fn a_file_edit_a_variable_hides_is_not_published_but_read_with_a_notice_naming_both() {
        let (dir, mut inputs, _) = setup("resources: {display: {replicas: 2}}\n");
        inputs.env = [("DXDP_REPLICAS".to_string(), "4".to_string())].into();
        let (tx, mut rx) = watch::channel(Arc::new(inputs.resolve().unwrap().config));
        rx.borrow_and_update();
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, "resources: {display: {replicas: 3}}\n").unwrap();
        // The values do not change (the variable still wins): nothing is published, but the
        // configuration's story does change: the new notice is what the reload logs.
        let (outcome, read) = reload_once(&inputs, &tx, dir.path(), &OsFacts::default());
        assert_eq!(outcome, Outcome::Unchanged);
        assert!(!rx.has_changed().unwrap(), "nothing is published");
        assert_eq!(
            tx.borrow().replicas(dxdp_core::devices::Resource::Display),
            4
        );
        assert_eq!(
            read.expect("the configuration read").notices,
            [format!(
                "resources.display.replicas: env DXDP_REPLICAS=4 overrides file {} (resources.display.replicas: 3): editing the file changes nothing while DXDP_REPLICAS is set; unset the variable to use the file's value",
                file.display()
            )]
        );
    }

    /// The same values reached another way (from a variable instead of the file, with another
    /// named configuration's name and reason) are not published: nothing re-advertises or
    /// registers again, and the reload counts `unchanged`.
    #[tokio::test]
    async fn the_same_values_from_another_origin_are_not_published() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        let text = "resources: {display: {replicas: 2}, compute: {replicas: 2}}\nconfigurations: {same: {}}\n";
        std::fs::write(&file, text).unwrap();
        let mut inputs = Inputs {
            file: Some((file.clone(), true)),
            ..Inputs::default()
        };
        let (tx, mut rx) = watch::channel(Arc::new(inputs.resolve().unwrap().config));
        rx.borrow_and_update();
        // The file's value now comes from the environment, and a named configuration that
        // changes nothing is selected.
        inputs.env = [
            ("DXDP_REPLICAS".to_string(), "2".to_string()),
            ("DXDP_CONFIGURATION".to_string(), "same".to_string()),
        ]
        .into();
        let (outcome, read) = reload_once(&inputs, &tx, dir.path(), &OsFacts::default());
        let read = read.expect("the configuration read");
        assert_eq!(
            read.origin("resources.display.replicas"),
            "env DXDP_REPLICAS"
        );
        assert_eq!(read.selection.reason, "env DXDP_CONFIGURATION");
        assert_eq!(outcome, Outcome::Unchanged);
        assert!(!rx.has_changed().unwrap(), "nothing is published");
        // Through the running reload: a file event that brings no new value counts `unchanged`.
        let observe = Observe::new();
        let task = spawn_watch_observed(inputs, tx, dir.path(), observe.clone());
        let tmp = dir.path().join("config.yaml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        let unchanged = "dxdp_config_reloads_total{result=\"unchanged\"} 1\n";
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while !observe.metrics.encode().contains(unchanged) {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no unchanged reload counted:\n{}", observe.metrics.encode()));
        let text = observe.metrics.encode();
        assert!(
            text.contains("dxdp_config_reloads_total{result=\"applied\"} 0\n"),
            "{text}"
        );
        assert!(!rx.has_changed().unwrap(), "nothing is published");
        task.abort();
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
            let outcome = reload_once(&inputs, &tx, dir.path(), &OsFacts::default()).0;
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

    /// The default file (read when it exists) that exists but cannot be read is an error, not
    /// a missing file: the running configuration stays instead of the defaults.
    #[test]
    fn a_default_file_that_cannot_be_read_keeps_the_running_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, "resources: {display: {replicas: 2}}\n").unwrap();
        let inputs = Inputs {
            file: Some((file.clone(), false)),
            ..Inputs::default()
        };
        let (tx, _rx) = watch::channel(Arc::new(inputs.resolve().unwrap().config));
        let before = tx.borrow().clone();
        std::fs::remove_file(&file).unwrap();
        std::fs::create_dir(&file).unwrap();
        let outcome = reload_once(&inputs, &tx, dir.path(), &OsFacts::default()).0;
        assert_eq!(
            outcome,
            Outcome::Rejected(format!(
                "cannot read configuration file {}: it is a directory, not a regular file: dxdp reads only regular files (replace it with one)",
                file.display()
            ))
        );
        assert_eq!(*tx.borrow(), before);
        // Gone: the defaults apply, as when it never existed.
        std::fs::remove_dir(&file).unwrap();
        assert_eq!(
            reload_once(&inputs, &tx, dir.path(), &OsFacts::default()).0,
            Outcome::Applied
        );
        assert_eq!(
            tx.borrow().replicas(dxdp_core::devices::Resource::Display),
            1
        );
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
        let outcome = reload_once(&inputs, &tx, dir.path(), &old).0;
        assert_eq!(
            outcome,
            Outcome::Rejected("assignment location-path needs HCS schema 2.2 or later (Windows Server 2022+), and this host has 2.1: every container start would fail. Use assignment auto (class-guid here, every container then gets every GPU) or class-guid".into())
        );
        let new = OsFacts {
            hcs_schema_versions: vec!["2.1".into(), "2.2".into()],
            ..OsFacts::default()
        };
        assert_eq!(
            reload_once(&inputs, &tx, dir.path(), &new).0,
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
        spawn_watch_observed(inputs, tx, kubelet_dir, Observe::new())
    }

    fn spawn_watch_observed(
        inputs: Inputs,
        tx: watch::Sender<Arc<Config>>,
        kubelet_dir: &Path,
        observe: Observe,
    ) -> tokio::task::JoinHandle<()> {
        let fw = super::super::file_watch::FileWatch::new();
        let sub = fw.subscribe(
            &super::super::file_watch::parent_dirs(&inputs.watched_files()),
            std::time::Duration::from_secs(3600),
        );
        let facts = dxdp_core::facts::HostFacts::default();
        let (inventory, _) = crate::inventory::build(&facts, tx.borrow().clone());
        let (keep, rx) = watch::channel(Arc::new(inventory));
        let reload = Reload {
            inputs,
            tx,
            node: None,
            logged: Vec::new(),
            kept: None,
            fallback: Arc::default(),
        };
        let task = watch_counted(
            reload,
            kubelet_dir.to_path_buf(),
            sub,
            observe,
            rx,
            std::time::Duration::from_secs(30),
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
        let (tx, mut rx) = watch::channel(Arc::new(inputs.resolve().unwrap().config));
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
        let (tx, mut rx) = watch::channel(Arc::new(inputs.resolve().unwrap().config));
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
        let (tx, mut rx) = watch::channel(Arc::new(inputs.resolve().unwrap().config));
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
