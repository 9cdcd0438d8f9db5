//! The container runtime's CRI API v1 (the API the kubelet itself uses), for one question: which
//! pod container is each running container? `RuntimeService/ListContainers` with the state
//! `CONTAINER_RUNNING` answers with every container's ID and the labels the kubelet set when it
//! created it (`io.kubernetes.pod.namespace`, `io.kubernetes.pod.name`,
//! `io.kubernetes.container.name`). Under containerd with hcsshim a process-isolated container's
//! ID is also the ID of its HCS compute system, which lists its processes.
//!
//! For `dxdp_pod_info` (opt-in), `RuntimeService/ListPodSandbox` answers each ready pod
//! sandbox's pod (namespace, name, UID) and the pod's labels, which the kubelet copies onto the
//! sandbox (`list_sandboxes`, pure part `sandboxes`).
//!
//! The calls are local (a socket or named pipe on the node), needs no API server and no RBAC.
//! [`list_pods`] calls it once, with a timeout; `pods` is the pure part, tested with recorded
//! answers. The generated types are in [`v1`] (from `proto/cri_runtime_v1.proto`, the subset of
//! the published `k8s.io/cri-api` `runtime/v1/api.proto` that dxdp uses).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use dxdp_core::telemetry::PodRef;

use super::endpoint::connect;
use crate::transport::Endpoint;
use crate::util::errors::chain;

/// The CRI runtime API v1, generated from `proto/cri_runtime_v1.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("runtime.v1");
}

use v1::runtime_service_client::RuntimeServiceClient;
use v1::{
    ContainerFilter, ContainerState, ContainerStateValue, ListContainersRequest,
    ListContainersResponse, ListPodSandboxRequest, ListPodSandboxResponse, PodSandboxFilter,
    PodSandboxState, PodSandboxStateValue,
};

/// containerd's CRI endpoint on Windows (`npipe:////./pipe/containerd-containerd`).
pub(crate) const WINDOWS_PIPE: &str = r"\\.\pipe\containerd-containerd";
/// containerd's CRI endpoint on Linux (`unix:///run/containerd/containerd.sock`).
pub(crate) const LINUX_SOCKET: &str = "/run/containerd/containerd.sock";

/// The kubelet's label with the pod's namespace.
pub const LABEL_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// The kubelet's label with the pod's name.
pub const LABEL_POD: &str = "io.kubernetes.pod.name";
/// The kubelet's label with the container's name in the pod spec.
pub const LABEL_CONTAINER: &str = "io.kubernetes.container.name";

/// The kubelet's label with the pod's UID.
pub(crate) const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";

/// The most bytes of a `ListContainers` answer accepted (a node with hundreds of containers stays
/// far below).
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// containerd's endpoint on this OS.
pub(crate) fn default_endpoint() -> Endpoint {
    if cfg!(windows) {
        Endpoint::Pipe(WINDOWS_PIPE.to_string())
    } else {
        Endpoint::Socket(LINUX_SOCKET.into())
    }
}

/// Why `ListContainers` gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// No connection.
    #[error("cannot connect to the container runtime's CRI API at {endpoint}: {error} (is containerd running, and is telemetry.criEndpoint its socket or pipe? dxdp must be allowed to open it: on Windows it runs as SYSTEM in a HostProcess container, which may)")]
    Connect {
        /// Where.
        endpoint: String,
        /// Why.
        error: String,
    },
    /// The call failed.
    #[error("the container runtime's CRI {call} call at {endpoint} failed: {error}{hint}")]
    Call {
        /// Which call.
        call: &'static str,
        /// Where.
        endpoint: String,
        /// Why.
        error: String,
        /// What to do, when known.
        hint: &'static str,
    },
    /// No answer in time.
    #[error("the container runtime's CRI API at {endpoint} did not answer within {timeout:?}")]
    Timeout {
        /// Where.
        endpoint: String,
        /// How long dxdp waited.
        timeout: Duration,
    },
}

/// The request dxdp sends: the running containers.
pub(crate) fn request() -> ListContainersRequest {
    ListContainersRequest {
        filter: Some(ContainerFilter {
            state: Some(ContainerStateValue {
                state: ContainerState::ContainerRunning as i32,
            }),
            ..ContainerFilter::default()
        }),
    }
}

/// The pod container of every running container in `answer`, by container ID. A container that
/// is not running (a runtime may ignore the filter) or lacks one of the kubelet's labels (not
/// created by the kubelet) is left out.
pub(crate) fn pods(answer: &ListContainersResponse) -> HashMap<String, PodRef> {
    let mut out = HashMap::with_capacity(answer.containers.len());
    for c in &answer.containers {
        if c.state != ContainerState::ContainerRunning as i32 || c.id.is_empty() {
            continue;
        }
        let label = |k: &str| c.labels.get(k).filter(|v| !v.is_empty()).cloned();
        let (Some(namespace), Some(pod), Some(container)) = (
            label(LABEL_NAMESPACE),
            label(LABEL_POD),
            label(LABEL_CONTAINER),
        ) else {
            continue;
        };
        out.insert(
            c.id.clone(),
            PodRef {
                namespace,
                pod,
                container,
            },
        );
    }
    out
}

/// Calls `ListContainers` at `endpoint` and returns the pod container of every running container
/// the kubelet created, by container ID, waiting at most `timeout`.
pub async fn list_pods(
    endpoint: &Endpoint,
    timeout: Duration,
) -> Result<HashMap<String, PodRef>, CriError> {
    let name = endpoint.to_string();
    within(&name, timeout, async {
        let answer = client(endpoint, &name)
            .await?
            .list_containers(request())
            .await
            .map_err(|s| call_error("ListContainers", &name, &s))?;
        Ok(pods(&answer.into_inner()))
    })
    .await
}

/// A RuntimeService client at `endpoint` (named `name` in errors).
async fn client(
    endpoint: &Endpoint,
    name: &str,
) -> Result<RuntimeServiceClient<tonic::transport::Channel>, CriError> {
    let channel = connect(endpoint).await.map_err(|e| CriError::Connect {
        endpoint: name.to_string(),
        error: chain(&e),
    })?;
    Ok(RuntimeServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE))
}

/// `call` (connecting included) within `timeout`: every CRI call has a time limit.
async fn within<T>(
    name: &str,
    timeout: Duration,
    call: impl std::future::Future<Output = Result<T, CriError>>,
) -> Result<T, CriError> {
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| CriError::Timeout {
            endpoint: name.to_string(),
            timeout,
        })?
}

fn call_error(call: &'static str, endpoint: &str, s: &tonic::Status) -> CriError {
    CriError::Call {
        call,
        endpoint: endpoint.to_string(),
        error: format!("{}: {}", s.code(), s.message()),
        hint: if s.code() == tonic::Code::Unimplemented {
            " (dxdp speaks CRI v1, which Kubernetes 1.26 and later require of the runtime: is this a container runtime's endpoint, and a current one?)"
        } else {
            ""
        },
    }
}

/// A pod as its ready sandbox names it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct PodSandboxInfo {
    /// The pod's UID.
    pub(crate) uid: String,
    /// The pod's labels (without the kubelet's `io.kubernetes.pod.*` ones, which name the pod).
    pub(crate) labels: BTreeMap<String, String>,
}

/// The request for `dxdp_pod_info`: the ready pod sandboxes.
pub(crate) fn sandbox_request() -> ListPodSandboxRequest {
    ListPodSandboxRequest {
        filter: Some(PodSandboxFilter {
            state: Some(PodSandboxStateValue {
                state: PodSandboxState::SandboxReady as i32,
            }),
            ..PodSandboxFilter::default()
        }),
    }
}

/// Each pod of a ready sandbox in `answer`, by (namespace, name). A sandbox that is not ready
/// (a runtime may ignore the filter) or has no namespace or name is left out; of two ready
/// sandboxes of one pod name (a pod deleted and created again), the newer one counts.
pub(crate) fn sandboxes(
    answer: &ListPodSandboxResponse,
) -> HashMap<(String, String), PodSandboxInfo> {
    let mut newest: HashMap<(String, String), (i64, PodSandboxInfo)> = HashMap::new();
    for s in &answer.items {
        let Some(m) = &s.metadata else { continue };
        if s.state != PodSandboxState::SandboxReady as i32
            || m.namespace.is_empty()
            || m.name.is_empty()
        {
            continue;
        }
        let info = PodSandboxInfo {
            uid: m.uid.clone(),
            labels: s
                .labels
                .iter()
                .filter(|(k, _)| ![LABEL_NAMESPACE, LABEL_POD, LABEL_POD_UID].contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        };
        let key = (m.namespace.clone(), m.name.clone());
        match newest.get(&key) {
            Some((at, _)) if *at >= s.created_at => {}
            _ => {
                newest.insert(key, (s.created_at, info));
            }
        }
    }
    newest.into_iter().map(|(k, (_, v))| (k, v)).collect()
}

/// Calls `ListPodSandbox` at `endpoint` and returns the pod of every ready sandbox (see
/// [`sandboxes`]), waiting at most `timeout`.
pub(crate) async fn list_sandboxes(
    endpoint: &Endpoint,
    timeout: Duration,
) -> Result<HashMap<(String, String), PodSandboxInfo>, CriError> {
    let name = endpoint.to_string();
    within(&name, timeout, async {
        let answer = client(endpoint, &name)
            .await?
            .list_pod_sandbox(sandbox_request())
            .await
            .map_err(|s| call_error("ListPodSandbox", &name, &s))?;
        Ok(sandboxes(&answer.into_inner()))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::v1::{Container, ContainerMetadata};
    use super::*;

    fn container(id: &str, state: ContainerState, labels: &[(&str, &str)]) -> Container {
        Container {
            id: id.into(),
            pod_sandbox_id: format!("sandbox-of-{id}"),
            metadata: Some(ContainerMetadata {
                name: "ignored".into(),
                attempt: 0,
            }),
            state: state as i32,
            created_at: 1,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn labels<'a>(ns: &'a str, pod: &'a str, c: &'a str) -> [(&'a str, &'a str); 3] {
        [
            (LABEL_NAMESPACE, ns),
            (LABEL_POD, pod),
            (LABEL_CONTAINER, c),
        ]
    }

    #[test]
    fn running_containers_of_the_kubelet_name_their_pod_container() {
        let answer = ListContainersResponse {
            containers: vec![
                container(
                    "aaa",
                    ContainerState::ContainerRunning,
                    &labels("ml", "train-0", "trainer"),
                ),
                // Not running: the runtime ignored the filter.
                container(
                    "bbb",
                    ContainerState::ContainerExited,
                    &labels("ml", "old", "x"),
                ),
                // Not the kubelet's (no pod labels), and a label left empty.
                container("ccc", ContainerState::ContainerRunning, &[("app", "ctr")]),
                container(
                    "ddd",
                    ContainerState::ContainerRunning,
                    &labels("ml", "", "x"),
                ),
                container(
                    "",
                    ContainerState::ContainerRunning,
                    &labels("ml", "p", "c"),
                ),
            ],
        };
        let got = pods(&answer);
        let want = HashMap::from([(
            "aaa".to_string(),
            PodRef {
                namespace: "ml".into(),
                pod: "train-0".into(),
                container: "trainer".into(),
            },
        )]);
        assert_eq!(got, want);
    }

    #[test]
    fn ready_sandboxes_name_their_pod_uid_and_labels_and_the_newest_wins() {
        use super::v1::{PodSandbox, PodSandboxMetadata};
        let sandbox =
            |id: &str, ns: &str, name: &str, uid: &str, state, at, labels: &[(&str, &str)]| {
                PodSandbox {
                    id: id.into(),
                    metadata: Some(PodSandboxMetadata {
                        name: name.into(),
                        uid: uid.into(),
                        namespace: ns.into(),
                        attempt: 0,
                    }),
                    state: state as i32,
                    created_at: at,
                    labels: labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                }
            };
        let answer = ListPodSandboxResponse {
            items: vec![
                sandbox(
                    "s1",
                    "ml",
                    "train-0",
                    "uid-old",
                    PodSandboxState::SandboxReady,
                    1,
                    &[("team", "old")],
                ),
                sandbox(
                    "s2",
                    "ml",
                    "train-0",
                    "uid-new",
                    PodSandboxState::SandboxReady,
                    2,
                    &[
                        ("team", "vision"),
                        (LABEL_POD, "train-0"),
                        (LABEL_NAMESPACE, "ml"),
                        (LABEL_POD_UID, "uid-new"),
                    ],
                ),
                sandbox(
                    "s3",
                    "ml",
                    "gone",
                    "u3",
                    PodSandboxState::SandboxNotready,
                    3,
                    &[],
                ),
                sandbox(
                    "s4",
                    "",
                    "nons",
                    "u4",
                    PodSandboxState::SandboxReady,
                    3,
                    &[],
                ),
            ],
        };
        let want = HashMap::from([(
            ("ml".to_string(), "train-0".to_string()),
            PodSandboxInfo {
                uid: "uid-new".into(),
                labels: BTreeMap::from([("team".to_string(), "vision".to_string())]),
            },
        )]);
        assert_eq!(sandboxes(&answer), want);
        let filter = sandbox_request().filter.unwrap();
        assert_eq!(filter.state.unwrap().state, 0); // SANDBOX_READY in the published enum
    }

    #[test]
    fn the_request_asks_for_running_containers_only() {
        let r = request();
        let filter = r.filter.unwrap();
        assert_eq!(filter.state.unwrap().state, 1); // CONTAINER_RUNNING in the published enum
        assert!(filter.id.is_empty() && filter.label_selector.is_empty());
    }

    #[test]
    fn the_default_endpoint_is_containerds() {
        let want = if cfg!(windows) {
            Endpoint::Pipe(r"\\.\pipe\containerd-containerd".into())
        } else {
            Endpoint::Socket("/run/containerd/containerd.sock".into())
        };
        assert_eq!(default_endpoint(), want);
    }

    // Unix only: Wine has no AF_UNIX sockets. The stand-in serving answers over a real socket is
    // in tests/daemon/telemetry.rs.
    #[cfg(unix)]
    #[tokio::test]
    async fn an_absent_runtime_is_a_connect_error_naming_the_endpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("containerd.sock");
        let err = list_pods(&Endpoint::Socket(path), Duration::from_secs(10))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot connect") && err.contains("containerd.sock"),
            "{err}"
        );
    }
}
