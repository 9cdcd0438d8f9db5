//! The daemon in process, on real sockets against the kubelet stand-in: serving, healing, faults,
//! health, telemetry, the metrics endpoint, host reads that must not hang it, and `dxdp validate`.
//!
//! One test executable per layer (issue 42): each is compiled and linked with the whole
//! dependency tree once, not once per file.

#[path = "../common/mod.rs"]
mod common;
#[path = "../support/cri.rs"]
mod cri;
#[path = "../support/eventlog.rs"]
mod eventlog;
#[path = "../support/fake_plugin.rs"]
mod fake_plugin;
#[path = "../support/podresources.rs"]
mod podresources;
#[path = "../support/silent.rs"]
mod silent;

mod auth;
mod faults;
mod health;
mod observe;
mod plugin;
mod reads;
mod sensors;
mod telemetry;
mod validate;
