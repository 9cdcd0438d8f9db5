//! The built-in sample host: a simulated GPU node embedded as a host snapshot, for demos, docs
//! and tests on machines that are not Windows.

use crate::facts::HostFacts;
use crate::snapshot::{self, SnapshotError};

/// The sample host as a host snapshot document.
pub const SAMPLE_HOST_YAML: &str = include_str!("sample-host.yaml");

/// What the sample host is, for logs and notices.
pub const SAMPLE_HOST_DESCRIPTION: &str =
    "the built-in sample host (2x NVIDIA A10, 1x NVIDIA A100 compute-only)";

/// Parses the embedded sample host: two NVIDIA A10 GPUs, one NVIDIA A100 in compute-only (MCDM)
/// mode and the Microsoft Basic Render Driver.
pub fn sample_host() -> Result<HostFacts, SnapshotError> {
    snapshot::parse(SAMPLE_HOST_YAML, "built-in sample host")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::Resource;
    use crate::pipeline::{discover, PipelineConfig};

    #[test]
    fn sample_host_parses_and_has_both_resources_without_warnings() {
        let facts = sample_host().unwrap();
        let d = discover(&facts, &PipelineConfig::default());
        assert_eq!(d.devices_for(Resource::Display).count(), 2);
        assert_eq!(d.devices_for(Resource::Compute).count(), 1);
        assert_eq!(d.excluded.len(), 1);
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        assert!(d.devices.iter().all(|d| d.runtime_files.len() > 5));
    }
}
