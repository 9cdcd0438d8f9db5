//! NVIDIA's management library, loaded at run time (never linked): `nvml.dll` from System32,
//! else from `%ProgramFiles%\NVIDIA Corporation\NVSMI`. Initialised once (`nvmlInit_v2`) on the
//! NVML sensor thread ([`super::sensors`]) and shut down (`nvmlShutdown`) when that thread ends.
//! Each NVML device is matched to its adapter LUID through its PCI location
//! (`nvmlDeviceGetPciInfo_v3`) and the graphics kernel's `KMTQAITYPE_ADAPTERADDRESS`; the match,
//! the temperature thresholds and the maximum clocks are read again every
//! [`STATIC_REFRESH`]. What NVML answers is turned into readings by
//! `crate::backend::winparse::nvml_sensors`, tested on every target. NVML has no events on
//! Windows: it is polled with the counters.

use std::ffi::{c_void, CStr};
use std::path::PathBuf;
use std::time::Instant;

use super::library::Library;
use super::sensors::{Kmt, SensorReader, SourceError, STATIC_REFRESH};
use crate::backend::winparse::{self, nvml_pci, NvmlReadings, NVML_CLOCKS};
use dxdp_core::telemetry::sensors::AdapterSensors;

type Device = *mut c_void;
type Init = unsafe extern "C" fn() -> i32;
type Count = unsafe extern "C" fn(*mut u32) -> i32;
type HandleByIndex = unsafe extern "C" fn(u32, *mut Device) -> i32;
type PciInfo = unsafe extern "C" fn(Device, *mut u32) -> i32;
/// `(device, type, *value)`: temperature, its thresholds, clocks.
type ByType = unsafe extern "C" fn(Device, u32, *mut u32) -> i32;
/// `(device, *value)`: power and its limit.
type Value = unsafe extern "C" fn(Device, *mut u32) -> i32;
type Reasons = unsafe extern "C" fn(Device, *mut u64) -> i32;
/// `nvmlDeviceGetFanSpeedRPM(device, nvmlFanSpeedInfo_t*)`.
type FanRpm = unsafe extern "C" fn(Device, *mut FanSpeedInfo) -> i32;

/// `nvmlFanSpeedInfo_v1_t`.
#[repr(C)]
#[derive(Default)]
struct FanSpeedInfo {
    version: u32,
    fan: u32,
    speed: u32,
}

/// `nvmlFanSpeedInfo_v1`: `sizeof(nvmlFanSpeedInfo_v1_t) | 1 << 24`.
const FAN_SPEED_INFO_V1: u32 = 12 | (1 << 24);
/// `NVML_TEMPERATURE_GPU`.
const TEMPERATURE_GPU: u32 = 0;
/// `NVML_TEMPERATURE_THRESHOLD_SHUTDOWN`.
const THRESHOLD_SHUTDOWN: u32 = 0;
/// `NVML_TEMPERATURE_THRESHOLD_SLOWDOWN`.
const THRESHOLD_SLOWDOWN: u32 = 1;
/// `NVML_SUCCESS`.
const SUCCESS: i32 = 0;

/// Transmutes an export to its signature.
///
/// # Safety
/// `T` must be the export's real signature (a C function pointer).
unsafe fn cast<T: Copy>(f: unsafe extern "system" fn() -> isize) -> T {
    // SAFETY: the caller names the real signature; fn pointers have the same size (and on
    // x86-64 Windows "C" and "system" are the same convention).
    unsafe { std::mem::transmute_copy(&f) }
}

/// The NVML functions dxdp uses; the optional ones are `None` where this driver's NVML does not
/// export them.
struct Nvml {
    shutdown: Init,
    count: Count,
    handle: HandleByIndex,
    pci: PciInfo,
    temperature: Option<ByType>,
    threshold: Option<ByType>,
    clock: Option<ByType>,
    max_clock: Option<ByType>,
    power: Option<Value>,
    power_limit: Option<Value>,
    reasons: Option<Reasons>,
    fan_rpm: Option<FanRpm>,
    // Keeps nvml.dll loaded while the functions are used; dropped last.
    _library: Library,
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: nvmlInit_v2 succeeded for this value; one shutdown per init.
        let _ = unsafe { (self.shutdown)() };
    }
}

/// Where NVIDIA's installer puts NVML when it is not in System32.
fn nvsmi_path() -> Option<PathBuf> {
    let base = std::env::var_os("ProgramFiles")?;
    Some(
        PathBuf::from(base)
            .join("NVIDIA Corporation")
            .join("NVSMI")
            .join("nvml.dll"),
    )
}

impl Nvml {
    /// Loads and initialises NVML.
    fn open() -> Result<Nvml, SourceError> {
        let library = match Library::load("nvml.dll") {
            Ok(library) => library,
            Err(system32) => match nvsmi_path().filter(|p| p.is_file()) {
                Some(path) => Library::load_from(&path, "nvml.dll")
                    .map_err(|e| SourceError::Failed(e.to_string()))?,
                None => {
                    return Err(SourceError::Absent(format!(
                        "no nvml.dll in System32 ({system32}) nor in %ProgramFiles%\\NVIDIA Corporation\\NVSMI (not an NVIDIA driver?)"
                    )))
                }
            },
        };
        let required = |name: &CStr| {
            library
                .symbol(name)
                .map_err(|e| SourceError::Failed(e.to_string()))
        };
        let optional = |name: &CStr| library.symbol(name).ok();
        // SAFETY: the signatures are those of nvml.h.
        let init: Init = unsafe { cast(required(c"nvmlInit_v2")?) };
        let shutdown: Init = unsafe { cast(required(c"nvmlShutdown")?) };
        let count: Count = unsafe { cast(required(c"nvmlDeviceGetCount_v2")?) };
        let handle: HandleByIndex = unsafe { cast(required(c"nvmlDeviceGetHandleByIndex_v2")?) };
        let pci = match optional(c"nvmlDeviceGetPciInfo_v3") {
            Some(f) => f,
            None => required(c"nvmlDeviceGetPciInfo_v2")?,
        };
        let reasons = optional(c"nvmlDeviceGetCurrentClocksEventReasons")
            .or_else(|| optional(c"nvmlDeviceGetCurrentClocksThrottleReasons"));
        // SAFETY: nvmlInit_v2 takes nothing; it may be called from any thread.
        let status = unsafe { init() };
        if status != SUCCESS {
            return Err(SourceError::Failed(format!(
                "nvmlInit_v2 returned nvmlReturn_t {status} (is the NVIDIA driver loaded?)"
            )));
        }
        // SAFETY: the signatures are those of nvml.h.
        unsafe {
            Ok(Nvml {
                shutdown,
                count,
                handle,
                pci: cast(pci),
                temperature: optional(c"nvmlDeviceGetTemperature").map(|f| cast(f)),
                threshold: optional(c"nvmlDeviceGetTemperatureThreshold").map(|f| cast(f)),
                clock: optional(c"nvmlDeviceGetClockInfo").map(|f| cast(f)),
                max_clock: optional(c"nvmlDeviceGetMaxClockInfo").map(|f| cast(f)),
                power: optional(c"nvmlDeviceGetPowerUsage").map(|f| cast(f)),
                power_limit: optional(c"nvmlDeviceGetEnforcedPowerLimit").map(|f| cast(f)),
                reasons: reasons.map(|f| cast(f)),
                fan_rpm: optional(c"nvmlDeviceGetFanSpeedRPM").map(|f| cast(f)),
                _library: library,
            })
        }
    }

    fn by_type(&self, f: Option<ByType>, device: Device, kind: u32) -> Option<u32> {
        let f = f?;
        let mut value = 0u32;
        // SAFETY: a device handle from nvmlDeviceGetHandleByIndex_v2, a valid out pointer.
        (unsafe { f(device, kind, &mut value) } == SUCCESS).then_some(value)
    }

    fn value(&self, f: Option<Value>, device: Device) -> Option<u32> {
        let f = f?;
        let mut value = 0u32;
        // SAFETY: as above.
        (unsafe { f(device, &mut value) } == SUCCESS).then_some(value)
    }

    /// Every device's handle and PCI location (`None` where NVML gave none).
    fn devices(&self) -> Result<Vec<(Device, Option<dxdp_core::facts::PciLocation>)>, String> {
        let mut count = 0u32;
        // SAFETY: valid out pointer.
        let status = unsafe { (self.count)(&mut count) };
        if status != SUCCESS {
            return Err(format!(
                "nvmlDeviceGetCount_v2 returned nvmlReturn_t {status}"
            ));
        }
        let mut out = Vec::new();
        for index in 0..count {
            let mut device: Device = std::ptr::null_mut();
            // SAFETY: index < count, valid out pointer.
            if unsafe { (self.handle)(index, &mut device) } != SUCCESS {
                tracing::debug!("nvmlDeviceGetHandleByIndex_v2({index}) failed");
                continue;
            }
            let mut info = [0u32; nvml_pci::SIZE / 4];
            // SAFETY: the buffer is sizeof(nvmlPciInfo_t) bytes, 4-byte aligned.
            let location = (unsafe { (self.pci)(device, info.as_mut_ptr()) } == SUCCESS)
                .then(|| {
                    // SAFETY: viewing the initialised u32s as bytes.
                    let bytes = unsafe {
                        std::slice::from_raw_parts(info.as_ptr().cast::<u8>(), nvml_pci::SIZE)
                    };
                    winparse::nvml_pci_location(bytes).map(|(_, at)| at)
                })
                .flatten();
            out.push((device, location));
        }
        Ok(out)
    }
}

/// An NVML device matched to an adapter, with its static values.
struct Matched {
    device: Device,
    luid: i64,
    slowdown_c: Option<u32>,
    shutdown_c: Option<u32>,
    max_mhz: [Option<u32>; 4],
}

/// The NVML sensor source.
pub(crate) struct NvmlReader {
    nvml: Option<Nvml>,
    /// When NVML was last tried, and why it failed.
    open_failed: Option<(Instant, SourceError)>,
    devices: Vec<Matched>,
    devices_at: Option<Instant>,
    /// Why the last match failed (kept until the next one).
    match_error: Option<SourceError>,
}

impl NvmlReader {
    pub(crate) fn new() -> Self {
        NvmlReader {
            nvml: None,
            open_failed: None,
            devices: Vec::new(),
            devices_at: None,
            match_error: None,
        }
    }

    /// The devices matched to adapter LUIDs, with their thresholds and maximum clocks.
    fn match_devices(nvml: &Nvml) -> Result<Vec<Matched>, SourceError> {
        let devices = nvml.devices().map_err(SourceError::Failed)?;
        if devices.is_empty() {
            return Ok(Vec::new());
        }
        let kmt = Kmt::load().map_err(|e| {
            SourceError::Failed(format!(
                "cannot match NVML's devices to adapters without the graphics kernel's adapter addresses: {e:?}"
            ))
        })?;
        let adapters = kmt
            .adapters()
            .map_err(|e| SourceError::Failed(e.to_string()))?;
        let addresses: Vec<(i64, dxdp_core::facts::PciLocation)> = adapters
            .iter()
            .filter_map(|a| Some((a.luid, kmt.address(a)?)))
            .collect();
        let locations: Vec<_> = devices.iter().map(|(_, at)| *at).collect();
        let luids = winparse::nvml_luids(&locations, &addresses);
        let mut out = Vec::new();
        for ((device, at), luid) in devices.into_iter().zip(luids) {
            let Some(luid) = luid else {
                tracing::debug!(
                    "NVML device at PCI {at:?} matches no single adapter: no NVML readings for it"
                );
                continue;
            };
            let mut max_mhz = [None; 4];
            for (slot, (kind, _)) in max_mhz.iter_mut().zip(NVML_CLOCKS) {
                *slot = nvml.by_type(nvml.max_clock, device, kind);
            }
            out.push(Matched {
                device,
                luid,
                slowdown_c: nvml.by_type(nvml.threshold, device, THRESHOLD_SLOWDOWN),
                shutdown_c: nvml.by_type(nvml.threshold, device, THRESHOLD_SHUTDOWN),
                max_mhz,
            });
        }
        Ok(out)
    }
}

impl SensorReader for NvmlReader {
    fn read(&mut self) -> Result<Vec<AdapterSensors>, SourceError> {
        if self.nvml.is_none() {
            if let Some((at, e)) = &self.open_failed {
                if at.elapsed() < STATIC_REFRESH {
                    return Err(e.clone());
                }
            }
            match Nvml::open() {
                Ok(nvml) => {
                    self.nvml = Some(nvml);
                    self.open_failed = None;
                }
                Err(e) => {
                    self.open_failed = Some((Instant::now(), e.clone()));
                    return Err(e);
                }
            }
        }
        let Some(nvml) = &self.nvml else {
            return Ok(Vec::new());
        };
        if self
            .devices_at
            .is_none_or(|at| at.elapsed() >= STATIC_REFRESH)
        {
            self.devices_at = Some(Instant::now());
            match Self::match_devices(nvml) {
                Ok(devices) => {
                    self.devices = devices;
                    self.match_error = None;
                }
                Err(e) => {
                    self.devices.clear();
                    self.match_error = Some(e);
                }
            }
        }
        if let Some(e) = &self.match_error {
            return Err(e.clone());
        }
        let mut out = Vec::new();
        for d in &self.devices {
            let mut clocks_mhz = [(None, None); 4];
            for ((slot, (kind, _)), max) in clocks_mhz.iter_mut().zip(NVML_CLOCKS).zip(d.max_mhz) {
                *slot = (nvml.by_type(nvml.clock, d.device, kind), max);
            }
            let clock_event_reasons = nvml.reasons.and_then(|f| {
                let mut bits = 0u64;
                // SAFETY: a device handle from NVML, a valid out pointer.
                (unsafe { f(d.device, &mut bits) } == SUCCESS).then_some(bits)
            });
            let fan_rpm = nvml.fan_rpm.and_then(|f| {
                let mut info = FanSpeedInfo {
                    version: FAN_SPEED_INFO_V1,
                    ..FanSpeedInfo::default()
                };
                // SAFETY: a versioned nvmlFanSpeedInfo_v1_t for fan 0.
                (unsafe { f(d.device, &mut info) } == SUCCESS).then_some(info.speed)
            });
            let readings = NvmlReadings {
                temperature_c: nvml.by_type(nvml.temperature, d.device, TEMPERATURE_GPU),
                slowdown_c: d.slowdown_c,
                shutdown_c: d.shutdown_c,
                power_mw: nvml.value(nvml.power, d.device),
                power_limit_mw: nvml.value(nvml.power_limit, d.device),
                clocks_mhz,
                clock_event_reasons,
                fan_rpm,
            };
            out.extend(winparse::nvml_sensors(d.luid, &readings));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_is_read_or_its_absence_is_said() {
        // Wine has no nvml.dll: absent, naming it. On Windows with an NVIDIA driver, one reading
        // per matched device at most.
        let mut reader = NvmlReader::new();
        match reader.read() {
            Ok(readings) => {
                let luids: std::collections::HashSet<i64> =
                    readings.iter().map(|r| r.luid).collect();
                assert_eq!(luids.len(), readings.len(), "{readings:?}");
            }
            Err(SourceError::Absent(e)) => {
                assert!(e.contains("nvml.dll"), "{e}");
                eprintln!("no NVML readings on this host: {e}");
            }
            Err(SourceError::Failed(e)) => eprintln!("NVML is there and failed: {e}"),
        }
        // Asked again within the retry period: the same answer, without loading again.
        let again = reader.read();
        if let Err(SourceError::Absent(e)) = again {
            assert!(e.contains("nvml.dll"), "{e}");
        }
    }

    #[test]
    fn the_fan_speed_struct_is_versioned_by_its_size() {
        assert_eq!(std::mem::size_of::<FanSpeedInfo>(), 12);
        assert_eq!(FAN_SPEED_INFO_V1, 0x0100_000C);
    }
}
