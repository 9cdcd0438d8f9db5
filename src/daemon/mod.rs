//! The composition root: builds the daemon's one context and every feature's tasks, and runs
//! them under one supervisor.
//!
//! `dxdp plugin`, `dxdp demo`, the integration tests and the benchmarks all start the daemon
//! here, so that they run the graph production runs. The CLI only parses flags and hands
//! [`Daemon`] what it found; nothing else wires tasks.
//!
//! What is built, in order:
//! 1. the API server client ([`ClusterChoice`], built once: the node's labels, the cluster
//!    features and the metrics authorizer all use it), which may select a named configuration
//!    by the node's label (the configuration is resolved again with the node's labels);
//! 2. the lock of the kubelet directory (one daemon per directory), then the metrics and probe
//!    endpoints (they answer from the first moment; a guard that cannot be set up answers
//!    `503` with the reason, the devices are served as usual);
//! 3. on Windows the live GPU fault events from the event log, fed into device health;
//! 4. device serving's start (`plugin::serve::start`): the first host read and the check that
//!    the configuration can be served (with the top-level fallback);
//! 5. the context: the validated configuration channel and the inventory channel, which
//!    every feature reads (no task copies one channel into another);
//! 6. each feature's tasks: serving (refresher, device gauges, configuration reload), the node
//!    labels and the node watch, GPU telemetry and the isolation audit (Events, taint), device
//!    health on the cluster side (Events, node conditions, `/readyz` on the Node's capacity),
//!    the in-cluster validation Jobs;
//! 7. serving's main loop (`plugin::serve::run`) with the supervisor, until the stop.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::backend::eventlog::EventLog;
use crate::backend::HostFactsSource;
use crate::cluster::{self, isolation_events, taint, Cluster};
use crate::config::{Config, Inputs, NodeInfo, Resolved};
use crate::inventory::InventoryRx;
use crate::observe::endpoint::Guard;
use crate::observe::state::Phase;
use crate::observe::Observe;
use crate::plugin::{self, claim, serve, PluginConfig, PluginError, Reload};
use crate::supervisor::{Role, TaskSpec, Tasks};
use crate::telemetry::audit::{ActiveTx, Tracker};
use crate::util::retry::Backoff;

/// Where the daemon's API server client comes from.
#[derive(Debug, Clone)]
pub enum ClusterChoice {
    /// No API server: no node labels, per-node configuration, isolation Events or taint.
    Off,
    /// From the environment: `NODE_NAME` (of the inputs' environment, [`Daemon::reload`]) and the
    /// pod's service account (or, outside a pod, `KUBECONFIG`); without them the cluster parts
    /// are off, said once.
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
    fallback: Option<Config>,
    event_log: Option<Arc<dyn EventLog>>,
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

/// What every feature of the running daemon reads: built once by [`Daemon::run`].
struct Context {
    /// The configuration in force: only what passed the serving check (at start and on every
    /// update); a rejected configuration never reaches a feature.
    config: watch::Receiver<Arc<Config>>,
    /// The inventory served (devices and the configuration they were made with).
    inventory: InventoryRx,
    /// Metrics, health and readiness.
    observe: Observe,
    /// The API server client, when there is one.
    cluster: Option<Cluster>,
    /// The node's labels, followed when there is an API server client.
    node: Option<watch::Receiver<Option<NodeInfo>>>,
    /// The kubelet's device-plugin directory.
    kubelet_dir: PathBuf,
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
            fallback: None,
            event_log: None,
        }
    }

    /// Takes every configuration sent on `updates` (validated, rejected whole when it cannot be
    /// served). Without it the daemon publishes its own: the reload's, when there is one.
    pub fn updates(mut self, updates: watch::Receiver<Arc<Config>>) -> Self {
        self.updates = Some(updates);
        self
    }

    /// Reads the configuration from `inputs` again when its files change (and on SIGHUP); with
    /// an API server they also select a named configuration by the node's label. Not with
    /// [`Daemon::updates`], whose sender publishes the configurations instead.
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

    /// What is served instead when the configuration cannot be served on this host. Without
    /// it, a configuration the node's label selected falls back to the top level of its inputs
    /// (the configuration at start, resolved without the node); any other configuration that
    /// cannot be served is an error at start.
    pub fn fallback(mut self, top: Config) -> Self {
        self.fallback = Some(top);
        self
    }

    /// Follows GPU fault events in `log`, whatever the host facts' source. Without it the
    /// machine's own event log is followed (Windows' `wevtapi.dll`; none elsewhere), and none
    /// for host snapshots and the sample host, which bring their recorded faults.
    pub fn event_log(mut self, log: Arc<dyn EventLog>) -> Self {
        self.event_log = Some(log);
        self
    }

    /// Builds every part and runs the daemon until `stop` completes, then ends every stream,
    /// removes its sockets and stops every task.
    pub async fn run(self, stop: impl Future<Output = ()>) -> Result<(), PluginError> {
        let Daemon {
            plugin,
            source,
            updates,
            mut inputs,
            cluster,
            host_snapshot,
            fallback,
            event_log,
        } = self;
        let observe = plugin.observe.clone();
        // Says "stopped" to the probes however this function ends.
        let _stopped = StoppedOnDrop(observe.clone());
        observe.phase(Phase::Starting);
        observe.health.start_deadline(plugin.start_deadline);
        tokio::pin!(stop);
        let mut config = plugin.config.clone();
        let safety_poll = plugin.safety_poll;
        // The variables that are inputs of the daemon (`NODE_NAME`, `POD_NAMESPACE`), as the
        // configuration's environment has them.
        let env = inputs.as_ref().map(|i| i.env.clone()).unwrap_or_default();

        // 1. The API server and the node.
        let cluster_asked = !matches!(cluster, ClusterChoice::Off);
        let client = match cluster {
            ClusterChoice::Off => None,
            ClusterChoice::FromEnvironment => {
                connect(&config, env.get(cluster::NODE_NAME_VAR)).await
            }
            ClusterChoice::Given(c) => Some(*c),
        };
        let mut node = None;
        if let Some(cluster) = &client {
            let read = read_node(cluster).await;
            if let (Some(inputs), Some(read)) = (inputs.as_mut(), read) {
                inputs.node = Some(read);
                // The selection is logged once, below, with or without the API server.
                config = resolve_within(inputs).await?;
            }
            let initial = inputs.as_ref().and_then(|i| i.node.clone());
            node = Some(watch::channel(initial));
        }
        // A named configuration the node's label selected falls back to the top level (the
        // configuration at start, resolved without the node) when it cannot be served here.
        let fallback = match fallback {
            Some(top) => Some(top),
            None if config.selection.name.is_some() && config.selection.by.is_node_label() => {
                Some(plugin.config.config.clone())
            }
            None => None,
        };
        // How the configuration was built, and which named configuration applies and why.
        for n in &config.notices {
            tracing::warn!("{n}");
        }
        let logged = config.notices.clone();
        if let Some(w) = &config.selection.warning {
            tracing::warn!("{w}");
        }
        tracing::info!(
            configuration = config.selection.name.as_deref().unwrap_or("default"),
            reason = %config.selection.reason,
            "configuration selected; validated before it is served"
        );
        // The configurations published (by the reload, or the caller's: then its latest is the
        // first), and the one in force.
        let (own_tx, mut updates) = match updates {
            Some(rx) => (None, rx),
            None => {
                let (tx, rx) = watch::channel(Arc::new(config.config));
                (Some(tx), rx)
            }
        };
        let first = updates.borrow_and_update().clone();
        let (config_tx, config_rx) = watch::channel(first.clone());

        // 2. One daemon per kubelet directory; the endpoints answer from the first moment.
        observe.health.start_step("locking the kubelet directory");
        let _lock = claim::lock(&plugin.lock_dir, &plugin.kubelet_dir)?;
        let mut tasks = Tasks::new(observe.clone());
        let reviewer = (client.as_ref(), cluster_asked);
        for spec in endpoint_tasks(&first, &observe, reviewer, plugin.guard_retry).await {
            tasks.spawn(spec);
        }

        // 3. Live GPU fault events from the Windows event log (display-driver resets), fed into
        // the devices' health (docs/health.md); a host snapshot brings its own recorded `faults`.
        let mut specs = Vec::new();
        let log = match event_log {
            Some(log) => Some(Ok(log)),
            None if source.is_simulated() => None,
            None => Some(crate::backend::native_event_log()),
        };
        let source = match log {
            None => source,
            Some(log) => match log {
                Ok(log) => {
                    let (wrapped, task) = plugin::faults::live_faults(
                        source,
                        log,
                        config_rx.clone(),
                        observe.metrics.clone(),
                        API_BACKOFF,
                    );
                    specs.push(task);
                    wrapped
                }
                Err(why) => {
                    tracing::info!("live GPU fault events are off: {why}");
                    source
                }
            },
        };

        // 4. Device serving's start: the first host read, the configuration checked on it.
        let started = serve::start(&plugin, &source, first.clone(), fallback, stop.as_mut());
        let Some((mut started, inventory)) = started.await? else {
            tasks.shutdown().await;
            return Ok(());
        };
        if !Arc::ptr_eq(&started.config, &first) {
            // The top level instead of the selected configuration: what the reload compares
            // against, and what is in force.
            if let Some(tx) = &own_tx {
                tx.send_replace(started.config.clone());
                updates.borrow_and_update();
            }
            config_tx.send_replace(started.config.clone());
        }

        // 5. The context every feature reads.
        let (inventory_tx, inventory_rx) = watch::channel(Arc::new(inventory));
        let ctx = Context {
            config: config_rx.clone(),
            inventory: inventory_rx,
            observe: observe.clone(),
            cluster: client,
            node: node.as_ref().map(|(_, rx)| rx.clone()),
            kubelet_dir: plugin.kubelet_dir.clone(),
        };

        // 6. Every feature's tasks.
        let reload = match (inputs, own_tx) {
            (Some(inputs), Some(tx)) => Some(Reload {
                inputs,
                tx,
                node: ctx.node.clone(),
                logged,
            }),
            _ => None,
        };
        specs.extend(serve::tasks(
            &mut started,
            &plugin,
            source,
            config_rx,
            inventory_tx,
            reload,
        ));
        if let Some((node_tx, _)) = node {
            specs.extend(node_tasks(&ctx, node_tx, safety_poll));
        }
        let active = telemetry_tasks(&ctx, host_snapshot, &mut specs);
        match &ctx.cluster {
            Some(cluster) => isolation_tasks(&ctx, cluster, &active, &mut specs),
            None => say_isolation_without_cluster(&ctx.config, active.borrow().is_none()),
        }
        match (&ctx.cluster, &ctx.node) {
            (Some(cluster), Some(node)) => health_tasks(&ctx, cluster, node, &active, &mut specs),
            // Without a client by choice (`dxdp demo`, tests) there is nothing to say.
            _ if cluster_asked => say_health_without_cluster(&ctx),
            _ => {}
        }
        match &ctx.cluster {
            Some(cluster) => specs.push(validation_task(&ctx, cluster, &env)),
            None if ctx.config.borrow().validation.enabled => tracing::warn!("validation.enabled is true, but dxdp has no API server client (no NODE_NAME or credentials, see above; the chart needs nodeApi.enabled): no validation Jobs"),
            None => {}
        }
        for spec in specs {
            tasks.spawn(spec);
        }

        // 7. Serve until the stop.
        serve::run(
            &plugin,
            started,
            &mut tasks,
            ctx.inventory.clone(),
            updates,
            config_tx,
            stop,
        )
        .await
    }
}

/// How long the runtime's blocking threads (a host read hung in the OS) may hold up the
/// process's exit once the daemon has stopped: [`stop_runtime`].
pub(crate) const RUNTIME_STOP_LIMIT: Duration = Duration::from_secs(2);

/// Shuts `runtime` down once the daemon has returned, waiting at most `RUNTIME_STOP_LIMIT`
/// for its blocking threads (dropping a runtime waits for them without limit, so one read hung
/// in the OS would keep a stopped process alive until it is killed).
pub fn stop_runtime(runtime: tokio::runtime::Runtime) {
    runtime.shutdown_timeout(RUNTIME_STOP_LIMIT);
}

/// Sets the phase to stopped when dropped.
struct StoppedOnDrop(Observe);

impl Drop for StoppedOnDrop {
    fn drop(&mut self) {
        self.0.phase(Phase::Stopped);
    }
}

/// The metrics endpoint (guarded as `config` says) and the probe endpoint, when configured.
/// With `metrics.authorization: kubernetes` the token reviewer uses the daemon's API server
/// client, or the standard credentials when there is no node to follow.
async fn endpoint_tasks(
    config: &Config,
    observe: &Observe,
    reviewer: (Option<&Cluster>, bool),
    retry: Duration,
) -> Vec<TaskSpec> {
    let mut specs = Vec::new();
    if let Some(address) = config.metrics_address {
        let kubernetes =
            config.metrics_authorization == crate::config::file::MetricsAuthorization::Kubernetes;
        let authorizer = if kubernetes {
            Some(metrics_authorizer(reviewer).await)
        } else {
            None
        };
        let guard = Guard {
            web_config_file: config.web_config_file.clone(),
            authorizer,
        };
        let observe = observe.clone();
        specs.push(TaskSpec::new(
            "metrics-endpoint",
            Role::Optional,
            move || {
                crate::observe::endpoint::serve_metrics(
                    address,
                    observe.clone(),
                    guard.clone(),
                    retry,
                )
            },
        ));
    }
    if let Some(address) = config.probe_address {
        let observe = observe.clone();
        specs.push(TaskSpec::new("probe-endpoint", Role::Optional, move || {
            crate::observe::http::serve_probes_forever(address, observe.clone())
        }));
    }
    specs
}

/// The metrics endpoint's token reviewer, or why there is none: on the daemon's own client,
/// else (asked to use the API server, with no node to follow) on the standard credentials (a
/// pod's service account, else `KUBECONFIG`); none when the daemon runs without an API server.
async fn metrics_authorizer(
    (client, asked): (Option<&Cluster>, bool),
) -> Result<Arc<dyn crate::observe::access::Authorize>, String> {
    use cluster::metrics_authz::KubernetesAuthorizer;
    let authorizer = match client {
        Some(cluster) => Ok(KubernetesAuthorizer::with_client(cluster.client())),
        None if asked => KubernetesAuthorizer::connect().await,
        None => return Err(
            "it needs the API server, and this daemon runs without one; set metrics.authorization: none".into(),
        ),
    };
    match authorizer {
        Ok(a) => Ok(Arc::new(a)),
        Err(e) => Err(format!(
            "dxdp cannot use the API server: {e}; give it credentials (the chart mounts the service account token with metrics.authorization=kubernetes) or set metrics.authorization: none"
        )),
    }
}

/// The node labels and the node watch (optional tasks, with the API server).
fn node_tasks(
    ctx: &Context,
    node_tx: watch::Sender<Option<NodeInfo>>,
    safety_poll: Duration,
) -> Vec<TaskSpec> {
    let Some(cluster) = ctx.cluster.clone() else {
        return Vec::new();
    };
    let node = node_tx.subscribe();
    let (c, inventory) = (cluster.clone(), ctx.inventory.clone());
    vec![
        TaskSpec::new("node-labels", Role::Optional, move || {
            cluster::labels::keep(c.clone(), inventory.clone(), node.clone(), API_BACKOFF)
        }),
        TaskSpec::new("node-watch", Role::Optional, move || {
            cluster::node::follow(cluster.clone(), node_tx.clone(), API_BACKOFF, safety_poll)
        }),
    ]
}

/// Adds the GPU telemetry task (when telemetry can be built) and returns the channel of the
/// isolation violations it finds. Without telemetry none can be known, which the channel says
/// at once (the node taint needs to hear it).
fn telemetry_tasks(
    ctx: &Context,
    host_snapshot: Option<PathBuf>,
    specs: &mut Vec<TaskSpec>,
) -> ActiveTx {
    use crate::telemetry::sampler;
    let build = {
        let (inventory, config) = (ctx.inventory.clone(), ctx.config.clone());
        let dir = ctx.kubelet_dir.clone();
        let metrics = ctx.observe.metrics.telemetry().clone();
        move || {
            sampler::build(
                sampler::Devices::Daemon(inventory.clone()),
                config.clone(),
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
    let isolation = ctx.observe.metrics.isolation().clone();
    let (tracked, config) = (active.clone(), ctx.config.clone());
    specs.push(TaskSpec::new("telemetry", Role::Optional, move || {
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
fn isolation_tasks(ctx: &Context, cluster: &Cluster, active: &ActiveTx, specs: &mut Vec<TaskSpec>) {
    let metrics = ctx.observe.metrics.isolation().clone();
    let (c, rx, config, m) = (
        cluster.clone(),
        active.subscribe(),
        ctx.config.clone(),
        metrics.clone(),
    );
    specs.push(TaskSpec::new(
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
    let (c, rx, config) = (cluster.clone(), active.subscribe(), ctx.config.clone());
    specs.push(TaskSpec::new(
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
    ctx: &Context,
    cluster: &Cluster,
    node: &watch::Receiver<Option<NodeInfo>>,
    active: &ActiveTx,
    specs: &mut Vec<TaskSpec>,
) {
    let metrics = ctx.observe.metrics.device_health().clone();
    let events = cluster::health_events::HealthEvents {
        cluster: cluster.clone(),
        inventory: ctx.inventory.clone(),
        config: ctx.config.clone(),
        kubelet_dir: ctx.kubelet_dir.clone(),
        metrics: metrics.clone(),
        limits: cluster::events::EVENT_LIMITS,
        backoff: API_BACKOFF,
        clock: cluster::health_events::now_ms,
    };
    let conditions = cluster::conditions::NodeConditions {
        cluster: cluster.clone(),
        inventory: ctx.inventory.clone(),
        active: active.subscribe(),
        config: ctx.config.clone(),
        metrics,
        backoff: API_BACKOFF,
        resync: cluster::conditions::RESYNC,
    };
    let gate = cluster::capacity::CapacityGate {
        node: node.clone(),
        inventory: ctx.inventory.clone(),
        readiness: ctx.observe.readiness.clone(),
        first_read_grace: cluster::capacity::FIRST_READ_GRACE,
    };
    specs.push(TaskSpec::new("health-events", Role::Optional, move || {
        events.clone().run()
    }));
    specs.push(TaskSpec::new(
        "node-conditions",
        Role::Optional,
        move || conditions.clone().run(),
    ));
    specs.push(TaskSpec::new(
        "readiness-capacity",
        Role::Optional,
        move || gate.clone().run(),
    ));
}

/// The validation task (optional; it does nothing while `validation.enabled` is off).
fn validation_task(ctx: &Context, cluster: &Cluster, env: &crate::config::Env) -> TaskSpec {
    let task = cluster::validation_task::ValidationTask {
        cluster: cluster.clone(),
        namespace: (env.get(cluster::validation_task::NAMESPACE_VAR).cloned())
            .filter(|n| !n.trim().is_empty()),
        inventory: ctx.inventory.clone(),
        config: ctx.config.clone(),
        readiness: ctx.observe.readiness.clone(),
        metrics: ctx.observe.metrics.validation().clone(),
        exe: std::env::current_exe().unwrap_or_default(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        backoff: API_BACKOFF,
        timing: cluster::validation_task::TIMING,
        done: None,
    };
    TaskSpec::new("validation", Role::Optional, move || task.clone().run())
}

/// Says once, at start, what device health cannot do without the API server, and tells
/// `/readyz` that the Node's capacity is not checked.
fn say_health_without_cluster(ctx: &Context) {
    let c = ctx.config.borrow().clone();
    if c.health_reports.events || c.health_reports.node_conditions {
        tracing::info!("GPUUnhealthy Events and node conditions are off: dxdp has no API server client (no NODE_NAME or credentials; the chart needs nodeApi.enabled); device health is logged and counted only");
    }
    tracing::info!(
        "/readyz does not check the Node's allocatable capacity: dxdp has no API server client"
    );
    ctx.observe
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
pub(crate) const API_BACKOFF: Backoff = Backoff {
    initial: Duration::from_secs(1),
    max: Duration::from_secs(60),
    timeout: Duration::from_secs(30),
};

/// How long the start waits for the node's labels (they select the named configuration).
const NODE_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects to the API server when `NODE_NAME` and credentials are there, else says once why
/// not.
async fn connect(config: &Config, node_name: Option<&String>) -> Option<Cluster> {
    let cluster = match Cluster::connect(node_name.map(String::as_str)).await {
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
async fn resolve_within(inputs: &Inputs) -> Result<Resolved, PluginError> {
    let inputs = inputs.clone();
    crate::util::bounded::run_blocking(plugin::DEFAULT_READ_LIMIT, &inputs.reading(), move || {
        inputs.resolve()
    })
    .await
    .map_err(|e| PluginError::Configuration(e.to_string()))?
    .map_err(|e| PluginError::Configuration(e.to_string()))
}
