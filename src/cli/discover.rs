//! `dxdp discover`: the devices of the host, for people (a table numbered as `mounts --index`
//! counts, `--details` for everything) or as JSON or YAML.

use std::io::Write;
use std::process::ExitCode;

use clap::Args;

use dxdp::backend::HostFactsSource;
use dxdp::config::Config;
use dxdp::render;
use dxdp_core::pipeline;

/// Arguments of `dxdp discover`.
#[derive(Debug, Args)]
pub(crate) struct DiscoverArgs {
    /// Output: text, or one document `{"apiVersion", "kind": "Discovery", "devices",
    /// "excluded", "warnings", "inContainer"}` as JSON or YAML (schema:
    /// docs/schemas/Discovery.schema.json).
    #[command(flatten)]
    output: super::OutputArgs,
    /// After the table, every device's properties and runtime files (as `kubectl describe`).
    #[arg(long)]
    details: bool,
    #[command(flatten)]
    pub(super) pipeline: super::PipelineArgs,
}

/// Runs the pipeline and prints the result to stdout.
pub(crate) fn run(
    args: &DiscoverArgs,
    config: &Config,
    source: &dyn HostFactsSource,
) -> anyhow::Result<ExitCode> {
    let facts = super::load_facts(source)?;
    let mut discovery = pipeline::discover(&facts, &config.pipeline);
    if config.pipeline.health.enabled {
        // Recorded fault events (a snapshot's `faults`) count as they would in the daemon now.
        dxdp_core::health::apply_recorded(
            &facts,
            &mut discovery,
            &config.pipeline.health.policy,
            dxdp::inventory::now_ms(),
        );
    }
    // Fewer devices than `health.expectedDevices` (given counts: the CLI has no Node labels).
    dxdp_core::health::expected::warn_missing(&mut discovery, &config.expected_counts());
    let text = if args.output.is_document() {
        args.output.document(&render::discovery_doc(&discovery))?
    } else {
        render::discovery_text(&discovery, facts.os.as_ref(), args.details)
    };
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}
