//! `dxdp demo`: the plugin against an in-process kubelet stand-in, narrated.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;

use dxdp::backend::HostFactsSource;
use dxdp::config::{Config, Flags};
use dxdp::daemon::{ClusterChoice, Daemon};
use dxdp::kubelet::standin::{KubeletStandin, StandinView};
use dxdp::kubelet::v1beta1::AllocateResponse;
use dxdp::plugin::PluginConfig;
use dxdp_core::devices::{Discovery, Resource};
use dxdp_core::pipeline;
use dxdp_core::quote::clean;
use dxdp_core::sharing::{parse_memory_unit_id, MemorySharing, Served, Sharing};

/// Arguments of `dxdp demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Advertise each physical device this many times [default: 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    replicas: Option<u32>,
    #[command(flatten)]
    pipeline: super::PipelineArgs,
}

impl DemoArgs {
    /// Puts the configuration flags into `flags`.
    pub(super) fn apply(&self, flags: &mut Flags) {
        self.pipeline.apply(flags);
        flags.replicas = self.replicas;
    }
}

/// Runs the demo and prints it to stdout.
pub(crate) fn run(
    args: &DemoArgs,
    config: Config,
    source: Arc<dyn HostFactsSource>,
) -> anyhow::Result<ExitCode> {
    let dir = std::env::temp_dir().join(format!("dxdp-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let result = super::runtime()?.block_on(demo(args, config, source, dir.clone()));
    let _ = std::fs::remove_dir_all(&dir);
    let text = result?;
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

async fn demo(
    args: &DemoArgs,
    config: Config,
    source: Arc<dyn HostFactsSource>,
    dir: PathBuf,
) -> anyhow::Result<String> {
    let facts = source
        .load()
        .with_context(|| format!("cannot collect host facts from {}", source.describe()))?;
    let discovery = pipeline::discover(&facts, &config.pipeline);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "dxdp demo: the device plugin against an in-process kubelet stand-in"
    );
    let _ = writeln!(out, "Host facts:        {}", source.describe());
    let _ = writeln!(out, "Kubelet directory: {}", dir.display());
    // Show a GPU shared by memory: the compute GPUs, when the host has some, unless the
    // configuration shares a class by memory already or asks for replicas.
    let shares_memory = Resource::ALL
        .iter()
        .any(|r| config.memory_resource_name(*r).is_some());
    let config = if !shares_memory
        && args.replicas.is_none()
        && config.sharing(Resource::Compute) == Sharing::Replicas(1)
        && config
            .endpoints()
            .iter()
            .any(|(r, _)| *r == Resource::Compute)
        && discovery.devices_for(Resource::Compute).next().is_some()
    {
        let config = config.with_memory_sharing(Resource::Compute, 1 << 30, 1 << 30);
        let _ = writeln!(
            out,
            "Memory sharing:    on for compute GPUs, to show it (1 GiB units, 1 GiB kept back per GPU; resources.compute.memorySharing)"
        );
        config
    } else {
        config
    };

    let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, &dir)
        .await
        .context("cannot start the kubelet stand-in")?;
    let endpoints = dxdp::inventory::endpoints(&config);
    let names: Vec<String> = endpoints.iter().map(|(_, n)| n.clone()).collect();
    let mut plugin_config = PluginConfig::new(dir.clone());
    plugin_config.config = config.clone().into();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // The production graph, without an API server (the demo never touches a cluster).
    let daemon = tokio::spawn(
        Daemon::new(plugin_config, source)
            .cluster(ClusterChoice::Off)
            .run(async {
                let _ = stopped.await;
            }),
    );

    let ready = kubelet
        .wait_for(Duration::from_secs(10), |v| {
            names.iter().all(|n| v.devices(n).is_some())
        })
        .await;
    if !ready {
        let _ = stop.send(());
        let _ = daemon.await;
        kubelet.stop().await;
        bail!("the plugin did not register its resources within 10 s (run with --log-level info to see why)");
    }
    let view = kubelet.view();
    registration_section(&mut out, &view);
    devices_section(&mut out, &view, &discovery);

    for (step, (resource, name)) in (3..).zip(endpoints) {
        let name = name.as_str();
        if let Served::Memory(m) = dxdp::inventory::served(&config, resource, name) {
            memory_section(&mut out, &kubelet, (step, name), m).await;
            continue;
        }
        let _ = writeln!(out, "\n{step}. Allocate one {name} device");
        let healthy: Vec<String> = view
            .devices(name)
            .unwrap_or_default()
            .iter()
            .filter(|d| d.health == "Healthy")
            .map(|d| d.id.clone())
            .collect();
        if healthy.is_empty() {
            match config.memory_resource_name(resource) {
                Some(memory) => {
                    let _ = writeln!(
                        out,
                        "   (none advertised whole: {} GPUs with memory units are advertised under {memory})",
                        resource.as_str()
                    );
                }
                None => {
                    let _ = writeln!(
                        out,
                        "   (no healthy {} device on this host)",
                        resource.as_str()
                    );
                }
            }
            continue;
        }
        let policy = config.policy(resource).allocation.as_str();
        let _ = writeln!(
            out,
            "   GetPreferredAllocation: 1 of {} available IDs (policy {policy})",
            healthy.len()
        );
        let preferred = kubelet
            .preferred_allocation(name, &healthy, &[], 1)
            .await
            .unwrap_or_default();
        let _ = writeln!(out, "   Plugin prefers:   {}", preferred.join(", "));
        let Some(id) = preferred.first().or(healthy.first()).cloned() else {
            continue;
        };
        let _ = writeln!(out, "   Kubelet asks for: {id}");
        match kubelet.allocate(name, std::slice::from_ref(&id)).await {
            Ok(response) => containerd_section(&mut out, &response),
            Err(status) => {
                let _ = writeln!(out, "   Allocate failed: {}", status.message());
            }
        }
        // A second pod: the first pod's ID is no longer available.
        let rest: Vec<String> = healthy.into_iter().filter(|h| *h != id).collect();
        if !rest.is_empty() {
            let second = kubelet
                .preferred_allocation(name, &rest, &[], 1)
                .await
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "   A second pod: GetPreferredAllocation without {id}\n   Plugin prefers:   {}",
                second.join(", ")
            );
        }
    }

    let _ = stop.send(());
    daemon.await.context("the plugin task failed")??;
    kubelet.stop().await;
    let leftover = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("dxdp-"))
                .count()
        })
        .unwrap_or(0);
    let _ = writeln!(
        out,
        "\nStopped the plugin: {} of its sockets left behind.",
        if leftover == 0 {
            "none".to_string()
        } else {
            leftover.to_string()
        }
    );
    Ok(out)
}

/// The memory units a demo pod asks for.
const DEMO_UNITS: usize = 4;

/// A pod asking for `DEMO_UNITS` units of the memory resource `name`: the preferred units (all on
/// one GPU), what containerd receives (with the memory share), and a second pod.
async fn memory_section(
    out: &mut String,
    kubelet: &KubeletStandin,
    (step, name): (usize, &str),
    memory: MemorySharing,
) {
    let unit = bytes_text(memory.unit_bytes);
    let _ = writeln!(
        out,
        "\n{step}. Allocate {DEMO_UNITS} {name} units ({DEMO_UNITS} x {unit}, on one GPU)"
    );
    let healthy: Vec<String> = kubelet
        .view()
        .devices(name)
        .unwrap_or_default()
        .iter()
        .filter(|d| d.health == "Healthy")
        .map(|d| d.id.clone())
        .collect();
    if healthy.len() < DEMO_UNITS {
        let _ = writeln!(
            out,
            "   (fewer than {DEMO_UNITS} healthy units on this host)"
        );
        return;
    }
    let _ = writeln!(
        out,
        "   GetPreferredAllocation: {DEMO_UNITS} of {} available units",
        healthy.len()
    );
    let preferred = kubelet
        .preferred_allocation(name, &healthy, &[], DEMO_UNITS as i32)
        .await
        .unwrap_or_default();
    let _ = writeln!(out, "   Plugin prefers:   {}", preferred.join(", "));
    match kubelet.allocate(name, &preferred).await {
        Ok(response) => containerd_section(out, &response),
        Err(status) => {
            let _ = writeln!(out, "   Allocate failed: {}", status.message());
        }
    }
    let _ = writeln!(
        out,
        "   Nothing enforces the share on Windows: the container is told it (DXDP_GPU_MEMORY_LIMIT_BYTES), and dxdp's telemetry compares it with what the container uses."
    );
    let rest: Vec<String> = healthy
        .into_iter()
        .filter(|h| !preferred.contains(h))
        .collect();
    let second = kubelet
        .preferred_allocation(name, &rest, &[], DEMO_UNITS as i32)
        .await
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "   A second pod: GetPreferredAllocation without those {DEMO_UNITS}\n   Plugin prefers:   {}",
        second.join(", ")
    );
}

/// Bytes for people: whole GiB or MiB when exact, else bytes.
fn bytes_text(bytes: u64) -> String {
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{} GiB", bytes >> 30)
    } else if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

fn registration_section(out: &mut String, view: &StandinView) {
    let _ = writeln!(
        out,
        "\n1. Registration (Register on kubelet.sock, then the kubelet dials back)"
    );
    for r in &view.registrations {
        let options = r.options.unwrap_or_default();
        let _ = writeln!(
            out,
            "   {:<32} version {}  endpoint {}  preStartRequired={} preferredAllocation={}",
            r.resource_name,
            r.version,
            r.endpoint,
            options.pre_start_required,
            options.get_preferred_allocation_available
        );
    }
}

fn devices_section(out: &mut String, view: &StandinView, discovery: &Discovery) {
    let _ = writeln!(
        out,
        "\n2. Advertised devices (ListAndWatch: the full list on every change)"
    );
    for (name, plugin) in &view.plugins {
        let list = plugin.devices.as_deref().unwrap_or_default();
        let _ = writeln!(
            out,
            "   {name}: {} device{}",
            list.len(),
            if list.len() == 1 { "" } else { "s" }
        );
        let mut shown: Vec<&str> = Vec::new();
        for d in list {
            let physical = discovery.devices.iter().find(|p| d.id.starts_with(&p.id));
            let what = physical
                .map(|p| format!("{} at {}", clean(&p.description), clean(&p.location_path)))
                .unwrap_or_default();
            // A GPU's memory units on one line.
            if let Some((gpu, _)) = parse_memory_unit_id(&d.id) {
                if shown.contains(&gpu) {
                    continue;
                }
                shown.push(gpu);
                let units = list
                    .iter()
                    .filter(|u| parse_memory_unit_id(&u.id).is_some_and(|(g, _)| g == gpu))
                    .count();
                let ids = format!("{gpu}-m0 .. -m{}", units.saturating_sub(1));
                let _ = writeln!(
                    out,
                    "     {ids:<58} {:<9} {what}: {units} memory units",
                    d.health
                );
                continue;
            }
            let _ = writeln!(out, "     {:<58} {:<9} {what}", d.id, d.health);
        }
    }
}

fn containerd_section(out: &mut String, response: &AllocateResponse) {
    let _ = writeln!(out, "   What containerd receives:");
    for c in &response.container_responses {
        for d in &c.devices {
            let _ = writeln!(
                out,
                "     device  {}  (container path {:?}, permissions {:?})",
                clean(&d.host_path),
                d.container_path,
                d.permissions
            );
        }
        for (k, v) in sorted(&c.envs) {
            let _ = writeln!(out, "     env     {k}={}", clean(v));
        }
        for (k, v) in sorted(&c.annotations) {
            let _ = writeln!(out, "     annot.  {k}: {}", clean(v));
        }
        for m in &c.mounts {
            let _ = writeln!(
                out,
                "     mount   {}  <=  {}  ({})",
                clean(&m.container_path),
                clean(&m.host_path),
                if m.read_only {
                    "read-only"
                } else {
                    "read-write"
                }
            );
        }
    }
}

fn sorted(map: &std::collections::HashMap<String, String>) -> Vec<(&String, &String)> {
    let mut v: Vec<_> = map.iter().collect();
    v.sort();
    v
}
