//! `dxdp hcs`: OS, HCS schema versions and the device-assignment verdict.

use std::io::Write;
use std::process::ExitCode;

use clap::Args;

use dxdp::backend::HostFactsSource;
use dxdp::config::Resolved;
use dxdp::tools::hcs;

/// Arguments of `dxdp hcs`.
#[derive(Debug, Args)]
pub(crate) struct HcsArgs {
    #[command(flatten)]
    output: super::OutputArgs,
    #[command(flatten)]
    pub(super) assignment: super::AssignmentArgs,
}

/// Prints the report and what the configured assignment does here; exits 0 when it works,
/// 1 otherwise.
pub(crate) fn run(
    args: &HcsArgs,
    config: &Resolved,
    source: &dyn HostFactsSource,
) -> anyhow::Result<ExitCode> {
    let facts = super::load_facts(source)?;
    let os = facts.os.unwrap_or_default();
    let report = hcs::report(&os);
    let verdict = hcs::assignment(&os, config.assignment);
    let text = if args.output.is_document() {
        args.output.document(&dxdp::output::HcsReportDoc {
            api_version: dxdp::output::ApiVersion,
            kind: dxdp::output::HcsReportKind,
            report: &report,
            assignment: &verdict,
        })?
    } else {
        format!(
            "{}Configured assignment: {} ({}): {}\n",
            hcs::text(&report),
            verdict.configured,
            config.origin_of(dxdp::config::keys::Key::Assignment),
            if verdict.configured == verdict.in_force {
                verdict.verdict.clone()
            } else {
                format!("{} here; {}", verdict.in_force, verdict.verdict)
            }
        )
    };
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(if verdict.works {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
