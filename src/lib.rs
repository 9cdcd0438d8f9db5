//! dxdp: Kubernetes device plugins that give process-isolated Windows containers DirectX GPUs
//! and compute accelerators.
//!
//! The architecture, in the order data flows:
//!
//! - [`facts`]: the host facts model, plain data as the Windows APIs report it.
//! - [`snapshot`]: the host snapshot file format (the same facts as YAML or JSON).
//! - [`config`]: configuration layers (defaults, files, environment, flags) and their origins.
//! - [`backend`]: where facts come from (snapshot file, built-in sample host, native Windows).
//! - [`pipeline`]: pure rules turning facts into devices.
//! - [`devices`]: the devices, their health and runtime files.
//! - [`allocation`]: replicas and the container edits of an `Allocate` call.
//! - [`plugin`]: the device plugin daemon (gRPC service, registration, kubelet restarts).
//! - [`kubelet`]: the kubelet's v1beta1 API and an in-process kubelet stand-in.
//! - [`transport`]: AF_UNIX sockets on Unix and Windows.
//! - [`tools`]: the node tools (`mounts`, `hcs`, `doctor`) as pure functions.
//! - [`render`]: output for people and machines.
//! - [`logging`]: `tracing` setup.

pub mod allocation;
pub mod backend;
pub mod config;
pub mod devices;
pub mod facts;
pub mod kubelet;
pub mod logging;
pub mod pipeline;
pub mod plugin;
pub mod render;
pub mod snapshot;
pub mod tools;
pub mod transport;
