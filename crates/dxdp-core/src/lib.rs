//! The pure core of dxdp: host facts in, devices and container edits out.
//!
//! Nothing here does I/O beyond reading a named snapshot file, starts a thread or calls an OS
//! API; Cargo enforces it (no tokio, tonic, clap or Windows dependency). The daemon, the OS
//! backends and the command line depend on this crate, never the reverse.
//!
//! In the order data flows:
//!
//! - [`facts`]: the host facts model, plain data as the Windows APIs report it.
//! - [`snapshot`]: the host snapshot file format (the same facts as YAML or JSON).
//! - [`sample`]: the built-in sample host.
//! - [`pipeline`]: pure rules turning facts into devices.
//! - [`devices`]: the devices, their health and runtime files.
//! - [`health`]: why a device is Unhealthy, the fault-signal catalogue and policy, fault events.
//! - [`assignment`]: how containers are given devices, and what the host's HCS allows.
//! - [`policy`]: per-resource allocation settings (spread or pack, multi-device requests, hints).
//! - [`preferred`]: the preferred allocation (`GetPreferredAllocation`).
//! - [`sharing`]: how one GPU becomes several device IDs (replicas or memory units).
//! - [`allocation`]: replicas and the container edits of an `Allocate` call.
//! - [`quote`]: bounded quoting of untrusted values in messages.
//! - [`luid`]: the one notation of adapter LUIDs in text (the telemetry labels' notation).
//! - [`hints`]: the environment variables and annotations that tell a container its devices.
//! - [`labels`]: the Node labels that describe the node's devices.
//! - [`telemetry`]: GPU telemetry facts (counter samples, container processes, the kubelet's
//!   allocations) and the per-device and per-container figures computed from them.

pub mod allocation;
pub mod assignment;
pub mod devices;
pub mod facts;
pub mod families;
pub mod health;
pub mod hints;
pub mod labels;
pub mod lifecycle;
pub mod luid;
pub mod pipeline;
pub mod policy;
pub mod preferred;
pub mod quote;
pub mod sample;
pub mod sharing;
pub mod snapshot;
pub mod telemetry;
pub mod validation;
pub mod vendor;
