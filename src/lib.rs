//! dxdp: Kubernetes device plugins that give process-isolated Windows containers DirectX GPUs
//! and compute accelerators.
//!
//! The architecture, in the order data flows:
//!
//! - [`dxdp_core`] (its own crate): the host facts model, the host snapshot format, the pipeline
//!   rules turning facts into devices, the devices, assignment modes and allocation. Pure.
//! - [`config`]: configuration layers (defaults, files, environment, flags) and their origins.
//! - [`backend`]: where facts come from (snapshot file, built-in sample host, native Windows).
//! - [`inventory`]: what is served (devices and configuration), built from the host facts.
//! - `supervisor`: the task supervisor every long-lived task of the daemon runs under.
//! - [`plugin`]: device serving (device-plugin servers, file watch, gRPC service, registration,
//!   kubelet restarts).
//! - `context`: what every feature of the running daemon reads, built once by the daemon.
//! - [`health`]: device health on the cluster side (live fault events, `GPUUnhealthy` Events,
//!   node conditions, readiness on the Node's capacity).
//! - [`validation`]: the in-cluster validation Jobs.
//! - [`kubelet`]: the kubelet's v1beta1 API and an in-process kubelet stand-in.
//! - [`daemon`]: the composition root: builds every part of the daemon and runs it (the CLI,
//!   `dxdp demo`, the tests and the benchmarks all start it there).
//! - [`cluster`]: the node's Kubernetes object: dxdp's node labels and the label that selects a
//!   named configuration.
//! - [`observe`]: Prometheus metrics, and the health and readiness endpoints.
//! - [`telemetry`]: the GPU telemetry sampler (counters, PodResources, figures on `/metrics`).
//! - [`transport`]: AF_UNIX sockets on Unix and Windows.
//! - [`shutdown`]: termination signals and console events, and the cleanup handshake.
//! - [`tools`]: the node tools (`mounts`, `hcs`, `doctor`) as pure functions.
//! - [`render`]: output for people and machines.
//! - [`output`]: the JSON documents (`apiVersion: dxdp/v1`) and their JSON Schemas.
//! - [`logging`]: `tracing` setup.
//! - [`util`]: retry backoff and error text, shared by every layer.

pub mod backend;
pub mod cluster;
pub mod config;
pub(crate) mod context;
pub mod daemon;
pub mod health;
pub mod inventory;
pub mod kubelet;
pub mod logging;
pub mod observe;
pub mod output;
pub mod plugin;
pub mod render;
pub mod shutdown;
pub(crate) mod supervisor;
pub mod telemetry;
pub mod tools;
pub mod transport;
pub mod util;
pub mod validation;
