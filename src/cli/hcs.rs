//! `dxdp hcs`: OS, HCS schema versions and the device-assignment verdict.

use std::io::Write;
use std::process::ExitCode;

use clap::Args;

use dxdp::backend::HostFactsSource;
use dxdp::tools::hcs;

/// Arguments of `dxdp hcs`.
#[derive(Debug, Args)]
pub struct HcsArgs {
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Prints the report; exits 0 when devices can be assigned by location path, 1 otherwise.
pub fn run(args: &HcsArgs, source: &dyn HostFactsSource) -> anyhow::Result<ExitCode> {
    let facts = super::load_facts(source)?;
    let report = hcs::report(&facts.os.unwrap_or_default());
    let text = if args.json {
        serde_json::to_string_pretty(&report)? + "\n"
    } else {
        hcs::text(&report)
    };
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(if report.location_path_assignment {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
