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
use dxdp_core::devices::Discovery;
use dxdp_core::pipeline;
use dxdp_core::quote::clean;

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
    _args: &DemoArgs,
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

    let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, &dir)
        .await
        .context("cannot start the kubelet stand-in")?;
    let names: Vec<String> = config.endpoints().into_iter().map(|(_, n)| n).collect();
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

    for (step, (resource, name)) in (3..).zip(config.endpoints()) {
        let name = name.as_str();
        let _ = writeln!(out, "\n{step}. Allocate one {name} device");
        let healthy: Vec<String> = view
            .devices(name)
            .unwrap_or_default()
            .iter()
            .filter(|d| d.health == "Healthy")
            .map(|d| d.id.clone())
            .collect();
        if healthy.is_empty() {
            let _ = writeln!(
                out,
                "   (no healthy {} device on this host)",
                resource.as_str()
            );
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
        for d in list {
            let physical = discovery.devices.iter().find(|p| d.id.starts_with(&p.id));
            let what = physical
                .map(|p| format!("{} at {}", clean(&p.description), clean(&p.location_path)))
                .unwrap_or_default();
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
