//! An in-process kubelet stand-in: the `Registration` service on `kubelet.sock`, which dials each
//! registering plugin back, asks for its options and watches its device list, as the kubelet does.
//!
//! `dxdp demo` uses it to show the plugin working without a cluster, and the integration tests
//! use it to speak the real protocol over real sockets.
//!
//! Like the kubelet (`PluginDisconnected` in its device manager, keyed by the resource name), it
//! holds every device of a resource unhealthy when the `ListAndWatch` stream of a registration
//! that a newer one replaced ends, until the next `ListAndWatch` message for the resource
//! ([`PluginView::held_unhealthy`], [`StandinView::allocatable`]).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::v1beta1::device_plugin_client::DevicePluginClient;
use super::v1beta1::registration_server::{Registration, RegistrationServer};
use super::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateRequest,
    ContainerPreferredAllocationRequest, Device, Empty, PreferredAllocationRequest,
    RegisterRequest,
};
use super::{API_VERSION, KUBELET_SOCKET};
use crate::transport::{self, Transport};
use dxdp_core::devices::HealthState;

/// What the stand-in knows about one registered resource.
#[derive(Debug, Clone)]
pub struct PluginView {
    /// The plugin's socket file name.
    pub endpoint: String,
    /// Its registration: an index into [`StandinView::registrations`].
    pub(crate) registration: usize,
    /// The latest device list, once one arrived.
    pub devices: Option<Vec<Device>>,
    /// How many ListAndWatch messages arrived.
    pub updates: usize,
    /// The number of devices in every ListAndWatch message, in order of arrival.
    pub list_sizes: Vec<usize>,
    /// Whether the ListAndWatch stream is still open.
    pub connected: bool,
    /// Whether every device of the resource is held unhealthy, as the kubelet holds them after
    /// the stream of a replaced registration ended (`PluginDisconnected`), until the next
    /// ListAndWatch message.
    pub held_unhealthy: bool,
}

/// The end of a registration's ListAndWatch stream (its end of stream or its error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamEnd {
    /// The registration's resource name.
    pub resource_name: String,
    /// The registration's socket file name.
    pub endpoint: String,
    /// The registration: an index into [`StandinView::registrations`].
    pub registration: usize,
    /// Whether a newer registration of the resource had replaced it (then the resource's
    /// devices were held unhealthy).
    pub replaced: bool,
    /// How many registrations had been accepted when it ended.
    pub registrations: usize,
}

/// Everything the stand-in has seen.
#[derive(Debug, Clone, Default)]
pub struct StandinView {
    /// Every accepted Register request, in order.
    pub registrations: Vec<RegisterRequest>,
    /// Every refused Register request, in order.
    pub refused: Vec<RegisterRequest>,
    /// The current plugin of each resource name.
    pub plugins: BTreeMap<String, PluginView>,
    /// Every ListAndWatch stream that ended, in order.
    pub stream_ends: Vec<StreamEnd>,
}

impl StandinView {
    /// The latest device list of `resource_name`.
    pub fn devices(&self, resource_name: &str) -> Option<&[Device]> {
        self.plugins.get(resource_name)?.devices.as_deref()
    }

    /// The devices of `resource_name` the kubelet would allocate (the node's allocatable count):
    /// the healthy devices of the latest list, none while the resource is held unhealthy.
    pub fn allocatable(&self, resource_name: &str) -> usize {
        match self.plugins.get(resource_name) {
            Some(p) if !p.held_unhealthy => p
                .devices
                .iter()
                .flatten()
                .filter(|d| d.health == HealthState::Healthy.as_str())
                .count(),
            _ => 0,
        }
    }
}

struct Shared {
    view: StandinView,
    clients: BTreeMap<String, DevicePluginClient<Channel>>,
    /// The task reading each registration's ListAndWatch stream.
    watchers: Vec<JoinHandle<()>>,
    /// The reader of each registration's stream, by registration.
    readers: BTreeMap<usize, tokio::task::AbortHandle>,
    refuse: Option<String>,
    /// How the end of a replaced registration's stream is handled.
    disconnects: Disconnects,
    /// Bumped on every change of the view, so that waiting needs no polling.
    changed: watch::Sender<()>,
}

/// How the stand-in handles the end of a replaced registration's `ListAndWatch` stream, the
/// kubelet's `PluginDisconnected` (keyed by the resource name, so it concerns the newest
/// registration of the name).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Disconnects {
    /// How long after the stream ended the kubelet handles it (its goroutine may run late).
    pub(crate) late: Duration,
    /// Whether it also closes the newest registration's stream and forgets its client, as a
    /// kubelet does whose handler disconnects the current client of the name.
    pub(crate) drop_newest: bool,
}

impl Shared {
    fn touch(&self) {
        self.changed.send_replace(());
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A running kubelet stand-in.
pub struct KubeletStandin {
    dir: PathBuf,
    shared: Arc<Mutex<Shared>>,
    served: transport::Served,
}

struct RegistrationService {
    dir: PathBuf,
    transport: Transport,
    shared: Arc<Mutex<Shared>>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let req = request.into_inner();
        let refusal = lock(&self.shared).refuse.clone();
        if let Some(reason) = refusal {
            let mut shared = lock(&self.shared);
            shared.view.refused.push(req);
            shared.touch();
            return Err(Status::unavailable(reason));
        }
        if req.version != API_VERSION {
            return Err(Status::invalid_argument(format!(
                "requested API version {:?} is not supported by kubelet",
                req.version
            )));
        }
        if req.endpoint.is_empty() || req.endpoint.contains(['/', '\\']) {
            return Err(Status::invalid_argument(format!(
                "endpoint {:?} must be a file name in the device plugin directory",
                req.endpoint
            )));
        }
        let path = self.dir.join(&req.endpoint);
        let channel = self.transport.channel(&path).await.map_err(|e| {
            Status::unavailable(format!("cannot dial plugin at {}: {e}", path.display()))
        })?;
        let mut client = DevicePluginClient::new(channel);
        // Asked for, as the kubelet does; nothing here depends on them.
        client.get_device_plugin_options(Empty {}).await?;
        let mut stream = client.list_and_watch(Empty {}).await?.into_inner();
        let resource = req.resource_name.clone();
        let endpoint = req.endpoint.clone();
        let mut shared = lock(&self.shared);
        let registration = shared.view.registrations.len();
        shared.clients.insert(resource.clone(), client);
        shared.view.plugins.insert(
            resource.clone(),
            PluginView {
                endpoint: endpoint.clone(),
                registration,
                devices: None,
                updates: 0,
                list_sizes: Vec::new(),
                connected: true,
                held_unhealthy: false,
            },
        );
        shared.view.registrations.push(req);
        shared.touch();
        let reader = self.shared.clone();
        // Spawned under the lock, so that `stop` finds it.
        let watcher = tokio::spawn(async move {
            loop {
                let message = stream.message().await;
                if !matches!(message, Ok(Some(_))) {
                    let late = lock(&reader).disconnects.late;
                    if !late.is_zero() {
                        tokio::time::sleep(late).await;
                    }
                }
                let mut guard = lock(&reader);
                let drop_newest = guard.disconnects.drop_newest;
                let shared = &mut *guard;
                let view = &mut shared.view;
                let newest = view
                    .plugins
                    .get_mut(&resource)
                    .filter(|p| p.registration == registration);
                match (message, newest) {
                    (Ok(Some(list)), Some(plugin)) => {
                        plugin.list_sizes.push(list.devices.len());
                        plugin.devices = Some(list.devices);
                        plugin.updates += 1;
                        plugin.held_unhealthy = false;
                    }
                    // A replaced registration's list: the view shows the newest one's.
                    (Ok(Some(_)), None) => continue,
                    (_, newest) => {
                        let replaced = newest.is_none();
                        match newest {
                            Some(plugin) => plugin.connected = false,
                            // The kubelet's PluginDisconnected: every device of the resource.
                            None => {
                                if let Some(plugin) = view.plugins.get_mut(&resource) {
                                    plugin.held_unhealthy = true;
                                    if drop_newest {
                                        plugin.connected = false;
                                        let newest = plugin.registration;
                                        if let Some(reader) = shared.readers.remove(&newest) {
                                            reader.abort();
                                        }
                                        shared.clients.remove(&resource);
                                    }
                                }
                            }
                        }
                        let registrations = view.registrations.len();
                        view.stream_ends.push(StreamEnd {
                            resource_name: resource,
                            endpoint,
                            registration,
                            replaced,
                            registrations,
                        });
                        guard.touch();
                        return;
                    }
                }
                guard.touch();
            }
        });
        shared.watchers.retain(|w| !w.is_finished());
        shared.readers.insert(registration, watcher.abort_handle());
        shared.watchers.push(watcher);
        Ok(Response::new(Empty {}))
    }
}

impl KubeletStandin {
    /// Starts serving `Registration` on `<dir>/kubelet.sock` (replacing a stale file), over
    /// `transport` (which it also dials plugins with).
    pub async fn start(transport: Transport, dir: &Path) -> io::Result<Self> {
        Self::start_refusing(transport, dir, None).await
    }

    /// [`KubeletStandin::start`], refusing every `Register` with `refuse` from the first one
    /// on (until `refuse_registrations`, a test-support switch, changes it).
    pub async fn start_refusing(
        transport: Transport,
        dir: &Path,
        refuse: Option<&str>,
    ) -> io::Result<Self> {
        let socket = dir.join(KUBELET_SOCKET);
        transport::check_socket_path(&socket).map_err(io::Error::other)?;
        let _ = std::fs::remove_file(&socket);
        let listener = transport.bind(&socket)?;
        let shared = Arc::new(Mutex::new(Shared {
            view: StandinView::default(),
            clients: BTreeMap::new(),
            watchers: Vec::new(),
            readers: BTreeMap::new(),
            disconnects: Disconnects::default(),
            refuse: refuse.map(str::to_string),
            changed: watch::Sender::new(()),
        }));
        let service = RegistrationService {
            dir: dir.to_path_buf(),
            transport,
            shared: shared.clone(),
        };
        let served = transport::Served::spawn(
            listener,
            tonic::transport::Server::builder().add_service(RegistrationServer::new(service)),
        );
        Ok(KubeletStandin {
            dir: dir.to_path_buf(),
            shared,
            served,
        })
    }

    /// The path of `kubelet.sock`.
    pub fn socket_path(&self) -> PathBuf {
        self.dir.join(KUBELET_SOCKET)
    }

    /// Handles the ends of replaced registrations' streams as `disconnects` says from now on.
    #[cfg(test)]
    pub(crate) fn set_disconnects(&self, disconnects: Disconnects) {
        lock(&self.shared).disconnects = disconnects;
    }

    /// Makes `Register` fail with `reason` (or accept again with `None`).
    #[cfg(any(test, feature = "test-support"))]
    pub fn refuse_registrations(&self, reason: Option<&str>) {
        lock(&self.shared).refuse = reason.map(str::to_string);
    }

    /// A copy of what the stand-in has seen.
    pub fn view(&self) -> StandinView {
        lock(&self.shared).view.clone()
    }

    /// Waits until `done` holds for the view, or `timeout` passes; returns whether it held.
    /// Wakes on every change of the view (no polling).
    pub async fn wait_for(&self, timeout: Duration, done: impl Fn(&StandinView) -> bool) -> bool {
        let mut changes = lock(&self.shared).changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            changes.borrow_and_update();
            if done(&self.view()) {
                return true;
            }
            tokio::select! {
                r = changes.changed() => if r.is_err() { return done(&self.view()) },
                _ = tokio::time::sleep_until(deadline) => return done(&self.view()),
            }
        }
    }

    /// The client of the plugin registered for `resource_name`.
    pub fn client(&self, resource_name: &str) -> Option<DevicePluginClient<Channel>> {
        lock(&self.shared).clients.get(resource_name).cloned()
    }

    /// Calls `Allocate` for one container, as the kubelet does at admission.
    pub async fn allocate(
        &self,
        resource_name: &str,
        ids: &[String],
    ) -> Result<AllocateResponse, Status> {
        let mut client = self.client(resource_name).ok_or_else(|| {
            Status::not_found(format!("no plugin registered for {resource_name}"))
        })?;
        let request = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids.to_vec(),
            }],
        };
        Ok(client.allocate(request).await?.into_inner())
    }

    /// Calls `GetPreferredAllocation` for one container and returns the preferred IDs, as the
    /// kubelet does before `Allocate` when the plugin offers it.
    pub async fn preferred_allocation(
        &self,
        resource_name: &str,
        available: &[String],
        must_include: &[String],
        size: i32,
    ) -> Result<Vec<String>, Status> {
        let mut client = self.client(resource_name).ok_or_else(|| {
            Status::not_found(format!("no plugin registered for {resource_name}"))
        })?;
        let request = PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available.to_vec(),
                must_include_device_i_ds: must_include.to_vec(),
                allocation_size: size,
            }],
        };
        let response = client.get_preferred_allocation(request).await?.into_inner();
        Ok(response
            .container_responses
            .into_iter()
            .next()
            .map(|c| c.device_i_ds)
            .unwrap_or_default())
    }

    /// Stops serving and removes `kubelet.sock`, as a stopping kubelet does, and drops its
    /// connections to the plugins, as the kubelet's process ending closes them.
    pub async fn stop(mut self) {
        self.served.stop(Some(Duration::from_secs(2))).await;
        let watchers = {
            let mut shared = lock(&self.shared);
            shared.clients.clear();
            std::mem::take(&mut shared.watchers)
        };
        for watcher in watchers {
            watcher.abort();
            // Aborted, it ends at its next poll; the bound only guards against a stuck runtime.
            let _ = tokio::time::timeout(Duration::from_secs(2), watcher).await;
        }
        let _ = std::fs::remove_file(self.socket_path());
    }
}
