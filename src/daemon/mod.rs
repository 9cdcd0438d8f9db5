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
//! 3. on Windows the live GPU fault events from the event log, fed into device health
//!    (`health::live_faults`);
//! 4. device serving's start (`plugin::serve::start`): the first host read and the check that
//!    the configuration can be served (with the top-level fallback);
//! 5. the `Context`: the validated configuration channel and the inventory channel, which
//!    every feature reads (no task copies one channel into another);
//! 6. each feature's tasks, from its entry point: serving (`plugin::serve::tasks`: refresher,
//!    device gauges, configuration reload), the node labels and the node watch
//!    (`cluster::node_tasks`), GPU telemetry and the isolation audit (`telemetry::tasks`:
//!    Events, taint), GPU memory over-use's Events (`telemetry::overuse::tasks`), device health on the cluster side (`health::tasks`: Events, node
//!    conditions, `/readyz` on the Node's capacity), the in-cluster validation Jobs
//!    (`validation::tasks`);
//! 7. serving's main loop (`plugin::serve::run`) with the supervisor, until the stop.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod trim;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::backend::eventlog::EventLog;
use crate::backend::HostFactsSource;
use crate::cluster::metrics_authz::KubernetesAuthorizer;
use crate::cluster::{self, Cluster};
use crate::config::file::MetricsAuthorization;
use crate::config::kept::KeptConfig;
use crate::config::{Config, Inputs, Resolved};
use crate::context::Context;
use crate::observe::endpoint::{Guard, MetricsEndpoint, ProbeEndpoint};
use crate::observe::state::Phase;
use crate::observe::Observe;
use crate::plugin::{self, claim, serve, PluginConfig, PluginError, Reload};
use crate::supervisor::{Role, TaskSpec, Tasks};
use crate::{health, telemetry, validation};

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
    last_served: Option<(KeptConfig, Option<String>)>,
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
            fallback: None,
            event_log: None,
            last_served: None,
        }
    }

    /// Keeps every configuration it serves from the [`Daemon::reload`] inputs' file at `kept`
    /// on the host. With `rejected` (why the configuration file was rejected at start: see
    /// [`KeptConfig::resolve_or_kept`]), the configuration at start is the last-served one read
    /// from there: `/readyz` fails with the reason, and `dxdp_config_fallback` is 1, until a
    /// configuration read from the inputs is served. Without `rejected`, a configuration that
    /// cannot be served on this host also falls back to the kept one.
    pub fn last_served(mut self, kept: KeptConfig, rejected: Option<String>) -> Self {
        self.last_served = Some((kept, rejected));
        self
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
    #[cfg(any(test, feature = "test-support"))]
    pub fn fallback(mut self, top: Config) -> Self {
        self.fallback = Some(top);
        self
    }

    /// Follows GPU fault events in `log`, whatever the host facts' source. Without it the
    /// machine's own event log is followed (Windows' `wevtapi.dll`; none elsewhere), and none
    /// for host snapshots and the sample host, which bring their recorded faults.
    #[cfg(any(test, feature = "test-support"))]
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
            last_served,
        } = self;
        let (kept, mut rejected) = match last_served {
            Some((kept, rejected)) => (Some(kept), rejected),
            None => (None, None),
        };
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
                // The selection is logged once, below, with or without the API server. From
                // the kept file while it is served instead of the configuration file.
                let kept_inputs = kept.as_ref().and_then(|k| k.inputs(inputs));
                config = match (&rejected, kept_inputs) {
                    (Some(_), Some(kept_inputs)) => resolve_within(&kept_inputs).await?,
                    _ => resolve_within(inputs).await?,
                };
            }
            let initial = inputs.as_ref().and_then(|i| i.node.clone());
            node = Some(watch::channel(initial));
        }
        // A named configuration the node's label selected falls back to the top level (the
        // configuration at start, resolved without the node) when it cannot be served here;
        // another configuration read from the file falls back to the last-served one kept on
        // the host.
        let fallback = match fallback {
            Some(top) => Some(serve::Fallback::TopLevel(top)),
            None if config.selection.name.is_some() && config.selection.by.is_node_label() => {
                Some(serve::Fallback::TopLevel(plugin.config.config.clone()))
            }
            None if rejected.is_none() => match (&kept, &inputs) {
                (Some(k), Some(i)) => last_served_config(k, i)
                    .await
                    .map(serve::Fallback::LastServed),
                _ => None,
            },
            None => None,
        };
        let last_served_fallback = matches!(fallback, Some(serve::Fallback::LastServed(_)));
        // What is served, to keep on the host once it is.
        let served_text = (rejected.is_none()).then(|| config.clone());
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
        let sandbox = env.get(crate::util::host_process::SANDBOX_VAR).cloned();
        for spec in endpoint_tasks(&first, &observe, reviewer, sandbox, plugin.guard_retry).await {
            tasks.spawn(spec);
        }

        // 3. Live GPU fault events from the Windows event log (display-driver resets), fed into
        // the devices' health (docs/health.md); a host snapshot brings its own recorded `faults`.
        let mut specs = Vec::new();
        let source =
            health::live_faults(source, event_log, config_rx.clone(), &observe, &mut specs);

        // 4. Device serving's start: the first host read, the configuration checked on it.
        let started = serve::start(&plugin, &source, first.clone(), fallback, stop.as_mut());
        let Some((mut started, inventory)) = started.await? else {
            tasks.shutdown().await;
            return Ok(());
        };
        if last_served_fallback {
            rejected = started.unservable.clone();
        }
        match (&kept, &rejected) {
            (Some(k), Some(why)) => {
                let files = inputs
                    .as_ref()
                    .and_then(|i| i.file.as_ref())
                    .map(|(p, _)| p.display().to_string())
                    .unwrap_or_default();
                tracing::error!(
                    "the configuration was rejected at start: {why}; serving the last configuration this node served, kept at {}, instead. /readyz fails until the configuration is fixed: fix {files} (`dxdp config check {files}` lists what is wrong); it is read again when it changes",
                    k.path().display()
                );
                observe.readiness.set_config_fallback(Some(format!(
                    "serving the last configuration this node served (kept at {}): the configuration was rejected at start: {why}; fix the configuration",
                    k.path().display()
                )));
                observe.metrics.set_config_fallback(true);
                observe.metrics.set_config_rejected(true);
            }
            (Some(k), None) => {
                if let (Some(i), Some(served)) = (&inputs, &served_text) {
                    if let Err(e) = keep(k, i, served).await {
                        tracing::warn!("{}", plugin::reload::keep_failed(k.path(), &e));
                    }
                }
            }
            (None, _) => {}
        }
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
            cluster_asked,
            node: node.as_ref().map(|(_, rx)| rx.clone()),
            kubelet_dir: plugin.kubelet_dir.clone(),
            env,
        };

        // 6. Every feature's tasks.
        let reload = match (inputs, own_tx) {
            (Some(inputs), Some(tx)) => Some(Reload {
                inputs,
                tx,
                node: ctx.node.clone(),
                logged,
                kept,
                fallback: Arc::new(std::sync::Mutex::new(rejected)),
            }),
            _ => None,
        };
        // The audit's violations (isolation.policy: withdraw takes GPUs out of serving).
        let (telemetry, feeds) = telemetry::tasks(&ctx, host_snapshot);
        let active = feeds.active;
        specs.extend(serve::tasks(
            &mut started,
            &plugin,
            source,
            config_rx,
            inventory_tx,
            reload,
            crate::plugin::refresher::Feeds {
                active: active.subscribe(),
                hot: feeds.hot.subscribe(),
            },
        ));
        if let (Some(cluster), Some((node_tx, _))) = (&ctx.cluster, node) {
            specs.extend(cluster::node_tasks(
                cluster,
                &ctx.inventory,
                node_tx,
                safety_poll,
                ctx.env
                    .get(crate::validation::task::NAMESPACE_VAR)
                    .filter(|n| !n.trim().is_empty())
                    .cloned(),
                ctx.observe.metrics.labels().clone(),
            ));
        }
        specs.extend(telemetry);
        specs.extend(telemetry::overuse::tasks(&ctx, &feeds.overuse));
        specs.extend(health::tasks(&ctx, &active));
        specs.extend(validation::tasks(&ctx));
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        specs.push(TaskSpec::task(
            "memory-trim",
            Role::Optional,
            trim::GiveBackMemory,
        ));
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
    (client, asked): (Option<&Cluster>, bool),
    sandbox: Option<String>,
    retry: Duration,
) -> Vec<TaskSpec> {
    let mut specs = Vec::new();
    if let Some(address) = config.metrics_address {
        let authorizer = match config.metrics_authorization {
            MetricsAuthorization::Kubernetes => Some(
                KubernetesAuthorizer::for_daemon(
                    client,
                    asked,
                    &config.metrics_token_audiences,
                    observe.metrics.reviews(),
                )
                .await,
            ),
            MetricsAuthorization::None => None,
        };
        let guard = Guard {
            web_config_file: config.web_config_file.clone(),
            authorizer,
            allow_plain_http_tokens: config.metrics_allow_plain_http_tokens,
            sandbox,
        };
        let endpoint = MetricsEndpoint {
            address,
            observe: observe.clone(),
            guard,
            retry,
        };
        specs.push(TaskSpec::task("metrics-endpoint", Role::Optional, endpoint));
    }
    if let Some(address) = config.probe_address {
        let endpoint = ProbeEndpoint {
            address,
            observe: observe.clone(),
        };
        specs.push(TaskSpec::task("probe-endpoint", Role::Optional, endpoint));
    }
    specs
}

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

/// The last-served configuration kept by `kept`, resolved with `inputs` (the node's too), on
/// a blocking thread with the read limit; `None` when nothing is kept or it cannot be read.
async fn last_served_config(kept: &KeptConfig, inputs: &Inputs) -> Option<Config> {
    let kept_inputs = kept.inputs(inputs)?;
    resolve_within(&kept_inputs).await.ok().map(|r| r.config)
}

/// Keeps `served` (read from `inputs`) at `kept`, on a blocking thread with the read limit.
async fn keep(kept: &KeptConfig, inputs: &Inputs, served: &Resolved) -> std::io::Result<()> {
    let (kept, inputs, served) = (kept.clone(), inputs.clone(), served.clone());
    let what = format!("writing {}", kept.path().display());
    crate::util::bounded::run_blocking(plugin::DEFAULT_READ_LIMIT, &what, move || {
        kept.keep(&inputs, &served).map(|_| ())
    })
    .await
    .map_err(std::io::Error::other)?
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
