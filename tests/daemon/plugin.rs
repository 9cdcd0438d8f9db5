//! The device plugin daemon against a kubelet stand-in that speaks the real v1beta1 protocol over
//! real Unix sockets: registration, lists, allocation, replicas, live refresh, health, malformed
//! edits, kubelet restarts, plugin-before-kubelet, refused registrations and SIGTERM cleanup.

#![cfg(any(unix, windows))]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use dxdp::backend::SnapshotFile;
use dxdp::kubelet::standin::{KubeletStandin, StandinView};
use dxdp::kubelet::v1beta1::{Empty, PreStartContainerRequest, PreferredAllocationRequest};
use dxdp::plugin::{PluginConfig, PluginError};
use dxdp_core::devices::Resource;
use dxdp_core::facts::HostFacts;
use dxdp_core::pipeline::{discover, PipelineConfig};
use dxdp_core::sharing::replica_id;
use dxdp_core::snapshot;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const DISPLAY: &str = "directx.microsoft.com/display";
const COMPUTE: &str = "directx.microsoft.com/compute";
/// Generous: these waits are for behaviour, not speed (latency is measured by the `refresh`
/// benchmark, never asserted here).
const WAIT: Duration = Duration::from_secs(10);
use common::NO_SAFETY_POLL;
use silent::Silent;

use crate::common;
use crate::fake_plugin;
use crate::silent;

fn load_facts(name: &str) -> HostFacts {
    common::facts(name)
}

struct Harness {
    dir: tempfile::TempDir,
    snapshot: PathBuf,
    kubelet: Option<KubeletStandin>,
    stop: Option<oneshot::Sender<()>>,
    daemon: Option<JoinHandle<Result<(), PluginError>>>,
    observe: dxdp::observe::Observe,
}

impl Harness {
    /// A temporary kubelet directory holding `facts` as the host snapshot; nothing running yet.
    fn new(facts: &HostFacts) -> Harness {
        let dir = common::socket_tempdir();
        let snapshot = dir.path().join("host.yaml");
        let h = Harness {
            dir,
            snapshot,
            kubelet: None,
            stop: None,
            daemon: None,
            observe: dxdp::observe::Observe::new(),
        };
        h.write_facts(facts);
        h
    }

    /// Writes `facts` as the host snapshot, optionally starts the kubelet, then the plugin.
    async fn start(facts: &HostFacts, replicas: u32, kubelet_first: bool) -> Harness {
        let mut h = Harness::new(facts);
        if kubelet_first {
            h.start_kubelet().await;
        }
        let config = dxdp::config::Config::default().with_replicas(replicas);
        let (_keep, updates) = tokio::sync::watch::channel(Arc::new(config));
        h.spawn_plugin(updates);
        h
    }

    /// Starts the plugin with fast polling, following configuration `updates`.
    fn spawn_plugin(&mut self, updates: tokio::sync::watch::Receiver<Arc<dxdp::config::Config>>) {
        self.spawn_plugin_with(updates, None)
    }

    /// [`Harness::spawn_plugin`]; with `reload`, the daemon reads its configuration from those
    /// inputs again when they change (as `dxdp plugin`), instead of following `updates`.
    fn spawn_plugin_with(
        &mut self,
        updates: tokio::sync::watch::Receiver<Arc<dxdp::config::Config>>,
        reload: Option<dxdp::config::Inputs>,
    ) {
        // Everything must happen from events: the safety poll never fires during a test.
        let mut config = common::plugin_config(self.dir.path());
        self.observe = config.observe.clone();
        config.config = updates.borrow().as_ref().clone().into();
        let source = Arc::new(SnapshotFile::new(self.snapshot.clone()));
        let (stop, stopped) = oneshot::channel::<()>();
        self.stop = Some(stop);
        let daemon = dxdp::daemon::Daemon::new(config, source);
        let daemon = match reload {
            Some(inputs) => daemon.reload(inputs),
            None => daemon.updates(updates),
        };
        self.daemon = Some(tokio::spawn(daemon.run(async {
            let _ = stopped.await;
        })));
    }

    async fn start_kubelet(&mut self) {
        self.kubelet = Some(
            KubeletStandin::start(common::transport(), self.dir.path())
                .await
                .unwrap(),
        );
    }

    fn kubelet(&self) -> &KubeletStandin {
        self.kubelet.as_ref().unwrap()
    }

    /// Replaces the snapshot atomically (write then rename), as an editor or ConfigMap would.
    fn write_facts(&self, facts: &HostFacts) {
        let text = snapshot::write(facts, snapshot::Format::Yaml).unwrap();
        self.write_text(&text);
    }

    fn write_text(&self, text: &str) {
        let tmp = self.dir.path().join("host.yaml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.snapshot).unwrap();
    }

    async fn wait(&self, what: &str, done: impl Fn(&StandinView) -> bool) {
        if !self.kubelet().wait_for(WAIT, done).await {
            panic!(
                "timed out waiting for {what}; kubelet saw {:#?}",
                self.kubelet().view()
            );
        }
    }

    /// Waits until `line` is a line of the daemon's metrics.
    async fn metric(&self, line: &str) {
        until(line, || {
            self.observe.metrics.encode().lines().any(|l| l == line)
        })
        .await;
    }

    /// Waits until the counter `series` (`name{labels}`) is at least `n`. For counters fed by
    /// file events: one edit can arrive in more than one batch of events, each counted.
    async fn counter_at_least(&self, series: &str, n: u64) {
        let prefix = format!("{series} ");
        until(&format!("{series} >= {n}"), || {
            self.observe.metrics.encode().lines().any(|l| {
                l.strip_prefix(&prefix)
                    .and_then(|v| v.parse::<f64>().ok())
                    .is_some_and(|v| v >= n as f64)
            })
        })
        .await;
    }

    async fn registered(&self) {
        self.wait("both resources", |v| {
            v.devices(DISPLAY).is_some() && v.devices(COMPUTE).is_some()
        })
        .await;
    }

    fn ids(&self, resource: &str) -> Vec<String> {
        self.kubelet()
            .view()
            .devices(resource)
            .unwrap_or_default()
            .iter()
            .map(|d| d.id.clone())
            .collect()
    }

    fn plugin_sockets(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("dxdp-"))
            .collect();
        names.sort();
        names
    }

    async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(daemon) = self.daemon.take() {
            tokio::time::timeout(WAIT, daemon)
                .await
                .expect("plugin stops")
                .unwrap()
                .unwrap();
        }
        assert!(
            self.plugin_sockets().is_empty(),
            "sockets left: {:?}",
            self.plugin_sockets()
        );
        if let Some(k) = self.kubelet.take() {
            k.stop().await;
        }
    }
}

/// Waits until `done` holds (checked every 5 ms, for at most [`WAIT`]).
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The IDs each fixture host advertises, written out from `dxdp discover --json` of the host
/// (one replica: the physical IDs).
fn expected_ids(host: &str, resource: Resource) -> Vec<String> {
    const SAMPLE_DISPLAY: &[&str] = &[
        "pciroot-0-pci-0100-pci-0000-d598ef34d10e0ad3",
        "pciroot-0-pci-0200-pci-0000-0d3ededcb0d74bd8",
    ];
    const SAMPLE_COMPUTE: &[&str] = &["pciroot-0-pci-0300-pci-0000-4a1450fd9e47b7a5"];
    const FOUR_A10: &[&str] = &[
        "pciroot-0-pci-1b00-0540e5ad73bf260f",
        "pciroot-0-pci-1c00-ba6abfb666f4630a",
        "pciroot-0-pci-1d00-99a65d9b8c3e813d",
        "pciroot-0-pci-1e00-4ed067a47f740fc8",
    ];
    const COMPUTE_ONLY: &[&str] = &[
        "acpi-sb-acpi-nsp0-3c6a14361fc5cc86",
        "pciroot-0-pci-0100-pci-0000-d598ef34d10e0ad3",
        "pciroot-0-pci-0b00-941772ce2eaa64f0",
    ];
    let ids: &[&str] = match (host, resource) {
        ("sample", Resource::Display) => SAMPLE_DISPLAY,
        ("sample", Resource::Compute) => SAMPLE_COMPUTE,
        ("nvidia-multi-gpu" | "broken-drivers", Resource::Display) => FOUR_A10,
        ("compute-only", Resource::Compute) => COMPUTE_ONLY,
        _ => &[],
    };
    ids.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_both_resources_with_the_full_lists_of_several_hosts() {
    for host in [
        "sample",
        "nvidia-multi-gpu",
        "compute-only",
        "broken-drivers",
    ] {
        let facts = load_facts(host);
        let h = Harness::start(&facts, 1, true).await;
        h.registered().await;
        let view = h.kubelet().view();
        assert_eq!(view.registrations.len(), 2, "{host}");
        for r in &view.registrations {
            assert_eq!(r.version, "v1beta1");
            assert!(
                !r.endpoint.contains('/'),
                "endpoint is a bare file name: {}",
                r.endpoint
            );
            assert!(h.dir.path().join(&r.endpoint).exists());
            let options = r.options.unwrap();
            assert!(!options.pre_start_required && options.get_preferred_allocation_available);
        }
        for (name, resource) in [(DISPLAY, Resource::Display), (COMPUTE, Resource::Compute)] {
            assert_eq!(h.ids(name), expected_ids(host, resource), "{host} {name}");
        }
        h.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_without_devices_is_still_registered_with_an_empty_list() {
    let h = Harness::start(&load_facts("nvidia-multi-gpu"), 1, true).await;
    h.registered().await;
    assert_eq!(h.ids(DISPLAY).len(), 4);
    assert_eq!(h.kubelet().view().devices(COMPUTE), Some(&[][..]));
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_returns_the_device_spec_and_read_only_mounts_of_existing_files() {
    let facts = load_facts("amd-radeon");
    let h = Harness::start(&facts, 1, true).await;
    h.registered().await;
    let id = h.ids(DISPLAY)[0].clone();
    let response = h
        .kubelet()
        .allocate(DISPLAY, std::slice::from_ref(&id))
        .await
        .unwrap();
    assert_eq!(response.container_responses.len(), 1);
    let c = &response.container_responses[0];
    assert_eq!(c.devices.len(), 1);
    assert_eq!(
        c.devices[0].host_path,
        "vpci-location-path://PCIROOT(0)#PCI(1E00)#PCI(0000)"
    );
    assert_eq!(c.devices[0].container_path, "");
    assert_eq!(c.devices[0].permissions, "");
    let store =
        r"C:\Windows\System32\DriverStore\FileRepository\u0381544.inf_amd64_ad2c8e5b4e1f8a04";
    let mut mounts: Vec<(String, String, bool)> = c
        .mounts
        .iter()
        .map(|m| (m.container_path.clone(), m.host_path.clone(), m.read_only))
        .collect();
    mounts.sort();
    let expect = |dir: &str, dest: &str, src: &str| {
        (
            format!(r"C:\Windows\{dir}\{dest}"),
            format!(r"{store}\{src}"),
            true,
        )
    };
    let mut expected = vec![
        expect("System32", "amdxc64.dll", "amdxc64.dll"),
        expect("System32", "amfrt64.dll", "amfrt64.dll"),
        expect("System32", "amdocl64.dll", r"B381544\amdocl64.dll"),
        expect("SysWOW64", "amfrt32.dll", "amfrt32.dll"),
        expect("SysWOW64", "amdocl.dll", r"B381544\amdocl.dll"),
    ];
    expected.sort();
    // amdvlk64.dll is listed by the driver but missing on the host: never mounted.
    assert_eq!(mounts, expected);
    assert!(c.cdi_devices.is_empty());
    assert_eq!(c.envs["DXDP_VENDOR"], "amd");
    assert_eq!(c.envs["DXDP_DEVICE_IDS"], id);
    assert!(!c.envs.contains_key("CUDA_VISIBLE_DEVICES"));
    assert_eq!(c.annotations["directx.microsoft.com/display.vendor"], "amd");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_malformed_ids_fail_with_invalid_argument_and_the_plugin_keeps_serving() {
    let h = Harness::start(&load_facts("sample"), 1, true).await;
    h.registered().await;
    let compute_id = h.ids(COMPUTE)[0].clone();
    for bad in [
        "no-such-device-0000000000000000",
        "bad/id",
        compute_id.as_str(),
    ] {
        let status = h
            .kubelet()
            .allocate(DISPLAY, &[bad.to_string()])
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{bad}");
        assert!(status.message().contains(bad), "{}", status.message());
    }
    let id = h.ids(DISPLAY)[0].clone();
    assert!(h.kubelet().allocate(DISPLAY, &[id]).await.is_ok());
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_one_physical_device_and_give_one_device_spec() {
    let facts = load_facts("sample");
    let h = Harness::start(&facts, 3, true).await;
    h.registered().await;
    let ids = h.ids(DISPLAY);
    assert_eq!(
        ids,
        [
            "pciroot-0-pci-0100-pci-0000-d598ef34d10e0ad3",
            "pciroot-0-pci-0100-pci-0000-d598ef34d10e0ad3-r1",
            "pciroot-0-pci-0100-pci-0000-d598ef34d10e0ad3-r2",
            "pciroot-0-pci-0200-pci-0000-0d3ededcb0d74bd8",
            "pciroot-0-pci-0200-pci-0000-0d3ededcb0d74bd8-r1",
            "pciroot-0-pci-0200-pci-0000-0d3ededcb0d74bd8-r2",
        ]
    );
    assert_eq!(ids.len(), 6);
    let first = &ids[0];
    let sibling = ids
        .iter()
        .find(|i| *i != first && i.starts_with(first.as_str()))
        .unwrap()
        .clone();
    let r = h
        .kubelet()
        .allocate(DISPLAY, &[first.clone(), sibling])
        .await
        .unwrap();
    assert_eq!(r.container_responses[0].devices.len(), 1);
    // Two different GPUs: both specs are returned (containerd attaches the first; logged).
    let other = ids
        .iter()
        .find(|i| !i.starts_with(first.as_str()))
        .unwrap()
        .clone();
    let r = h
        .kubelet()
        .allocate(DISPLAY, &[first.clone(), other])
        .await
        .unwrap();
    assert_eq!(r.container_responses[0].devices.len(), 2);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_disappear_and_return_when_the_host_changes() {
    let facts = load_facts("nvidia-multi-gpu");
    let h = Harness::start(&facts, 1, true).await;
    h.registered().await;
    let all = h.ids(DISPLAY);
    let mut fewer = facts.clone();
    fewer.adapters.remove(0);
    h.write_facts(&fewer);
    h.wait("a device to disappear", |v| {
        v.devices(DISPLAY).is_some_and(|d| d.len() == 3)
    })
    .await;
    assert!(!h.ids(DISPLAY).contains(&all[0]));
    let status = h
        .kubelet()
        .allocate(DISPLAY, &[all[0].clone()])
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    h.write_facts(&facts);
    h.wait("the device to return", |v| {
        v.devices(DISPLAY).is_some_and(|d| d.len() == 4)
    })
    .await;
    assert_eq!(h.ids(DISPLAY), all);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_lost_and_recovered() {
    let facts = load_facts("sample");
    let h = Harness::start(&facts, 1, true).await;
    h.registered().await;
    let health = |v: &StandinView| -> Vec<String> {
        v.devices(DISPLAY)
            .unwrap_or_default()
            .iter()
            .map(|d| d.health.clone())
            .collect()
    };
    let mut broken = facts.clone();
    broken.adapters[0].pnp.as_mut().unwrap().problem_code = 43;
    broken.adapters[1].driver_update_in_progress = true;
    h.write_facts(&broken);
    h.wait("both GPUs unhealthy", |v| {
        health(v) == ["Unhealthy", "Unhealthy"]
    })
    .await;
    h.write_facts(&facts);
    h.wait("both GPUs healthy again", |v| {
        health(v) == ["Healthy", "Healthy"]
    })
    .await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_snapshot_edit_keeps_the_last_good_list() {
    let facts = load_facts("sample");
    let h = Harness::start(&facts, 1, true).await;
    h.registered().await;
    let before = h.ids(DISPLAY);
    let updates = h.kubelet().view().plugins[DISPLAY].updates;
    h.write_text("apiVersion: dxdp/v1alpha1\nkind: HostSnapshot\nadapters: [{luid: oops}]\n");
    h.counter_at_least("dxdp_host_refreshes_total{result=\"error\"}", 1)
        .await;
    let view = h.kubelet().view();
    assert_eq!(h.ids(DISPLAY), before);
    assert_eq!(
        view.plugins[DISPLAY].updates, updates,
        "no new list was sent"
    );
    assert!(view.plugins[DISPLAY].connected);
    assert!(
        h.kubelet().allocate(DISPLAY, &before[..1]).await.is_ok(),
        "still serving"
    );
    let mut fewer = facts.clone();
    fewer.adapters.remove(0);
    h.write_facts(&fewer);
    h.wait("the next good edit", |v| {
        v.devices(DISPLAY).is_some_and(|d| d.len() == 1)
    })
    .await;
    h.shutdown().await;
}

/// Simulates a kubelet restart: the kubelet stops, deletes plugin sockets, starts again.
async fn restart_kubelet(h: &mut Harness) {
    h.kubelet.take().unwrap().stop().await;
    for name in h.plugin_sockets() {
        let _ = std::fs::remove_file(h.dir.path().join(name));
    }
    h.start_kubelet().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_registers_after_several_kubelet_restarts_on_fresh_sockets() {
    let mut h = Harness::start(&load_facts("sample"), 1, true).await;
    h.registered().await;
    let mut endpoints = vec![h.kubelet().view().plugins[DISPLAY].endpoint.clone()];
    for _ in 0..3 {
        restart_kubelet(&mut h).await;
        h.registered().await;
        let endpoint = h.kubelet().view().plugins[DISPLAY].endpoint.clone();
        assert!(
            !endpoints.contains(&endpoint),
            "socket names are new on every start"
        );
        endpoints.push(endpoint);
        assert_eq!(
            h.plugin_sockets().len(),
            2,
            "old sockets are removed: {:?}",
            h.plugin_sockets()
        );
        let id = h.ids(DISPLAY)[0].clone();
        assert!(h.kubelet().allocate(DISPLAY, &[id]).await.is_ok());
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_plugin_socket_alone_triggers_re_registration() {
    let h = Harness::start(&load_facts("sample"), 1, true).await;
    h.registered().await;
    let old = h.kubelet().view().plugins[DISPLAY].endpoint.clone();
    std::fs::remove_file(h.dir.path().join(&old)).unwrap();
    h.wait("re-registration", |v| {
        v.plugins
            .get(DISPLAY)
            .is_some_and(|p| p.endpoint != old && p.devices.is_some())
    })
    .await;
    h.shutdown().await;
}

/// The kubelet marks every device of a resource unhealthy when a stream of any registration of it
/// ends (`PluginDisconnected`), until the next list: a server restarted while the kubelet lives
/// must register only once the old server's streams ended and its connections are closed. A silent
/// client keeps the old server's gRPC server for 0.5 s; the stand-in refuses the first `Register`,
/// so that the moment it arrived is kept, and the silent connection must be closed by then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_registers_only_after_the_old_servers_connections_are_closed() {
    let h = Harness::start(&load_facts("sample"), 1, true).await;
    h.registered().await;
    let old = h.kubelet().view().plugins[DISPLAY].endpoint.clone();
    let mut silent = Silent::connect(&h.dir.path().join(&old)).await;
    h.kubelet()
        .refuse_registrations(Some("the test keeps the first Register"));
    std::fs::remove_file(h.dir.path().join(&old)).unwrap();
    h.wait("the new server's first Register", |v| !v.refused.is_empty())
        .await;
    assert!(
        silent.closed(),
        "the new server's Register reached the kubelet while the old server still had a connection open"
    );
    let view = h.kubelet().view();
    assert_eq!(view.refused[0].resource_name, DISPLAY);
    assert_ne!(view.refused[0].endpoint, old);
    // The old server's stream ended before the new registration (the stand-in had 2).
    assert_eq!(
        view.stream_ends
            .iter()
            .map(|e| (e.endpoint.as_str(), e.replaced, e.registrations))
            .collect::<Vec<_>>(),
        [(old.as_str(), false, 2)]
    );
    h.kubelet().refuse_registrations(None);
    h.wait("the new server registered with its list", |v| {
        v.plugins[DISPLAY].endpoint != old && v.plugins[DISPLAY].devices.is_some()
    })
    .await;
    let view = h.kubelet().view();
    assert!(!view.plugins[DISPLAY].held_unhealthy, "{view:#?}");
    assert_eq!(view.allocatable(DISPLAY), 2);
    assert_eq!(view.allocatable(COMPUTE), 1);
    assert_eq!(h.ids(DISPLAY), expected_ids("sample", Resource::Display));
    assert_eq!(view.stream_ends.len(), 1, "{:#?}", view.stream_ends);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_started_before_the_kubelet_registers_when_it_appears() {
    let mut h = Harness::start(&load_facts("sample"), 1, false).await;
    until("the daemon waits for the kubelet", || {
        h.observe
            .readiness
            .check()
            .is_err_and(|e| e.starts_with("waiting for the kubelet"))
    })
    .await;
    assert!(
        h.plugin_sockets().is_empty(),
        "no sockets before the kubelet exists"
    );
    h.start_kubelet().await;
    h.registered().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_registration_is_retried() {
    let mut h = Harness::start(&load_facts("sample"), 1, false).await;
    h.start_kubelet().await;
    h.kubelet()
        .refuse_registrations(Some("kubelet is not ready"));
    h.wait("two refused attempts per resource", |v| {
        v.refused.len() >= 4
    })
    .await;
    assert!(h.kubelet().view().registrations.is_empty());
    h.kubelet().refuse_registrations(None);
    h.registered().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_preferred_allocation_and_pre_start() {
    let h = Harness::start(&load_facts("sample"), 1, true).await;
    h.registered().await;
    let mut client = h.kubelet().client(DISPLAY).unwrap();
    let options = client
        .get_device_plugin_options(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(options.get_preferred_allocation_available);
    // An empty request gets an empty answer, not an error.
    let empty = client
        .get_preferred_allocation(PreferredAllocationRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(empty.container_responses.is_empty());
    client
        .pre_start_container(PreStartContainerRequest {
            devices_ids: h.ids(DISPLAY),
        })
        .await
        .unwrap();
    h.shutdown().await;
}

/// Unix only: the Windows stop (console events) is tested in `src/shutdown.rs`. The Allocate
/// line, which the daemon logs from its log writer's thread, is out before the process ends.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_binary_and_removes_its_sockets() {
    if !common::af_unix("sigterm_stops_the_binary_and_removes_its_sockets") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("dxdp")
        .tempdir_in("/tmp")
        .unwrap();
    // The binary speaks AF_UNIX only.
    let kubelet = KubeletStandin::start(dxdp::transport::Transport::UnixSocket, dir.path())
        .await
        .unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_dxdp"))
        .args(["plugin", "--kubelet-dir"])
        .arg(dir.path())
        .args(["--host-snapshot"])
        .arg(common::fixture_path("nvidia-multi-gpu"))
        .env_clear()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let log = tokio::spawn(async move {
        let mut text = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut text).await;
        text
    });
    assert!(
        kubelet
            .wait_for(WAIT, |v| v.devices(DISPLAY).is_some()
                && v.devices(COMPUTE).is_some())
            .await
    );
    // The first T4 of the fixture.
    let id = "pciroot-0-pci-1b00-0540e5ad73bf260f".to_string();
    assert!(kubelet.allocate(DISPLAY, &[id]).await.is_ok());
    common::terminate(&mut child, WAIT).await;
    let log = log.await.unwrap();
    let allocated: Vec<&str> = log.lines().filter(|l| l.contains(" allocated ")).collect();
    assert_eq!(allocated.len(), 1, "{log}");
    for part in [
        "resource=directx.microsoft.com/display",
        "ids=pciroot-0-pci-1b00-0540e5ad73bf260f",
        r#"devices=["vpci-location-path://PCIROOT(0)#PCI(1B00)"]"#,
    ] {
        assert!(allocated[0].contains(part), "{part} in {}", allocated[0]);
    }
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("dxdp-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(
        kubelet
            .wait_for(WAIT, |v| !v.plugins[DISPLAY].connected)
            .await,
        "ListAndWatch ended"
    );
    kubelet.stop().await;
}

/// Starts the plugin with configuration inputs that are watched and reloaded, as `dxdp plugin`.
async fn start_with_config_file(config_text: &str) -> (Harness, PathBuf) {
    let mut h = Harness::new(&load_facts("sample"));
    let config_path = h.dir.path().join("config.yaml");
    std::fs::write(&config_path, config_text).unwrap();
    h.start_kubelet().await;
    let inputs = dxdp::config::Inputs {
        file: Some((config_path.clone(), true)),
        ..Default::default()
    };
    let (_, updates) = tokio::sync::watch::channel(Arc::new(inputs.resolve().unwrap().config));
    h.spawn_plugin_with(updates, Some(inputs));
    (h, config_path)
}

fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_changes_apply_without_a_restart_and_bad_edits_are_ignored() {
    let (h, path) = start_with_config_file("resources: {display: {replicas: 1}}\n").await;
    h.registered().await;
    assert_eq!(h.ids(DISPLAY).len(), 2);
    // Replicas re-advertise.
    replace(&path, "resources: {display: {replicas: 3}}\n");
    h.wait("3 replicas", |v| {
        v.devices(DISPLAY).is_some_and(|d| d.len() == 6)
    })
    .await;
    // An invalid edit keeps the running configuration.
    let registrations = h.kubelet().view().registrations.len();
    replace(&path, "resources: {display: {replicas: 0}}\n");
    h.counter_at_least("dxdp_config_reloads_total{result=\"rejected\"}", 1)
        .await;
    assert_eq!(h.ids(DISPLAY).len(), 6);
    assert_eq!(h.kubelet().view().registrations.len(), registrations);
    // Selectors re-advertise.
    replace(&path, "resources: {display: {replicas: 3}}\ndevices: {exclude: [{locationPath: 'PCIROOT(0)#PCI(0100)#PCI(0000)'}]}\n");
    h.wait("one GPU excluded", |v| {
        v.devices(DISPLAY).is_some_and(|d| d.len() == 3)
    })
    .await;
    // A renamed resource and a disabled one re-register.
    replace(
        &path,
        "resources: {display: {name: example.com/gpu}, compute: {enabled: false}}\n",
    );
    h.wait("the new name", |v| {
        v.devices("example.com/gpu").is_some_and(|d| d.len() == 2)
    })
    .await;
    let view = h.kubelet().view();
    let last: Vec<&str> = view
        .registrations
        .iter()
        .rev()
        .take(1)
        .map(|r| r.resource_name.as_str())
        .collect();
    assert_eq!(last, ["example.com/gpu"]);
    assert_eq!(
        h.plugin_sockets().len(),
        1,
        "only the display socket remains: {:?}",
        h.plugin_sockets()
    );
    h.shutdown().await;
}

/// A configuration whose first line alone is a valid configuration with the default replicas
/// (2 display IDs on the sample host), and which whole gives 3 replicas (6 IDs): what a reader
/// of a half-written copy would apply.
const THREE_REPLICAS: &str = "logLevel: info\nresources:\n  display: {replicas: 3}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_rewritten_in_place_with_the_same_content_changes_nothing() {
    use std::io::Write;
    let (h, path) = start_with_config_file(THREE_REPLICAS).await;
    h.registered().await;
    h.wait("3 replicas", |v| {
        v.devices(DISPLAY).is_some_and(|d| d.len() == 6)
    })
    .await;
    let messages = h.kubelet().view().plugins[DISPLAY].list_sizes.len();
    // Linux reports when a writer closes the file: rewrites back to back. Windows reports no
    // close, and the daemon reads a file 300 ms after its first write (WRITE_GRACE): saves as an
    // operator makes them, each done before the next (seen under Wine: 40 rewrites 40 ms apart
    // keep the file mid-write past the grace, and a half-written copy is read).
    #[cfg(not(windows))]
    const REWRITES: usize = 40;
    #[cfg(not(windows))]
    const PAUSE: Duration = Duration::from_millis(40);
    #[cfg(windows)]
    const REWRITES: usize = 6;
    #[cfg(windows)]
    const PAUSE: Duration = Duration::from_millis(700);
    let writer = {
        let path = path.clone();
        std::thread::spawn(move || {
            let cut = "logLevel: info\n".len();
            for i in 0..REWRITES {
                if i % 2 == 0 {
                    // Python's open(path, "w"): truncate, write the first line, pause, write the
                    // rest, close.
                    let mut f = std::fs::File::create(&path).unwrap();
                    f.write_all(&THREE_REPLICAS.as_bytes()[..cut]).unwrap();
                    f.flush().unwrap();
                    std::thread::sleep(Duration::from_millis(15));
                    f.write_all(&THREE_REPLICAS.as_bytes()[cut..]).unwrap();
                    drop(f);
                } else {
                    // A shell redirection (`printf '...' > config.yaml`) or PowerShell's
                    // Set-Content: truncate, then the whole text in one write.
                    std::fs::write(&path, THREE_REPLICAS).unwrap();
                }
                std::thread::sleep(PAUSE);
            }
        })
    };
    tokio::task::spawn_blocking(move || writer.join().unwrap())
        .await
        .unwrap();
    // A last, atomic change: once it is seen, every rewrite before it has been acted on.
    replace(&path, "resources:\n  display: {replicas: 2}\n");
    h.wait("2 replicas", |v| {
        v.devices(DISPLAY).is_some_and(|d| d.len() == 4)
    })
    .await;
    let view = h.kubelet().view();
    let sizes = &view.plugins[DISPLAY].list_sizes[messages..];
    assert_eq!(
        sizes,
        [4],
        "identical rewrites in place changed what the kubelet saw"
    );
    h.metric("dxdp_config_reloads_total{result=\"applied\"} 1")
        .await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliases_advertise_the_same_devices_and_class_guid_allocates_the_class() {
    let (h, _path) = start_with_config_file(
        "resources: {display: {aliases: [microsoft.com/directx]}}\nassignment: class-guid\n",
    )
    .await;
    h.wait("the alias", |v| {
        v.devices("microsoft.com/directx").is_some() && v.devices(DISPLAY).is_some()
    })
    .await;
    let view = h.kubelet().view();
    assert_eq!(view.devices("microsoft.com/directx"), view.devices(DISPLAY));
    let id = h.ids(DISPLAY)[0].clone();
    for name in [DISPLAY, "microsoft.com/directx"] {
        let r = h
            .kubelet()
            .allocate(name, std::slice::from_ref(&id))
            .await
            .unwrap();
        let c = &r.container_responses[0];
        assert_eq!(c.devices.len(), 1);
        assert_eq!(
            c.devices[0].host_path,
            "class/5B45201D-F2F2-4F3B-85BB-30FF1F953599"
        );
        assert!(!c.mounts.is_empty());
    }
    h.shutdown().await;
}

/// Starts the plugin following `updates` that the test sends itself.
fn start_with_updates(
    h: &mut Harness,
    first: dxdp::config::Config,
) -> tokio::sync::watch::Sender<Arc<dxdp::config::Config>> {
    let (tx, updates) = tokio::sync::watch::channel(Arc::new(first));
    h.spawn_plugin(updates);
    tx
}

fn renamed_display(name: &str) -> dxdp::config::Config {
    let mut c = dxdp::config::Config::default();
    c.resources.get_mut(&Resource::Display).unwrap().name = name.to_string();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_that_cannot_be_served_is_rejected_and_the_daemon_keeps_serving() {
    let mut h = Harness::new(&load_facts("sample"));
    h.start_kubelet().await;
    let tx = start_with_updates(&mut h, dxdp::config::Config::default());
    h.registered().await;
    let registrations = h.kubelet().view().registrations.len();
    // An alias whose socket path cannot fit in sun_path, then a name used twice.
    let mut too_long = dxdp::config::Config::default();
    too_long
        .resources
        .get_mut(&Resource::Display)
        .unwrap()
        .aliases = vec![format!("example.com/{}", "x".repeat(100))];
    tx.send(Arc::new(too_long)).unwrap();
    h.metric("dxdp_config_reloads_total{result=\"rejected\"} 1")
        .await;
    tx.send(Arc::new(renamed_display(COMPUTE))).unwrap();
    h.metric("dxdp_config_reloads_total{result=\"rejected\"} 2")
        .await;
    assert!(
        !h.daemon.as_ref().unwrap().is_finished(),
        "the daemon is still running"
    );
    assert_eq!(h.kubelet().view().registrations.len(), registrations);
    assert_eq!(h.plugin_sockets().len(), 2);
    // A servable one afterwards still applies.
    tx.send(Arc::new(renamed_display("example.com/gpu")))
        .unwrap();
    h.wait("the renamed resource", |v| {
        v.devices("example.com/gpu").is_some()
    })
    .await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_right_after_start_is_not_lost() {
    let mut h = Harness::new(&load_facts("sample"));
    h.start_kubelet().await;
    let tx = start_with_updates(&mut h, dxdp::config::Config::default());
    // Before the first registration has happened.
    tx.send(Arc::new(renamed_display("example.com/gpu")))
        .unwrap();
    h.wait("the renamed resource registered", |v| {
        v.devices("example.com/gpu").is_some() && v.devices(COMPUTE).is_some()
    })
    .await;
    // The old name is no longer served: only two sockets, none of them for display.
    until("the display server stopped", || {
        h.plugin_sockets().iter().all(|s| !s.contains("display"))
    })
    .await;
    let sockets = h.plugin_sockets();
    assert_eq!(sockets.len(), 2, "{sockets:?}");
    assert!(
        sockets.iter().all(|s| !s.contains("display")),
        "{sockets:?}"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_registration_does_not_stop_the_daemon_from_noticing_a_removed_socket() {
    let mut h = Harness::new(&load_facts("sample"));
    // A "kubelet" that accepts connections and never answers.
    let kubelet_sock = h.dir.path().join("kubelet.sock");
    let listener = common::transport().bind(&kubelet_sock).unwrap();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok(conn) = listener.accept().await {
            held.push(conn);
        }
    });
    let (tx, updates) = tokio::sync::watch::channel(Arc::new(dxdp::config::Config::default()));
    h.spawn_plugin(updates);
    let deadline = tokio::time::Instant::now() + WAIT;
    while h.plugin_sockets().len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "sockets never appeared"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = h.plugin_sockets();
    // Registration is now hanging (timeout 5 s). Remove one socket: it must come back at once.
    std::fs::remove_file(h.dir.path().join(&first[0])).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let now = h.plugin_sockets();
        if now.len() == 2 && !now.contains(&first[0]) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the removed socket was not replaced while registration hung: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    silent.abort();
    drop(tx);
    if let Some(stop) = h.stop.take() {
        let _ = stop.send(());
    }
    let daemon = h.daemon.take().unwrap();
    tokio::time::timeout(WAIT, daemon)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(h.plugin_sockets().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_dxdp_for_the_same_resource_refuses_to_start_and_stale_sockets_are_cleaned() {
    let mut h = Harness::new(&load_facts("sample"));
    h.start_kubelet().await;
    // A stale socket from a crashed run.
    let stale = h
        .dir
        .path()
        .join("dxdp-directx.microsoft.com-display-42.sock");
    drop(common::transport().bind(&stale).unwrap());
    let _tx = start_with_updates(&mut h, dxdp::config::Config::default());
    h.registered().await;
    assert!(!stale.exists(), "the stale socket was removed at start");
    let mut second = PluginConfig::new(h.dir.path().to_path_buf());
    second.safety_poll = NO_SAFETY_POLL;
    second.transport = common::transport();
    let source = Arc::new(SnapshotFile::new(h.snapshot.clone()));
    let result = tokio::time::timeout(
        WAIT,
        dxdp::daemon::Daemon::new(second, source).run(std::future::pending::<()>()),
    )
    .await
    .expect("refuses at once");
    match result {
        Err(PluginError::Lock(dxdp::plugin::claim::LockError::Held { dir, .. })) => {
            assert_eq!(dir, h.dir.path())
        }
        other => panic!("expected Locked, got {other:?}"),
    }
    // A dxdp that does not take the lock (an older one) is still refused by the live socket.
    let lock_dir = tempfile::tempdir().unwrap();
    let mut third = PluginConfig::new(h.dir.path().to_path_buf());
    third.safety_poll = NO_SAFETY_POLL;
    third.transport = common::transport();
    third.lock_dir = lock_dir.path().to_path_buf();
    let source = Arc::new(SnapshotFile::new(h.snapshot.clone()));
    let result = tokio::time::timeout(
        WAIT,
        dxdp::daemon::Daemon::new(third, source).run(std::future::pending::<()>()),
    )
    .await
    .expect("refuses at once");
    match result {
        Err(PluginError::AlreadyServed { resource, .. }) => {
            assert!(resource == DISPLAY || resource == COMPUTE, "{resource}")
        }
        other => panic!("expected AlreadyServed, got {other:?}"),
    }
    assert_eq!(
        h.plugin_sockets().len(),
        2,
        "the first one's sockets are intact"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_device_ids_fail_with_invalid_argument_and_a_bounded_message() {
    let h = Harness::start(&load_facts("sample"), 1, true).await;
    h.registered().await;
    for len in [100_000, 3 << 20] {
        let id = "a".repeat(len);
        let status = h.kubelet().allocate(DISPLAY, &[id]).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{len}");
        assert!(
            status.message().len() < 400,
            "{len}: {} bytes",
            status.message().len()
        );
        assert!(
            status.message().contains(&format!("({len} bytes)")),
            "{}",
            status.message()
        );
    }
    let id = h.ids(DISPLAY)[0].clone();
    assert!(h.kubelet().allocate(DISPLAY, &[id]).await.is_ok());
    h.shutdown().await;
}

/// The longest prefix of `text` ending at a line boundary that is itself a valid snapshot with
/// fewer display devices than `text`: what a reader sees of a file rewritten in place.
fn valid_smaller_prefix(text: &str) -> usize {
    let full = discover(
        &snapshot::parse(text, "full").unwrap(),
        &PipelineConfig::default(),
    )
    .devices_for(Resource::Display)
    .count();
    text.match_indices('\n')
        .map(|(i, _)| i + 1)
        .rev()
        .find(|&end| {
            snapshot::parse(&text[..end], "prefix").is_ok_and(|f| {
                discover(&f, &PipelineConfig::default())
                    .devices_for(Resource::Display)
                    .count()
                    < full
            })
        })
        .expect("a valid smaller prefix")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_rewritten_slowly_in_place_never_shows_a_partial_list() {
    use std::io::Write;
    let facts = load_facts("nvidia-multi-gpu");
    let mut unhealthy = facts.clone();
    unhealthy.adapters[0].pnp.as_mut().unwrap().problem_code = 43;
    let versions: Vec<(String, usize)> = [&facts, &unhealthy]
        .into_iter()
        .map(|f| {
            let text = snapshot::write(f, snapshot::Format::Yaml).unwrap();
            let cut = valid_smaller_prefix(&text);
            (text, cut)
        })
        .collect();
    let h = Harness::start(&facts, 1, true).await;
    h.registered().await;
    assert_eq!(h.ids(DISPLAY).len(), 4);
    let path = h.snapshot.clone();
    const REWRITES: usize = 12;
    let writer = std::thread::spawn(move || {
        for i in 0..REWRITES {
            let (text, cut) = &versions[(i + 1) % 2];
            // In place: truncate, write up to a line boundary, pause, write the rest.
            let mut f = std::fs::File::create(&path).unwrap();
            f.write_all(&text.as_bytes()[..*cut]).unwrap();
            f.flush().unwrap();
            std::thread::sleep(Duration::from_millis(20));
            f.write_all(&text.as_bytes()[*cut..]).unwrap();
            f.flush().unwrap();
            drop(f);
            std::thread::sleep(Duration::from_millis(250));
        }
    });
    tokio::task::spawn_blocking(move || writer.join().unwrap())
        .await
        .unwrap();
    // Versions alternate, starting with the unhealthy one: the last (REWRITES is even) is healthy.
    h.wait("the last version", |v| {
        v.devices(DISPLAY)
            .is_some_and(|d| d.iter().all(|x| x.health == "Healthy"))
    })
    .await;
    let view = h.kubelet().view();
    let sizes = &view.plugins[DISPLAY].list_sizes;
    assert!(
        sizes.iter().all(|&n| n == 4),
        "the kubelet saw a partial list: {sizes:?}"
    );
    assert!(
        sizes.len() >= 3,
        "the rewrites were picked up (health flips): {sizes:?}"
    );
    h.shutdown().await;
}

/// The sample host's display devices in location-path order, with their LUIDs and paths (from
/// `crates/dxdp-core/src/sample-host.yaml`).
fn sample_displays() -> [(String, &'static str, &'static str); 2] {
    let id = dxdp_core::pipeline::ids::device_id;
    [
        (
            id("PCIROOT(0)#PCI(0100)#PCI(0000)"),
            "55027",
            "PCIROOT(0)#PCI(0100)#PCI(0000)",
        ),
        (
            id("PCIROOT(0)#PCI(0200)#PCI(0000)"),
            "55311",
            "PCIROOT(0)#PCI(0200)#PCI(0000)",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_allocation_spreads_replicas_and_answers_hostile_requests() {
    let h = Harness::start(&load_facts("sample"), 2, true).await;
    h.registered().await;
    let [(a, _, _), (b, _, _)] = sample_displays();
    let (a1, b1) = (replica_id(&a, 1), replica_id(&b, 1));
    let k = h.kubelet();
    let s = |ids: &[&String]| ids.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    // (available, must include, size, expected in any order)
    type Case = (Vec<String>, Vec<String>, i32, Vec<String>);
    let table: Vec<Case> = vec![
        // A replica of `a` is in use: spread gives `b`.
        (s(&[&a1, &b, &b1]), vec![], 1, s(&[&b])),
        // Two replicas: one physical device.
        (s(&[&a, &a1, &b1]), vec![], 2, s(&[&a, &a1])),
        // Must-include is kept.
        (s(&[&a, &a1, &b, &b1]), s(&[&b1]), 2, s(&[&b1, &b])),
        // Unknown IDs are ignored, sizes are capped.
        (
            vec!["nope".into(), a.clone(), a.clone()],
            vec!["x".into()],
            5,
            s(&[&a]),
        ),
        (s(&[&a, &b]), vec![], -1, vec![]),
    ];
    for (available, must, size, expected) in table {
        let mut got = k
            .preferred_allocation(DISPLAY, &available, &must, size)
            .await
            .unwrap();
        got.sort();
        let mut expected = expected.clone();
        expected.sort();
        assert_eq!(got, expected, "{available:?} {must:?} {size}");
    }
    // A huge list does not break the plugin.
    let huge: Vec<String> = (0..100_000).map(|i| format!("junk-{i}")).collect();
    assert!(k
        .preferred_allocation(DISPLAY, &huge, &huge[..10], i32::MAX)
        .await
        .unwrap()
        .is_empty());
    h.shutdown().await;
}

const DISPLAY_MEMORY: &str = "directx.microsoft.com/display-memory";

/// Issue 46: a class shared by memory is served as a resource of its own, with its socket and
/// registration: each A10 of the sample host (24,146,608,128 bytes) less the 1 GiB reserve is
/// 21 units of 1 GiB, none of them also advertised whole; a request stays on one GPU and is told
/// its share; units on two GPUs are refused; turning it off again serves the GPUs whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_sharing_serves_units_of_one_gpu_and_refuses_units_of_two() {
    let (h, path) = start_with_config_file(
        "resources:\n  display: {allocationPolicy: pack, memorySharing: {enabled: true, unit: 1Gi, reserve: 1Gi}}\n",
    )
    .await;
    h.wait("the memory resource", |v| {
        v.devices(DISPLAY_MEMORY).is_some_and(|d| d.len() == 42)
            && v.devices(DISPLAY).is_some()
            && v.devices(COMPUTE).is_some()
    })
    .await;
    let [(a, _, path_a), (b, _, _)] = sample_displays();
    let units = h.ids(DISPLAY_MEMORY);
    let of = |gpu: &str| -> Vec<String> { (0..21).map(|k| format!("{gpu}-m{k}")).collect() };
    let mut expected = of(&a);
    expected.extend(of(&b));
    assert_eq!(units, expected, "in advertising order");
    assert!(h.ids(DISPLAY).is_empty(), "no GPU is also advertised whole");
    assert_eq!(h.ids(COMPUTE).len(), 1, "compute is not shared by memory");
    assert!(h
        .kubelet()
        .view()
        .devices(DISPLAY_MEMORY)
        .unwrap()
        .iter()
        .all(|d| d.health == "Healthy"));
    let k = h.kubelet();
    // Pack: `a` has 5 units free, `b` 21; 4 units fit `a`, 6 only `b`.
    let mut available: Vec<String> = of(&a)[16..].to_vec();
    available.extend(of(&b));
    let four = k
        .preferred_allocation(DISPLAY_MEMORY, &available, &[], 4)
        .await
        .unwrap();
    assert_eq!(four, of(&a)[16..20].to_vec());
    let six = k
        .preferred_allocation(DISPLAY_MEMORY, &available, &[], 6)
        .await
        .unwrap();
    assert_eq!(six, of(&b)[..6].to_vec());
    // Allocate: the GPU's device and runtime files, and the share (4 x 1 GiB).
    let r = k.allocate(DISPLAY_MEMORY, &four).await.unwrap();
    let c = &r.container_responses[0];
    assert_eq!(c.devices.len(), 1);
    assert_eq!(
        c.devices[0].host_path,
        format!("vpci-location-path://{path_a}")
    );
    assert!(c
        .mounts
        .iter()
        .any(|m| m.container_path == r"C:\Windows\System32\nvcuda.dll"));
    assert_eq!(c.envs["DXDP_GPU_MEMORY_LIMIT_BYTES"], "4294967296");
    assert_eq!(c.envs["DXDP_DEVICE_IDS"], a);
    // The same request again comes from the prepared answers, unchanged.
    let again = k.allocate(DISPLAY_MEMORY, &four).await.unwrap();
    assert_eq!(again.container_responses[0].envs, c.envs);
    // Units on two GPUs: refused, saying why and what to do.
    let spanning = vec![format!("{a}-m0"), format!("{b}-m0")];
    let err = k.allocate(DISPLAY_MEMORY, &spanning).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(
        err.message().starts_with(&format!(
            "the request for 2 {DISPLAY_MEMORY} units spans 2 GPUs (PCIROOT(0)#PCI(0100)#PCI(0000), PCIROOT(0)#PCI(0200)#PCI(0000))"
        )) && err.message().contains("Request at most 21 units"),
        "{}",
        err.message()
    );
    // A whole-GPU ID is unknown to the memory resource.
    let err = k
        .allocate(DISPLAY_MEMORY, std::slice::from_ref(&a))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    // Off again: the GPUs are advertised whole, and the memory resource's socket goes.
    replace(&path, "resources:\n  display: {allocationPolicy: pack}\n");
    h.wait("whole GPUs again", |v| {
        v.devices(DISPLAY).is_some_and(|d| d.len() == 2)
    })
    .await;
    until("the memory socket removed", || {
        !h.plugin_sockets()
            .iter()
            .any(|s| s.contains("display-memory"))
    })
    .await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_gives_hints_and_follows_the_pack_and_multi_device_options() {
    let (h, _path) = start_with_config_file(
        "resources:\n  display: {replicas: 2, allocationPolicy: pack, multiDevice: fail, cudaVisibleDevices: true}\n  compute: {replicas: 2}\n",
    )
    .await;
    h.registered().await;
    let [(a, luid_a, path_a), (b, _, _)] = sample_displays();
    let a1 = replica_id(&a, 1);
    let k = h.kubelet();
    // Pack: with `a` in use, the next pod goes to `a`'s other replica.
    let all = h.ids(DISPLAY);
    let rest: Vec<String> = all.iter().filter(|x| **x != a).cloned().collect();
    assert_eq!(
        k.preferred_allocation(DISPLAY, &rest, &[], 1)
            .await
            .unwrap(),
        vec![a1.clone()]
    );
    let r = k
        .allocate(DISPLAY, std::slice::from_ref(&a1))
        .await
        .unwrap();
    let c = &r.container_responses[0];
    let env = |key: &str| c.envs.get(key).cloned().unwrap_or_default();
    assert_eq!(env("DXDP_DEVICE_IDS"), a);
    assert_eq!(env("DXDP_ADAPTER_LUIDS"), luid_a);
    assert_eq!(env("DXDP_LOCATION_PATHS"), path_a);
    assert_eq!(env("DXDP_VENDOR"), "nvidia");
    // The sample host's NVIDIA devices by PCI bus: A100 (0x18), this A10 (0x3b), the other (0x5e).
    assert_eq!(env("CUDA_VISIBLE_DEVICES"), "1");
    assert_eq!(env("CUDA_DEVICE_ORDER"), "PCI_BUS_ID");
    assert_eq!(
        c.annotations
            .get("directx.microsoft.com/display.adapter-luids"),
        Some(&luid_a.to_string())
    );
    // multiDevice: fail refuses two devices and two replicas of one, saying what to do.
    for ids in [vec![a.clone(), b.clone()], vec![a.clone(), a1.clone()]] {
        let status = k.allocate(DISPLAY, &ids).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{ids:?}");
        assert!(
            status
                .message()
                .contains("request 1 directx.microsoft.com/display per container"),
            "{}",
            status.message()
        );
    }
    // Compute keeps the defaults: a warning annotation, no CUDA hint.
    let compute = h.ids(COMPUTE);
    let r = k.allocate(COMPUTE, &compute).await.unwrap();
    let c = &r.container_responses[0];
    assert!(c.annotations["directx.microsoft.com/compute.multi-device"].contains("merged"));
    assert!(!c.envs.contains_key("CUDA_VISIBLE_DEVICES"));
    h.shutdown().await;
}

/// The kubelet stand-in itself (which `dxdp demo` and every daemon test rely on) against a fake
/// plugin: the stand-in's own behaviour, as the kubelet's.
mod standin_behaviour {
    use super::*;
    use dxdp::kubelet::standin::StreamEnd;
    use dxdp::kubelet::v1beta1::registration_client::RegistrationClient;
    use dxdp::kubelet::v1beta1::{Device, RegisterRequest};
    use dxdp::kubelet::API_VERSION;

    const GPU: &str = "example.com/gpu";

    fn device(id: &str, health: &str) -> Device {
        Device {
            id: id.to_string(),
            health: health.to_string(),
            topology: None,
        }
    }

    async fn register(kubelet: &KubeletStandin, endpoint: &str) {
        let channel = common::transport()
            .channel(&kubelet.socket_path())
            .await
            .expect("connect to the stand-in");
        RegistrationClient::new(channel)
            .register(RegisterRequest {
                version: API_VERSION.to_string(),
                endpoint: endpoint.to_string(),
                resource_name: GPU.to_string(),
                options: None,
            })
            .await
            .expect("the stand-in takes the registration");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replaced_registrations_stream_end_holds_the_devices_unhealthy_until_the_next_list() {
        let dir = common::socket_tempdir();
        let kubelet = KubeletStandin::start(common::transport(), dir.path())
            .await
            .unwrap();
        let list = vec![device("gpu-0", "Healthy"), device("gpu-1", "Unhealthy")];
        let (mut old, old_lists, _) =
            fake_plugin::fake(common::transport(), dir.path(), "old.sock");
        old_lists.send_replace(Some(list.clone()));
        register(&kubelet, "old.sock").await;
        assert!(kubelet.wait_for(WAIT, |v| v.allocatable(GPU) == 1).await);
        // A newer registration of the resource, which sent its first list.
        let (mut new, new_lists, mut new_open) =
            fake_plugin::fake(common::transport(), dir.path(), "new.sock");
        new_lists.send_replace(Some(list.clone()));
        register(&kubelet, "new.sock").await;
        assert!(
            kubelet
                .wait_for(WAIT, |v| v.plugins[GPU].endpoint == "new.sock"
                    && v.plugins[GPU].updates == 1)
                .await
        );
        assert_eq!(kubelet.view().allocatable(GPU), 1);
        // Then the old registration's stream ends: every device is held unhealthy.
        old_lists.send_replace(None);
        assert!(kubelet.wait_for(WAIT, |v| v.stream_ends.len() == 1).await);
        let view = kubelet.view();
        assert_eq!(
            view.stream_ends,
            [StreamEnd {
                resource_name: GPU.to_string(),
                endpoint: "old.sock".to_string(),
                registration: 0,
                replaced: true,
                registrations: 2,
            }]
        );
        let plugin = &view.plugins[GPU];
        assert!(plugin.held_unhealthy && plugin.connected);
        assert_eq!(plugin.devices.as_deref(), Some(&list[..]));
        assert_eq!(view.allocatable(GPU), 0);
        // The next list (the same devices) makes them healthy again.
        new_lists.send_replace(Some(list.clone()));
        assert!(
            kubelet
                .wait_for(WAIT, |v| v.plugins[GPU].updates == 2)
                .await
        );
        let view = kubelet.view();
        assert!(!view.plugins[GPU].held_unhealthy);
        assert_eq!(view.allocatable(GPU), 1);
        // The stand-in stopping closes its connections to the plugin, as the kubelet's process
        // ending would: the plugin's stream is dropped without the plugin ending it.
        assert_eq!(*new_open.borrow(), 1);
        kubelet.stop().await;
        assert!(
            tokio::time::timeout(WAIT, new_open.wait_for(|n| *n == 0))
                .await
                .is_ok(),
            "the stopped stand-in still holds the plugin's stream"
        );
        old.stop(Some(WAIT)).await;
        new.stop(Some(WAIT)).await;
    }
}

/// Starts `dxdp plugin`'s daemon on `inputs` as the command does: the configuration of the
/// inputs, or when its file is rejected the last-served one `kept` on the host; `Err` (the
/// message `dxdp plugin` ends with) when that is refused.
fn spawn_plugin_keeping(
    h: &mut Harness,
    inputs: dxdp::config::Inputs,
    kept: &dxdp::config::kept::KeptConfig,
) -> Result<(), String> {
    let start = kept.resolve_or_kept(&inputs)?;
    let mut config = common::plugin_config(h.dir.path());
    h.observe = config.observe.clone();
    config.config = start.resolved;
    let source = Arc::new(SnapshotFile::new(h.snapshot.clone()));
    let (stop, stopped) = oneshot::channel::<()>();
    h.stop = Some(stop);
    let daemon = dxdp::daemon::Daemon::new(config, source)
        .reload(inputs)
        .last_served(kept.clone(), start.rejected);
    h.daemon = Some(tokio::spawn(daemon.run(async {
        let _ = stopped.await;
    })));
    Ok(())
}

/// Stops the daemon (the kubelet stand-in keeps running).
async fn stop_daemon(h: &mut Harness) {
    if let Some(stop) = h.stop.take() {
        let _ = stop.send(());
    }
    if let Some(daemon) = h.daemon.take() {
        tokio::time::timeout(WAIT, daemon)
            .await
            .expect("plugin stops")
            .unwrap()
            .unwrap();
    }
}

/// Waits until `/readyz` answers `want`.
async fn readiness(h: &Harness, want: Result<(), String>) {
    until(&format!("/readyz {want:?}"), || {
        h.observe.readiness.check() == want
    })
    .await;
}

/// Issue 43: a configuration file rejected at start does not stop the node's GPUs. The daemon
/// keeps the configuration it serves on the host; started on a file that does not parse, it
/// serves that last-served configuration, `/readyz` fails with the reason and
/// `dxdp_config_fallback` is 1, until a valid file is read, which is served and kept. With
/// nothing kept the start is refused as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_rejected_at_start_serves_the_last_served_one_until_it_is_fixed() {
    let mut h = Harness::new(&load_facts("sample"));
    h.start_kubelet().await;
    let path = h.dir.path().join("config.yaml");
    let kept_path = h.dir.path().join("state").join("last-served-config.yaml");
    let kept = dxdp::config::kept::KeptConfig::at(kept_path.clone());
    let inputs = dxdp::config::Inputs {
        file: Some((path.clone(), true)),
        ..Default::default()
    };
    // Nothing kept yet: a file that does not parse is refused, as before.
    std::fs::write(&path, "resources: {display: {replicas: 3}\n").unwrap();
    let refused = spawn_plugin_keeping(&mut h, inputs.clone(), &kept).unwrap_err();
    assert_eq!(
        refused,
        inputs.resolve().unwrap_err().to_string(),
        "the same refusal as without a kept configuration"
    );
    assert!(!kept_path.exists());

    // A daemon serves 3 replicas, and keeps them on the host.
    std::fs::write(&path, "resources: {display: {replicas: 3}}\n").unwrap();
    spawn_plugin_keeping(&mut h, inputs.clone(), &kept).unwrap();
    h.wait("3 replicas", |v| {
        v.devices(DISPLAY).is_some_and(|d| d.len() == 6)
    })
    .await;
    readiness(&h, Ok(())).await;
    h.metric("dxdp_config_fallback 0").await;
    h.metric("dxdp_config_rejected 0").await;
    let kept_text = format!(
        "# Written by dxdp: the configuration this node last served (from {}).\n\
         # dxdp reads it only at start, when the configuration file is rejected, and replaces it\n\
         # whenever it serves a configuration. Edit the configuration file, not this one.\n\
         resources: {{display: {{replicas: 3}}}}\n",
        path.display()
    );
    assert_eq!(std::fs::read_to_string(&kept_path).unwrap(), kept_text);
    stop_daemon(&mut h).await;
    let registrations = h.kubelet().view().registrations.len();

    // A bad edit, then a restart: the last-served configuration (3 replicas) is served.
    std::fs::write(&path, "resources: {display: {replicas: 3}\n").unwrap();
    let rejected = inputs.resolve().unwrap_err().to_string();
    assert!(
        rejected.starts_with(&format!("{}:", path.display())),
        "{rejected}"
    );
    spawn_plugin_keeping(&mut h, inputs.clone(), &kept).unwrap();
    readiness(
        &h,
        Err(format!(
            "serving the last configuration this node served (kept at {}): the configuration was rejected at start: {rejected}; fix the configuration",
            kept_path.display()
        )),
    )
    .await;
    h.wait("3 replicas again, registered anew", |v| {
        v.registrations.len() >= registrations + 2
            && v.devices(DISPLAY).is_some_and(|d| d.len() == 6)
    })
    .await;
    h.metric("dxdp_config_fallback 1").await;
    h.metric("dxdp_config_rejected 1").await;
    assert_eq!(
        std::fs::read_to_string(&kept_path).unwrap(),
        kept_text,
        "the kept configuration is not rewritten from itself"
    );

    // The file fixed: it is served and kept, readiness returns.
    replace(&path, "resources: {display: {replicas: 2}}\n");
    h.wait("2 replicas", |v| {
        v.devices(DISPLAY).is_some_and(|d| d.len() == 4)
    })
    .await;
    readiness(&h, Ok(())).await;
    h.metric("dxdp_config_fallback 0").await;
    h.metric("dxdp_config_rejected 0").await;
    until("the fixed file kept", || {
        std::fs::read_to_string(&kept_path)
            .is_ok_and(|t| t.ends_with("\nresources: {display: {replicas: 2}}\n"))
    })
    .await;
    h.shutdown().await;
}

/// A configuration that reads but cannot be served on the host (nothing enabled) falls back to
/// the last-served configuration the same way; with nothing kept the daemon refuses to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_that_cannot_be_served_at_start_falls_back_to_the_kept_one() {
    let mut h = Harness::new(&load_facts("sample"));
    h.start_kubelet().await;
    let path = h.dir.path().join("config.yaml");
    let kept_path = h.dir.path().join("state").join("last-served-config.yaml");
    let kept = dxdp::config::kept::KeptConfig::at(kept_path.clone());
    let inputs = dxdp::config::Inputs {
        file: Some((path.clone(), true)),
        ..Default::default()
    };
    std::fs::write(
        &path,
        "resources: {display: {enabled: false}, compute: {enabled: false}}\n",
    )
    .unwrap();
    // Nothing kept: the daemon stops with the reason, as before.
    spawn_plugin_keeping(&mut h, inputs.clone(), &kept).unwrap();
    let ended = tokio::time::timeout(WAIT, h.daemon.take().unwrap())
        .await
        .expect("the daemon ends")
        .unwrap();
    assert_eq!(
        ended.map_err(|e| e.to_string()),
        Err("no resources to serve: enable display, compute or both".to_string())
    );
    // Kept: served instead.
    std::fs::create_dir_all(kept_path.parent().unwrap()).unwrap();
    std::fs::write(&kept_path, "resources: {compute: {enabled: false}}\n").unwrap();
    spawn_plugin_keeping(&mut h, inputs.clone(), &kept).unwrap();
    readiness(
        &h,
        Err(format!(
            "serving the last configuration this node served (kept at {}): the configuration was rejected at start: no resources to serve: enable display, compute or both; fix the configuration",
            kept_path.display()
        )),
    )
    .await;
    h.wait("the display devices", |v| {
        v.devices(DISPLAY).is_some_and(|d| d.len() == 2)
    })
    .await;
    h.metric("dxdp_config_fallback 1").await;
    h.shutdown().await;
}
