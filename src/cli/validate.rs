//! `dxdp validate`: inside a container given GPUs by dxdp (the `DXDP_*` hints), checks that the
//! GPUs and their APIs work: the adapters it sees against those it was given, a D3D12 round trip
//! on each, the runtime files dxdp mounted, and the vendor APIs the driver ships.
//!
//! Exit codes: 0 every check passed, 1 a check failed (or timed out), 2 usage error, 3 nothing
//! failed but a check could not tell (docs/tools.md#exit-codes).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use dxdp::backend::probe::NativeProbes;
use dxdp::backend::HostFactsSource;
use dxdp::tools::validate::{self, Hints, Plan};
use dxdp_core::validation::{summary, summary_line, Api};

use super::{OutputArgs, OutputFormat};

/// Arguments of `dxdp validate`.
#[derive(Debug, Args)]
pub(crate) struct ValidateArgs {
    /// The time limit of each check, in seconds (a hung driver DLL gives `timed-out`).
    #[arg(long, value_name = "SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout: u64,
    /// Probe only these vendor APIs (cuda, nvml, opencl, vulkan, nvenc, amf, vpl); repeat or
    /// separate with commas [default: all].
    #[arg(long = "api", value_name = "NAME", value_delimiter = ',', value_parser = parse_api)]
    apis: Vec<ApiName>,
    /// Look the vendor DLLs up in this directory instead of System32.
    #[arg(long, value_name = "DIR")]
    library_dir: Option<PathBuf>,
    /// Bytes of the D3D12 round trip (uploaded, copied on the GPU, read back).
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20,
          value_parser = clap::value_parser!(u64).range(16..=(256 << 20)))]
    bytes: u64,
    /// Fail the adapters check when the container sees adapters it was not given (by default
    /// a note: Windows shows containers every GPU, microsoft/Windows-Containers#333).
    #[arg(long)]
    fail_on_leak: bool,
    /// Also write a one-line summary (`dxdp-validation v1 <verdict> <check>=<result>...`) to
    /// this file: the validation Job's termination message, which the daemon reads.
    #[arg(long, value_name = "FILE")]
    summary_file: Option<PathBuf>,
    #[command(flatten)]
    output: OutputArgs,
}

/// An API named on the command line.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ApiName(Api);

fn parse_api(s: &str) -> Result<ApiName, String> {
    Api::from_name(s.trim()).map(ApiName).ok_or_else(|| {
        let names: Vec<&str> = Api::ALL.iter().map(|a| a.name()).collect();
        format!("unknown API {s:?}: use one of {}", names.join(", "))
    })
}

/// Runs the checks and prints them; the exit code is the verdict's.
pub(crate) fn run(
    args: &ValidateArgs,
    source: Arc<dyn HostFactsSource>,
) -> anyhow::Result<ExitCode> {
    if source.is_simulated() {
        super::notice(&format!("simulated host: using {}", source.describe()));
    }
    let plan = Plan {
        hints: Hints::from_env(),
        library_dir: args.library_dir.clone(),
        apis: if args.apis.is_empty() {
            Api::ALL.to_vec()
        } else {
            args.apis.iter().map(|a| a.0).collect()
        },
        timeout: Duration::from_secs(args.timeout),
        bytes: args.bytes as usize,
        fail_on_leak: args.fail_on_leak,
    };
    let doc = validate::run(&plan, source, Arc::new(NativeProbes));
    if let Some(path) = &args.summary_file {
        let line = summary_line(&summary(&doc.checks)) + "\n";
        std::fs::write(path, line)
            .with_context(|| format!("cannot write the summary file {}", path.display()))?;
    }
    let text = match args.output.format() {
        OutputFormat::Text => validate::text(&doc),
        _ => args.output.document(&doc)?,
    };
    super::write_stdout(text.as_bytes())?;
    Ok(ExitCode::from(doc.verdict.exit_code()))
}
