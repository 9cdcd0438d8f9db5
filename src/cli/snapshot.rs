//! `dxdp snapshot`: write the current host facts as a host snapshot.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, ValueEnum};

use dxdp::backend::HostFactsSource;
use dxdp_core::snapshot::{self, Format};

/// Arguments of `dxdp snapshot`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// Write to this file instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Document format.
    #[arg(long, value_enum, default_value_t = SnapshotFormat::Yaml)]
    format: SnapshotFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum SnapshotFormat {
    Yaml,
    Json,
}

/// Collects the facts and writes them.
pub fn run(args: &SnapshotArgs, source: &dyn HostFactsSource) -> anyhow::Result<ExitCode> {
    let facts = super::load_facts(source)?;
    let format = match args.format {
        SnapshotFormat::Yaml => Format::Yaml,
        SnapshotFormat::Json => Format::Json,
    };
    let text = snapshot::write(&facts, format)?;
    match &args.output {
        Some(path) => {
            std::fs::write(path, text)
                .with_context(|| format!("cannot write host snapshot to {}", path.display()))?;
            tracing::info!("wrote host snapshot to {}", path.display());
        }
        None => std::io::stdout().write_all(text.as_bytes())?,
    }
    Ok(ExitCode::SUCCESS)
}
