//! The composition root: builds the whole daemon (device serving, the cluster parts, GPU
//! telemetry, the isolation audit and every optional part) and runs it.
//!
//! `dxdp plugin`, `dxdp demo`, the integration tests and the benchmarks all start the daemon
//! here, so that they run the graph production runs. The CLI only parses flags and hands
//! [`Daemon`] what it found; nothing else wires tasks.
//!
//! What is built, in order:
//! 1. the API server client ([`ClusterChoice`]), which may select a named configuration by the
//!    node's label (the configuration is resolved again with the node's labels);
//! 2. the node labels and the node watch (optional tasks, with the client);
//! 3. the metrics endpoint's Kubernetes authorizer (`metrics.authorization: kubernetes`); when
//!    it cannot be built `/metrics` answers `503` with the reason, the devices are served as
//!    usual;
//! 4. the GPU telemetry sampler and the isolation tracker, and with the client the isolation
//!    Events and taint;
//! 5. device health on the cluster side: `GPUUnhealthy` Events on the pods holding an unhealthy
//!    device, the opt-in node conditions, and `/readyz` gated on the Node's allocatable
//!    capacity (with the client; without it `/readyz` keeps its meaning and says so);
//! 6. the in-cluster validation Jobs (`validation.enabled`, with the client), and on Windows the
//!    live GPU fault events from the event log, fed into device health;
//! 7. the configuration reload;
//! 8. the device plugin ([`crate::plugin`]), which supervises all of it.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::backend::HostFactsSource;
use crate::cluster::{self, isolation_events, taint, Cluster};
use crate::config::{Config, Inputs};
use crate::plugin::tasks::{Role, TaskSpec};
use crate::plugin::{self, PluginConfig, PluginError, Reload};
use crate::telemetry::audit::{ActiveTx, Tracker};
use crate::util::retry::Backoff;

/// Where the daemon's API server client comes from.
#[derive(Debug, Clone)]
pub enum ClusterChoice {
    /// No API server: no node labels, per-node configuration, isolation Events or taint.
    Off,
    /// From the environment: `NODE_NAME` and the pod's service account (or, outside a pod,
    /// `KUBECONFIG`); without them the cluster parts are off, said once.
    FromEnvironment,
    /// This client (tests, with the API server stand-in).
    Given(Box<Cluster>),
}

/// The daemon, before it runs: what it serves and where its parts come from.
pub struct Daemon {
    plugin: PluginConfig,
    source: Arc<dyn HostFactsSource>,
    updates: Option<watch::Receiver<Arc<Config>>>,
    inputs: Option<Inputs>,
    cluster: ClusterChoice,
    host_snapshot: Option<PathBuf>,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("kubelet_dir", &self.plugin.kubelet_dir)
            .field("source", &self.source.describe())
            .field("cluster", &self.cluster)
            .field("host_snapshot", &self.host_snapshot)
            .finish()
    }
}

impl Daemon {
    /// The daemon serving `plugin.config` from the host facts of `source`, without an API
    /// server, a configuration reload or configuration updates (each added below).
    pub fn new(plugin: PluginConfig, source: Arc<dyn HostFactsSource>) -> Self {
        Daemon {
            plugin,
            source,
            updates: None,
            inputs: None,
            cluster: ClusterChoice::Off,
            host_snapshot: None,
        }
    }

    /// Takes every configuration sent on `updates` (validated, rejected whole when it cannot be
    /// served). Without it the daemon publishes its own: the reload's, when there is one.
    pub fn updates(mut self, updates: watch::Receiver<Arc<Config>>) -> Self {
        self.updates = Some(updates);
        self
    }

    /// Reads the configuration from `inputs` again when its files change (and on SIGHUP); with
    /// an API server they also select a named configuration by the node's label.
    pub fn reload(mut self, inputs: Inputs) -> Self {
        self.inputs = Some(inputs);
        self
    }

    /// Where the API server client comes from ([`ClusterChoice::Off`] unless set).
    pub fn cluster(mut self, cluster: ClusterChoice) -> Self {
        self.cluster = cluster;
        self
    }

    /// The host snapshot the host facts come from, if any (the telemetry sampler then reads
    /// its recorded counters).
    pub fn host_snapshot(mut self, path: Option<PathBuf>) -> Self {
        self.host_snapshot = path;
        self
    }

    /// Builds every part and runs the daemon until `stop` completes (see
    /// [`plugin::run_with_updates`]).
    pub async fn run(self, stop: impl Future<Output = ()>) -> Result<(), PluginError> {
        let Daemon {
            mut plugin,
            source,
            updates,
            mut inputs,
            cluster,
            host_snapshot,
        } = self;
        let mut config = plugin.config.clone();
        let safety_poll = plugin.safety_poll;
        // The served inventory, for the node labels and the telemetry sampler.
        let (tap_tx, tap_rx) = watch::channel(None);
        plugin.inventory_tap = Some(tap_tx);

        // 1-2. The API server and the node.
        let cluster_asked = !matches!(cluster, ClusterChoice::Off);
        let client = match cluster {
            ClusterChoice::Off => None,
            ClusterChoice::FromEnvironment => connect(&config).await,
            ClusterChoice::Given(c) => Some(*c),
        };
        let mut node_rx = None;
        if let Some(cluster) = &client {
            let node = read_node(cluster).await;
            if let (Some(inputs), Some(node)) = (inputs.as_mut(), node) {
                inputs.node = Some(node);
                // The selection is logged once, below, with or without the API server.
                config = resolve_within(inputs.clone()).await?;
            }
            let initial = inputs.as_ref().and_then(|i| i.node.clone());
            let (node_tx, rx) = watch::channel(initial);
            let (c, node, tap) = (cluster.clone(), rx.clone(), tap_rx.clone());
            plugin
                .tasks
                .push(TaskSpec::new("node-labels", Role::Optional, move || {
                    cluster::labels::keep(c.clone(), tap.clone(), node.clone(), API_BACKOFF)
                }));
            let c = cluster.clone();
            plugin
                .tasks
                .push(TaskSpec::new("node-watch", Role::Optional, move || {
                    cluster::node::follow(c.clone(), node_tx.clone(), API_BACKOFF, safety_poll)
                }));
            node_rx = Some(rx);
        }

        // 3. Who may read /metrics.
        if config.metrics_authorization == crate::config::file::MetricsAuthorization::Kubernetes
            && plugin.metrics_authorizer.is_none()
        {
            plugin.metrics_authorizer =
                Some(match cluster::metrics_authz::KubernetesAuthorizer::connect().await {
                    Ok(a) => Ok(Arc::new(a)),
                    Err(e) => Err(format!(
                        "dxdp cannot use the API server: {e}; give it credentials (the chart mounts the service account token with metrics.authorization=kubernetes) or set metrics.authorization: none"
                    )),
                });
        }

        // A named configuration the node's label selected falls back to the top level when it
        // cannot be served on this host.
        if let Some(inputs) = inputs.as_ref() {
            if config.selection.name.is_some() && config.selection.by.is_node_label() {
                let mut top = inputs.clone();
                top.node = None;
                plugin.fallback = resolve_within(top).await.ok();
            }
        }
        // How the configuration was built, and which named configuration applies and why.
        for n in &config.notices {
            tracing::warn!("{n}");
        }
        if let Some(w) = &config.selection.warning {
            tracing::warn!("{w}");
        }
        tracing::info!(
            configuration = config.selection.name.as_deref().unwrap_or("default"),
            reason = %config.selection.reason,
            "configuration selected; validated before it is served"
        );
        plugin.config = config.clone();
        let (own_tx, updates) = match updates {
            Some(rx) => (None, rx),
            None => {
                let (tx, rx) = watch::channel(Arc::new(config));
                (Some(tx), rx)
            }
        };

        // 4. Telemetry and the isolation audit.
        let active = telemetry_tasks(&mut plugin, &tap_rx, &updates, host_snapshot);
        match &client {
            Some(cluster) => isolation_tasks(&mut plugin, cluster, &active, &updates),
            None => say_isolation_without_cluster(&updates, active.borrow().is_none()),
        }

        // 5. Device health on the cluster side: Events on the pods, node conditions, readiness
        // on the Node's capacity.
        match (&client, &node_rx) {
            (Some(cluster), Some(node)) => {
                health_tasks(&mut plugin, cluster, &tap_rx, node, &active, &updates)
            }
            // Without a client by choice (`dxdp demo`, tests) there is nothing to say.
            _ if cluster_asked => say_health_without_cluster(&plugin, &updates),
            _ => {}
        }

        // 6. In-cluster validation (opt-in).
        match &client {
            Some(cluster) => validation_task(&mut plugin, cluster, &tap_rx, &updates),
            None if updates.borrow().validation.enabled => tracing::warn!("validation.enabled is true, but dxdp has no API server client (no NODE_NAME or credentials, see above; the chart needs nodeApi.enabled): no validation Jobs"),
            None => {}
        }

        // Live GPU fault events from the Windows event log (display-driver resets), fed into the
        // devices' health (docs/health.md); a host snapshot brings its own recorded `faults`.
        let source = if source.is_simulated() {
            source
        } else {
            match crate::backend::native_event_log() {
                Ok(log) => {
                    let (wrapped, task) = plugin::faults::live_faults(
                        source,
                        log,
                        updates.clone(),
                        plugin.observe.metrics.clone(),
                        API_BACKOFF,
                    );
                    plugin.tasks.push(task);
                    wrapped
                }
                Err(why) => {
                    tracing::info!("live GPU fault events are off: {why}");
                    source
                }
            }
        };

        // 7. The configuration reload (it publishes on the daemon's own channel).
        let keep = match (inputs, own_tx) {
            (Some(inputs), Some(tx)) if plugin.reload.is_none() => {
                plugin.reload = Some(Reload {
                    inputs,
                    tx,
                    node: node_rx,
                });
                None
            }
            (_, tx) => tx,
        };

        // 8. The device plugin, which supervises every task above.
        let result = plugin::run_with_updates(plugin, source, updates, stop).await;
        drop(keep);
        result
    }
}

/// Adds the GPU telemetry task (when telemetry can be built) and returns the channel of the
/// isolation violations it finds. Without telemetry none can be known, which the channel says
/// at once (the node taint needs to hear it).
fn telemetry_tasks(
    plugin: &mut PluginConfig,
    tap_rx: &watch::Receiver<Option<Arc<crate::inventory::Inventory>>>,
    updates: &watch::Receiver<Arc<Config>>,
    host_snapshot: Option<PathBuf>,
) -> ActiveTx {
    use crate::telemetry::sampler;
    let build = {
        let (tap_rx, updates) = (tap_rx.clone(), updates.clone());
        let dir = plugin.kubelet_dir.clone();
        let metrics = plugin.observe.metrics.telemetry().clone();
        move || {
            sampler::build(
                sampler::Devices::Daemon(tap_rx.clone()),
                updates.clone(),
                host_snapshot.as_deref(),
                &dir,
                metrics.clone(),
            )
        }
    };
    let first = build();
    let active: ActiveTx = Arc::new(watch::Sender::new(
        first.is_none().then(|| Arc::new(Vec::new())),
    ));
    if first.is_none() {
        return active;
    }
    // Built again on every restart: a sampler holds its source's state.
    let mut first = first;
    let isolation = plugin.observe.metrics.isolation().clone();
    let (tracked, config) = (active.clone(), updates.clone());
    plugin
        .tasks
        .push(TaskSpec::new("telemetry", Role::Optional, move || {
            let sampler = first.take().or_else(&build);
            let tracker = Tracker::new(isolation.clone(), tracked.clone());
            let config = config.clone();
            async move {
                if let Some(sampler) = sampler {
                    sampler::run_with(sampler, Some(tracker), std::future::pending::<()>()).await;
                } else {
                    // No sample can be judged: the violations it took over end when they are
                    // stale (no taint stays for what is unknown).
                    tracker.expire_when_stale(config).await;
                }
                // Ended (or could not be built again): the supervisor restarts it.
            }
        }));
    active
}

/// Adds the isolation Events and the node taint (optional tasks, with the API server).
fn isolation_tasks(
    plugin: &mut PluginConfig,
    cluster: &Cluster,
    active: &ActiveTx,
    updates: &watch::Receiver<Arc<Config>>,
) {
    let metrics = plugin.observe.metrics.isolation().clone();
    let (c, rx, config, m) = (
        cluster.clone(),
        active.subscribe(),
        updates.clone(),
        metrics.clone(),
    );
    plugin.tasks.push(TaskSpec::new(
        "isolation-events",
        Role::Optional,
        move || {
            isolation_events::report_events(
                c.clone(),
                rx.clone(),
                config.clone(),
                m.clone(),
                cluster::events::EVENT_LIMITS,
                API_BACKOFF,
            )
        },
    ));
    let (c, rx, config) = (cluster.clone(), active.subscribe(), updates.clone());
    plugin.tasks.push(TaskSpec::new(
        "isolation-taint",
        Role::Optional,
        move || {
            taint::keep_taint(
                c.clone(),
                rx.clone(),
                config.clone(),
                metrics.clone(),
                API_BACKOFF,
                taint::TAINT_START_GRACE,
                taint::TAINT_MIN_HOLD,
            )
        },
    ));
}

/// Adds the `GPUUnhealthy` Events, the node conditions and the readiness capacity gate
/// (optional tasks, with the API server and the Node watch).
fn health_tasks(
    plugin: &mut PluginConfig,
    cluster: &Cluster,
    inventory: &watch::Receiver<Option<Arc<crate::inventory::Inventory>>>,
    node: &watch::Receiver<Option<crate::config::NodeInfo>>,
    active: &ActiveTx,
    updates: &watch::Receiver<Arc<Config>>,
) {
    let metrics = plugin.observe.metrics.device_health().clone();
    let events = cluster::health_events::HealthEvents {
        cluster: cluster.clone(),
        inventory: inventory.clone(),
        config: updates.clone(),
        kubelet_dir: plugin.kubelet_dir.clone(),
        metrics: metrics.clone(),
        limits: cluster::events::EVENT_LIMITS,
        backoff: API_BACKOFF,
        clock: cluster::health_events::now_ms,
    };
    let conditions = cluster::conditions::NodeConditions {
        cluster: cluster.clone(),
        inventory: inventory.clone(),
        active: active.subscribe(),
        config: updates.clone(),
        metrics,
        backoff: API_BACKOFF,
        resync: cluster::conditions::RESYNC,
    };
    let gate = cluster::capacity::CapacityGate {
        node: node.clone(),
        inventory: inventory.clone(),
        readiness: plugin.observe.readiness.clone(),
        first_read_grace: cluster::capacity::FIRST_READ_GRACE,
    };
    plugin
        .tasks
        .push(TaskSpec::new("health-events", Role::Optional, move || {
            events.clone().run()
        }));
    plugin.tasks.push(TaskSpec::new(
        "node-conditions",
        Role::Optional,
        move || conditions.clone().run(),
    ));
    plugin.tasks.push(TaskSpec::new(
        "readiness-capacity",
        Role::Optional,
        move || gate.clone().run(),
    ));
}

/// Adds the validation task (optional; it does nothing while `validation.enabled` is off).
fn validation_task(
    plugin: &mut PluginConfig,
    cluster: &Cluster,
    inventory: &watch::Receiver<Option<Arc<crate::inventory::Inventory>>>,
    updates: &watch::Receiver<Arc<Config>>,
) {
    let task = cluster::validation_task::ValidationTask {
        cluster: cluster.clone(),
        namespace: std::env::var(cluster::validation_task::NAMESPACE_VAR)
            .ok()
            .filter(|n| !n.trim().is_empty()),
        inventory: inventory.clone(),
        config: updates.clone(),
        readiness: plugin.observe.readiness.clone(),
        metrics: plugin.observe.metrics.validation().clone(),
        exe: std::env::current_exe().unwrap_or_default(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        backoff: API_BACKOFF,
        timing: cluster::validation_task::TIMING,
        done: None,
    };
    plugin
        .tasks
        .push(TaskSpec::new("validation", Role::Optional, move || {
            task.clone().run()
        }));
}

/// Says once, at start, what device health cannot do without the API server, and tells
/// `/readyz` that the Node's capacity is not checked.
fn say_health_without_cluster(plugin: &PluginConfig, updates: &watch::Receiver<Arc<Config>>) {
    let c = updates.borrow().clone();
    if c.health_reports.events || c.health_reports.node_conditions {
        tracing::info!("GPUUnhealthy Events and node conditions are off: dxdp has no API server client (no NODE_NAME or credentials; the chart needs nodeApi.enabled); device health is logged and counted only");
    }
    tracing::info!(
        "/readyz does not check the Node's allocatable capacity: dxdp has no API server client"
    );
    plugin
        .observe
        .readiness
        .set_capacity(crate::observe::state::Capacity::NotChecked(
            cluster::capacity::NO_CLIENT.into(),
        ));
}

/// Says once, at start, what the isolation audit cannot do without the API server.
fn say_isolation_without_cluster(updates: &watch::Receiver<Arc<Config>>, telemetry_on: bool) {
    let c = updates.borrow().clone();
    if c.isolation.policy == crate::config::file::IsolationPolicy::Taint {
        tracing::warn!("isolation.policy is taint, but dxdp has no API server client (no NODE_NAME or credentials, see the line above; the chart needs nodeApi.enabled): the node is never tainted, violations are only logged and counted");
    } else if c.isolation.events && telemetry_on {
        tracing::info!("GPU isolation Events are off: dxdp has no API server client (no NODE_NAME or credentials; the chart needs nodeApi.enabled); violations are logged and counted only");
    }
}

/// Retries of API server calls (node labels, following the node, isolation Events and taint):
/// 1 s doubling to 60 s, with jitter.
pub const API_BACKOFF: Backoff = Backoff {
    initial: Duration::from_secs(1),
    max: Duration::from_secs(60),
    timeout: Duration::from_secs(30),
};

/// How long the start waits for the node's labels (they select the named configuration).
const NODE_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects to the API server when `NODE_NAME` and credentials are there, else says once why
/// not.
async fn connect(config: &Config) -> Option<Cluster> {
    let node_name = std::env::var(cluster::NODE_NAME_VAR).ok();
    let cluster = match Cluster::connect(node_name.as_deref()).await {
        Ok(c) => c,
        Err(why) => {
            tracing::info!("node labels and per-node configuration are off: {why}");
            return None;
        }
    };
    if config.node_labels.enabled {
        tracing::info!(node = %cluster.node(), prefix = %config.node_labels.prefix, "node labels on");
    } else {
        tracing::info!(node = %cluster.node(), "node labels off (nodeLabels.enabled: false)");
    }
    Some(cluster)
}

/// Reads the node (its labels select the named configuration), within
/// [`NODE_READ_TIMEOUT`]; `None` (said once) when the API server cannot tell in time.
async fn read_node(cluster: &Cluster) -> Option<crate::config::NodeInfo> {
    match tokio::time::timeout(NODE_READ_TIMEOUT, cluster.get()).await {
        Ok(Ok(info)) => Some(info),
        Ok(Err(e)) => {
            tracing::warn!(
                "cannot read the node's labels yet, starting with the default configuration: {e}"
            );
            None
        }
        Err(_) => {
            tracing::warn!(node = %cluster.node(), "the API server did not answer within {NODE_READ_TIMEOUT:?}; starting with the default configuration");
            None
        }
    }
}

/// Resolves the configuration (reading its files) on a blocking thread with the read limit.
async fn resolve_within(inputs: Inputs) -> Result<Config, PluginError> {
    let what = "reading the configuration";
    crate::util::bounded::run_blocking(plugin::DEFAULT_READ_LIMIT, what, move || inputs.resolve())
        .await
        .map_err(|e| PluginError::Configuration(e.to_string()))?
        .map_err(|e| PluginError::Configuration(e.to_string()))
}
