//! Observability of the daemon: Prometheus metrics ([`metrics`], GPU telemetry in
//! `telemetry_metrics`, the GPU isolation audit in [`isolation_metrics`], the outcome of
//! Events in [`event_metrics`]), what `/healthz` and `/readyz` answer ([`state`]), the HTTP
//! server that serves them ([`http`]) and the endpoint task with its guard (`endpoint`).
//!
//! One [`Observe`] handle is made per daemon and passed to it through
//! [`crate::plugin::PluginConfig`]; the daemon's parts record into it, the server reads it. It
//! is cheap to clone (shared state behind `Arc`s) and costs a few atomic updates per event
//! when no server is listening.

pub mod access;
pub(crate) mod cardinality;
pub mod device_health;
pub(crate) mod endpoint;
pub mod event_metrics;
pub mod http;
pub mod isolation_metrics;
pub(crate) mod label_metrics;
pub mod metrics;
pub mod overuse_metrics;
pub(crate) mod podinfo;
pub mod remediation_metrics;
pub(crate) mod review_metrics;
pub mod state;
pub(crate) mod telemetry_metrics;
pub(crate) mod validation;
pub(crate) mod verifier;
pub mod web;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use metrics::Metrics;
use state::{Health, Phase, Readiness};

/// Everything the daemon records and the endpoints serve.
#[derive(Debug, Clone)]
pub struct Observe {
    /// The Prometheus metrics.
    pub metrics: Metrics,
    /// Whether every served resource is registered with the kubelet, and why not.
    pub readiness: Readiness,
    /// Whether the daemon's supervisor is alive.
    pub health: Health,
    listening: Arc<watch::Sender<Option<SocketAddr>>>,
    /// Serialises reading the readiness and setting `dxdp_kubelet_registered`, so that two
    /// reports racing cannot leave the gauge at the older state.
    sync: Arc<Mutex<()>>,
}

impl Default for Observe {
    fn default() -> Self {
        Observe::new()
    }
}

impl Observe {
    /// A fresh handle: empty metrics, not ready, starting.
    pub fn new() -> Self {
        Observe {
            metrics: Metrics::new(),
            readiness: Readiness::default(),
            health: Health::default(),
            listening: Arc::new(watch::Sender::new(None)),
            sync: Arc::default(),
        }
    }

    /// The address the HTTP server listens on, once it does (`None` while it does not).
    pub fn listening(&self) -> watch::Receiver<Option<SocketAddr>> {
        self.listening.subscribe()
    }

    pub(crate) fn set_listening(&self, address: Option<SocketAddr>) {
        self.listening.send_replace(address);
    }

    /// The daemon's phase changed.
    pub fn phase(&self, phase: Phase) {
        self.health.set_phase(phase);
        self.readiness.set_phase(phase);
        self.sync_registered();
    }

    /// The served names changed.
    pub fn wanted(&self, names: Vec<String>) {
        for name in &names {
            self.metrics.init_resource(name);
        }
        self.readiness.set_wanted(names);
        self.sync_registered();
    }

    /// `kubelet.sock` is missing (`Some`) or exists (`None`).
    pub fn kubelet_missing(&self, socket: Option<&Path>) {
        self.readiness.set_kubelet_missing(socket);
        self.sync_registered();
    }

    /// A device-plugin server of `name` listens and starts registering.
    pub fn server_started(&self, name: &str, generation: u64) {
        self.readiness.server_started(name, generation);
        self.sync_registered();
    }

    /// A device-plugin server of `name` could not listen.
    pub(crate) fn server_not_listening(&self, name: &str, why: String) {
        self.readiness.server_not_listening(name, why);
        self.sync_registered();
    }

    /// The device-plugin server `generation` of `name` stopped.
    pub(crate) fn server_stopped(&self, name: &str, generation: u64) {
        self.readiness.server_stopped(name, generation);
        self.sync_registered();
    }

    /// A Register call of server `generation` of `name` ended.
    pub fn registration(&self, name: &str, generation: u64, result: Result<(), String>) {
        self.metrics.registration(name, result.is_ok());
        if self.readiness.registration(name, generation, result) {
            self.sync_registered();
        }
    }

    /// The kubelet watches (`true`) or stopped watching (`false`) the device list of server
    /// `generation` of `name`.
    pub fn watching(&self, name: &str, generation: u64, watching: bool) {
        self.readiness.watching(name, generation, watching);
    }

    /// The supervised task `name` runs.
    pub(crate) fn task_up(&self, name: &str) {
        self.metrics.set_task_up(name, true);
        self.health.task_up(name);
    }

    /// The supervised task `name` stopped for `reason` and waits to be restarted; a required
    /// one fails `/healthz` meanwhile.
    pub(crate) fn task_down(&self, name: &str, required: bool, reason: &str) {
        self.metrics.set_task_up(name, false);
        if required {
            self.health.task_down(name, reason);
        }
    }

    fn sync_registered(&self) {
        let _serial = self.sync.lock().unwrap_or_else(|p| p.into_inner());
        let (served, registered) = self.readiness.registered();
        self.metrics.set_registered(&served, &registered);
    }
}
