//! Command-line interface: global options, subcommands and error reporting.

mod discover;
mod snapshot;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use dxdp::backend::{self, HostFactsSource};
use dxdp::facts::HostFacts;
use dxdp::logging::{self, LogFormat};

/// Kubernetes device plugins for DirectX GPUs and compute accelerators in Windows containers.
#[derive(Debug, Parser)]
#[command(name = "dxdp", version, about, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

/// Options every command accepts, before or after the subcommand.
#[derive(Debug, Args)]
struct GlobalArgs {
    /// Read host facts from this host snapshot file (YAML or JSON) instead of the host.
    #[arg(long, global = true, env = "DXDP_HOST_SNAPSHOT", value_name = "FILE")]
    host_snapshot: Option<PathBuf>,

    /// Log format on stderr: `text` or `json`.
    #[arg(long, global = true, env = "DXDP_LOG_FORMAT", default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    /// Log level or tracing filter (error, warn, info, debug, trace).
    #[arg(long, global = true, env = "DXDP_LOG_LEVEL", default_value = "info")]
    log_level: String,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the DirectX devices of the host, what was left out and why, and warnings.
    Discover(discover::DiscoverArgs),
    /// Write the host facts as a host snapshot (for bug reports and replay).
    Snapshot(snapshot::SnapshotArgs),
}

/// Parses arguments, runs the command and turns errors into a message and exit code 1.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = logging::init(cli.global.log_format, &cli.global.log_level) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let source = backend::select(cli.global.host_snapshot.clone());
    match cli.command {
        Command::Discover(args) => discover::run(&args, source.as_ref()),
        Command::Snapshot(args) => snapshot::run(&args, source.as_ref()),
    }
}

/// Loads host facts, telling stderr when they are simulated.
fn load_facts(source: &dyn HostFactsSource) -> anyhow::Result<HostFacts> {
    if source.is_simulated() {
        tracing::info!("simulated host: using {}", source.describe());
    }
    source
        .load()
        .with_context(|| format!("cannot collect host facts from {}", source.describe()))
}
