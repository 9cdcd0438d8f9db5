//! [`Servers`] under paused time: a fake kubelet behind the [`Host`] seam answers `Register`,
//! watches each registered server's device list by calling its service's `ListAndWatch`
//! directly, and is "restarted" by giving `kubelet.sock` another identity. Socket files are real
//! files in a temporary directory (so removals and the directory events about them are real);
//! no socket is bound and no time passes but the virtual clock's. Every expected time below is
//! written out from the constants' documented values.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::watch as channel;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_stream::StreamExt;

use super::{
    kubelet_id, predecessors_finished, GrpcTask, Host, KubeletId, Servers, PREDECESSOR_WAIT,
};
use crate::config::Config;
use crate::inventory::Inventory;
use crate::kubelet::v1beta1::Empty;
use crate::plugin::answer::server::device_plugin_server::DevicePlugin;
use crate::plugin::file_watch::{Change, DirEvent};
use crate::plugin::register::RegisterError;
use crate::plugin::service::ResourceService;
use crate::util::file_id::FileId;
use crate::util::retry::Backoff;
use dxdp_core::devices::Resource;

const DISPLAY: &str = "directx.microsoft.com/display";
const COMPUTE: &str = "directx.microsoft.com/compute";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// How a fake server behaves when it is told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stops {
    /// It ends at once, with every connection.
    AtOnce,
    /// It ends at once, but a connection (a client that does not read) lives on until the
    /// server closes its connections.
    KeepsAConnection,
    /// It never ends: only the abort ends it.
    Hangs,
}

/// One `Register` call the fake kubelet received.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Registration {
    /// When (since the test's start).
    at: Duration,
    name: String,
    endpoint: String,
}

#[derive(Default)]
struct State {
    /// The identity of `kubelet.sock` (its file number): `None` while there is none.
    kubelet: Option<u128>,
    registrations: Vec<Registration>,
    /// Every socket a server listened on, in order (file names).
    sockets: Vec<String>,
    /// The services served, by socket file name.
    services: BTreeMap<String, ResourceService>,
    /// The task reading each watched device list, by socket file name.
    watchers: BTreeMap<String, AbortHandle>,
    /// Each device list received: when, and on which socket.
    lists: Vec<(Duration, String)>,
    /// How the servers started from now on stop.
    stops: Option<Stops>,
    /// The next `Register` call panics.
    panic_once: bool,
}

struct Inner {
    start: Instant,
    state: Mutex<State>,
}

impl Inner {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn since_start(&self) -> Duration {
        Instant::now() - self.start
    }
}

/// The fake kubelet, and the sockets of the servers.
#[derive(Clone)]
struct Fake(Arc<Inner>);

impl Fake {
    fn new() -> Fake {
        Fake(Arc::new(Inner {
            start: Instant::now(),
            state: Mutex::new(State {
                kubelet: Some(1),
                ..State::default()
            }),
        }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.state()
    }

    /// Until `t` after the test's start (virtual time).
    async fn until(&self, t: Duration) {
        tokio::time::sleep_until(self.0.start + t).await;
    }

    /// The registrations as (time, name, socket number from 1 in the order the sockets were
    /// made), sorted.
    fn registrations(&self) -> Vec<(Duration, &'static str, usize)> {
        let state = self.state();
        let mut all: Vec<_> = state
            .registrations
            .iter()
            .map(|r| {
                let name = if r.name == DISPLAY { DISPLAY } else { COMPUTE };
                let socket = state.sockets.iter().position(|s| *s == r.endpoint);
                (r.at, name, socket.map_or(0, |i| i + 1))
            })
            .collect();
        all.sort();
        all
    }

    /// When the lists sent on socket number `socket` (from 1) arrived.
    fn lists(&self, socket: usize) -> Vec<Duration> {
        let state = self.state();
        let file = &state.sockets[socket - 1];
        state
            .lists
            .iter()
            .filter(|(_, s)| s == file)
            .map(|(at, _)| *at)
            .collect()
    }

    /// How many sockets the servers listened on so far.
    fn sockets(&self) -> usize {
        self.state().sockets.len()
    }

    /// The kubelet stops watching the list of socket number `socket` (from 1).
    fn stop_watching(&self, socket: usize) {
        let mut state = self.state();
        let file = state.sockets[socket - 1].clone();
        state
            .watchers
            .remove(&file)
            .expect("a watched socket")
            .abort();
    }
}

impl Host for Fake {
    fn serve(
        &self,
        path: &Path,
        service: ResourceService,
        mut stopped: channel::Receiver<bool>,
        close: channel::Receiver<bool>,
    ) -> std::io::Result<GrpcTask> {
        std::fs::File::create_new(path)?;
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let mut state = self.state();
        state.sockets.push(file.clone());
        state.services.insert(file, service);
        let stops = state.stops.unwrap_or(Stops::AtOnce);
        Ok(tokio::spawn(async move {
            let mut connection = close;
            match stops {
                Stops::AtOnce => {
                    let _ = stopped.wait_for(|s| *s).await;
                }
                Stops::KeepsAConnection => {
                    let _ = stopped.wait_for(|s| *s).await;
                    let _ = connection.wait_for(|c| *c).await;
                }
                Stops::Hangs => std::future::pending::<()>().await,
            }
            Ok(())
        }))
    }

    fn register(
        &self,
        _kubelet_sock: &Path,
        endpoint: &str,
        name: &str,
        _timeout: Duration,
    ) -> BoxFuture<'static, Result<(), RegisterError>> {
        let service = {
            let mut state = self.state();
            assert!(state.kubelet.is_some(), "no kubelet to register with");
            state.registrations.push(Registration {
                at: self.0.since_start(),
                name: name.to_string(),
                endpoint: endpoint.to_string(),
            });
            if std::mem::take(&mut state.panic_once) {
                drop(state);
                panic!("the fake kubelet's Register panics once");
            }
            state.services.get(endpoint).cloned()
        };
        let (inner, endpoint) = (self.0.clone(), endpoint.to_string());
        Box::pin(async move {
            // The kubelet dials the endpoint and watches its device list.
            let service = service.expect("a registered socket is served");
            let mut stream = service
                .list_and_watch(tonic::Request::new(Empty {}))
                .await
                .expect("ListAndWatch")
                .into_inner();
            let (watcher, file) = (inner.clone(), endpoint.clone());
            let reader = tokio::spawn(async move {
                while let Some(Ok(_)) = stream.next().await {
                    let at = watcher.since_start();
                    watcher.state().lists.push((at, file.clone()));
                }
            });
            let old = inner
                .state()
                .watchers
                .insert(endpoint, reader.abort_handle());
            if let Some(old) = old {
                old.abort();
            }
            Ok(())
        })
    }

    fn kubelet(&self, _kubelet_sock: &Path) -> Option<KubeletId> {
        self.state().kubelet.map(|file| KubeletId {
            file: Some(FileId { volume: 1, file }),
            modified: None,
        })
    }
}

/// [`Servers`] for `names` behind `fake`, in a fresh directory, checked once (so started).
struct Setup {
    dir: tempfile::TempDir,
    _inventory: channel::Sender<Arc<Inventory>>,
    sup: Servers,
}

fn setup(fake: &Fake, names: &[(Resource, &str)]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let facts = dxdp_core::sample::sample_host().unwrap();
    let (inventory, _) = crate::inventory::build(&facts, Arc::new(Config::default()));
    let (tx, rx) = channel::channel(Arc::new(inventory));
    let mut sup = Servers::with_host(
        dir.path(),
        Arc::new(fake.clone()),
        Backoff {
            initial: ms(500),
            max: Duration::from_secs(30),
            timeout: Duration::from_secs(30),
        },
        crate::observe::Observe::new(),
        rx,
        names.iter().map(|(r, n)| (*r, n.to_string())).collect(),
    );
    sup.check();
    Setup {
        dir,
        _inventory: tx,
        sup,
    }
}

fn event(name: &str, change: Change) -> DirEvent {
    DirEvent {
        dir: std::path::PathBuf::new(),
        name: OsString::from(name),
        change,
    }
}

impl Setup {
    /// Removes the socket of the server of `name` as the kubelet would, and returns the event.
    fn remove_socket(&self, name: &str) -> DirEvent {
        let path = self.sup.running[name].path.clone();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(path.parent(), Some(self.dir.path()));
        event(path.file_name().unwrap().to_str().unwrap(), Change::Removed)
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[tokio::test(start_paused = true)]
async fn a_new_kubelet_sock_restarts_every_server_and_the_new_ones_register_at_once() {
    let fake = Fake::new();
    let mut s = setup(
        &fake,
        &[(Resource::Display, DISPLAY), (Resource::Compute, COMPUTE)],
    );
    fake.until(secs(10)).await;
    assert_eq!(
        fake.registrations(),
        [(secs(0), COMPUTE, 2), (secs(0), DISPLAY, 1)]
    );
    // The safety check finds another kubelet.sock (no event seen).
    fake.state().kubelet = Some(2);
    s.sup.check();
    fake.until(secs(30)).await;
    assert_eq!(
        fake.registrations(),
        [
            (secs(0), COMPUTE, 2),
            (secs(0), DISPLAY, 1),
            (secs(10), COMPUTE, 4),
            (secs(10), DISPLAY, 3),
        ]
    );
    // The new kubelet has no clients of the old servers: each list is sent once.
    assert_eq!(fake.lists(1), [secs(0)]);
    assert_eq!(fake.lists(3), [secs(10)]);
    assert_eq!(fake.lists(4), [secs(10)]);
    assert_eq!(fake.sockets(), 4);
    s.sup.stop_all().await;
}

/// A removed socket restarts its server at once on a new socket, which registers once the old
/// server finished stopping: at once, after the 0.5 s grace when a client keeps a stream open,
/// after 1 s (grace and abort) when the old server hangs. The restarted server sends its list
/// again 1 s and 5 s after the kubelet first watches it.
#[tokio::test(start_paused = true)]
async fn a_removed_socket_restarts_its_server_which_registers_once_the_old_one_stopped() {
    for (stops, waited) in [
        (Stops::AtOnce, ms(0)),
        (Stops::KeepsAConnection, ms(500)),
        (Stops::Hangs, ms(1000)),
    ] {
        let fake = Fake::new();
        fake.state().stops = Some(stops);
        let mut s = setup(&fake, &[(Resource::Display, DISPLAY)]);
        fake.until(secs(10)).await;
        let removed = s.remove_socket(DISPLAY);
        s.sup.on_dir_events(&[removed]);
        assert_eq!(fake.sockets(), 2, "{stops:?}: listening at once");
        fake.until(secs(30)).await;
        let registered = secs(10) + waited;
        assert_eq!(
            fake.registrations(),
            [(secs(0), DISPLAY, 1), (registered, DISPLAY, 2)],
            "{stops:?}"
        );
        assert_eq!(
            fake.lists(2),
            [registered, registered + secs(1), registered + secs(5)],
            "{stops:?}"
        );
        assert_eq!(fake.lists(1), [secs(0)], "{stops:?}");
        s.sup.stop_all().await;
    }
}

#[tokio::test(start_paused = true)]
async fn the_wait_for_the_earlier_servers_is_at_most_predecessor_wait() {
    assert_eq!(PREDECESSOR_WAIT, secs(2));
    let start = Instant::now();
    predecessors_finished("x".into(), None).await;
    assert_eq!(Instant::now() - start, ms(0));
    // Finished after 300 ms.
    let (finished, rx) = channel::channel(());
    tokio::spawn(async move {
        tokio::time::sleep(ms(300)).await;
        drop(finished);
    });
    predecessors_finished("x".into(), Some(rx)).await;
    assert_eq!(Instant::now() - start, ms(300));
    // Never finished: 2 s.
    let (_never, rx) = channel::channel(());
    predecessors_finished("x".into(), Some(rx)).await;
    assert_eq!(Instant::now() - start, ms(2300));
}

/// The kubelet stops watching while `kubelet.sock` stays: after the 1 s pause the server
/// registers again on the same socket and sends its list again 1 s and 5 s later. While
/// `kubelet.sock` changed, it waits for the new servers instead.
#[tokio::test(start_paused = true)]
async fn a_registration_the_kubelet_drops_is_made_again_after_the_rewatch_pause() {
    let fake = Fake::new();
    let mut s = setup(&fake, &[(Resource::Display, DISPLAY)]);
    fake.until(secs(10)).await;
    fake.stop_watching(1);
    fake.until(secs(20)).await;
    assert_eq!(
        fake.registrations(),
        [(secs(0), DISPLAY, 1), (secs(11), DISPLAY, 1)]
    );
    assert_eq!(fake.lists(1), [secs(0), secs(11), secs(12), secs(16)]);
    // Not watched again, and kubelet.sock changed (no event yet): no registration...
    fake.stop_watching(1);
    fake.state().kubelet = Some(2);
    fake.until(secs(30)).await;
    assert_eq!(fake.registrations().len(), 2);
    // ...until the check starts new servers, which register at once.
    s.sup.check();
    fake.until(secs(40)).await;
    assert_eq!(
        fake.registrations(),
        [
            (secs(0), DISPLAY, 1),
            (secs(11), DISPLAY, 1),
            (secs(30), DISPLAY, 2)
        ]
    );
    assert_eq!(fake.lists(2), [secs(30)]);
    s.sup.stop_all().await;
}

/// A server that ends within 1 s of its start waits for the next check; one that ends later is
/// restarted at once. Both register again as restarted servers (the list is sent again).
#[tokio::test(start_paused = true)]
async fn a_server_that_ends_right_after_its_start_waits_for_the_next_check() {
    assert_eq!(super::RAPID_END, secs(1));
    let fake = Fake::new();
    let mut s = setup(&fake, &[(Resource::Display, DISPLAY)]);
    fake.until(ms(999)).await;
    s.sup.running[DISPLAY].grpc.abort();
    let ended = s.sup.ended_rx.recv().await.unwrap();
    assert_eq!(ended.reason, "gRPC server ended: aborted");
    s.sup.on_ended(ended);
    assert!(s.sup.running.is_empty(), "not restarted at once");
    fake.until(secs(5)).await;
    assert_eq!(fake.sockets(), 1);
    s.sup.check();
    // 2 s after its start (after the list was sent again at 6 s): restarted at once.
    fake.until(secs(7)).await;
    s.sup.running[DISPLAY].grpc.abort();
    let ended = s.sup.ended_rx.recv().await.unwrap();
    s.sup.on_ended(ended);
    assert_eq!(fake.sockets(), 3);
    fake.until(secs(20)).await;
    assert_eq!(
        fake.registrations(),
        [
            (secs(0), DISPLAY, 1),
            (secs(5), DISPLAY, 2),
            (secs(7), DISPLAY, 3)
        ]
    );
    assert_eq!(fake.lists(2), [secs(5), secs(6)]);
    assert_eq!(fake.lists(3), [secs(7), secs(8), secs(12)]);
    s.sup.stop_all().await;
}

/// One kubelet restart (its sockets removed and `kubelet.sock` created again, seen in one batch
/// of events) restarts each server once: one new socket and one registration per name.
#[tokio::test(start_paused = true)]
async fn one_kubelet_restart_restarts_each_server_once() {
    let fake = Fake::new();
    let mut s = setup(
        &fake,
        &[(Resource::Display, DISPLAY), (Resource::Compute, COMPUTE)],
    );
    fake.until(secs(10)).await;
    fake.state().kubelet = Some(2);
    let events = [
        s.remove_socket(DISPLAY),
        s.remove_socket(COMPUTE),
        event("kubelet.sock", Change::Removed),
        event("kubelet.sock", Change::Created),
    ];
    s.sup.on_dir_events(&events);
    fake.until(secs(20)).await;
    assert_eq!(fake.sockets(), 4, "one new socket per name");
    assert_eq!(
        fake.registrations(),
        [
            (secs(0), COMPUTE, 2),
            (secs(0), DISPLAY, 1),
            (secs(10), COMPUTE, 4),
            (secs(10), DISPLAY, 3),
        ]
    );
    assert_eq!(fake.lists(3), [secs(10)]);
    s.sup.stop_all().await;
}

/// `kubelet.sock` removed and created again with the same identity (an inode reused at once,
/// time stamps within the clock's granularity): a new kubelet all the same. A change of its
/// attributes alone is not.
#[tokio::test(start_paused = true)]
async fn a_kubelet_sock_created_again_with_the_same_identity_is_a_new_kubelet() {
    let fake = Fake::new();
    let mut s = setup(&fake, &[(Resource::Display, DISPLAY)]);
    fake.until(secs(10)).await;
    s.sup.on_dir_events(&[
        event("kubelet.sock", Change::Removed),
        event("kubelet.sock", Change::Created),
    ]);
    fake.until(secs(20)).await;
    s.sup.on_dir_events(&[event("kubelet.sock", Change::Other)]);
    fake.until(secs(30)).await;
    assert_eq!(
        fake.registrations(),
        [(secs(0), DISPLAY, 1), (secs(10), DISPLAY, 2)]
    );
    assert_eq!(fake.lists(2), [secs(10)]);
    // The kubelet stops (its removal seen alone), and a new one starts a second later: one
    // restart, at once.
    fake.state().kubelet = None;
    s.sup
        .on_dir_events(&[event("kubelet.sock", Change::Removed)]);
    fake.until(secs(31)).await;
    fake.state().kubelet = Some(2);
    s.sup
        .on_dir_events(&[event("kubelet.sock", Change::Created)]);
    fake.until(secs(40)).await;
    assert_eq!(
        fake.registrations(),
        [
            (secs(0), DISPLAY, 1),
            (secs(10), DISPLAY, 2),
            (secs(31), DISPLAY, 3)
        ]
    );
    assert_eq!(fake.sockets(), 3);
    s.sup.stop_all().await;
}

/// However many servers stop before anyone reads the reports, nothing piles up: a server
/// stopped on purpose does not report, the ends of one server are one report, and one entry per
/// name tells the next server what to wait for.
#[tokio::test(start_paused = true)]
async fn ended_reports_and_stopping_servers_take_one_slot_per_name() {
    let fake = Fake::new();
    let mut s = setup(&fake, &[(Resource::Display, DISPLAY)]);
    for i in 1..=50 {
        fake.until(secs(10) + ms(100) * i).await;
        let removed = s.remove_socket(DISPLAY);
        s.sup.on_dir_events(&[removed]);
    }
    fake.until(secs(20)).await;
    assert_eq!(fake.sockets(), 51);
    assert_eq!(fake.registrations().len(), 51);
    assert_eq!(s.sup.ended_rx.pending(), 0);
    assert_eq!(s.sup.stopping.len(), 1);
    // The next server's registration panics and its gRPC server dies: one report.
    fake.state().panic_once = true;
    let removed = s.remove_socket(DISPLAY);
    s.sup.on_dir_events(&[removed]);
    fake.until(secs(21)).await;
    s.sup.running[DISPLAY].grpc.abort();
    fake.until(secs(22)).await;
    assert_eq!(s.sup.ended_rx.pending(), 1);
    let ended = s.sup.ended_rx.recv().await.unwrap();
    assert_eq!(ended.generation, 52);
    assert_eq!(
        ended.reason,
        "registration panicked: the fake kubelet's Register panics once"
    );
    assert_eq!(s.sup.ended_rx.try_recv().map(|e| e.generation), None);
    s.sup.stop_all().await;
}

#[test]
fn a_kubelet_sock_is_known_by_its_file_identity() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kubelet.sock");
    assert_eq!(kubelet_id(&sock), None);
    std::fs::write(&sock, b"").unwrap();
    let first = kubelet_id(&sock).unwrap();
    assert_eq!(kubelet_id(&sock), Some(first), "stable while it stays");
    assert_eq!(
        first.file,
        Some(crate::util::file_id::file_id(&sock).unwrap()),
        "one file identity for the whole daemon"
    );
    // Renamed away (so its number cannot be reused) and created again: another kubelet.
    std::fs::rename(&sock, dir.path().join("old.sock")).unwrap();
    std::fs::write(&sock, b"").unwrap();
    let second = kubelet_id(&sock).unwrap();
    assert_ne!(second.file, first.file);
}
