//! The daemon's wiring: what happens at start, the main loop, and the stop.
//!
//! Start: lock the kubelet directory (one daemon per directory), start the optional metrics
//! endpoint (so the probes answer from the first moment), watch the kubelet directory before
//! looking at it, remove stale sockets, load the host facts, validate the configuration against
//! them (a label-selected configuration that cannot be served falls back to the top level), and
//! start the supervised tasks and the device-plugin servers.
//!
//! The main loop reacts to the kubelet directory, the servers' ends, configuration updates
//! (validated by the same [`validate::validate`] as at start, rejected whole), liveness pings, and the
//! task supervisor (which ends the daemon only when a required task keeps failing).
//!
//! Nothing waits without a limit: the first host read has the read limit (past it the start
//! says so and waits on; a stop ends it), the start as a whole has a deadline past which
//! `/healthz` fails with what it is doing, and [`stop_runtime`] gives the runtime's blocking
//! threads a time limit at exit, so that a read hung in the OS never turns a SIGTERM into a
//! SIGKILL.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch as channel};

use super::file_watch::{parent_dirs, FileWatch, Notice};
use super::refresher;
use super::servers::Servers;
use super::tasks::{Role, TaskSpec, Tasks};
use super::{claim, reload, validate, PluginConfig, PluginError, Reload};
use crate::backend::{HostFactsSource, SourceError};
use crate::config::file::MetricsAuthorization;
use crate::config::Config;
use crate::inventory::{self, Inventory};
use crate::observe::access::Access;
use crate::observe::state::Phase;
use crate::observe::state::Ping;
use crate::observe::web::Web;
use crate::observe::Observe;
use crate::util::bounded::{Lane, Overdue};
use dxdp_core::facts::HostFacts;

/// How long the runtime's blocking threads (a host read hung in the OS) may hold up the
/// process's exit once the daemon has stopped: [`stop_runtime`].
pub const RUNTIME_STOP_LIMIT: Duration = Duration::from_secs(2);

/// Shuts `runtime` down once the daemon has returned, waiting at most [`RUNTIME_STOP_LIMIT`]
/// for its blocking threads (dropping a runtime waits for them without limit, so one read hung
/// in the OS would keep a stopped process alive until it is killed).
pub fn stop_runtime(runtime: tokio::runtime::Runtime) {
    runtime.shutdown_timeout(RUNTIME_STOP_LIMIT);
}

/// Runs the daemon (see [`super::run_with_updates`]).
pub async fn run(
    mut config: PluginConfig,
    source: Arc<dyn HostFactsSource>,
    mut updates: channel::Receiver<Arc<Config>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PluginError> {
    let observe = config.observe.clone();
    // Says "stopped" to the probes however this function ends.
    let _stopped = StoppedOnDrop(observe.clone());
    observe.phase(Phase::Starting);
    observe.health.start_deadline(config.start_deadline);
    tokio::pin!(shutdown);
    let mut first = updates.borrow_and_update().clone();
    observe.health.start_step("locking the kubelet directory");
    let _lock = claim::lock(&config.lock_dir, &config.kubelet_dir)?;
    let mut tasks = Tasks::new(observe.clone());
    if let Some(address) = first.metrics_address {
        let (observe, authorizer, guarded, retry) = (
            observe.clone(),
            config.metrics_authorizer.clone(),
            first.clone(),
            config.guard_retry,
        );
        tasks.spawn(TaskSpec::new(
            "metrics-endpoint",
            Role::Optional,
            move || {
                metrics_endpoint(
                    address,
                    observe.clone(),
                    guarded.clone(),
                    authorizer.clone(),
                    retry,
                )
            },
        ));
    }
    if let Some(address) = first.probe_address {
        let observe = observe.clone();
        tasks.spawn(TaskSpec::new("probe-endpoint", Role::Optional, move || {
            crate::observe::http::serve_probes_forever(address, observe.clone())
        }));
    }
    // Names, sockets: what can be judged before the host is known.
    validate(&first, &config.kubelet_dir, &Default::default())?;
    // Watch before looking, so that nothing created from now on is missed.
    let watch = config.file_watch.clone();
    let mut kubelet_dir = watch.subscribe(
        std::slice::from_ref(&config.kubelet_dir),
        config.safety_poll,
    );
    if !kubelet_dir.unwatched().is_empty() {
        tracing::info!(
            dir = %config.kubelet_dir.display(),
            "the kubelet directory does not exist yet: watching for it to appear"
        );
    }
    observe.health.start_step("removing stale sockets");
    claim::remove_stale_sockets(config.transport, &config.kubelet_dir, &first.endpoints()).await?;
    let facts = tokio::select! {
        facts = first_read(&source, &observe, config.read_limit, config.start_deadline) => facts?,
        _ = &mut shutdown => {
            tracing::info!("device plugin stopped while starting (the first host read had not returned)");
            tasks.shutdown().await;
            return Ok(());
        }
    };
    observe
        .health
        .start_step("starting the device-plugin servers");
    let os = facts.os.clone().unwrap_or_default();
    if let Err(e) = validate(&first, &config.kubelet_dir, &os) {
        match config.fallback.take() {
            Some(top) if validate(&top, &config.kubelet_dir, &os).is_ok() => {
                tracing::error!(
                    configuration = first.selection.name.as_deref().unwrap_or("default"),
                    reason = %first.selection.reason,
                    "the selected configuration cannot be served on this host: {e}; serving the top-level configuration instead (fix the configuration or the node's label)"
                );
                first = Arc::new(top);
                if let Some(reload) = &config.reload {
                    reload.tx.send_replace(first.clone());
                }
            }
            _ => return Err(e.into()),
        }
    }
    let (inventory, notices) = inventory::build(&facts, first.clone());
    for n in &notices {
        tracing::warn!("{n}");
    }
    for (r, name) in first.endpoints() {
        tracing::info!(
            resource = %name,
            devices = inventory.discovery.devices_for(r).count(),
            unhealthy = inventory
                .discovery
                .devices_for(r)
                .filter(|d| !d.health.is_healthy())
                .count(),
            replicas = first.replicas(r),
            assignment = inventory.assignment.as_str(),
            "serving"
        );
    }
    refresher::log_health(None, &inventory);
    // The configuration in force: what passed validation.
    let (effective_tx, effective) = channel::channel(first.clone());
    let (inventory_tx, inventory_rx) = channel::channel(Arc::new(inventory));
    let facts = Arc::new(Mutex::new(facts));
    {
        let (source, facts, logged) = (source.clone(), facts.clone(), notices.clone());
        let (effective, tx, watch) = (effective.clone(), inventory_tx.clone(), watch.clone());
        let (observe, safety, limit) = (observe.clone(), config.safety_poll, config.read_limit);
        let kubelet_dir = config.kubelet_dir.clone();
        tasks.spawn(TaskSpec::new("refresher", Role::Required, move || {
            let files = parent_dirs(&source.watched_files());
            refresher::refresh(
                source.clone(),
                facts.clone(),
                logged.clone(),
                effective.clone(),
                tx.clone(),
                watch.subscribe(&files, safety),
                observe.clone(),
                limit,
                kubelet_dir.clone(),
            )
        }));
    }
    {
        let (rx, metrics) = (inventory_rx.clone(), observe.metrics.clone());
        tasks.spawn(TaskSpec::new("device-gauges", Role::Optional, move || {
            refresher::follow_devices(rx.clone(), metrics.clone())
        }));
    }
    if let Some(tap) = config.inventory_tap.take() {
        let rx = inventory_rx.clone();
        tasks.spawn(TaskSpec::new("inventory-tap", Role::Optional, move || {
            tap_inventory(rx.clone(), tap.clone())
        }));
    }
    if let Some(r) = config.reload.take() {
        spawn_reload(&mut tasks, r, &config, &watch, inventory_rx.clone());
    }
    for spec in std::mem::take(&mut config.tasks) {
        tasks.spawn(spec);
    }

    let mut servers = Servers::new(
        &config.kubelet_dir,
        config.transport,
        config.backoff,
        observe.clone(),
        inventory_rx.clone(),
        first.endpoints(),
    );
    let mut pings = observe.health.take_pings();
    observe.phase(Phase::Running);
    servers.check();
    let mut updates_open = true;
    let mut failed = None;
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            notice = kubelet_dir.next() => match notice {
                Notice::Events(events) => servers.on_dir_events(&events),
                Notice::Recheck(why) => {
                    tracing::debug!(?why, "checking the kubelet directory");
                    servers.check();
                }
            },
            Some(ended) = servers.ended_rx.recv() => servers.on_ended(ended),
            Some(ping) = next_ping(&mut pings) => {
                let _ = ping.send(());
            }
            changed = updates.changed(), if updates_open => match changed {
                Ok(()) => {
                    let c = updates.borrow_and_update().clone();
                    let os = inventory_rx.borrow().os.clone();
                    match validate(&c, &config.kubelet_dir, &os) {
                        Ok(()) => {
                            servers.reconfigure(c.endpoints());
                            effective_tx.send_replace(c);
                        }
                        Err(e) => {
                            observe.metrics.config_reload(crate::observe::metrics::ReloadResult::Rejected);
                            tracing::error!("configuration rejected: {e}; keeping the resources served now");
                        }
                    }
                }
                // No more updates: keep serving the last configuration.
                Err(_) => updates_open = false,
            },
            fatal = tasks.run() => {
                failed = Some(fatal);
                break;
            }
        }
    }
    observe.phase(Phase::Stopped);
    servers.stop_all().await;
    tasks.shutdown().await;
    match failed {
        Some(fatal) => {
            tracing::error!("device plugin stopped: {fatal}");
            Err(fatal.into())
        }
        None => {
            tracing::info!("device plugin stopped");
            Ok(())
        }
    }
}

/// Spawns the configuration reload as a required task.
fn spawn_reload(
    tasks: &mut Tasks,
    r: Reload,
    config: &PluginConfig,
    watch: &FileWatch,
    inventory: inventory::InventoryRx,
) {
    let files = r.inputs.watched_files();
    if files.is_empty() {
        return;
    }
    let dirs = parent_dirs(&files);
    let (kubelet_dir, safety) = (config.kubelet_dir.clone(), config.safety_poll);
    let (watch, observe, limit) = (watch.clone(), config.observe.clone(), config.read_limit);
    tasks.spawn(TaskSpec::new("config-reload", Role::Required, move || {
        reload::watch_counted(
            r.inputs.clone(),
            r.tx.clone(),
            kubelet_dir.clone(),
            watch.subscribe(&dirs, safety),
            r.node.clone(),
            observe.clone(),
            inventory.clone(),
            limit,
        )
    }));
}

/// The first read of the host facts, each attempt given `limit`. A read that does not return
/// is said once, and waited for (nothing can be served before the host is known); once it
/// returns the facts are read again (its result may be stale). Past `deadline` the start is
/// overdue: said once here, and `/healthz` fails with the reason from then on.
async fn first_read(
    source: &Arc<dyn HostFactsSource>,
    observe: &Observe,
    limit: Duration,
    deadline: Duration,
) -> Result<HostFacts, SourceError> {
    let mut lane = Lane::new(
        format!("reading host facts from {}", source.describe()),
        limit,
    );
    observe.health.start_step(lane.what().to_string());
    let overdue = tokio::time::sleep(deadline);
    tokio::pin!(overdue);
    let mut said_overdue = false;
    loop {
        let loader = source.clone();
        match lane.run(move || loader.load()).await {
            Ok(facts) => return facts,
            Err(e @ Overdue::TimedOut { .. }) => {
                tracing::error!(
                    "{e}; waiting for it: nothing is served before the host is known (/healthz fails {} s after the start)",
                    deadline.as_secs_f64()
                );
                observe
                    .health
                    .start_step(format!("{} has not returned", lane.what()));
                loop {
                    tokio::select! {
                        _ = lane.unstuck() => break,
                        _ = &mut overdue, if !said_overdue => {
                            said_overdue = true;
                            if let Some(why) = observe.health.start_overdue() {
                                tracing::error!("{why}; /healthz fails until the start completes");
                            }
                        }
                    }
                }
                tracing::info!("{} returned; reading the host facts again", lane.what());
                observe.health.start_step(lane.what().to_string());
            }
            Err(e) => return Err(SourceError::Unavailable(e.to_string())),
        }
    }
}

/// Hands every inventory to `tap` (the node labels) until `tap` is closed.
async fn tap_inventory(
    mut rx: inventory::InventoryRx,
    tap: channel::Sender<Option<Arc<Inventory>>>,
) {
    loop {
        let current = rx.borrow_and_update().clone();
        tap.send_replace(Some(current));
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { break },
            _ = tap.closed() => break,
        }
    }
    // Nothing more to hand on (the daemon is stopping, or nobody listens): wait to be stopped.
    std::future::pending::<()>().await
}

/// How often a metrics endpoint whose guard could not be set up tries again.
pub const GUARD_RETRY: Duration = Duration::from_secs(10);

/// Serves `/metrics`, `/healthz` and `/readyz` on `address` ([`crate::observe::http::serve_forever`]:
/// an address that cannot be bound is logged once per distinct error and retried in the
/// background; device serving never waits for it), guarded as `config` says, and says it
/// stopped listening when it ends.
///
/// A guard that cannot be set up (an invalid web configuration, `metrics.authorization:
/// kubernetes` without the API server's credentials) never stops the daemon and never opens
/// `/metrics` unguarded: the endpoint answers `503` with the reason (the probes answer as
/// always), says so once, and tries again every `retry` until the guard loads.
async fn metrics_endpoint(
    address: SocketAddr,
    observe: Observe,
    config: Arc<Config>,
    authorizer: Option<Result<Arc<dyn crate::observe::access::Authorize>, String>>,
    retry: Duration,
) {
    let _unset = UnsetListening(observe.clone());
    let serve =
        |access| crate::observe::http::serve_guarded_forever(address, observe.clone(), access);
    let mut said: Option<String> = None;
    let access = loop {
        match metrics_access(&config, authorizer.clone(), &observe).await {
            Ok(access) => break access,
            Err(why) => {
                if said.as_deref() != Some(why.as_str()) {
                    tracing::error!(
                        %address,
                        "the metrics endpoint cannot be guarded as configured: {why}; /metrics answers 503 until it is fixed (tried again every {} s; the devices are served as usual)",
                        retry.as_secs()
                    );
                    said = Some(why.clone());
                }
                observe.metrics.access().guard_failed();
                let refusing = serve(Access::refusing(why));
                tokio::pin!(refusing);
                tokio::select! {
                    _ = &mut refusing => return,
                    _ = tokio::time::sleep(retry) => {}
                }
            }
        }
    };
    if said.is_some() {
        tracing::info!(%address, "the metrics endpoint's guard is set up now: serving /metrics as configured");
    }
    serve(access).await
}

/// What guards the metrics endpoint: the web configuration, loaded and checked now, and the
/// Kubernetes authorizer when `metrics.authorization` asks for it; `Err` says why either
/// cannot be set up (the endpoint then refuses `/metrics`).
async fn metrics_access(
    config: &Config,
    authorizer: Option<Result<Arc<dyn crate::observe::access::Authorize>, String>>,
    observe: &Observe,
) -> Result<Access, String> {
    let mut access = Access::default();
    if let Some(path) = config.web_config_file.clone() {
        let metrics = observe.metrics.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            Web::load(&path, move |r| metrics.access().web_reload(r))
        })
        .await
        .map_err(|e| format!("loading the web configuration failed: {e}"))?
        .map_err(|e| format!("{e} (fix or unset metrics.webConfigFile)"))?;
        let current = loaded.current();
        tracing::info!(
            file = %loaded.path().display(),
            tls = current.tls().is_some(),
            client_certificates = ?current.client_auth(),
            basic_auth = current.has_users(),
            "metrics endpoint web configuration loaded"
        );
        access.web = Some(Arc::new(loaded));
    }
    if config.metrics_authorization == MetricsAuthorization::Kubernetes {
        let authorizer = match authorizer {
            Some(Ok(a)) => a,
            Some(Err(why)) => return Err(format!("metrics.authorization: kubernetes: {why}")),
            None => return Err(
                "metrics.authorization: kubernetes needs the API server (in a pod: the service account token; outside: KUBECONFIG), which dxdp cannot reach with what it was given; set metrics.authorization: none to serve /metrics without it".into(),
            ),
        };
        if access.web.as_ref().is_some_and(|w| w.current().has_users()) {
            return Err(
                "metrics.authorization: kubernetes and the web configuration's basic_auth_users both ask for the Authorization header: use one of them".into(),
            );
        }
        access.authorizer = Some(authorizer);
    }
    Ok(access)
}

/// Tells the probes' listeners that the endpoint stopped listening, when dropped.
struct UnsetListening(Observe);

impl Drop for UnsetListening {
    fn drop(&mut self) {
        self.0.set_listening(None);
    }
}

/// Sets the phase to stopped when dropped.
struct StoppedOnDrop(Observe);

impl Drop for StoppedOnDrop {
    fn drop(&mut self) {
        self.0.phase(Phase::Stopped);
    }
}

/// The next liveness ping, or never when there is no one to answer.
async fn next_ping(pings: &mut Option<mpsc::Receiver<Ping>>) -> Option<Ping> {
    match pings {
        Some(p) => p.recv().await,
        None => std::future::pending().await,
    }
}
