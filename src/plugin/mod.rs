//! Device serving, one feature of the daemon: serves every enabled resource to the kubelet and heals itself after
//! kubelet restarts, removed sockets, dead servers, device changes, configuration reloads and
//! tasks that end or panic.
//!
//! By job:
//! - `serve`: serving's start, its supervised tasks and its main loop;
//! - `servers`: one socket, gRPC server and registration per served name;
//! - [`answer`]: the generated `v1beta1.DevicePlugin` server, with Allocate answers
//!   pre-encoded;
//! - `file_watch`: the one file-watch component (re-watch, rescan, safety tick);
//! - [`claim`]: one daemon per kubelet directory (lock), socket names, stale sockets;
//! - [`servable`]: whether a configuration can be served, at start and on reload;
//! - [`refresher`]: the devices served (`crate::inventory`), refreshed on host events;
//! - `faults`: live GPU fault events from the Windows event log, fed into the inventory;
//! - `reload`: configuration hot reload;
//! - `register`: `Register` calls with fast retry and backoff;
//! - [`service`]: the gRPC service.

pub mod answer;
pub mod claim;
pub(crate) mod file_watch;
pub mod refresher;
pub(crate) mod register;
pub(crate) mod reload;
pub mod servable;
pub(crate) mod serve;
pub(crate) mod servers;
pub mod service;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch as channel;

use crate::backend::SourceError;
use crate::config::{Config, Inputs, NodeInfo, Resolved};
use crate::observe::Observe;
use crate::transport::Transport;
use crate::util::retry::Backoff;
use servable::Unservable;

/// The configuration reload the daemon runs (and supervises): where the configuration comes
/// from, and where new ones are published.
#[derive(Debug, Clone)]
pub(crate) struct Reload {
    /// The configuration's inputs (files, environment, flags, the node).
    pub(crate) inputs: Inputs,
    /// Where new configurations are published (the daemon reads them from its `updates`).
    pub(crate) tx: channel::Sender<Arc<Config>>,
    /// The node's labels, when the API server is followed (they select a named configuration).
    pub(crate) node: Option<channel::Receiver<Option<NodeInfo>>>,
    /// The notices of the configuration in force, logged at start: a reload logs new ones only.
    pub(crate) logged: Vec<String>,
    /// Where each configuration read from the inputs and served is kept on the host (none:
    /// nothing is kept).
    pub(crate) kept: Option<crate::config::kept::KeptConfig>,
    /// Why the configuration was rejected at start, while the last-served one kept on the
    /// host is served instead (`/readyz` fails until a configuration read is served). Shared by
    /// the task's restarts: cleared once.
    pub(crate) fallback: Arc<std::sync::Mutex<Option<String>>>,
}

/// How the daemon runs.
#[derive(Debug)]
pub struct PluginConfig {
    /// The kubelet's device-plugin directory (holds `kubelet.sock`).
    pub kubelet_dir: PathBuf,
    /// The configuration at start (resources, names, replicas, pipeline, assignment), with how
    /// it was resolved (logged at start).
    pub config: Resolved,
    /// The slow safety poll: how often sockets, `kubelet.sock`, the configuration and host facts
    /// without change events (device health on Windows) are checked anyway.
    pub safety_poll: Duration,
    /// Registration retries.
    pub backoff: Backoff,
    /// Metrics, health and readiness: recorded by the daemon, served on
    /// `config.metrics_address` when set.
    pub observe: Observe,
    /// The file watch every part of the daemon shares.
    pub(crate) file_watch: file_watch::FileWatch,
    /// Where the lock of the kubelet directory is kept (`claim::lock_dir`).
    pub lock_dir: PathBuf,
    /// How the plugin's sockets are bound and `kubelet.sock` is dialled: AF_UNIX, always, for
    /// the `dxdp` binary; [`Transport::Loopback`] only for tests that run where AF_UNIX is
    /// missing (Wine).
    pub transport: Transport,
    /// How long one read of the host facts or the configuration may take: past it the daemon
    /// goes on without it (the last good state stays) and `/healthz` fails until it returns.
    pub read_limit: Duration,
    /// How long the start (configuration checks, the first host read, the device-plugin servers up)
    /// may take: past it, while still starting, `/healthz` fails with what the start is doing.
    pub start_deadline: Duration,
    /// How often a metrics endpoint whose guard could not be set up tries again
    /// (`crate::observe::endpoint::GUARD_RETRY`).
    pub guard_retry: Duration,
}

/// The default safety poll.
pub(crate) const DEFAULT_SAFETY_POLL: Duration = Duration::from_secs(10);

/// The default [`PluginConfig::read_limit`]: a host read takes milliseconds (a few seconds for
/// a host scan on a busy Windows node); 30 s is a hung file system or driver.
pub const DEFAULT_READ_LIMIT: Duration = Duration::from_secs(30);

/// The default [`PluginConfig::start_deadline`]: a start takes under a second; with the chart's
/// liveness probe (every 30 s, 3 failures) a start hung for 60 s restarts the container about
/// two minutes later.
pub(crate) const DEFAULT_START_DEADLINE: Duration = Duration::from_secs(60);

impl PluginConfig {
    /// Defaults for `kubelet_dir`: both resources, one replica, a 10 s safety poll, registration
    /// retried from 0.5 s up to 30 s with a 30 s timeout per call.
    pub fn new(kubelet_dir: PathBuf) -> Self {
        PluginConfig {
            kubelet_dir,
            config: Resolved::default(),
            safety_poll: DEFAULT_SAFETY_POLL,
            backoff: Backoff {
                initial: Duration::from_millis(500),
                max: Duration::from_secs(30),
                timeout: Duration::from_secs(30),
            },
            observe: Observe::new(),
            file_watch: file_watch::FileWatch::new(),
            lock_dir: claim::lock_dir(),
            transport: Transport::UnixSocket,
            read_limit: DEFAULT_READ_LIMIT,
            start_deadline: DEFAULT_START_DEADLINE,
            guard_retry: crate::observe::endpoint::GUARD_RETRY,
        }
    }
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
    /// The kubelet directory's lock cannot be taken.
    #[error(transparent)]
    Lock(#[from] claim::LockError),
    /// Another live dxdp serves the same resource in the same directory.
    #[error("another dxdp is already serving {resource} at {} (it answers on that socket): stop it first, or use a different --kubelet-dir", socket.display())]
    AlreadyServed {
        /// The resource name.
        resource: String,
        /// Its live socket.
        socket: PathBuf,
    },
    /// A required task kept failing.
    #[error(transparent)]
    Task(#[from] crate::supervisor::Fatal),
    /// The configuration could not be read again with the node's labels (at start, with the
    /// API server).
    #[error("{0}")]
    Configuration(String),
}

impl From<SourceError> for PluginError {
    fn from(e: SourceError) -> Self {
        PluginError::Facts(e)
    }
}

#[cfg(test)]
mod tests;
