//! The Windows GPU performance counters through PDH (`pdh.dll`, loaded at run time): one query
//! with the wildcard counters `\GPU Engine(*)\Running Time`, `\GPU Process Memory(*)\Dedicated
//! Usage` and `Shared Usage`, `\GPU Adapter Memory(*)\Dedicated Usage` and `Shared Usage`, read as
//! raw values. Thin: what PDH's statuses mean (an idle GPU's empty sets are empty, not errors) and
//! the sample's time (PDH's own, from `PdhCollectQueryDataWithTime`) are decided by
//! `crate::backend::winparse::pdh_sample`, the instance names parsed by
//! `dxdp_core::telemetry::instance`, both tested on every target from recorded answers.

use std::sync::Mutex;

use windows::core::PCWSTR;

use dxdp_core::telemetry::TelemetryFacts;

use super::library::Library;
use crate::backend::counters::CounterSource;
use crate::backend::winparse::{
    self, pdh_array_status, pdh_error, wide, PdhAnswer, PdhArrayStatus, PdhCounterAnswer,
    PdhRawItem,
};

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
type CollectQueryDataWithTime = unsafe extern "system" fn(isize, *mut i64) -> u32;
type GetRawCounterArray =
    unsafe extern "system" fn(isize, *mut u32, *mut u32, *mut RawCounterItem) -> u32;
type CloseQuery = unsafe extern "system" fn(isize) -> u32;

struct Functions {
    collect: CollectQueryDataWithTime,
    raw_array: GetRawCounterArray,
    close: CloseQuery,
}

struct Query {
    functions: Functions,
    query: isize,
    counters: Vec<isize>,
    /// The time of the last sample (see [`winparse::pdh_sample`]).
    last_time: Option<u64>,
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
pub(crate) struct PdhSource {
    query: Mutex<Query>,
}

// SAFETY: the PDH query handle is only used under the mutex, one call at a time; PDH handles may
// be used from any thread.
unsafe impl Send for PdhSource {}
// SAFETY: as above.
unsafe impl Sync for PdhSource {}

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
    pub(crate) fn open() -> Result<Self, String> {
        let library = Library::load("pdh.dll").map_err(|e| e.to_string())?;
        let symbol = |name: &std::ffi::CStr| library.symbol(name).map_err(|e| e.to_string());
        // SAFETY: the signatures are those of pdh.h.
        let (open, add, functions) = unsafe {
            (
                cast::<OpenQuery>(symbol(c"PdhOpenQueryW")?),
                cast::<AddEnglishCounter>(symbol(c"PdhAddEnglishCounterW")?),
                Functions {
                    collect: cast::<CollectQueryDataWithTime>(symbol(
                        c"PdhCollectQueryDataWithTime",
                    )?),
                    raw_array: cast::<GetRawCounterArray>(symbol(c"PdhGetRawCounterArrayW")?),
                    close: cast::<CloseQuery>(symbol(c"PdhCloseQuery")?),
                },
            )
        };
        let mut handle = 0isize;
        // SAFETY: a null data source means live data; the out pointer is valid.
        let rc = unsafe { open(PCWSTR::null(), 0, &mut handle) };
        if rc != 0 {
            return Err(pdh_error("PdhOpenQueryW", rc));
        }
        let mut query = Query {
            functions,
            query: handle,
            counters: Vec::new(),
            last_time: None,
            _library: library,
        };
        for path in COUNTERS {
            let wide_path = wide(path);
            let mut counter = 0isize;
            // SAFETY: the query is open, the path is NUL-terminated UTF-16 outliving the call.
            let rc = unsafe { add(query.query, PCWSTR(wide_path.as_ptr()), 0, &mut counter) };
            if rc != 0 {
                return Err(pdh_error(&format!("PdhAddEnglishCounterW({path})"), rc));
            }
            query.counters.push(counter);
        }
        // An idle GPU's empty sets may answer PDH_NO_DATA here: no reason to turn telemetry off.
        let mut time = 0i64;
        // SAFETY: the query is open; the out pointer is valid.
        let rc = unsafe { (query.functions.collect)(query.query, &mut time) };
        winparse::pdh_collect_status(rc)?;
        Ok(PdhSource {
            query: Mutex::new(query),
        })
    }
}

/// One counter's answer as PDH gives it (the decision what it means is `winparse`'s).
fn raw_answer(q: &Query, counter: isize) -> PdhCounterAnswer {
    // The set can grow between asking for the size and reading: ask again (bounded).
    let mut answer = PdhCounterAnswer::status(0);
    for _ in 0..5 {
        let mut size = 0u32;
        let mut count = 0u32;
        // SAFETY: asking for the size with a null buffer.
        let rc = unsafe {
            (q.functions.raw_array)(counter, &mut size, &mut count, std::ptr::null_mut())
        };
        if pdh_array_status(rc) != PdhArrayStatus::Items {
            return PdhCounterAnswer::status(rc);
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
        answer = PdhCounterAnswer {
            status: winparse::pdh_status::MORE_DATA,
            read_status: rc,
            items: Vec::new(),
        };
        if rc == winparse::pdh_status::MORE_DATA {
            continue;
        }
        if rc != 0 {
            return answer;
        }
        for it in buffer.iter().take((count as usize).min(buffer.len())) {
            if it.name.is_null() {
                continue;
            }
            // SAFETY: PDH wrote a NUL-terminated name inside the buffer, which is still alive.
            let instance = unsafe { PCWSTR(it.name).to_string() }.unwrap_or_default();
            answer.items.push(PdhRawItem {
                instance,
                status: it.raw.status,
                time_stamp: u64::from(it.raw.time_stamp[0])
                    | (u64::from(it.raw.time_stamp[1]) << 32),
                value: it.raw.first_value,
            });
        }
        return answer;
    }
    answer
}

impl CounterSource for PdhSource {
    fn describe(&self) -> String {
        "the GPU performance counters (PDH)".into()
    }

    fn read(&self) -> Result<TelemetryFacts, String> {
        let mut q = self.query.lock().unwrap_or_else(|p| p.into_inner());
        let mut time = 0i64;
        // SAFETY: the query is open; the out pointer is valid.
        let rc = unsafe { (q.functions.collect)(q.query, &mut time) };
        winparse::pdh_collect_status(rc)?;
        let answer = PdhAnswer {
            collect_status: rc,
            collect_time: time,
            counters: q.counters.iter().map(|&c| raw_answer(&q, c)).collect(),
        };
        let sample = winparse::pdh_sample(&answer, q.last_time)?;
        if let Some(s) = &sample {
            q.last_time = Some(s.time100ns);
        }
        Ok(TelemetryFacts {
            samples: sample.into_iter().collect(),
            ..TelemetryFacts::default()
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_gpu_counters_are_read_or_their_absence_is_explained() {
        // Wine has pdh.dll but no GPU counter sets: the open fails naming PDH and the call, and
        // the sampler then reports telemetry off. On Windows the counters are read: on a GPU node
        // with instances, on a machine where no process uses a GPU (a CI runner) as empty sets.
        match super::PdhSource::open() {
            Ok(source) => {
                let facts = crate::backend::counters::CounterSource::read(&source)
                    .unwrap_or_else(|e| panic!("the GPU counters exist but cannot be read: {e}"));
                assert!(facts.samples.len() <= 1, "{:?}", facts.samples);
                if facts.samples.iter().all(|s| s.engines.is_empty()) {
                    eprintln!(
                        "the_gpu_counters_are_read_or_their_absence_is_explained: no GPU engine instance here (no process uses a GPU), read as an empty set"
                    );
                }
            }
            Err(e) => {
                assert!(e.contains("PDH") || e.contains("pdh.dll"), "{e}");
                eprintln!(
                    "skipped the_gpu_counters_are_read_or_their_absence_is_explained: no GPU counters here ({e})"
                );
            }
        }
    }
}
