//! The `DevicePlugin` gRPC service for one resource.
//!
//! Allocate is on the pod-start path: the answer for a request of one device ID (what the kubelet
//! sends for one GPU) is prepared per physical device once per inventory (when the kubelet is
//! sent a new device list, or by the first Allocate after a change), encoded then, and only
//! reference-counted per call ([`crate::plugin::answer`]).

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::inventory::{Inventory, InventoryRx};
use crate::kubelet::v1beta1::{
    self, AllocateRequest, ContainerAllocateResponse, ContainerPreferredAllocationResponse,
    DevicePluginOptions, Empty, ListAndWatchResponse, PreStartContainerRequest,
    PreStartContainerResponse, PreferredAllocationRequest, PreferredAllocationResponse,
};
use crate::observe::metrics::AllocateRecorder;
use crate::plugin::answer::{
    encode_container, server::device_plugin_server::DevicePlugin, AllocateAnswer,
};
use dxdp_core::allocation::{self, AllocationError};
use dxdp_core::devices::{Discovery, Resource};
use dxdp_core::pipeline::ids;
use dxdp_core::preferred;
use dxdp_core::quote;
use dxdp_core::sharing::Served;

/// Serves one resource (under one of its names) from the shared inventory.
#[derive(Debug, Clone)]
pub(crate) struct ResourceService {
    resource: Resource,
    name: String,
    inventory: InventoryRx,
    stopping: watch::Receiver<bool>,
    allocations: AllocateRecorder,
    prepared: Prepared,
    streams: Streams,
}

/// The `ListAndWatch` streams of one device-plugin server: how many are open (its registration
/// task watches it, to tell when the kubelet stopped watching), and a request to send the
/// current list again on each of them, changed or not.
#[derive(Debug, Clone)]
pub(crate) struct Streams {
    /// The number of open streams.
    pub(crate) open: Arc<watch::Sender<usize>>,
    /// Each change asks every open stream to send the current list again.
    pub(crate) resend: watch::Receiver<u64>,
}

impl Streams {
    /// No stream open yet; `resend` asks for the list again.
    pub(crate) fn new(resend: watch::Receiver<u64>) -> Self {
        Streams {
            open: Arc::new(watch::Sender::new(0)),
            resend,
        }
    }
}

/// Counts one open stream while it lives.
struct OpenStream(Arc<watch::Sender<usize>>);

impl OpenStream {
    fn new(open: Arc<watch::Sender<usize>>) -> Self {
        open.send_modify(|n| *n += 1);
        OpenStream(open)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// The Allocate answer of one physical device, as computed for one inventory.
#[derive(Debug)]
struct Answer {
    /// The device paths given (logged with each answer).
    devices: Arc<[String]>,
    /// How many files are mounted (logged with each answer).
    mounts: usize,
    /// The `ContainerAllocateResponse`, encoded.
    encoded: bytes::Bytes,
    /// What the core noted (logged with each answer).
    notes: Vec<String>,
}

/// The answers of every physical device of the resource for one inventory.
#[derive(Debug)]
struct Answers {
    /// The inventory they were computed from (compared by pointer).
    inventory: Arc<Inventory>,
    by_device: HashMap<String, Arc<Answer>>,
    /// A memory resource's answers for `n` units of one GPU (physical ID, `n`), each made by
    /// the first request for it: at most the GPUs' units in all.
    by_units: Mutex<HashMap<(String, usize), Arc<Answer>>>,
}

/// The answers for the latest inventory seen, shared by every clone of the service.
#[derive(Debug, Clone, Default)]
struct Prepared(Arc<Mutex<Option<Arc<Answers>>>>);

impl Prepared {
    /// The answers for `inventory`, computed now if they are for another one.
    fn for_inventory(
        &self,
        inventory: &Arc<Inventory>,
        resource: Resource,
        served: Served,
    ) -> Arc<Answers> {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(answers) = slot.as_ref() {
            if Arc::ptr_eq(&answers.inventory, inventory) {
                return answers.clone();
            }
        }
        let answers = Arc::new(prepare(inventory, resource, served));
        *slot = Some(answers.clone());
        answers
    }
}

/// Computes the answer of each physical device of `resource` served as `served` in
/// `inventory`: for one ID of the device (one replica, or one memory unit).
fn prepare(inventory: &Arc<Inventory>, resource: Resource, served: Served) -> Answers {
    let policy = inventory.config.policy(resource);
    let by_device = inventory
        .discovery
        .devices_for(resource)
        .filter(|d| served.shares(d.dedicated_memory_bytes) > 0)
        .filter_map(|d| {
            // Only answers that succeed are kept, so the name in errors does not matter here.
            let edits = allocation::allocate(
                &inventory.discovery,
                resource,
                resource.default_resource_name(),
                served,
                inventory.assignment,
                &policy,
                &[served.share_id(&d.id, 0)],
            )
            .ok()?;
            Some((d.id.clone(), Arc::new(answer_of(edits))))
        })
        .collect();
    Answers {
        inventory: inventory.clone(),
        by_device,
        by_units: Mutex::default(),
    }
}

/// A container's edits as a prepared answer.
fn answer_of(edits: allocation::ContainerEdits) -> Answer {
    let notes = edits.notes.clone();
    let response = container_response(edits);
    Answer {
        devices: response
            .devices
            .iter()
            .map(|d| d.host_path.clone())
            .collect(),
        mounts: response.mounts.len(),
        encoded: encode_container(&response),
        notes,
    }
}

/// The wire form of a container's edits.
fn container_response(edits: allocation::ContainerEdits) -> ContainerAllocateResponse {
    ContainerAllocateResponse {
        devices: edits
            .devices
            .into_iter()
            .map(|host_path| v1beta1::DeviceSpec {
                container_path: String::new(),
                host_path,
                permissions: String::new(),
            })
            .collect(),
        mounts: edits
            .mounts
            .into_iter()
            .map(|m| v1beta1::Mount {
                container_path: m.container_path,
                host_path: m.host_path,
                read_only: true,
            })
            .collect(),
        envs: edits.envs.into_iter().collect(),
        annotations: edits.annotations.into_iter().collect(),
        ..ContainerAllocateResponse::default()
    }
}

impl ResourceService {
    /// A service for `resource` registered as `name`; streams end when `stopping` turns true and
    /// are counted in `streams`; Allocate calls are counted and timed in `allocations`.
    pub(crate) fn new(
        resource: Resource,
        name: String,
        inventory: InventoryRx,
        (stopping, streams): (watch::Receiver<bool>, Streams),
        allocations: AllocateRecorder,
    ) -> Self {
        ResourceService {
            resource,
            name,
            inventory,
            stopping,
            streams,
            allocations,
            prepared: Prepared::default(),
        }
    }
}

/// The plugin's options: no PreStartContainer; preferred allocations.
pub(crate) fn options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// The full device list of `resource` served as `served` (a class's sharing, or a
/// [`Served`]) as the kubelet receives it.
pub fn device_list(
    discovery: &Discovery,
    resource: Resource,
    served: impl Into<Served>,
) -> Vec<v1beta1::Device> {
    allocation::advertise(discovery, resource, served)
        .into_iter()
        .map(|a| v1beta1::Device {
            id: a.id,
            health: a.health.as_str().to_string(),
            topology: None,
        })
        .collect()
}

type ListStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for ResourceService {
    async fn get_device_plugin_options(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = ListStream;

    async fn list_and_watch(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let mut inventory = self.inventory.clone();
        let mut stopping = self.stopping.clone();
        let mut resend = self.streams.resend.clone();
        resend.mark_unchanged();
        let open = OpenStream::new(self.streams.open.clone());
        let resource = self.resource;
        let name = self.name.clone();
        let prepared = self.prepared.clone();
        tracing::info!(resource = %self.name, "kubelet is watching the device list");
        let stream = async_stream::stream! {
            let _open = open;
            let mut resend_alive = true;
            let mut last: Option<Vec<v1beta1::Device>> = None;
            loop {
                let list = {
                    let inv = inventory.borrow_and_update().clone();
                    let served = crate::inventory::served(&inv.config, resource, &name);
                    // The kubelet may allocate from this list at once: have the answers ready.
                    prepared.for_inventory(&inv, resource, served);
                    device_list(&inv.discovery, resource, served)
                };
                if last.as_ref() != Some(&list) {
                    tracing::debug!(resource = resource.as_str(), devices = list.len(), "sending device list");
                    yield Ok(ListAndWatchResponse { devices: list.clone() });
                    last = Some(list);
                }
                if *stopping.borrow() {
                    break;
                }
                tokio::select! {
                    changed = inventory.changed() => if changed.is_err() { break },
                    _ = stopping.changed() => break,
                    // The same list again: the kubelet may have marked the resource unhealthy
                    // since it last received it (see `servers`).
                    again = resend.changed(), if resend_alive => match again {
                        Ok(()) => last = None,
                        Err(_) => resend_alive = false,
                    },
                }
            }
        };
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let inventory = self.inventory.borrow().clone();
        let served = crate::inventory::served(&inventory.config, self.resource, &self.name);
        let policy = inventory.config.policy(self.resource).allocation;
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| {
                let ids = preferred::preferred_allocation(
                    &inventory.discovery,
                    self.resource,
                    served,
                    policy,
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    c.allocation_size,
                );
                tracing::debug!(
                    resource = %self.name,
                    policy = policy.as_str(),
                    available = c.available_device_i_ds.len(),
                    must_include = %quote::bounded(&c.must_include_device_i_ds.join(",")),
                    size = c.allocation_size,
                    preferred = %quote::bounded(&ids.join(",")),
                    "preferred allocation"
                );
                ContainerPreferredAllocationResponse { device_i_ds: ids }
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateAnswer>, Status> {
        let started = Instant::now();
        let result = self.allocate_all(request.into_inner());
        self.allocations.record(result.is_ok(), started.elapsed());
        result.map(Response::new)
    }

    async fn pre_start_container(
        &self,
        _request: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

impl ResourceService {
    /// Answers an Allocate request: the edits of every container, or the first refusal. The
    /// allocation is logged once the whole request is answered: a refused request logs no
    /// container as allocated.
    fn allocate_all(&self, request: AllocateRequest) -> Result<AllocateAnswer, Status> {
        let inventory = self.inventory.borrow().clone();
        let served = crate::inventory::served(&inventory.config, self.resource, &self.name);
        let answers = self
            .prepared
            .for_inventory(&inventory, self.resource, served);
        let mut response = AllocateAnswer::default();
        // What to log once the request is answered (nothing is kept when the line is off).
        let log = tracing::enabled!(tracing::Level::INFO);
        let mut allocated = Vec::new();
        for container in request.container_requests {
            if let Some(answer) = self.prepared_answer(&answers, served, &container.devices_ids) {
                for note in &answer.notes {
                    tracing::warn!(resource = %self.name, "{note}");
                }
                if log {
                    allocated.push((container.devices_ids, answer.devices.clone(), answer.mounts));
                }
                response.container_responses.push(answer.encoded.clone());
                continue;
            }
            let edits = allocation::allocate(
                &inventory.discovery,
                self.resource,
                &self.name,
                served,
                inventory.assignment,
                &inventory.config.policy(self.resource),
                &container.devices_ids,
            )
            .map_err(|e| {
                tracing::warn!(resource = %self.name, "Allocate refused: {e}");
                match e {
                    AllocationError::Empty
                    | AllocationError::Malformed(_)
                    | AllocationError::Unknown { .. } => Status::invalid_argument(e.to_string()),
                    AllocationError::MultiDevice(_) | AllocationError::SpansGpus(_) => {
                        Status::failed_precondition(e.to_string())
                    }
                }
            })?;
            for note in &edits.notes {
                tracing::warn!(resource = %self.name, "{note}");
            }
            if log {
                let (devices, mounts) = (Arc::from(edits.devices.clone()), edits.mounts.len());
                allocated.push((container.devices_ids, devices, mounts));
            }
            response
                .container_responses
                .push(encode_container(&container_response(edits)));
        }
        for (ids, devices, mounts) in allocated {
            self.log_allocated(ids, devices, mounts);
        }
        Ok(response)
    }

    /// Logs one container's allocation (the line operators audit) on the log writer's thread:
    /// formatting it costs more than the rest of a prepared answer.
    fn log_allocated(&self, ids: Vec<String>, devices: Arc<[String]>, mounts: usize) {
        if !tracing::enabled!(tracing::Level::INFO) {
            return;
        }
        let name = self.name.clone();
        crate::logging::deferred(move || {
            tracing::info!(
                resource = %name,
                ids = %quote::bounded(&ids.join(",")),
                devices = ?devices,
                mounts,
                "allocated"
            );
        });
    }

    /// The prepared answer for a request of exactly one valid, advertised ID (the answer then
    /// depends only on its physical device), or of a memory resource's units of one GPU (the
    /// answer then depends only on the GPU and the number of units); `None` sends the request
    /// the long way.
    fn prepared_answer(
        &self,
        answers: &Answers,
        served: Served,
        ids_requested: &[String],
    ) -> Option<Arc<Answer>> {
        let discovery = &answers.inventory.discovery;
        if let [id] = ids_requested {
            if !ids::is_valid_kubelet_id(id) {
                return None;
            }
            let device = allocation::resolve(discovery, self.resource, served, id)?;
            return answers.by_device.get(&device.id).cloned();
        }
        served.memory()?;
        let mut gpu: Option<&str> = None;
        let mut distinct: HashSet<&str> = HashSet::with_capacity(ids_requested.len());
        for id in ids_requested {
            if !ids::is_valid_kubelet_id(id) {
                return None;
            }
            let device = allocation::resolve(discovery, self.resource, served, id)?;
            if *gpu.get_or_insert(device.id.as_str()) != device.id {
                return None;
            }
            distinct.insert(id);
        }
        let key = (gpu?.to_string(), distinct.len());
        let mut by_units = answers.by_units.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(answer) = by_units.get(&key) {
            return Some(answer.clone());
        }
        let edits = allocation::allocate(
            discovery,
            self.resource,
            &self.name,
            served,
            answers.inventory.assignment,
            &answers.inventory.config.policy(self.resource),
            ids_requested,
        )
        .ok()?;
        let answer = Arc::new(answer_of(edits));
        by_units.insert(key, answer.clone());
        Some(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::observe::metrics::Metrics;
    use dxdp_core::facts::HostFacts;
    use dxdp_core::pipeline::ids::device_id;

    const A: &str = "PCIROOT(0)#PCI(0100)#PCI(0000)";
    const B: &str = "PCIROOT(0)#PCI(0200)#PCI(0000)";
    const MOVED: &str = "PCIROOT(0)#PCI(0300)#PCI(0000)";

    fn inventory(facts: &HostFacts) -> Arc<Inventory> {
        Arc::new(crate::inventory::build(facts, Arc::new(Config::default())).0)
    }

    fn request(id: &str) -> AllocateRequest {
        AllocateRequest {
            container_requests: vec![v1beta1::ContainerAllocateRequest {
                devices_ids: vec![id.to_string()],
            }],
        }
    }

    /// The display resource's service on `inventory`, and what stops it.
    fn display_service(inventory: InventoryRx) -> (ResourceService, watch::Sender<bool>) {
        let (stop, stopping) = watch::channel(false);
        let service = ResourceService::new(
            Resource::Display,
            "directx.microsoft.com/display".into(),
            inventory,
            (stopping, Streams::new(watch::channel(0).1)),
            Metrics::new().allocate_recorder("directx.microsoft.com/display"),
        );
        (service, stop)
    }

    fn device_of(service: &ResourceService, id: &str) -> Result<String, tonic::Code> {
        service
            .allocate_all(request(id))
            .map(|r| {
                r.decoded().unwrap().container_responses[0].devices[0]
                    .host_path
                    .clone()
            })
            .map_err(|s| s.code())
    }

    /// Issue 42: a request refused for one of its containers logs no container as allocated;
    /// an answered one logs each container once.
    #[test]
    fn allocate_is_logged_once_it_is_answered() {
        use std::sync::Mutex;
        let facts = dxdp_core::sample::sample_host().unwrap();
        let (_tx, rx) = watch::channel(inventory(&facts));
        let (service, _stop) = display_service(rx);
        let two = |first: &str, second: &str| AllocateRequest {
            container_requests: [first, second]
                .iter()
                .map(|id| v1beta1::ContainerAllocateRequest {
                    devices_ids: vec![id.to_string()],
                })
                .collect(),
        };
        let log = Arc::new(Mutex::new(Vec::<u8>::new()));
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || LogLine(writer.clone()))
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let refused = service.allocate_all(two(&device_id(A), &device_id(MOVED)));
            assert_eq!(
                refused.map(|_| ()).map_err(|s| s.code()),
                Err(tonic::Code::InvalidArgument)
            );
            let text = String::from_utf8(log.lock().unwrap().clone()).unwrap();
            assert!(text.contains("Allocate refused"), "{text}");
            assert!(!text.contains("allocated"), "{text}");
            service
                .allocate_all(two(&device_id(A), &device_id(B)))
                .unwrap();
        });
        let text = String::from_utf8(log.lock().unwrap().clone()).unwrap();
        assert_eq!(text.matches(" allocated").count(), 2, "{text}");
    }

    /// A log sink for one test.
    struct LogLine(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for LogLine {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Issue 46: 8 GPUs of 80 GiB in 256 MiB units are 2,560 IDs, and their ListAndWatch
    /// message stays well under the kubelet's 4 MiB limit on received messages. Each entry is at
    /// most 79 bytes on the wire: an ID of at most 63 bytes and a health of at most 9
    /// (`Unhealthy`), each with a tag and a one-byte length (4), and the entry's own tag and
    /// length of at most 3. So at most 2,560 x 79 = 202,240 bytes, under 5 % of 4 MiB.
    #[test]
    fn a_memory_device_list_at_8_gpus_of_80_gib_is_well_under_4_mib() {
        use dxdp_core::sharing::{MemorySharing, Sharing};
        use prost::Message;
        let facts = dxdp_core::sample::sample_host().unwrap();
        let sample = dxdp_core::pipeline::discover(&facts, &Default::default());
        let template = sample
            .devices_for(Resource::Compute)
            .next()
            .unwrap()
            .clone();
        let mut discovery = Discovery::default();
        for i in 0..8 {
            let mut d = template.clone();
            d.location_path = format!("PCIROOT(0)#PCI({:02X}00)#PCI(0000)", i + 1);
            d.id = device_id(&d.location_path);
            d.dedicated_memory_bytes = 80 << 30;
            discovery.devices.push(d);
        }
        let memory = Sharing::Memory(MemorySharing {
            unit_bytes: 256 << 20,
            reserve_bytes: 0,
        });
        let devices = device_list(&discovery, Resource::Compute, memory);
        assert_eq!(devices.len(), 2_560);
        let encoded = ListAndWatchResponse { devices }.encoded_len();
        assert!(encoded <= 202_240, "{encoded} bytes");
        assert!(encoded < (4 << 20) / 20, "{encoded} bytes");
        // Exactly: an ID is 44 characters, `-m` and 1 to 3 digits; an entry is the ID and
        // `Healthy` (7) with 6 bytes of tags and lengths. Per GPU 10 entries of 60 bytes, 90 of
        // 61 and 220 of 62: 19,730 bytes; 157,840 for 8 GPUs, 3.8 % of 4 MiB.
        assert_eq!(
            encoded,
            8 * (10 * 60 + 90 * 61 + 220 * 62),
            "{encoded} bytes"
        );
    }

    #[test]
    fn prepared_answers_follow_the_inventory() {
        let facts = dxdp_core::sample::sample_host().unwrap();
        let (tx, rx) = watch::channel(inventory(&facts));
        let (service, _stop) = display_service(rx);
        let path = |p: &str| Ok(format!("vpci-location-path://{p}"));
        // Twice each: the second answer comes from the prepared ones.
        for _ in 0..2 {
            assert_eq!(device_of(&service, &device_id(A)), path(A));
            assert_eq!(device_of(&service, &device_id(B)), path(B));
            assert_eq!(
                device_of(&service, &device_id(MOVED)),
                Err(tonic::Code::InvalidArgument)
            );
        }
        // The first display adapter moves to another slot: its old ID is gone, the new one is
        // answered with the new path.
        let mut moved = facts.clone();
        let pnp = moved
            .adapters
            .iter_mut()
            .filter_map(|a| a.pnp.as_mut())
            .find(|p| p.location_paths.first().map(String::as_str) == Some(A))
            .expect("the adapter at A");
        pnp.location_paths[0] = MOVED.to_string();
        tx.send_replace(inventory(&moved));
        for _ in 0..2 {
            assert_eq!(
                device_of(&service, &device_id(A)),
                Err(tonic::Code::InvalidArgument)
            );
            assert_eq!(device_of(&service, &device_id(MOVED)), path(MOVED));
            assert_eq!(device_of(&service, &device_id(B)), path(B));
        }
    }
}
