//! Fixture hosts shared by the integration tests.
#![allow(dead_code)] // each test crate uses a part

use std::path::{Path, PathBuf};

use dxdp_core::facts::HostFacts;

/// Every fixture host in `tests/fixtures/`.
pub const FIXTURES: [&str; 12] = [
    "nvidia-multi-gpu",
    "amd-radeon",
    "intel-igpu",
    "compute-only",
    "broken-drivers",
    "hostile-registry",
    "hostile-paths",
    "hostile-system-root",
    "in-container",
    "ws2019-old",
    "status-and-unsupported",
    "telemetry-t4",
];

/// The file of a fixture host.
pub fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("{name}.yaml"))
}

/// The facts of a fixture host, or of the built-in sample host for `"sample"`.
pub fn facts(name: &str) -> HostFacts {
    if name == "sample" {
        return dxdp_core::sample::sample_host().unwrap_or_else(|e| panic!("sample host: {e}"));
    }
    dxdp_core::snapshot::read_file(&fixture_path(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}
