//! The live GPU counter source of a Windows node: the GPU performance counters ([`super::pdh`])
//! with each adapter's shared memory total (DXCore `SharedSystemMemory`, [`super::dxcore`]),
//! which feeds `dxdp_gpu_memory_total_bytes{segment="shared"}`. The totals change only when
//! adapters come or go, so DXCore is asked at the first read and then once a minute. Each sample
//! also carries the adapters' sensor readings ([`super::sensors`]: D3DKMT performance data and
//! NVML), which never fail or delay the read beyond their own time limit.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use dxdp_core::telemetry::{SharedMemoryLimit, TelemetryFacts};

use super::dxcore;
use super::nvml::NvmlReader;
use super::pdh::PdhSource;
use super::sensors::Sensors;
use crate::backend::counters::CounterSource;

/// How often the shared memory totals are read again.
pub(crate) const SHARED_REFRESH: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Shared {
    read_at: Option<Instant>,
    limits: Vec<SharedMemoryLimit>,
    failing: bool,
}

/// The GPU counters and shared memory totals of this machine.
pub(crate) struct NodeCounters {
    pdh: PdhSource,
    shared: Mutex<Shared>,
    sensors: Sensors,
}

impl NodeCounters {
    /// Opens the GPU counters (see [`PdhSource::open`]); fails where they do not exist. Starts
    /// the sensor sources' threads.
    pub(crate) fn open() -> Result<Self, String> {
        Ok(NodeCounters {
            pdh: PdhSource::open()?,
            shared: Mutex::default(),
            sensors: Sensors::start(NvmlReader::new),
        })
    }

    /// The shared memory totals, read from DXCore when due. A failure keeps the last totals
    /// (none at first: the figure is then absent) and is logged once until DXCore answers again.
    fn shared_limits(&self) -> Vec<SharedMemoryLimit> {
        let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        if s.read_at.is_none_or(|at| at.elapsed() >= SHARED_REFRESH) {
            s.read_at = Some(Instant::now());
            match dxcore::shared_memory_limits() {
                Ok(limits) => {
                    if s.failing {
                        tracing::info!("DXCore reports the adapters' shared memory again");
                    }
                    s.failing = false;
                    s.limits = limits;
                }
                Err(e) => {
                    if !s.failing {
                        tracing::warn!("cannot read the adapters' shared memory from DXCore: {e}; dxdp_gpu_memory_total_bytes{{segment=\"shared\"}} keeps its last value (absent if none), retried every {SHARED_REFRESH:?}");
                    }
                    s.failing = true;
                }
            }
        }
        s.limits.clone()
    }
}

impl CounterSource for NodeCounters {
    fn describe(&self) -> String {
        format!(
            "{}, DXCore shared memory and GPU sensors (D3DKMT, NVML)",
            self.pdh.describe()
        )
    }

    fn read(&self) -> Result<TelemetryFacts, String> {
        let mut facts = self.pdh.read()?;
        facts.shared_memory_limits = self.shared_limits();
        if let Some(sample) = facts.samples.last_mut() {
            sample.sensors = self.sensors.read();
        }
        Ok(facts)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn shared_memory_totals_are_read_or_their_absence_is_explained() {
        // Wine has no dxcore.dll: an error naming it. On Windows, one total per adapter.
        match super::dxcore::shared_memory_limits() {
            Ok(limits) => {
                let luids: std::collections::HashSet<i64> = limits.iter().map(|l| l.luid).collect();
                assert_eq!(luids.len(), limits.len(), "{limits:?}");
            }
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("dxcore.dll") || e.contains("DXCore"), "{e}");
                eprintln!(
                    "skipped shared_memory_totals_are_read_or_their_absence_is_explained: the shared memory totals need DXCore: {e}"
                );
            }
        }
    }
}
