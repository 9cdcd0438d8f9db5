//! Host-facts sources: where the pipeline's input comes from.
//!
//! The rest of dxdp sees only the [`HostFactsSource`] trait. Sources are the edge of the system:
//! a host snapshot file, the built-in sample host, and (on Windows) the native backend.

pub mod counters;
pub mod eventlog;
pub mod probe;
mod sample;
mod snapshot_file;
#[cfg(windows)]
pub(crate) mod windows;
pub mod winparse;

use std::path::PathBuf;
use std::sync::Arc;

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
    /// Collects the facts when the caller knows the source's files are complete: they were just
    /// renamed into place, or closed after writing. A file source can then skip waiting for a
    /// writer to finish ([`load`](Self::load) must not trust a file that may be half-written).
    fn load_complete(&self) -> Result<HostFacts, SourceError> {
        self.load()
    }
    /// Files whose changes may change the facts. The daemon watches their directories and
    /// reloads as soon as one changes.
    fn watched_files(&self) -> Vec<PathBuf> {
        Vec::new()
    }
    /// Registers `wake`, which the source calls (from any thread) as soon as it learns that the
    /// facts may have changed, such as a DXCore adapter notification. The default never calls.
    fn on_change(&self, wake: Wake) {
        let _ = wake;
    }
    /// Whether the facts may have changed since the last [`load`](Self::load) (or the last call).
    /// Asked by the daemon's slow safety poll, for changes no event reports (device health on
    /// Windows). Cheap: never collects the facts itself.
    fn changed(&self) -> bool {
        false
    }
}

/// A callback that wakes the daemon's refresh; cheap and callable from any thread.
pub type Wake = Arc<dyn Fn() + Send + Sync>;

/// Picks the source: the snapshot file when given, else the native backend on Windows,
/// else the built-in sample host.
pub fn select(host_snapshot: Option<PathBuf>) -> Box<dyn HostFactsSource> {
    match host_snapshot {
        Some(path) if path.as_os_str() == BUILTIN_SAMPLE => Box::new(SampleHost),
        Some(path) => Box::new(SnapshotFile::new(path)),
        None => native(),
    }
}

/// The `--host-snapshot` value that names the built-in sample host ([`SampleHost`]) rather
/// than a file: `dxdp plugin` off Windows serves it only when asked this way.
pub const BUILTIN_SAMPLE: &str = "builtin:sample";

/// The host snapshot *file* `--host-snapshot` names: `None` for the built-in sample host.
pub fn snapshot_file(host_snapshot: Option<PathBuf>) -> Option<PathBuf> {
    host_snapshot.filter(|p| p.as_os_str() != BUILTIN_SAMPLE)
}

#[cfg(windows)]
fn native() -> Box<dyn HostFactsSource> {
    Box::new(windows::WindowsHost::new())
}

#[cfg(not(windows))]
fn native() -> Box<dyn HostFactsSource> {
    Box::new(SampleHost)
}

/// The counter source for this run: the snapshot's recording when a host snapshot is used, the
/// PDH counters on Windows, else none (with the reason).
pub fn select_counters(
    host_snapshot: Option<&std::path::Path>,
) -> Result<Box<dyn counters::CounterSource>, String> {
    match host_snapshot {
        Some(path) => Ok(Box::new(counters::Recorded::new(path))),
        None => native_counters(),
    }
}

#[cfg(windows)]
fn native_counters() -> Result<Box<dyn counters::CounterSource>, String> {
    windows::telemetry::NodeCounters::open()
        .map(|s| Box::new(s) as Box<dyn counters::CounterSource>)
}

#[cfg(not(windows))]
fn native_counters() -> Result<Box<dyn counters::CounterSource>, String> {
    Err("GPU telemetry needs the Windows GPU performance counters, or a host snapshot with a telemetry section (--host-snapshot)".into())
}

/// The live source of the containers' process lists: HCS on Windows, else none (with the
/// reason).
#[cfg(windows)]
pub fn native_containers() -> Result<Box<dyn counters::ContainerSource>, String> {
    windows::hcs::HcsContainers::open()
        .map(|s| Box::new(s) as Box<dyn counters::ContainerSource>)
        .map_err(|e| e.to_string())
}

/// The live source of the containers' process lists: HCS on Windows, else none (with the
/// reason).
#[cfg(not(windows))]
pub fn native_containers() -> Result<Box<dyn counters::ContainerSource>, String> {
    Err("the containers' process lists come from HCS, which exists only on Windows".into())
}

/// The event log of the machine dxdp runs on, for GPU fault events: Windows' (`wevtapi.dll`),
/// else none (with the reason).
#[cfg(windows)]
pub fn native_event_log() -> Result<Arc<dyn eventlog::EventLog>, String> {
    Ok(Arc::new(windows::eventlog::WindowsEventLog))
}

/// The event log of the machine dxdp runs on, for GPU fault events: Windows' (`wevtapi.dll`),
/// else none (with the reason).
#[cfg(not(windows))]
pub fn native_event_log() -> Result<Arc<dyn eventlog::EventLog>, String> {
    Err("fault events come from the Windows event log, which exists only on Windows".into())
}
