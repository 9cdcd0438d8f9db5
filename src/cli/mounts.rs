//! `dxdp mounts`: flags for standalone containers (ctr, nerdctl, docker) or JSON / OCI output,
//! and `--run` to start `ctr run` with them.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};

use dxdp::backend::HostFactsSource;
use dxdp::config::Config;
use dxdp::tools::mounts::{self, Format};
use dxdp::tools::select::{self, SelectError, Selector};
use dxdp::tools::shell::{self, Shell};
use dxdp_core::devices::Resource;
use dxdp_core::pipeline;

/// Arguments of `dxdp mounts`.
#[derive(Debug, Args)]
pub(crate) struct MountsArgs {
    /// Select every device.
    #[arg(long)]
    all: bool,
    /// Select devices by position in `dxdp discover` order (0-based; repeatable, comma lists).
    #[arg(long, value_delimiter = ',', value_name = "N")]
    index: Vec<usize>,
    /// Select devices by kubelet device ID, as `discover` and the kubelet show them, replicas
    /// (`<id>-r<k>`) and memory units (`<id>-m<k>`) included (repeatable, comma lists).
    #[arg(long, value_delimiter = ',', value_name = "ID")]
    id: Vec<String>,
    /// Select devices by adapter LUID (decimal or 0x hex; repeatable, comma lists).
    #[arg(long, value_delimiter = ',', value_name = "LUID")]
    luid: Vec<String>,
    /// Select devices by location path (repeatable, comma lists).
    #[arg(long, value_delimiter = ',', value_name = "PATH")]
    location_path: Vec<String>,
    /// Select devices by vendor name or PCI vendor ID (repeatable, comma lists).
    #[arg(long, value_delimiter = ',', value_name = "VENDOR")]
    vendor: Vec<String>,
    /// Select the devices of directx.microsoft.com/display.
    #[arg(long)]
    display: bool,
    /// Select the devices of directx.microsoft.com/compute.
    #[arg(long)]
    compute: bool,
    /// Output format: flags for ctr, nerdctl or docker, a json or yaml document (schema:
    /// docs/schemas/Mounts.schema.json), or an oci runtime-spec fragment (`--format` is an alias).
    #[arg(
        short = 'o',
        long = "output",
        alias = "format",
        value_enum,
        value_name = "FORMAT",
        default_value_t = FormatArg::Ctr
    )]
    format: FormatArg,
    /// Same as `-o json`.
    #[arg(long, conflicts_with = "format")]
    json: bool,
    /// Quote flags for this shell [default: powershell on Windows, sh elsewhere].
    #[arg(long, value_enum)]
    shell: Option<ShellArg>,
    /// Print, then execute `ctr run --rm <flags> <ARGS>` (image, container ID, command), and exit
    /// with ctr's exit code.
    #[arg(long, num_args = 1.., allow_hyphen_values = true, value_name = "ARGS")]
    run: Option<Vec<String>>,
    /// With --run: a global `ctr` argument placed before `run`, such as `--namespace=k8s.io`
    /// or `--address=\\.\pipe\containerd-containerd` (repeatable).
    #[arg(
        long = "ctr-arg",
        allow_hyphen_values = true,
        value_name = "ARG",
        requires = "run"
    )]
    ctr_args: Vec<String>,
    #[command(flatten)]
    pub(super) pipeline: super::PipelineArgs,
    #[command(flatten)]
    pub(super) assignment: super::AssignmentArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FormatArg {
    Ctr,
    Nerdctl,
    Docker,
    Json,
    Yaml,
    Oci,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ShellArg {
    Sh,
    Powershell,
    Cmd,
}

impl MountsArgs {
    fn selectors(&self) -> Vec<Selector> {
        let mut s = Vec::new();
        if self.all {
            s.push(Selector::All);
        }
        s.extend(self.index.iter().map(|&i| Selector::Index(i)));
        s.extend(self.id.iter().cloned().map(Selector::Id));
        s.extend(self.luid.iter().cloned().map(Selector::Luid));
        s.extend(
            self.location_path
                .iter()
                .cloned()
                .map(Selector::LocationPath),
        );
        s.extend(self.vendor.iter().cloned().map(Selector::Vendor));
        if self.display {
            s.push(Selector::Resource(Resource::Display));
        }
        if self.compute {
            s.push(Selector::Resource(Resource::Compute));
        }
        s
    }
}

/// Selects devices and prints (or runs) the flags.
pub(crate) fn run(
    args: &MountsArgs,
    config: &Config,
    source: &dyn HostFactsSource,
) -> anyhow::Result<ExitCode> {
    let facts = super::load_facts(source)?;
    let discovery = pipeline::discover(&facts, &config.pipeline);
    let devices = match select::select(&discovery, &args.selectors()) {
        Ok(devices) => devices,
        Err(e @ (SelectError::Nothing | SelectError::Invalid(_))) => {
            return Err(super::exit::UsageError(e.to_string()).into())
        }
        Err(e) => return Err(e.into()),
    };
    let shell = match args.shell {
        Some(ShellArg::Sh) => Shell::Sh,
        Some(ShellArg::Powershell) => Shell::PowerShell,
        Some(ShellArg::Cmd) => Shell::Cmd,
        None => Shell::native(),
    };
    let format = match if args.json {
        FormatArg::Json
    } else {
        args.format
    } {
        FormatArg::Ctr => Format::Ctr,
        FormatArg::Nerdctl => Format::Nerdctl,
        FormatArg::Docker => Format::Docker,
        FormatArg::Json => Format::Json,
        FormatArg::Yaml => Format::Yaml,
        FormatArg::Oci => Format::Oci,
    };
    if let Some(run_args) = &args.run {
        if format != Format::Ctr {
            bail!("--run starts `ctr run`; it works only with -o ctr");
        }
        return run_ctr(&devices, &args.ctr_args, run_args, shell);
    }
    let assignment = config
        .assignment
        .resolve(&facts.os.clone().unwrap_or_default());
    let rendered = mounts::render_with(&devices, format, shell, assignment);
    for note in &rendered.notes {
        super::notice(note);
    }
    std::io::stdout().write_all(rendered.text.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

fn run_ctr(
    devices: &[&dxdp_core::devices::Device],
    ctr_args: &[String],
    run_args: &[String],
    shell: Shell,
) -> anyhow::Result<ExitCode> {
    let edits = dxdp_core::allocation::container_edits(devices);
    let mut argv = ctr_args.to_vec();
    argv.extend(["run".to_string(), "--rm".to_string()]);
    argv.extend(mounts::ctr_args(&edits));
    argv.extend(run_args.iter().cloned());
    eprintln!("+ ctr {}", shell::join(&argv, shell));
    let status = match std::process::Command::new("ctr").args(&argv).status() {
        Ok(status) => status,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("`ctr` was not found on PATH: install containerd (which ships ctr) or run the printed command where ctr is available")
        }
        Err(e) => return Err(e).context("cannot start ctr"),
    };
    Ok(match status.code() {
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}
