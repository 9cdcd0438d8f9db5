//! The kubelet's PodResources API v1: which pod containers hold which devices.
//!
//! The kubelet serves it on `<kubelet root>/pod-resources/kubelet.sock` on Linux and on the named
//! pipe `\\.\pipe\kubelet-pod-resources` on Windows (kubernetes `pkg/kubelet/util/util_windows.go`,
//! `LocalEndpoint`). [`list`] calls `List` once, with a timeout; [`answer`] is the `List` answer
//! that gives a set of allocations (the tests' stand-in, `tests/support/podresources.rs`, serves
//! it).

use std::path::{Path, PathBuf};
use std::time::Duration;

use dxdp_core::telemetry::PodAllocation;

use super::endpoint::connect;
use super::v1::pod_resources_lister_client::PodResourcesListerClient;
use super::v1::{
    ContainerDevices, ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse,
    PodResources,
};
use crate::util::errors::chain;

/// The kubelet's PodResources named pipe on Windows.
pub(crate) const WINDOWS_PIPE: &str = r"\\.\pipe\kubelet-pod-resources";

/// The most bytes of a `List` answer accepted (a node with hundreds of pods stays far below).
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

use crate::transport::Endpoint;

impl Endpoint {
    /// The kubelet's endpoint on this OS, for its device-plugin directory `kubelet_dir`
    /// (`<root>/device-plugins`): the named pipe on Windows, `<root>/pod-resources/kubelet.sock`
    /// elsewhere.
    pub(crate) fn default_for(kubelet_dir: &Path) -> Endpoint {
        if cfg!(windows) {
            Endpoint::Pipe(WINDOWS_PIPE.to_string())
        } else {
            Endpoint::Socket(socket_beside(kubelet_dir))
        }
    }
}

/// `<root>/pod-resources/kubelet.sock` for the device-plugin directory `<root>/device-plugins`.
pub(crate) fn socket_beside(kubelet_dir: &Path) -> PathBuf {
    kubelet_dir
        .parent()
        .unwrap_or(kubelet_dir)
        .join("pod-resources")
        .join("kubelet.sock")
}

/// Why `List` gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    /// No connection.
    #[error("cannot connect to the kubelet's PodResources API at {endpoint}: {error} (is the kubelet running, and may dxdp open it? On Linux dxdp needs the kubelet's pod-resources directory mounted)")]
    Connect {
        /// Where.
        endpoint: String,
        /// Why.
        error: String,
    },
    /// The call failed.
    #[error("the kubelet's PodResources List call at {endpoint} failed: {error}")]
    Call {
        /// Where.
        endpoint: String,
        /// Why.
        error: String,
    },
    /// No answer in time.
    #[error("the kubelet's PodResources API at {endpoint} did not answer within {timeout:?}")]
    Timeout {
        /// Where.
        endpoint: String,
        /// How long dxdp waited.
        timeout: Duration,
    },
}

/// Calls `List` at `endpoint` and returns every container's devices, waiting at most `timeout`.
pub async fn list(
    endpoint: &Endpoint,
    timeout: Duration,
) -> Result<Vec<PodAllocation>, PodResourcesError> {
    let name = endpoint.to_string();
    let call =
        async {
            let channel = connect(endpoint)
                .await
                .map_err(|e| PodResourcesError::Connect {
                    endpoint: name.clone(),
                    error: chain(&e),
                })?;
            let mut client =
                PodResourcesListerClient::new(channel).max_decoding_message_size(MAX_MESSAGE);
            let answer = client.list(ListPodResourcesRequest {}).await.map_err(|s| {
                PodResourcesError::Call {
                    endpoint: name.clone(),
                    error: format!("{}: {}", s.code(), s.message()),
                }
            })?;
            Ok(allocations(&answer.into_inner()))
        };
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| PodResourcesError::Timeout {
            endpoint: name.clone(),
            timeout,
        })?
}

/// Every container's devices in a `List` answer, one entry per (container, resource).
pub(crate) fn allocations(answer: &ListPodResourcesResponse) -> Vec<PodAllocation> {
    let mut out = Vec::new();
    for pod in &answer.pod_resources {
        for container in &pod.containers {
            for devices in &container.devices {
                if devices.device_ids.is_empty() {
                    continue;
                }
                out.push(PodAllocation {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: container.name.clone(),
                    resource: devices.resource_name.clone(),
                    device_ids: devices.device_ids.clone(),
                });
            }
        }
    }
    out
}

/// The `List` answer that gives `allocations` (one pod entry per pod, in first-seen order).
pub fn answer(allocations: &[PodAllocation]) -> ListPodResourcesResponse {
    let mut pods: Vec<PodResources> = Vec::new();
    for a in allocations {
        let index = match pods
            .iter()
            .position(|p| p.namespace == a.namespace && p.name == a.pod)
        {
            Some(i) => i,
            None => {
                pods.push(PodResources {
                    name: a.pod.clone(),
                    namespace: a.namespace.clone(),
                    containers: Vec::new(),
                });
                pods.len() - 1
            }
        };
        let pod = &mut pods[index];
        let container = match pod.containers.iter().position(|c| c.name == a.container) {
            Some(i) => &mut pod.containers[i],
            None => {
                pod.containers.push(ContainerResources {
                    name: a.container.clone(),
                    ..ContainerResources::default()
                });
                let last = pod.containers.len() - 1;
                &mut pod.containers[last]
            }
        };
        container.devices.push(ContainerDevices {
            resource_name: a.resource.clone(),
            device_ids: a.device_ids.clone(),
            topology: None,
        });
    }
    ListPodResourcesResponse {
        pod_resources: pods,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocation(ns: &str, pod: &str, container: &str, ids: &[&str]) -> PodAllocation {
        PodAllocation {
            namespace: ns.into(),
            pod: pod.into(),
            container: container.into(),
            resource: "directx.microsoft.com/display".into(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn the_kubelets_socket_is_beside_the_device_plugin_directory() {
        assert_eq!(
            socket_beside(Path::new("/var/lib/kubelet/device-plugins")),
            PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock")
        );
    }

    #[test]
    fn containers_without_devices_are_left_out() {
        let mut a = answer(&[allocation("n", "p", "c", &["x"])]);
        a.pod_resources[0].containers.push(ContainerResources {
            name: "cpu-only".into(),
            ..ContainerResources::default()
        });
        assert_eq!(allocations(&a), vec![allocation("n", "p", "c", &["x"])]);
    }
}
