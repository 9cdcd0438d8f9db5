//! The Windows GPU performance counters through PDH (`pdh.dll`, loaded at run time): one query
//! with the wildcard counters `\GPU Engine(*)\Running Time`, `\GPU Process Memory(*)\Dedicated
//! Usage` and `Shared Usage`, `\GPU Adapter Memory(*)\Dedicated Usage` and `Shared Usage`, read as
//! raw values. Thin: the instance names are parsed by `dxdp_core::telemetry::instance` and the
//! values merged by `crate::backend::counters::memory_counters`, both tested on every target.

use std::sync::Mutex;

use windows::core::PCWSTR;

use dxdp_core::telemetry::{CounterSample, EngineCounter, TelemetryFacts};

use super::library::Library;
use crate::backend::counters::{memory_counters, CounterSource};
use crate::backend::winparse::wide;

/// `PDH_MORE_DATA`: the buffer is too small.
const PDH_MORE_DATA: u32 = 0x8000_07D2;
/// `PDH_CSTATUS_VALID_DATA` and `PDH_CSTATUS_NEW_DATA`: a counter value is usable.
const PDH_CSTATUS_VALID_DATA: u32 = 0;
const PDH_CSTATUS_NEW_DATA: u32 = 1;

/// The counters read, in this order.
const COUNTERS: [&str; 5] = [
    r"\GPU Engine(*)\Running Time",
    r"\GPU Process Memory(*)\Dedicated Usage",
    r"\GPU Process Memory(*)\Shared Usage",
    r"\GPU Adapter Memory(*)\Dedicated Usage",
    r"\GPU Adapter Memory(*)\Shared Usage",
];

/// `PDH_RAW_COUNTER` (every field is part of the C layout, even those dxdp does not read).
#[allow(dead_code)]
#[repr(C)]
#[derive(Clone, Copy)]
struct RawCounter {
    status: u32,
    time_stamp: [u32; 2],
    first_value: i64,
    second_value: i64,
    multi_count: u32,
}

/// `PDH_RAW_COUNTER_ITEM_W`.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawCounterItem {
    name: *const u16,
    raw: RawCounter,
}

type OpenQuery = unsafe extern "system" fn(PCWSTR, usize, *mut isize) -> u32;
type AddEnglishCounter = unsafe extern "system" fn(isize, PCWSTR, usize, *mut isize) -> u32;
type CollectQueryData = unsafe extern "system" fn(isize) -> u32;
type GetRawCounterArray =
    unsafe extern "system" fn(isize, *mut u32, *mut u32, *mut RawCounterItem) -> u32;
type CloseQuery = unsafe extern "system" fn(isize) -> u32;

struct Functions {
    collect: CollectQueryData,
    raw_array: GetRawCounterArray,
    close: CloseQuery,
}

struct Query {
    functions: Functions,
    query: isize,
    counters: Vec<isize>,
    // Keeps pdh.dll loaded while the functions are used; dropped last.
    _library: Library,
}

impl Drop for Query {
    fn drop(&mut self) {
        // SAFETY: the query was opened by PdhOpenQueryW and is closed once.
        let _ = unsafe { (self.functions.close)(self.query) };
    }
}

/// The GPU counters of this machine.
pub struct PdhSource {
    query: Mutex<Query>,
}

// SAFETY: the PDH query handle is only used under the mutex, one call at a time; PDH handles may
// be used from any thread.
unsafe impl Send for PdhSource {}
// SAFETY: as above.
unsafe impl Sync for PdhSource {}

fn status(api: &str, code: u32) -> String {
    let hint = match code {
        0xC000_0BB8 | 0xC000_0BB9 => {
            " (the GPU performance counters do not exist here: they come with Windows 10 1709 / Server 2019 and a WDDM 2.4 or later driver)"
        }
        _ => "",
    };
    format!("PDH {api}: status 0x{code:08X}{hint}")
}

/// Transmutes an export to its signature.
///
/// # Safety
/// `T` must be the export's real signature.
unsafe fn cast<T: Copy>(f: unsafe extern "system" fn() -> isize) -> T {
    // SAFETY: the caller names the real signature; fn pointers have the same size.
    unsafe { std::mem::transmute_copy(&f) }
}

impl PdhSource {
    /// Loads `pdh.dll`, opens a query with the GPU counters and reads them once (the first read of
    /// a query gives no values). Fails, naming the call and status, where the counters do not
    /// exist.
    pub fn open() -> Result<Self, String> {
        let library = Library::load("pdh.dll").map_err(|e| e.to_string())?;
        let symbol = |name: &std::ffi::CStr| library.symbol(name).map_err(|e| e.to_string());
        // SAFETY: the signatures are those of pdh.h.
        let (open, add, functions) = unsafe {
            (
                cast::<OpenQuery>(symbol(c"PdhOpenQueryW")?),
                cast::<AddEnglishCounter>(symbol(c"PdhAddEnglishCounterW")?),
                Functions {
                    collect: cast::<CollectQueryData>(symbol(c"PdhCollectQueryData")?),
                    raw_array: cast::<GetRawCounterArray>(symbol(c"PdhGetRawCounterArrayW")?),
                    close: cast::<CloseQuery>(symbol(c"PdhCloseQuery")?),
                },
            )
        };
        let mut handle = 0isize;
        // SAFETY: a null data source means live data; the out pointer is valid.
        let rc = unsafe { open(PCWSTR::null(), 0, &mut handle) };
        if rc != 0 {
            return Err(status("PdhOpenQueryW", rc));
        }
        let mut query = Query {
            functions,
            query: handle,
            counters: Vec::new(),
            _library: library,
        };
        for path in COUNTERS {
            let wide_path = wide(path);
            let mut counter = 0isize;
            // SAFETY: the query is open, the path is NUL-terminated UTF-16 outliving the call.
            let rc = unsafe { add(query.query, PCWSTR(wide_path.as_ptr()), 0, &mut counter) };
            if rc != 0 {
                return Err(status(&format!("PdhAddEnglishCounterW({path})"), rc));
            }
            query.counters.push(counter);
        }
        // SAFETY: the query is open.
        let rc = unsafe { (query.functions.collect)(query.query) };
        if rc != 0 {
            return Err(status("PdhCollectQueryData", rc));
        }
        Ok(PdhSource {
            query: Mutex::new(query),
        })
    }
}

/// Every instance of a counter with its raw first value.
fn raw_values(q: &Query, counter: isize) -> Result<Vec<(String, i64)>, String> {
    let mut size = 0u32;
    let mut count = 0u32;
    // SAFETY: asking for the size with a null buffer.
    let rc =
        unsafe { (q.functions.raw_array)(counter, &mut size, &mut count, std::ptr::null_mut()) };
    if rc != PDH_MORE_DATA {
        return if rc == 0 {
            Ok(Vec::new())
        } else {
            Err(status("PdhGetRawCounterArrayW", rc))
        };
    }
    // The buffer holds the items followed by their names; allocate it as items for alignment.
    let item = std::mem::size_of::<RawCounterItem>();
    let mut buffer = vec![
        RawCounterItem {
            name: std::ptr::null(),
            raw: RawCounter {
                status: 0,
                time_stamp: [0, 0],
                first_value: 0,
                second_value: 0,
                multi_count: 0,
            },
        };
        (size as usize).div_ceil(item).max(1)
    ];
    let mut size = (buffer.len() * item) as u32;
    // SAFETY: the buffer has `size` bytes and is aligned for the items.
    let rc =
        unsafe { (q.functions.raw_array)(counter, &mut size, &mut count, buffer.as_mut_ptr()) };
    if rc != 0 {
        return Err(status("PdhGetRawCounterArrayW", rc));
    }
    let mut out = Vec::with_capacity(count as usize);
    for it in buffer.iter().take((count as usize).min(buffer.len())) {
        if it.name.is_null()
            || !matches!(it.raw.status, PDH_CSTATUS_VALID_DATA | PDH_CSTATUS_NEW_DATA)
        {
            continue;
        }
        // SAFETY: PDH wrote a NUL-terminated name inside the buffer, which is still alive.
        let name = unsafe { PCWSTR(it.name).to_string() }.unwrap_or_default();
        out.push((name, it.raw.first_value));
    }
    Ok(out)
}

/// Now as a FILETIME (100 ns units since 1601).
fn now_100ns() -> u64 {
    const UNIX_TO_1601: u64 = 11_644_473_600;
    let since_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (since_unix.as_secs() + UNIX_TO_1601) * 10_000_000 + u64::from(since_unix.subsec_nanos() / 100)
}

impl CounterSource for PdhSource {
    fn describe(&self) -> String {
        "the GPU performance counters (PDH)".into()
    }

    fn read(&self) -> Result<TelemetryFacts, String> {
        let q = self.query.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the query is open.
        let rc = unsafe { (q.functions.collect)(q.query) };
        let time100ns = now_100ns();
        if rc != 0 {
            return Err(status("PdhCollectQueryData", rc));
        }
        let mut values = Vec::with_capacity(COUNTERS.len());
        for &c in &q.counters {
            values.push(raw_values(&q, c)?);
        }
        let positive = |v: i64| u64::try_from(v).unwrap_or(0);
        let engines = values[0]
            .iter()
            .map(|(instance, v)| EngineCounter {
                instance: instance.clone(),
                running_time: positive(*v),
            })
            .collect();
        let as_u64 = |list: &[(String, i64)]| -> Vec<(String, u64)> {
            list.iter()
                .map(|(n, v)| (n.clone(), positive(*v)))
                .collect()
        };
        Ok(TelemetryFacts {
            samples: vec![CounterSample {
                time100ns,
                engines,
                process_memory: memory_counters(&as_u64(&values[1]), &as_u64(&values[2])),
                adapter_memory: memory_counters(&as_u64(&values[3]), &as_u64(&values[4])),
            }],
            ..TelemetryFacts::default()
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_gpu_counters_are_read_or_their_absence_is_explained() {
        // Wine has pdh.dll but no GPU counter sets: the open fails naming PDH and the call, and
        // the sampler then reports telemetry off. On a Windows GPU node it reads a sample.
        match super::PdhSource::open() {
            Ok(source) => {
                let facts = crate::backend::counters::CounterSource::read(&source).expect("a read");
                assert_eq!(facts.samples.len(), 1);
            }
            Err(e) => assert!(e.contains("PDH") || e.contains("pdh.dll"), "{e}"),
        }
    }
}
