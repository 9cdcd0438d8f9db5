//! `dxdp plugin`: the device plugin daemon.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tokio::sync::watch;

use dxdp::backend::HostFactsSource;
use dxdp::cluster::{self, isolation, Cluster};
use dxdp::config::{file, Config, Flags, Inputs};
use dxdp::kubelet::paths;
use dxdp::plugin::register::Backoff;
use dxdp::plugin::tasks::{Role, TaskSpec};
use dxdp::telemetry::isolation::{ActiveTx, Tracker};
use dxdp_core::allocation::MAX_REPLICAS;

use super::ResourceArg;
use dxdp::plugin::{self, PluginConfig};
use dxdp::shutdown;

/// Arguments of `dxdp plugin`.
#[derive(Debug, Args)]
pub struct PluginArgs {
    /// The kubelet's device-plugin directory [default: %SystemDrive%\var\lib\kubelet\device-plugins
    /// on Windows, as the kubelet computes it; /var/lib/kubelet/device-plugins elsewhere].
    #[arg(long, env = "DXDP_KUBELET_DIR", value_name = "DIR")]
    kubelet_dir: Option<PathBuf>,
    /// The resources to serve, comma-separated [env: DXDP_RESOURCES; default: display,compute].
    #[arg(long, value_enum, value_delimiter = ',')]
    resources: Option<Vec<ResourceArg>>,
    /// Advertise each physical device this many times, to share it by time-slicing (1 to 64)
    /// [env: DXDP_REPLICAS; default: 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_REPLICAS)))]
    replicas: Option<u32>,
    #[command(flatten)]
    assignment: super::AssignmentArgs,
    /// Seconds between safety checks of sockets, kubelet.sock, the configuration and device
    /// health (changes are otherwise acted on at once, from file-system and DXCore events).
    #[arg(long, env = "DXDP_SAFETY_POLL", value_name = "SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    safety_poll: u64,
    /// Serve /metrics (Prometheus), /healthz and /readyz over HTTP on this IP:PORT, e.g.
    /// 0.0.0.0:9466; empty: off [env: DXDP_METRICS_ADDRESS; config: metrics.address; default: off].
    #[arg(long, value_name = "HOST:PORT", value_parser = metrics_address)]
    metrics_address: Option<file::MetricsAddress>,
    /// Also serve /healthz and /readyz alone on this IP:PORT, on connections of their own that
    /// metrics clients cannot use up (point the kubelet's probes here), e.g. 127.0.0.1:9467;
    /// empty: off [env: DXDP_PROBE_ADDRESS; config: metrics.probeAddress; default: off].
    #[arg(long, value_name = "HOST:PORT", value_parser = metrics_address)]
    probe_address: Option<file::MetricsAddress>,
    /// The web configuration of the metrics endpoint, in the Prometheus exporters' format
    /// (tls_server_config, basic_auth_users, http_server_config.headers); its files are re-read
    /// when they change; empty: plain HTTP [env: DXDP_WEB_CONFIG_FILE; config:
    /// metrics.webConfigFile; default: off].
    #[arg(long, value_name = "FILE")]
    web_config_file: Option<std::path::PathBuf>,
    /// Who may read /metrics: none, or kubernetes (a bearer token allowed to get the
    /// non-resource URL /metrics, checked with TokenReview and SubjectAccessReview) [env:
    /// DXDP_METRICS_AUTHORIZATION; config: metrics.authorization; default: none].
    #[arg(long, value_name = "MODE", value_parser = metrics_authorization)]
    metrics_authorization: Option<file::MetricsAuthorization>,
    #[command(flatten)]
    pipeline: super::PipelineArgs,
}

fn metrics_authorization(s: &str) -> Result<file::MetricsAuthorization, String> {
    file::MetricsAuthorization::parse(s)
}

fn metrics_address(s: &str) -> Result<file::MetricsAddress, String> {
    file::MetricsAddress::parse(s).map(file::MetricsAddress)
}

impl PluginArgs {
    /// Puts the configuration flags into `flags`.
    pub(super) fn apply(&self, flags: &mut Flags) {
        self.pipeline.apply(flags);
        flags.resources = super::resources(&self.resources);
        flags.replicas = self.replicas;
        self.assignment.apply(flags);
        flags.metrics_address = self.metrics_address.map(|a| a.0);
        flags.probe_address = self.probe_address.map(|a| a.0);
        flags.web_config_file = self
            .web_config_file
            .clone()
            .map(|p| (!p.as_os_str().is_empty()).then_some(p));
        flags.metrics_authorization = self.metrics_authorization;
    }
}

/// Runs the daemon until a stop signal (SIGTERM, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, ...: see
/// [`shutdown::STOP_SIGNALS`]; on Windows: Ctrl-C, Ctrl-Break, console close or
/// CTRL_SHUTDOWN_EVENT, which hcsshim sends to stop a HostProcess container), reloading the
/// configuration when its files change and on SIGHUP. Once the daemon has removed its sockets, a console
/// handler waiting for cleanup is released (see [`dxdp::shutdown`]).
pub fn run(
    args: &PluginArgs,
    config: Config,
    inputs: Inputs,
    source: Arc<dyn HostFactsSource>,
    host_snapshot: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    // Releases a waiting console handler however this function ends, after writing out the
    // log queue: once released, Windows ends the process (issue 30).
    let cleanup = shutdown::CleanupGuard::new().first(|| {
        dxdp::logging::flush_within(STOP_FLUSH);
    });
    if source.is_simulated() {
        tracing::info!("simulated host: using {}", source.describe());
    }
    let kubelet_dir = paths::resolve(
        args.kubelet_dir.clone(),
        std::env::var("DXDP_KUBELET_DIR").ok().as_deref(),
    );
    let mut plugin_config = PluginConfig::new(kubelet_dir.path);
    plugin_config.config = config.clone();
    plugin_config.safety_poll = Duration::from_secs(args.safety_poll);
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        kubelet_dir = %plugin_config.kubelet_dir.display(),
        kubelet_dir_reason = %kubelet_dir.reason,
        host_facts = %source.describe(),
        config_file = %inputs
            .file
            .as_ref()
            .map(|(p, _)| if p.exists() {
                p.display().to_string()
            } else {
                format!("none (would read {})", p.display())
            })
            .unwrap_or_else(|| "none".into()),
        "starting the dxdp device plugin"
    );
    let safety_poll = plugin_config.safety_poll;
    let runtime = super::runtime()?;
    let result = runtime.block_on(async move {
        // The stop and reload signals are handled from here on (the console handler on
        // Windows is installed earlier, by `cli::main`).
        let stop = shutdown::signal();
        let mut inputs = inputs;
        let mut config = config;
        let mut node_rx = None;
        let mut isolation_cluster = None;
        // The served inventory, for the node labels and the telemetry sampler.
        let (tap_tx, tap_rx) = watch::channel(None);
        plugin_config.inventory_tap = Some(tap_tx);
        if let Some((cluster, resolved)) = connect_cluster(&config, &mut inputs).await? {
            config = resolved;
            isolation_cluster = Some(cluster.clone());
            let (node_tx, rx) = watch::channel(inputs.node.clone());
            let (c, node, tap_rx) = (cluster.clone(), rx.clone(), tap_rx.clone());
            plugin_config
                .tasks
                .push(TaskSpec::new("node-labels", Role::Optional, move || {
                    cluster::labels::keep(c.clone(), tap_rx.clone(), node.clone(), API_BACKOFF)
                }));
            plugin_config
                .tasks
                .push(TaskSpec::new("node-watch", Role::Optional, move || {
                    cluster::node::follow(
                        cluster.clone(),
                        node_tx.clone(),
                        API_BACKOFF,
                        safety_poll,
                    )
                }));
            node_rx = Some(rx);
        }
        // `metrics.authorization: kubernetes` needs the API server; without it dxdp refuses to
        // start rather than serve /metrics unchecked.
        if config.metrics_authorization == dxdp::config::file::MetricsAuthorization::Kubernetes {
            match cluster::metrics_authz::KubernetesAuthorizer::connect().await {
                Ok(a) => plugin_config.metrics_authorizer = Some(Arc::new(a)),
                Err(e) => anyhow::bail!(
                    "metrics.authorization is kubernetes but dxdp cannot use the API server: {e}; give it credentials (the chart mounts the service account token with metrics.authorization=kubernetes) or set metrics.authorization: none"
                ),
            }
        }
        // A named configuration the node's label selected falls back to the top level when it
        // cannot be served on this host.
        if config.selection.name.is_some() && config.selection.reason.starts_with("node label") {
            let mut top = inputs.clone();
            top.node = None;
            plugin_config.fallback = resolve_within(top).await.ok();
        }
        // How the configuration was built, and which named configuration applies and why.
        for n in &config.notices {
            tracing::warn!("{n}");
        }
        // (With the API server, connect_cluster has already warned about an unknown name.)
        if let Some(w) = config
            .selection
            .warning
            .as_ref()
            .filter(|_| node_rx.is_none())
        {
            tracing::warn!("{w}");
        }
        tracing::info!(
            configuration = config.selection.name.as_deref().unwrap_or("default"),
            reason = %config.selection.reason,
            "configuration selected; validated before it is served"
        );
        plugin_config.config = config.clone();
        let (tx, updates) = watch::channel(Arc::new(config));
        let telemetry = dxdp::telemetry::sampler::build(
            dxdp::telemetry::sampler::Devices::Daemon(tap_rx.clone()),
            updates.clone(),
            host_snapshot.as_deref(),
            &plugin_config.kubelet_dir,
            plugin_config.observe.metrics.telemetry().clone(),
        );
        // The isolation violations the telemetry task finds; without telemetry none can be
        // known, which the node taint needs to hear at once.
        let active: ActiveTx = Arc::new(watch::Sender::new(
            telemetry.is_none().then(|| Arc::new(Vec::new())),
        ));
        let telemetry_on = telemetry.is_some();
        if telemetry_on {
            // Built again on every restart: a sampler holds its source's state.
            let mut first = telemetry;
            let (dir, updates) = (plugin_config.kubelet_dir.clone(), updates.clone());
            let metrics = plugin_config.observe.metrics.telemetry().clone();
            let isolation = plugin_config.observe.metrics.isolation().clone();
            let active = active.clone();
            plugin_config
                .tasks
                .push(TaskSpec::new("telemetry", Role::Optional, move || {
                    let sampler = first.take().or_else(|| {
                        dxdp::telemetry::sampler::build(
                            dxdp::telemetry::sampler::Devices::Daemon(tap_rx.clone()),
                            updates.clone(),
                            host_snapshot.as_deref(),
                            &dir,
                            metrics.clone(),
                        )
                    });
                    let tracker = Tracker::new(isolation.clone(), active.clone());
                    let config = updates.clone();
                    async move {
                        if let Some(sampler) = sampler {
                            dxdp::telemetry::sampler::run_with(
                                sampler,
                                Some(tracker),
                                std::future::pending::<()>(),
                            )
                            .await;
                        } else {
                            // No sample can be judged: the violations it took over end when
                            // they are stale (no taint stays for what is unknown).
                            tracker.expire_when_stale(config).await;
                        }
                        // Ended (or could not be built again): the supervisor restarts it.
                    }
                }));
        }
        if isolation_cluster.is_none() {
            // Said once, at start: what the isolation audit cannot do without the API server.
            let c = updates.borrow().clone();
            if c.isolation.policy == dxdp::config::file::IsolationPolicy::Taint {
                tracing::warn!("isolation.policy is taint, but dxdp has no API server client (no NODE_NAME or credentials, see the line above; the chart needs nodeApi.enabled): the node is never tainted, violations are only logged and counted");
            } else if c.isolation.events && telemetry_on {
                tracing::info!("GPU isolation Events are off: dxdp has no API server client (no NODE_NAME or credentials; the chart needs nodeApi.enabled); violations are logged and counted only");
            }
        }
        if let Some(cluster) = isolation_cluster {
            let metrics = plugin_config.observe.metrics.isolation().clone();
            let (c, rx, config, m) = (
                cluster.clone(),
                active.subscribe(),
                updates.clone(),
                metrics.clone(),
            );
            plugin_config.tasks.push(TaskSpec::new(
                "isolation-events",
                Role::Optional,
                move || {
                    isolation::report_events(
                        c.clone(),
                        rx.clone(),
                        config.clone(),
                        m.clone(),
                        isolation::EVENT_LIMITS,
                        API_BACKOFF,
                    )
                },
            ));
            let (rx, config) = (active.subscribe(), updates.clone());
            plugin_config.tasks.push(TaskSpec::new(
                "isolation-taint",
                Role::Optional,
                move || {
                    isolation::keep_taint(
                        cluster.clone(),
                        rx.clone(),
                        config.clone(),
                        metrics.clone(),
                        API_BACKOFF,
                        isolation::TAINT_START_GRACE,
                        isolation::TAINT_MIN_HOLD,
                    )
                },
            ));
        }
        // --- live fault events wiring ---
        // GPU fault events from the Windows event log (display-driver resets), fed into the
        // devices' health (docs/health.md); a host snapshot brings its own recorded `faults`.
        let source = if source.is_simulated() {
            source
        } else {
            match dxdp::backend::native_event_log() {
                Ok(log) => {
                    let (wrapped, task) = dxdp::plugin::faults::live_faults(
                        source,
                        log,
                        updates.clone(),
                        plugin_config.observe.metrics.clone(),
                        API_BACKOFF,
                    );
                    plugin_config.tasks.push(task);
                    wrapped
                }
                Err(why) => {
                    tracing::info!("live GPU fault events are off: {why}");
                    source
                }
            }
        };
        // --- end live fault events wiring ---
        plugin_config.reload = Some(plugin::Reload {
            inputs,
            tx,
            node: node_rx,
        });
        Ok::<_, anyhow::Error>(
            plugin::run_with_updates(plugin_config, source, updates, stop).await,
        )
    });
    // A blocking thread hung in the OS (a host read) must not keep the stopped process alive.
    plugin::daemon::stop_runtime(runtime);
    // Sockets are removed and streams ended: the log queue is written out, then Windows may
    // end the process.
    cleanup.finish();
    result??;
    Ok(ExitCode::SUCCESS)
}

/// The longest the stop waits for the log queue to be written out before it releases a waiting
/// console handler: well within the 4 s the handler waits (`shutdown::CLEANUP_BUDGET`), so that
/// a stderr nobody reads cannot use up the time Windows gives the stop.
const STOP_FLUSH: Duration = Duration::from_secs(1);

/// Retries of API server calls (node labels, following the node): 1 s doubling to 60 s, with
/// jitter.
const API_BACKOFF: Backoff = Backoff {
    initial: Duration::from_secs(1),
    max: Duration::from_secs(60),
    timeout: Duration::from_secs(30),
};

/// How long the start waits for the node's labels (they select the named configuration).
const NODE_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects to the API server when `NODE_NAME` and credentials are there (else says once why
/// not), reads the node's labels and re-resolves the configuration with them, so that the
/// named configuration the node selects applies from the start.
async fn connect_cluster(
    config: &Config,
    inputs: &mut Inputs,
) -> Result<Option<(Cluster, Config)>, anyhow::Error> {
    let node_name = std::env::var(cluster::NODE_NAME_VAR).ok();
    let cluster = match Cluster::connect(node_name.as_deref()).await {
        Ok(c) => c,
        Err(why) => {
            tracing::info!("node labels and per-node configuration are off: {why}");
            return Ok(None);
        }
    };
    if config.node_labels.enabled {
        tracing::info!(node = %cluster.node(), prefix = %config.node_labels.prefix, "node labels on");
    } else {
        tracing::info!(node = %cluster.node(), "node labels off (nodeLabels.enabled: false)");
    }
    match tokio::time::timeout(NODE_READ_TIMEOUT, cluster.get()).await {
        Ok(Ok(info)) => inputs.node = Some(info),
        Ok(Err(e)) => tracing::warn!(
            "cannot read the node's labels yet, starting with the default configuration: {e}"
        ),
        Err(_) => {
            tracing::warn!(node = %cluster.node(), "the API server did not answer within {NODE_READ_TIMEOUT:?}; starting with the default configuration")
        }
    }
    // The selection is logged once, by the caller, with or without the API server.
    let resolved = resolve_within(inputs.clone()).await?;
    if let Some(w) = &resolved.selection.warning {
        tracing::warn!("{w}");
    }
    Ok(Some((cluster, resolved)))
}

/// Resolves the configuration (reading its files) on a blocking thread with the read limit.
async fn resolve_within(inputs: Inputs) -> anyhow::Result<Config> {
    let what = "reading the configuration";
    Ok(
        dxdp::util::bounded::run_blocking(plugin::DEFAULT_READ_LIMIT, what, move || {
            inputs.resolve()
        })
        .await??,
    )
}
