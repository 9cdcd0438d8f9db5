//! `dxdp audit`: whether containers stay on the GPUs they were allocated. On a node, per pod
//! container the allocated against the used GPUs (from a running daemon's `/metrics` or by
//! sampling the counters here, as `dxdp top` does); inside a container that dxdp gave GPUs
//! (`DXDP_ADAPTER_LUIDS` set), the adapters it can enumerate against the ones it was given.
//!
//! Exit codes: 0 clean, 1 violations (or the node leaks), 3 the audit could not tell (with why);
//! 2 is a usage error, as for every command.
//! An error is never exit code 1: it is a verdict `unknown`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use dxdp::backend::HostFactsSource;
use dxdp::config::Config;
use dxdp::output::{ApiVersion, AuditDoc, AuditKind, AuditScope, AuditVerdict};
use dxdp::telemetry::audit::audit_text;
use dxdp_core::assignment::Assignment;
use dxdp_core::telemetry::isolation::{audit, container_check, held, parse_luids};

use super::endpoint::EndpointArgs;
use super::top::Figures;
use super::{OutputArgs, OutputFormat};

/// The variable that makes `audit` check the container it runs in.
pub(crate) const LUIDS_VAR: &str = "DXDP_ADAPTER_LUIDS";

/// Arguments of `dxdp audit`.
#[derive(Debug, Args)]
pub(crate) struct AuditArgs {
    #[command(flatten)]
    endpoint: EndpointArgs,
    /// Seconds between the two reads of the counters that a utilisation needs, when sampling
    /// here.
    #[arg(long, value_name = "SECONDS", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    interval: u64,
    /// Audit the node even when DXDP_ADAPTER_LUIDS is set (by default its presence means "check
    /// this container").
    #[arg(long)]
    node: bool,
    #[command(flatten)]
    output: OutputArgs,
}

/// Runs the audit and prints it; the exit code is the verdict's.
pub(crate) fn run(
    args: &AuditArgs,
    config: Config,
    source: Arc<dyn HostFactsSource>,
    host_snapshot: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let luids = std::env::var(LUIDS_VAR).ok().filter(|_| !args.node);
    let doc = match luids {
        Some(luids) => in_container(&luids, source.as_ref()),
        None => on_node(args, config, source, host_snapshot),
    };
    let text = match args.output.format() {
        OutputFormat::Text => audit_text(&doc),
        _ => args.output.document(&doc)?,
    };
    super::write_stdout(text.as_bytes())?;
    Ok(ExitCode::from(doc.verdict.exit_code()))
}

fn doc(scope: AuditScope, source: String) -> AuditDoc {
    AuditDoc {
        api_version: ApiVersion,
        kind: AuditKind,
        scope,
        verdict: AuditVerdict::Unknown,
        reason: None,
        source,
        node: None,
        container: None,
        notes: Vec::new(),
    }
}

fn unknown(mut d: AuditDoc, why: impl Into<String>) -> AuditDoc {
    d.verdict = AuditVerdict::Unknown;
    d.reason = Some(why.into());
    d
}

/// The node: every pod container's use against its allocation.
fn on_node(
    args: &AuditArgs,
    config: Config,
    source: Arc<dyn HostFactsSource>,
    host_snapshot: Option<PathBuf>,
) -> AuditDoc {
    let class_guid = config.assignment == Assignment::ClassGuid;
    let mut figures = match Figures::new(&args.endpoint, config, source, host_snapshot) {
        Ok(f) => f,
        Err(e) => return unknown(doc(AuditScope::Node, "none".into()), format!("{e:#}")),
    };
    let mut d = doc(AuditScope::Node, figures.describe());
    if class_guid && args.endpoint.endpoint.is_none() {
        d.notes.push("assignment is class-guid: every container that gets a GPU sees every GPU of the node on purpose, but the scheduler accounted it only the GPUs it requested; a violation is a pod using GPUs it did not request (docs/isolation.md)".into());
    }
    let read = super::runtime().and_then(|rt| {
        rt.block_on(figures.read_with_allocations(Duration::from_secs(args.interval), true))
    });
    let (view, known) = match read {
        Ok(r) => r,
        Err(e) => return unknown(d, format!("{e:#}")),
    };
    if view.devices.is_empty() {
        return unknown(d, "there are no GPU figures: no device with telemetry here, or the daemon's telemetry is off or its last sample failed (see dxdp_telemetry_samples_total)");
    }
    if !known {
        return unknown(d, "the kubelet's PodResources API, the containers' process lists (HCS) or the runtime's CRI API did not answer the last call, so which pod holds or uses which GPU is unknown (a new pod would look unallocated); check telemetry.podResourcesEndpoint and telemetry.criEndpoint (dxdp_telemetry_*_calls_total)");
    }
    let report = audit(&view, &held(&view));
    d.verdict = if !report.violations.is_empty() {
        AuditVerdict::Violations
    } else if let Some(why) = &report.undetermined {
        d.reason = Some(why.clone());
        AuditVerdict::Unknown
    } else {
        AuditVerdict::Clean
    };
    if view.window_seconds == 0.0 {
        d.notes
            .push("one counter sample only: use is judged by memory, not by engine time".into());
    }
    d.node = Some(report);
    d
}

/// This container: what DXCore enumerates here against what it was given.
fn in_container(luids: &str, source: &dyn HostFactsSource) -> AuditDoc {
    let mut d = doc(
        AuditScope::Container,
        format!("DXCore in this container ({})", source.describe()),
    );
    if source.is_simulated() {
        super::notice(&format!("simulated host: using {}", source.describe()));
    }
    let given = match parse_luids(luids) {
        Ok(l) => l,
        Err(why) => return unknown(d, format!("{LUIDS_VAR}={luids:?}: {why}")),
    };
    let facts = match source.load() {
        Ok(f) => f,
        Err(e) => {
            return unknown(
                d,
                format!("cannot enumerate the adapters in this container: {e}"),
            )
        }
    };
    let visible: Vec<(i64, String)> = facts
        .adapters
        .iter()
        .filter(|a| a.is_hardware)
        .map(|a| (a.luid, a.driver_description.clone()))
        .collect();
    if visible.is_empty() {
        return unknown(d, "DXCore enumerates no hardware adapter in this container: it was given no GPU (check the pod's resource request), or the adapters are hidden from this process");
    }
    let check = container_check(&given, &visible);
    if !check.missing.is_empty() {
        d.notes.push(format!(
            "{} of the adapters in {LUIDS_VAR} {} not visible here: the container did not get every GPU it was allocated",
            check.missing.len(),
            if check.missing.len() == 1 { "is" } else { "are" }
        ));
    }
    if check.leaks() {
        d.notes.push("with assignment class-guid this is by design (every GPU, on purpose); with location-path it is the leak docs/isolation.md describes: the scheduler cannot keep other pods' GPUs out of this container".into());
    }
    d.verdict = if check.leaks() {
        AuditVerdict::Violations
    } else {
        AuditVerdict::Clean
    };
    d.container = Some(check);
    d
}
