//! `dxdp top`: the node's GPUs at a glance (utilisation by engine, memory, processes, the pods
//! holding each), from a running daemon's `/metrics` or by sampling itself.
//!
//! `-o text|json|yaml` and `--json`, as every command with machine output. With `--watch`: on a
//! terminal the table is redrawn in place; into a pipe or file every frame starts with a line
//! giving its time; JSON is one document per line, YAML a stream of documents (`---`).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde::Serialize;
use tokio::sync::watch;

use dxdp::backend::HostFactsSource;
use dxdp::config::Config;
use dxdp::kubelet::paths;
use dxdp::observe::metrics::Metrics;
use dxdp::telemetry::sampler::{self, Sampler, State};
use dxdp::telemetry::scrape::Scraper;
use dxdp::telemetry::top;
use dxdp_core::telemetry::compute::TelemetryView;

use super::endpoint::EndpointArgs;
use super::OutputFormat;

/// Arguments of `dxdp top`.
#[derive(Debug, Args)]
pub(crate) struct TopArgs {
    #[command(flatten)]
    endpoint: EndpointArgs,
    /// Refresh every --interval seconds until Ctrl-C (in place on a terminal).
    #[arg(long)]
    watch: bool,
    /// Seconds between refreshes with --watch, and between the two reads of the counters that a
    /// utilisation needs when sampling here.
    #[arg(long, value_name = "SECONDS", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    interval: u64,
    /// Output: text, or one document `{"apiVersion", "kind": "Top", "windowSeconds",
    /// "devices", "containers"}` as JSON or YAML (with --watch: one JSON document per line, or a
    /// YAML stream of documents).
    #[command(flatten)]
    output: super::OutputArgs,
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
    Daemon(Box<Scraper>),
    Here(Box<Sampler>, Box<State>),
}

impl Figures {
    /// The daemon's figures at `--endpoint` (its files read and checked now), else a sampler of
    /// this host's counters (an error when there is no source here).
    pub(super) fn new(
        endpoint: &EndpointArgs,
        config: Config,
        source: Arc<dyn HostFactsSource>,
        host_snapshot: Option<PathBuf>,
    ) -> anyhow::Result<Figures> {
        Ok(match &endpoint.endpoint {
            Some(e) => {
                let scraper = Scraper::new(e, &endpoint.options())?;
                if let Some(warning) = scraper.exposure() {
                    super::warning(&warning);
                }
                Figures::Daemon(Box::new(scraper))
            }
            None => {
                if source.is_simulated() {
                    super::notice(&format!("simulated host: using {}", source.describe()));
                }
                let kubelet_dir = paths::default_dir();
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
            Figures::Daemon(scraper) => {
                format!("the daemon's /metrics at {}", scraper.url())
            }
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
            Figures::Daemon(scraper) => {
                let text = scraper.fetch().await?;
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
pub(crate) fn run(
    args: &TopArgs,
    config: Config,
    source: Arc<dyn HostFactsSource>,
    host_snapshot: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let mut figures = Figures::new(&args.endpoint, config, source, host_snapshot)?;
    let interval = Duration::from_secs(args.interval);
    let output = args.output.format();
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

fn print(view: &TelemetryView, output: OutputFormat, watching: bool) -> anyhow::Result<()> {
    let doc = TopDocument {
        api_version: "dxdp/v1",
        kind: "Top",
        view,
    };
    let text = match output {
        OutputFormat::Json if watching => serde_json::to_string(&doc)? + "\n",
        OutputFormat::Json => serde_json::to_string_pretty(&doc)? + "\n",
        // A stream of documents, as `kubectl get --watch -o yaml` writes one.
        OutputFormat::Yaml if watching => format!("---\n{}", dxdp::output::to_yaml(&doc)?),
        OutputFormat::Yaml => dxdp::output::to_yaml(&doc)?,
        OutputFormat::Text => {
            let table = top::text(view);
            if watching && std::io::stdout().is_terminal() {
                // Home and clear: refresh in place.
                format!("\x1b[H\x1b[2J{table}")
            } else if watching {
                // Into a pipe or a file: frames one after the other, each with its time.
                format!("{}{table}\n", frame_line(std::time::SystemTime::now()))
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

/// The line that starts a `--watch` frame written to a pipe or file: a separator with the time,
/// `--- 2026-11-25T22:15:03Z ---`.
fn frame_line(now: std::time::SystemTime) -> String {
    let secs = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("--- {} ---\n", utc_text(secs))
}

/// Seconds since 1970 as an RFC 3339 UTC time (civil-from-days, proleptic Gregorian).
fn utc_text(secs: u64) -> String {
    let days = secs / 86_400;
    let rest = secs % 86_400;
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_lines_carry_the_utc_time() {
        // Expected values from `date -u -d @SECONDS +%FT%TZ`.
        assert_eq!(utc_text(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_text(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_text(1_795_641_303), "2026-11-25T21:15:03Z");
        assert_eq!(utc_text(4_107_542_399), "2100-02-28T23:59:59Z");
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_795_641_303);
        assert_eq!(frame_line(t), "--- 2026-11-25T21:15:03Z ---\n");
    }
}
