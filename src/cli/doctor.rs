//! `dxdp doctor`: preflight checks of this node.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use dxdp::backend::HostFactsSource;
use dxdp::config::{Config, Flags};
use dxdp::kubelet::KUBELET_SOCKET;
use dxdp::output::Status;
use dxdp::tools::doctor::{self, DirState, Probes};
use dxdp_core::devices::Resource;
use dxdp_core::pipeline;

use super::ResourceArg;

/// Arguments of `dxdp doctor`.
#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    #[command(flatten)]
    output: super::OutputArgs,
    /// The kubelet's device-plugin directory [default: as for `dxdp plugin`].
    #[arg(long, env = "DXDP_KUBELET_DIR", value_name = "DIR")]
    kubelet_dir: Option<PathBuf>,
    /// The resources the plugin serves, comma-separated [env: DXDP_RESOURCES; default: both].
    #[arg(long, value_enum, value_delimiter = ',')]
    resources: Option<Vec<ResourceArg>>,
    #[command(flatten)]
    pipeline: super::PipelineArgs,
    #[command(flatten)]
    assignment: super::AssignmentArgs,
}

impl DoctorArgs {
    /// Puts the configuration flags into `flags`.
    pub(super) fn apply(&self, flags: &mut Flags) {
        self.pipeline.apply(flags);
        self.assignment.apply(flags);
        flags.resources = super::resources(&self.resources);
    }
}

fn dir_state(dir: &Path) -> DirState {
    if !dir.is_dir() {
        return DirState::Missing;
    }
    let probe = dir.join(format!(".dxdp-doctor-{}", std::process::id()));
    match std::fs::write(&probe, b"") {
        Ok(()) => {
            let _ = std::fs::remove_file(&probe);
            DirState::Writable
        }
        Err(e) => DirState::NotWritable(e.to_string()),
    }
}

fn containerd(
    source: &dyn HostFactsSource,
    snapshot_version: Option<String>,
) -> Option<(String, String)> {
    if source.is_simulated() {
        return snapshot_version.map(|v| (v, "from the host snapshot".to_string()));
    }
    let out = std::process::Command::new("containerd")
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Some((text, "containerd --version".to_string()))
}

/// The kubelet version: from the snapshot on a simulated host, else `kubelet --version` (on
/// `PATH`, then `C:\k\kubelet.exe` on Windows, where most installers put it). `None` when it
/// cannot be found; the check is then skipped.
fn kubelet(
    source: &dyn HostFactsSource,
    snapshot_version: Option<String>,
) -> Option<(String, String)> {
    if source.is_simulated() {
        return snapshot_version.map(|v| (v, "from the host snapshot".to_string()));
    }
    let candidates: &[&str] = if cfg!(windows) {
        &["kubelet", r"C:\k\kubelet.exe"]
    } else {
        &["kubelet"]
    };
    candidates.iter().find_map(|exe| {
        let out = std::process::Command::new(exe)
            .arg("--version")
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !text.is_empty()).then(|| (text, format!("{exe} --version")))
    })
}

/// Runs the checks; exits 1 when any check fails.
pub(crate) fn run(
    args: &DoctorArgs,
    config: &Config,
    source: &dyn HostFactsSource,
    env: &dxdp::config::Env,
) -> anyhow::Result<ExitCode> {
    let facts = super::load_facts(source)?;
    let discovery = pipeline::discover(&facts, &config.pipeline);
    let kubelet_dir = dxdp::kubelet::paths::resolve(
        args.kubelet_dir.clone(),
        env.get("DXDP_KUBELET_DIR").map(String::as_str),
    );
    let dir = kubelet_dir.path;
    // A simulated host is not this machine: its kubelet directory is only checked when named.
    let check_dir = !source.is_simulated() || args.kubelet_dir.is_some();
    let resources: Vec<Resource> = config
        .resources
        .iter()
        .filter(|(_, s)| s.enabled)
        .map(|(r, _)| *r)
        .collect();
    let probes = Probes {
        kubelet_dir: dir.display().to_string(),
        kubelet_dir_reason: kubelet_dir.reason,
        kubelet_dir_state: if check_dir {
            dir_state(&dir)
        } else {
            DirState::NotChecked(
                "simulated host (pass --kubelet-dir to check a directory of this machine)".into(),
            )
        },
        kubelet_socket: check_dir.then(|| dir.join(KUBELET_SOCKET).exists()),
        containerd: containerd(
            source,
            facts.os.as_ref().and_then(|o| o.containerd_version.clone()),
        ),
        kubelet: kubelet(
            source,
            facts.os.as_ref().and_then(|o| o.kubelet_version.clone()),
        ),
        resources,
        assignment: config.assignment,
        expected: config.expected_counts(),
        pod_resources_users: pod_resources_users(config),
    };
    let checks = doctor::checks(&facts, &discovery, &probes);
    let text = if args.output.is_document() {
        let count = |s| checks.iter().filter(|c| c.status == s).count();
        args.output.document(&dxdp::output::DoctorReportDoc {
            api_version: dxdp::output::ApiVersion,
            kind: dxdp::output::DoctorReportKind,
            checks: &checks,
            summary: dxdp::output::DoctorSummary {
                pass: count(Status::Pass),
                warn: count(Status::Warn),
                fail: count(Status::Fail),
                info: count(Status::Info),
            },
            ok: !doctor::failed(&checks),
        })?
    } else {
        doctor::text(&checks)
    };
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(if doctor::failed(&checks) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The settings of `config` that read the kubelet's PodResources API: per-pod telemetry (and
/// with it the isolation audit) and `GPUUnhealthy` Events on pods.
fn pod_resources_users(config: &Config) -> Vec<String> {
    let mut users = Vec::new();
    if config.telemetry.enabled {
        users.push("telemetry.enabled".to_string());
    }
    if config.health_reports.events {
        users.push("health.events".to_string());
    }
    users
}
