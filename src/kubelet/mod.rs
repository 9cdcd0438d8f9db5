//! The kubelet side of the device plugin API: generated v1beta1 types, the kubelet's directory
//! ([`paths`]), and an in-process kubelet stand-in used by `dxdp demo` and the integration tests;
//! the kubelet's PodResources API ([`podresources`]: client and stand-in); the container
//! runtime's CRI API, which the kubelet drives ([`cri`]: the `ListContainers` client); and where
//! such node-local APIs are served ([`endpoint`]: socket files and named pipes). The plugin's
//! own `DevicePlugin` server, with pre-encoded Allocate answers, is `plugin::answer`.

pub mod cri;
pub mod endpoint;
pub mod paths;
pub mod podresources;
pub mod standin;

/// The kubelet device plugin API v1beta1, generated from `proto/deviceplugin_v1beta1.proto`:
/// its messages, `Registration` (client and server) and the kubelet's `DevicePlugin` client.
/// The one `DevicePlugin` server is the plugin's (`plugin::answer::server`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
    include!(concat!(env!("OUT_DIR"), "/kubelet/v1beta1.DevicePlugin.rs"));
}

/// The kubelet's PodResources API v1, generated from `proto/podresources_v1.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("v1");
}

/// The API version dxdp speaks.
pub const API_VERSION: &str = "v1beta1";
/// The kubelet's registration socket file name.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
