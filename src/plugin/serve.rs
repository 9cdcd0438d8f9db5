//! Device serving, one feature of the daemon ([`crate::daemon`] runs it): its start, its
//! supervised tasks, and its main loop.
//!
//! [`start`]: watch the kubelet directory before looking at it, remove stale sockets, load the
//! host facts, check that the configuration can be served on them (a label-selected
//! configuration that cannot be served falls back to the top level) and build the first
//! inventory. [`tasks`]: the refresher (the inventory, refreshed on host events), the device
//! gauges and the configuration reload. [`run`]: the device-plugin servers, reacting to the
//! kubelet directory, the servers' ends, configuration updates (checked by the same
//! [`servable::check`] as at start, rejected whole, published on the daemon's validated
//! configuration channel when taken), liveness pings, and the task supervisor (which ends the
//! daemon only when a required task keeps failing).
//!
//! Nothing waits without a limit: the first host read has the read limit (past it the start
//! says so and waits on; a stop ends it), and the start as a whole has a deadline past which
//! `/healthz` fails with what it is doing.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch as channel};

use super::file_watch::{parent_dirs, FileWatch, Notice, Subscription};
use super::refresher;
use super::servers::Servers;
use super::{claim, reload, servable, PluginConfig, PluginError, Reload};
use crate::backend::{HostFactsSource, SourceError};
use crate::config::Config;
use crate::inventory::{self, Inventory, InventoryRx};
use crate::observe::state::Phase;
use crate::observe::state::Ping;
use crate::observe::Observe;
use crate::supervisor::{Role, TaskSpec, Tasks};
use crate::util::bounded::{Lane, Overdue};
use dxdp_core::facts::HostFacts;

/// What the start found: the configuration to serve, with what the refresher and the servers
/// go on from.
pub(crate) struct Started {
    /// The configuration served: the one asked for, or the [`Fallback`] it fell back to.
    pub(crate) config: Arc<Config>,
    /// Why the configuration asked for was not served, when the fallback is.
    pub(crate) unservable: Option<String>,
    facts: HostFacts,
    notices: Vec<String>,
    kubelet_dir: Subscription,
}

/// What is served when the configuration asked for cannot be served on this host.
pub(crate) enum Fallback {
    /// The top level of the configuration file, instead of the named configuration the node's
    /// label selected.
    TopLevel(Config),
    /// The last configuration this node served, kept on the host.
    LastServed(Config),
}

impl Fallback {
    fn config(&self) -> &Config {
        match self {
            Fallback::TopLevel(c) | Fallback::LastServed(c) => c,
        }
    }
}

/// Starts serving `first` (falling back to `fallback` when `first` cannot be served on this
/// host): what it found and the first inventory, or `None` when `stop` completed before the
/// first host read returned.
pub(crate) async fn start(
    settings: &PluginConfig,
    source: &Arc<dyn HostFactsSource>,
    first: Arc<Config>,
    fallback: Option<Fallback>,
    stop: Pin<&mut impl Future<Output = ()>>,
) -> Result<Option<(Started, Inventory)>, PluginError> {
    let observe = &settings.observe;
    // Names, sockets: what can be judged before the host is known (the last-served
    // configuration instead, when it can be served).
    let mut unservable = None;
    let mut fallback = fallback;
    let mut first = first;
    if let Err(e) = servable::check(&first, &settings.kubelet_dir, &Default::default()) {
        match fallback.take() {
            Some(Fallback::LastServed(c))
                if servable::check(&c, &settings.kubelet_dir, &Default::default()).is_ok() =>
            {
                unservable = Some(e.to_string());
                first = Arc::new(c);
            }
            _ => return Err(e.into()),
        }
    }
    // Watch before looking, so that nothing created from now on is missed.
    let kubelet_dir = settings.file_watch.subscribe(
        std::slice::from_ref(&settings.kubelet_dir),
        settings.safety_poll,
    );
    if !kubelet_dir.unwatched().is_empty() {
        tracing::info!(
            dir = %settings.kubelet_dir.display(),
            "the kubelet directory does not exist yet: watching for it to appear"
        );
    }
    observe.health.start_step("removing stale sockets");
    claim::remove_stale_sockets(
        settings.transport,
        &settings.kubelet_dir,
        &crate::inventory::endpoints(&first),
    )
    .await?;
    let facts = tokio::select! {
        facts = first_read(source, observe, settings.read_limit, settings.start_deadline) => facts?,
        _ = stop => {
            tracing::info!("device plugin stopped while starting (the first host read had not returned)");
            return Ok(None);
        }
    };
    observe
        .health
        .start_step("starting the device-plugin servers");
    let os = facts.os.clone().unwrap_or_default();
    let mut config = first;
    if let Err(e) = servable::check(&config, &settings.kubelet_dir, &os) {
        match fallback {
            Some(f) if servable::check(f.config(), &settings.kubelet_dir, &os).is_ok() => {
                if let Fallback::TopLevel(_) = f {
                    // The configuration's name and why it was selected are logged before the
                    // start.
                    tracing::error!(
                        "the selected configuration cannot be served on this host: {e}; serving the top-level configuration instead (fix the configuration or the node's label)"
                    );
                }
                // The last-served configuration is said by the daemon, with what to do.
                unservable = Some(e.to_string());
                config = Arc::new(f.config().clone());
            }
            _ => return Err(e.into()),
        }
    }
    let (inventory, notices) = inventory::build(&facts, config.clone());
    for n in &notices {
        tracing::warn!("{n}");
    }
    for (r, name) in crate::inventory::endpoints(&config) {
        let served = crate::inventory::served(&config, r, &name);
        let held = || {
            inventory
                .discovery
                .devices_for(r)
                .filter(move |d| served.shares(d.dedicated_memory_bytes) > 0)
        };
        tracing::info!(
            resource = %name,
            devices = held().count(),
            unhealthy = held().filter(|d| !d.health.is_healthy()).count(),
            ids = dxdp_core::allocation::advertise(&inventory.discovery, r, served).len(),
            sharing = %sharing_text(served),
            assignment = inventory.assignment.as_str(),
            "serving"
        );
        if let dxdp_core::sharing::Served::Class(dxdp_core::sharing::Sharing::Memory(_)) = served {
            tracing::info!(
                resource = %name,
                devices = held().count(),
                "{r} GPUs are shared by memory and advertised under {}: {name} is still served, with the {r} GPUs that have no memory unit (less dedicated memory than the reserve plus one unit), usually none",
                config.memory_resource_name(r).unwrap_or_default()
            );
        }
    }
    refresher::log_health(None, &inventory);
    let started = Started {
        config,
        unservable,
        facts,
        notices,
        kubelet_dir,
    };
    Ok(Some((started, inventory)))
}

/// How a served name shares its GPUs, for the start's log.
fn sharing_text(served: dxdp_core::sharing::Served) -> String {
    use dxdp_core::sharing::{Served, Sharing};
    match served {
        Served::Class(Sharing::Replicas(n)) => format!("{n} replicas per GPU"),
        Served::Class(Sharing::Memory(_)) => "whole GPUs without memory units".to_string(),
        Served::Memory(m) => format!(
            "memory units of {} bytes, {} bytes kept back per GPU",
            m.unit_bytes, m.reserve_bytes
        ),
    }
}

/// Serving's supervised tasks: the refresher (required: it publishes every inventory on
/// `inventory_tx`, for the servers and every other feature), the device gauges, and the
/// configuration reload (required) when `reload` is given.
pub(crate) fn tasks(
    started: &mut Started,
    settings: &PluginConfig,
    source: Arc<dyn HostFactsSource>,
    config: channel::Receiver<Arc<Config>>,
    inventory_tx: channel::Sender<Arc<Inventory>>,
    reload: Option<Reload>,
    feeds: refresher::Feeds,
) -> Vec<TaskSpec> {
    let inventory_rx = inventory_tx.subscribe();
    let mut specs = Vec::new();
    {
        let refresher = refresher::Refresher {
            source,
            facts: Arc::new(Mutex::new(std::mem::take(&mut started.facts))),
            logged: std::mem::take(&mut started.notices),
            config,
            tx: inventory_tx,
            watch: (settings.file_watch.clone(), settings.safety_poll),
            observe: settings.observe.clone(),
            read_limit: settings.read_limit,
            kubelet_dir: settings.kubelet_dir.clone(),
            active: feeds.active,
            hot: feeds.hot,
        };
        specs.push(TaskSpec::task("refresher", Role::Required, refresher));
    }
    let gauges = refresher::DeviceGauges {
        inventory: inventory_rx.clone(),
        metrics: settings.observe.metrics.clone(),
    };
    specs.push(TaskSpec::task("device-gauges", Role::Optional, gauges));
    if let Some(r) = reload {
        specs.extend(reload_task(r, settings, &settings.file_watch, inventory_rx));
    }
    specs
}

/// Serves the device plugin until `stop` completes or a required task keeps failing: the
/// device-plugin servers, configuration `updates` (each checked, and published on `config_tx`
/// when taken), and the supervisor `tasks`. Then stops the servers and every task.
pub(crate) async fn run(
    settings: &PluginConfig,
    started: Started,
    tasks: &mut Tasks,
    inventory: InventoryRx,
    mut updates: channel::Receiver<Arc<Config>>,
    config_tx: channel::Sender<Arc<Config>>,
    stop: Pin<&mut impl Future<Output = ()>>,
) -> Result<(), PluginError> {
    let observe = &settings.observe;
    let mut kubelet_dir = started.kubelet_dir;
    let mut servers = Servers::new(
        &settings.kubelet_dir,
        settings.transport,
        settings.backoff,
        observe.clone(),
        inventory.clone(),
        crate::inventory::endpoints(&started.config),
    );
    let mut pings = observe.health.take_pings();
    observe.phase(Phase::Running);
    servers.check();
    let mut updates_open = true;
    let mut failed = None;
    let mut stop = stop;
    loop {
        tokio::select! {
            _ = &mut stop => break,
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
                    let os = inventory.borrow().os.clone();
                    match servable::check(&c, &settings.kubelet_dir, &os) {
                        Ok(()) => {
                            servers.reconfigure(crate::inventory::endpoints(&c));
                            // The same values are no change for any feature.
                            if **config_tx.borrow() != *c {
                                config_tx.send_replace(c);
                            }
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

/// The configuration reload, a required task (none when the configuration has no files).
fn reload_task(
    r: Reload,
    settings: &PluginConfig,
    watch: &FileWatch,
    inventory: InventoryRx,
) -> Option<TaskSpec> {
    let files = r.inputs.watched_files();
    if files.is_empty() {
        return None;
    }
    let dirs = parent_dirs(&files);
    let task = reload::ConfigReload {
        reload: r,
        kubelet_dir: settings.kubelet_dir.clone(),
        watch: watch.clone(),
        dirs,
        safety_poll: settings.safety_poll,
        observe: settings.observe.clone(),
        inventory,
        read_limit: settings.read_limit,
    };
    Some(TaskSpec::task("config-reload", Role::Required, task))
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

/// The next liveness ping, or never when there is no one to answer.
async fn next_ping(pings: &mut Option<mpsc::Receiver<Ping>>) -> Option<Ping> {
    match pings {
        Some(p) => p.recv().await,
        None => std::future::pending().await,
    }
}
