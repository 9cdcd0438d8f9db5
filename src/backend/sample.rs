//! The built-in sample host as a host-facts source (the facts themselves live in the core).

use super::{HostFactsSource, SourceError};
use dxdp_core::facts::HostFacts;
use dxdp_core::sample::{sample_host, SAMPLE_HOST_DESCRIPTION};

/// A simulated GPU node: two NVIDIA A10 GPUs, one NVIDIA A100 in compute-only (MCDM) mode and
/// the Microsoft Basic Render Driver.
#[derive(Debug, Clone, Copy, Default)]
pub struct SampleHost;

impl HostFactsSource for SampleHost {
    fn describe(&self) -> String {
        SAMPLE_HOST_DESCRIPTION.into()
    }

    fn is_simulated(&self) -> bool {
        true
    }

    fn load(&self) -> Result<HostFacts, SourceError> {
        Ok(sample_host()?)
    }
}
