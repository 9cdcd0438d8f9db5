//! The plugin's side of the `v1beta1.DevicePlugin` service, with Allocate answers pre-encoded.
//!
//! The server is generated (build.rs) from a manual definition of the same service as
//! `proto/deviceplugin_v1beta1.proto`: same package, routes, requests and streaming. The one
//! difference is Allocate's answer type, [`AllocateAnswer`]: field 1 of `AllocateResponse` is
//! `repeated ContainerAllocateResponse`, and an embedded message is encoded exactly as `bytes`
//! holding its encoding (wire type 2, length, payload), so `repeated bytes` carrying each
//! container's encoded answer is the same message on the wire. The answer of each device is
//! encoded once per inventory and only reference-counted per call: no copy of its 40-odd
//! strings and no encoding on the pod-start path.

use bytes::Bytes;
use prost::Message;

use crate::kubelet::v1beta1::ContainerAllocateResponse;

/// `AllocateResponse` on the wire, each container's answer already encoded.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AllocateAnswer {
    /// Each container's `ContainerAllocateResponse`, encoded, in request order.
    #[prost(bytes = "bytes", repeated, tag = "1")]
    pub container_responses: Vec<Bytes>,
}

#[cfg(test)]
impl AllocateAnswer {
    /// The answer as the kubelet decodes it (the server itself never decodes it).
    pub(crate) fn decoded(
        &self,
    ) -> Result<crate::kubelet::v1beta1::AllocateResponse, prost::DecodeError> {
        crate::kubelet::v1beta1::AllocateResponse::decode(self.encode_to_vec().as_slice())
    }
}

/// One container's answer, encoded for [`AllocateAnswer`].
pub fn encode_container(response: &ContainerAllocateResponse) -> Bytes {
    Bytes::from(response.encode_to_vec())
}

/// The generated server of `v1beta1.DevicePlugin` answering with [`AllocateAnswer`].
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod server {
    include!(concat!(env!("OUT_DIR"), "/plugin/v1beta1.DevicePlugin.rs"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::v1beta1::{AllocateResponse, DeviceSpec, Mount};

    fn container(device: &str, mounts: &[(&str, &str)]) -> ContainerAllocateResponse {
        ContainerAllocateResponse {
            devices: vec![DeviceSpec {
                container_path: String::new(),
                host_path: device.into(),
                permissions: String::new(),
            }],
            mounts: mounts
                .iter()
                .map(|(c, h)| Mount {
                    container_path: (*c).into(),
                    host_path: (*h).into(),
                    read_only: true,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn an_answer_is_an_allocate_response_on_the_wire() {
        let a = container(
            "vpci-location-path://PCIROOT(0)#PCI(0100)",
            &[(
                r"C:\Windows\System32\nvcuda.dll",
                r"C:\DriverStore\nvcuda64.dll",
            )],
        );
        let b = container("vpci-location-path://PCIROOT(0)#PCI(0200)", &[]);
        let answer = AllocateAnswer {
            container_responses: vec![encode_container(&a), encode_container(&b)],
        };
        let expected = AllocateResponse {
            container_responses: vec![a, b],
        };
        assert_eq!(answer.encode_to_vec(), expected.encode_to_vec());
        assert_eq!(answer.decoded().unwrap(), expected);
        // No container: the empty message, as AllocateResponse encodes it.
        assert!(AllocateAnswer::default().encode_to_vec().is_empty());
    }
}
