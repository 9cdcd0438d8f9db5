//! `dxdp plugin`: the device plugin daemon.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use dxdp::backend::HostFactsSource;
use dxdp::config::kept::KeptConfig;
use dxdp::config::{file, values, Flags, Inputs, Resolved};
use dxdp::daemon::{ClusterChoice, Daemon};
use dxdp::kubelet::paths;
use dxdp_core::sharing::MAX_REPLICAS;

use super::ResourceArg;
use dxdp::plugin::PluginConfig;
use dxdp::shutdown;

/// Arguments of `dxdp plugin`.
#[derive(Debug, Args)]
pub(crate) struct PluginArgs {
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
    metrics_address: Option<values::MetricsAddress>,
    /// Also serve /healthz and /readyz alone on this IP:PORT, on connections of their own that
    /// metrics clients cannot use up (point the kubelet's probes here), e.g. 127.0.0.1:9467;
    /// empty: off [env: DXDP_PROBE_ADDRESS; config: metrics.probeAddress; default: off].
    #[arg(long, value_name = "HOST:PORT", value_parser = metrics_address)]
    probe_address: Option<values::MetricsAddress>,
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

fn metrics_address(s: &str) -> Result<values::MetricsAddress, String> {
    values::MetricsAddress::parse(s).map(values::MetricsAddress)
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

/// Where the daemon keeps the configurations it serves, and why the configuration file was
/// rejected at start when the kept one is served instead.
pub(crate) type LastServed = (KeptConfig, Option<String>);

/// The kubelet directory of `args` (the flag, else `DXDP_KUBELET_DIR` of the configuration's
/// environment, else the OS default).
fn kubelet_dir(args: &PluginArgs, inputs: &Inputs) -> paths::KubeletDir {
    paths::resolve(
        args.kubelet_dir.clone(),
        inputs.env.get("DXDP_KUBELET_DIR").map(String::as_str),
    )
}

/// Reads the configuration of `inputs` on a thread of its own, like every command, or, when its
/// file is rejected, the last configuration this node served, kept on the host
/// ([`KeptConfig::resolve_or_kept`]). Off Windows, where nothing is kept, as every command.
pub(super) fn read(
    args: &PluginArgs,
    inputs: &Inputs,
) -> Result<(Resolved, Option<LastServed>), String> {
    let Some(path) = dxdp::plugin::claim::kept_config_path(&kubelet_dir(args, inputs).path) else {
        return super::read(inputs).map(|c| (c, None));
    };
    let kept = KeptConfig::at(path);
    let what = inputs.reading();
    let (k, i) = (kept.clone(), inputs.clone());
    let start =
        dxdp::util::bounded::run_thread(dxdp::plugin::DEFAULT_READ_LIMIT, &what, move || {
            k.resolve_or_kept(&i)
        })
        .map_err(|e| e.to_string())??;
    Ok((start.resolved, Some((kept, start.rejected))))
}

/// Runs the daemon until a stop signal (SIGTERM, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, ...: see
/// [`shutdown::STOP_SIGNALS`]; on Windows: Ctrl-C, Ctrl-Break, console close or
/// CTRL_SHUTDOWN_EVENT, which hcsshim sends to stop a HostProcess container), reloading the
/// configuration when its files change and on SIGHUP. Once the daemon has removed its sockets, a console
/// handler waiting for cleanup is released (see [`dxdp::shutdown`]).
pub(crate) fn run(
    args: &PluginArgs,
    (config, inputs, last_served): (Resolved, Inputs, Option<LastServed>),
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
    let kubelet_dir = kubelet_dir(args, &inputs);
    let mut plugin_config = PluginConfig::new(kubelet_dir.path);
    plugin_config.config = config;
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
    let runtime = super::runtime()?;
    let mut daemon = Daemon::new(plugin_config, source)
        .reload(inputs)
        .cluster(ClusterChoice::FromEnvironment)
        .host_snapshot(host_snapshot);
    if let Some((kept, rejected)) = last_served {
        daemon = daemon.last_served(kept, rejected);
    }
    // The stop and reload signals are handled from inside the runtime (the console handler on
    // Windows is installed earlier, by `cli::main`).
    let result = runtime.block_on(async move { daemon.run(shutdown::signal()).await });
    // A blocking thread hung in the OS (a host read) must not keep the stopped process alive.
    dxdp::daemon::stop_runtime(runtime);
    // Sockets are removed and streams ended: the log queue is written out, then Windows may
    // end the process.
    cleanup.finish();
    result?;
    Ok(ExitCode::SUCCESS)
}

/// The longest the stop waits for the log queue to be written out before it releases a waiting
/// console handler: well within the 4 s the handler waits (`shutdown::CLEANUP_BUDGET`), so that
/// a stderr nobody reads cannot use up the time Windows gives the stop.
const STOP_FLUSH: Duration = Duration::from_secs(1);
