//! Sources of GPU counter samples: the `telemetry` section of a host snapshot (a recorded window,
//! replayed as it is), or the Windows GPU performance counters through PDH (with DXCore's shared
//! memory limits); and of the containers' process lists (HCS on Windows; a recording has them in
//! its telemetry section).

use std::path::{Path, PathBuf};

use dxdp_core::telemetry::{ContainerProcesses, TelemetryFacts};

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

/// Something that lists the containers of this machine and their processes, live (a recording
/// has them in its telemetry facts instead).
pub trait ContainerSource: Send + Sync {
    /// A short description for logs (`HCS (computecore.dll)`).
    fn describe(&self) -> String;
    /// The running containers and their process IDs, now, without their pods (which the
    /// container runtime knows). Blocking, with its own time limit; called off the async runtime.
    fn list(&self) -> Result<ContainerListing, String>;
}

/// What one listing of the containers' processes gave.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerListing {
    /// The containers whose processes were read.
    pub containers: Vec<ContainerProcesses>,
    /// Running containers whose processes could not be read this time (each with why): the
    /// sampler keeps their previous process list rather than give their processes to the host
    /// for one sample.
    pub unreadable: Vec<(String, String)>,
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
        // A regular file only, bounded, never a blocking open (as the snapshot source reads it).
        let text = crate::util::stable_read::read_once(
            &self.path,
            super::snapshot_file::MAX_SNAPSHOT_BYTES,
        )
        .map_err(|e| format!("cannot read host snapshot {}: {e}", self.path.display()))?;
        match dxdp_core::snapshot::parse_full(&text, &self.path.display().to_string()) {
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

#[cfg(test)]
mod tests {
    use super::super::winparse::memory_counters;
    use super::*;
    use dxdp_core::telemetry::MemoryCounter;

    #[test]
    fn dedicated_and_shared_values_meet_per_instance() {
        let s = |n: &str, v: u64| (n.to_string(), v);
        let got = memory_counters(
            &[
                s("pid_1_luid_0x0_0x1_phys_0", 10),
                s("pid_2_luid_0x0_0x1_phys_0", 20),
            ],
            &[
                s("pid_2_luid_0x0_0x1_phys_0", 5),
                s("pid_3_luid_0x0_0x1_phys_0", 7),
            ],
        );
        let m = |n: &str, dedicated: u64, shared: u64| MemoryCounter {
            instance: n.into(),
            dedicated,
            shared,
        };
        assert_eq!(
            got,
            vec![
                m("pid_1_luid_0x0_0x1_phys_0", 10, 0),
                m("pid_2_luid_0x0_0x1_phys_0", 20, 5),
                m("pid_3_luid_0x0_0x1_phys_0", 0, 7),
            ]
        );
    }

    #[test]
    fn a_snapshot_without_telemetry_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.yaml");
        std::fs::write(&path, "apiVersion: dxdp/v1alpha1\nkind: HostSnapshot\n").unwrap();
        let err = Recorded::new(&path).read().unwrap_err();
        assert!(err.contains("no telemetry section"), "{err}");
    }
}
