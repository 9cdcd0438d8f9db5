//! `dxdp snapshot`: write the current host facts as a host snapshot.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, ValueEnum};

use dxdp::backend::HostFactsSource;
use dxdp::config::Config;
use dxdp::kubelet::cri;
use dxdp::telemetry::sampler;
use dxdp_core::snapshot::{self, Format};
use dxdp_core::telemetry::{ContainerProcesses, TelemetryFacts};

/// Arguments of `dxdp snapshot`.
#[derive(Debug, Args)]
pub(crate) struct SnapshotArgs {
    /// Write to this file instead of stdout. As everywhere else, `-o json` and `-o yaml` (a bare
    /// format name) choose the format and write to stdout.
    #[arg(short, long, value_name = "FILE|FORMAT")]
    output: Option<PathBuf>,
    /// Document format [default: yaml, or from the file's extension .json].
    #[arg(long, value_enum)]
    format: Option<SnapshotFormat>,
    /// Same as `-o json`: JSON on stdout.
    #[arg(long, conflicts_with_all = ["output", "format"])]
    json: bool,
    /// Do not record the GPU telemetry section (by default two reads of the GPU counters one
    /// second apart where they exist, with the containers' processes and pods, or the telemetry
    /// of the --host-snapshot being rewritten).
    #[arg(long)]
    no_telemetry: bool,
    /// Record the GPU fault events the Windows event log holds from this long ago on
    /// (display-driver resets, WER LiveKernelEvent reports) in `faults`, e.g. 90m, 24h, 7d; 0
    /// records none. On a host snapshot being rewritten its own `faults` are kept.
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = faults_since)]
    faults_since: std::time::Duration,
}

/// The longest `--faults-since`.
const MAX_FAULTS_SINCE: std::time::Duration = dxdp_core::health::feed::MAX_LOOKBACK;

/// Parses `--faults-since`: `0`, or a number with `s`, `m`, `h` or `d`, at most 14 days.
fn faults_since(text: &str) -> Result<std::time::Duration, String> {
    let t = text.trim();
    if t == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    let (number, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{t:?} is not a duration: write 0, 90m, 24h or 7d"))?;
    let secs = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        "d" => n.saturating_mul(86_400),
        _ => return Err(format!("{t:?} is not a duration: write 0, 90m, 24h or 7d")),
    };
    let d = std::time::Duration::from_secs(secs);
    if d > MAX_FAULTS_SINCE {
        return Err(format!("{t:?} is longer than the 14 days dxdp reads back"));
    }
    Ok(d)
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum SnapshotFormat {
    Yaml,
    Json,
}

impl SnapshotArgs {
    /// Where to write (a file, or stdout) and in which format: `-o json|yaml` is a format, any
    /// other `-o` value a file; `--format` wins, else a `.json` file is JSON, else YAML.
    fn destination(&self) -> (Option<PathBuf>, SnapshotFormat) {
        if self.json {
            return (None, SnapshotFormat::Json);
        }
        let word = self.output.as_ref().and_then(|p| p.to_str());
        let (file, implied) = match word {
            Some("json") => (None, Some(SnapshotFormat::Json)),
            Some("yaml") => (None, Some(SnapshotFormat::Yaml)),
            _ => {
                let ext = self
                    .output
                    .as_ref()
                    .and_then(|p| p.extension())
                    .and_then(|e| e.to_str());
                let implied = ext
                    .filter(|e| e.eq_ignore_ascii_case("json"))
                    .map(|_| SnapshotFormat::Json);
                (self.output.clone(), implied)
            }
        };
        (
            file,
            self.format.or(implied).unwrap_or(SnapshotFormat::Yaml),
        )
    }
}

/// How long apart the two reads of the GPU counters are, so that a replay has a utilisation.
const TELEMETRY_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);

/// The telemetry section to record: the snapshot's own when rewriting one, else two reads of the
/// GPU counters where they exist (none, with a note, when they cannot be read), with the
/// containers' processes (HCS) and their pods (CRI at `telemetry.criEndpoint`).
fn telemetry(host_snapshot: Option<&std::path::Path>, config: &Config) -> Option<TelemetryFacts> {
    if let Some(path) = host_snapshot {
        return snapshot::read_file_full(path).ok().and_then(|(_, t)| t);
    }
    let source = dxdp::backend::select_counters(None).ok()?;
    let read = || match source.read() {
        Ok(t) => Some(t),
        Err(why) => {
            super::notice(&format!("no GPU telemetry recorded: {why}"));
            None
        }
    };
    let mut first = read()?;
    std::thread::sleep(TELEMETRY_WINDOW);
    let second = read()?;
    first.samples.extend(second.samples);
    first.containers = containers(config);
    Some(first)
}

/// The running containers with their processes and, where the container runtime names them,
/// their pods; none (with a note saying why) without HCS.
fn containers(config: &Config) -> Vec<ContainerProcesses> {
    let lister = match dxdp::backend::native_containers() {
        Ok(l) => l,
        Err(why) => {
            super::notice(&format!("no container processes recorded: {why}"));
            return Vec::new();
        }
    };
    let mut containers = match lister.list() {
        Ok(listing) => {
            for (id, why) in &listing.unreadable {
                super::notice(&format!(
                    "container {id} left out: its processes cannot be read: {why}"
                ));
            }
            listing.containers
        }
        Err(why) => {
            super::notice(&format!("no container processes recorded: {why}"));
            return Vec::new();
        }
    };
    let endpoint = sampler::cri_endpoint(config.telemetry.cri_endpoint.as_ref());
    let pods = super::runtime()
        .map_err(|e| format!("{e:#}"))
        .and_then(|rt| {
            rt.block_on(cri::list_pods(&endpoint, sampler::CRI_TIMEOUT))
                .map_err(|e| e.to_string())
        });
    match pods {
        Ok(pods) => {
            for c in &mut containers {
                c.pod = pods.get(&c.id).cloned();
            }
        }
        Err(why) => super::notice(&format!(
            "the containers are recorded without their pods: {why}"
        )),
    }
    containers
}

/// Adds the fault events of the event log's last `since` to `facts` (none, with a note saying
/// why, where the event log cannot be read).
fn record_faults(facts: &mut dxdp_core::facts::HostFacts, since: std::time::Duration) {
    let recorded = dxdp::backend::native_event_log()
        .and_then(|log| dxdp::backend::eventlog::recent_faults(log.as_ref(), since));
    match recorded {
        Ok((records, _)) => {
            if !records.is_empty() {
                super::notice(&format!(
                    "recorded {} GPU fault event(s) of the last {} s from the event log",
                    records.len(),
                    since.as_secs()
                ));
            }
            facts.faults = dxdp_core::health::feed::merge(&facts.faults, records);
        }
        Err(why) => super::notice(&format!("no GPU fault events recorded: {why}")),
    }
}

/// Collects the facts and writes them.
pub(crate) fn run(
    args: &SnapshotArgs,
    config: &Config,
    source: &dyn HostFactsSource,
    host_snapshot: Option<&std::path::Path>,
) -> anyhow::Result<ExitCode> {
    let mut facts = super::load_facts(source)?;
    if host_snapshot.is_none() && !source.is_simulated() && !args.faults_since.is_zero() {
        record_faults(&mut facts, args.faults_since);
    }
    let (file, format) = args.destination();
    let format = match format {
        SnapshotFormat::Yaml => Format::Yaml,
        SnapshotFormat::Json => Format::Json,
    };
    let telemetry = if args.no_telemetry {
        None
    } else {
        telemetry(host_snapshot, config)
    };
    let text = snapshot::write_full(&facts, telemetry.as_ref(), format)?;
    match &file {
        Some(path) => {
            std::fs::write(path, text)
                .with_context(|| format!("cannot write host snapshot to {}", path.display()))?;
            tracing::info!("wrote host snapshot to {}", path.display());
        }
        None => std::io::stdout().write_all(text.as_bytes())?,
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn faults_since_takes_zero_and_units_up_to_fourteen_days() {
        assert_eq!(faults_since("0"), Ok(Duration::ZERO));
        assert_eq!(faults_since("90m"), Ok(Duration::from_secs(5400)));
        assert_eq!(faults_since("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(faults_since("14d"), Ok(Duration::from_secs(14 * 86_400)));
        assert_eq!(faults_since("30s"), Ok(Duration::from_secs(30)));
        assert!(faults_since("15d").unwrap_err().contains("14 days"));
        assert!(faults_since("1w").unwrap_err().contains("not a duration"));
        assert!(faults_since("h").unwrap_err().contains("not a duration"));
        assert!(faults_since("").unwrap_err().contains("not a duration"));
    }
}
