//! Host-facts sources: where the pipeline's input comes from.
//!
//! The rest of dxdp sees only the [`HostFactsSource`] trait. Sources are the edge of the system:
//! a host snapshot file, the built-in sample host, and (on Windows) the native backend.

mod sample;
mod snapshot_file;
pub mod stable_read;
#[cfg(windows)]
pub mod windows;
pub mod winparse;

use std::path::PathBuf;

use dxdp_core::facts::HostFacts;
use dxdp_core::snapshot::SnapshotError;

pub use sample::SampleHost;
pub use snapshot_file::SnapshotFile;

/// Why host facts could not be collected.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The snapshot could not be read.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// The source cannot work on this machine.
    #[error("{0}")]
    Unavailable(String),
}

/// Something that can report the facts of a host.
pub trait HostFactsSource: Send + Sync {
    /// A short description for logs and notices (`host snapshot /x.yaml`).
    fn describe(&self) -> String;
    /// True when the facts are not those of the machine dxdp runs on.
    fn is_simulated(&self) -> bool;
    /// Collects the facts now.
    fn load(&self) -> Result<HostFacts, SourceError>;
    /// Whether the facts may have changed since the last [`load`](Self::load) (or the last call).
    /// Polled by the plugin every poll interval; a true answer makes it reload and re-advertise
    /// when the devices differ. Cheap: never collects the facts itself.
    fn changed(&self) -> bool {
        false
    }
}

/// Picks the source: the snapshot file when given, else the native backend on Windows,
/// else the built-in sample host.
pub fn select(host_snapshot: Option<PathBuf>) -> Box<dyn HostFactsSource> {
    match host_snapshot {
        Some(path) => Box::new(SnapshotFile::new(path)),
        None => native(),
    }
}

#[cfg(windows)]
fn native() -> Box<dyn HostFactsSource> {
    Box::new(windows::WindowsHost::new())
}

#[cfg(not(windows))]
fn native() -> Box<dyn HostFactsSource> {
    Box::new(SampleHost)
}
