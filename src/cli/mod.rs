//! Command-line interface: global options, subcommands and error reporting.

mod demo;
mod discover;
mod doctor;
mod hcs;
mod mounts;
mod plugin;
mod snapshot;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use dxdp::devices::Resource;

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

    /// Log level or tracing filter (error, warn, info, debug, trace) [default: info; warn for demo].
    #[arg(long, global = true, env = "DXDP_LOG_LEVEL")]
    log_level: Option<String>,
}

/// A resource on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ResourceArg {
    /// directx.microsoft.com/display
    Display,
    /// directx.microsoft.com/compute
    Compute,
}

impl From<ResourceArg> for Resource {
    fn from(r: ResourceArg) -> Self {
        match r {
            ResourceArg::Display => Resource::Display,
            ResourceArg::Compute => Resource::Compute,
        }
    }
}

/// Pipeline switches shared by the commands that discover devices.
#[derive(Debug, Clone, Args)]
struct PipelineArgs {
    /// Include integrated adapters.
    #[arg(long)]
    include_integrated: bool,
    /// Include detachable adapters.
    #[arg(long)]
    include_detachable: bool,
}

impl PipelineArgs {
    fn config(&self) -> dxdp::pipeline::PipelineConfig {
        dxdp::pipeline::PipelineConfig {
            include_integrated: self.include_integrated,
            include_detachable: self.include_detachable,
            ..dxdp::pipeline::PipelineConfig::default()
        }
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the DirectX devices of the host, what was left out and why, and warnings.
    Discover(discover::DiscoverArgs),
    /// Write the host facts as a host snapshot (for bug reports and replay).
    Snapshot(snapshot::SnapshotArgs),
    /// Run the device plugin daemon: serve both resources to the kubelet.
    Plugin(plugin::PluginArgs),
    /// Run the plugin against an in-process kubelet stand-in and show what containerd receives.
    Demo(demo::DemoArgs),
    /// Print the flags that give a standalone container devices and their runtime files.
    Mounts(mounts::MountsArgs),
    /// Show the OS, the HCS schema versions and whether devices can be assigned by location path.
    Hcs(hcs::HcsArgs),
    /// Check whether this node can run dxdp, with a remedy for every problem.
    Doctor(doctor::DoctorArgs),
}

/// Parses arguments, runs the command and turns errors into a message and exit code 1.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = match cli.command {
        Command::Demo(_) => "warn",
        _ => "info",
    };
    let level = cli.global.log_level.as_deref().unwrap_or(default_level);
    if let Err(e) = logging::init(cli.global.log_format, level) {
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
        Command::Plugin(args) => plugin::run(&args, source.into()),
        Command::Demo(args) => demo::run(&args, source.into()),
        Command::Mounts(args) => mounts::run(&args, source.as_ref()),
        Command::Hcs(args) => hcs::run(&args, source.as_ref()),
        Command::Doctor(args) => doctor::run(&args, source.as_ref()),
    }
}

/// A multi-threaded tokio runtime for the commands that serve gRPC.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
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
