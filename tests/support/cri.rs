//! An in-process stand-in for a container runtime's CRI API, over a real Unix domain socket:
//! `runtime.v1.RuntimeService/ListContainers` answers a given list of containers. Like a runtime
//! that ignores filters, it answers every container whatever the request asks (so the client's
//! own checks are tested), and it records the requests. `ListPodSandbox` answers a given list
//! of pod sandboxes the same way (empty unless [`CriStandin::set_sandboxes`]). Only these two
//! calls exist (the service of `proto/cri_runtime_v1.proto`).
#![allow(dead_code)] // each user takes a part

use std::io;
use std::sync::{Arc, Mutex};

use tonic::{Request, Response, Status};

use dxdp::kubelet::cri::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use dxdp::kubelet::cri::v1::{
    Container, ContainerMetadata, ContainerState, ListContainersRequest, ListContainersResponse,
    ListPodSandboxRequest, ListPodSandboxResponse, PodSandbox, PodSandboxMetadata, PodSandboxState,
};
use dxdp::kubelet::cri::{LABEL_CONTAINER, LABEL_NAMESPACE, LABEL_POD};
use dxdp::transport;
use dxdp::transport::Endpoint;

/// A container the kubelet created for `namespace/pod/name`, in `state`.
pub fn container(
    id: &str,
    state: ContainerState,
    namespace: &str,
    pod: &str,
    name: &str,
) -> Container {
    Container {
        id: id.into(),
        pod_sandbox_id: format!("sandbox-{pod}"),
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        state: state as i32,
        created_at: 1_714_644_000_000_000_000,
        labels: [
            (LABEL_NAMESPACE, namespace),
            (LABEL_POD, pod),
            (LABEL_CONTAINER, name),
            (
                "io.kubernetes.pod.uid",
                "0f8e2c3a-5b6d-4e7f-8a9b-0c1d2e3f4a5b",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    }
}

/// A ready pod sandbox of `namespace/pod` with `uid` and the pod's `labels` (the kubelet's
/// `io.kubernetes.pod.*` labels added, as the kubelet does).
pub fn sandbox(namespace: &str, pod: &str, uid: &str, labels: &[(&str, &str)]) -> PodSandbox {
    let mut all: std::collections::HashMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    all.insert(LABEL_NAMESPACE.into(), namespace.into());
    all.insert(LABEL_POD.into(), pod.into());
    all.insert("io.kubernetes.pod.uid".into(), uid.into());
    PodSandbox {
        id: format!("sandbox-{pod}"),
        metadata: Some(PodSandboxMetadata {
            name: pod.into(),
            uid: uid.into(),
            namespace: namespace.into(),
            attempt: 0,
        }),
        state: PodSandboxState::SandboxReady as i32,
        created_at: 1_714_644_000_000_000_000,
        labels: all,
    }
}

#[derive(Default)]
struct Shared {
    containers: Mutex<Vec<Container>>,
    requests: Mutex<Vec<ListContainersRequest>>,
    sandboxes: Mutex<Vec<PodSandbox>>,
    sandbox_requests: Mutex<Vec<ListPodSandboxRequest>>,
}

struct Service(Arc<Shared>);

#[tonic::async_trait]
impl RuntimeService for Service {
    async fn list_containers(
        &self,
        request: Request<ListContainersRequest>,
    ) -> Result<Response<ListContainersResponse>, Status> {
        self.0.requests.lock().unwrap().push(request.into_inner());
        Ok(Response::new(ListContainersResponse {
            containers: self.0.containers.lock().unwrap().clone(),
        }))
    }

    async fn list_pod_sandbox(
        &self,
        request: Request<ListPodSandboxRequest>,
    ) -> Result<Response<ListPodSandboxResponse>, Status> {
        self.0
            .sandbox_requests
            .lock()
            .unwrap()
            .push(request.into_inner());
        Ok(Response::new(ListPodSandboxResponse {
            items: self.0.sandboxes.lock().unwrap().clone(),
        }))
    }
}

/// The stand-in, serving until [`CriStandin::stop`].
pub struct CriStandin {
    endpoint: Endpoint,
    shared: Arc<Shared>,
    served: transport::Served,
}

impl CriStandin {
    /// Serves `containers` at `endpoint`: a socket file, or a named pipe on Windows.
    pub async fn start(endpoint: &Endpoint, containers: Vec<Container>) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            containers: Mutex::new(containers),
            requests: Mutex::default(),
            sandboxes: Mutex::default(),
            sandbox_requests: Mutex::default(),
        });
        let served = dxdp::kubelet::endpoint::serve(
            endpoint,
            tonic::transport::Server::builder()
                .add_service(RuntimeServiceServer::new(Service(shared.clone()))),
        )?;
        Ok(CriStandin {
            endpoint: endpoint.clone(),
            shared,
            served,
        })
    }

    /// Where it serves.
    pub fn endpoint(&self) -> Endpoint {
        self.endpoint.clone()
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<ListContainersRequest> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Answers `sandboxes` to `ListPodSandbox` from now on.
    pub fn set_sandboxes(&self, sandboxes: Vec<PodSandbox>) {
        *self.shared.sandboxes.lock().unwrap() = sandboxes;
    }

    /// The `ListPodSandbox` requests received so far.
    pub fn sandbox_requests(&self) -> Vec<ListPodSandboxRequest> {
        self.shared.sandbox_requests.lock().unwrap().clone()
    }

    /// Stops serving and removes the socket file (a named pipe goes with its last instance).
    pub async fn stop(mut self) {
        self.served.stop(None).await;
        if let Endpoint::Socket(path) = &self.endpoint {
            let _ = std::fs::remove_file(path);
        }
    }
}
