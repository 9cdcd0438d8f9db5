//! Command-line interface: global options, subcommands and error reporting.

mod audit;
mod cleanup;
mod config_cmd;
mod demo;
mod discover;
mod doctor;
mod endpoint;
mod exit;
mod hcs;
mod mounts;
mod plugin;
mod snapshot;
mod top;
mod validate;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use dxdp_core::assignment::Assignment;
use dxdp_core::devices::Resource;

use dxdp::backend::{self, HostFactsSource};
use dxdp::config::{self, Flags, Inputs, Resolved};
use dxdp::logging::{self, LogFormat};
use dxdp_core::facts::HostFacts;

/// `dxdp --version`: the version, the git commit it was built from and the target.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("DXDP_GIT_COMMIT"),
    ", ",
    env!("DXDP_TARGET"),
    ")"
);

/// Kubernetes device plugins for DirectX GPUs and compute accelerators in Windows containers.
#[derive(Debug, Parser)]
#[command(
    name = "dxdp",
    version = VERSION,
    about,
    propagate_version = true,
    after_help = "Exit codes: 0 success, 1 error or a failed check, 2 usage error, 3 a check could not tell \
                  (doctor, hcs, audit); each command's --help lists its own (docs/tools.md#exit-codes)."
)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

/// Options every command accepts, before or after the subcommand.
#[derive(Debug, Args)]
struct GlobalArgs {
    /// Read host facts from this host snapshot file (YAML or JSON) instead of the host;
    /// `builtin:sample` is the built-in sample host (off Windows the default of every command
    /// but `plugin`, which serves it only when asked).
    #[arg(long, global = true, env = "DXDP_HOST_SNAPSHOT", value_name = "FILE")]
    host_snapshot: Option<PathBuf>,

    /// Configuration file [default: DXDP_CONFIG, else /etc/directx-device-plugins/config.yaml
    /// (C:\etc\directx-device-plugins\config.yaml on Windows) when present].
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,

    /// Apply this named configuration (`configurations.NAME` in the configuration file) instead
    /// of the one the node's `directx.microsoft.com/device-plugin.config` label selects
    /// [env: DXDP_CONFIGURATION].
    #[arg(long, global = true, value_name = "NAME")]
    configuration: Option<String>,

    /// Log format on stderr: `text` or `json` [env: DXDP_LOG_FORMAT; default: text].
    #[arg(long, global = true)]
    log_format: Option<LogFormat>,

    /// Log level or tracing filter (error, warn, info, debug, trace) [env: DXDP_LOG_LEVEL;
    /// default: info, warn for demo].
    #[arg(long, global = true, value_parser = |s: &str| config::values::LogLevelName::try_from(s.to_string()))]
    log_level: Option<config::values::LogLevelName>,
}

/// The output format of a command with machine output (`-o/--output`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutputFormat {
    /// For people (the default).
    #[default]
    Text,
    /// One JSON document (`apiVersion`, `kind`; schema in docs/schemas/).
    Json,
    /// The same document as YAML.
    Yaml,
}

/// `-o/--output json|yaml|text` (with `--json` kept as an alias of `-o json`), shared by every
/// command with machine output.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct OutputArgs {
    /// Output format: text (for people), json or yaml (one document with apiVersion and kind;
    /// its JSON Schema is in docs/schemas/).
    #[arg(short = 'o', long = "output", value_enum, value_name = "FORMAT")]
    pub(crate) output: Option<OutputFormat>,
    /// Same as `-o json`.
    #[arg(long, conflicts_with = "output")]
    pub(crate) json: bool,
}

impl OutputArgs {
    /// The format asked for.
    pub(crate) fn format(&self) -> OutputFormat {
        match (self.output, self.json) {
            (Some(f), _) => f,
            (None, true) => OutputFormat::Json,
            (None, false) => OutputFormat::Text,
        }
    }

    /// Whether the output is a document (JSON or YAML) rather than text for people.
    pub(crate) fn is_document(&self) -> bool {
        self.format() != OutputFormat::Text
    }

    /// `doc` in the format asked for: JSON (as `--json` always wrote it) or YAML; text is the
    /// caller's business (this gives JSON then).
    pub(crate) fn document<T: serde::Serialize>(&self, doc: &T) -> anyhow::Result<String> {
        match self.format() {
            OutputFormat::Yaml => dxdp::output::to_yaml(doc),
            OutputFormat::Json | OutputFormat::Text => Ok(dxdp::output::to_json(doc)),
        }
    }
}

/// A resource on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ResourceArg {
    /// directx.microsoft.com/display
    Display,
    /// directx.microsoft.com/compute
    Compute,
}

/// The resources named on the command line.
fn resources(list: &Option<Vec<ResourceArg>>) -> Option<Vec<Resource>> {
    list.as_ref()
        .map(|l| l.iter().map(|&r| Resource::from(r)).collect())
}

impl From<ResourceArg> for Resource {
    fn from(r: ResourceArg) -> Self {
        match r {
            ResourceArg::Display => Resource::Display,
            ResourceArg::Compute => Resource::Compute,
        }
    }
}

/// An assignment mode on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum AssignmentArg {
    /// vpci-location-path://<path>: one device (HCS schema 2.2+)
    LocationPath,
    /// class/5B45201D-...: every display adapter of the node
    ClassGuid,
    /// location-path on HCS schema 2.2+, else class-guid
    Auto,
}

/// `--assignment`, for every command whose answer depends on it.
#[derive(Debug, Clone, Args)]
struct AssignmentArgs {
    /// How containers get devices [env: DXDP_ASSIGNMENT; default: auto].
    #[arg(long, value_enum)]
    assignment: Option<AssignmentArg>,
}

impl AssignmentArgs {
    fn apply(&self, flags: &mut Flags) {
        flags.assignment = self.assignment.map(|a| match a {
            AssignmentArg::LocationPath => Assignment::LocationPath,
            AssignmentArg::ClassGuid => Assignment::ClassGuid,
            AssignmentArg::Auto => Assignment::Auto,
        });
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
    fn apply(&self, flags: &mut Flags) {
        flags.include_integrated = self.include_integrated;
        flags.include_detachable = self.include_detachable;
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the DirectX devices of the host (a table with the index `mounts --index` takes),
    /// what was left out and why, and warnings.
    #[command(after_help = exit::HELP)]
    Discover(discover::DiscoverArgs),
    /// Write the host facts as a host snapshot (for bug reports and replay).
    #[command(after_help = exit::HELP)]
    Snapshot(snapshot::SnapshotArgs),
    /// Run the device plugin daemon: serve both resources to the kubelet.
    #[command(
        after_help = "Exit codes: 0 stopped by a signal (gracefully), 1 stopped on an error, 2 usage error."
    )]
    Plugin(plugin::PluginArgs),
    /// Run the plugin against an in-process kubelet stand-in and show what containerd receives.
    #[command(after_help = exit::HELP)]
    Demo(demo::DemoArgs),
    /// Print the flags that give a standalone container devices and their runtime files.
    #[command(
        after_help = "Exit codes: 0 success, 1 error (such as a selector that matches no device), 2 usage error; \
                      with --run, ctr's own exit code."
    )]
    Mounts(mounts::MountsArgs),
    /// Show the OS, the HCS schema versions and whether devices can be assigned by location path.
    #[command(
        after_help = "Exit codes: 0 the configured assignment works here, 1 it does not, 2 usage error, \
                      3 could not tell (the host facts could not be read; why is printed)."
    )]
    Hcs(hcs::HcsArgs),
    /// Check whether this node can run dxdp, with a remedy for every problem.
    #[command(
        after_help = "Exit codes: 0 no check failed (warnings allowed), 1 a check failed, 2 usage error, \
                      3 could not tell (the host facts or the configuration could not be read; why is printed)."
    )]
    Doctor(doctor::DoctorArgs),
    /// Show the node's GPUs at a glance: utilisation, memory, processes and the pods holding them.
    #[command(after_help = exit::HELP)]
    Top(top::TopArgs),
    /// Check that containers use only the GPUs they were allocated (on the node, or inside a
    /// container given GPUs).
    #[command(
        after_help = "Exit codes: 0 clean, 1 violations, 2 usage error, 3 could not tell (why is printed)."
    )]
    Audit(audit::AuditArgs),
    /// Remove what dxdp put on nodes (its labels, the isolation taint, its node conditions), and
    /// with its namespace its DaemonSet (first) and validation Jobs, for an uninstall or after a
    /// crash: exit code 0 done, 1 a part could not be done.
    #[command(
        after_help = "Exit codes: 0 everything clean (or, with --dry-run, read), 1 a node, the DaemonSet or the Jobs could not be cleaned (or the nodes could not be listed), 2 usage error."
    )]
    Cleanup(cleanup::CleanupArgs),
    /// Check, inside a container given GPUs, that they and their APIs work (D3D12, runtime
    /// files, CUDA, NVML, OpenCL, Vulkan, video encoders): exit code 0 pass, 1 fail, 3 unknown.
    #[command(
        after_help = "Exit codes: 0 passed, 1 a check failed or timed out, 2 usage error, 3 could not tell (why is printed)."
    )]
    Validate(validate::ValidateArgs),
    /// Show the effective configuration, or check a configuration file.
    #[command(
        subcommand,
        after_help = "Exit codes: 0 success (config check: the file is valid), 1 error (config check: the \
                      file is invalid or cannot be read), 2 usage error."
    )]
    Config(config_cmd::ConfigCommand),
    /// Print a shell completion script (bash, zsh, fish, powershell, elvish).
    #[command(after_help = exit::HELP)]
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the version, the git commit it was built from and the target (as `--version`).
    #[command(after_help = exit::HELP)]
    Version,
    /// Write man pages (roff): dxdp.1 and one per subcommand.
    #[command(after_help = exit::HELP)]
    Man {
        /// The directory to write them to.
        #[arg(long, value_name = "DIR")]
        out_dir: PathBuf,
    },
}

impl Command {
    /// The exit code of an error: "could not tell" for the checks with a verdict (an error
    /// there is never "failed"), else 1.
    fn error_code(&self) -> u8 {
        match self {
            Command::Doctor(_) | Command::Hcs(_) | Command::Audit(_) | Command::Validate(_) => {
                exit::COULD_NOT_TELL
            }
            _ => exit::FAILED,
        }
    }

    /// The configuration flags this command was given.
    fn flags(&self) -> Flags {
        let mut flags = Flags::default();
        match self {
            Command::Discover(a) => a.pipeline.apply(&mut flags),
            Command::Plugin(a) => a.apply(&mut flags),
            Command::Demo(a) => a.apply(&mut flags),
            Command::Mounts(a) => {
                a.pipeline.apply(&mut flags);
                a.assignment.apply(&mut flags);
            }
            Command::Hcs(a) => a.assignment.apply(&mut flags),
            Command::Doctor(a) => a.apply(&mut flags),
            Command::Snapshot(_)
            | Command::Top(_)
            | Command::Audit(_)
            | Command::Cleanup(_)
            | Command::Validate(_)
            | Command::Config(_)
            | Command::Completion { .. }
            | Command::Version
            | Command::Man { .. } => {}
        }
        flags
    }
}

/// What the configuration is built from for this invocation.
fn inputs(cli: &Cli) -> Inputs {
    let mut env = config::process_env();
    // The reference plugin's default files (wddm.yaml, mcdm.yaml) are read from its directory.
    env.entry(config::REFERENCE_DIR_VAR.to_string())
        .or_insert_with(|| config::default_reference_dir().display().to_string());
    let mut flags = cli.command.flags();
    flags.log_level = cli.global.log_level.clone();
    flags.log_format = cli.global.log_format;
    flags.configuration = cli.global.configuration.clone();
    let file = config::choose_path(cli.global.config.as_deref(), &env);
    // In a HostProcess container on containerd 1.6, volumes are under the sandbox mount point.
    let sandbox = env.get(dxdp::util::host_process::SANDBOX_VAR).cloned();
    let file = config::resolve_in_sandbox(
        file,
        &mut env,
        &config::default_path(),
        sandbox.as_deref(),
        |p| p.exists(),
    );
    Inputs {
        file,
        env,
        flags,
        node: None,
    }
}

/// Reads the configuration of `inputs` (the one [`Inputs::resolve`]) on a thread of its own: a
/// configuration file on a hung file system must not hang the command without a word.
fn read(inputs: &Inputs) -> Result<Resolved, String> {
    let what = inputs.reading();
    let inputs = inputs.clone();
    dxdp::util::bounded::run_thread(dxdp::plugin::DEFAULT_READ_LIMIT, &what, move || {
        inputs.resolve()
    })
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())
}

/// Parses arguments, runs the command and turns errors into a message and exit code 1 (3, "could
/// not tell", for the checks: see [`exit`]).
pub(crate) fn main() -> ExitCode {
    // Discovery's one-shot D3D12 child (a variable, not a subcommand: nobody runs it by hand).
    if let Some(code) = dxdp::backend::probe::feature_level_child() {
        return code;
    }
    let cli = Cli::parse();
    let error_code = exit::code(cli.command.error_code());
    if matches!(cli.command, Command::Plugin(_)) {
        // First thing: a stop (hcsshim's CTRL_SHUTDOWN_EVENT) during start-up must not end the
        // process before it can clean up. A failure is logged when the daemon waits for a stop.
        let _ = dxdp::shutdown::install();
    }
    let inputs = inputs(&cli);
    // The daemon starts with the last configuration the node served when the file is rejected.
    let read = match &cli.command {
        Command::Plugin(args) => plugin::read(args, &inputs),
        _ => read(&inputs).map(|c| (c, None)),
    };
    let (config, last_served) = match read {
        Ok(c) => c,
        Err(e) => {
            // The configuration (with logFormat) is what failed: the flag or environment
            // still choose the format of the error.
            let format = cli.global.log_format.or_else(|| {
                inputs
                    .env
                    .get("DXDP_LOG_FORMAT")
                    .and_then(|f| f.parse().ok())
            });
            fatal(format.unwrap_or_default(), &e, false);
            return error_code;
        }
    };
    let level_is_default = config
        .origin_of(dxdp::config::keys::Key::LogLevel)
        .is_default();
    let level = match &cli.command {
        Command::Demo(_) if level_is_default => "warn",
        _ => config.log_level.0.as_str(),
    };
    let _ = NOTICE_FORMAT.set(config.log_format);
    // Kept until main returns: dropping it writes out the queued log lines.
    let _log_guard = match logging::init(config.log_format, level) {
        Ok(guard) => guard,
        Err(e) => {
            // A log level that is not one: a bad option value, as clap's.
            fatal(config.log_format, &e.to_string(), false);
            return exit::code(exit::USAGE);
        }
    };
    // How the configuration was built, when an operator must know (`config show` prints the
    // notices on stdout; the plugin logs them with the configuration it applies).
    match &cli.command {
        Command::Plugin(_) => {}
        Command::Config(config_cmd::ConfigCommand::Show { .. }) => {
            if let Some(w) = &config.selection.warning {
                warning(w);
            }
        }
        _ => {
            for n in config.notices.iter().chain(&config.selection.warning) {
                warning(n);
            }
        }
    }
    let format = config.log_format;
    match run(cli, config, inputs, last_served) {
        Ok(code) => code,
        Err(e) => {
            // The log lines that led here first, then the error.
            logging::flush();
            fatal(format, &format!("{e:#}"), true);
            if e.is::<exit::UsageError>() {
                exit::code(exit::USAGE)
            } else {
                error_code
            }
        }
    }
}

fn run(
    cli: Cli,
    config: Resolved,
    inputs: Inputs,
    last_served: Option<plugin::LastServed>,
) -> anyhow::Result<ExitCode> {
    if matches!(cli.command, Command::Plugin(_))
        && cli.global.host_snapshot.is_none()
        && !cfg!(windows)
    {
        // A kubelet on this machine must not be handed the sample host's fictitious GPUs by
        // mistake (issue 35): the sample host is served only when asked for.
        fatal(
            config.log_format,
            &format!(
                "dxdp plugin has no host to read on this OS (it reads DXCore and the device tree on Windows): give --host-snapshot FILE (or DXDP_HOST_SNAPSHOT), or --host-snapshot {} to serve the built-in sample host's fictitious GPUs",
                backend::BUILTIN_SAMPLE
            ),
            true,
        );
        return Ok(exit::code(exit::USAGE));
    }
    let source = backend::select(cli.global.host_snapshot.clone());
    // The snapshot *file*, for the parts that read more of it (telemetry); not the built-in
    // sample host.
    let host_snapshot = backend::snapshot_file(cli.global.host_snapshot.clone());
    match cli.command {
        Command::Discover(args) => discover::run(&args, &config, source.as_ref()),
        Command::Snapshot(args) => {
            snapshot::run(&args, &config, source.as_ref(), host_snapshot.as_deref())
        }
        Command::Plugin(args) => {
            let plugin_inputs = (config, inputs, last_served);
            plugin::run(&args, plugin_inputs, source.into(), host_snapshot.clone())
        }
        Command::Demo(args) => demo::run(&args, config.config, source.into()),
        Command::Mounts(args) => mounts::run(&args, &config, source.as_ref()),
        Command::Hcs(args) => hcs::run(&args, &config, source.as_ref()),
        Command::Doctor(args) => doctor::run(&args, &config, source.as_ref(), &inputs.env),
        Command::Top(args) => top::run(&args, config.config, source.into(), host_snapshot),
        Command::Audit(args) => audit::run(&args, config.config, source.into(), host_snapshot),
        Command::Cleanup(args) => cleanup::run(&args),
        Command::Validate(args) => validate::run(&args, source.into()),
        Command::Config(cmd) => {
            let (config, inputs) = match &cmd {
                config_cmd::ConfigCommand::Show { .. } => with_node_selection(config, inputs)?,
                _ => (config, inputs),
            };
            config_cmd::run(&cmd, &config, &inputs)
        }
        Command::Completion { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "dxdp", &mut script);
            write_stdout(&script)
        }
        Command::Man { out_dir } => man_pages(&out_dir),
        Command::Version => write_stdout(format!("dxdp {VERSION}\n").as_bytes()),
    }
}

/// With `NODE_NAME` and Kubernetes credentials, reads the node's labels (as the daemon does at
/// start) so that `config show` shows the named configuration the node selects; otherwise says
/// why not and keeps the configuration as it is.
fn with_node_selection(config: Resolved, mut inputs: Inputs) -> anyhow::Result<(Resolved, Inputs)> {
    use dxdp::cluster::{Cluster, NODE_NAME_VAR};
    let Some(node) = inputs
        .env
        .get(NODE_NAME_VAR)
        .filter(|n| !n.trim().is_empty())
        .cloned()
    else {
        return Ok((config, inputs));
    };
    let node_read = runtime()?.block_on(async {
        let cluster = Cluster::connect(Some(&node))
            .await
            .map_err(|e| e.to_string())?;
        tokio::time::timeout(std::time::Duration::from_secs(5), cluster.get())
            .await
            .map_err(|_| format!("the API server did not answer within 5 s for node {node}"))?
            .map_err(|e| e.to_string())
    });
    match node_read {
        Ok(info) => {
            inputs.node = Some(info);
            let before = config.selection.warning.clone();
            let config = read(&inputs).map_err(anyhow::Error::msg)?;
            if let Some(w) = config
                .selection
                .warning
                .as_ref()
                .filter(|w| Some(*w) != before.as_ref())
            {
                warning(w);
            }
            Ok((config, inputs))
        }
        Err(why) => {
            notice(&format!(
                "cannot read node {node}'s labels, so no named configuration is selected by label: {why}"
            ));
            Ok((config, inputs))
        }
    }
}

/// Writes `dxdp.1` and `dxdp-<subcommand>.1` into `dir`.
fn man_pages(dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the man page directory {}", dir.display()))?;
    let cmd = Cli::command();
    let mut pages = vec![("dxdp".to_string(), cmd.clone())];
    for sub in cmd.get_subcommands() {
        let name = format!("dxdp-{}", sub.get_name());
        pages.push((name.clone(), sub.clone().display_name(name)));
    }
    for (name, page) in pages {
        let path = dir.join(format!("{name}.1"));
        let mut roff = Vec::new();
        clap_mangen::Man::new(page)
            .title(name.to_uppercase())
            .render(&mut roff)
            .with_context(|| format!("cannot render the man page {name}"))?;
        std::fs::write(&path, roff).with_context(|| format!("cannot write {}", path.display()))?;
        write_stdout(format!("{}\n", path.display()).as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes to stdout; a reader that went away (`| head`) ends the command quietly.
fn write_stdout(bytes: &[u8]) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e).context("cannot write to stdout"),
    }
}

/// The error that ends the process: `error: …` on stderr, or one JSON log line (level ERROR) when
/// logs are JSON, so that a log collector sees it as it sees every other line.
fn fatal(format: LogFormat, message: &str, logging_ready: bool) {
    match format {
        LogFormat::Json => {
            // The configuration failed before logging was set up: set it up for this line.
            let _guard = (!logging_ready)
                .then(|| logging::init(LogFormat::Json, "error").ok())
                .flatten();
            tracing::error!("{message}");
            logging::flush();
        }
        LogFormat::Text => eprintln!("error: {message}"),
    }
}

/// The log format, for [`notice`].
static NOTICE_FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

/// Something the user must see whatever the log level: a plain `note:` line on stderr, or a
/// warning log event when logs are JSON (so stderr stays JSON lines).
fn notice(message: &str) {
    match NOTICE_FORMAT.get() {
        Some(LogFormat::Json) => tracing::warn!("{message}"),
        _ => eprintln!("note: {message}"),
    }
}

/// Like [`notice`], for something that may be a mistake: a `warning:` line on stderr, or a
/// warning log event when logs are JSON.
fn warning(message: &str) {
    match NOTICE_FORMAT.get() {
        Some(LogFormat::Json) => tracing::warn!("{message}"),
        _ => eprintln!("warning: {message}"),
    }
}

/// A multi-threaded tokio runtime for the commands that serve gRPC.
/// The async runtime: two workers whatever the node's size (a device plugin waits on events;
/// on a 64-core node tokio's default would be 64 idle threads), and blocking threads (file
/// reads, host scans) that end one second after their last job instead of ten.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(1, 2));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_keep_alive(std::time::Duration::from_secs(1))
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Loads host facts, telling stderr when they are simulated.
fn load_facts(source: &dyn HostFactsSource) -> anyhow::Result<HostFacts> {
    if source.is_simulated() {
        notice(&format!("simulated host: using {}", source.describe()));
    }
    source
        .load()
        .with_context(|| format!("cannot collect host facts from {}", source.describe()))
}
