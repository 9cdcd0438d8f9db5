//! The `DevicePlugin` gRPC service for one resource.

use std::pin::Pin;
use std::time::Instant;

use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::inventory::InventoryRx;
use crate::kubelet::v1beta1::{
    self, device_plugin_server::DevicePlugin, AllocateRequest, AllocateResponse,
    ContainerAllocateResponse, ContainerPreferredAllocationResponse, DevicePluginOptions, Empty,
    ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse,
};
use crate::observe::metrics::AllocateRecorder;
use dxdp_core::allocation::{self, AllocationError};
use dxdp_core::devices::{Discovery, Resource};
use dxdp_core::preferred;
use dxdp_core::quote;

/// Serves one resource (under one of its names) from the shared inventory.
#[derive(Debug, Clone)]
pub struct ResourceService {
    resource: Resource,
    name: String,
    inventory: InventoryRx,
    stopping: watch::Receiver<bool>,
    allocations: AllocateRecorder,
}

impl ResourceService {
    /// A service for `resource` registered as `name`; streams end when `stopping` turns true;
    /// Allocate calls are counted and timed in `allocations`.
    pub fn new(
        resource: Resource,
        name: String,
        inventory: InventoryRx,
        stopping: watch::Receiver<bool>,
        allocations: AllocateRecorder,
    ) -> Self {
        ResourceService {
            resource,
            name,
            inventory,
            stopping,
            allocations,
        }
    }
}

/// The plugin's options: no PreStartContainer; preferred allocations.
pub fn options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// The full device list of `resource` as the kubelet receives it.
pub fn device_list(
    discovery: &Discovery,
    resource: Resource,
    replicas: u32,
) -> Vec<v1beta1::Device> {
    allocation::advertise(discovery, resource, replicas)
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
        let resource = self.resource;
        tracing::info!(resource = %self.name, "kubelet is watching the device list");
        let stream = async_stream::stream! {
            let mut last: Option<Vec<v1beta1::Device>> = None;
            loop {
                let list = {
                    let inv = inventory.borrow_and_update();
                    device_list(&inv.discovery, resource, inv.config.replicas(resource))
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
        let replicas = inventory.config.replicas(self.resource);
        let policy = inventory.config.policy(self.resource).allocation;
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| {
                let ids = preferred::preferred_allocation(
                    &inventory.discovery,
                    self.resource,
                    replicas,
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
    ) -> Result<Response<AllocateResponse>, Status> {
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
    /// Answers an Allocate request: the edits of every container, or the first refusal.
    fn allocate_all(&self, request: AllocateRequest) -> Result<AllocateResponse, Status> {
        let inventory = self.inventory.borrow().clone();
        let replicas = inventory.config.replicas(self.resource);
        let mut response = AllocateResponse::default();
        for container in request.container_requests {
            let edits = allocation::allocate(
                &inventory.discovery,
                self.resource,
                replicas,
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
                    AllocationError::MultiDevice(_) => Status::failed_precondition(e.to_string()),
                }
            })?;
            for note in &edits.notes {
                tracing::warn!(resource = %self.name, "{note}");
            }
            tracing::info!(
                resource = %self.name,
                ids = %quote::bounded(&container.devices_ids.join(",")),
                devices = ?edits.devices,
                mounts = edits.mounts.len(),
                "allocated"
            );
            response
                .container_responses
                .push(ContainerAllocateResponse {
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
                });
        }
        Ok(response)
    }
}
