//! The cluster side against the API server stand-in (tests/support/apiserver.rs): node labels and
//! configuration, cleanup, health Events and conditions, the isolation audit, GPU memory over-use, the metrics guard,
//! and a real Prometheus scrape.
//!
//! One test executable per layer (issue 42): each is compiled and linked with the whole
//! dependency tree once, not once per file.

#[path = "../support/apiserver.rs"]
mod apiserver;
#[path = "../common/mod.rs"]
mod common;
#[path = "../support/podresources.rs"]
mod podresources;
#[path = "../support/tls.rs"]
mod tls;

mod cleanup;
mod cluster;
mod health_cluster;
mod isolation;
mod lifecycle;
mod metrics_authz;
mod node_tools;
mod overuse;
mod prometheus;
mod web;
mod web_sans;
