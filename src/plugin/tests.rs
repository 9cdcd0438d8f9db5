//! Daemon part tests: socket names, servability, claiming the directory, and healing a server
//! whose gRPC server died, against the kubelet stand-in over real sockets.

use std::path::Path;

use super::claim::remove_stale_sockets;
use super::claim::{socket_name, socket_resource};
use super::servers::Servers;
use super::*;
use crate::transport::testing;
use dxdp_core::devices::Resource;
use dxdp_core::facts::OsFacts;

#[path = "../../tests/support/silent.rs"]
mod silent;
use silent::Silent;

fn check_servable(config: &Config, dir: &Path) -> Result<(), Unservable> {
    servable::check(config, dir, &OsFacts::default())
}

#[test]
fn socket_names_round_trip_to_their_resource() {
    let table = [
        (
            "dxdp-directx.microsoft.com-display-1763860000000000000.sock",
            Some("directx.microsoft.com-display"),
        ),
        (
            "dxdp-microsoft.com-directx-1.sock",
            Some("microsoft.com-directx"),
        ),
        ("dxdp-directx.microsoft.com-display-.sock", None),
        ("dxdp-directx.microsoft.com-display-12x.sock", None),
        ("kubelet.sock", None),
        ("dxdp-x-1.sock.tmp", None),
        ("nvidia-gpu.sock", None),
    ];
    for (name, want) in table {
        assert_eq!(socket_resource(name), want, "{name}");
    }
    let made = socket_name("directx.microsoft.com/compute");
    assert_eq!(
        socket_resource(&made),
        Some("directx.microsoft.com-compute")
    );
}

#[test]
fn servable_configurations() {
    let dir = Path::new("/var/lib/kubelet/device-plugins");
    let ok = Config::default();
    assert!(check_servable(&ok, dir).is_ok());
    let mut none = Config::default();
    for s in none.resources.values_mut() {
        s.enabled = false;
    }
    assert!(matches!(
        check_servable(&none, dir),
        Err(Unservable::NoResources)
    ));
    let mut twice = Config::default();
    twice.resources.get_mut(&Resource::Compute).unwrap().name =
        "directx.microsoft.com/display".into();
    assert!(
        matches!(check_servable(&twice, dir), Err(Unservable::Duplicate(n)) if n == "directx.microsoft.com/display")
    );
    let mut alias = Config::default();
    alias.resources.get_mut(&Resource::Display).unwrap().aliases =
        vec!["microsoft.com/directx".into()];
    assert!(check_servable(&alias, dir).is_ok());
    // 107 bytes is the limit: "dxdp-" + name + "-" + 20 digits + ".sock" after the directory.
    let room = 107 - dir.as_os_str().len() - 1 - "dxdp--.sock".len() - 20;
    let fits = format!("a.io/{}", "x".repeat(room - 5));
    let too_long = format!("a.io/{}", "x".repeat(room - 4));
    alias.resources.get_mut(&Resource::Display).unwrap().aliases = vec![fits];
    assert!(check_servable(&alias, dir).is_ok());
    alias.resources.get_mut(&Resource::Display).unwrap().aliases = vec![too_long];
    assert!(matches!(
        check_servable(&alias, dir),
        Err(Unservable::SocketPath(_))
    ));
}

#[tokio::test]
async fn claiming_removes_stale_sockets_and_refuses_a_live_dxdp_for_the_same_resource() {
    let transport = testing::transport();
    let dir = testing::socket_dir();
    let display = [(
        Resource::Display,
        "directx.microsoft.com/display".to_string(),
    )];
    // A stale socket (bound, then its listener dropped) and an unrelated file.
    let stale = dir.path().join("dxdp-directx.microsoft.com-display-1.sock");
    drop(transport.bind(&stale).unwrap());
    std::fs::write(dir.path().join("kubelet_internal_checkpoint"), b"{}").unwrap();
    remove_stale_sockets(transport, dir.path(), &display)
        .await
        .unwrap();
    assert!(!stale.exists(), "stale socket removed");
    assert!(dir.path().join("kubelet_internal_checkpoint").exists());
    // A live one for another resource is left alone; one for ours refuses the start.
    let other = dir.path().join("dxdp-directx.microsoft.com-compute-2.sock");
    let _other_listener = transport.bind(&other).unwrap();
    remove_stale_sockets(transport, dir.path(), &display)
        .await
        .unwrap();
    assert!(other.exists());
    let live = dir.path().join("dxdp-directx.microsoft.com-display-3.sock");
    let _live_listener = transport.bind(&live).unwrap();
    match remove_stale_sockets(transport, dir.path(), &display).await {
        Err(PluginError::AlreadyServed { resource, socket }) => {
            assert_eq!(resource, "directx.microsoft.com/display");
            assert_eq!(socket, live);
        }
        other => panic!("expected AlreadyServed, got {other:?}"),
    }
}

/// A kubelet stand-in and the display server registered with it, in a fresh directory.
struct DisplayServer {
    _dir: tempfile::TempDir,
    kubelet: crate::kubelet::standin::KubeletStandin,
    config: PluginConfig,
    _inventory: channel::Sender<Arc<crate::inventory::Inventory>>,
    sup: Servers,
    display: String,
}

async fn display_server() -> DisplayServer {
    use crate::kubelet::standin::KubeletStandin;
    let dir = testing::socket_dir();
    let kubelet = KubeletStandin::start(testing::transport(), dir.path())
        .await
        .unwrap();
    let facts = dxdp_core::sample::sample_host().unwrap();
    let mut config = PluginConfig::new(dir.path().to_path_buf());
    config.transport = testing::transport();
    let (inventory, _) = crate::inventory::build(&facts, Arc::new(config.config.config.clone()));
    let (tx, rx) = channel::channel(Arc::new(inventory));
    let display = "directx.microsoft.com/display".to_string();
    let mut sup = Servers::new(
        dir.path(),
        config.transport,
        config.backoff,
        config.observe.clone(),
        rx,
        vec![(Resource::Display, display.clone())],
    );
    sup.check();
    assert!(
        kubelet
            .wait_for(Duration::from_secs(10), |v| v.registrations.len() == 1)
            .await
    );
    DisplayServer {
        _dir: dir,
        kubelet,
        config,
        _inventory: tx,
        sup,
        display,
    }
}

/// Kills the gRPC server of server `name` as a crash would, after the server ran for a while, and
/// returns the server's report of its end.
async fn crash_after_a_while(sup: &mut Servers, name: &str) -> servers::Ended {
    let server = sup.running.get_mut(name).unwrap();
    server.started -= servers::RAPID_END * 2;
    server.grpc.abort();
    tokio::time::timeout(Duration::from_secs(10), sup.ended_rx.recv())
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_grpc_server_dies_is_restarted_on_a_fresh_socket_and_registered_again() {
    // Held to the end: the directory and the inventory sender.
    let DisplayServer {
        _dir,
        _inventory,
        kubelet,
        mut sup,
        display,
        ..
    } = display_server().await;
    let wait = Duration::from_secs(10);
    let first = sup.running[&display].path.clone();
    let ended = crash_after_a_while(&mut sup, &display).await;
    assert_eq!(ended.name, display);
    assert_eq!(ended.reason, "gRPC server ended: aborted");
    sup.on_ended(ended);
    let second = sup.running[&display].path.clone();
    assert_ne!(first, second, "a fresh socket");
    assert!(kubelet.wait_for(wait, |v| v.registrations.len() == 2).await);
    let view = kubelet.view();
    assert_eq!(
        view.registrations[1].endpoint,
        second.file_name().unwrap().to_string_lossy()
    );
    assert!(
        kubelet
            .wait_for(wait, |v| v.devices(&display).is_some_and(|d| d.len() == 2))
            .await
    );
    // The end of a server that was replaced on purpose is not a crash.
    sup.stop_all().await;
    assert!(!second.exists() && !first.exists());
    while let Some(ended) = sup.ended_rx.try_recv() {
        sup.on_ended(ended);
        assert!(sup.running.is_empty());
    }
    kubelet.stop().await;
}

/// An aborted gRPC server leaves its connection tasks running: the server restarted after it
/// registers only once the stop closed them (the stand-in refuses the first `Register` to keep its
/// moment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_grpc_server_died_registers_again_only_after_its_connections_are_closed() {
    // Held to the end: the directory and the inventory sender.
    let DisplayServer {
        _dir,
        _inventory,
        kubelet,
        mut sup,
        display,
        ..
    } = display_server().await;
    let wait = Duration::from_secs(10);
    let first = sup.running[&display].path.clone();
    let mut silent = Silent::connect(&first).await;
    kubelet.refuse_registrations(Some("the test keeps the first Register"));
    let ended = crash_after_a_while(&mut sup, &display).await;
    sup.on_ended(ended);
    assert!(kubelet.wait_for(wait, |v| !v.refused.is_empty()).await);
    assert!(
        silent.closed(),
        "the new server's Register reached the kubelet while the old server still had a connection open"
    );
    kubelet.refuse_registrations(None);
    assert!(
        kubelet
            .wait_for(wait, |v| v.registrations.len() == 2
                && v.allocatable(&display) == 2)
            .await
    );
    let view = kubelet.view();
    assert_eq!(view.stream_ends.len(), 1);
    assert!(!view.stream_ends[0].replaced);
    sup.stop_all().await;
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_ends_right_after_its_start_waits_for_the_next_check() {
    // Held to the end: the directory and the inventory sender.
    let DisplayServer {
        _dir,
        _inventory,
        kubelet,
        config,
        mut sup,
        display,
    } = display_server().await;
    let wait = Duration::from_secs(10);
    // The server dies at once (as one failing at every start would).
    sup.running[&display].grpc.abort();
    let ended = tokio::time::timeout(wait, sup.ended_rx.recv())
        .await
        .unwrap()
        .unwrap();
    sup.on_ended(ended);
    assert!(sup.running.is_empty(), "not restarted at once");
    config.observe.phase(crate::observe::state::Phase::Running);
    let why = config.observe.readiness.check().unwrap_err();
    assert!(why.contains("ended right after its start"), "{why}");
    // The next full check starts it again.
    sup.check();
    assert!(sup.running.contains_key(&display));
    assert!(kubelet.wait_for(wait, |v| v.registrations.len() == 2).await);
    sup.stop_all().await;
    kubelet.stop().await;
}

/// How long the dropped-registration tests wait for each step.
const LATE_WAIT: Duration = Duration::from_secs(15);

/// Crashes the server `name` after the kubelet was told to handle stream ends 300 ms late (and to
/// drop the newest registration with `drop_newest`), and waits until the crashed server's stream
/// end was handled after the new server registered.
async fn crash_with_a_late_disconnect(
    kubelet: &crate::kubelet::standin::KubeletStandin,
    sup: &mut Servers,
    name: &str,
    drop_newest: bool,
) {
    kubelet.set_disconnects(crate::kubelet::standin::Disconnects {
        late: Duration::from_millis(300),
        drop_newest,
    });
    let ended = crash_after_a_while(sup, name).await;
    sup.on_ended(ended);
    assert!(
        kubelet
            .wait_for(LATE_WAIT, |v| v.stream_ends.iter().any(|e| e.replaced))
            .await
    );
}

/// The kubelet handles the end of the crashed server's stream only after the new server's first
/// list (late): every device of the resource is held unhealthy, and the list the restarted server
/// sends again makes them allocatable without any change on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_plugin_disconnected_after_a_restart_is_healed_by_the_list_sent_again() {
    let DisplayServer {
        _dir,
        _inventory,
        kubelet,
        mut sup,
        display,
        ..
    } = display_server().await;
    // The late end marked the newest registration's devices unhealthy...
    crash_with_a_late_disconnect(&kubelet, &mut sup, &display, false).await;
    let wait = LATE_WAIT;
    // ...and a later list (the same two devices) made them allocatable again.
    assert!(
        kubelet
            .wait_for(wait, |v| v.allocatable(&display) == 2
                && !v.plugins[&display].held_unhealthy)
            .await,
        "{:?}",
        kubelet.view().plugins.get(&display)
    );
    let view = kubelet.view();
    assert_eq!(view.registrations.len(), 2);
    assert_eq!(view.plugins[&display].list_sizes.last(), Some(&2));
    sup.stop_all().await;
    kubelet.stop().await;
}

/// A kubelet that closes the newest registration of the name when it handles the end of the
/// crashed server's stream (late): the server sees its stream closed while `kubelet.sock` stayed,
/// registers again, and is watched and ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_the_kubelet_drops_is_made_again() {
    let DisplayServer {
        _dir,
        _inventory,
        kubelet,
        config,
        mut sup,
        display,
    } = display_server().await;
    config.observe.phase(crate::observe::state::Phase::Running);
    crash_with_a_late_disconnect(&kubelet, &mut sup, &display, true).await;
    let wait = LATE_WAIT;
    assert!(
        kubelet
            .wait_for(wait, |v| v.registrations.len() == 3
                && v.plugins[&display].connected
                && v.allocatable(&display) == 2)
            .await,
        "{:?}",
        kubelet.view()
    );
    let view = kubelet.view();
    // The server registered again on the same socket: no restart.
    assert_eq!(
        view.registrations[2].endpoint,
        view.registrations[1].endpoint
    );
    let deadline = tokio::time::Instant::now() + wait;
    let mut sub = config.observe.readiness.changes();
    while config.observe.readiness.check().is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            config.observe.readiness.check()
        );
        let _ = tokio::time::timeout_at(deadline, sub.changed()).await;
    }
    sup.stop_all().await;
    kubelet.stop().await;
}
