//! The built-in sample host, embedded in the binary for machines that are not Windows.

use super::{HostFactsSource, SourceError};
use crate::facts::HostFacts;
use crate::snapshot;

/// The sample host as a host snapshot document.
pub const SAMPLE_HOST_YAML: &str = include_str!("sample-host.yaml");

/// Parses the embedded sample host.
pub fn sample_host() -> Result<HostFacts, SourceError> {
    Ok(snapshot::parse(SAMPLE_HOST_YAML, "built-in sample host")?)
}

/// A simulated GPU node: two NVIDIA A10 GPUs, one NVIDIA A100 in compute-only (MCDM) mode and
/// the Microsoft Basic Render Driver.
#[derive(Debug, Clone, Copy, Default)]
pub struct SampleHost;

impl HostFactsSource for SampleHost {
    fn describe(&self) -> String {
        "the built-in sample host (2x NVIDIA A10, 1x NVIDIA A100 compute-only)".into()
    }

    fn is_simulated(&self) -> bool {
        true
    }

    fn load(&self) -> Result<HostFacts, SourceError> {
        sample_host()
    }
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
