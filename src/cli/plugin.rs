//! `dxdp plugin`: the device plugin daemon.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;

use dxdp::allocation::MAX_REPLICAS;
use dxdp::backend::HostFactsSource;
use dxdp::devices::Resource;

use super::ResourceArg;
use dxdp::plugin::{self, PluginConfig};

/// Arguments of `dxdp plugin`.
#[derive(Debug, Args)]
pub struct PluginArgs {
    /// The kubelet's device-plugin directory [default: C:\var\lib\kubelet\device-plugins on
    /// Windows, /var/lib/kubelet/device-plugins elsewhere].
    #[arg(long, env = "DXDP_KUBELET_DIR", value_name = "DIR")]
    kubelet_dir: Option<PathBuf>,
    /// The resources to serve, comma-separated.
    #[arg(long, env = "DXDP_RESOURCES", value_enum, value_delimiter = ',', default_values_t = [ResourceArg::Display, ResourceArg::Compute])]
    resources: Vec<ResourceArg>,
    /// Advertise each physical device this many times, to share it by time-slicing (1 to 64).
    #[arg(long, env = "DXDP_REPLICAS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_REPLICAS)))]
    replicas: u32,
    #[command(flatten)]
    pipeline: super::PipelineArgs,
}

impl PluginArgs {
    fn config(&self) -> PluginConfig {
        let mut config = PluginConfig::new(
            self.kubelet_dir
                .clone()
                .unwrap_or_else(plugin::default_kubelet_dir),
        );
        let mut resources: Vec<Resource> = self.resources.iter().map(|&r| r.into()).collect();
        resources.sort();
        resources.dedup();
        config.resources = resources;
        config.replicas = self.replicas;
        config.pipeline = self.pipeline.config();
        config
    }
}

/// Runs the daemon until SIGTERM/SIGINT (Ctrl-C/Ctrl-Break on Windows).
pub fn run(args: &PluginArgs, source: Arc<dyn HostFactsSource>) -> anyhow::Result<ExitCode> {
    if source.is_simulated() {
        tracing::info!("simulated host: using {}", source.describe());
    }
    let config = args.config();
    tracing::info!(kubelet_dir = %config.kubelet_dir.display(), "starting the dxdp device plugin");
    super::runtime()?.block_on(plugin::run(config, source, shutdown_signal()))?;
    Ok(ExitCode::SUCCESS)
}

/// Completes on the first termination signal.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM: {e}");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(windows)]
    {
        match tokio::signal::windows::ctrl_break() {
            Ok(mut brk) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = brk.recv() => {}
                }
            }
            Err(e) => {
                tracing::warn!("cannot listen for Ctrl-Break: {e}");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    tracing::info!("termination signal received; shutting down");
}
