//! `dxdp top`: the node's GPUs at a glance (utilisation by engine, memory, processes, the pods
//! holding each), from a running daemon's `/metrics` or by sampling itself.
//!
//! `-o json|text` is this command's own flag for now (a shared `--output` is being added to the
//! other commands separately).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use serde::Serialize;
use tokio::sync::watch;

use dxdp::backend::HostFactsSource;
use dxdp::config::Config;
use dxdp::kubelet::paths;
use dxdp::observe::Metrics;
use dxdp::telemetry::{sampler, top, Sampler, State};
use dxdp_core::telemetry::compute::TelemetryView;

/// Output formats of `dxdp top`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TopOutput {
    /// A table for people.
    Text,
    /// One JSON document `{"apiVersion", "kind": "Top", "windowSeconds", "devices", "containers"}`
    /// (one line per refresh with --watch).
    Json,
}

/// Arguments of `dxdp top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// Read the figures from a running daemon's /metrics at HOST:PORT (its metrics.address,
    /// e.g. 127.0.0.1:9466) instead of sampling the GPUs here.
    #[arg(long, value_name = "HOST:PORT")]
    endpoint: Option<String>,
    /// Refresh every --interval seconds until Ctrl-C (in place on a terminal).
    #[arg(long)]
    watch: bool,
    /// Seconds between refreshes with --watch, and between the two reads of the counters that a
    /// utilisation needs when sampling here.
    #[arg(long, value_name = "SECONDS", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    interval: u64,
    /// Output format: text or json.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = TopOutput::Text)]
    output: TopOutput,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TopDocument<'a> {
    api_version: &'static str,
    kind: &'static str,
    #[serde(flatten)]
    view: &'a TelemetryView,
}

/// Where `top` and `audit` get their figures: a running daemon's `/metrics`, or samples taken
/// here.
pub(super) enum Figures {
    Daemon(String),
    Here(Box<Sampler>, Box<State>),
}

impl Figures {
    /// The daemon's figures at `endpoint`, else a sampler of this host's counters (an error
    /// when there is no source here).
    pub(super) fn new(
        endpoint: Option<&str>,
        config: Config,
        source: Arc<dyn HostFactsSource>,
        host_snapshot: Option<PathBuf>,
    ) -> anyhow::Result<Figures> {
        Ok(match endpoint {
            Some(e) => {
                top::parse_endpoint(e).map_err(anyhow::Error::msg)?;
                Figures::Daemon(e.to_string())
            }
            None => {
                if source.is_simulated() {
                    super::notice(&format!("simulated host: using {}", source.describe()));
                }
                let kubelet_dir =
                    paths::resolve(None, std::env::var("DXDP_KUBELET_DIR").ok().as_deref());
                let (_, updates) = watch::channel(Arc::new(config));
                let sampler = sampler::build(
                    sampler::Devices::Host(source),
                    updates,
                    host_snapshot.as_deref(),
                    &kubelet_dir.path,
                    Metrics::new().telemetry().clone(),
                )
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "no GPU telemetry source here: run on a Windows node, pass --host-snapshot with a telemetry section, or --endpoint of a running daemon"
                    )
                })?;
                Figures::Here(Box::new(sampler), Box::default())
            }
        })
    }

    /// Where the figures come from, for people.
    pub(super) fn describe(&self) -> String {
        match self {
            Figures::Daemon(endpoint) => format!("the daemon's /metrics at {endpoint}"),
            Figures::Here(sampler, _) => sampler.source.describe(),
        }
    }

    async fn read(&mut self, interval: Duration, first: bool) -> anyhow::Result<TelemetryView> {
        Ok(self.read_with_allocations(interval, first).await?.0)
    }

    /// The figures, and whether the allocations behind them are the kubelet's (see
    /// [`Sampler::sources_current`]).
    pub(super) async fn read_with_allocations(
        &mut self,
        interval: Duration,
        first: bool,
    ) -> anyhow::Result<(TelemetryView, bool)> {
        match self {
            Figures::Daemon(endpoint) => {
                let text = top::fetch(endpoint).await.map_err(anyhow::Error::msg)?;
                Ok((
                    top::view_from_metrics(&text),
                    top::allocations_known_in_metrics(&text),
                ))
            }
            Figures::Here(sampler, state) => {
                let mut view = sampler
                    .step(state)
                    .await
                    .map_err(|(_, why)| anyhow::anyhow!("cannot sample the GPU counters: {why}"))?;
                if first && view.window_seconds == 0.0 && !sampler.source.is_recorded() {
                    // A utilisation needs two reads of the running-time counters.
                    tokio::time::sleep(interval).await;
                    view = sampler.step(state).await.map_err(|(_, why)| {
                        anyhow::anyhow!("cannot sample the GPU counters: {why}")
                    })?;
                }
                let known = sampler.sources_current(state);
                Ok((view, known))
            }
        }
    }
}

/// Prints the figures once, or every `--interval` with `--watch`.
pub fn run(
    args: &TopArgs,
    config: Config,
    source: Arc<dyn HostFactsSource>,
    host_snapshot: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let mut figures = Figures::new(args.endpoint.as_deref(), config, source, host_snapshot)?;
    let interval = Duration::from_secs(args.interval);
    let output = args.output;
    let watching = args.watch;
    super::runtime()?.block_on(async move {
        let mut first = true;
        loop {
            let view = figures.read(interval, first).await?;
            first = false;
            print(&view, output, watching)?;
            if !watching {
                return Ok(ExitCode::SUCCESS);
            }
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
                () = tokio::time::sleep(interval) => {}
            }
        }
    })
}

fn print(view: &TelemetryView, output: TopOutput, watching: bool) -> anyhow::Result<()> {
    let text = match output {
        TopOutput::Json => {
            let doc = TopDocument {
                api_version: "dxdp/v1",
                kind: "Top",
                view,
            };
            if watching {
                serde_json::to_string(&doc)? + "\n"
            } else {
                serde_json::to_string_pretty(&doc)? + "\n"
            }
        }
        TopOutput::Text => {
            let table = top::text(view);
            if watching && std::io::stdout().is_terminal() {
                // Home and clear: refresh in place.
                format!("\x1b[H\x1b[2J{table}")
            } else if watching {
                format!("{table}\n")
            } else {
                table
            }
        }
    };
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("cannot write to stdout"),
    }
}
