//! The device-plugin servers: one [`Server`] per served name (a resource's name and each alias),
//! each its own socket in the kubelet's device-plugin directory (a fresh file name on every
//! start), its gRPC server and its registration task. [`Servers`] reacts to events, never to a
//! fast poll:
//!
//! - `kubelet.sock` created or replaced (kubelet restart): every server restarts and registers.
//! - a server's socket removed, its gRPC server ended, or its registration task died: that server
//!   restarts on a fresh socket.
//! - a new configuration: servers for names no longer served stop, new ones start.
//! - a full check (safety tick, lost events, the directory watched again) re-checks all of the
//!   above in case an event was missed.
//!
//! A stopping server removes its socket at once, ends its streams, and after [`STOP_GRACE`]
//! closes every connection it still has (a client that never reads cannot keep a stopped
//! server's descriptors), so that nothing outlives its socket.
//!
//! A server started again for a name while the same kubelet lives (its socket removed, its gRPC
//! server ended, a name served again) listens at once but registers only once the earlier servers
//! of that name have finished stopping: the kubelet marks every device of a resource unhealthy when
//! the `ListAndWatch` stream of any of its registrations ends (`PluginDisconnected` is keyed by the
//! resource name), and only a later `ListAndWatch` message makes them healthy again. The kubelet
//! may still handle the old stream's end after the new server's first list (its goroutine runs
//! late): so a restarted server sends its list again ([`RESEND_AFTER`]), and a server whose streams
//! the kubelet closes while `kubelet.sock` stays (a kubelet that disconnects the newest client of
//! the name) registers again. Readiness counts a name as served only while the kubelet watches its
//! list. A new kubelet (`kubelet.sock` recreated) has no clients of the old servers: there the new
//! servers register at once.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio::sync::{watch as channel, Notify};
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::Instant;

use super::claim::socket_name;
use super::file_watch::{Change, DirEvent};
use super::register::{self, RegisterError};
use super::service::{ResourceService, Streams};
use crate::inventory::InventoryRx;
use crate::kubelet::KUBELET_SOCKET;
use crate::observe::Observe;
use crate::plugin::answer::server::device_plugin_server::DevicePluginServer;
use crate::transport::{self, Transport};
use crate::util::file_id::{file_id, FileId};
use crate::util::retry::Backoff;
use dxdp_core::devices::Resource;

/// The most calls one kubelet connection has in flight at once (HTTP/2
/// `SETTINGS_MAX_CONCURRENT_STREAMS`; RFC 9113 recommends at least 100). The kubelet admits pods
/// one at a time: only a burst from elsewhere meets it.
pub(crate) const MAX_CONCURRENT_STREAMS: u32 = 100;

/// How long a stopping server's streams get to end before its connections are closed.
pub(crate) const STOP_GRACE: Duration = Duration::from_millis(500);
/// How long a stopping server's gRPC server gets, after its connections were closed, before it is
/// aborted. With [`STOP_GRACE`] a server stops in at most one second, well inside the ~5 s
/// Windows gives a HostProcess container's process after CTRL_SHUTDOWN_EVENT.
pub(crate) const STOP_ABORT: Duration = Duration::from_millis(500);

/// How long a server started again waits, at most, for the earlier servers of its name to finish
/// stopping before it registers: twice the longest stop ([`STOP_GRACE`] + [`STOP_ABORT`]).
pub(crate) const PREDECESSOR_WAIT: Duration = Duration::from_secs(2);

/// What tells one `kubelet.sock` from its successor: the file's identity ([`FileId`]: device and
/// inode on Unix, volume serial number and file ID on Windows) and its modification time (to the
/// nanosecond where the file system keeps it). Not its creation time: NTFS tunnelling gives a
/// file created again under the same name within 15 s the creation time of the one removed. A
/// socket created again at once can still get the removed one's inode and, within the clock's
/// granularity, its time: [`Servers::on_dir_events`] therefore also takes the removal of
/// `kubelet.sock` as the end of that kubelet, whatever the identity says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KubeletId {
    /// The file's identity (`None` where it cannot be read although the file exists).
    pub(crate) file: Option<FileId>,
    /// Its modification time.
    pub(crate) modified: Option<SystemTime>,
}

/// The identity of the `kubelet.sock` at `path`, `None` while there is none. Whether it exists is
/// `std::fs::metadata`'s answer (which knows an AF_UNIX socket on Windows is a reparse point it
/// cannot follow), so that a file ID that cannot be read degrades the identity, never hides the
/// kubelet.
fn kubelet_id(path: &Path) -> Option<KubeletId> {
    let meta = std::fs::metadata(path).ok()?;
    Some(KubeletId {
        file: file_id(path).ok(),
        modified: meta.modified().ok(),
    })
}

/// A gRPC server task of one served name.
pub(crate) type GrpcTask = JoinHandle<Result<(), tonic::transport::Error>>;

/// What the servers do outside the process, in one seam: listen on a socket file and serve a
/// name's service there, call `Register` on `kubelet.sock`, and tell one `kubelet.sock` from its
/// successor. The product's is [`OsHost`]; the unit tests put a fake kubelet behind it, so that
/// restarts, waits and registrations run under paused time.
pub(crate) trait Host: Send + Sync + 'static {
    /// Listens on a new socket at `path` (which does not exist) and serves `service` there in a
    /// task of its own until `stopped` turns true; once `close` turns true, every connection
    /// accepted fails its next read or write, and `close`'s sender is closed once the listener
    /// and every connection are dropped.
    fn serve(
        &self,
        path: &Path,
        service: ResourceService,
        stopped: channel::Receiver<bool>,
        close: channel::Receiver<bool>,
    ) -> std::io::Result<GrpcTask>;

    /// One `Register` call on `kubelet_sock` for `name` served at `endpoint` (a file name in the
    /// kubelet's directory), within `timeout`.
    fn register(
        &self,
        kubelet_sock: &Path,
        endpoint: &str,
        name: &str,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<(), RegisterError>>;

    /// The identity of `kubelet_sock`, `None` while there is none.
    fn kubelet(&self, kubelet_sock: &Path) -> Option<KubeletId>;
}

/// The product's [`Host`]: sockets of the transport, tonic, the file system.
struct OsHost(Transport);

impl Host for OsHost {
    fn serve(
        &self,
        path: &Path,
        service: ResourceService,
        mut stopped: channel::Receiver<bool>,
        close: channel::Receiver<bool>,
    ) -> std::io::Result<GrpcTask> {
        let listener = self.0.bind(path)?;
        let incoming = transport::incoming(listener, close, Arc::default());
        Ok(tokio::spawn(async move {
            tonic::transport::Server::builder()
                // A burst of concurrent calls is served 100 at a time (the client queues the
                // rest): memory stays bounded, and h2 never closes the kubelet's connection for
                // buffering too many small DATA frames (issue 36, BENCHMARKS.md).
                .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
                .add_service(DevicePluginServer::new(service))
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await
        }))
    }

    fn register(
        &self,
        kubelet_sock: &Path,
        endpoint: &str,
        name: &str,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<(), RegisterError>> {
        let (transport, sock) = (self.0, kubelet_sock.to_path_buf());
        let (endpoint, name) = (endpoint.to_string(), name.to_string());
        Box::pin(
            async move { register::register(transport, &sock, &endpoint, &name, timeout).await },
        )
    }

    fn kubelet(&self, kubelet_sock: &Path) -> Option<KubeletId> {
        kubelet_id(kubelet_sock)
    }
}

/// A server's gRPC task or registration ended while the server was meant to run.
#[derive(Debug)]
pub(crate) struct Ended {
    /// The served name.
    pub(crate) name: String,
    /// The server's generation.
    pub(crate) generation: u64,
    /// Why.
    pub(crate) reason: String,
}

/// Where servers report that they ended: at most one report per served name, the newest
/// generation's (an older generation's end is stale by construction), so that however many
/// servers end before the reports are read, they take one slot per name. A server stopped on
/// purpose does not report. Reporting never blocks.
#[derive(Debug, Default)]
struct EndedSlots {
    by_name: Mutex<BTreeMap<String, Ended>>,
    notify: Notify,
}

impl EndedSlots {
    fn report(&self, ended: Ended) {
        let mut slots = self.by_name.lock().unwrap_or_else(|p| p.into_inner());
        match slots.get(&ended.name) {
            Some(kept) if kept.generation >= ended.generation => return,
            _ => {
                slots.insert(ended.name.clone(), ended);
            }
        }
        drop(slots);
        self.notify.notify_one();
    }
}

/// The reports of servers that ended (see [`Servers::on_ended`]).
#[derive(Debug)]
pub(crate) struct EndedRx(Arc<EndedSlots>);

impl EndedRx {
    /// The next report, once there is one (cancel-safe: a report is taken only when returned).
    /// Never `None` while the [`Servers`] lives.
    pub(crate) async fn recv(&mut self) -> Option<Ended> {
        loop {
            if let Some(ended) = self.try_recv() {
                return Some(ended);
            }
            // A report made since `try_recv` left a permit: this returns at once.
            self.0.notify.notified().await;
        }
    }

    /// The next report, if there is one now.
    pub(crate) fn try_recv(&mut self) -> Option<Ended> {
        self.0
            .by_name
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_first()
            .map(|(_, ended)| ended)
    }

    /// How many reports are waiting.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.0
            .by_name
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

/// One device-plugin server: for one served name, its socket, its gRPC server task and its
/// registration with the kubelet.
pub(crate) struct Server {
    resource: Resource,
    /// The socket.
    pub(crate) path: PathBuf,
    generation: u64,
    stop: channel::Sender<bool>,
    close: channel::Sender<bool>,
    monitor: JoinHandle<()>,
    /// The gRPC server task (aborting it is how tests simulate a crash).
    pub(crate) grpc: AbortHandle,
    registrar: AbortHandle,
    /// When it started (tests age it).
    pub(super) started: Instant,
}

/// A server that ends sooner than this after its start is restarted by the next full check, not
/// at once.
pub(crate) const RAPID_END: std::time::Duration = std::time::Duration::from_secs(1);

/// Keeps one [`Server`] running per wanted name.
pub(crate) struct Servers {
    kubelet_dir: PathBuf,
    kubelet_sock: PathBuf,
    host: Arc<dyn Host>,
    backoff: Backoff,
    inventory: InventoryRx,
    wanted: Vec<(Resource, String)>,
    /// The running servers by served name.
    pub(crate) running: BTreeMap<String, Server>,
    kubelet: Option<KubeletId>,
    waiting_announced: bool,
    generations: u64,
    /// For each name a server of which was stopped while this kubelet lives: a receiver whose
    /// sender is dropped once every server of the name stopped so far finished stopping. One
    /// entry per name (each stop waits for the one before it), dropped when the kubelet changes
    /// or, once finished, when the name is no longer served.
    stopping: BTreeMap<String, channel::Receiver<()>>,
    ended_tx: Arc<EndedSlots>,
    /// Where servers report that they ended.
    pub(crate) ended_rx: EndedRx,
    observe: Observe,
}

impl Servers {
    /// No servers yet; `wanted` are the names to serve.
    pub(crate) fn new(
        kubelet_dir: &Path,
        transport: Transport,
        backoff: Backoff,
        observe: Observe,
        inventory: InventoryRx,
        wanted: Vec<(Resource, String)>,
    ) -> Self {
        Self::with_host(
            kubelet_dir,
            Arc::new(OsHost(transport)),
            backoff,
            observe,
            inventory,
            wanted,
        )
    }

    /// [`Servers::new`] with the sockets, `Register` calls and `kubelet.sock` of `host`.
    pub(crate) fn with_host(
        kubelet_dir: &Path,
        host: Arc<dyn Host>,
        backoff: Backoff,
        observe: Observe,
        inventory: InventoryRx,
        wanted: Vec<(Resource, String)>,
    ) -> Self {
        let ended_tx = Arc::new(EndedSlots::default());
        let kubelet_sock = kubelet_dir.join(KUBELET_SOCKET);
        observe.wanted(wanted.iter().map(|(_, n)| n.clone()).collect());
        Servers {
            kubelet: host.kubelet(&kubelet_sock),
            kubelet_dir: kubelet_dir.to_path_buf(),
            kubelet_sock,
            host,
            backoff,
            inventory,
            wanted,
            running: BTreeMap::new(),
            waiting_announced: false,
            generations: 0,
            stopping: BTreeMap::new(),
            ended_rx: EndedRx(ended_tx.clone()),
            ended_tx,
            observe,
        }
    }

    /// Brings the servers in line with the wanted names, the sockets and `kubelet.sock`: the
    /// whole state is compared, so it is also the fallback for missed events.
    pub(crate) fn check(&mut self) {
        let now = self.host.kubelet(&self.kubelet_sock);
        if now != self.kubelet {
            // Another kubelet (or none): it has no clients of the servers stopped so far.
            self.stopping.clear();
        }
        self.observe
            .kubelet_missing(now.is_none().then_some(self.kubelet_sock.as_path()));
        if now.is_none() {
            if !self.waiting_announced {
                tracing::info!(
                    "waiting for the kubelet: {} does not exist yet",
                    self.kubelet_sock.display()
                );
                self.waiting_announced = true;
            }
            self.kubelet = None;
            return;
        }
        self.waiting_announced = false;
        if now != self.kubelet {
            let was_there = self.kubelet.is_some();
            self.kubelet = now;
            if was_there || !self.running.is_empty() {
                self.restart_all(&format!(
                    "{} was recreated (kubelet restart)",
                    self.kubelet_sock.display()
                ));
                return;
            }
        }
        let gone: Vec<String> = self
            .running
            .iter()
            .filter(|(_, u)| !u.path.exists())
            .map(|(n, _)| n.clone())
            .collect();
        for name in gone {
            self.restart(&name, "its socket was removed (kubelet restart?)");
        }
        let missing: Vec<(Resource, String)> = self
            .wanted
            .iter()
            .filter(|(_, n)| !self.running.contains_key(n))
            .cloned()
            .collect();
        for (resource, name) in missing {
            self.start(resource, &name);
        }
    }

    /// Acts on changes in the kubelet directory. One cause restarts a server once: a new
    /// `kubelet.sock` is handled first (it restarts every server), and a removed socket then
    /// restarts its server only if that server was not restarted already.
    pub(crate) fn on_dir_events(&mut self, events: &[DirEvent]) {
        let is_kubelet = |e: &&DirEvent| e.name.as_os_str() == std::ffi::OsStr::new(KUBELET_SOCKET);
        let kubelet = events.iter().any(|e| is_kubelet(&e));
        let removed: Vec<(String, PathBuf)> = self
            .running
            .iter()
            .filter(|(_, u)| {
                events.iter().any(|e| {
                    e.change == Change::Removed
                        && u.path.file_name() == Some(e.name.as_os_str())
                        && !u.path.exists()
                })
            })
            .map(|(n, u)| (n.clone(), u.path.clone()))
            .collect();
        if kubelet {
            let now = self.host.kubelet(&self.kubelet_sock);
            if now.is_none() && self.kubelet.is_some() {
                tracing::warn!(
                    "{} disappeared (kubelet stopped?)",
                    self.kubelet_sock.display()
                );
            }
            // The kubelet.sock known so far was removed: whatever is there now is another
            // kubelet's, even one that got the same inode and time stamps.
            if events
                .iter()
                .filter(is_kubelet)
                .any(|e| e.change == Change::Removed)
            {
                self.kubelet = None;
            }
            self.check();
        }
        for (name, path) in removed {
            if self.running.get(&name).is_some_and(|u| u.path == path) {
                self.restart(&name, "its socket was removed (kubelet restart?)");
            }
        }
    }

    /// A server's gRPC task or registration ended: restarts it when it is the current one. A server
    /// that ended within [`RAPID_END`] of its start is not restarted at once but by the next
    /// full check (the safety poll, or the next kubelet event), so that a server failing at every
    /// start cannot spin.
    pub(crate) fn on_ended(&mut self, ended: Ended) {
        let Some(server) = self
            .running
            .get(&ended.name)
            .filter(|u| u.generation == ended.generation)
        else {
            return;
        };
        tracing::error!(resource = %ended.name, "{}", ended.reason);
        if server.started.elapsed() < RAPID_END {
            if let Some(server) = self.running.remove(&ended.name) {
                tracing::warn!(resource = %ended.name, "the server ended within {RAPID_END:?} of its start; starting it again at the next check");
                self.retire(&ended.name, server);
                self.observe.server_not_listening(
                    &ended.name,
                    format!("ended right after its start: {}", ended.reason),
                );
            }
            return;
        }
        self.restart(&ended.name, "restarting the server");
    }

    /// Serves the names of a new (validated) configuration.
    pub(crate) fn reconfigure(&mut self, wanted: Vec<(Resource, String)>) {
        if wanted == self.wanted {
            return;
        }
        tracing::info!("the configuration changed the served resources or their names");
        let stale: Vec<String> = self
            .running
            .iter()
            .filter(|(n, u)| !wanted.contains(&(u.resource, (*n).clone())))
            .map(|(n, _)| n.clone())
            .collect();
        for name in stale {
            if let Some(server) = self.running.remove(&name) {
                tracing::info!(resource = %name, "no longer served");
                self.retire(&name, server);
            }
        }
        self.observe
            .wanted(wanted.iter().map(|(_, n)| n.clone()).collect());
        // The stops of names no longer served that have finished: nothing waits for them.
        self.stopping.retain(|name, finished| {
            wanted.iter().any(|(_, n)| n == name) || finished.has_changed().is_ok()
        });
        self.wanted = wanted;
        self.check();
    }

    /// Restarts every server for a new kubelet: the new servers register at once (the new kubelet
    /// has no clients of the old ones; [`Servers::check`] forgot them).
    fn restart_all(&mut self, why: &str) {
        tracing::warn!("{why}; starting new sockets and registering again");
        let running = std::mem::take(&mut self.running);
        for (name, server) in running {
            tokio::spawn(self.stop(&name, server));
        }
        self.check();
    }

    fn restart(&mut self, name: &str, why: &str) {
        let Some(server) = self.running.remove(name) else {
            return;
        };
        tracing::warn!(resource = %name, "{why}; serving it on a new socket and registering again");
        let resource = server.resource;
        self.retire(name, server);
        if self.host.kubelet(&self.kubelet_sock).is_some() {
            self.start(resource, name);
        }
    }

    /// Stops `server` (in a task of its own) while the kubelet lives on: the next server of `name`
    /// registers only once it and every earlier server of `name` finished.
    fn retire(&mut self, name: &str, server: Server) {
        let (finished, stopping) = channel::channel(());
        let stop = self.stop(name, server);
        let earlier = self.stopping.insert(name.to_string(), stopping);
        tokio::spawn(async move {
            tokio::join!(stop, stopped(earlier));
            drop(finished);
        });
    }

    /// Binds a fresh socket for `name`, serves it and registers it once the earlier servers of
    /// `name` stopped while this kubelet lives have finished. A failure is logged and retried by
    /// the next full check.
    fn start(&mut self, resource: Resource, name: &str) {
        let path = self.kubelet_dir.join(socket_name(name));
        if let Err(e) = transport::check_socket_path(&path) {
            tracing::error!(resource = %name, "{e}");
            return;
        }
        let _ = std::fs::remove_file(&path);
        let (stop, stopping) = channel::channel(false);
        let (close, closing) = channel::channel(false);
        let (resend, resend_rx) = channel::channel(0u64);
        let streams = Streams::new(resend_rx);
        let open = streams.open.subscribe();
        let svc = ResourceService::new(
            resource,
            name.to_string(),
            self.inventory.clone(),
            (stopping.clone(), streams),
            self.observe.metrics.allocate_recorder(name),
        );
        let grpc = match self.host.serve(&path, svc, stopping.clone(), closing) {
            Ok(grpc) => grpc,
            Err(e) => {
                tracing::error!(resource = %name, socket = %path.display(), "cannot listen: {e}; retrying at the next safety poll");
                self.observe.server_not_listening(
                    name,
                    format!("cannot listen on {}: {e}", path.display()),
                );
                return;
            }
        };
        self.generations += 1;
        let generation = self.generations;
        let grpc_abort = grpc.abort_handle();
        let ended_tx = self.ended_tx.clone();
        let ended_name = name.to_string();
        let told_to_stop = stopping.clone();
        let monitor = tokio::spawn(async move {
            let reason = match grpc.await {
                Ok(Ok(())) => "stopped".to_string(),
                Ok(Err(e)) => crate::util::errors::chain(&e),
                Err(e) if e.is_cancelled() => "aborted".to_string(),
                Err(e) => format!("panicked: {e}"),
            };
            // The end of a server stopped on purpose is no news.
            if !*told_to_stop.borrow() {
                ended_tx.report(Ended {
                    name: ended_name,
                    generation,
                    reason: format!("gRPC server ended: {reason}"),
                });
            }
        });
        tracing::info!(resource = %name, socket = %path.display(), "listening");
        self.observe.server_started(name, generation);
        // An earlier server of the name served this kubelet: the kubelet may handle the end of its
        // stream after this server's first list, however soon that server finished stopping.
        let predecessors = self.stopping.get(name).cloned();
        let restarted = predecessors.is_some();
        let watch = Watch {
            open,
            resend,
            stopping,
            restarted,
        };
        let predecessors = predecessors_finished(name.to_string(), predecessors);
        let registration = registration(
            (self.host.clone(), self.kubelet_sock.clone()),
            path.clone(),
            name.to_string(),
            self.backoff,
            (self.observe.clone(), generation),
            watch,
        );
        let registration = async move {
            predecessors.await;
            registration.await;
        };
        let ended_tx = self.ended_tx.clone();
        let ended_name = name.to_string();
        let registrar = tokio::spawn(async move {
            // A registration that panics would leave the server unregistered for ever.
            if let Err(panic) = std::panic::AssertUnwindSafe(registration)
                .catch_unwind()
                .await
            {
                let text = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                ended_tx.report(Ended {
                    name: ended_name,
                    generation,
                    reason: format!("registration panicked: {text}"),
                });
            }
        });
        self.running.insert(
            name.to_string(),
            Server {
                resource,
                path,
                generation,
                stop,
                close,
                monitor,
                grpc: grpc_abort,
                registrar: registrar.abort_handle(),
                started: Instant::now(),
            },
        );
    }

    /// Stops every server and waits until their gRPC servers ended.
    pub(crate) async fn stop_all(&mut self) {
        let running = std::mem::take(&mut self.running);
        let stopping: Vec<_> = running
            .into_iter()
            .map(|(name, server)| self.stop(&name, server))
            .collect();
        futures_util::future::join_all(stopping).await;
    }

    /// [`stop_server`], telling the readiness that the server is gone.
    fn stop(&self, name: &str, server: Server) -> impl Future<Output = ()> {
        self.observe.server_stopped(name, server.generation);
        stop_server(server)
    }
}

/// Until the sender of `finished` (if any) is dropped: nothing is ever sent on it.
async fn stopped(finished: Option<channel::Receiver<()>>) {
    if let Some(mut finished) = finished {
        while finished.changed().await.is_ok() {}
    }
}

/// Waits until the earlier servers of the name finished stopping (the sender of `predecessors`
/// is dropped), at most [`PREDECESSOR_WAIT`].
async fn predecessors_finished(name: String, predecessors: Option<channel::Receiver<()>>) {
    if predecessors.is_none() {
        return;
    }
    tracing::debug!(resource = %name, "waiting for the previous server to finish before registering");
    let started = Instant::now();
    match tokio::time::timeout(PREDECESSOR_WAIT, stopped(predecessors)).await {
        Ok(_) => {
            tracing::debug!(resource = %name, waited = ?started.elapsed(), "the previous server finished; registering")
        }
        Err(_) => {
            tracing::warn!(resource = %name, "the previous server did not finish stopping within {PREDECESSOR_WAIT:?}; registering anyway (the device list is sent again later, and a registration the kubelet drops is made again)")
        }
    }
}

/// When a server restarted while its kubelet lives sends its device list again, counted from the
/// moment the kubelet first watches it: by then the end of the old server's stream has reached the
/// kubelet however late it handles it, and the list makes the devices healthy again if that
/// end marked them unhealthy.
pub(crate) const RESEND_AFTER: [Duration; 2] = [Duration::from_secs(1), Duration::from_secs(5)];

/// How long the kubelet gets, after accepting a registration, to open its `ListAndWatch`
/// stream before the server registers again.
pub(crate) const WATCH_WAIT: Duration = Duration::from_secs(30);

/// The pause before a server whose streams the kubelet closed (while `kubelet.sock` stayed)
/// registers again: the kubelet finishes dropping the registration first.
pub(crate) const REWATCH_PAUSE: Duration = Duration::from_secs(1);

/// What a server's registration task follows of its streams.
struct Watch {
    /// The number of open `ListAndWatch` streams.
    open: channel::Receiver<usize>,
    /// Asks the streams to send the current list again.
    resend: channel::Sender<u64>,
    /// Turns true when the server stops.
    stopping: channel::Receiver<bool>,
    /// Whether an earlier server of the name served this kubelet.
    restarted: bool,
}

/// Registers one server until the kubelet accepts it, reporting every attempt to `observe` as the
/// server's generation; then follows the kubelet's `ListAndWatch` streams: when the kubelet
/// stops watching while the server lives (it dropped the registration: a late
/// `PluginDisconnected` of an earlier server of the name closes the newest client), the server
/// registers again. A server that was `restarted` sends its list again ([`RESEND_AFTER`]).
async fn registration(
    (host, kubelet_sock): (Arc<dyn Host>, PathBuf),
    socket: PathBuf,
    name: String,
    backoff: Backoff,
    (observe, generation): (Observe, u64),
    mut watch: Watch,
) {
    let endpoint = socket
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    loop {
        register::until_registered(
            backoff,
            || host.register(&kubelet_sock, &endpoint, &name, backoff.timeout),
            |attempt, result, retry_in| {
                observe.registration(
                    &name,
                    generation,
                    result.as_ref().map(|_| ()).map_err(|e| e.to_string()),
                );
                match (result, retry_in) {
                    (Ok(()), _) => tracing::info!(resource = %name, endpoint = %endpoint, attempt, "registered with the kubelet"),
                    (Err(e), Some(delay)) if delay <= register::FAST_RETRY => tracing::debug!(resource = %name, attempt, retry_in = ?delay, "registration failed: {e}"),
                    (Err(e), Some(delay)) => tracing::warn!(resource = %name, attempt, retry_in = ?delay, "registration failed: {e}"),
                    (Err(e), None) => tracing::warn!(resource = %name, attempt, "registration failed: {e}"),
                }
            },
        )
        .await;
        match tokio::time::timeout(WATCH_WAIT, watch.open.wait_for(|n| *n > 0)).await {
            Ok(Ok(_)) => {}
            // The service is gone: the server stops.
            Ok(Err(_)) => return,
            Err(_) => {
                tracing::warn!(resource = %name, "the kubelet accepted the registration but did not watch the device list within {WATCH_WAIT:?}; registering again");
                continue;
            }
        }
        let kubelet = host.kubelet(&kubelet_sock);
        observe.watching(&name, generation, true);
        let resends = async {
            if watch.restarted {
                let mut since = Duration::ZERO;
                for at in RESEND_AFTER {
                    tokio::time::sleep(at.saturating_sub(since)).await;
                    since = at;
                    tracing::debug!(resource = %name, "sending the device list again after a restart");
                    watch.resend.send_modify(|n| *n = n.wrapping_add(1));
                }
            }
            std::future::pending::<()>().await
        };
        tokio::select! {
            closed = watch.open.wait_for(|n| *n == 0) => if closed.is_err() { return },
            () = resends => {}
        }
        if *watch.stopping.borrow() {
            return;
        }
        observe.watching(&name, generation, false);
        tokio::time::sleep(REWATCH_PAUSE).await;
        if *watch.stopping.borrow() {
            return;
        }
        if host.kubelet(&kubelet_sock) != kubelet {
            // The kubelet restarted or went away: `Servers` serves the next kubelet
            // with new servers, and stops this one.
            tracing::debug!(resource = %name, "the kubelet stopped watching the device list and kubelet.sock changed; waiting for the new servers");
            let _ = watch.stopping.wait_for(|s| *s).await;
            return;
        }
        tracing::warn!(resource = %name, "the kubelet stopped watching the device list while kubelet.sock stayed (it dropped the registration); registering again");
        // The kubelet may handle the end of this registration's stream late, too.
        watch.restarted = true;
    }
}

/// Stops a server. At once: its socket file is removed (so the kubelet cannot dial it again and
/// the directory shows it gone), its registration stops and its streams are told to end. The
/// returned future waits for the gRPC server to finish and every connection it accepted to be
/// dropped: after [`STOP_GRACE`] its connections are closed, after [`STOP_ABORT`] more it is
/// aborted (and the future ends).
fn stop_server(server: Server) -> impl Future<Output = ()> {
    let _ = server.stop.send(true);
    server.registrar.abort();
    match std::fs::remove_file(&server.path) {
        Ok(()) => tracing::debug!(socket = %server.path.display(), "removed"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(socket = %server.path.display(), "cannot remove socket: {e}"),
    }
    async move {
        let mut monitor = server.monitor;
        let ended = tokio::time::timeout(STOP_GRACE, &mut monitor).await.is_ok();
        // Streams that did not end (a client that does not read) and the connections of a
        // server that ended without them (aborted: its connection tasks live on) are closed.
        let _ = server.close.send(true);
        let finished = async {
            if !ended {
                let _ = monitor.await;
            }
            server.close.closed().await;
        };
        if tokio::time::timeout(STOP_ABORT, finished).await.is_err() {
            server.grpc.abort();
        }
    }
}

#[cfg(test)]
mod tests;
