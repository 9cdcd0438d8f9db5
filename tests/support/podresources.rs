//! A kubelet stand-in serving the PodResources API's `List` on a socket file or a named pipe,
//! as the kubelet does on each OS (tests only: the product reads PodResources, never serves it).
//! Declared once in the test executables that need it (`tests/<name>/main.rs`).

#![allow(dead_code)]

use std::io;
use std::sync::{Arc, Mutex};

use tonic::{Request, Response, Status};

use dxdp::kubelet::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use dxdp::kubelet::v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, GetPodResourcesRequest,
    GetPodResourcesResponse, ListPodResourcesRequest, ListPodResourcesResponse,
};
use dxdp::transport;
use dxdp::transport::Endpoint;
use dxdp_core::telemetry::PodAllocation;

type Answer = Arc<Mutex<Vec<PodAllocation>>>;

struct Lister {
    answer: Answer,
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _request: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        let allocations = self
            .answer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Ok(Response::new(dxdp::kubelet::podresources::answer(
            &allocations,
        )))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("the stand-in serves List only"))
    }

    async fn get(
        &self,
        _request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("the stand-in serves List only"))
    }
}

/// A kubelet stand-in serving PodResources `List` on a socket file or a named pipe.
pub struct PodResourcesStandin {
    endpoint: Endpoint,
    answer: Answer,
    served: transport::Served,
}

impl PodResourcesStandin {
    /// Serves `allocations` at `endpoint`: a socket file (replacing a stale one) or a named
    /// pipe.
    pub async fn start(endpoint: &Endpoint, allocations: Vec<PodAllocation>) -> io::Result<Self> {
        let answer: Answer = Arc::new(Mutex::new(allocations));
        let service = Lister {
            answer: answer.clone(),
        };
        let served = dxdp::kubelet::endpoint::serve(
            endpoint,
            tonic::transport::Server::builder().add_service(PodResourcesListerServer::new(service)),
        )?;
        Ok(PodResourcesStandin {
            endpoint: endpoint.clone(),
            answer,
            served,
        })
    }

    /// Where it serves.
    pub fn endpoint(&self) -> Endpoint {
        self.endpoint.clone()
    }

    /// Answers `allocations` from now on.
    pub fn set(&self, allocations: Vec<PodAllocation>) {
        *self.answer.lock().unwrap_or_else(|p| p.into_inner()) = allocations;
    }

    /// Stops serving and removes the socket file (a named pipe goes with its last instance).
    pub async fn stop(mut self) {
        self.served.stop(None).await;
        if let Endpoint::Socket(path) = &self.endpoint {
            let _ = std::fs::remove_file(path);
        }
    }
}
