//! The `dxdp` command line and the repository: what a user runs (the binary against fixture hosts,
//! its processes, exit codes and output), the docs, schemas, checkout and code-structure checks.
//!
//! One test executable per layer (issue 42): each is compiled and linked with the whole
//! dependency tree once, not once per file.

#[path = "../common/mod.rs"]
mod common;

mod checkout;
mod claim;
mod cli;
mod docs;
mod field_compare;
mod fixtures_discover;
mod hostile;
mod missing;
mod process;
mod schemas;
mod stop_windows;
mod structure;
mod tools;
