//! The Windows event log (`wevtapi.dll`): a push subscription (`EvtSubscribe` with a callback)
//! and a one-off query (`EvtQuery`, `EvtNext`), each record rendered with
//! `EvtRender(EvtRenderEventXml)` and handed on as text. Thin: what is asked for and what the
//! text means is decided by the pure parts (`dxdp_core::health::feed`, `health::eventlog`).
//!
//! One subscription at a time per process: the callback hands records to the current queue,
//! kept in a static, so a late callback after the subscription is closed finds no queue (or the
//! next one, whose log drops what it already has) and never a freed one.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use windows::core::{HSTRING, PCWSTR};
use windows::Win32::Foundation::{ERROR_INSUFFICIENT_BUFFER, ERROR_NO_MORE_ITEMS};
use windows::Win32::System::EventLog::{
    EvtClose, EvtNext, EvtQuery, EvtQueryChannelPath, EvtQueryReverseDirection,
    EvtQueryTolerateQueryErrors, EvtRender, EvtRenderEventXml, EvtSubscribe,
    EvtSubscribeActionDeliver, EvtSubscribeStartAtOldestRecord, EvtSubscribeTolerateQueryErrors,
    EVT_HANDLE, EVT_SUBSCRIBE_NOTIFY_ACTION,
};

use super::error::WinError;
use crate::backend::eventlog::{Delivery, EventLog, Queue, Subscription};
use dxdp_core::health::feed::MAX_RECORD_BYTES;

/// The queue of the current subscription.
static SINK: Mutex<Option<Arc<Queue>>> = Mutex::new(None);

/// How long one `EvtNext` of a query may wait for records.
const NEXT_TIMEOUT_MS: u32 = 5_000;

/// Renders one record as XML; a record larger than [`MAX_RECORD_BYTES`] is an error (its
/// text is not read).
fn render(event: EVT_HANDLE) -> Result<String, WinError> {
    let (mut used, mut count) = (0u32, 0u32);
    // SAFETY: a size query (no buffer); `event` is valid for the duration of the call.
    let sized = unsafe {
        EvtRender(
            None,
            event,
            EvtRenderEventXml.0,
            0,
            None,
            &mut used,
            &mut count,
        )
    };
    match sized {
        Ok(()) => return Ok(String::new()),
        Err(e) if e.code() == ERROR_INSUFFICIENT_BUFFER.to_hresult() => {}
        Err(e) => return Err(WinError::hresult("EvtRender(EvtRenderEventXml)", &e)),
    }
    // `used` is in bytes of UTF-16; UTF-8 is at most 1.5 times that.
    if used as usize > MAX_RECORD_BYTES * 2 {
        return Err(WinError::other(
            "EvtRender(EvtRenderEventXml)",
            format!(
                "a record of {used} bytes is larger than the {} KiB dxdp reads",
                MAX_RECORD_BYTES >> 10
            ),
        ));
    }
    let mut buf = vec![0u16; (used as usize).div_ceil(2) + 1];
    // SAFETY: the buffer holds `buf.len() * 2` bytes.
    unsafe {
        EvtRender(
            None,
            event,
            EvtRenderEventXml.0,
            (buf.len() * 2) as u32,
            Some(buf.as_mut_ptr().cast()),
            &mut used,
            &mut count,
        )
    }
    .map_err(|e| WinError::hresult("EvtRender(EvtRenderEventXml)", &e))?;
    let units = (used as usize / 2).min(buf.len());
    let end = buf[..units].iter().position(|&c| c == 0).unwrap_or(units);
    Ok(String::from_utf16_lossy(&buf[..end]))
}

unsafe extern "system" fn on_event(
    action: EVT_SUBSCRIBE_NOTIFY_ACTION,
    _context: *const c_void,
    event: EVT_HANDLE,
) -> u32 {
    // Clone out of the lock: rendering must not hold it.
    let Some(queue) = SINK.lock().ok().and_then(|s| s.clone()) else {
        return 0;
    };
    let delivery = if action == EvtSubscribeActionDeliver {
        match render(event) {
            Ok(xml) => Delivery::Event(xml),
            Err(e) => Delivery::Error(e.to_string()),
        }
    } else {
        // For an error the "event" is the Win32 error code.
        Delivery::Error(WinError::win32("the event-log subscription", event.0 as u32).to_string())
    };
    queue.push(delivery);
    0
}

/// A running `EvtSubscribe` subscription.
struct Subscribed {
    handle: EVT_HANDLE,
    queue: Arc<Queue>,
}

impl Subscription for Subscribed {}

impl Drop for Subscribed {
    fn drop(&mut self) {
        // SAFETY: our subscription handle, closed once; this ends the deliveries.
        let _ = unsafe { EvtClose(self.handle) };
        let mut sink = SINK.lock().unwrap_or_else(|p| p.into_inner());
        if sink.as_ref().is_some_and(|q| Arc::ptr_eq(q, &self.queue)) {
            *sink = None;
        }
    }
}

/// The Windows event log of this machine.
pub(crate) struct WindowsEventLog;

impl EventLog for WindowsEventLog {
    fn describe(&self) -> String {
        "the Windows event log".into()
    }

    fn subscribe(&self, query: &str, queue: Arc<Queue>) -> Result<Box<dyn Subscription>, String> {
        // Set before subscribing: the backlog is delivered at once, maybe within the call.
        *SINK.lock().unwrap_or_else(|p| p.into_inner()) = Some(queue.clone());
        let query = HSTRING::from(query);
        // SAFETY: a structured XML query (no channel path), no bookmark or session; the
        // callback only touches the static queue.
        let subscribed = unsafe {
            EvtSubscribe(
                None,
                None,
                PCWSTR::null(),
                &query,
                None,
                None,
                Some(on_event),
                EvtSubscribeStartAtOldestRecord.0 | EvtSubscribeTolerateQueryErrors.0,
            )
        };
        match subscribed {
            Ok(handle) => Ok(Box::new(Subscribed { handle, queue })),
            Err(e) => {
                let mut sink = SINK.lock().unwrap_or_else(|p| p.into_inner());
                if sink.as_ref().is_some_and(|q| Arc::ptr_eq(q, &queue)) {
                    *sink = None;
                }
                Err(WinError::hresult("EvtSubscribe", &e).to_string())
            }
        }
    }

    fn query(&self, query: &str, limit: usize) -> Result<Vec<String>, String> {
        let text = HSTRING::from(query);
        // SAFETY: a structured XML query, newest first.
        let results = unsafe {
            EvtQuery(
                None,
                PCWSTR::null(),
                &text,
                EvtQueryChannelPath.0 | EvtQueryReverseDirection.0 | EvtQueryTolerateQueryErrors.0,
            )
        }
        .map_err(|e| WinError::hresult("EvtQuery", &e).to_string())?;
        let mut out = Vec::new();
        let mut failure = None;
        'batches: while out.len() < limit {
            let mut events = [0isize; 64];
            let mut returned = 0u32;
            // SAFETY: `events` receives at most its length of handles, each closed below.
            let next = unsafe { EvtNext(results, &mut events, NEXT_TIMEOUT_MS, 0, &mut returned) };
            if let Err(e) = next {
                if e.code() != ERROR_NO_MORE_ITEMS.to_hresult() {
                    failure = Some(WinError::hresult("EvtNext", &e).to_string());
                }
                break;
            }
            let returned = (returned as usize).min(events.len());
            for (i, raw) in events[..returned].iter().enumerate() {
                let handle = EVT_HANDLE(*raw);
                if out.len() < limit {
                    match render(handle) {
                        Ok(xml) => out.push(xml),
                        Err(e) => tracing::debug!("event-log record skipped: {e}"),
                    }
                }
                // SAFETY: a record handle EvtNext returned, closed once.
                let _ = unsafe { EvtClose(handle) };
                if out.len() >= limit {
                    for rest in &events[i + 1..returned] {
                        // SAFETY: as above.
                        let _ = unsafe { EvtClose(EVT_HANDLE(*rest)) };
                    }
                    break 'batches;
                }
            }
        }
        // SAFETY: the query's handle, closed once.
        let _ = unsafe { EvtClose(results) };
        if let Some(e) = failure {
            if out.is_empty() {
                return Err(e);
            }
            tracing::warn!("reading the event log stopped early: {e}");
        }
        out.reverse();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dxdp_core::health::feed;
    use dxdp_core::health::HealthPolicy;

    /// Under Wine `wevtapi.dll` is mostly stubs: subscribing and querying either work or fail
    /// with an error naming the call, never a panic, and a failed subscription leaves no queue
    /// behind.
    #[test]
    fn subscribing_and_querying_fail_soft() {
        let q = feed::query(feed::MIN_LOOKBACK, &HealthPolicy::default());
        let queue = Queue::bounded();
        match WindowsEventLog.subscribe(&q, queue.clone()) {
            Ok(sub) => {
                eprintln!("EvtSubscribe works here");
                drop(sub);
            }
            Err(e) => {
                eprintln!("EvtSubscribe fails here: {e}");
                assert!(e.contains("EvtSubscribe"), "{e}");
            }
        }
        assert!(SINK.lock().unwrap().is_none(), "no queue left behind");
        match WindowsEventLog.query(&q, 16) {
            Ok(records) => assert!(records.len() <= 16),
            Err(e) => assert!(e.contains("Evt"), "{e}"),
        }
    }
}
