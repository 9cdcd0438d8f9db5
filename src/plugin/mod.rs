//! The device plugin daemon: serves every enabled resource to the kubelet and survives kubelet
//! restarts, device changes and signals.
//!
//! One process serves both resources, each on its own socket in the kubelet's device-plugin
//! directory. A *generation* is one set of sockets (with names new on every start) and their
//! registrations; when the kubelet restarts (it deletes plugin sockets and recreates
//! `kubelet.sock`) the generation is torn down and a new one starts and registers again.

pub mod inventory;
pub mod reload;
pub mod service;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backend::{HostFactsSource, SourceError};
use crate::config::Config;
use crate::kubelet::v1beta1::device_plugin_server::DevicePluginServer;
use crate::kubelet::v1beta1::registration_client::RegistrationClient;
use crate::kubelet::v1beta1::RegisterRequest;
use crate::kubelet::{API_VERSION, KUBELET_SOCKET};
use crate::transport;
use dxdp_core::devices::Resource;
use inventory::{Inventory, InventoryRx};
use service::ResourceService;

/// The kubelet's device-plugin directory on this OS.
pub fn default_kubelet_dir() -> PathBuf {
    if cfg!(windows) {
        PathBuf::from(r"C:\var\lib\kubelet\device-plugins")
    } else {
        PathBuf::from("/var/lib/kubelet/device-plugins")
    }
}

/// How the daemon runs.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// The kubelet's device-plugin directory (holds `kubelet.sock`).
    pub kubelet_dir: PathBuf,
    /// The configuration at start (resources, names, replicas, pipeline, assignment).
    pub config: Config,
    /// How often sockets, `kubelet.sock` and the host facts are checked for changes.
    pub poll_interval: Duration,
    /// First retry delay for a failed registration; doubles up to `max_backoff`.
    pub initial_backoff: Duration,
    /// Longest retry delay for a failed registration.
    pub max_backoff: Duration,
}

impl PluginConfig {
    /// Defaults for `kubelet_dir`: both resources, one replica, 200 ms polling.
    pub fn new(kubelet_dir: PathBuf) -> Self {
        PluginConfig {
            kubelet_dir,
            config: Config::default(),
            poll_interval: Duration::from_millis(200),
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The host facts could not be collected at start.
    #[error("cannot collect host facts: {0}")]
    Facts(#[from] SourceError),
    /// A socket path is too long.
    #[error(transparent)]
    SocketPath(#[from] transport::SocketPathTooLong),
    /// A socket could not be created.
    #[error("cannot listen on {}: {source}", path.display())]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// No resources to serve.
    #[error("no resources to serve: enable display, compute or both")]
    NoResources,
}

/// Runs the daemon with a fixed configuration until `shutdown` completes.
pub async fn run(
    config: PluginConfig,
    source: Arc<dyn HostFactsSource>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PluginError> {
    let (_keep, updates) = watch::channel(Arc::new(config.config.clone()));
    run_with_updates(config, source, updates, shutdown).await
}

/// Runs the daemon until `shutdown` completes, then removes its sockets. Every configuration
/// sent on `updates` takes effect at once: replicas and device selection re-advertise, and
/// renamed, added or removed resources re-register.
pub async fn run_with_updates(
    config: PluginConfig,
    source: Arc<dyn HostFactsSource>,
    updates: watch::Receiver<Arc<Config>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PluginError> {
    let first = updates.borrow().clone();
    if first.endpoints().is_empty() {
        return Err(PluginError::NoResources);
    }
    for (_, name) in first.endpoints() {
        transport::check_socket_path(&config.kubelet_dir.join(socket_name(&name)))?;
    }
    let facts = {
        let source = source.clone();
        tokio::task::spawn_blocking(move || source.load())
            .await
            .map_err(|e| SourceError::Unavailable(e.to_string()))??
    };
    let inventory: Inventory = inventory::build(&facts, first.clone());
    for (r, name) in first.endpoints() {
        tracing::info!(
            resource = %name,
            devices = inventory.discovery.devices_for(r).count(),
            replicas = first.replicas(r),
            assignment = inventory.assignment.as_str(),
            "serving"
        );
    }
    let (tx, inventory) = watch::channel(Arc::new(inventory));
    let refresher = tokio::spawn(inventory::refresh(
        source,
        facts,
        updates.clone(),
        tx,
        config.poll_interval,
    ));

    tokio::pin!(shutdown);
    let result = loop {
        let kubelet_sock = config.kubelet_dir.join(KUBELET_SOCKET);
        tokio::select! {
            _ = &mut shutdown => break Ok(()),
            _ = wait_for_file(&kubelet_sock, config.poll_interval) => {}
        }
        let endpoints = updates.borrow().endpoints();
        if endpoints.is_empty() {
            tracing::warn!(
                "the configuration enables no resource; waiting for a configuration that does"
            );
        }
        let generation = match Generation::start(&config, &endpoints, &inventory) {
            Ok(g) => g,
            Err(e) => break Err(e),
        };
        tokio::select! {
            _ = &mut shutdown => {
                generation.stop().await;
                break Ok(());
            }
            reason = generation.supervise(&config, &kubelet_sock, updates.clone()) => {
                tracing::warn!("{reason}; starting new sockets and registering again");
                generation.stop().await;
            }
        }
    };
    refresher.abort();
    tracing::info!("device plugin stopped");
    result
}

/// A fresh socket file name for a resource name (`directx.microsoft.com/display` gives
/// `dxdp-directx.microsoft.com-display-<nanoseconds>.sock`).
fn socket_name(resource_name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let safe: String = resource_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("dxdp-{safe}-{nanos}.sock")
}

async fn wait_for_file(path: &Path, interval: Duration) {
    let mut announced = false;
    while !path.exists() {
        if !announced {
            tracing::info!(
                "waiting for the kubelet: {} does not exist yet",
                path.display()
            );
            announced = true;
        }
        tokio::time::sleep(interval).await;
    }
}

/// What tells one `kubelet.sock` from its successor.
fn file_identity(path: &Path) -> Option<(Option<SystemTime>, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let id = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(not(unix))]
    let id = 0;
    Some((meta.modified().ok(), id))
}

struct Served {
    name: String,
    path: PathBuf,
    task: JoinHandle<()>,
}

/// One set of sockets and servers.
struct Generation {
    served: Vec<Served>,
    stop: watch::Sender<bool>,
}

impl Generation {
    fn start(
        config: &PluginConfig,
        endpoints: &[(Resource, String)],
        inventory: &InventoryRx,
    ) -> Result<Self, PluginError> {
        let (stop, stopping) = watch::channel(false);
        let mut served = Vec::new();
        for (resource, name) in endpoints {
            let (resource, name) = (*resource, name.clone());
            let path = config.kubelet_dir.join(socket_name(&name));
            transport::check_socket_path(&path)?;
            let _ = std::fs::remove_file(&path);
            let listener = transport::bind(&path).map_err(|source| PluginError::Bind {
                path: path.clone(),
                source,
            })?;
            let svc =
                ResourceService::new(resource, name.clone(), inventory.clone(), stopping.clone());
            let mut until_stopped = stopping.clone();
            let task = tokio::spawn(async move {
                let result = tonic::transport::Server::builder()
                    .add_service(DevicePluginServer::new(svc))
                    .serve_with_incoming_shutdown(listener.incoming(), async move {
                        let _ = until_stopped.wait_for(|s| *s).await;
                    })
                    .await;
                if let Err(e) = result {
                    tracing::error!(resource = resource.as_str(), "gRPC server failed: {e}");
                }
            });
            tracing::info!(resource = %name, socket = %path.display(), "listening");
            served.push(Served { name, path, task });
        }
        Ok(Generation { served, stop })
    }

    /// Registers every resource (retrying with capped backoff) and returns when the generation
    /// must be replaced: a socket was deleted or `kubelet.sock` was recreated.
    async fn supervise(
        &self,
        config: &PluginConfig,
        kubelet_sock: &Path,
        mut updates: watch::Receiver<Arc<Config>>,
    ) -> String {
        let identity = file_identity(kubelet_sock);
        let endpoints = updates.borrow_and_update().endpoints();
        let mut pending: Vec<&Served> = self.served.iter().collect();
        let mut backoff = config.initial_backoff;
        let mut next_attempt = tokio::time::Instant::now();
        loop {
            if let Some(gone) = self.served.iter().find(|s| !s.path.exists()) {
                return format!(
                    "socket {} was removed (kubelet restart?)",
                    gone.path.display()
                );
            }
            let now_identity = file_identity(kubelet_sock);
            if now_identity != identity {
                return if now_identity.is_none() {
                    format!("{} disappeared (kubelet stopped?)", kubelet_sock.display())
                } else {
                    format!("{} was recreated (kubelet restart)", kubelet_sock.display())
                };
            }
            if updates.has_changed().unwrap_or(false)
                && updates.borrow_and_update().endpoints() != endpoints
            {
                return "the configuration changed the served resources or their names".to_string();
            }
            if !pending.is_empty() && tokio::time::Instant::now() >= next_attempt {
                let mut failed = Vec::new();
                for served in pending {
                    match register(kubelet_sock, served).await {
                        Ok(()) => tracing::info!(
                            resource = %served.name,
                            endpoint = %endpoint(served),
                            "registered with the kubelet"
                        ),
                        Err(e) => {
                            tracing::warn!(
                                resource = %served.name,
                                retry_in = ?backoff,
                                "registration failed: {e}"
                            );
                            failed.push(served);
                        }
                    }
                }
                pending = failed;
                if !pending.is_empty() {
                    next_attempt = tokio::time::Instant::now() + backoff;
                    backoff = (backoff * 2).min(config.max_backoff);
                }
            }
            tokio::time::sleep(config.poll_interval).await;
        }
    }

    /// Stops the servers (ending ListAndWatch streams) and removes the sockets.
    async fn stop(self) {
        let _ = self.stop.send(true);
        for served in self.served {
            let abort = served.task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), served.task)
                .await
                .is_err()
            {
                abort.abort();
            }
            match std::fs::remove_file(&served.path) {
                Ok(()) => tracing::debug!(socket = %served.path.display(), "removed"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(socket = %served.path.display(), "cannot remove socket: {e}")
                }
            }
        }
    }
}

fn endpoint(served: &Served) -> String {
    served
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Why a registration failed.
#[derive(Debug, thiserror::Error)]
enum RegisterError {
    #[error("cannot connect to the kubelet: {0}")]
    Connect(#[from] tonic::transport::Error),
    #[error("the kubelet refused: {}", .0.message())]
    Refused(#[from] tonic::Status),
    #[error("the kubelet did not answer within 30 s")]
    Timeout,
}

async fn register(kubelet_sock: &Path, served: &Served) -> Result<(), RegisterError> {
    let channel = transport::channel(kubelet_sock).await?;
    let mut client = RegistrationClient::new(channel);
    let request = RegisterRequest {
        version: API_VERSION.to_string(),
        endpoint: endpoint(served),
        resource_name: served.name.clone(),
        options: Some(service::options()),
    };
    tokio::time::timeout(Duration::from_secs(30), client.register(request))
        .await
        .map_err(|_| RegisterError::Timeout)??;
    Ok(())
}
