//! The device plugin daemon: serves every enabled resource to the kubelet and heals itself after
//! kubelet restarts, removed sockets, dead servers, device changes and configuration reloads.
//!
//! One process serves both resources. Each served name (a resource's name and each alias) is a
//! *unit*: its own socket in the kubelet's device-plugin directory (a fresh file name on every
//! start), its gRPC server and its registration task. The supervisor reacts to events, never to
//! a fast poll:
//!
//! - `kubelet.sock` created or replaced (kubelet restart): every unit restarts and registers.
//! - a unit's socket removed, or its server ended: that unit restarts on a fresh socket.
//! - a new configuration: units for names no longer served stop, new ones start.
//! - a slow safety poll (default 10 s) re-checks all of the above in case an event was missed.
//!
//! Registration runs in its own task per unit, with capped exponential backoff and jitter, so a
//! hanging kubelet never blocks the supervisor.

pub mod inventory;
pub mod register;
pub mod reload;
pub mod service;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, watch as channel};
use tokio::task::{AbortHandle, JoinHandle};

use crate::backend::{HostFactsSource, SourceError};
use crate::config::Config;
use crate::kubelet::v1beta1::device_plugin_server::DevicePluginServer;
use crate::kubelet::KUBELET_SOCKET;
use crate::observe::state::Ping;
use crate::observe::{Observe, Phase};
use crate::transport;
use dxdp_core::devices::Resource;
use inventory::InventoryRx;
use register::Backoff;
use service::ResourceService;
use watch::{Change, DirEvent, DirWatch};

/// The kubelet's device-plugin directory on this OS (on Windows from `%SystemDrive%`).
pub fn default_kubelet_dir() -> PathBuf {
    crate::kubelet::paths::default_dir().path
}

/// How the daemon runs.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// The kubelet's device-plugin directory (holds `kubelet.sock`).
    pub kubelet_dir: PathBuf,
    /// The configuration at start (resources, names, replicas, pipeline, assignment).
    pub config: Config,
    /// The slow safety poll: how often sockets, `kubelet.sock`, the configuration and host facts
    /// without change events (device health on Windows) are checked anyway.
    pub safety_poll: Duration,
    /// Registration retries.
    pub backoff: Backoff,
    /// Receives every inventory the daemon serves (for the node labels).
    pub inventory_tap: Option<channel::Sender<Option<Arc<inventory::Inventory>>>>,
    /// Metrics, health and readiness: recorded by the daemon, served on
    /// `config.metrics_address` when set.
    pub observe: Observe,
}

/// The default safety poll.
pub const DEFAULT_SAFETY_POLL: Duration = Duration::from_secs(10);

impl PluginConfig {
    /// Defaults for `kubelet_dir`: both resources, one replica, a 10 s safety poll, registration
    /// retried from 0.5 s up to 30 s with a 30 s timeout per call.
    pub fn new(kubelet_dir: PathBuf) -> Self {
        PluginConfig {
            kubelet_dir,
            config: Config::default(),
            safety_poll: DEFAULT_SAFETY_POLL,
            backoff: Backoff {
                initial: Duration::from_millis(500),
                max: Duration::from_secs(30),
                timeout: Duration::from_secs(30),
            },
            inventory_tap: None,
            observe: Observe::new(),
        }
    }
}

/// Why a configuration cannot be served. A reload that hits one of these is rejected whole.
#[derive(Debug, thiserror::Error)]
pub enum Unservable {
    /// No resource is enabled.
    #[error("no resources to serve: enable display, compute or both")]
    NoResources,
    /// One name is served twice.
    #[error("resource name {0} is served twice: each name in resources.*.name and resources.*.aliases must be unique")]
    Duplicate(String),
    /// A socket path does not fit in `sun_path`.
    #[error(transparent)]
    SocketPath(#[from] transport::SocketPathTooLong),
}

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The host facts could not be collected at start (the cause is in the message).
    #[error("cannot collect host facts: {0}")]
    Facts(SourceError),
    /// The configuration cannot be served.
    #[error(transparent)]
    Unservable(#[from] Unservable),
    /// The configured assignment cannot work on this host.
    #[error("assignment location-path needs HCS schema 2.2 or later (Windows Server 2022+), and this host has {schema}: every container start would fail. Use assignment auto (class-guid here, every container then gets every GPU) or class-guid")]
    Assignment {
        /// The host's highest schema version.
        schema: String,
    },
    /// The metrics and probes endpoint cannot listen.
    #[error(transparent)]
    Metrics(#[from] crate::observe::http::BindError),
    /// Another live dxdp serves the same resource in the same directory.
    #[error("another dxdp is already serving {resource} at {} (it answers on that socket): stop it first, or use a different --kubelet-dir", socket.display())]
    AlreadyServed {
        /// The resource name.
        resource: String,
        /// Its live socket.
        socket: PathBuf,
    },
}

impl From<SourceError> for PluginError {
    fn from(e: SourceError) -> Self {
        PluginError::Facts(e)
    }
}

/// Checks that `config` can be served from `kubelet_dir`: something enabled, every name once,
/// every socket path short enough.
pub fn check_servable(config: &Config, kubelet_dir: &Path) -> Result<(), Unservable> {
    let endpoints = config.endpoints();
    if endpoints.is_empty() {
        return Err(Unservable::NoResources);
    }
    let mut seen = BTreeSet::new();
    for (_, name) in &endpoints {
        if !seen.insert(name.as_str()) {
            return Err(Unservable::Duplicate(name.clone()));
        }
        // The longest name this resource's sockets can get.
        transport::check_socket_path(
            &kubelet_dir.join(socket_file_name(name, u128::from(u64::MAX))),
        )?;
    }
    Ok(())
}

/// Runs the daemon with a fixed configuration until `shutdown` completes.
pub async fn run(
    config: PluginConfig,
    source: Arc<dyn HostFactsSource>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PluginError> {
    let (_keep, updates) = channel::channel(Arc::new(config.config.clone()));
    run_with_updates(config, source, updates, shutdown).await
}

/// Runs the daemon until `shutdown` completes, then ends every stream and removes its sockets.
/// Every configuration sent on `updates` takes effect at once: replicas and device selection
/// re-advertise, and renamed, added or removed resources re-register. A configuration that
/// cannot be served is rejected and the running one stays.
pub async fn run_with_updates(
    config: PluginConfig,
    source: Arc<dyn HostFactsSource>,
    mut updates: channel::Receiver<Arc<Config>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PluginError> {
    let first = updates.borrow_and_update().clone();
    let observe = config.observe.clone();
    // Says "stopped" to the probes, and stops the endpoint, however this function ends.
    let mut endpoint = Endpoint {
        observe: observe.clone(),
        server: None,
    };
    observe.phase(Phase::Starting);
    check_servable(&first, &config.kubelet_dir)?;
    if let Some(address) = first.metrics_address {
        let server = crate::observe::http::bind(address).await?;
        let bound = server.local_addr();
        tracing::info!(address = %bound, "serving /metrics, /healthz and /readyz");
        observe.set_listening(Some(bound));
        endpoint.server = Some(tokio::spawn(server.serve(observe.clone())));
    }
    // Watch before looking, so that nothing created from now on is missed.
    let mut dir_watch = DirWatch::new();
    if !dir_watch.add(&config.kubelet_dir) {
        tracing::warn!(
            dir = %config.kubelet_dir.display(),
            "cannot watch the kubelet directory (does it exist?); checking it every {:?}",
            config.safety_poll
        );
    }
    claim_directory(&config.kubelet_dir, &first.endpoints()).await?;
    let facts = {
        let source = source.clone();
        tokio::task::spawn_blocking(move || source.load())
            .await
            .map_err(|e| SourceError::Unavailable(e.to_string()))??
    };
    let os = facts.os.clone().unwrap_or_default();
    if first.assignment == dxdp_core::assignment::Assignment::LocationPath
        && !os.hcs_schema_versions.is_empty()
        && !dxdp_core::assignment::supports_location_path(&os)
    {
        return Err(PluginError::Assignment {
            schema: os.hcs_schema_versions.join(", "),
        });
    }
    let (inventory, notices) = inventory::build(&facts, first.clone());
    for n in &notices {
        tracing::warn!("{n}");
    }
    for (r, name) in first.endpoints() {
        tracing::info!(
            resource = %name,
            devices = inventory.discovery.devices_for(r).count(),
            replicas = first.replicas(r),
            assignment = inventory.assignment.as_str(),
            "serving"
        );
    }
    let (tx, inventory) = channel::channel(Arc::new(inventory));
    let tap = config.inventory_tap.clone().map(|tap| {
        let mut rx = inventory.clone();
        tokio::spawn(async move {
            loop {
                let current = rx.borrow_and_update().clone();
                tap.send_replace(Some(current));
                tokio::select! {
                    changed = rx.changed() => if changed.is_err() { return },
                    _ = tap.closed() => return,
                }
            }
        })
    });
    let refresher = tokio::spawn(inventory::refresh(
        source,
        facts,
        notices,
        updates.clone(),
        tx,
        config.safety_poll,
        observe.metrics.clone(),
    ));
    let gauges = tokio::spawn(inventory::follow_devices(
        inventory.clone(),
        observe.metrics.clone(),
    ));

    let mut sup = Supervisor::new(&config, inventory, first.endpoints());
    let mut pings = observe.health.take_pings();
    observe.phase(Phase::Running);
    sup.check();
    let mut safety = tokio::time::interval_at(
        tokio::time::Instant::now() + config.safety_poll,
        config.safety_poll,
    );
    safety.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut updates_open = true;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            event = dir_watch.next() => {
                let mut events = vec![event];
                events.extend(dir_watch.drain());
                sup.on_dir_events(&events);
            }
            Some(ended) = sup.ended_rx.recv() => sup.on_ended(ended),
            Some(ping) = next_ping(&mut pings) => {
                let _ = ping.send(());
            }
            changed = updates.changed(), if updates_open => match changed {
                Ok(()) => {
                    let c = updates.borrow_and_update().clone();
                    sup.reconfigure(&c);
                }
                // No more updates: keep serving the last configuration.
                Err(_) => updates_open = false,
            },
            _ = safety.tick() => {
                if !dir_watch.is_watching(&config.kubelet_dir) && dir_watch.add(&config.kubelet_dir) {
                    tracing::info!(dir = %config.kubelet_dir.display(), "watching the kubelet directory");
                }
                sup.check();
            }
        }
    }
    observe.phase(Phase::Stopped);
    sup.stop_all().await;
    refresher.abort();
    if let Some(tap) = tap {
        tap.abort();
    }
    gauges.abort();
    endpoint.stop().await;
    tracing::info!("device plugin stopped");
    Ok(())
}

/// The metrics endpoint of a running daemon: stopped, and the probes told, when dropped.
struct Endpoint {
    observe: Observe,
    server: Option<JoinHandle<()>>,
}

impl Endpoint {
    /// Stops the server and waits until it no longer listens.
    async fn stop(mut self) {
        self.observe.phase(Phase::Stopped);
        if let Some(server) = self.server.take() {
            server.abort();
            let _ = server.await;
            self.observe.set_listening(None);
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.observe.phase(Phase::Stopped);
        if let Some(server) = self.server.take() {
            server.abort();
            self.observe.set_listening(None);
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

/// `dxdp-<resource name with / as ->-<nanoseconds>.sock`.
fn socket_file_name(resource_name: &str, nanos: u128) -> String {
    format!("dxdp-{}-{nanos}.sock", socket_safe(resource_name))
}

/// A resource name as it appears in socket file names.
fn socket_safe(resource_name: &str) -> String {
    resource_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// A fresh socket file name for a resource name.
fn socket_name(resource_name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    socket_file_name(resource_name, nanos)
}

/// The resource part of a socket file name dxdp made (`None` for any other file).
fn socket_resource(file_name: &str) -> Option<&str> {
    let rest = file_name.strip_prefix("dxdp-")?.strip_suffix(".sock")?;
    let (resource, nanos) = rest.rsplit_once('-')?;
    (!nanos.is_empty() && nanos.bytes().all(|b| b.is_ascii_digit())).then_some(resource)
}

/// Removes `dxdp-*.sock` files that no process answers on (left by a crashed run), and refuses
/// to start when a live dxdp already serves one of `endpoints` in `dir`.
async fn claim_directory(dir: &Path, endpoints: &[(Resource, String)]) -> Result<(), PluginError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            tracing::debug!(dir = %dir.display(), "cannot list the kubelet directory: {e}");
            return Ok(());
        }
    };
    let ours: BTreeMap<String, &str> = endpoints
        .iter()
        .map(|(_, n)| (socket_safe(n), n.as_str()))
        .collect();
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(resource) = socket_resource(&file_name.to_string_lossy()).map(str::to_string)
        else {
            continue;
        };
        let path = entry.path();
        let live = tokio::time::timeout(Duration::from_secs(2), transport::probe(&path))
            .await
            .is_ok_and(|r| r.is_ok());
        if live {
            if let Some(name) = ours.get(&resource) {
                return Err(PluginError::AlreadyServed {
                    resource: name.to_string(),
                    socket: path,
                });
            }
            tracing::debug!(socket = %path.display(), "another live dxdp serves this socket; leaving it");
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {
                tracing::info!(socket = %path.display(), "removed a stale socket left by an earlier run")
            }
            Err(e) => tracing::warn!(socket = %path.display(), "cannot remove a stale socket: {e}"),
        }
    }
    Ok(())
}

/// What tells one `kubelet.sock` from its successor.
type FileIdentity = (Option<SystemTime>, u64);

fn file_identity(path: &Path) -> Option<FileIdentity> {
    let meta = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let id = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(windows)]
    let id = std::os::windows::fs::MetadataExt::creation_time(&meta);
    #[cfg(not(any(unix, windows)))]
    let id = 0;
    Some((meta.modified().ok(), id))
}

/// A unit's server ended (for whatever reason).
#[derive(Debug)]
struct Ended {
    name: String,
    generation: u64,
    reason: String,
}

/// One served name: its socket, server and registration.
struct Unit {
    resource: Resource,
    path: PathBuf,
    generation: u64,
    stop: channel::Sender<bool>,
    monitor: JoinHandle<()>,
    server: AbortHandle,
    registrar: JoinHandle<()>,
}

/// Keeps the wanted units running.
struct Supervisor {
    kubelet_dir: PathBuf,
    kubelet_sock: PathBuf,
    backoff: Backoff,
    inventory: InventoryRx,
    wanted: Vec<(Resource, String)>,
    units: BTreeMap<String, Unit>,
    kubelet: Option<FileIdentity>,
    waiting_announced: bool,
    generations: u64,
    ended_tx: mpsc::UnboundedSender<Ended>,
    ended_rx: mpsc::UnboundedReceiver<Ended>,
    observe: Observe,
}

impl Supervisor {
    fn new(config: &PluginConfig, inventory: InventoryRx, wanted: Vec<(Resource, String)>) -> Self {
        let (ended_tx, ended_rx) = mpsc::unbounded_channel();
        let kubelet_sock = config.kubelet_dir.join(KUBELET_SOCKET);
        config
            .observe
            .wanted(wanted.iter().map(|(_, n)| n.clone()).collect());
        Supervisor {
            kubelet: file_identity(&kubelet_sock),
            kubelet_dir: config.kubelet_dir.clone(),
            kubelet_sock,
            backoff: config.backoff,
            inventory,
            wanted,
            units: BTreeMap::new(),
            waiting_announced: false,
            generations: 0,
            ended_tx,
            ended_rx,
            observe: config.observe.clone(),
        }
    }

    /// Brings the units in line with the wanted names, the sockets and `kubelet.sock`: the
    /// whole state is compared, so it is also the safety poll's fallback for missed events.
    fn check(&mut self) {
        let now = file_identity(&self.kubelet_sock);
        self.observe
            .kubelet_missing(now.is_none().then_some(self.kubelet_sock.as_path()));
        if now.is_none() {
            if !self.waiting_announced {
                tracing::info!(
                    "waiting for the kubelet: {} does not exist yet",
                    self.kubelet_sock.display()
                );
                self.waiting_announced = true;
            }
            self.kubelet = None;
            return;
        }
        self.waiting_announced = false;
        if now != self.kubelet {
            let was_there = self.kubelet.is_some();
            self.kubelet = now;
            if was_there || !self.units.is_empty() {
                self.restart_all(&format!(
                    "{} was recreated (kubelet restart)",
                    self.kubelet_sock.display()
                ));
                return;
            }
        }
        let gone: Vec<String> = self
            .units
            .iter()
            .filter(|(_, u)| !u.path.exists())
            .map(|(n, _)| n.clone())
            .collect();
        for name in gone {
            self.restart(&name, "its socket was removed (kubelet restart?)");
        }
        let missing: Vec<(Resource, String)> = self
            .wanted
            .iter()
            .filter(|(_, n)| !self.units.contains_key(n))
            .cloned()
            .collect();
        for (resource, name) in missing {
            self.start(resource, &name);
        }
    }

    fn on_dir_events(&mut self, events: &[DirEvent]) {
        let kubelet = events
            .iter()
            .any(|e| e.name.as_os_str() == std::ffi::OsStr::new(KUBELET_SOCKET));
        let removed: Vec<String> = self
            .units
            .iter()
            .filter(|(_, u)| {
                events.iter().any(|e| {
                    e.change == Change::Removed
                        && u.path.file_name() == Some(e.name.as_os_str())
                        && !u.path.exists()
                })
            })
            .map(|(n, _)| n.clone())
            .collect();
        if kubelet {
            let now = file_identity(&self.kubelet_sock);
            if now.is_none() && self.kubelet.is_some() {
                tracing::warn!(
                    "{} disappeared (kubelet stopped?)",
                    self.kubelet_sock.display()
                );
            }
        }
        for name in removed {
            self.restart(&name, "its socket was removed (kubelet restart?)");
        }
        if kubelet {
            self.check();
        }
    }

    fn on_ended(&mut self, ended: Ended) {
        let current = self
            .units
            .get(&ended.name)
            .is_some_and(|u| u.generation == ended.generation);
        if current {
            tracing::error!(resource = %ended.name, "gRPC server ended: {}", ended.reason);
            self.restart(&ended.name, "its gRPC server ended");
        }
    }

    /// Applies a new configuration's names, or rejects it whole.
    fn reconfigure(&mut self, config: &Config) {
        if let Err(e) = check_servable(config, &self.kubelet_dir) {
            tracing::error!("configuration rejected: {e}; keeping the resources served now");
            return;
        }
        let wanted = config.endpoints();
        if wanted == self.wanted {
            return;
        }
        tracing::info!("the configuration changed the served resources or their names");
        let stale: Vec<String> = self
            .units
            .iter()
            .filter(|(n, u)| !wanted.contains(&(u.resource, (*n).clone())))
            .map(|(n, _)| n.clone())
            .collect();
        for name in stale {
            if let Some(unit) = self.units.remove(&name) {
                tracing::info!(resource = %name, "no longer served");
                tokio::spawn(self.stop(&name, unit));
            }
        }
        self.observe
            .wanted(wanted.iter().map(|(_, n)| n.clone()).collect());
        self.wanted = wanted;
        self.check();
    }

    fn restart_all(&mut self, why: &str) {
        tracing::warn!("{why}; starting new sockets and registering again");
        let units = std::mem::take(&mut self.units);
        for (name, unit) in units {
            tokio::spawn(self.stop(&name, unit));
        }
        self.check();
    }

    fn restart(&mut self, name: &str, why: &str) {
        let Some(unit) = self.units.remove(name) else {
            return;
        };
        tracing::warn!(resource = %name, "{why}; serving it on a new socket and registering again");
        let resource = unit.resource;
        tokio::spawn(self.stop(name, unit));
        if self.kubelet_sock.exists() {
            self.start(resource, name);
        }
    }

    /// Binds a fresh socket for `name`, serves it and registers it. A failure is logged and
    /// retried by the next safety poll.
    fn start(&mut self, resource: Resource, name: &str) {
        let path = self.kubelet_dir.join(socket_name(name));
        if let Err(e) = transport::check_socket_path(&path) {
            tracing::error!(resource = %name, "{e}");
            return;
        }
        let _ = std::fs::remove_file(&path);
        let listener = match transport::bind(&path) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(resource = %name, socket = %path.display(), "cannot listen: {e}; retrying at the next safety poll");
                self.observe
                    .unit_not_listening(name, format!("cannot listen on {}: {e}", path.display()));
                return;
            }
        };
        self.generations += 1;
        let generation = self.generations;
        let (stop, stopping) = channel::channel(false);
        let svc = ResourceService::new(
            resource,
            name.to_string(),
            self.inventory.clone(),
            stopping.clone(),
            self.observe.metrics.allocate_recorder(name),
        );
        let mut until_stopped = stopping;
        let server = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(svc))
                .serve_with_incoming_shutdown(listener.incoming(), async move {
                    let _ = until_stopped.wait_for(|s| *s).await;
                })
                .await
        });
        let server_abort = server.abort_handle();
        let ended_tx = self.ended_tx.clone();
        let ended_name = name.to_string();
        let monitor = tokio::spawn(async move {
            let reason = match server.await {
                Ok(Ok(())) => "stopped".to_string(),
                Ok(Err(e)) => register::chain(&e),
                Err(e) if e.is_cancelled() => "aborted".to_string(),
                Err(e) => format!("panicked: {e}"),
            };
            let _ = ended_tx.send(Ended {
                name: ended_name,
                generation,
                reason,
            });
        });
        tracing::info!(resource = %name, socket = %path.display(), "listening");
        self.observe.unit_started(name, generation);
        let registrar = tokio::spawn(registration(
            self.kubelet_sock.clone(),
            path.clone(),
            name.to_string(),
            self.backoff,
            (self.observe.clone(), generation),
        ));
        self.units.insert(
            name.to_string(),
            Unit {
                resource,
                path,
                generation,
                stop,
                monitor,
                server: server_abort,
                registrar,
            },
        );
    }

    async fn stop_all(&mut self) {
        let units = std::mem::take(&mut self.units);
        let stopping: Vec<_> = units
            .into_iter()
            .map(|(name, unit)| self.stop(&name, unit))
            .collect();
        futures_util::future::join_all(stopping).await;
    }

    /// [`stop_unit`], telling the readiness that the unit is gone.
    fn stop(&self, name: &str, unit: Unit) -> impl Future<Output = ()> {
        self.observe.unit_stopped(name, unit.generation);
        stop_unit(unit)
    }
}

/// Registers one unit until the kubelet accepts it, reporting every attempt to `observe` as the
/// unit's generation.
async fn registration(
    kubelet_sock: PathBuf,
    socket: PathBuf,
    name: String,
    backoff: Backoff,
    (observe, generation): (Observe, u64),
) {
    let endpoint = socket
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (sock, ep, rn) = (kubelet_sock.clone(), endpoint.clone(), name.clone());
    register::until_registered(
        backoff,
        move || {
            let (sock, ep, rn) = (sock.clone(), ep.clone(), rn.clone());
            async move { register::register(&sock, &ep, &rn, backoff.timeout).await }
        },
        |attempt, result, retry_in| {
            observe.registration(
                &name,
                generation,
                result.as_ref().map(|_| ()).map_err(|e| e.to_string()),
            );
            match (result, retry_in) {
                (Ok(()), _) => tracing::info!(resource = %name, endpoint = %endpoint, attempt, "registered with the kubelet"),
                (Err(e), Some(delay)) => tracing::warn!(resource = %name, attempt, retry_in = ?delay, "registration failed: {e}"),
                (Err(e), None) => tracing::warn!(resource = %name, attempt, "registration failed: {e}"),
            }
        },
    )
    .await;
}

/// Stops a unit. At once: its socket file is removed (so the kubelet cannot dial it again and
/// the directory shows it gone), its registration stops and its streams are told to end. The
/// returned future waits for the server to finish (2 s grace, then it is aborted).
fn stop_unit(unit: Unit) -> impl Future<Output = ()> {
    let _ = unit.stop.send(true);
    unit.registrar.abort();
    match std::fs::remove_file(&unit.path) {
        Ok(()) => tracing::debug!(socket = %unit.path.display(), "removed"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(socket = %unit.path.display(), "cannot remove socket: {e}"),
    }
    async move {
        if tokio::time::timeout(Duration::from_secs(2), unit.monitor)
            .await
            .is_err()
        {
            unit.server.abort();
        }
    }
}

#[cfg(test)]
mod tests;
