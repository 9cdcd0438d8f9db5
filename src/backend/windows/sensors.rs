//! GPU sensor readings (temperature, power, clocks, fan, throttle reasons) for the counter
//! samples, from two sources, each read on a thread of its own so that a call that hangs in a
//! driver never stalls sampling:
//! - the graphics kernel: `D3DKMTEnumAdapters2`, then per adapter `D3DKMTQueryAdapterInfo` with
//!   `KMTQAITYPE_ADAPTERPERFDATA`, `KMTQAITYPE_ADAPTERPERFDATA_CAPS`, `KMTQAITYPE_NODEMETADATA`
//!   and `KMTQAITYPE_NODEPERFDATA` (WDDM 2.4 and later), and `D3DKMTCloseAdapter`; the functions
//!   are looked up in `gdi32.dll` at run time (Wine's has neither `D3DKMTEnumAdapters2` nor
//!   `D3DKMTQueryAdapterInfo`, and calling an import Wine lacks aborts the process);
//! - NVIDIA's NVML ([`super::nvml`]), where the driver ships `nvml.dll`.
//!
//! The bytes the calls fill are turned into readings by `crate::backend::winparse`, tested on
//! every target. Sensors are optional: a source that is missing, fails or does not answer within
//! [`SENSOR_TIMEOUT`] gives no readings for that sample, never an error of the counter read, and
//! is logged once (warn; info for a source that is simply absent) until it answers again.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use windows::Wdk::Graphics::Direct3D::{
    D3DKMT_ADAPTERADDRESS, D3DKMT_ADAPTERINFO, D3DKMT_CLOSEADAPTER, D3DKMT_ENUMADAPTERS2,
    D3DKMT_QUERYADAPTERINFO, KMTQAITYPE_ADAPTERADDRESS, KMTQAITYPE_ADAPTERPERFDATA,
    KMTQAITYPE_ADAPTERPERFDATA_CAPS, KMTQAITYPE_NODEMETADATA, KMTQAITYPE_NODEPERFDATA,
    KMTQUERYADAPTERINFOTYPE,
};

use super::error::WinError;
use super::library::Library;
use crate::backend::winparse::{self, perfdata};
use dxdp_core::facts::PciLocation;
use dxdp_core::telemetry::sensors::{AdapterSensors, SensorSource};

/// How long a counter read waits for the sensor sources (all at once).
pub(crate) const SENSOR_TIMEOUT: Duration = Duration::from_secs(2);

/// How often what changes only with the adapters or their drivers (caps, engine nodes, maximum
/// clocks, the NVML devices' LUIDs) is read again, and a missing source tried again.
pub(crate) const STATIC_REFRESH: Duration = Duration::from_secs(60);

/// Engine nodes asked for at most (the graphics kernel answers an error past the last one).
const MAX_NODES: u32 = 64;

/// Why a source gave no readings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SourceError {
    /// The source does not exist here (no `nvml.dll`, a `gdi32.dll` without the calls).
    Absent(String),
    /// It exists and failed.
    Failed(String),
}

/// A sensor source, used on its worker thread only.
pub(crate) trait SensorReader {
    /// One reading of every adapter the source knows.
    fn read(&mut self) -> Result<Vec<AdapterSensors>, SourceError>;
}

type Answer = (u64, Result<Vec<AdapterSensors>, SourceError>);

/// What was last logged about a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Logged {
    Nothing,
    Working,
    Absent,
    Failing,
}

/// One source on its own thread: a request carries a number, the answer repeats it.
struct Worker {
    source: SensorSource,
    requests: SyncSender<u64>,
    answers: Receiver<Answer>,
    next: u64,
    /// The request not answered yet, and when it was made.
    pending: Option<(u64, Instant)>,
    logged: Logged,
}

impl Worker {
    /// Starts the thread; the reader is made on it (NVML's initialisation may be slow).
    fn spawn<R: SensorReader + 'static>(source: SensorSource, make: fn() -> R) -> Option<Worker> {
        let (requests, inbox) = mpsc::sync_channel::<u64>(1);
        let (outbox, answers) = mpsc::channel::<Answer>();
        let spawned = std::thread::Builder::new()
            .name(format!("dxdp-sensors-{}", source.as_str()))
            .spawn(move || {
                let mut reader = make();
                while let Ok(id) = inbox.recv() {
                    if outbox.send((id, reader.read())).is_err() {
                        break;
                    }
                }
            });
        match spawned {
            Ok(_) => Some(Worker {
                source,
                requests,
                answers,
                next: 0,
                pending: None,
                logged: Logged::Nothing,
            }),
            Err(e) => {
                tracing::warn!(
                    "cannot start the {} sensor thread: {e}; no {} sensor readings",
                    source.as_str(),
                    source.as_str()
                );
                None
            }
        }
    }

    /// Asks for a reading, unless the last request is still unanswered (a hung call: no second
    /// one is queued behind it). Answers that came too late are dropped.
    fn ask(&mut self) -> Result<(), SourceError> {
        loop {
            match self.answers.try_recv() {
                Ok((id, _)) if Some(id) == self.pending.map(|p| p.0) => self.pending = None,
                Ok(_) => {}
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    return Err(SourceError::Failed("its thread ended".into()))
                }
            }
        }
        if let Some((_, since)) = self.pending {
            return Err(SourceError::Failed(format!(
                "the read started {:.0?} ago has not returned yet (a hung driver call?); not starting another",
                since.elapsed()
            )));
        }
        self.next += 1;
        self.requests
            .try_send(self.next)
            .map_err(|e| SourceError::Failed(format!("its thread does not take requests: {e}")))?;
        self.pending = Some((self.next, Instant::now()));
        Ok(())
    }

    /// The answer to the request just made, waited for until `deadline`.
    fn collect(&mut self, deadline: Instant) -> Result<Vec<AdapterSensors>, SourceError> {
        let Some((want, _)) = self.pending else {
            return Err(SourceError::Failed("no request pending".into()));
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.answers.recv_timeout(left) {
                Ok((id, answer)) if id == want => {
                    self.pending = None;
                    return answer;
                }
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(SourceError::Failed(format!(
                        "no answer within {SENSOR_TIMEOUT:?}"
                    )))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(SourceError::Failed("its thread ended".into()))
                }
            }
        }
    }

    /// Logs a change of the source's state once.
    fn log(&mut self, outcome: &Result<Vec<AdapterSensors>, SourceError>) {
        let name = self.source.as_str();
        let now = match outcome {
            Ok(_) => Logged::Working,
            Err(SourceError::Absent(_)) => Logged::Absent,
            Err(SourceError::Failed(_)) => Logged::Failing,
        };
        if now == self.logged {
            return;
        }
        match outcome {
            Ok(readings) if self.logged == Logged::Nothing => tracing::info!(
                "GPU sensors from {name}: {} adapter(s) report readings",
                readings.len()
            ),
            Ok(readings) => tracing::info!(
                "GPU sensors from {name} work again: {} adapter(s) report readings",
                readings.len()
            ),
            Err(SourceError::Absent(why)) => tracing::info!(
                "no GPU sensors from {name} on this host: {why}; retried every {STATIC_REFRESH:?}"
            ),
            Err(SourceError::Failed(why)) => tracing::warn!(
                "cannot read GPU sensors from {name}: {why}; the counters are read without them until it answers again"
            ),
        }
        self.logged = now;
    }
}

/// The sensor sources of this machine, each on its own thread.
pub(crate) struct Sensors {
    workers: Mutex<Vec<Worker>>,
}

impl Sensors {
    /// Starts the D3DKMT thread and the NVML one (`nvml` makes its reader, on its thread:
    /// `super::nvml::NvmlReader::new`, which uses this module's D3DKMT calls).
    pub(crate) fn start<N: SensorReader + 'static>(nvml: fn() -> N) -> Self {
        let workers = [
            Worker::spawn(SensorSource::D3dkmt, D3dkmtReader::new),
            Worker::spawn(SensorSource::Nvml, nvml),
        ];
        Sensors {
            workers: Mutex::new(workers.into_iter().flatten().collect()),
        }
    }

    /// Every source's readings, waiting at most [`SENSOR_TIMEOUT`] for all of them; a source
    /// that fails or is late gives none.
    pub(crate) fn read(&self) -> Vec<AdapterSensors> {
        let mut workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        let asked: Vec<Result<(), SourceError>> = workers.iter_mut().map(Worker::ask).collect();
        let deadline = Instant::now() + SENSOR_TIMEOUT;
        let mut out = Vec::new();
        for (worker, asked) in workers.iter_mut().zip(asked) {
            let outcome = asked.and_then(|()| worker.collect(deadline));
            worker.log(&outcome);
            out.extend(outcome.unwrap_or_default());
        }
        out
    }
}

type EnumAdapters2 = unsafe extern "system" fn(*mut D3DKMT_ENUMADAPTERS2) -> i32;
type QueryAdapterInfo = unsafe extern "system" fn(*const D3DKMT_QUERYADAPTERINFO) -> i32;
type CloseAdapter = unsafe extern "system" fn(*const D3DKMT_CLOSEADAPTER) -> i32;

/// `STATUS_BUFFER_TOO_SMALL`: an adapter came between the two enumeration calls.
const STATUS_BUFFER_TOO_SMALL: i32 = 0xC000_0023_u32 as i32;

/// The D3DKMT calls, looked up in `gdi32.dll`.
pub(crate) struct Kmt {
    enumerate: EnumAdapters2,
    query: QueryAdapterInfo,
    close: CloseAdapter,
    // Keeps gdi32.dll loaded while the functions are used; dropped last.
    _library: Library,
}

/// An adapter handle from `D3DKMTEnumAdapters2`, closed on drop.
pub(crate) struct KmtAdapter<'a> {
    kmt: &'a Kmt,
    handle: u32,
    pub(crate) luid: i64,
}

impl Drop for KmtAdapter<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle came from D3DKMTEnumAdapters2 and is closed once.
        let _ = unsafe {
            (self.kmt.close)(&D3DKMT_CLOSEADAPTER {
                hAdapter: self.handle,
            })
        };
    }
}

impl Kmt {
    /// Looks the calls up; `Absent` where `gdi32.dll` lacks them (Wine, Windows before 8).
    pub(crate) fn load() -> Result<Kmt, SourceError> {
        let library = Library::load("gdi32.dll").map_err(|e| SourceError::Absent(e.to_string()))?;
        let symbol = |name: &std::ffi::CStr| {
            library
                .symbol(name)
                .map_err(|e| SourceError::Absent(e.to_string()))
        };
        let (enumerate, query, close) = (
            symbol(c"D3DKMTEnumAdapters2")?,
            symbol(c"D3DKMTQueryAdapterInfo")?,
            symbol(c"D3DKMTCloseAdapter")?,
        );
        // SAFETY: the signatures are those of d3dkmthk.h (NTSTATUS is an i32).
        unsafe {
            Ok(Kmt {
                enumerate: std::mem::transmute::<unsafe extern "system" fn() -> isize, EnumAdapters2>(
                    enumerate,
                ),
                query: std::mem::transmute::<unsafe extern "system" fn() -> isize, QueryAdapterInfo>(
                    query,
                ),
                close: std::mem::transmute::<unsafe extern "system" fn() -> isize, CloseAdapter>(
                    close,
                ),
                _library: library,
            })
        }
    }

    /// Every adapter the graphics kernel lists, opened.
    pub(crate) fn adapters(&self) -> Result<Vec<KmtAdapter<'_>>, WinError> {
        for _ in 0..4 {
            let mut count = D3DKMT_ENUMADAPTERS2::default();
            // SAFETY: a NULL adapter array asks for the count only.
            let status = unsafe { (self.enumerate)(&mut count) };
            if status < 0 {
                return Err(WinError::ntstatus("D3DKMTEnumAdapters2", status));
            }
            if count.NumAdapters == 0 {
                return Ok(Vec::new());
            }
            let mut infos = vec![D3DKMT_ADAPTERINFO::default(); count.NumAdapters as usize];
            let mut list = D3DKMT_ENUMADAPTERS2 {
                NumAdapters: count.NumAdapters,
                pAdapters: infos.as_mut_ptr(),
            };
            // SAFETY: the array holds NumAdapters entries.
            let status = unsafe { (self.enumerate)(&mut list) };
            if status == STATUS_BUFFER_TOO_SMALL {
                continue;
            }
            if status < 0 {
                return Err(WinError::ntstatus("D3DKMTEnumAdapters2", status));
            }
            let filled = (list.NumAdapters as usize).min(infos.len());
            return Ok(infos[..filled]
                .iter()
                .map(|info| KmtAdapter {
                    kmt: self,
                    handle: info.hAdapter,
                    luid: winparse::luid_to_i64(
                        info.AdapterLuid.LowPart,
                        info.AdapterLuid.HighPart,
                    ),
                })
                .collect());
        }
        Err(WinError::other(
            "D3DKMTEnumAdapters2",
            "the adapter list kept growing",
        ))
    }

    /// `D3DKMTQueryAdapterInfo(kind)` into `buf` (8-byte aligned) of which `size` bytes are the
    /// struct; `buf`'s first bytes are the struct's input fields.
    fn query(
        &self,
        adapter: &KmtAdapter<'_>,
        kind: KMTQUERYADAPTERINFOTYPE,
        buf: &mut [u64],
        size: usize,
    ) -> Result<(), i32> {
        debug_assert!(size <= buf.len() * 8);
        let query = D3DKMT_QUERYADAPTERINFO {
            hAdapter: adapter.handle,
            Type: kind,
            pPrivateDriverData: buf.as_mut_ptr().cast(),
            PrivateDriverDataSize: size as u32,
        };
        // SAFETY: the private data is `size` bytes (or more) and 8-byte aligned.
        let status = unsafe { (self.query)(&query) };
        if status < 0 {
            Err(status)
        } else {
            Ok(())
        }
    }

    /// The adapter's PCI bus, device and function (`KMTQAITYPE_ADAPTERADDRESS`).
    pub(crate) fn address(&self, adapter: &KmtAdapter<'_>) -> Option<PciLocation> {
        let mut buf = [0u64; 2];
        let size = std::mem::size_of::<D3DKMT_ADAPTERADDRESS>();
        self.query(adapter, KMTQAITYPE_ADAPTERADDRESS, &mut buf, size)
            .ok()?;
        let b = as_bytes(&buf);
        let at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        // BusNumber, DeviceNumber, FunctionNumber.
        Some(PciLocation {
            bus: at(0),
            device: at(4),
            function: at(8),
        })
    }
}

/// A `u64` buffer as bytes.
fn as_bytes(buf: &[u64]) -> &[u8] {
    // SAFETY: viewing initialised u64s as bytes.
    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), std::mem::size_of_val(buf)) }
}

/// What does not change while an adapter is there: its caps and the engine nodes with a clock
/// domain.
struct AdapterStatics {
    caps: Option<Vec<u8>>,
    nodes: Vec<(u32, &'static str)>,
}

/// The graphics kernel's performance data.
struct D3dkmtReader {
    kmt: Option<Kmt>,
    /// When `gdi32.dll` was last tried, and why it failed.
    load_failed: Option<(Instant, SourceError)>,
    statics: HashMap<i64, AdapterStatics>,
    statics_at: Option<Instant>,
}

impl D3dkmtReader {
    fn new() -> Self {
        D3dkmtReader {
            kmt: None,
            load_failed: None,
            statics: HashMap::new(),
            statics_at: None,
        }
    }

    fn statics(kmt: &Kmt, adapter: &KmtAdapter<'_>) -> AdapterStatics {
        let mut caps = [0u64; perfdata::CAPS_SIZE.div_ceil(8)];
        let caps = kmt
            .query(
                adapter,
                KMTQAITYPE_ADAPTERPERFDATA_CAPS,
                &mut caps,
                perfdata::CAPS_SIZE,
            )
            .ok()
            .map(|()| as_bytes(&caps)[..perfdata::CAPS_SIZE].to_vec());
        let mut nodes = Vec::new();
        for ordinal in 0..MAX_NODES {
            let mut meta = [0u64; perfdata::METADATA_SIZE.div_ceil(8)];
            // NodeOrdinalAndAdapterIndex: the node in the low word, physical adapter 0.
            meta[0] = u64::from(ordinal);
            if kmt
                .query(
                    adapter,
                    KMTQAITYPE_NODEMETADATA,
                    &mut meta,
                    perfdata::METADATA_SIZE,
                )
                .is_err()
            {
                break;
            }
            if let Some(domain) = winparse::node_clock_domain(as_bytes(&meta)) {
                nodes.push((ordinal, domain));
            }
        }
        AdapterStatics { caps, nodes }
    }
}

impl SensorReader for D3dkmtReader {
    fn read(&mut self) -> Result<Vec<AdapterSensors>, SourceError> {
        if self.kmt.is_none() {
            if let Some((at, e)) = &self.load_failed {
                if at.elapsed() < STATIC_REFRESH {
                    return Err(e.clone());
                }
            }
            match Kmt::load() {
                Ok(kmt) => self.kmt = Some(kmt),
                Err(e) => {
                    self.load_failed = Some((Instant::now(), e.clone()));
                    return Err(e);
                }
            }
        }
        let Some(kmt) = &self.kmt else {
            return Ok(Vec::new());
        };
        let adapters = kmt
            .adapters()
            .map_err(|e| SourceError::Failed(e.to_string()))?;
        if self
            .statics_at
            .is_none_or(|at| at.elapsed() >= STATIC_REFRESH)
        {
            self.statics.clear();
            self.statics_at = Some(Instant::now());
        }
        let mut out = Vec::new();
        for adapter in &adapters {
            let statics = self
                .statics
                .entry(adapter.luid)
                .or_insert_with(|| Self::statics(kmt, adapter));
            // PhysicalAdapterIndex 0 (the first field, left at zero).
            let mut perf = [0u64; perfdata::ADAPTER_SIZE / 8];
            let perf = match kmt.query(
                adapter,
                KMTQAITYPE_ADAPTERPERFDATA,
                &mut perf,
                perfdata::ADAPTER_SIZE,
            ) {
                Ok(()) => Some(as_bytes(&perf)[..perfdata::ADAPTER_SIZE].to_vec()),
                Err(status) => {
                    tracing::debug!(
                        "adapter LUID {}: D3DKMTQueryAdapterInfo(ADAPTERPERFDATA) failed: NTSTATUS 0x{:08X}",
                        dxdp_core::luid::label(adapter.luid),
                        status as u32
                    );
                    None
                }
            };
            let mut nodes = Vec::new();
            for &(ordinal, domain) in &statics.nodes {
                let mut node = [0u64; perfdata::NODE_SIZE / 8];
                // NodeOrdinal, then PhysicalAdapterIndex 0.
                node[0] = u64::from(ordinal);
                if kmt
                    .query(
                        adapter,
                        KMTQAITYPE_NODEPERFDATA,
                        &mut node,
                        perfdata::NODE_SIZE,
                    )
                    .is_ok()
                {
                    nodes.push((domain, as_bytes(&node)[..perfdata::NODE_SIZE].to_vec()));
                }
            }
            let nodes: Vec<(&str, &[u8])> = nodes.iter().map(|(d, b)| (*d, b.as_slice())).collect();
            out.extend(winparse::d3dkmt_sensors(
                adapter.luid,
                perf.as_deref(),
                statics.caps.as_deref(),
                &nodes,
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use windows::Wdk::Graphics::Direct3D::{
        D3DKMT_ADAPTER_PERFDATA, D3DKMT_ADAPTER_PERFDATACAPS, D3DKMT_NODEMETADATA,
        D3DKMT_NODE_PERFDATA,
    };

    #[test]
    fn the_recorded_layouts_match_the_windows_structs() {
        use std::mem::{offset_of, size_of};
        assert_eq!(size_of::<D3DKMT_ADAPTER_PERFDATA>(), perfdata::ADAPTER_SIZE);
        assert_eq!(
            offset_of!(D3DKMT_ADAPTER_PERFDATA, MemoryFrequency),
            perfdata::MEMORY_FREQUENCY
        );
        assert_eq!(
            offset_of!(D3DKMT_ADAPTER_PERFDATA, MaxMemoryFrequency),
            perfdata::MAX_MEMORY_FREQUENCY
        );
        assert_eq!(
            offset_of!(D3DKMT_ADAPTER_PERFDATA, FanRPM),
            perfdata::FAN_RPM
        );
        assert_eq!(offset_of!(D3DKMT_ADAPTER_PERFDATA, Power), perfdata::POWER);
        assert_eq!(
            offset_of!(D3DKMT_ADAPTER_PERFDATA, Temperature),
            perfdata::TEMPERATURE
        );
        assert_eq!(
            size_of::<D3DKMT_ADAPTER_PERFDATACAPS>(),
            perfdata::CAPS_SIZE
        );
        assert_eq!(
            offset_of!(D3DKMT_ADAPTER_PERFDATACAPS, TemperatureMax),
            perfdata::TEMPERATURE_MAX
        );
        assert_eq!(
            offset_of!(D3DKMT_ADAPTER_PERFDATACAPS, TemperatureWarning),
            perfdata::TEMPERATURE_WARNING
        );
        assert_eq!(size_of::<D3DKMT_NODE_PERFDATA>(), perfdata::NODE_SIZE);
        assert_eq!(
            offset_of!(D3DKMT_NODE_PERFDATA, Frequency),
            perfdata::NODE_FREQUENCY
        );
        assert_eq!(
            offset_of!(D3DKMT_NODE_PERFDATA, MaxFrequency),
            perfdata::NODE_MAX_FREQUENCY
        );
        assert_eq!(size_of::<D3DKMT_NODEMETADATA>(), perfdata::METADATA_SIZE);
        assert_eq!(size_of::<D3DKMT_ADAPTERADDRESS>(), 12);
    }

    #[test]
    fn sensors_are_read_or_their_absence_is_harmless() {
        // Wine's gdi32.dll has neither D3DKMTEnumAdapters2 nor D3DKMTQueryAdapterInfo and there
        // is no nvml.dll: both sources are absent and a read gives no sensors, without a panic
        // and within the time limit. On Windows, whatever the adapters report, one entry per
        // adapter and source at most, each with a value.
        let sensors = Sensors::start(super::super::nvml::NvmlReader::new);
        for _ in 0..2 {
            let started = Instant::now();
            let readings = sensors.read();
            assert!(
                started.elapsed() < SENSOR_TIMEOUT + Duration::from_secs(1),
                "{:?}",
                started.elapsed()
            );
            let mut seen = std::collections::HashSet::new();
            for r in &readings {
                assert!(seen.insert((r.luid, r.source)), "{readings:?}");
            }
            if readings.is_empty() {
                eprintln!(
                    "no GPU sensor readings on this host (expected under Wine: no D3DKMT performance data, no nvml.dll)"
                );
            }
        }
        let mut kmt = D3dkmtReader::new();
        match kmt.read() {
            Ok(_) => {}
            Err(SourceError::Absent(e)) => assert!(e.contains("D3DKMT"), "{e}"),
            Err(SourceError::Failed(e)) => panic!("{e}"),
        }
    }
}
