//! Sources of GPU counter samples: the `telemetry` section of a host snapshot (a recorded window,
//! replayed as it is), or the Windows GPU performance counters through PDH.

use std::path::{Path, PathBuf};

use dxdp_core::telemetry::TelemetryFacts;

/// Something that reads the GPU counters.
pub trait CounterSource: Send + Sync {
    /// A short description for logs (`host snapshot /x.yaml`, `PDH GPU counters`).
    fn describe(&self) -> String;
    /// Reads the counters now: one new sample (a live source; the sampler keeps the window), or
    /// a recorded window of two or more samples (used as it is). Blocking; called off the async
    /// runtime.
    fn read(&self) -> Result<TelemetryFacts, String>;
    /// True when the facts are a recording, not this machine's.
    fn is_recorded(&self) -> bool {
        false
    }
}

/// The `telemetry` section of a host snapshot file, re-read at every sample (so that replacing
/// the file replays another recording).
#[derive(Debug, Clone)]
pub struct Recorded {
    path: PathBuf,
}

impl Recorded {
    /// The snapshot at `path`.
    pub fn new(path: &Path) -> Self {
        Recorded {
            path: path.to_path_buf(),
        }
    }
}

impl CounterSource for Recorded {
    fn describe(&self) -> String {
        format!(
            "telemetry recorded in host snapshot {}",
            self.path.display()
        )
    }

    fn read(&self) -> Result<TelemetryFacts, String> {
        match dxdp_core::snapshot::read_file_full(&self.path) {
            Ok((_, Some(t))) => Ok(t),
            Ok((_, None)) => Err(format!(
                "host snapshot {} has no telemetry section (see docs/host-snapshot.md#telemetry)",
                self.path.display()
            )),
            Err(e) => Err(e.to_string()),
        }
    }

    fn is_recorded(&self) -> bool {
        true
    }
}

/// The counter source for this run: the snapshot's recording when a host snapshot is used, the
/// PDH counters on Windows, else none (with the reason).
pub fn select(host_snapshot: Option<&Path>) -> Result<Box<dyn CounterSource>, String> {
    match host_snapshot {
        Some(path) => Ok(Box::new(Recorded::new(path))),
        None => native(),
    }
}

#[cfg(windows)]
fn native() -> Result<Box<dyn CounterSource>, String> {
    crate::backend::windows::pdh::PdhSource::open().map(|s| Box::new(s) as Box<dyn CounterSource>)
}

#[cfg(not(windows))]
fn native() -> Result<Box<dyn CounterSource>, String> {
    Err("GPU telemetry needs the Windows GPU performance counters, or a host snapshot with a telemetry section (--host-snapshot)".into())
}
